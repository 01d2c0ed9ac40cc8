//! The two-factor page's forms (approvers and admins, for themselves): set
//! up an authenticator, confirm it with its first code, turn it off.

use axum::{extract::State, response::Response, Extension};
use serde::Deserialize;
use tower_sessions::Session;

use super::forms::{page_forms, ConsoleForm, Page};
use super::guard::Operator;
use app::{
    domain::{Me, Notice},
    operators::second_factor,
    ssr::AppState,
};

const PAGE: Page = Page {
    path: "/account/two-factor",
    gone: "Your account no longer exists.",
};

page_forms!(PAGE: CodeForm);

#[derive(Debug, Deserialize)]
pub struct CodeForm {
    #[serde(default)]
    code: String,
}

pub async fn set_up(
    State(state): State<AppState>,
    Extension(me): Extension<Me>,
    session: Session,
) -> Response {
    let outcome = async {
        second_factor::begin(&state.pool, &me).await?;
        Ok(Notice::success(
            "Scan the QR code with your authenticator app, then enter the code it shows.",
        ))
    }
    .await;
    PAGE.back_with(&session, outcome).await
}

pub async fn confirm(
    State(state): State<AppState>,
    Operator { me, ip, .. }: Operator,
    session: Session,
    ConsoleForm(form): ConsoleForm<CodeForm>,
) -> Response {
    let outcome = async {
        let codes = second_factor::confirm(&state.pool, &me, &form.code, ip).await?;
        Ok(Notice::success(
            "Two-factor sign-in is on: from now on, sign-in asks for a code from your \
             authenticator. These recovery codes each sign you in once if you lose it. \
             Keep them somewhere safe: they are shown only now.",
        )
        .with_secret(codes.join("\n")))
    }
    .await;
    PAGE.back_with(&session, outcome).await
}

pub async fn turn_off(
    State(state): State<AppState>,
    Operator { me, ip, .. }: Operator,
    session: Session,
    ConsoleForm(form): ConsoleForm<CodeForm>,
) -> Response {
    let outcome = async {
        second_factor::disable(&state.pool, state.auth.throttle, &me, &form.code, ip).await?;
        Ok(Notice::success(
            "Two-factor sign-in is off: sign-in asks for your password only.",
        ))
    }
    .await;
    PAGE.back_with(&session, outcome).await
}
