//! The Operators page's forms. Each handler checks the admin role, makes one
//! call into `accounts`, and redirects back with a notice (post/redirect/get).

use axum::{
    extract::{Path, State},
    http::{header, HeaderMap},
    response::Response,
};
use serde::Deserialize;
use tower_sessions::Session;

use super::forms::{page_forms, ConsoleForm, Page};
use super::guard::Operator;
use app::{
    domain::{Email, Notice, Role},
    operators::accounts,
    ssr::AppState,
};

const PAGE: Page = Page {
    path: "/operators",
    gone: "That operator no longer exists.",
};

page_forms!(PAGE: AddForm, RoleForm, DisabledForm);

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

/// `https://console.example` as the browser reached us.
fn origin(headers: &HeaderMap, secure: bool) -> String {
    let host = headers
        .get(header::HOST)
        .and_then(|host| host.to_str().ok())
        .unwrap_or("localhost");
    format!("{}://{host}", if secure { "https" } else { "http" })
}

pub async fn add(
    State(state): State<AppState>,
    Operator { actor, .. }: Operator,
    headers: HeaderMap,
    session: Session,
    ConsoleForm(form): ConsoleForm<AddForm>,
) -> Response {
    let outcome = async {
        let email = Email::parse(&form.email)?;
        let role: Role = form.role.parse()?;
        let (operator, token) = accounts::invite_operator(&state.pool, actor, &email, role).await?;
        let link = format!("{}/invite/{token}", origin(&headers, state.auth.secure_cookies));
        Ok(Notice::success(format!(
            "Added {} as {}. Send them this invitation link: it works once, within {} hours, for them to set their own password.",
            operator.email,
            operator.role,
            accounts::INVITATION_HOURS
        ))
        .with_secret(link))
    }
    .await;
    PAGE.back_with(&session, outcome).await
}

pub async fn change_role(
    State(state): State<AppState>,
    Operator { actor, .. }: Operator,
    session: Session,
    Path(id): Path<app::domain::OperatorId>,
    ConsoleForm(form): ConsoleForm<RoleForm>,
) -> Response {
    let outcome = async {
        let role: Role = form.role.parse()?;
        let operator = accounts::change_role(&state.pool, actor, id, role).await?;
        Ok(Notice::success(format!(
            "{} is now {}.",
            operator.email, operator.role
        )))
    }
    .await;
    PAGE.back_with(&session, outcome).await
}

pub async fn set_disabled(
    State(state): State<AppState>,
    Operator { actor, .. }: Operator,
    session: Session,
    Path(id): Path<app::domain::OperatorId>,
    ConsoleForm(form): ConsoleForm<DisabledForm>,
) -> Response {
    let outcome = async {
        let operator = accounts::set_disabled(&state.pool, actor, id, form.disabled).await?;
        let verb = if form.disabled { "disabled" } else { "enabled" };
        Ok(Notice::success(format!("{} is {verb}.", operator.email)))
    }
    .await;
    PAGE.back_with(&session, outcome).await
}
