use leptos::prelude::*;

use crate::{
    domain::{KeyDetail, KeyForm, KeyList, KeyQuery},
    error::AppError,
};

/// One page of the keys list, filtered and sorted as the query asks.
#[server(endpoint = "list_vault_keys")]
pub async fn list_vault_keys(query: KeyQuery) -> Result<KeyList, AppError> {
    use crate::{
        domain::{Role, KEYS_PER_PAGE},
        keys::sql as vault_keys,
        ssr::{self},
    };
    crate::operators::auth::require(Role::Viewer)?;
    let filter = query.parse()?;
    let pool = &expect_context::<ssr::AppState>().pool;
    let now = chrono::Utc::now();
    let (rows, matching) = vault_keys::list_filtered(pool, &filter, KEYS_PER_PAGE).await?;
    let keys = rows.iter().map(|row| row.summary(now)).collect();
    Ok(KeyList {
        keys,
        matching,
        page: filter.page,
        pages: (matching + KEYS_PER_PAGE - 1) / KEYS_PER_PAGE,
        periods: vault_keys::periods(pool).await?,
    })
}

/// Everything a key's page shows, its spend chart drawn here.
#[server(endpoint = "get_vault_key")]
pub async fn get_vault_key(id: crate::domain::VaultKeyId) -> Result<KeyDetail, AppError> {
    use crate::{
        alerts::sql as alerts,
        audit::sql as audit,
        cap_increases::sql as cap_increases,
        domain::Role,
        keys::{call_stats, sql as vault_keys},
        ssr::{self, charts},
    };
    crate::operators::auth::require(Role::Viewer)?;
    let state = expect_context::<ssr::AppState>();
    let (pool, reads) = (&state.pool, &state.reads.pool);
    let now = chrono::Utc::now();
    let row = vault_keys::find_with_people(pool, id)
        .await?
        .ok_or(AppError::NotFound)?;
    let key = row.key.summary(now);
    let hourly = call_stats::hourly_spend(reads, id).await?;
    let period = row.key.billing_period;
    let from = row.key.created_at.min(period.starts_at());
    let spend_chart_svg = charts::cumulative_spend(
        &hourly,
        from,
        row.key.expires_at.max(from + chrono::Duration::hours(1)),
        now,
        key.cap,
        key.expected_total,
        &key.currency,
    );
    Ok(KeyDetail {
        duplicate_policy: row.key.duplicate_policy,
        buffer_bps: row.key.buffer_bps,
        allowed_endpoints: row.key.allowed_endpoints.clone(),
        created_at: row.key.created_at,
        created_by: row.created_by,
        revoked_at: row.key.revoked_at,
        revoked_by: row.revoked_by,
        revoke_reason: row.key.revoke_reason.clone(),
        calls: call_stats::by_decision(pool, id).await?,
        latest_calls: audit::latest_for_key(reads, id, 20).await?,
        alerts: alerts::list(pool, Some(id), None, 20).await?,
        cap_history: cap_increases::list(pool, cap_increases::Listing::Key(id), 100).await?,
        parent_key_id: row.key.parent_key_id,
        spend_chart_svg,
        spend_by_day: charts::cumulative_by_day(&hourly),
        key,
    })
}

/// The new-key form: the draft refused last (with its messages) or a fresh
/// one for this billing period, and an expected total suggested from what
/// the previous period billed.
#[server(endpoint = "new_key_form")]
pub async fn new_key_form(
    draft: Option<String>,
    checked: Option<String>,
) -> Result<KeyForm, AppError> {
    use crate::{
        domain::{BillingPeriod, KeyDraft, Role},
        keys::sql as vault_keys,
        ssr::{self, flash},
    };
    crate::operators::auth::require(Role::Operator)?;
    let state = expect_context::<ssr::AppState>();
    let session = leptos_axum::extract::<tower_sessions::Session>().await?;
    let current = BillingPeriod::containing(chrono::Utc::now());
    let refused = match draft {
        Some(id) => flash::key_draft(&session, &id).await,
        None => None,
    };
    let (draft, errors) = refused
        .clone()
        .unwrap_or_else(|| (KeyDraft::for_period(current), Vec::new()));
    let period = draft.period.parse::<BillingPeriod>().unwrap_or(current);
    let uploaded = flash::key_suggestion(&session).await;
    let suggestion = match uploaded {
        Some(uploaded) => Some(uploaded),
        None => previous_period_suggestion(&state.pool, period.previous()).await?,
    };
    let label_in_use = vault_keys::live_with_label(&state.pool, &draft.label).await?;
    Ok(KeyForm {
        checked: checked.is_some() && refused.is_some(),
        draft,
        errors,
        suggestion,
        label_in_use,
    })
}

/// What the billing records say `previous` billed, as a suggestion.
#[cfg(feature = "ssr")]
async fn previous_period_suggestion(
    pool: &sqlx::PgPool,
    previous: crate::domain::BillingPeriod,
) -> Result<Option<crate::domain::Suggestion>, AppError> {
    use crate::{
        domain::{group_thousands, Cents, Currency, Suggestion},
        reconciliation::billing_records,
    };
    let billed = billing_records::period_totals(pool, previous).await?;
    Ok(billed
        .into_iter()
        .next()
        .and_then(|(currency, customers, total)| {
            let currency = Currency::parse(&currency).ok()?;
            let customers = group_thousands(customers.unsigned_abs());
            let source =
                format!("what {previous} billed: {customers} customers in the billing records");
            Some(Suggestion {
                expected: Cents(total),
                currency,
                source,
            })
        }))
}
