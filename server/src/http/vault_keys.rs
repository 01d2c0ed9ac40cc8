//! The new-key form (operator role). A refused form goes back to the page
//! with what was typed and a message per field; a created key goes to the
//! keys list with its secret shown once.

use axum::{
    body::Bytes,
    extract::State,
    response::{IntoResponse, Redirect, Response},
    Extension,
};
use tower_sessions::Session;

use super::{auth::ClientIp, error::HttpError, forms::require};
use app::{
    domain::{KeyDraft, Me, Notice, Role},
    error::AppError,
    ssr::{data::actions::Actor, flash, vault_keys, AppState},
};

pub async fn create(
    State(state): State<AppState>,
    me: Option<Extension<Me>>,
    ClientIp(ip): ClientIp,
    session: Session,
    body: Bytes,
) -> Response {
    let me = match require(me, Role::Operator) {
        Ok(me) => me,
        Err(err) => return err.into_response(),
    };
    let fields: Vec<(String, String)> = form_urlencoded::parse(&body).into_owned().collect();
    let draft = KeyDraft::from_fields(fields.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    let key = match vault_keys::parse_draft(&draft, chrono::Utc::now()) {
        Ok(key) => key,
        Err(errors) => return back_to_form(&session, &draft, errors).await,
    };
    let actor = Actor::Operator { id: me.id, ip };
    match vault_keys::issue(&state.pool, actor, key).await {
        Ok((secret, row)) => {
            let currency = app::domain::Currency::parse(&row.currency)
                .unwrap_or_else(|_| app::domain::Currency::usd());
            let notice = Notice::success(format!(
                "Created {} for {}: cap {} {currency}. Give the billing job this key:",
                row.label,
                row.billing_period,
                app::domain::Cents(row.cap_cents).format(&currency),
            ))
            .with_secret(secret);
            flash::clear_key_draft(&session).await;
            flash::set(&session, notice).await;
            Redirect::to("/keys").into_response()
        }
        Err(AppError::Invalid(message)) => {
            back_to_form(&session, &draft, vec![("label".into(), message)]).await
        }
        Err(err) => HttpError::from(err).into_response(),
    }
}

async fn back_to_form(
    session: &Session,
    draft: &KeyDraft,
    errors: app::domain::FieldErrors,
) -> Response {
    let id = uuid::Uuid::new_v4().simple().to_string();
    flash::set_key_draft(session, &id, draft, &errors).await;
    Redirect::to(&format!("/keys/new?draft={id}")).into_response()
}
