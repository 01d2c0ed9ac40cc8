use leptos::prelude::*;

use crate::{domain::Overview, error::AppError};

/// Keys the daily spend chart draws (those that spent most).
#[cfg(feature = "ssr")]
const CHARTED_KEYS: i64 = 8;

/// Billing periods the overview lists with their state.
#[cfg(feature = "ssr")]
const PERIODS_LISTED: i64 = 6;

/// Where the current billing period (UTC) stands: totals, keys near their
/// caps, alerts, refusals and daily spend. Reads only vault_keys, alerts
/// and the call counters, never the audit log.
#[server(endpoint = "get_overview")]
pub async fn get_overview() -> Result<Overview, AppError> {
    use crate::{
        alerts::sql as alerts,
        domain::{BillingPeriod, KeyQuery, Role},
        keys::{call_stats, sql as vault_keys},
        periods::sql as period_closes,
        reconciliation::billing_records,
        ssr::{self},
    };
    crate::operators::auth::require(Role::Viewer)?;
    let state = expect_context::<ssr::AppState>();
    let pool = &state.pool;
    let now = chrono::Utc::now();
    let period = BillingPeriod::containing(now);
    let totals = vault_keys::period_totals(pool, period).await?;
    let (billing_records, billed_customers_amount) =
        billing_records::charged_in_period(pool, period).await?;
    let near_cap = KeyQuery {
        period: Some(period.to_string()),
        at_threshold: Some("1".into()),
        sort: Some("utilization".into()),
        ..KeyQuery::default()
    }
    .parse()?;
    let (rows, at_threshold_count) = vault_keys::list_filtered(pool, &near_cap, 10).await?;
    let at_threshold = rows.iter().map(|row| row.summary(now)).collect();
    let charted = vault_keys::top_spenders(pool, period, CHARTED_KEYS).await?;
    let ids: Vec<_> = charted.iter().map(|row| row.id).collect();
    let daily = call_stats::daily_spend(
        &state.reads.pool,
        &ids,
        period.starts_at(),
        period.ends_at(),
    )
    .await?;
    Ok(Overview {
        period,
        as_of: now,
        totals,
        billing_records,
        billed_customers_amount,
        at_threshold,
        at_threshold_count,
        open_alerts: alerts::open_count(pool).await?,
        refused_last_24h: call_stats::refused_since(pool, now - chrono::Duration::hours(24))
            .await?,
        daily_spend: spend_charts(period, &charted, &daily)?,
        periods: period_closes::statuses(pool, PERIODS_LISTED).await?,
    })
}

/// One chart per currency, a line per key.
#[cfg(feature = "ssr")]
fn spend_charts(
    period: crate::domain::BillingPeriod,
    keys: &[crate::keys::sql::VaultKeyRow],
    daily: &[(
        crate::domain::VaultKeyId,
        chrono::NaiveDate,
        crate::domain::Cents,
    )],
) -> Result<Vec<crate::domain::SpendChart>, AppError> {
    use crate::{
        domain::{Currency, SpendChart},
        ssr::charts,
    };
    let first = period.starts_at().date_naive();
    let last = (period.ends_at() - chrono::Duration::days(1)).date_naive();
    let today = chrono::Utc::now().date_naive();
    let mut currencies: Vec<&Currency> = keys.iter().map(|k| &k.currency).collect();
    currencies.sort_unstable();
    currencies.dedup();
    currencies
        .into_iter()
        .map(|currency| {
            let currency = currency.clone();
            let keys: Vec<_> = keys.iter().filter(|k| k.currency == currency).collect();
            let series: Vec<Vec<_>> = keys
                .iter()
                .map(|key| {
                    daily
                        .iter()
                        .filter(|(id, _, _)| *id == key.id)
                        .map(|(_, day, spent)| (*day, *spent))
                        .collect()
                })
                .collect();
            let legend = keys
                .iter()
                .zip(charts::SERIES.iter().cycle())
                .map(|(key, colour)| {
                    (
                        key.id,
                        key.label.clone(),
                        charts::css_colour(*colour),
                        key.spent_cents,
                    )
                })
                .collect();
            Ok(SpendChart {
                svg: charts::daily_spend(&series, first, last, today, &currency),
                by_day: charts::by_day(&series),
                currency,
                legend,
            })
        })
        .collect()
}
