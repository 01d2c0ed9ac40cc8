//! `/vault/keys/{id}/cap-increase-requests`: a billing job that was refused
//! with `spend_cap_exceeded` asks for more, then watches for the decision.
//! An approver decides in the console; no API token can decide.

use axum::{
    extract::{Path, State},
    http::{Method, StatusCode},
    Json,
};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{ApiError, ApiErrorBody, ApiJson, ApiRoutes, ApiToken};
use app::{
    cap_increases::{
        rules::{self as cap_increases, Ask, Target},
        sql as requests,
    },
    domain::{
        ApiScope, ApplyAs, CapIncrease, CapIncreaseId, Cents, Currency, RequestState, VaultKeyId,
        MAX_CENTS,
    },
    error::AppError,
    keys::sql as vault_keys,
    ssr::AppState,
};

pub fn routes(routes: ApiRoutes) -> ApiRoutes {
    const PATH: &str = "/vault/keys/{id}/cap-increase-requests";
    routes
        .route(Method::POST, PATH, ApiScope::CapRequestsCreate, create)
        .route(Method::GET, PATH, ApiScope::KeysRead, list)
}

/// A request for a higher cap: the new cap in all, or the amount to add.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateRequest {
    #[serde(default)]
    #[schema(value_type = Option<i64>)]
    new_cap_cents: Option<Cents>,
    #[serde(default)]
    #[schema(value_type = Option<i64>)]
    additional_cents: Option<Cents>,
    /// Why the run needs more; the approver decides on it.
    reason: String,
    /// `raise_cap` (default) or `follow_on_key`.
    #[serde(default)]
    apply_as: Option<String>,
}

impl CreateRequest {
    fn parse(self) -> Result<Ask, ApiError> {
        let amount = |name: &str, cents: Cents| {
            if (1..=MAX_CENTS).contains(&cents.0) {
                Ok(cents)
            } else {
                Err(ApiError::invalid(format!(
                    "{name} {} must be a positive number of cents",
                    cents.0
                )))
            }
        };
        let target = match (self.new_cap_cents, self.additional_cents) {
            (Some(cap), None) => Target::Cap(amount("new_cap_cents", cap)?),
            (None, Some(more)) => Target::Additional(amount("additional_cents", more)?),
            _ => {
                return Err(ApiError::invalid(
                    "give either new_cap_cents or additional_cents",
                ))
            }
        };
        Ok(Ask {
            target,
            apply_as: ApplyAs::parse(self.apply_as.as_deref().unwrap_or_default())?,
            reason: self.reason,
            origin: "api".into(),
        })
    }
}

/// A request as the API shows it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct RequestView {
    #[schema(value_type = i64)]
    id: CapIncreaseId,
    #[schema(value_type = i64)]
    vault_key_id: VaultKeyId,
    #[schema(value_type = String)]
    currency: Currency,
    #[schema(value_type = i64)]
    from_cap_cents: Cents,
    #[schema(value_type = i64)]
    to_cap_cents: Cents,
    /// `raise_cap` or `follow_on_key`.
    #[schema(value_type = String)]
    apply_as: ApplyAs,
    reason: String,
    /// `pending`, `approved`, `rejected` or `expired`.
    #[schema(value_type = String)]
    state: RequestState,
    requested_at: DateTime<Utc>,
    requested_by: String,
    expires_at: DateTime<Utc>,
    decided_at: Option<DateTime<Utc>>,
    decided_by: Option<String>,
    decision_note: Option<String>,
    /// The follow-on key issued on approval (its secret went to the approver).
    follow_on_key_id: Option<i64>,
}

impl From<CapIncrease> for RequestView {
    fn from(r: CapIncrease) -> Self {
        Self {
            id: r.id,
            vault_key_id: r.vault_key_id,
            currency: r.currency,
            from_cap_cents: r.from_cap_cents,
            to_cap_cents: r.to_cap_cents,
            apply_as: r.apply_as,
            reason: r.reason,
            state: r.state,
            requested_at: r.requested_at,
            requested_by: r.requested_by,
            expires_at: r.expires_at,
            decided_at: r.decided_at,
            decided_by: r.decided_by,
            decision_note: r.decision_note,
            follow_on_key_id: r.follow_on_key_id,
        }
    }
}

/// Ask for a higher cap; an approver decides in the console.
#[utoipa::path(post, path = "/vault/keys/{id}/cap-increase-requests", params(("id" = i64, Path)),
    request_body = CreateRequest,
    responses((status = 201, body = RequestView), (status = 400, body = ApiErrorBody),
              (status = 401, body = ApiErrorBody), (status = 404, body = ApiErrorBody)),
    security(("api_token" = [])))]
pub async fn create(
    State(state): State<AppState>,
    token: ApiToken,
    Path(id): Path<VaultKeyId>,
    ApiJson(body): ApiJson<CreateRequest>,
) -> Result<(StatusCode, Json<RequestView>), ApiError> {
    let ask = body.parse()?;
    let actor = token.actor();
    let filed = cap_increases::request(&state.pool, &state.cap_increases, actor, id, ask).await?;
    Ok((StatusCode::CREATED, Json(filed.into())))
}

/// The key's cap increase requests, newest first, with their decisions.
#[utoipa::path(get, path = "/vault/keys/{id}/cap-increase-requests", params(("id" = i64, Path)),
    responses((status = 200, body = [RequestView]), (status = 404, body = ApiErrorBody)),
    security(("api_token" = [])))]
pub async fn list(
    State(state): State<AppState>,
    _token: ApiToken,
    Path(id): Path<VaultKeyId>,
) -> Result<Json<Vec<RequestView>>, ApiError> {
    if vault_keys::find(&state.pool, id).await?.is_none() {
        return Err(AppError::NotFound.into());
    }
    let rows = requests::list(&state.pool, requests::Listing::Key(id), 100).await?;
    Ok(Json(rows.into_iter().map(RequestView::from).collect()))
}
