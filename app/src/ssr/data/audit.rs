//! The proxy's audit log: one row per call that reached the proxy.

use serde::Serialize;
use uuid::Uuid;

use crate::domain::Decision;

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
