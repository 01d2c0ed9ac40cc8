use leptos::prelude::*;

use crate::{domain::ApiTokenSummary, error::AppError};

#[server(endpoint = "list_api_tokens")]
pub async fn list_api_tokens() -> Result<Vec<ApiTokenSummary>, AppError> {
    use crate::{domain::Role, ssr};
    crate::operators::auth::require(Role::Admin)?;
    let state = expect_context::<ssr::AppState>();
    Ok(crate::operators::tokens_sql::list(&state.pool).await?)
}
