//! The API tokens page's forms (admin): create a token, revoke one.

use axum::{
    body::Bytes,
    extract::{Path, State},
    response::Response,
};
use tower_sessions::Session;

use super::forms::Page;
use super::guard::Operator;
use app::{
    domain::{parse_token_ceiling, parse_token_days, ApiScope, Notice},
    error::AppError,
    operators::tokens,
    ssr::AppState,
};

const PAGE: Page = Page {
    path: "/tokens",
    gone: "That token no longer exists.",
};

/// `name`, one `scope` field per ticked box, and `days`. Read by hand:
/// repeated fields are what checkboxes send.
pub async fn create(
    State(state): State<AppState>,
    Operator { actor, .. }: Operator,
    session: Session,
    body: Bytes,
) -> Response {
    let outcome = async {
        let (mut name, mut scopes, mut days, mut ceiling) =
            (String::new(), Vec::new(), String::new(), String::new());
        for (field, value) in form_urlencoded::parse(&body) {
            match field.as_ref() {
                "name" => name = value.into_owned(),
                "scope" => scopes.push(value.into_owned()),
                "days" => days = value.into_owned(),
                "max_cap_cents" => ceiling = value.into_owned(),
                _ => {}
            }
        }
        if scopes.is_empty() {
            return Err(AppError::Invalid(
                "tick at least one scope: a token that may do nothing is of no use".into(),
            )
            .into());
        }
        let scopes = ApiScope::parse_list(&scopes.join(","))?;
        let days = parse_token_days(&days)?;
        let ceiling = parse_token_ceiling(&ceiling)?;
        let created = tokens::create(&state.pool, actor, &name, &scopes, days, ceiling).await?;
        Ok(Notice::success(format!(
            "Created the token \"{}\" with {}, valid {days} days. Copy it now: it is not shown again.",
            name.trim(),
            ApiScope::join(&scopes)
        ))
        .with_secret(created.secret.plaintext))
    }
    .await;
    PAGE.back_with(&session, outcome).await
}

pub async fn revoke(
    State(state): State<AppState>,
    Operator { actor, .. }: Operator,
    session: Session,
    Path(id): Path<app::domain::ApiTokenId>,
) -> Response {
    let outcome = async {
        let name = tokens::revoke(&state.pool, actor, id).await?;
        Ok(Notice::success(format!(
            "Revoked the token \"{name}\": its next call is refused."
        )))
    }
    .await;
    PAGE.back_with(&session, outcome).await
}
