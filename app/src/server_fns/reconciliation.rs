use leptos::prelude::*;

use crate::{domain::ReconciliationView, error::AppError};

/// A period's findings (the current UTC period when none is given) with the
/// money at risk per kind and the period's last sync.
#[server(endpoint = "get_reconciliation")]
pub async fn get_reconciliation(
    period: Option<String>,
    kind: Option<String>,
    state: Option<String>,
) -> Result<ReconciliationView, AppError> {
    use crate::{
        domain::{Cents, Currency, FindingFilter, FindingKind, FindingTotal, Role, SyncSummary},
        ssr::{
            self,
            data::{findings, stripe_charges},
        },
    };
    ssr::auth::require(Role::Viewer)?;
    let filter = FindingFilter::parse(
        period.as_deref(),
        kind.as_deref(),
        state.as_deref(),
        chrono::Utc::now(),
    )?;
    let pool = &expect_context::<ssr::AppState>().pool;
    let name = filter.period.to_string();
    let last_sync = stripe_charges::last(pool, &name)
        .await?
        .map(|s| SyncSummary {
            started_at: s.started_at,
            finished_at: s.finished_at,
            pages: s.pages,
            charges_seen: s.charges_seen,
            error: s.error,
        });
    let totals = findings::totals(pool, &name)
        .await?
        .into_iter()
        .filter_map(|(kind, currency, open, at_risk)| {
            Some(FindingTotal {
                kind: FindingKind::parse(&kind)?,
                currency: Currency::parse(&currency).ok()?,
                open,
                at_risk: Cents(at_risk),
            })
        })
        .collect();
    Ok(ReconciliationView {
        findings: findings::list(pool, &name, filter.kind, filter.open, 500).await?,
        periods: findings::periods(pool).await?,
        export_query: format!(
            "period={name}&kind={}&state={}",
            filter.kind.map(FindingKind::as_str).unwrap_or("all"),
            filter.state()
        ),
        period: name,
        last_sync,
        totals,
        state: filter.state().to_owned(),
        kind: filter.kind,
    })
}
