use leptos::prelude::*;

use crate::{
    domain::{BillingPeriod, PeriodCloseView},
    error::AppError,
};

/// A billing period's close page: its report (frozen once signed off), the
/// close if one was prepared, and the period's action log.
#[server(endpoint = "get_period_close")]
pub async fn get_period_close(period: BillingPeriod) -> Result<PeriodCloseView, AppError> {
    use crate::{domain::Role, ssr};
    crate::operators::auth::require(Role::Viewer)?;
    let pool = &expect_context::<ssr::AppState>().pool;
    crate::periods::rules::view(pool, period).await
}
