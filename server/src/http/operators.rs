//! The Operators page's forms. Each handler checks the admin role, makes one
//! call into `accounts`, and redirects back with a notice (post/redirect/get).

use axum::{
    extract::{rejection::FormRejection, Path, State},
    http::StatusCode,
    response::{IntoResponse, Redirect, Response},
    Extension, Form,
};
use serde::Deserialize;
use tower_sessions::Session;

use super::{auth::ClientIp, error::HttpError};
use app::{
    domain::{Email, Me, Notice, Role},
    error::AppError,
    ssr::{accounts, data::actions::Actor, flash, AppState},
};

const PAGE: &str = "/operators";

#[derive(Debug, Deserialize)]
pub struct AddForm {
    email: String,
    role: String,
}

#[derive(Debug, Deserialize)]
pub struct RoleForm {
    role: String,
}

#[derive(Debug, Deserialize)]
pub struct DisabledForm {
    disabled: bool,
}

/// The admin behind the request, or the refusal to send.
fn admin(me: Option<Extension<Me>>) -> Result<Me, HttpError> {
    let Some(Extension(me)) = me else {
        return Err(AppError::Unauthenticated.into());
    };
    if me.role.allows(Role::Admin) {
        Ok(me)
    } else {
        Err(AppError::Forbidden(Role::Admin).into())
    }
}

/// Why a form could not be handled: a message for the page, or a response
/// of its own (an oversized body keeps its 413).
enum Failure {
    App(AppError),
    Rejected(FormRejection),
}

impl From<AppError> for Failure {
    fn from(err: AppError) -> Self {
        Self::App(err)
    }
}

impl From<app::domain::ParseError> for Failure {
    fn from(err: app::domain::ParseError) -> Self {
        Self::App(err.into())
    }
}

fn readable<T>(form: Result<Form<T>, FormRejection>) -> Result<T, Failure> {
    match form {
        Ok(Form(form)) => Ok(form),
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            Err(Failure::Rejected(rejection))
        }
        Err(rejection) => Err(Failure::App(AppError::Invalid(format!(
            "the form could not be read: {}",
            rejection.body_text()
        )))),
    }
}

/// Back to the Operators page with the outcome of the action as a notice.
async fn back_with(session: &Session, outcome: Result<Notice, Failure>) -> Response {
    let notice = match outcome {
        Ok(notice) => notice,
        Err(Failure::Rejected(rejection)) => return rejection.into_response(),
        Err(Failure::App(err)) => return back_with_error(session, err).await,
    };
    flash::set(session, notice).await;
    Redirect::to(PAGE).into_response()
}

async fn back_with_error(session: &Session, err: AppError) -> Response {
    let notice = match err {
        AppError::Invalid(message) => Notice::error(format!("Nothing was changed: {message}.")),
        AppError::NotFound => Notice::error("That operator no longer exists."),
        other => return HttpError::from(other).into_response(),
    };
    flash::set(session, notice).await;
    Redirect::to(PAGE).into_response()
}

pub async fn add(
    State(state): State<AppState>,
    me: Option<Extension<Me>>,
    ClientIp(ip): ClientIp,
    session: Session,
    form: Result<Form<AddForm>, FormRejection>,
) -> Response {
    let me = match admin(me) {
        Ok(me) => me,
        Err(err) => return err.into_response(),
    };
    let outcome = async {
        let form = readable(form)?;
        let email = Email::parse(&form.email)?;
        let role: Role = form.role.parse()?;
        let actor = Actor::Operator { id: me.id, ip };
        let (operator, password) =
            accounts::add_operator(&state.pool, actor, &email, role, None).await?;
        let notice = Notice::success(format!(
            "Added {} as {}. Their password:",
            operator.email, operator.role
        ));
        Ok(match password {
            Some(password) => notice.with_secret(password),
            None => notice,
        })
    }
    .await;
    back_with(&session, outcome).await
}

pub async fn change_role(
    State(state): State<AppState>,
    me: Option<Extension<Me>>,
    ClientIp(ip): ClientIp,
    session: Session,
    Path(id): Path<i64>,
    form: Result<Form<RoleForm>, FormRejection>,
) -> Response {
    let me = match admin(me) {
        Ok(me) => me,
        Err(err) => return err.into_response(),
    };
    let outcome = async {
        let form = readable(form)?;
        let role: Role = form.role.parse()?;
        let operator =
            accounts::change_role(&state.pool, Actor::Operator { id: me.id, ip }, id, role).await?;
        Ok(Notice::success(format!(
            "{} is now {}.",
            operator.email, operator.role
        )))
    }
    .await;
    back_with(&session, outcome).await
}

pub async fn set_disabled(
    State(state): State<AppState>,
    me: Option<Extension<Me>>,
    ClientIp(ip): ClientIp,
    session: Session,
    Path(id): Path<i64>,
    form: Result<Form<DisabledForm>, FormRejection>,
) -> Response {
    let me = match admin(me) {
        Ok(me) => me,
        Err(err) => return err.into_response(),
    };
    let outcome = async {
        let form = readable(form)?;
        let operator = accounts::set_disabled(
            &state.pool,
            Actor::Operator { id: me.id, ip },
            id,
            form.disabled,
        )
        .await?;
        let verb = if form.disabled { "disabled" } else { "enabled" };
        Ok(Notice::success(format!("{} is {verb}.", operator.email)))
    }
    .await;
    back_with(&session, outcome).await
}
