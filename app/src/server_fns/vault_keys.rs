use leptos::prelude::*;

use crate::{domain::KeySummary, error::AppError};

#[server(endpoint = "list_vault_keys")]
pub async fn list_vault_keys() -> Result<Vec<KeySummary>, AppError> {
    use crate::{domain::Role, ssr};
    /// The most keys the list shows until it gains filters and paging.
    const KEY_LIST_LIMIT: i64 = 200;
    ssr::auth::require(Role::Viewer)?;
    let state = expect_context::<ssr::AppState>();
    Ok(ssr::data::keys::list(&state.pool, KEY_LIST_LIMIT).await?)
}
