//! The Operators page's forms. Each handler checks the admin role, makes one
//! call into `accounts`, and redirects back with a notice (post/redirect/get).

use axum::{
    extract::{rejection::FormRejection, Path, State},
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

/// Back to the Operators page with the outcome of the action as a notice.
async fn back_with(session: &Session, outcome: Result<Notice, AppError>) -> Response {
    let notice = match outcome {
        Ok(notice) => notice,
        Err(AppError::Invalid(message)) => Notice::error(capitalise(&message)),
        Err(AppError::NotFound) => Notice::error("That operator no longer exists."),
        Err(other) => return HttpError::from(other).into_response(),
    };
    flash::set(session, notice).await;
    Redirect::to(PAGE).into_response()
}

fn capitalise(message: &str) -> String {
    let mut chars = message.chars();
    chars
        .next()
        .map(|first| first.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
}

fn malformed(rejection: FormRejection) -> AppError {
    AppError::Invalid(format!(
        "the form could not be read: {}",
        rejection.body_text()
    ))
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
        let Form(form) = form.map_err(malformed)?;
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
        let Form(form) = form.map_err(malformed)?;
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
        let Form(form) = form.map_err(malformed)?;
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
