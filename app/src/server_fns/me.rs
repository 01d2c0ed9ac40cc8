use leptos::prelude::*;

use crate::{
    domain::{Me, Notice},
    error::AppError,
};

/// The signed-in operator, or `None` on the sign-in page.
#[server(endpoint = "get_me")]
pub async fn get_me() -> Result<Option<Me>, AppError> {
    Ok(crate::operators::auth::current_operator())
}

/// The one-time notice left by the last form submission, removed as it is
/// read; a sealed secret in it is opened with the browser's reveal cookie,
/// which is then removed.
#[server(endpoint = "take_notice")]
pub async fn take_notice() -> Result<Option<Notice>, AppError> {
    use crate::ssr::flash;
    use http::{header, HeaderValue};
    let session = leptos_axum::extract::<tower_sessions::Session>().await?;
    let headers = leptos_axum::extract::<http::HeaderMap>().await?;
    let cookies = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .collect::<Vec<_>>()
        .join("; ");
    let notice = flash::take(&session, Some(&cookies)).await;
    let response = expect_context::<leptos_axum::ResponseOptions>();
    if cookies.contains(flash::REVEAL_COOKIE) {
        if let Ok(forget) = HeaderValue::from_str(&flash::forget_reveal_cookie()) {
            response.append_header(header::SET_COOKIE, forget);
        }
    }
    if notice
        .as_ref()
        .is_some_and(|notice| notice.secret.is_some())
    {
        // Not from the browser's cache or history either.
        response.insert_header(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    Ok(notice)
}

#[cfg(feature = "ssr")]
impl From<leptos::server_fn::error::ServerFnErrorErr> for AppError {
    fn from(err: leptos::server_fn::error::ServerFnErrorErr) -> Self {
        tracing::error!(error = %err, "server function could not read the request");
        AppError::Internal
    }
}
