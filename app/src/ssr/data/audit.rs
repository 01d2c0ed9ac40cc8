//! The proxy's audit log: one row per call that reached the proxy.

use sqlx::PgExecutor;
use uuid::Uuid;

use crate::domain::Decision;

/// Everything recorded about one call.
#[derive(Debug, Clone)]
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

/// The audit row's columns, in the order [`bind`] binds them ($1 to $18).
pub const COLUMNS: &str = "request_id, vault_key_id, key_prefix, method, path, stripe_customer,
    metadata_customer_id, metadata_billing_period, billing_period, amount_cents, currency,
    idempotency_key, decision, upstream_status, stripe_object_id, error_code, message, latency_ms";

/// `$1, …, $18` for [`COLUMNS`].
pub const PARAMETERS: &str =
    "$1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18";

/// Binds an entry's values as $1 to $18.
pub fn bind<'q>(
    query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    entry: &'q AuditEntry,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    query
        .bind(entry.request_id)
        .bind(entry.vault_key_id)
        .bind(&entry.key_prefix)
        .bind(&entry.method)
        .bind(&entry.path)
        .bind(&entry.stripe_customer)
        .bind(&entry.metadata_customer_id)
        .bind(&entry.metadata_billing_period)
        .bind(&entry.billing_period)
        .bind(entry.amount_cents)
        .bind(&entry.currency)
        .bind(&entry.idempotency_key)
        .bind(entry.decision.as_str())
        .bind(entry.upstream_status)
        .bind(&entry.stripe_object_id)
        .bind(&entry.error_code)
        .bind(&entry.message)
        .bind(entry.latency_ms)
}

pub async fn insert(db: impl PgExecutor<'_>, entry: &AuditEntry) -> Result<(), sqlx::Error> {
    let sql = format!("INSERT INTO audit_log ({COLUMNS}) VALUES ({PARAMETERS})");
    bind(sqlx::query(&sql), entry).execute(db).await?;
    Ok(())
}
