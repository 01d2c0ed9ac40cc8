//! `/api/alerts`: on-call tooling reads and acknowledges alerts without the
//! browser.

use axum::{
    body::Bytes,
    extract::{Path, Query, State},
    http::{Method, StatusCode},
    Json,
};
use chrono::{DateTime, Utc};
use serde::Deserialize;

use super::{ApiError, ApiErrorBody, ApiRoutes, ApiToken};
use app::{
    alerts::sql::{self as alerts, Alert, AlertChangeError, AlertState},
    domain::{AlertId, ApiScope, Cents, Currency, VaultKeyId},
    ssr::AppState,
};

pub fn routes(routes: ApiRoutes) -> ApiRoutes {
    routes
        .route(Method::GET, "/api/alerts", ApiScope::AlertsRead, list)
        .route(
            Method::POST,
            "/api/alerts/{id}/ack",
            ApiScope::AlertsAck,
            acknowledge,
        )
}

/// `GET /api/alerts` filters; all optional.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct AlertFilter {
    /// Only this vault key's alerts.
    key: Option<String>,
    /// `open`, `acknowledged` or `snoozed`.
    state: Option<String>,
    /// At most this many, newest first (1 to 500, default 100).
    limit: Option<String>,
}

impl AlertFilter {
    fn parse(self) -> Result<(Option<VaultKeyId>, Option<AlertState>, i64), ApiError> {
        let key = match self.key.as_deref() {
            None | Some("") => None,
            Some(raw) => Some(raw.parse::<VaultKeyId>().map_err(|_| {
                ApiError::invalid(format!(
                    "key {raw:?} is not a vault key id (a whole number)"
                ))
            })?),
        };
        let state = match self.state.as_deref() {
            None | Some("") => None,
            Some(raw) => Some(AlertState::parse(raw).ok_or_else(|| {
                ApiError::invalid(format!(
                    "state {raw:?} is not one of open, acknowledged, snoozed"
                ))
            })?),
        };
        let limit = match self.limit.as_deref() {
            None | Some("") => 100,
            Some(raw) => match raw.parse::<i64>() {
                Ok(limit) if (1..=500).contains(&limit) => limit,
                _ => {
                    return Err(ApiError::invalid(format!(
                        "limit {raw:?} must be a whole number from 1 to 500"
                    )))
                }
            },
        };
        Ok((key, state, limit))
    }
}

/// Alerts, newest first.
#[utoipa::path(get, path = "/api/alerts", params(AlertFilter),
    responses((status = 200, body = [AlertView]), (status = 400, body = ApiErrorBody), (status = 401, body = ApiErrorBody)),
    security(("api_token" = [])))]
pub async fn list(
    State(state): State<AppState>,
    _token: ApiToken,
    Query(filter): Query<AlertFilter>,
) -> Result<Json<Vec<AlertView>>, ApiError> {
    let (key, alert_state, limit) = filter.parse()?;
    let rows = alerts::list(&state.pool, key, alert_state, limit).await?;
    Ok(Json(rows.into_iter().map(AlertView::from).collect()))
}

#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Acknowledge {
    /// What was done about it (optional).
    #[serde(default)]
    note: Option<String>,
}

/// Acknowledge an alert (once).
#[utoipa::path(post, path = "/api/alerts/{id}/ack", params(("id" = i64, Path)), request_body = Acknowledge,
    responses((status = 200, body = AlertView), (status = 404, body = ApiErrorBody), (status = 409, body = ApiErrorBody)),
    security(("api_token" = [])))]
pub async fn acknowledge(
    State(state): State<AppState>,
    token: ApiToken,
    Path(id): Path<AlertId>,
    body: Bytes,
) -> Result<Json<AlertView>, ApiError> {
    // The body is optional: no body acknowledges without a note.
    let body: Acknowledge = if body.iter().all(u8::is_ascii_whitespace) {
        Acknowledge::default()
    } else {
        serde_json::from_slice(&body).map_err(|err| {
            ApiError::invalid(format!(
                "the body is not valid JSON for an acknowledgement: {err}"
            ))
        })?
    };
    let note = body
        .note
        .map(|note| note.trim().to_owned())
        .filter(|note| !note.is_empty());
    if note
        .as_ref()
        .is_some_and(|note| note.chars().count() > 2000)
    {
        return Err(ApiError::invalid("note is longer than 2,000 characters"));
    }
    let actor = token.actor();
    match alerts::acknowledge(&state.pool, actor, id, note.as_deref()).await {
        Ok(row) => Ok(Json(row.into())),
        Err(err @ AlertChangeError::NotFound(_)) => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            err.to_string(),
        )),
        Err(err @ AlertChangeError::AlreadyAcknowledged(_)) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "already_acknowledged",
            err.to_string(),
        )),
        Err(AlertChangeError::Database(err)) => Err(err.into()),
    }
}

/// An alert as the API shows it.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct AlertView {
    #[schema(value_type = i64)]
    id: AlertId,
    #[schema(value_type = i64)]
    vault_key_id: VaultKeyId,
    key_label: String,
    /// `threshold`, `cap_refused` or `expiring`.
    kind: String,
    /// The threshold crossed (kind `threshold`), else 0.
    threshold_pct: i16,
    /// What happened, in a sentence.
    message: String,
    /// The key's currency; the amounts below are in its minor units.
    #[schema(value_type = String)]
    currency: Currency,
    /// Spent + reserved when raised (cap refusals: at the latest refusal;
    /// expiring: spent).
    #[schema(value_type = i64)]
    committed_cents: Cents,
    #[schema(value_type = i64)]
    cap_cents: Cents,
    /// The refused charge (cap refusals) or the expected billing left
    /// unspent (expiring).
    #[schema(value_type = Option<i64>)]
    amount_cents: Option<Cents>,
    /// Cap refusals after the first are counted here.
    occurrences: i32,
    /// `open`, `acknowledged` or `snoozed`.
    state: String,
    raised_at: DateTime<Utc>,
    last_occurred_at: DateTime<Utc>,
    acknowledged_at: Option<DateTime<Utc>>,
    acknowledged_by: Option<String>,
    ack_note: Option<String>,
    assigned_to: Option<String>,
    snoozed_until: Option<DateTime<Utc>>,
    /// Webhook deliveries made, still being retried, and given up.
    deliveries: Deliveries,
}

#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct Deliveries {
    delivered: i64,
    pending: i64,
    failed: i64,
}

impl From<Alert> for AlertView {
    fn from(row: Alert) -> Self {
        Self {
            message: row.describe(),
            id: row.id,
            vault_key_id: row.vault_key_id,
            key_label: row.key_label,
            kind: row.kind,
            threshold_pct: row.threshold_pct,
            currency: row.currency,
            committed_cents: row.committed_cents,
            cap_cents: row.cap_cents,
            amount_cents: row.amount_cents,
            occurrences: row.occurrences,
            state: row.state,
            raised_at: row.raised_at,
            last_occurred_at: row.last_occurred_at,
            acknowledged_at: row.acknowledged_at,
            acknowledged_by: row.acknowledged_by,
            ack_note: row.ack_note,
            assigned_to: row.assigned_to,
            snoozed_until: row.snoozed_until,
            deliveries: Deliveries {
                delivered: row.deliveries_delivered,
                pending: row.deliveries_pending,
                failed: row.deliveries_failed,
            },
        }
    }
}
