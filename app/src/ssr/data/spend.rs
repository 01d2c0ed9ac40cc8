//! Money under a vault key: reserve before forwarding, settle after. The one
//! place these rules live; every write is a short committed transaction and
//! the cap is enforced by a conditional UPDATE (and, behind it, a CHECK).

use sqlx::PgPool;

use super::audit::{self, AuditEntry};

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

/// What the reservation is for, kept so a cut-off call can be audited later.
pub struct ReservationFacts<'a> {
    pub request_id: uuid::Uuid,
    pub method: &'a str,
    pub path: &'a str,
    pub idempotency_key: Option<&'a str>,
    pub stripe_customer: Option<&'a str>,
    pub metadata_customer_id: Option<&'a str>,
    pub billing_period: &'a str,
    pub currency: Option<&'a str>,
}

pub async fn reserve(
    pool: &PgPool,
    key_id: i64,
    amount: i64,
    facts: &ReservationFacts<'_>,
) -> Result<Reserved, sqlx::Error> {
    // One statement, one commit: see reserve_spend in the migrations.
    let (outcome, reservation_id, cap, spent, reserved): (
        String,
        Option<i64>,
        Option<i64>,
        Option<i64>,
        Option<i64>,
    ) = sqlx::query_as("SELECT * FROM reserve_spend($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)")
        .bind(key_id)
        .bind(facts.request_id)
        .bind(facts.idempotency_key)
        .bind(amount)
        .bind(facts.method)
        .bind(facts.path)
        .bind(facts.stripe_customer)
        .bind(facts.metadata_customer_id)
        .bind(facts.billing_period)
        .bind(facts.currency)
        .fetch_optional(pool)
        .await?
        .unwrap_or_else(|| ("unusable".into(), None, None, None, None));
    Ok(match (outcome.as_str(), reservation_id) {
        ("reserved", Some(reservation_id)) => Reserved::New { reservation_id },
        ("replay", _) => Reserved::Replay,
        ("over_cap", _) => Reserved::OverCap {
            cap: cap.unwrap_or_default(),
            spent: spent.unwrap_or_default(),
            reserved: reserved.unwrap_or_default(),
        },
        _ => Reserved::KeyUnusable,
    })
}

/// How a forwarded call ended, for its reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settlement {
    /// Stripe confirmed it: the amount is spent.
    Spent,
    /// Stripe definitely refused it (a 4xx, or it never left): released.
    Released,
    /// Nobody knows: it stays reserved until reconciliation decides.
    Unknown,
}

/// Settles a reservation and writes the call's audit row, in one statement
/// (so one commit): see settle_spend in the migrations.
pub async fn settle(
    pool: &PgPool,
    reservation_id: i64,
    settlement: Settlement,
    entry: &AuditEntry,
) -> Result<(), sqlx::Error> {
    let state = match settlement {
        Settlement::Spent => "settled",
        Settlement::Released => "released",
        Settlement::Unknown => "outcome_unknown",
    };
    let sql = format!(
        "WITH settled AS (SELECT settle_spend($19, $20))
         INSERT INTO audit_log ({columns}) SELECT {parameters} FROM settled",
        columns = audit::COLUMNS,
        parameters = audit::PARAMETERS
    );
    audit::bind(sqlx::query(&sql), entry)
        .bind(reservation_id)
        .bind(state)
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
