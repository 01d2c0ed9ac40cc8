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
    /// Reserved; settle this reservation after the call. `duplicate_of`
    /// names the earlier charge for the same customer and period when the
    /// key's duplicate guard flags the call.
    New {
        reservation_id: i64,
        duplicate_of: Option<String>,
    },
    /// The Idempotency-Key was already used under this key: the call is a
    /// retry, forwarded without reserving again.
    Replay,
    /// The key's duplicate guard blocks it: the customer already has a
    /// charge this period under another Idempotency-Key (`earlier_charge`,
    /// unknown while that call is in flight or its outcome is unknown;
    /// `earlier_state` is its reservation's state).
    Duplicate {
        earlier_charge: Option<String>,
        earlier_state: String,
    },
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

/// One row of reserve_spend_many.
#[derive(sqlx::FromRow)]
struct ReserveOutcome {
    call_position: i64,
    outcome: String,
    reservation_id: Option<i64>,
    cap: Option<i64>,
    spent: Option<i64>,
    reserved: Option<i64>,
    earlier_charge: Option<String>,
    earlier_state: Option<String>,
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
            ("reserved", Some(reservation_id)) => Reserved::New {
                reservation_id,
                duplicate_of: row.earlier_charge,
            },
            ("replay", _) => Reserved::Replay,
            ("duplicate", _) => Reserved::Duplicate {
                earlier_charge: row.earlier_charge,
                earlier_state: row.earlier_state.unwrap_or_default(),
            },
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
    /// The earlier charge, when the duplicate guard flagged the call: once
    /// Stripe confirms it, its duplicate finding opens with its audit row.
    pub duplicate_of: Option<String>,
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

/// What reconciliation decided about calls whose outcome was unknown.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct UnknownOutcomes {
    /// Stripe has the charge: the amount is spent.
    pub settled: u64,
    /// A sync made well after the call shows no such charge: released.
    pub released: u64,
}

/// Decides the period's unknown outcomes from the synced charges, one call
/// at a time (so one charge settles at most one call): a succeeded charge
/// for the call's customer, period and amount, created from a minute before
/// the call to an hour after it, settles it; none releases it. Only calls
/// made at least ten minutes before `synced_from` (when the sync started)
/// are decided, so Stripe has had time to show the charge.
pub async fn settle_unknown(
    tx: &mut sqlx::PgConnection,
    period: &str,
    synced_from: chrono::DateTime<chrono::Utc>,
) -> Result<(UnknownOutcomes, Vec<(i64, Option<String>)>), sqlx::Error> {
    let unknown: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM reservations
         WHERE state = 'outcome_unknown' AND billing_period = $1 AND created_at < $2 - interval '10 minutes'
         ORDER BY id",
    )
    .bind(period)
    .bind(synced_from)
    .fetch_all(&mut *tx)
    .await?;
    let mut outcomes = UnknownOutcomes::default();
    let mut decided = Vec::with_capacity(unknown.len());
    for id in unknown {
        let charge: Option<String> = sqlx::query_scalar(
            "SELECT c.id FROM reservations r JOIN stripe_charges c
               ON c.customer_id = r.metadata_customer_id AND c.billing_period = r.billing_period
              AND c.amount_cents = r.amount_cents AND c.status = 'succeeded'
              AND c.created_at BETWEEN r.created_at - interval '1 minute' AND r.created_at + interval '1 hour'
             WHERE r.id = $1
               AND NOT EXISTS (SELECT 1 FROM reservations o WHERE o.stripe_charge_id = c.id)
             ORDER BY c.created_at, c.id LIMIT 1",
        )
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
        let state = if charge.is_some() {
            "settled"
        } else {
            "released"
        };
        let changed: bool = sqlx::query_scalar("SELECT settle_unknown_spend($1, $2, $3)")
            .bind(id)
            .bind(state)
            .bind(&charge)
            .fetch_one(&mut *tx)
            .await?;
        if changed {
            match charge {
                Some(_) => outcomes.settled += 1,
                None => outcomes.released += 1,
            }
            decided.push((id, charge));
        }
    }
    Ok((outcomes, decided))
}
