use leptos::prelude::*;

use crate::{domain::Overview, error::AppError};

/// Totals for the current billing period (UTC).
#[server(endpoint = "get_overview")]
pub async fn get_overview() -> Result<Overview, AppError> {
    use crate::{
        domain::{BillingPeriod, Role},
        ssr,
    };
    ssr::auth::require(Role::Viewer)?;
    let state = expect_context::<ssr::AppState>();
    let period = BillingPeriod::containing(chrono::Utc::now());
    let totals = ssr::data::vault_keys::period_totals(&state.pool, period).await?;
    let (billing_records, billed_customers_amount) =
        ssr::data::billing_records::charged_in_period(&state.pool, period).await?;
    Ok(Overview {
        period,
        totals,
        billing_records,
        billed_customers_amount,
    })
}
