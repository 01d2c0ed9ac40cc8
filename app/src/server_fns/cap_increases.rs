use leptos::prelude::*;

use crate::{
    domain::{ApprovalsView, CapIncreaseForm},
    error::AppError,
};

/// The request form for one key: its figures, the suggested cap and how it
/// was derived, the ceiling, and any request already waiting. `origin`
/// names an alert (`alert:ID`) or a refused call (`call:ID`) the request is
/// about; `remaining` is the billing still to come, as typed.
#[server(endpoint = "get_cap_increase_form")]
pub async fn get_cap_increase_form(
    key: crate::domain::VaultKeyId,
    origin: Option<String>,
    remaining: Option<String>,
    draft: Option<String>,
) -> Result<CapIncreaseForm, AppError> {
    use crate::{
        alerts::sql as alerts,
        audit::sql as audit,
        cap_increases::{rules as cap_increases, sql as requests},
        domain::{CapSuggestion, Cents, Decision, Role},
        keys::sql as vault_keys,
        ssr::{self, flash},
    };
    crate::operators::auth::require(Role::Operator)?;
    let state = expect_context::<ssr::AppState>();
    let pool = &state.pool;
    let row = vault_keys::find(pool, key)
        .await?
        .ok_or(AppError::NotFound)?;
    let summary = row.summary(chrono::Utc::now());
    let currency = row.currency.clone();

    // A refused charge the request is about is billing still to come.
    let origin = origin.unwrap_or_else(|| "key_page".into());
    let refused_charge = match origin.split_once(':') {
        Some(("alert", id)) => match id.parse() {
            Ok(id) => alerts::find(pool, id)
                .await?
                .filter(|a| a.vault_key_id == key && a.kind == "cap_refused")
                .and_then(|a| a.amount_cents),
            Err(_) => None,
        },
        Some(("call", id)) => match id.parse() {
            Ok(id) => audit::find(pool, id)
                .await?
                .map(|d| d.call)
                .filter(|c| c.vault_key_id == Some(key) && c.decision == Decision::RefusedCap)
                .and_then(|c| c.amount),
            Err(_) => None,
        },
        _ => None,
    };
    let refused_waiting = audit::refused_waiting(pool, key).await?;
    // Billing still to come: the expected total not yet spent, and at least
    // what the cap refused (the charge asked about, or all that wait).
    let unspent = Cents((row.expected_total_cents.0 - row.spent_cents.0).max(0));
    let refused = refused_charge
        .unwrap_or_default()
        .max(refused_waiting.total);
    let remaining = match remaining.as_deref().map(str::trim) {
        None | Some("") => unspent.max(refused),
        Some("0") => Cents(0),
        Some(typed) => Cents::parse_amount(typed, &currency)
            .map_err(|err| AppError::Invalid(format!("remaining billing: {}", err.0)))?,
    };
    let granted = requests::granted_cents(pool, key).await?;
    let buffer_bps = u32::try_from(row.buffer_bps).unwrap_or(0);
    let suggestion = CapSuggestion::new(&summary, granted, buffer_bps, remaining)?;
    let pending = requests::pending_for_key(pool, key).await?;
    let session = leptos_axum::extract::<tower_sessions::Session>().await?;
    let draft = match draft {
        Some(id) => flash::cap_increase_draft(&session, &id).await,
        None => None,
    };
    Ok(CapIncreaseForm {
        ceiling: cap_increases::ceiling(&row, &state.cap_increases),
        key: summary,
        granted,
        suggestion,
        origin,
        refused_charge,
        refused_waiting,
        pending,
        draft,
        decide_by: (chrono::Utc::now() + state.cap_increases.request_ttl).min(row.expires_at),
    })
}

/// The Approvals page: pending requests (oldest first) or the history
/// (decided and expired, newest first), with the counts for the tabs.
#[server(endpoint = "list_approvals")]
pub async fn list_approvals(tab: Option<String>) -> Result<ApprovalsView, AppError> {
    use crate::{
        cap_increases::sql as requests,
        domain::Role,
        ssr::{self},
    };
    crate::operators::auth::require(Role::Viewer)?;
    let listing = match tab.as_deref().unwrap_or("pending") {
        "pending" => requests::Listing::Pending,
        "history" => requests::Listing::History,
        other => {
            return Err(AppError::Invalid(format!(
                "{other:?} is not a tab: use pending or history"
            )))
        }
    };
    let pool = &expect_context::<ssr::AppState>().pool;
    let (pending, history) = requests::counts(pool).await?;
    let key_requests = match listing {
        requests::Listing::Pending => crate::key_requests::sql::pending(pool).await?,
        _ => Vec::new(),
    };
    Ok(ApprovalsView {
        pending: pending + key_requests.len() as i64,
        key_requests,
        requests: requests::list(pool, listing, 200).await?,
        history,
    })
}

/// How many requests wait for a decision, for the navigation badge.
#[server(endpoint = "pending_approval_count")]
pub async fn pending_approval_count() -> Result<i64, AppError> {
    use crate::{domain::Role, ssr};
    crate::operators::auth::require(Role::Viewer)?;
    let pool = &expect_context::<ssr::AppState>().pool;
    Ok(crate::cap_increases::sql::pending_count(pool).await?)
}

/// What approving request `id` would change, for the approver to confirm
/// (with the note they typed). Refused, with the reason, when the request
/// is no longer pending or the approver asked for it themselves.
#[server(endpoint = "get_approval_preview")]
pub async fn get_approval_preview(
    id: crate::domain::CapIncreaseId,
    note: Option<String>,
) -> Result<crate::domain::ApprovalPreview, AppError> {
    use crate::{
        cap_increases::{rules as cap_increases, sql as requests},
        domain::{ApprovalPreview, Role},
        keys::sql as vault_keys,
        ssr::{self},
    };
    let me = crate::operators::auth::require(Role::Approver)?;
    let state = expect_context::<ssr::AppState>();
    let request = requests::find(&state.pool, id)
        .await?
        .ok_or(AppError::NotFound)?;
    cap_increases::decidable(&request, &me)?;
    let key = vault_keys::find(&state.pool, request.vault_key_id)
        .await?
        .ok_or(AppError::NotFound)?;
    Ok(ApprovalPreview {
        request,
        expected_total: key.expected_total_cents,
        ceiling: cap_increases::ceiling(&key, &state.cap_increases),
        granted: requests::granted_cents(&state.pool, key.id).await?,
        note: note.unwrap_or_default(),
    })
}

/// What approving a key asked for beyond policy would issue, for the
/// confirmation page: refused when this approver may not decide it.
#[server(endpoint = "get_key_request_preview")]
pub async fn get_key_request_preview(
    id: crate::domain::KeyRequestId,
    note: Option<String>,
) -> Result<crate::domain::KeyRequestPreview, AppError> {
    use crate::{
        domain::{KeyRequestPreview, Role},
        key_requests::{rules as key_requests, sql as requests},
        ssr::{self},
    };
    let me = crate::operators::auth::require(Role::Approver)?;
    let pool = &expect_context::<ssr::AppState>().pool;
    let request = requests::find(pool, id).await?.ok_or(AppError::NotFound)?;
    key_requests::decidable(&request, &me)?;
    Ok(KeyRequestPreview {
        live_caps: requests::live_caps(pool, request.billing_period, &request.currency).await?,
        request,
        note: note.unwrap_or_default(),
    })
}
