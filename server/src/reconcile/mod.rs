//! Reconciliation: Stripe's charges against the billing jobs' ledger. The
//! sync fills `stripe_charges`; detection (`app::ssr::data::findings`)
//! compares them with `billing_records`.

pub mod refund;
pub mod sync;

use chrono::Utc;
use sqlx::PgPool;

use app::{
    domain::BillingPeriod,
    ssr::data::{
        actions::{self, Actor},
        findings, spend, stripe_charges,
    },
};

/// Detects findings for a period from its last finished sync, and settles
/// the period's calls of unknown outcome that a synced charge names (each
/// recorded in the action log); the others stay reserved until Stripe is
/// asked about them (`jobs::unknown_outcomes`) or a person decides.
#[tracing::instrument(skip_all)]
pub async fn detect(pool: &PgPool, period: BillingPeriod) -> Result<Detected, DetectError> {
    let Some(sync) = stripe_charges::last_finished(pool, period).await? else {
        return Err(DetectError::NotSynced(period));
    };
    let mut tx = pool.begin().await?;
    let findings = findings::detect(&mut tx, period, Utc::now()).await?;
    let (unknown, decided) = spend::settle_unknown(&mut tx, period, sync.started_at).await?;
    for (reservation, charge) in decided {
        actions::record(
            &mut *tx,
            Actor::System,
            "reservation.settle",
            "reservation",
            Some(reservation.to_string()),
            serde_json::json!({ "stripe_charge_id": charge, "sync_id": sync.id }),
        )
        .await?;
    }
    tx.commit().await?;
    Ok(Detected { findings, unknown })
}

/// What one detection did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Detected {
    pub findings: findings::Detected,
    pub unknown: spend::UnknownOutcomes,
}

#[derive(Debug, thiserror::Error)]
pub enum DetectError {
    /// Without a finished sync every billing record would look missing.
    #[error("no sync of {0} has finished yet: run one first (vaultcap reconcile --period {0})")]
    NotSynced(BillingPeriod),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}
