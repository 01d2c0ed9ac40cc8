use leptos::prelude::*;

use crate::{
    domain::{KeyForm, KeySummary},
    error::AppError,
};

#[server(endpoint = "list_vault_keys")]
pub async fn list_vault_keys() -> Result<Vec<KeySummary>, AppError> {
    use crate::{domain::Role, ssr};
    /// The most keys the list shows until it gains filters and paging.
    const KEY_LIST_LIMIT: i64 = 200;
    ssr::auth::require(Role::Viewer)?;
    let state = expect_context::<ssr::AppState>();
    let now = chrono::Utc::now();
    let rows = ssr::data::vault_keys::list(&state.pool, KEY_LIST_LIMIT).await?;
    rows.iter()
        .map(|row| row.summary(now).map_err(AppError::from))
        .collect()
}

/// The new-key form: the draft refused last (with its messages) or a fresh
/// one for this billing period, and an expected total suggested from what
/// the previous period billed.
#[server(endpoint = "new_key_form")]
pub async fn new_key_form(draft: Option<String>) -> Result<KeyForm, AppError> {
    use crate::{
        domain::{group_thousands, BillingPeriod, Cents, Currency, KeyDraft, Role, Suggestion},
        ssr::{self, data::billing_records, flash},
    };
    ssr::auth::require(Role::Operator)?;
    let state = expect_context::<ssr::AppState>();
    let session = leptos_axum::extract::<tower_sessions::Session>().await?;
    let current = BillingPeriod::containing(chrono::Utc::now());
    let refused = match draft {
        Some(id) => flash::key_draft(&session, &id).await,
        None => None,
    };
    let (draft, errors) = refused.unwrap_or_else(|| (KeyDraft::for_period(current), Vec::new()));
    let period = draft.period.parse::<BillingPeriod>().unwrap_or(current);
    let previous = period.previous();
    let billed = billing_records::period_totals(&state.pool, previous).await?;
    let suggestion = billed
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
        });
    Ok(KeyForm {
        draft,
        errors,
        suggestion,
    })
}
