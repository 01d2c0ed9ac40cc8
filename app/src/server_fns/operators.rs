use leptos::prelude::*;

use crate::{domain::OperatorSummary, error::AppError};

#[server(endpoint = "list_operators")]
pub async fn list_operators() -> Result<Vec<OperatorSummary>, AppError> {
    use crate::{domain::Role, ssr};
    crate::operators::auth::require(Role::Admin)?;
    let state = expect_context::<ssr::AppState>();
    let operators = crate::operators::sql::list(&state.pool).await?;
    Ok(operators.iter().map(|op| op.summary()).collect())
}
