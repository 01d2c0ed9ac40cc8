use leptos::prelude::*;

use crate::{domain::KeySummary, error::AppError};

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
