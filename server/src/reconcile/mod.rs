//! Reconciliation: Stripe's charges against the billing jobs' ledger. The
//! sync fills `stripe_charges`; detection (`app::ssr::data::findings`)
//! compares them with `billing_records`.

pub mod refund;
pub mod sync;

use chrono::Utc;
use sqlx::PgPool;

use app::{
    domain::BillingPeriod,
    ssr::data::{findings, stripe_charges},
};

/// Detects findings for a period from its last finished sync.
pub async fn detect(
    pool: &PgPool,
    period: BillingPeriod,
) -> Result<findings::Detected, DetectError> {
    if stripe_charges::last_finished(pool, &period.to_string())
        .await?
        .is_none()
    {
        return Err(DetectError::NotSynced(period));
    }
    let mut tx = pool.begin().await?;
    let found = findings::detect(&mut tx, period, Utc::now()).await?;
    tx.commit().await?;
    Ok(found)
}

#[derive(Debug, thiserror::Error)]
pub enum DetectError {
    /// Without a finished sync every billing record would look missing.
    #[error("no sync of {0} has finished yet: run one first (vaultcap reconcile --period {0})")]
    NotSynced(BillingPeriod),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}
