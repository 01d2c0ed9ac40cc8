//! Money under a vault key: reserve before forwarding, settle after. The
//! rules live in the migrations' reserve_spend / settle_spend functions and
//! are called only from here; every write is a short committed transaction
//! (for many calls at once) and the cap is enforced by a conditional UPDATE
//! (and, behind it, a CHECK).

use serde::Serialize;
use sqlx::{types::Json, PgPool};
use uuid::Uuid;

use super::audit::AuditEntry;

/// The outcome of trying to reserve an amount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reserved {
    /// Reserved; settle this reservation after the call.
    New { reservation_id: i64 },
    /// The Idempotency-Key was already used under this key: the call is a
    /// retry, forwarded without reserving again.
    Replay,
    /// Reserving would take spent + reserved over the cap.
    OverCap { cap: i64, spent: i64, reserved: i64 },
    /// The key was revoked or expired since it was checked.
    KeyUnusable,
}

/// One call's reservation request: what the money is for, kept with the
/// reservation so a cut-off call can still be audited later.
#[derive(Debug, Clone, Serialize)]
pub struct ReserveCall {
    pub key: i64,
    pub request: Uuid,
    pub amount: i64,
    pub idempotency_key: Option<String>,
    pub method: String,
    pub path: String,
    pub stripe_customer: Option<String>,
    pub metadata_customer_id: Option<String>,
    pub billing_period: String,
    pub currency: Option<String>,
}

/// Reserves for many calls in one statement and one commit (see
/// reserve_spend_many in the migrations); one outcome per call, in order.
/// One row of reserve_spend_many.
#[derive(sqlx::FromRow)]
struct ReserveOutcome {
    call_position: i64,
    outcome: String,
    reservation_id: Option<i64>,
    cap: Option<i64>,
    spent: Option<i64>,
    reserved: Option<i64>,
}

/// Reserves for many calls in one statement and one commit (see
/// reserve_spend_many in the migrations); one outcome per call, in order.
pub async fn reserve_many(
    pool: &PgPool,
    calls: &[ReserveCall],
) -> Result<Vec<Reserved>, sqlx::Error> {
    let rows: Vec<ReserveOutcome> = sqlx::query_as("SELECT * FROM reserve_spend_many($1)")
        .bind(Json(calls))
        .fetch_all(pool)
        .await?;
    let mut outcomes = vec![Reserved::KeyUnusable; calls.len()];
    for row in rows {
        let slot = usize::try_from(row.call_position - 1)
            .ok()
            .and_then(|i| outcomes.get_mut(i));
        let Some(slot) = slot else { continue };
        *slot = match (row.outcome.as_str(), row.reservation_id) {
            ("reserved", Some(reservation_id)) => Reserved::New { reservation_id },
            ("replay", _) => Reserved::Replay,
            ("over_cap", _) => Reserved::OverCap {
                cap: row.cap.unwrap_or_default(),
                spent: row.spent.unwrap_or_default(),
                reserved: row.reserved.unwrap_or_default(),
            },
            _ => Reserved::KeyUnusable,
        };
    }
    Ok(outcomes)
}

/// How a forwarded call ended, for its reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Settlement {
    /// Stripe confirmed it: the amount is spent.
    #[serde(rename = "settled")]
    Spent,
    /// Stripe definitely refused it (a 4xx, or it never left): released.
    #[serde(rename = "released")]
    Released,
    /// Nobody knows: it stays reserved until reconciliation decides.
    #[serde(rename = "outcome_unknown")]
    Unknown,
}

/// A decided call: its audit row and, when it held a reservation, how the
/// reservation ends.
#[derive(Debug, Clone, Serialize)]
pub struct CallRecord {
    #[serde(flatten)]
    pub entry: AuditEntry,
    pub reservation_id: Option<i64>,
    pub settlement: Option<Settlement>,
}

/// Settles the calls' reservations and appends their audit rows, for many
/// calls in one statement and one commit (see record_calls in the
/// migrations): a call's settlement and its audit row commit together.
pub async fn record_many(pool: &PgPool, calls: &[CallRecord]) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT record_calls($1)")
        .bind(Json(calls))
        .execute(pool)
        .await?;
    Ok(())
}

/// Reservations left pending by a process that died mid-call, older than
/// `older_than_secs` (longer than any call may take): marked unknown and
/// written to the audit log, so nothing silently vanishes. Returns how many.
pub async fn sweep_abandoned(pool: &PgPool, older_than_secs: i64) -> Result<u64, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let swept = sqlx::query(
        "WITH abandoned AS (
             UPDATE reservations r SET state = 'outcome_unknown'
             WHERE state = 'pending' AND created_at < now() - make_interval(secs => $1)
             RETURNING r.*
         )
         INSERT INTO audit_log (at, request_id, vault_key_id, key_prefix, method, path, stripe_customer,
             metadata_customer_id, billing_period, amount_cents, currency, idempotency_key, decision, message)
         SELECT a.created_at, a.request_id, a.vault_key_id, k.secret_prefix, a.method, a.path, a.stripe_customer,
                a.metadata_customer_id, a.billing_period, a.amount_cents, a.currency, a.idempotency_key,
                'outcome_unknown', 'the proxy stopped before the call settled; reconciliation decides'
         FROM abandoned a JOIN vault_keys k ON k.id = a.vault_key_id",
    )
    .bind(older_than_secs as f64)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    tx.commit().await?;
    Ok(swept)
}
