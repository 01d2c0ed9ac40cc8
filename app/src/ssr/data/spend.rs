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
    let mut tx = pool.begin().await?;
    // Recording the reservation first makes a concurrent retry with the
    // same Idempotency-Key wait here and then see it as a replay.
    let reservation_id: Option<i64> = sqlx::query_scalar(
        "INSERT INTO reservations (vault_key_id, request_id, idempotency_key, amount_cents, method, path,
             stripe_customer, metadata_customer_id, billing_period, currency)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
         ON CONFLICT (vault_key_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
         RETURNING id",
    )
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
    .fetch_optional(&mut *tx)
    .await?;
    let Some(reservation_id) = reservation_id else {
        return Ok(Reserved::Replay);
    };
    let reserved = sqlx::query(
        "UPDATE vault_keys SET reserved_cents = reserved_cents + $2
         WHERE id = $1 AND revoked_at IS NULL AND expires_at > now()
           AND spent_cents + reserved_cents + $2 <= cap_cents",
    )
    .bind(key_id)
    .bind(amount)
    .execute(&mut *tx)
    .await?
    .rows_affected()
        == 1;
    if reserved {
        tx.commit().await?;
        return Ok(Reserved::New { reservation_id });
    }
    tx.rollback().await?;
    let state: Option<(i64, i64, i64, bool)> = sqlx::query_as(
        "SELECT cap_cents, spent_cents, reserved_cents, revoked_at IS NULL AND expires_at > now()
         FROM vault_keys WHERE id = $1",
    )
    .bind(key_id)
    .fetch_optional(pool)
    .await?;
    Ok(match state {
        Some((cap, spent, reserved, true)) => Reserved::OverCap {
            cap,
            spent,
            reserved,
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

/// Settles a reservation and writes the call's audit row, in one transaction.
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
    let mut tx = pool.begin().await?;
    // Only a pending reservation is settled: a sweep may already have
    // marked it unknown, and then reconciliation owns it.
    let pending: Option<(i64, i64)> = sqlx::query_as(
        "UPDATE reservations SET state = $2, settled_at = now()
         WHERE id = $1 AND state = 'pending'
         RETURNING vault_key_id, amount_cents",
    )
    .bind(reservation_id)
    .bind(state)
    .fetch_optional(&mut *tx)
    .await?;
    if let Some((key_id, amount)) = pending {
        let moved = match settlement {
            Settlement::Spent => {
                "reserved_cents = reserved_cents - $2, spent_cents = spent_cents + $2"
            }
            Settlement::Released => "reserved_cents = reserved_cents - $2",
            Settlement::Unknown => "",
        };
        if !moved.is_empty() {
            sqlx::query(&format!("UPDATE vault_keys SET {moved} WHERE id = $1"))
                .bind(key_id)
                .bind(amount)
                .execute(&mut *tx)
                .await?;
        }
    }
    audit::insert(&mut *tx, entry).await?;
    tx.commit().await
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
