use leptos::prelude::*;

use crate::{domain::ReplicaLag, error::AppError};

/// How far the read replica trails the primary, when a page read from it
/// may be missing the newest rows; `None` when it is close enough or reads
/// go to the primary.
#[server(endpoint = "replica_lag")]
pub async fn get_replica_lag() -> Result<Option<ReplicaLag>, AppError> {
    use crate::{domain::Role, ssr};
    crate::operators::auth::require(Role::Viewer)?;
    let state = expect_context::<ssr::AppState>();
    Ok(state.reads.lag(&state.pool).await?)
}
