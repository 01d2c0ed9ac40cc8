use leptos::prelude::*;

use crate::{domain::TwoFactorView, error::AppError};

/// The signed-in approver's or admin's own second factor.
#[server(endpoint = "get_two_factor")]
pub async fn get_two_factor() -> Result<TwoFactorView, AppError> {
    use crate::{domain::Role, ssr};
    let me = crate::operators::auth::require(Role::Approver)?;
    let pool = &expect_context::<ssr::AppState>().pool;
    crate::operators::second_factor::view(pool, &me).await
}
