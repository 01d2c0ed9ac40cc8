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
        domain::{BillingPeriod, Cents, Currency, FindingKind, FindingTotal, Role, SyncSummary},
        ssr::{
            self,
            data::{findings, stripe_charges},
        },
    };
    ssr::auth::require(Role::Viewer)?;
    let period: BillingPeriod = match period.as_deref().map(str::trim) {
        None | Some("") => BillingPeriod::containing(chrono::Utc::now()),
        Some(raw) => raw.parse()?,
    };
    let kind = match kind.as_deref() {
        None | Some("") | Some("all") => None,
        Some(raw) => Some(FindingKind::parse(raw).ok_or_else(|| {
            AppError::Invalid(format!(
                "{raw:?} is not a kind of finding: use orphaned, duplicate or missing"
            ))
        })?),
    };
    let state = state.unwrap_or_else(|| "open".into());
    let open = match state.as_str() {
        "open" => Some(true),
        "resolved" => Some(false),
        "all" => None,
        other => {
            return Err(AppError::Invalid(format!(
                "{other:?} is not a state: use open, resolved or all"
            )))
        }
    };
    let pool = &expect_context::<ssr::AppState>().pool;
    let name = period.to_string();
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
        findings: findings::list(pool, &name, kind, open, 500).await?,
        periods: findings::periods(pool).await?,
        period: name,
        last_sync,
        totals,
        state,
        kind,
    })
}
