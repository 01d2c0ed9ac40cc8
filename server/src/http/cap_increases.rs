//! The cap increase forms. Request (operator role): a refused form goes
//! back to the request page with what was typed; a filed one to the key's
//! page. Decide (approver role, never one's own request): back to the
//! Approvals page, with a follow-on key's secret shown once.

use axum::{
    extract::{rejection::FormRejection, Path, State},
    response::Response,
    Form,
};
use tower_sessions::Session;

use super::forms::{page_forms, readable, redirect_with, ConsoleForm, Failure, Page};
use super::guard::Operator;
use app::{
    cap_increases::rules::{self as cap_increases, Ask, Target, Verdict},
    domain::{ApplyAs, CapIncreaseDraft, CapIncreaseId, Cents, KeyRequestId, Notice, VaultKeyId},
    error::AppError,
    key_requests::rules as key_requests,
    keys::sql as vault_keys,
    ssr::{flash, AppState},
};

pub async fn request(
    State(state): State<AppState>,
    Operator { actor, .. }: Operator,
    session: Session,
    Path(key): Path<VaultKeyId>,
    form: Result<Form<CapIncreaseDraft>, FormRejection>,
) -> Response {
    let draft = match readable(form) {
        Ok(draft) => draft,
        Err(failure) => {
            return KEYS
                .back_to(&format!("/keys/{key}"), &session, Err(failure))
                .await
        }
    };
    let outcome = async {
        let row = vault_keys::find(&state.pool, key)
            .await?
            .ok_or(AppError::NotFound)?;
        let new_cap = Cents::parse_amount(&draft.new_cap, &row.currency)
            .map_err(|err| AppError::Invalid(format!("the new cap: {}", err.0)))?;
        let ask = Ask {
            target: Target::Cap(new_cap),
            apply_as: ApplyAs::parse(&draft.apply_as)?,
            reason: draft.reason.clone(),
            origin: origin(&draft.origin),
        };
        let filed =
            cap_increases::request(&state.pool, &state.cap_increases, actor, key, ask).await?;
        Ok::<_, Failure>(Notice::success(format!(
            "Requested #{} for {}: {}. An approver other than you decides on the Approvals page.",
            filed.id,
            filed.key_label,
            filed.change()
        )))
    }
    .await;
    match outcome {
        Ok(notice) => redirect_with(&session, notice, &format!("/keys/{key}")).await,
        Err(Failure::App(AppError::Invalid(message))) => {
            // Back to the form as typed, with the reason.
            let id = uuid::Uuid::new_v4().simple().to_string();
            flash::set_cap_increase_draft(&session, &id, &draft).await;
            let origin = form_urlencoded::byte_serialize(origin(&draft.origin).as_bytes())
                .collect::<String>();
            redirect_with(
                &session,
                Notice::error(format!("Nothing was requested: {message}.")),
                &format!("/keys/{key}/cap-increase?origin={origin}&draft={id}"),
            )
            .await
        }
        Err(failure) => {
            KEYS.back_to(&format!("/keys/{key}"), &session, Err(failure))
                .await
        }
    }
}

/// Only the origins the request page sets are kept.
fn origin(raw: &str) -> String {
    let raw = raw.trim();
    let known = match raw.split_once(':') {
        Some(("alert" | "call", id)) => id.parse::<i64>().is_ok(),
        _ => false,
    };
    if known {
        raw.to_owned()
    } else {
        "key_page".to_owned()
    }
}

const KEYS: Page = Page {
    path: "/keys",
    gone: "That vault key no longer exists.",
};

const APPROVALS: Page = Page {
    path: "/approvals",
    gone: "That request no longer exists.",
};

page_forms!(APPROVALS: DecideForm);

#[derive(Debug, serde::Deserialize)]
pub struct DecideForm {
    #[serde(default)]
    verdict: String,
    #[serde(default)]
    note: String,
    /// `yes` from the confirmation page, which showed what approving
    /// changes; a cap increase is approved only through it.
    #[serde(default)]
    confirmed: String,
}

impl DecideForm {
    fn verdict(&self) -> Result<Verdict, AppError> {
        match self.verdict.as_str() {
            "approve" => Ok(Verdict::Approve),
            "reject" => Ok(Verdict::Reject),
            other => Err(AppError::Invalid(format!(
                "{other:?} is not a decision: approve or reject"
            ))),
        }
    }

    /// The verdict, refusing an approval that did not come through the
    /// confirmation page (`what` names the request in the refusal).
    fn confirmed_verdict(&self, what: &str) -> Result<Verdict, AppError> {
        let verdict = self.verdict()?;
        if verdict == Verdict::Approve && self.confirmed != "yes" {
            return Err(AppError::Invalid(format!(
                "{what} was not approved: press Approve on the Approvals page, check what it changes and confirm"
            )));
        }
        Ok(verdict)
    }
}

/// An approver's decision on a key asked for beyond policy.
pub async fn decide_key(
    State(state): State<AppState>,
    Operator { me, ip, .. }: Operator,
    session: Session,
    Path(id): Path<KeyRequestId>,
    ConsoleForm(form): ConsoleForm<DecideForm>,
) -> Response {
    let outcome = async {
        let verdict = form.confirmed_verdict(&format!("key request #{id}"))?;
        let request =
            key_requests::decide(&state.pool, &me, ip, id, verdict, &form.note).await?;
        let currency = request.currency.clone();
        Ok(match verdict {
            Verdict::Approve => Notice::success(format!(
                "Approved key request #{id}: {} is issued with a cap of {} {currency}; the requester's key works from now on.",
                request.label,
                request.cap_cents.format(&currency),
            )),
            Verdict::Reject => Notice::success(format!(
                "Rejected key request #{id}: {} is not issued and its key never works.",
                request.label
            )),
        })
    }
    .await;
    APPROVALS.back_with(&session, outcome).await
}

pub async fn decide(
    State(state): State<AppState>,
    Operator { me, ip, .. }: Operator,
    session: Session,
    Path(id): Path<CapIncreaseId>,
    ConsoleForm(form): ConsoleForm<DecideForm>,
) -> Response {
    let outcome = async {
        let verdict = form.confirmed_verdict(&format!("request #{id}"))?;
        let decided =
            cap_increases::decide(&state.pool, &me, ip, id, verdict, &form.note).await?;
        let request = &decided.request;
        let notice = match (verdict, decided.follow_on) {
            (Verdict::Reject, _) => Notice::success(format!(
                "Rejected #{id} for {}: the cap stays as it is.",
                request.key_label
            )),
            (Verdict::Approve, None) => Notice::success(format!(
                "Approved #{id}: {} now has a cap of {} {}; the proxy applies it from the next call.",
                request.key_label,
                request.key_cap_cents.format(&request.currency),
                request.currency.clone()
            )),
            (Verdict::Approve, Some((secret, key))) => Notice::success(format!(
                "Approved #{id}: issued {} with a cap of {} {}. Give the billing job this key:",
                key.label,
                key.cap_cents.format(&request.currency),
                request.currency.clone()
            ))
            .with_secret(secret),
        };
        Ok(notice)
    }
    .await;
    APPROVALS.back_with(&session, outcome).await
}
