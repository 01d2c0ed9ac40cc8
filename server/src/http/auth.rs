//! Signing in and out, and the middleware that tells every request who is
//! behind it.

use axum::{
    extract::{rejection::FormRejection, Request, State},
    http::{header, Method, StatusCode},
    middleware::Next,
    response::{IntoResponse, Redirect, Response},
    Form,
};
use serde::Deserialize;
use tower_sessions::Session;

use super::{client_ip::ClientIp, error::HttpError, forms::redirect_with};
use app::{
    domain::{is_local_path, Notice},
    ssr::{
        accounts::{self, SignInError},
        auth::{begin_session, end_session, resolve_session, SessionState},
        AppState,
    },
};

#[derive(Debug, Deserialize)]
pub struct SignInForm {
    email: String,
    password: String,
    #[serde(default)]
    next: String,
}

pub async fn login(
    State(state): State<AppState>,
    ClientIp(ip): ClientIp,
    session: Session,
    form: Result<Form<SignInForm>, FormRejection>,
) -> Response {
    let form = match form {
        Ok(Form(form)) => form,
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return rejection.into_response()
        }
        Err(_) => return Redirect::to("/login?error=form").into_response(),
    };
    if form.email.trim().is_empty() || form.password.is_empty() {
        return Redirect::to(&login_url("form", &form.next)).into_response();
    }
    let signed_in = accounts::sign_in(
        &state.pool,
        &state.auth,
        &state.password_checks,
        &form.email,
        form.password,
        ip,
    )
    .await;
    match signed_in {
        Ok(operator) => {
            if let Err(err) = begin_session(&session, operator.id).await {
                return HttpError::from(err).into_response();
            }
            let next = if is_local_path(&form.next) && form.next != "/login" {
                form.next.as_str()
            } else {
                "/"
            };
            Redirect::to(next).into_response()
        }
        Err(SignInError::Internal) => {
            HttpError::from(app::error::AppError::Internal).into_response()
        }
        Err(SignInError::Busy) => (
            [(header::RETRY_AFTER, "5")],
            HttpError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                SignInError::Busy.to_string(),
            ),
        )
            .into_response(),
        Err(err) => {
            let code = match err {
                SignInError::Throttled { retry_after } => {
                    // Whole seconds, rounded up: never "try again in 0".
                    let seconds = (retry_after.num_milliseconds() + 999) / 1000;
                    format!("throttled&wait={}", seconds.max(1))
                }
                SignInError::Disabled => "disabled".into(),
                _ => "invalid".into(),
            };
            Redirect::to(&login_url(&code, &form.next)).into_response()
        }
    }
}

fn login_url(error: &str, next: &str) -> String {
    let mut url = format!("/login?error={error}");
    if is_local_path(next) {
        url.push_str("&next=");
        url.push_str(&urlencode(next));
    }
    url
}

fn urlencode(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

#[derive(Debug, Deserialize)]
pub struct InvitationForm {
    #[serde(default)]
    token: String,
    #[serde(default)]
    password: String,
    #[serde(default)]
    password_again: String,
}

/// An invited operator sets their password from their link; then signs in.
pub async fn accept_invitation(
    State(state): State<AppState>,
    ClientIp(ip): ClientIp,
    session: Session,
    form: Result<Form<InvitationForm>, FormRejection>,
) -> Response {
    let form = match form {
        Ok(Form(form)) => form,
        Err(rejection) => return rejection.into_response(),
    };
    let outcome = if form.password != form.password_again {
        Err(app::error::AppError::Invalid(
            "the two passwords differ".into(),
        ))
    } else {
        accounts::accept_invitation(&state.pool, &form.token, form.password, ip).await
    };
    match outcome {
        Ok(_) => Redirect::to("/login?invited=1").into_response(),
        Err(app::error::AppError::Invalid(message)) => {
            let notice = Notice::error(format!("Nothing was changed: {message}."));
            let back = format!("/invite/{}", urlencode(&form.token));
            redirect_with(&session, notice, &back).await
        }
        Err(err) => HttpError::from(err).into_response(),
    }
}

pub async fn logout(session: Session) -> Response {
    match end_session(&session).await {
        Ok(()) => Redirect::to("/login?signed_out=1").into_response(),
        Err(err) => HttpError::from(err).into_response(),
    }
}

/// Resolves the session to an operator and puts their [`app::domain::Me`]
/// into the request. Pages need a signed-in operator: anyone else is sent to
/// the sign-in page (told when their session expired). Server functions
/// check roles themselves and answer 401/403.
pub async fn authenticate(
    State(state): State<AppState>,
    session: Session,
    mut request: Request,
    next: Next,
) -> Response {
    let path = request.uri().path().to_owned();
    let open_to_anyone = path == "/login"
        || path.starts_with("/auth/")
        || path.starts_with("/invite/")
        || path.starts_with("/api/");
    match resolve_session(&session, &state.pool, &state.auth).await {
        Ok(SessionState::SignedIn(me)) => {
            if path == "/login" && request.method() == Method::GET {
                return Redirect::to("/").into_response();
            }
            request.extensions_mut().insert(me);
            next.run(request).await
        }
        Ok(_) if open_to_anyone => next.run(request).await,
        Ok(state) => {
            let mut url = String::from("/login?");
            if state == SessionState::Expired {
                url.push_str("error=expired&");
            }
            let target = request
                .uri()
                .path_and_query()
                .map(|pq| pq.as_str())
                .unwrap_or("/");
            url.push_str("next=");
            url.push_str(&urlencode(if request.method() == Method::GET {
                target
            } else {
                "/"
            }));
            Redirect::to(&url).into_response()
        }
        Err(err) => HttpError::from(err).into_response(),
    }
}
