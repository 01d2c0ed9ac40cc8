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
    operators::{
        accounts::{self, PasswordChecked, SignInError},
        auth::{
            begin_second_factor, begin_session, end_session, pending_second_factor,
            resolve_session, SessionState,
        },
        second_factor::CodeRefused,
    },
    ssr::AppState,
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
        Ok(PasswordChecked::SignedIn(operator)) => {
            signed_in_to(&session, operator.id, &form.next).await
        }
        Ok(PasswordChecked::NeedsCode(operator)) => {
            if let Err(err) = begin_second_factor(&session, operator.id).await {
                return HttpError::from(err).into_response();
            }
            Redirect::to(&code_url(None, &form.next)).into_response()
        }
        Err(err) => refused(err, &form.next, login_url),
    }
}

/// A signed-in session, then on to `next` when it is a page of ours.
async fn signed_in_to(
    session: &Session,
    operator_id: app::domain::OperatorId,
    next: &str,
) -> Response {
    if let Err(err) = begin_session(session, operator_id).await {
        return HttpError::from(err).into_response();
    }
    let next = if is_local_path(next) && next != "/login" {
        next
    } else {
        "/"
    };
    Redirect::to(next).into_response()
}

/// A refused sign-in: back to the form it came from (`url` makes the
/// address for an error code), or an error page when nothing can be done.
fn refused(err: SignInError, next: &str, url: fn(&str, &str) -> String) -> Response {
    match err {
        SignInError::Internal => HttpError::from(app::error::AppError::Internal).into_response(),
        SignInError::Busy => (
            [(header::RETRY_AFTER, "5")],
            HttpError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                SignInError::Busy.to_string(),
            ),
        )
            .into_response(),
        err => {
            let code = match err {
                SignInError::Throttled { retry_after } => {
                    // Whole seconds, rounded up: never "try again in 0".
                    let seconds = (retry_after.num_milliseconds() + 999) / 1000;
                    format!("throttled&wait={}", seconds.max(1))
                }
                SignInError::Disabled => "disabled".into(),
                SignInError::Code(CodeRefused::Replayed) => "code_used".into(),
                SignInError::Code(CodeRefused::Wrong) => "code".into(),
                _ => "invalid".into(),
            };
            Redirect::to(&url(&code, next)).into_response()
        }
    }
}

#[derive(Debug, Deserialize)]
pub struct CodeForm {
    #[serde(default)]
    code: String,
    #[serde(default)]
    next: String,
}

/// The second step of signing in: the code, for the operator whose password
/// this session just proved.
pub async fn login_code(
    State(state): State<AppState>,
    ClientIp(ip): ClientIp,
    session: Session,
    form: Result<Form<CodeForm>, FormRejection>,
) -> Response {
    let form = match form {
        Ok(Form(form)) => form,
        Err(rejection) => return rejection.into_response(),
    };
    let operator_id = match pending_second_factor(&session).await {
        Ok(Some(id)) => id,
        Ok(None) => return Redirect::to(&login_url("code_expired", &form.next)).into_response(),
        Err(err) => return HttpError::from(err).into_response(),
    };
    if form.code.trim().is_empty() {
        return Redirect::to(&code_url(Some("code_missing"), &form.next)).into_response();
    }
    match accounts::sign_in_with_code(&state.pool, &state.auth, operator_id, &form.code, ip).await {
        Ok(operator) => signed_in_to(&session, operator.id, &form.next).await,
        Err(err) => refused(err, &form.next, |code, next| code_url(Some(code), next)),
    }
}

fn code_url(error: Option<&str>, next: &str) -> String {
    let mut url = String::from("/login?step=code");
    if let Some(error) = error {
        url.push_str("&error=");
        url.push_str(error);
    }
    if is_local_path(next) {
        url.push_str("&next=");
        url.push_str(&urlencode(next));
    }
    url
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
