//! Money under a vault key: reserve before forwarding, settle after. The
//! rules live in the migrations' reserve_spend / settle_calls functions and
//! are called only from here; every write is a short committed transaction
//! (for many calls at once) and the cap is enforced by a conditional UPDATE
//! (and, behind it, a CHECK).

use serde::Serialize;
use sqlx::{types::Json, PgPool};
use uuid::Uuid;

use crate::audit::sql::AuditEntry;
use crate::domain::{BillingPeriod, Cents, Currency, VaultKeyId};

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
    /// The same request under an Idempotency-Key whose call Stripe
    /// answered: forwarded (Stripe answers with the original result)
    /// without reserving again.
    Replay,
    /// The same request under an Idempotency-Key whose call's outcome is
    /// unknown: forwarded, and Stripe's answer settles that call's
    /// reservation (`reservation_id`).
    RetryUnknown { reservation_id: i64 },
    /// The Idempotency-Key's first call is still in flight.
    InFlight,
    /// The Idempotency-Key was used for another request (other parameters,
    /// path or account) within Stripe's 24 hours.
    IdempotencyMismatch,
    /// The key's duplicate guard blocks it: the customer already has a
    /// charge this period under another Idempotency-Key (`earlier_charge`,
    /// unknown while that call is in flight or its outcome is unknown;
    /// `earlier_state` is its reservation's state).
    Duplicate {
        earlier_charge: Option<String>,
        earlier_state: String,
    },
    /// Reserving would take spent + reserved over the cap.
    OverCap {
        cap: Cents,
        spent: Cents,
        reserved: Cents,
    },
    /// The key was revoked or expired since it was checked.
    KeyUnusable,
}

/// One call's reservation request: what the money is for, kept with the
/// reservation so a cut-off call can still be audited later.
#[derive(Debug, Clone, Serialize)]
pub struct ReserveCall {
    pub key: VaultKeyId,
    pub request: Uuid,
    pub amount: Cents,
    pub idempotency_key: Option<String>,
    /// The request's fingerprint in hex (see the proxy's `Params::fingerprint`).
    pub fingerprint: String,
    pub method: String,
    pub path: String,
    pub stripe_customer: Option<String>,
    pub metadata_customer_id: Option<String>,
    pub billing_period: BillingPeriod,
    pub currency: Currency,
    /// The payment intent whose amount this call raises (an update).
    pub payment_intent: Option<String>,
    /// The form body and Stripe-Version as sent: kept for calls with an
    /// Idempotency-Key, so an unknown outcome can be asked about by
    /// sending the same request again.
    pub request_body: Option<String>,
    pub stripe_version: Option<String>,
    /// How long the proxy answers for the call (its upstream timeout and a
    /// margin): a pending call older than this was abandoned.
    pub lease_secs: i32,
}

/// One row of reserve_spend_many.
#[derive(sqlx::FromRow)]
struct ReserveOutcome {
    call_position: i64,
    outcome: String,
    reservation_id: Option<i64>,
    cap: Option<Cents>,
    spent: Option<Cents>,
    reserved: Option<Cents>,
    earlier_charge: Option<String>,
    earlier_state: Option<String>,
}

impl ReserveOutcome {
    /// What the row says, or an error naming what no outcome can be.
    fn read(self) -> Result<Reserved, sqlx::Error> {
        let position = self.call_position;
        let broken = |what: &str| {
            sqlx::Error::Protocol(format!(
                "reserve_spend_many answered call {position} with {what}"
            ))
        };
        Ok(match (self.outcome.as_str(), self.reservation_id) {
            ("reserved", Some(reservation_id)) => Reserved::New {
                reservation_id,
                duplicate_of: self.earlier_charge,
            },
            ("replay", _) => Reserved::Replay,
            ("retry_unknown", Some(reservation_id)) => Reserved::RetryUnknown { reservation_id },
            ("in_flight", _) => Reserved::InFlight,
            ("idempotency_mismatch", _) => Reserved::IdempotencyMismatch,
            ("duplicate", _) => Reserved::Duplicate {
                earlier_state: self
                    .earlier_state
                    .ok_or_else(|| broken("a duplicate without its earlier state"))?,
                earlier_charge: self.earlier_charge,
            },
            ("over_cap", _) => match (self.cap, self.spent, self.reserved) {
                (Some(cap), Some(spent), Some(reserved)) => Reserved::OverCap {
                    cap,
                    spent,
                    reserved,
                },
                _ => return Err(broken("over_cap without the key's figures")),
            },
            ("unusable", _) => Reserved::KeyUnusable,
            (other, _) => return Err(broken(&format!("the outcome {other:?}"))),
        })
    }
}

/// Reserves for many calls in one statement and one commit (see
/// reserve_spend_many in the migrations); one outcome per call, in order.
#[tracing::instrument(skip_all)]
pub async fn reserve_many(
    pool: &PgPool,
    calls: &[ReserveCall],
) -> Result<Vec<Reserved>, sqlx::Error> {
    let rows = sqlx::query_as("SELECT * FROM reserve_spend_many($1)")
        .bind(Json(calls))
        .fetch_all(pool)
        .await?;
    outcomes(rows, calls.len())
}

/// [`reserve_many`] and [`record_many`] in one statement and one commit
/// (see record_and_reserve in the migrations): the reservations' outcomes.
#[tracing::instrument(skip_all)]
pub async fn record_and_reserve(
    pool: &PgPool,
    records: &[CallRecord],
    reserves: &[ReserveCall],
) -> Result<Vec<Reserved>, sqlx::Error> {
    let rows = sqlx::query_as("SELECT * FROM record_and_reserve($1, $2)")
        .bind(Json(records))
        .bind(Json(reserves))
        .fetch_all(pool)
        .await?;
    outcomes(rows, reserves.len())
}

/// Exactly one outcome per call, in the calls' order: anything else is a
/// broken statement, never a refusal made up here.
fn outcomes(rows: Vec<ReserveOutcome>, calls: usize) -> Result<Vec<Reserved>, sqlx::Error> {
    let mut outcomes: Vec<Option<Reserved>> = vec![None; calls];
    for row in rows {
        let position = row.call_position;
        let slot = usize::try_from(position - 1)
            .ok()
            .and_then(|i| outcomes.get_mut(i))
            .filter(|slot| slot.is_none())
            .ok_or_else(|| {
                sqlx::Error::Protocol(format!(
                    "reserve_spend_many answered call {position} of {calls} twice or out of range"
                ))
            })?;
        *slot = Some(row.read()?);
    }
    outcomes
        .into_iter()
        .enumerate()
        .map(|(i, outcome)| {
            outcome.ok_or_else(|| {
                sqlx::Error::Protocol(format!("reserve_spend_many gave call {} no outcome", i + 1))
            })
        })
        .collect()
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
    /// A payment intent Stripe cancelled or captured for less than was
    /// metered: what it will not take goes back to the key.
    pub release: Option<IntentRelease>,
}

impl CallRecord {
    /// A call that holds no reservation: only its audit row.
    pub fn audit_only(entry: AuditEntry) -> Self {
        Self {
            entry,
            reservation_id: None,
            settlement: None,
            duplicate_of: None,
            release: None,
        }
    }
}

/// What a payment intent took in the end (`keep_cents`; 0 when cancelled).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IntentRelease {
    pub intent: String,
    pub keep_cents: Cents,
}

/// What `key` has metered for payment intent `intent` (created or raised
/// under it, less what was given back); `None` when no call under this key
/// made or raised it.
#[tracing::instrument(skip_all)]
pub async fn intent_metered(
    pool: &PgPool,
    key: VaultKeyId,
    intent: &str,
) -> Result<Option<Cents>, sqlx::Error> {
    sqlx::query_scalar("SELECT intent_metered($1, $2)")
        .bind(key)
        .bind(intent)
        .fetch_one(pool)
        .await
}

/// Settles the calls' reservations and appends their audit rows, for many
/// calls in one statement and one commit (see record_calls in the
/// migrations): a call's settlement and its audit row commit together.
#[tracing::instrument(skip_all)]
pub async fn record_many(pool: &PgPool, calls: &[CallRecord]) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT record_calls($1)")
        .bind(Json(calls))
        .execute(pool)
        .await?;
    Ok(())
}

/// Reservations left pending by a process that died mid-call, more than
/// `grace_secs` past the time their process answered for them: marked
/// unknown and written to the audit log, so nothing silently vanishes (a
/// negative grace also takes calls still within it: for a run that is
/// over). Rows someone holds are skipped. Returns how many.
#[tracing::instrument(skip_all)]
pub async fn sweep_abandoned(pool: &PgPool, grace_secs: i64) -> Result<u64, sqlx::Error> {
    let swept: i64 = sqlx::query_scalar(
        "WITH abandoned AS (
             UPDATE reservations r SET state = 'outcome_unknown'
             WHERE r.id IN (SELECT id FROM reservations
                            WHERE state = 'pending' AND claimed_until < now() - make_interval(secs => $1)
                            FOR UPDATE SKIP LOCKED)
             RETURNING r.id
         )
         SELECT count(*) FROM (SELECT audit_abandoned(id) FROM abandoned) AS audited",
    )
    .bind(grace_secs as f64)
    .fetch_one(pool)
    .await?;
    Ok(swept as u64)
}

/// What reconciliation decided about calls whose outcome was unknown.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct UnknownOutcomes {
    /// Stripe has the charge: the amount is spent.
    pub settled: u64,
    /// No synced charge names them: they stay reserved. The absence of a
    /// matching charge is no proof that Stripe made none (a charge without
    /// metadata, on another account, later than the window), so only
    /// asking Stripe (`jobs::unknown_outcomes`) or a person releases them.
    pub still_unknown: u64,
}

/// Settles the period's unknown outcomes that the stored charges explain,
/// one call at a time (so one charge settles at most one call): a succeeded
/// charge for the call's customer, period and amount, created from a minute
/// before the call to an hour after it. Calls no charge explains stay
/// reserved. Only calls made before `made_before` are looked at (after a
/// sync, ten minutes before it started, so Stripe has had time to show the
/// charge).
#[tracing::instrument(skip_all)]
pub async fn settle_unknown(
    tx: &mut sqlx::PgConnection,
    period: BillingPeriod,
    made_before: chrono::DateTime<chrono::Utc>,
) -> Result<(UnknownOutcomes, Vec<(i64, String)>), sqlx::Error> {
    let unknown: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM reservations
         WHERE state = 'outcome_unknown' AND billing_period = $1 AND created_at < $2
         ORDER BY id",
    )
    .bind(period)
    .bind(made_before)
    .fetch_all(&mut *tx)
    .await?;
    // Their keys first, in key order as the ledger's writers lock them:
    // taken call by call, in call order, they could deadlock with a writer.
    sqlx::query(
        "SELECT 1 FROM vault_keys
         WHERE id IN (SELECT vault_key_id FROM reservations WHERE id = ANY($1))
         ORDER BY id FOR NO KEY UPDATE",
    )
    .bind(&unknown)
    .execute(&mut *tx)
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
        let Some(charge) = charge else {
            outcomes.still_unknown += 1;
            continue;
        };
        let changed: bool = sqlx::query_scalar("SELECT settle_unknown_spend($1, 'settled', $2)")
            .bind(id)
            .bind(&charge)
            .fetch_one(&mut *tx)
            .await?;
        if changed {
            outcomes.settled += 1;
            decided.push((id, charge));
        }
    }
    Ok((outcomes, decided))
}

/// Decides the call of unknown outcome that the stored charge `charge_id`
/// (just described by a Stripe event) explains, if one does: the call sent
/// with the Idempotency-Key that Stripe says made the charge, else the
/// oldest call for the charge's customer, period and amount made from an
/// hour before the charge to a minute after it. A succeeded charge settles
/// it; a failed one releases it, but only when the Idempotency-Key names
/// the call (a decline for a look-alike is no proof about this call).
/// Returns the reservation and its new state.
#[tracing::instrument(skip_all)]
pub async fn settle_unknown_by_charge(
    tx: &mut sqlx::PgConnection,
    charge_id: &str,
) -> Result<Option<(i64, &'static str)>, sqlx::Error> {
    let found: Option<(i64, bool, String)> = sqlx::query_as(
        "SELECT r.id, coalesce(r.idempotency_key = c.idempotency_key, false), c.status
         FROM stripe_charges c JOIN reservations r
           ON r.state = 'outcome_unknown' AND r.stripe_charge_id IS NULL
          AND r.amount_cents = c.amount_cents AND lower(r.currency) = c.currency
          AND ((c.idempotency_key IS NOT NULL AND r.idempotency_key = c.idempotency_key)
               OR (r.metadata_customer_id = c.customer_id AND r.billing_period = c.billing_period
                   AND r.created_at BETWEEN c.created_at - interval '1 hour' AND c.created_at + interval '1 minute'))
         WHERE c.id = $1 AND c.status IN ('succeeded', 'failed')
           AND NOT EXISTS (SELECT 1 FROM reservations o WHERE o.stripe_charge_id = c.id)
         ORDER BY 2 DESC, r.id
         LIMIT 1",
    )
    .bind(charge_id)
    .fetch_optional(&mut *tx)
    .await?;
    let state = match found {
        Some((id, _, status)) if status == "succeeded" => (id, "settled"),
        Some((id, true, _)) => (id, "released"),
        _ => return Ok(None),
    };
    let changed: bool = sqlx::query_scalar("SELECT settle_unknown_spend($1, $2, $3)")
        .bind(state.0)
        .bind(state.1)
        .bind(charge_id)
        .fetch_one(&mut *tx)
        .await?;
    Ok(changed.then_some(state))
}
