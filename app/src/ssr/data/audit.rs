//! The proxy's audit log: one row per call that reached the proxy.

use serde::Serialize;
use uuid::Uuid;

use crate::domain::{CallSummary, Cents, Decision};

/// Everything recorded about one call.
/// Its fields are the audit_log columns of the same names.
#[derive(Debug, Clone, Serialize)]
pub struct AuditEntry {
    pub request_id: Uuid,
    pub vault_key_id: Option<i64>,
    pub key_prefix: Option<String>,
    pub method: String,
    pub path: String,
    pub stripe_customer: Option<String>,
    pub metadata_customer_id: Option<String>,
    pub metadata_billing_period: Option<String>,
    pub billing_period: Option<String>,
    pub amount_cents: Option<i64>,
    pub currency: Option<String>,
    pub idempotency_key: Option<String>,
    pub decision: Decision,
    pub upstream_status: Option<i16>,
    pub stripe_object_id: Option<String>,
    pub error_code: Option<String>,
    pub message: Option<String>,
    pub latency_ms: i32,
}

/// A key's latest calls, newest first (the audit log's key index).
pub async fn latest_for_key(
    db: impl sqlx::PgExecutor<'_>,
    key: i64,
    limit: i64,
) -> Result<Vec<CallSummary>, sqlx::Error> {
    let rows: Vec<CallRow> = sqlx::query_as(
        "SELECT id, at, method, path, COALESCE(metadata_customer_id, stripe_customer) AS customer,
                amount_cents, decision, upstream_status, stripe_object_id
         FROM audit_log WHERE vault_key_id = $1 ORDER BY at DESC, id DESC LIMIT $2",
    )
    .bind(key)
    .bind(limit)
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().filter_map(CallRow::summary).collect())
}

#[derive(sqlx::FromRow)]
struct CallRow {
    id: i64,
    at: chrono::DateTime<chrono::Utc>,
    method: String,
    path: String,
    customer: Option<String>,
    amount_cents: Option<i64>,
    decision: String,
    upstream_status: Option<i16>,
    stripe_object_id: Option<String>,
}

impl CallRow {
    /// `None` only for a decision this build does not know (a newer schema).
    fn summary(self) -> Option<CallSummary> {
        Some(CallSummary {
            decision: Decision::parse(&self.decision)?,
            id: self.id,
            at: self.at,
            method: self.method,
            path: self.path,
            customer: self.customer,
            amount: self.amount_cents.map(Cents),
            upstream_status: self.upstream_status,
            stripe_object_id: self.stripe_object_id,
        })
    }
}
