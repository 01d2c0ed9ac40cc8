use leptos::prelude::*;

use crate::{
    domain::{Me, Notice},
    error::AppError,
};

/// The signed-in operator, or `None` on the sign-in page.
#[server(endpoint = "get_me")]
pub async fn get_me() -> Result<Option<Me>, AppError> {
    Ok(crate::ssr::auth::current_operator())
}

/// The one-time notice left by the last form submission, removed as it is read.
#[server(endpoint = "take_notice")]
pub async fn take_notice() -> Result<Option<Notice>, AppError> {
    let session = leptos_axum::extract::<tower_sessions::Session>().await?;
    Ok(crate::ssr::flash::take(&session).await)
}

#[cfg(feature = "ssr")]
impl From<leptos::server_fn::error::ServerFnErrorErr> for AppError {
    fn from(err: leptos::server_fn::error::ServerFnErrorErr) -> Self {
        tracing::error!(error = %err, "server function could not read the request");
        AppError::Internal
    }
}
