use leptos::prelude::*;

use crate::{domain::ReconciliationView, error::AppError};

/// A period's findings (the current UTC period when none is given) with the
/// money at risk per kind and the period's last sync.
#[server(endpoint = "get_reconciliation")]
pub async fn get_reconciliation(
    period: Option<String>,
    kind: Option<String>,
    state: Option<String>,
    customer: Option<String>,
) -> Result<ReconciliationView, AppError> {
    use crate::{
        domain::{FindingFilter, Role, SyncState, SyncSummary},
        reconciliation::{findings, stripe_charges},
        ssr::{self},
    };
    crate::operators::auth::require(Role::Viewer)?;
    let filter = FindingFilter::parse(
        period.as_deref(),
        kind.as_deref(),
        state.as_deref(),
        customer.as_deref(),
        chrono::Utc::now(),
    )?;
    let state = expect_context::<ssr::AppState>();
    let pool = &state.reads.pool;
    let last_sync = stripe_charges::last(pool, filter.period)
        .await?
        .map(|s| SyncSummary {
            started_at: s.started_at,
            finished_at: s.finished_at,
            pages: s.pages,
            charges_seen: s.charges_seen,
            intents_seen: s.intents_seen,
            error: s.error,
        });
    let totals = findings::totals(pool, filter.period).await?;
    Ok(ReconciliationView {
        findings: findings::list(pool, &filter, 500).await?,
        periods: findings::periods(pool).await?,
        export_query: filter.query(),
        period: filter.period,
        sync: SyncState::of(last_sync, chrono::Utc::now()),
        sync_unavailable: (!state.stripe_configured).then(|| {
            "this server has no Stripe secret key: start vaultcap serve with STRIPE_SECRET_KEY set"
                .to_owned()
        }),
        totals,
        state: filter.state().to_owned(),
        kind: filter.kind,
        customer: filter.customer.unwrap_or_default(),
    })
}

/// One finding with all its evidence: the charges side by side, the billing
/// record, the proxy calls and what people did about it.
#[server(endpoint = "get_finding")]
pub async fn get_finding(
    id: crate::domain::FindingId,
) -> Result<crate::domain::FindingEvidence, AppError> {
    use crate::{
        actions::sql as actions,
        domain::{FindingEvidence, Role},
        reconciliation::{findings, stripe_charges},
        ssr::{self},
    };
    crate::operators::auth::require(Role::Viewer)?;
    let pool = &expect_context::<ssr::AppState>().pool;
    let finding = findings::find(pool, id).await?.ok_or(AppError::NotFound)?;
    Ok(FindingEvidence {
        charges: findings::evidence_charges(pool, &finding).await?,
        record: findings::evidence_record(pool, &finding).await?,
        calls: findings::evidence_calls(pool, &finding).await?,
        history: actions::for_subject(pool, "finding", &id.to_string()).await?,
        last_synced_at: stripe_charges::last(pool, finding.billing_period)
            .await?
            .and_then(|sync| sync.finished_at),
        keys: findings::attributable_keys(pool, &finding).await?,
        finding,
    })
}

/// What a bulk action over the page's filtered set would do: the open
/// findings it applies to and the money at risk, before anyone confirms.
#[server(endpoint = "preview_bulk")]
pub async fn preview_bulk(
    period: Option<String>,
    kind: Option<String>,
    customer: Option<String>,
    action: Option<String>,
) -> Result<crate::domain::BulkPreview, AppError> {
    use crate::{
        domain::{BulkAction, BulkPreview, FindingFilter, Role, MAX_BULK},
        reconciliation::findings,
        ssr::{self},
    };
    crate::operators::auth::require(Role::Operator)?;
    let action = BulkAction::parse(action.as_deref().unwrap_or_default())?;
    let shown = FindingFilter::parse(
        period.as_deref(),
        kind.as_deref(),
        None,
        customer.as_deref(),
        chrono::Utc::now(),
    )?;
    let kind = match (action.kind(), shown.kind) {
        (Some(needed), Some(shown)) if needed != shown => {
            return Err(AppError::Invalid(format!(
                "{} applies to {} only, and the page shows {}",
                action.label(),
                needed.label().to_lowercase(),
                shown.label().to_lowercase()
            )))
        }
        (needed, shown) => needed.or(shown),
    };
    let filter = FindingFilter {
        kind,
        open: Some(true),
        ..shown.clone()
    };
    let pool = &expect_context::<ssr::AppState>().pool;
    let found = findings::list(pool, &filter, MAX_BULK as i64).await?;
    let open = findings::count(pool, &filter).await?;
    Ok(BulkPreview {
        totals: crate::domain::at_risk_by_currency(&found),
        action,
        left_over: open - found.len() as i64,
        period: filter.period,
        kind,
        customer: filter.customer.clone().unwrap_or_default(),
        back_query: shown.query(),
        findings: found,
    })
}
