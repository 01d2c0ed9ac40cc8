//! The vault key forms (operator role). New key: a refused form goes back to
//! the page with what was typed and a message per field; a created key goes
//! to the keys list with its secret shown once. Revoke: needs a reason and
//! the confirmation box, and goes back to the key's page.

use axum::{
    body::Bytes,
    extract::{rejection::FormRejection, Multipart, Path, State},
    response::{IntoResponse, Redirect, Response},
    Form,
};
use serde::Deserialize;
use tower_sessions::Session;

use super::guard::Operator;
use super::{
    error::HttpError,
    forms::{readable, redirect_with, Failure, Page},
};
use app::{
    domain::{DuplicatePolicy, KeyDraft, Notice, VaultKeyId},
    error::AppError,
    key_requests::rules::{self as key_requests, Outcome},
    keys::rules as vault_keys,
    ssr::{flash, AppState},
};

pub async fn create(
    State(state): State<AppState>,
    Operator { actor, .. }: Operator,
    session: Session,
    body: Bytes,
) -> Response {
    let fields: Vec<(String, String)> = form_urlencoded::parse(&body).into_owned().collect();
    let draft = KeyDraft::from_fields(fields.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    let parsed = vault_keys::parse_draft(&draft, chrono::Utc::now());
    // "Check cap and label": the form again with what it would issue, nothing created.
    if fields
        .iter()
        .any(|(name, value)| name == "intent" && value == "check")
    {
        let errors = parsed.err().unwrap_or_default();
        return back_to_form(&session, &draft, errors, "&checked=yes").await;
    }
    let key = match parsed {
        Ok(key) => key,
        Err(errors) => return back_to_form(&session, &draft, errors, "").await,
    };
    match key_requests::issue_or_request(&state.pool, &state.key_policy, actor, key).await {
        Ok(Outcome::Issued { secret, key: row }) => {
            let currency = &row.currency;
            let notice = Notice::success(format!(
                "Created {} for {}: cap {} {currency}. Give the billing job this key:",
                row.label,
                row.billing_period,
                row.cap_cents.format(currency),
            ))
            .with_secret(secret);
            flash::clear_key_draft(&session).await;
            redirect_with(&session, notice, "/keys").await
        }
        Ok(Outcome::Waiting { secret, request }) => {
            let notice = Notice::success(format!(
                "{} waits for an approver (request #{}): {}. An approver other than you decides on the Approvals page; the key below works from then on:",
                request.label,
                request.id,
                request.over_policy,
            ))
            .with_secret(secret);
            flash::clear_key_draft(&session).await;
            redirect_with(&session, notice, "/approvals").await
        }
        Err(AppError::Invalid(message)) => {
            back_to_form(&session, &draft, vec![("label".into(), message)], "").await
        }
        Err(err) => HttpError::from(err).into_response(),
    }
}

async fn back_to_form(
    session: &Session,
    draft: &KeyDraft,
    errors: app::domain::FieldErrors,
    more_query: &str,
) -> Response {
    let id = uuid::Uuid::new_v4().simple().to_string();
    flash::set_key_draft(session, &id, draft, &errors).await;
    Redirect::to(&format!("/keys/new?draft={id}{more_query}")).into_response()
}

const KEYS: Page = Page {
    path: "/keys",
    gone: "That vault key no longer exists.",
};

#[derive(Debug, Deserialize)]
pub struct RevokeForm {
    #[serde(default)]
    reason: String,
    /// The confirmation box: present only when ticked.
    confirm: Option<String>,
}

pub async fn revoke(
    State(state): State<AppState>,
    Operator { actor, .. }: Operator,
    session: Session,
    Path(id): Path<VaultKeyId>,
    form: Result<Form<RevokeForm>, FormRejection>,
) -> Response {
    let outcome = async {
        let form = readable(form)?;
        if form.confirm.as_deref() != Some("yes") {
            return Err(AppError::Invalid(
                "tick the box to confirm that the key is revoked now".into(),
            )
            .into());
        }
        let row = vault_keys::revoke(&state.pool, actor, id, &form.reason).await?;
        Ok(Notice::success(format!(
            "Revoked {}: the proxy refuses it from the next call.",
            row.label
        )))
    }
    .await;
    KEYS.back_to(&format!("/keys/{id}"), &session, outcome)
        .await
}

#[derive(Debug, Deserialize)]
pub struct PolicyForm {
    #[serde(default)]
    duplicate_policy: String,
}

/// Changes a key's duplicate guard (operator role).
pub async fn set_duplicate_policy(
    State(state): State<AppState>,
    Operator { actor, .. }: Operator,
    session: Session,
    Path(id): Path<VaultKeyId>,
    form: Result<Form<PolicyForm>, FormRejection>,
) -> Response {
    let outcome = async {
        let form = readable(form)?;
        let policy = DuplicatePolicy::parse(&form.duplicate_policy).map_err(AppError::from)?;
        let row = vault_keys::set_duplicate_policy(&state.pool, actor, id, policy).await?;
        Ok(Notice::success(format!(
            "The duplicate guard of {} is now {}: {}.",
            row.label,
            policy.as_str(),
            policy.explain()
        )))
    }
    .await;
    KEYS.back_to(&format!("/keys/{id}"), &session, outcome)
        .await
}

const NEW_KEY: Page = Page {
    path: "/keys/new",
    gone: "",
};

/// The largest CSV of expected billing accepted (about 200,000 rows).
pub const MAX_SUGGESTION_CSV: usize = 8 * 1024 * 1024;

/// An uploaded CSV of customer, amount rows becomes the new-key form's
/// suggested expected total.
pub async fn suggest(
    session: Session,
    multipart: Result<Multipart, axum::extract::multipart::MultipartRejection>,
) -> Response {
    let outcome = async {
        let mut multipart = multipart.map_err(|err| unreadable(err.body_text()))?;
        let (mut file, mut currency) = (None, String::from("usd"));
        while let Some(field) = multipart
            .next_field()
            .await
            .map_err(|err| unreadable(err.body_text()))?
        {
            match field.name() {
                Some("file") => {
                    let name = field.file_name().unwrap_or("the file").to_owned();
                    let bytes = field
                        .bytes()
                        .await
                        .map_err(|err| unreadable(err.body_text()))?;
                    file = Some((name, bytes));
                }
                Some("currency") => {
                    currency = field
                        .text()
                        .await
                        .map_err(|err| unreadable(err.body_text()))?;
                }
                _ => {}
            }
        }
        let Some((name, bytes)) = file.filter(|(_, bytes)| !bytes.is_empty()) else {
            return Err(
                AppError::Invalid("choose a CSV file of customer, amount rows".into()).into(),
            );
        };
        let currency = app::domain::Currency::parse(&currency)?;
        let name: String = name.chars().take(80).collect();
        let suggestion = vault_keys::suggestion_from_csv(&name, &bytes, &currency)
            .map_err(|message| AppError::Invalid(format!("{name} was not used: {message}")))?;
        flash::set_key_suggestion(&session, &suggestion).await;
        Ok(Notice::success(format!(
            "Suggested expected total {} {currency} from {}.",
            suggestion.expected.format(&currency),
            suggestion.source.trim_start_matches("uploaded file ")
        )))
    }
    .await;
    NEW_KEY.back_with(&session, outcome).await
}

fn unreadable(reason: String) -> Failure {
    AppError::Invalid(format!("the upload could not be read: {reason}")).into()
}
