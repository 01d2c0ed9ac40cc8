//! Cross-site request forgery defence: a state-changing request carried by
//! the session cookie must come from one of our own pages.

use axum::{
    extract::Request,
    http::{header, Method, StatusCode},
    middleware::Next,
    response::{IntoResponse, Response},
};

use super::error::HttpError;

/// Refuses POST, PUT, PATCH and DELETE unless the browser says the request
/// comes from this origin (`Origin` equal to our scheme and `Host`, or
/// `Sec-Fetch-Site: same-origin` when a browser omits `Origin`). Requests
/// with an `Authorization` header are API calls: browsers never attach one
/// on their own, so they cannot be forged cross-site.
pub async fn same_origin_writes(request: Request, next: Next) -> Response {
    let safe = matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS
    );
    if safe || request.headers().contains_key(header::AUTHORIZATION) || is_same_origin(&request) {
        return next.run(request).await;
    }
    tracing::warn!(method = %request.method(), path = %request.uri().path(), "refused a cross-origin write");
    HttpError::new(
        StatusCode::FORBIDDEN,
        "This request did not come from a Vaultcap page, so it was refused. Reload the page and try again.",
    )
    .into_response()
}

fn is_same_origin(request: &Request) -> bool {
    let headers = request.headers();
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    match headers.get(header::ORIGIN).and_then(|o| o.to_str().ok()) {
        Some(origin) => {
            let authority = origin
                .strip_prefix("https://")
                .or_else(|| origin.strip_prefix("http://"));
            matches!((authority, host), (Some(a), Some(h)) if a.eq_ignore_ascii_case(h))
        }
        None => headers
            .get("sec-fetch-site")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|site| site == "same-origin"),
    }
}
