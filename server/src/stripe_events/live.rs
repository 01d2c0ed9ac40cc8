//! Findings without a sync: every few seconds, the calls of unknown
//! outcome that a charge Stripe's events stored lately explains are settled
//! (a charge's event can arrive before the proxy gives up on its answer),
//! and each period whose charges the events changed is detected again:
//! duplicates, charges that no vault key's call made (unmetered), and
//! orphans once the billing job has had [`ORPHAN_GRACE`] to write its
//! record. Missing charges and clearing wait for a sync, which sees every
//! charge (the events may not have).

use chrono::{DateTime, Duration, Utc};
use sqlx::PgPool;

use app::{domain::BillingPeriod, keys::spend, reconciliation::findings};

/// A billing job writes its record after Stripe answers: a charge without
/// one is an orphan only once this has passed.
pub const ORPHAN_GRACE: Duration = Duration::minutes(2);

/// How often a pass runs.
pub const EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Charges of events received within this long settle calls that became of
/// unknown outcome since (a call is given up 90 s or more after it began);
/// and the first pass of a process detects the periods of these events.
const RECENT: Duration = Duration::minutes(3);

/// A pass looks again at events received this long before the previous
/// one started: a webhook's transaction may commit after a pass has read
/// (an event's `received_at` is when its transaction began).
const OVERLAP: Duration = Duration::seconds(15);

/// What one pass did, per period.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Pass {
    pub periods: Vec<BillingPeriod>,
    pub settled: u64,
}

/// One pass (see the module). `since`: when this process's previous pass
/// started, if it ran one. A period is detected again only when an event
/// about it arrived since then, or when such an event's orphan grace ended
/// since then; not on every pass while its events are recent.
#[tracing::instrument(skip_all)]
pub async fn pass(pool: &PgPool, since: Option<DateTime<Utc>>) -> Result<Pass, sqlx::Error> {
    let now = Utc::now();
    let from = since.map_or(now - RECENT, |since| since - OVERLAP);
    let mut done = Pass::default();
    let unexplained: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT c.id FROM stripe_events e JOIN stripe_charges c ON c.id = e.object_id
         WHERE e.received_at > $1
           AND NOT EXISTS (SELECT 1 FROM reservations r WHERE r.stripe_charge_id = c.id)
           -- Only a call of unknown outcome is settled here.
           AND EXISTS (SELECT 1 FROM reservations r WHERE r.state = 'outcome_unknown')",
    )
    .bind(now - RECENT)
    .fetch_all(pool)
    .await?;
    for charge in unexplained {
        let mut tx = pool.begin().await?;
        if let Some(decided) = spend::settle_unknown_by_charge(&mut tx, &charge).await? {
            super::apply::record_decided(&mut tx, decided, &charge, None).await?;
            done.settled += 1;
        }
        tx.commit().await?;
    }
    let periods: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT COALESCE(c.billing_period, to_char(c.created_at AT TIME ZONE 'UTC', 'YYYY-MM'))
         FROM stripe_events e JOIN stripe_charges c ON c.id = e.object_id
         WHERE e.received_at > $1 OR (e.received_at > $2 AND e.received_at <= $3)",
    )
    .bind(from)
    .bind(from - ORPHAN_GRACE)
    .bind(now - ORPHAN_GRACE)
    .fetch_all(pool)
    .await?;
    for period in periods {
        // Junk in a charge's metadata names no period.
        let Ok(period) = period.parse::<BillingPeriod>() else {
            continue;
        };
        let mut tx = pool.begin().await?;
        findings::detect_live(&mut tx, period, now, now - ORPHAN_GRACE).await?;
        tx.commit().await?;
        done.periods.push(period);
    }
    Ok(done)
}
