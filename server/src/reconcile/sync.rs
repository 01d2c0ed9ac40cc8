//! The Stripe sync: every payment intent and then every charge created in
//! a billing period (plus a margin either side) into
//! `stripe_payment_intents` and `stripe_charges`, page by page, with
//! async-stripe. Intents go first: Stripe keeps a billing job's metadata on
//! the intent, and a charge it made is stored with that metadata.
//!
//! Each page is stored with the sync's progress in one transaction, so an
//! interrupted sync (a crash, a Stripe error) resumes after the last page
//! it stored. Rate limits (429) and Stripe's retryable errors are retried
//! with exponential backoff by the client. One sync per period runs at a
//! time (a PostgreSQL advisory lock held for the run).

use chrono::{DateTime, Duration, TimeZone, Utc};
use sqlx::PgPool;
use stripe::{Client, ClientBuilder, StripeError};
use stripe_core::{charge::ListCharge, payment_intent::ListPaymentIntent};
use stripe_types::{RangeBoundsTs, RangeQueryTs};

use app::{
    domain::{BillingPeriod, Cents},
    reconciliation::stripe_charges::{self, SyncRow, SyncedCharge, SyncedIntent},
};

/// How a sync asks Stripe.
#[derive(Debug, Clone, Copy)]
pub struct SyncOptions {
    /// Charges created this long before the period starts or after it ends
    /// are included (a run near midnight, clocks, late retries).
    pub margin: Duration,
    /// Charges per page, 1 to 100.
    pub page_size: i64,
    /// Attempts per page on a 429 or a retryable Stripe error.
    pub attempts: u32,
}

impl Default for SyncOptions {
    fn default() -> Self {
        Self {
            margin: Duration::days(3),
            page_size: 100,
            attempts: 5,
        }
    }
}

/// Why a sync stopped.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("a sync of {0} is already running")]
    Busy(String),
    /// Stripe refused or failed; the sync resumes from its last page.
    #[error("{0}")]
    Stripe(String),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// A client for `base` (Stripe, or a stand-in in tests) with the real key.
pub fn client(base: &str, secret_key: &str, options: &SyncOptions) -> Result<Client, SyncError> {
    ClientBuilder::new(secret_key)
        .url(base)
        .request_strategy(stripe::RequestStrategy::ExponentialBackoff(
            options.attempts,
        ))
        .build()
        .map_err(|err| SyncError::Stripe(format!("the Stripe client could not be set up: {err}")))
}

/// Syncs the period's charges, calling `progress` after every page stored.
/// Returns the finished sync.
#[tracing::instrument(skip_all)]
pub async fn sync_period(
    pool: &PgPool,
    client: &Client,
    period: BillingPeriod,
    options: &SyncOptions,
    mut progress: impl FnMut(&SyncRow),
) -> Result<SyncRow, SyncError> {
    let sync = run(pool, client, period, options, &mut progress);
    crate::jobs::once_in_fleet(pool, &format!("stripe_sync:{period}"), sync)
        .await?
        .unwrap_or_else(|| Err(SyncError::Busy(period.to_string())))
}

async fn run(
    pool: &PgPool,
    client: &Client,
    period: BillingPeriod,
    options: &SyncOptions,
    progress: &mut impl FnMut(&SyncRow),
) -> Result<SyncRow, SyncError> {
    let from = period.starts_at() - options.margin;
    let to = period.ends_at() + options.margin;
    let mut conn = pool.acquire().await?;
    let (mut sync, _resumed) = stripe_charges::start_or_resume(&mut conn, period, from, to).await?;
    drop(conn);
    let created = || {
        RangeQueryTs::Bounds(RangeBoundsTs {
            gte: Some(from.timestamp()),
            lt: Some(to.timestamp()),
            ..RangeBoundsTs::default()
        })
    };
    let failed = |sync: &SyncRow, err: StripeError| {
        let (pool, id) = (pool.clone(), sync.id);
        async move {
            let message = describe(&err);
            stripe_charges::record_error(&pool, id, &message).await?;
            Err::<SyncRow, _>(SyncError::Stripe(message))
        }
    };
    while !sync.intents_done {
        let mut request = ListPaymentIntent::new()
            .created(created())
            .limit(options.page_size);
        if let Some(cursor) = &sync.intents_cursor {
            request = request.starting_after(cursor.clone());
        }
        let page = match request.send(client).await {
            Ok(page) => page,
            Err(err) => return failed(&sync, err).await,
        };
        let intents: Vec<SyncedIntent> = page.data.iter().map(synced_intent).collect();
        let finished = !page.has_more || intents.is_empty();
        let mut tx = pool.begin().await?;
        sync = stripe_charges::store_intent_page(&mut tx, sync.id, &intents, finished).await?;
        tx.commit().await?;
        progress(&sync);
    }
    loop {
        let mut request = ListCharge::new()
            .created(created())
            .limit(options.page_size);
        if let Some(cursor) = &sync.cursor {
            request = request.starting_after(cursor.clone());
        }
        let page = match request.send(client).await {
            Ok(page) => page,
            Err(err) => return failed(&sync, err).await,
        };
        let charges: Vec<SyncedCharge> = page.data.iter().map(synced).collect();
        let finished = !page.has_more || charges.is_empty();
        let mut tx = pool.begin().await?;
        sync = stripe_charges::store_page(&mut tx, sync.id, &charges, finished).await?;
        tx.commit().await?;
        progress(&sync);
        if finished {
            return Ok(sync);
        }
    }
}

/// The charge as `stripe_charges` keeps it.
pub fn synced(charge: &stripe_core::Charge) -> SyncedCharge {
    SyncedCharge {
        id: charge.id.to_string(),
        payment_intent: charge.payment_intent.as_ref().map(|pi| pi.id().to_string()),
        stripe_customer: charge.customer.as_ref().map(|c| c.id().to_string()),
        amount_cents: Cents(charge.amount),
        amount_refunded_cents: Cents(charge.amount_refunded),
        currency: charge.currency.to_string(),
        status: charge.status.as_str().to_owned(),
        customer_id: charge.metadata.get("customer_id").cloned(),
        metadata_period: charge.metadata.get("billing_period").cloned(),
        created_at: Utc
            .timestamp_opt(charge.created, 0)
            .single()
            .unwrap_or(DateTime::<Utc>::MIN_UTC),
        idempotency_key: None,
    }
}

/// The payment intent as `stripe_payment_intents` keeps it.
pub fn synced_intent(intent: &stripe_core::PaymentIntent) -> SyncedIntent {
    SyncedIntent {
        id: intent.id.to_string(),
        status: intent.status.as_str().to_owned(),
        amount_cents: Cents(intent.amount),
        currency: intent.currency.to_string(),
        stripe_customer: intent.customer.as_ref().map(|c| c.id().to_string()),
        latest_charge: intent.latest_charge.as_ref().map(|c| c.id().to_string()),
        customer_id: intent.metadata.get("customer_id").cloned(),
        metadata_period: intent.metadata.get("billing_period").cloned(),
        created_at: Utc
            .timestamp_opt(intent.created, 0)
            .single()
            .unwrap_or(DateTime::<Utc>::MIN_UTC),
    }
}

/// What went wrong, for the operator: the status and Stripe's own message.
pub fn describe(err: &StripeError) -> String {
    match err {
        StripeError::Stripe(error, 401) => format!(
            "Stripe refused the API key (401): {}; check STRIPE_SECRET_KEY",
            error.message.as_deref().unwrap_or("no message")
        ),
        StripeError::Stripe(error, 429) => format!(
            "Stripe kept answering 429 (rate limited) after the retries: {}; run the sync again later",
            error.message.as_deref().unwrap_or("no message")
        ),
        StripeError::Stripe(error, status) => format!(
            "Stripe answered {status}: {}",
            error.message.as_deref().unwrap_or("no message")
        ),
        StripeError::JSONDeserialize(detail) => {
            format!("Stripe's answer could not be read: {detail}")
        }
        other => format!("Stripe could not be reached: {other}"),
    }
}
