//! What every console response carries for the browser's protection, and
//! the cross-site request forgery defence: a state-changing request carried
//! by the session cookie must come from one of our own pages.

use axum::{
    extract::{Request, State},
    http::{header, HeaderValue, Method, StatusCode},
    middleware::Next,
    response::{IntoResponse, Response},
};
use leptos::nonce::Nonce;

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

/// Sets the headers that keep a browser from being turned against the
/// console: a Content-Security-Policy whose scripts must carry this
/// response's nonce (the page's hydration script does; nothing injected
/// can), no framing, no referrer outside the console, no MIME sniffing,
/// and HSTS when the console is served over TLS (`secure`). The nonce is
/// put into the request for the page renderer (see `app::shell`).
pub async fn browser_headers(
    State(secure): State<bool>,
    mut request: Request,
    next: Next,
) -> Response {
    let nonce = Nonce::new();
    request.extensions_mut().insert(nonce.clone());
    let mut response = next.run(request).await;
    let policy = format!(
        "default-src 'self'; script-src 'self' 'nonce-{nonce}' 'wasm-unsafe-eval'; \
         style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; \
         object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    );
    let headers = response.headers_mut();
    if let Ok(policy) = HeaderValue::from_str(&policy) {
        headers.insert(header::CONTENT_SECURITY_POLICY, policy);
    }
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    if secure {
        headers.insert(
            header::STRICT_TRANSPORT_SECURITY,
            HeaderValue::from_static("max-age=31536000"),
        );
        secure_cookies(headers);
    }
    response
}

/// Over HTTPS every cookie Vaultcap sets is `Secure`: the session layer
/// marks its own, and this the rest (the key that opens a one-time secret).
fn secure_cookies(headers: &mut axum::http::HeaderMap) {
    let cookies: Vec<HeaderValue> = headers
        .get_all(header::SET_COOKIE)
        .iter()
        .map(|cookie| match cookie.to_str() {
            Ok(text)
                if !text
                    .split(';')
                    .any(|part| part.trim().eq_ignore_ascii_case("secure")) =>
            {
                HeaderValue::from_str(&format!("{text}; Secure")).unwrap_or_else(|_| cookie.clone())
            }
            _ => cookie.clone(),
        })
        .collect();
    headers.remove(header::SET_COOKIE);
    for cookie in cookies {
        headers.append(header::SET_COOKIE, cookie);
    }
}
