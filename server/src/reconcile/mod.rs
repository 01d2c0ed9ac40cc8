//! Reconciliation: Stripe's charges against the billing jobs' ledger. The
//! sync fills `stripe_charges`; detection (`app::reconciliation::findings`)
//! compares them with `billing_records`.

pub mod refund;
pub mod sync;

use chrono::Utc;
use sqlx::PgPool;

use app::{
    actions::sql::{self as actions, Actor},
    domain::BillingPeriod,
    keys::spend,
    reconciliation::{findings, stripe_charges},
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
    let (unknown, decided) = spend::settle_unknown(
        &mut tx,
        period,
        sync.started_at - chrono::Duration::minutes(10),
    )
    .await?;
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

/// Syncs the period from Stripe, then detects its findings (see
/// [`detect`]), and records the run in the action log as `actor`'s.
#[tracing::instrument(skip_all, fields(%period))]
pub async fn sync_and_detect(
    pool: &PgPool,
    client: &stripe::Client,
    period: BillingPeriod,
    options: &sync::SyncOptions,
    actor: Actor,
    progress: impl FnMut(&stripe_charges::SyncRow),
) -> Result<(stripe_charges::SyncRow, Detected), RunError> {
    let synced = sync::sync_period(pool, client, period, options, progress).await?;
    let detected = detect(pool, period).await?;
    let (found, unknown) = (detected.findings, detected.unknown);
    actions::record(
        pool,
        actor,
        "reconcile",
        "billing_period",
        Some(period.to_string()),
        serde_json::json!({ "sync_id": synced.id, "pages": synced.pages,
            "charges_seen": synced.charges_seen, "intents_seen": synced.intents_seen,
            "orphaned": found.orphaned, "duplicate": found.duplicate, "missing": found.missing,
            "unmetered": found.unmetered, "cleared": found.cleared,
            "unknown_settled": unknown.settled, "unknown_left": unknown.still_unknown }),
    )
    .await?;
    Ok((synced, detected))
}

/// Why a sync and detection stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Sync(#[from] sync::SyncError),
    #[error(transparent)]
    Detect(#[from] DetectError),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// Each night at `hour` (UTC) the current and the previous period are
/// synced and detected, filling whatever Stripe's events missed; a period
/// synced in the last 20 hours (by a person, or another instance) is left.
pub async fn nightly(
    pool: &PgPool,
    client: &stripe::Client,
) -> Result<Vec<BillingPeriod>, RunError> {
    let this = BillingPeriod::containing(Utc::now());
    let mut synced = Vec::new();
    for period in [this.previous(), this] {
        let recent = stripe_charges::last_finished(pool, period)
            .await?
            .is_some_and(|sync| Utc::now() - sync.started_at < chrono::Duration::hours(20));
        if recent {
            continue;
        }
        let options = sync::SyncOptions::default();
        sync_and_detect(pool, client, period, &options, Actor::System, |_| {}).await?;
        synced.push(period);
    }
    Ok(synced)
}

/// The next time it is `hour`:00 UTC after `now`.
pub fn next_at_hour(now: chrono::DateTime<Utc>, hour: u32) -> chrono::DateTime<Utc> {
    let today = now
        .date_naive()
        .and_hms_opt(hour, 0, 0)
        .expect("an hour of the day")
        .and_utc();
    if today > now {
        today
    } else {
        today + chrono::Duration::days(1)
    }
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

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    #[test]
    fn the_nightly_sync_runs_at_the_next_occurrence_of_its_hour() {
        let at = |d, h, m| Utc.with_ymd_and_hms(2026, 12, d, h, m, 0).unwrap();
        assert_eq!(next_at_hour(at(3, 2, 59), 3), at(3, 3, 0));
        assert_eq!(
            next_at_hour(at(3, 3, 0), 3),
            at(4, 3, 0),
            "not twice in one hour"
        );
        assert_eq!(next_at_hour(at(3, 21, 5), 3), at(4, 3, 0));
    }
}
