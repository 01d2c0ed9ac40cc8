//! The Operators page's forms. Each handler checks the admin role, makes one
//! call into `accounts`, and redirects back with a notice (post/redirect/get).

use axum::{
    extract::{rejection::FormRejection, Path, State},
    response::Response,
    Extension, Form,
};
use serde::Deserialize;
use tower_sessions::Session;

use super::{
    client_ip::ClientIp,
    forms::{readable, Page},
};
use app::{
    domain::{Email, Me, Notice, Role},
    ssr::{accounts, data::actions::Actor, AppState},
};

const PAGE: Page = Page {
    path: "/operators",
    gone: "That operator no longer exists.",
};

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

pub async fn add(
    State(state): State<AppState>,
    Extension(me): Extension<Me>,
    ClientIp(ip): ClientIp,
    session: Session,
    form: Result<Form<AddForm>, FormRejection>,
) -> Response {
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
    PAGE.back_with(&session, outcome).await
}

pub async fn change_role(
    State(state): State<AppState>,
    Extension(me): Extension<Me>,
    ClientIp(ip): ClientIp,
    session: Session,
    Path(id): Path<i64>,
    form: Result<Form<RoleForm>, FormRejection>,
) -> Response {
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
    PAGE.back_with(&session, outcome).await
}

pub async fn set_disabled(
    State(state): State<AppState>,
    Extension(me): Extension<Me>,
    ClientIp(ip): ClientIp,
    session: Session,
    Path(id): Path<i64>,
    form: Result<Form<DisabledForm>, FormRejection>,
) -> Response {
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
    PAGE.back_with(&session, outcome).await
}
