//! Stripe's charges as the reconciliation sync stores them, and the syncs
//! themselves (progress, resume point, last error).

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgExecutor};

use crate::domain::{BillingPeriod, Cents};

/// A charge as Stripe listed it, reduced to what reconciliation compares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncedCharge {
    pub id: String,
    pub payment_intent: Option<String>,
    pub stripe_customer: Option<String>,
    pub amount_cents: Cents,
    pub amount_refunded_cents: Cents,
    pub currency: String,
    pub status: String,
    /// The billing job's `metadata[customer_id]` and `metadata[billing_period]`
    /// as it wrote them: caller text, kept as sent so that junk stays visible
    /// to reconciliation rather than failing the sync.
    pub customer_id: Option<String>,
    pub metadata_period: Option<String>,
    pub created_at: DateTime<Utc>,
    /// The Idempotency-Key of the request that made it, when a webhook
    /// event names it (a listing does not).
    pub idempotency_key: Option<String>,
}

/// A payment intent as Stripe listed it: what attributes the charge it
/// made to a customer and period.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncedIntent {
    pub id: String,
    pub status: String,
    pub amount_cents: Cents,
    pub currency: String,
    pub stripe_customer: Option<String>,
    pub latest_charge: Option<String>,
    /// The billing job's metadata, as on [`SyncedCharge`].
    pub customer_id: Option<String>,
    pub metadata_period: Option<String>,
    pub created_at: DateTime<Utc>,
}

/// A sync's progress.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct SyncRow {
    pub id: i64,
    pub billing_period: BillingPeriod,
    pub created_from: DateTime<Utc>,
    pub created_to: DateTime<Utc>,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub cursor: Option<String>,
    pub pages: i32,
    pub charges_seen: i32,
    pub error: Option<String>,
    /// The payment intents go first, from their own cursor.
    pub intents_cursor: Option<String>,
    pub intents_seen: i32,
    pub intents_done: bool,
}

const SYNC_COLUMNS: &str = "id, billing_period, created_from, created_to, started_at, finished_at,
    cursor, pages, charges_seen, error, intents_cursor, intents_seen, intents_done";

/// The period's unfinished sync (to resume), or a new one for the range.
#[tracing::instrument(skip_all)]
pub async fn start_or_resume(
    db: &mut PgConnection,
    period: BillingPeriod,
    created_from: DateTime<Utc>,
    created_to: DateTime<Utc>,
) -> Result<(SyncRow, bool), sqlx::Error> {
    let unfinished: Option<SyncRow> = sqlx::query_as(&format!(
        "SELECT {SYNC_COLUMNS} FROM stripe_syncs
         WHERE billing_period = $1 AND finished_at IS NULL AND created_from = $2 AND created_to = $3
         ORDER BY id DESC LIMIT 1"
    ))
    .bind(period)
    .bind(created_from)
    .bind(created_to)
    .fetch_optional(&mut *db)
    .await?;
    if let Some(sync) = unfinished {
        return Ok((sync, true));
    }
    let sync = sqlx::query_as(&format!(
        "INSERT INTO stripe_syncs (billing_period, created_from, created_to) VALUES ($1, $2, $3)
         RETURNING {SYNC_COLUMNS}"
    ))
    .bind(period)
    .bind(created_from)
    .bind(created_to)
    .fetch_one(db)
    .await?;
    Ok((sync, false))
}

/// Stores charges as Stripe described them at `described_at` (an event's
/// time, or a sync's): new ones inserted, known ones refreshed unless what
/// is stored was described later (events arrive out of order), a refund
/// never undone. A charge without the billing job's metadata takes its
/// payment intent's (Stripe keeps it there). Returns how many it changed.
#[tracing::instrument(skip_all)]
pub async fn upsert(
    db: &mut PgConnection,
    charges: &[SyncedCharge],
    described_at: DateTime<Utc>,
) -> Result<u64, sqlx::Error> {
    let column = |f: fn(&SyncedCharge) -> Option<String>| charges.iter().map(f).collect::<Vec<_>>();
    let changed = sqlx::query(
        "INSERT INTO stripe_charges AS s (id, payment_intent, stripe_customer, amount_cents, amount_refunded_cents,
             currency, status, customer_id, billing_period, created_at, idempotency_key, described_at, synced_at)
         SELECT c.id, c.payment_intent, c.stripe_customer, c.amount, c.refunded, c.currency, c.status,
                COALESCE(c.customer_id, pi.customer_id), COALESCE(c.billing_period, pi.billing_period),
                c.created_at, c.idempotency_key, $12, now()
         FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bigint[],
                     $6::text[], $7::text[], $8::text[], $9::text[], $10::timestamptz[], $11::text[])
              AS c(id, payment_intent, stripe_customer, amount, refunded, currency, status, customer_id,
                   billing_period, created_at, idempotency_key)
         LEFT JOIN stripe_payment_intents pi ON pi.id = c.payment_intent
         ON CONFLICT (id) DO UPDATE SET
             payment_intent = EXCLUDED.payment_intent, stripe_customer = EXCLUDED.stripe_customer,
             amount_cents = EXCLUDED.amount_cents,
             amount_refunded_cents = GREATEST(s.amount_refunded_cents, EXCLUDED.amount_refunded_cents),
             currency = EXCLUDED.currency, status = EXCLUDED.status, customer_id = EXCLUDED.customer_id,
             billing_period = EXCLUDED.billing_period,
             idempotency_key = COALESCE(EXCLUDED.idempotency_key, s.idempotency_key),
             described_at = EXCLUDED.described_at, synced_at = now()
         WHERE s.described_at <= EXCLUDED.described_at",
    )
    .bind(column(|c| Some(c.id.clone())))
    .bind(column(|c| c.payment_intent.clone()))
    .bind(column(|c| c.stripe_customer.clone()))
    .bind(charges.iter().map(|c| c.amount_cents.0).collect::<Vec<_>>())
    .bind(charges.iter().map(|c| c.amount_refunded_cents.0).collect::<Vec<_>>())
    .bind(column(|c| Some(c.currency.clone())))
    .bind(column(|c| Some(c.status.clone())))
    .bind(column(|c| c.customer_id.clone()))
    .bind(column(|c| c.metadata_period.clone()))
    .bind(charges.iter().map(|c| c.created_at).collect::<Vec<_>>())
    .bind(column(|c| c.idempotency_key.clone()))
    .bind(described_at)
    .execute(db)
    .await?;
    Ok(changed.rows_affected())
}

/// Stores payment intents as Stripe described them at `described_at`, as
/// [`upsert`] does charges. Returns how many it changed.
#[tracing::instrument(skip_all)]
pub async fn upsert_intents(
    db: &mut PgConnection,
    intents: &[SyncedIntent],
    described_at: DateTime<Utc>,
) -> Result<u64, sqlx::Error> {
    let column = |f: fn(&SyncedIntent) -> Option<String>| intents.iter().map(f).collect::<Vec<_>>();
    let changed = sqlx::query(
        "INSERT INTO stripe_payment_intents AS s (id, status, amount_cents, currency, stripe_customer, latest_charge,
             customer_id, billing_period, created_at, described_at, synced_at)
         SELECT *, $10, now() FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::text[],
                                          $7::text[], $8::text[], $9::timestamptz[])
         ON CONFLICT (id) DO UPDATE SET
             status = EXCLUDED.status, amount_cents = EXCLUDED.amount_cents, currency = EXCLUDED.currency,
             stripe_customer = EXCLUDED.stripe_customer, latest_charge = EXCLUDED.latest_charge,
             customer_id = EXCLUDED.customer_id, billing_period = EXCLUDED.billing_period,
             described_at = EXCLUDED.described_at, synced_at = now()
         WHERE s.described_at <= EXCLUDED.described_at",
    )
    .bind(column(|i| Some(i.id.clone())))
    .bind(column(|i| Some(i.status.clone())))
    .bind(intents.iter().map(|i| i.amount_cents.0).collect::<Vec<_>>())
    .bind(column(|i| Some(i.currency.clone())))
    .bind(column(|i| i.stripe_customer.clone()))
    .bind(column(|i| i.latest_charge.clone()))
    .bind(column(|i| i.customer_id.clone()))
    .bind(column(|i| i.metadata_period.clone()))
    .bind(intents.iter().map(|i| i.created_at).collect::<Vec<_>>())
    .bind(described_at)
    .execute(db)
    .await?;
    Ok(changed.rows_affected())
}

/// Stores one page of charges and moves the sync past it, in one
/// transaction: an interrupted sync resumes after the last page stored.
#[tracing::instrument(skip_all)]
pub async fn store_page(
    tx: &mut PgConnection,
    sync: i64,
    charges: &[SyncedCharge],
    finished: bool,
) -> Result<SyncRow, sqlx::Error> {
    upsert(tx, charges, Utc::now()).await?;
    sqlx::query_as(&format!(
        "UPDATE stripe_syncs SET pages = pages + 1, charges_seen = charges_seen + $2,
             cursor = COALESCE($3, cursor), error = NULL,
             finished_at = CASE WHEN $4 THEN now() END
         WHERE id = $1 RETURNING {SYNC_COLUMNS}"
    ))
    .bind(sync)
    .bind(charges.len() as i32)
    .bind(charges.last().map(|c| c.id.clone()))
    .bind(finished)
    .fetch_one(tx)
    .await
}

/// Stores one page of payment intents and moves the sync's intent cursor
/// past it, in one transaction (like [`store_page`]).
#[tracing::instrument(skip_all)]
pub async fn store_intent_page(
    tx: &mut PgConnection,
    sync: i64,
    intents: &[SyncedIntent],
    finished: bool,
) -> Result<SyncRow, sqlx::Error> {
    upsert_intents(tx, intents, Utc::now()).await?;
    sqlx::query_as(&format!(
        "UPDATE stripe_syncs SET pages = pages + 1, intents_seen = intents_seen + $2,
             intents_cursor = COALESCE($3, intents_cursor), intents_done = $4, error = NULL
         WHERE id = $1 RETURNING {SYNC_COLUMNS}"
    ))
    .bind(sync)
    .bind(intents.len() as i32)
    .bind(intents.last().map(|i| i.id.clone()))
    .bind(finished)
    .fetch_one(tx)
    .await
}

/// Records why a sync stopped early; it resumes from its cursor next time.
#[tracing::instrument(skip_all)]
pub async fn record_error(
    db: impl PgExecutor<'_>,
    sync: i64,
    error: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE stripe_syncs SET error = $2 WHERE id = $1")
        .bind(sync)
        .bind(error)
        .execute(db)
        .await?;
    Ok(())
}

/// The period's latest sync that ran to the end.
#[tracing::instrument(skip_all)]
pub async fn last_finished(
    db: impl PgExecutor<'_>,
    period: BillingPeriod,
) -> Result<Option<SyncRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {SYNC_COLUMNS} FROM stripe_syncs
         WHERE billing_period = $1 AND finished_at IS NOT NULL ORDER BY id DESC LIMIT 1"
    ))
    .bind(period)
    .fetch_optional(db)
    .await
}

/// The period's latest sync, finished or not.
#[tracing::instrument(skip_all)]
pub async fn last(
    db: impl PgExecutor<'_>,
    period: BillingPeriod,
) -> Result<Option<SyncRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {SYNC_COLUMNS} FROM stripe_syncs WHERE billing_period = $1 ORDER BY id DESC LIMIT 1"
    ))
    .bind(period)
    .fetch_optional(db)
    .await
}
