//! `/vault/keys`: issue, list, inspect and revoke vault keys.
//!
//! `POST /vault/keys` takes the body the seed articles' billing jobs send
//! (`vendor`, `label`, `daily_usd_cap` in dollars, `allowed_endpoints` as
//! paths, `expires_at`) and the native form (`billing_period`,
//! `expected_total_cents`, `buffer_pct`, `currency`, `cap_cents`).

use axum::{
    extract::{Path, State},
    http::{Method, StatusCode},
    response::IntoResponse,
    Json,
};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{ApiError, ApiErrorBody, ApiJson, ApiRoutes, ApiToken};
use app::{
    domain::{
        ApiScope, BillingPeriod, Cents, Currency, DuplicatePolicy, EndpointPattern, KeyRequest,
        KeyRequestId, ParseError, RequestState, VaultKeyId,
    },
    error::AppError,
    key_requests::{
        rules::{self as key_requests, Outcome},
        sql as key_request_rows,
    },
    keys::{
        rules::{self as vault_keys, KeyFields, NewVaultKey, DEFAULT_THRESHOLDS_PCT},
        sql::{self as key_rows, VaultKeyRow},
    },
    ssr::AppState,
};

pub fn routes(routes: ApiRoutes) -> ApiRoutes {
    routes
        .public(Method::GET, "/api/openapi.json", || async {
            Json(super::openapi::document())
        })
        .route(Method::POST, "/vault/keys", ApiScope::KeysCreate, create)
        .route(Method::GET, "/vault/keys", ApiScope::KeysRead, list)
        .route(Method::GET, "/vault/keys/{id}", ApiScope::KeysRead, show)
        .route(
            Method::POST,
            "/vault/keys/{id}/revoke",
            ApiScope::KeysRevoke,
            revoke,
        )
        .route(
            Method::GET,
            "/vault/key-requests/{id}",
            ApiScope::KeysRead,
            show_request,
        )
}

/// A request for a vault key: the seed articles' form (`daily_usd_cap`) or
/// the native form (`expected_total_cents`, optional `cap_cents`).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateKey {
    #[serde(default)]
    vendor: Option<String>,
    label: String,
    /// The seeds' form: the cap in dollars (expected total × 1.10).
    #[serde(default)]
    daily_usd_cap: Option<f64>,
    #[serde(default)]
    billing_period: Option<String>,
    #[serde(default)]
    #[schema(value_type = Option<i64>)]
    expected_total_cents: Option<Cents>,
    /// Percent over the expected total (default 10).
    #[serde(default)]
    buffer_pct: Option<f64>,
    #[serde(default)]
    currency: Option<String>,
    #[serde(default)]
    #[schema(value_type = Option<i64>)]
    cap_cents: Option<Cents>,
    allowed_endpoints: Vec<String>,
    expires_at: String,
    /// What the proxy does with a second charge for a customer and period
    /// under another Idempotency-Key: `flag` (default: forward it, open a
    /// duplicate finding), `block` (refuse it, 409) or `off`.
    #[serde(default)]
    duplicate_policy: Option<String>,
    /// The connected account (`acct_…`) the key is for: every call must
    /// send it as `Stripe-Account`. Without it, calls naming an account are
    /// refused.
    #[serde(default)]
    stripe_account: Option<String>,
}

const DEFAULT_BUFFER_BPS: u32 = 1000;

impl CreateKey {
    /// Reads the JSON's own shapes (the seeds' dollars, RFC 3339 times);
    /// the rules are the console's, in [`KeyFields::check`].
    fn parse(self, now: DateTime<Utc>) -> Result<NewVaultKey, ApiError> {
        if let Some(vendor) = &self.vendor {
            if vendor != "stripe" {
                return Err(ApiError::invalid(format!(
                    "vendor {vendor:?} is not supported: Vaultcap governs \"stripe\""
                )));
            }
        }
        // Its range is a rule, said by the check below.
        let buffer_bps = match self.buffer_pct {
            None => Ok(DEFAULT_BUFFER_BPS),
            Some(pct) if pct.is_finite() && pct >= 0.0 => Ok((pct * 100.0).round() as u32),
            Some(pct) => Err(format!("buffer_pct {pct} is not a percentage")),
        };
        let (expected_total, cap) =
            match (
                self.daily_usd_cap,
                self.expected_total_cents,
                self.cap_cents,
            ) {
                (Some(dollars), None, None) => {
                    // The seeds send the cap; the expected total is what it was
                    // computed from, rounded up, so that the key's own buffer
                    // gives the cap back (rounding down would leave the cap a
                    // cent above expected × 1.10, beyond the key policy).
                    let cap = Cents::from_dollars(dollars)?;
                    let divisor = 10_000 + i128::from(*buffer_bps.as_ref().unwrap_or(&0));
                    let expected = (i128::from(cap.0) * 10_000 + divisor - 1) / divisor;
                    (Ok(Cents(expected as i64)), Some(cap))
                }
                (None, Some(expected), cap) => {
                    let expected = if (0..=app::domain::MAX_CENTS).contains(&expected.0) {
                        Ok(expected)
                    } else {
                        Err(format!(
                            "expected_total_cents {} is out of range",
                            expected.0
                        ))
                    };
                    (expected, cap)
                }
                (None, None, _) => return Err(ApiError::invalid(
                    "give the cap as daily_usd_cap, or the expected total as expected_total_cents",
                )),
                (Some(_), _, _) => {
                    return Err(ApiError::invalid(
                        "give either daily_usd_cap or expected_total_cents/cap_cents, not both",
                    ))
                }
            };
        let expires_at = DateTime::parse_from_rfc3339(self.expires_at.trim())
            .map(|at| at.with_timezone(&Utc))
            .map_err(|err| {
                format!(
                    "expires_at {:?} is not an RFC 3339 time: {err}",
                    self.expires_at
                )
            });
        let billing_period = match &self.billing_period {
            Some(period) => period.parse().map_err(|err: ParseError| err.0),
            None => {
                Ok(period_in_label(&self.label).unwrap_or_else(|| BillingPeriod::containing(now)))
            }
        };
        let fields = KeyFields {
            label: self.label,
            billing_period,
            currency: match &self.currency {
                Some(code) => Currency::parse(code).map_err(|err| err.0),
                None => Ok(Currency::usd()),
            },
            expected_total,
            buffer_bps,
            cap,
            endpoints: self
                .allowed_endpoints
                .iter()
                .map(|raw| EndpointPattern::parse(raw).map_err(|err| err.0))
                .collect(),
            expires_at,
            thresholds: Ok(DEFAULT_THRESHOLDS_PCT.to_vec()),
            duplicate_policy: match &self.duplicate_policy {
                Some(raw) => DuplicatePolicy::parse(raw).map_err(|err| err.0),
                None => Ok(DuplicatePolicy::default()),
            },
            stripe_account: self.stripe_account,
        };
        fields.check(now).map_err(|errors| {
            let messages: Vec<String> = errors.into_iter().map(|(_, message)| message).collect();
            ApiError::invalid(messages.join("; "))
        })
    }
}

/// `billing-run-2026-07` names its period: the seeds' jobs put it there.
fn period_in_label(label: &str) -> Option<BillingPeriod> {
    let tail = label.get(label.len().checked_sub(7)?..)?;
    tail.parse().ok()
}

/// A key as the API shows it: never the secret, only its prefix.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct KeyView {
    #[schema(value_type = i64)]
    id: VaultKeyId,
    vendor: &'static str,
    label: String,
    prefix: String,
    /// `YYYY-MM`.
    #[schema(value_type = String)]
    billing_period: BillingPeriod,
    /// Lower-case, as Stripe writes it.
    #[schema(value_type = String)]
    currency: Currency,
    #[schema(value_type = i64)]
    expected_total_cents: Cents,
    buffer_pct: f64,
    #[schema(value_type = i64)]
    cap_cents: Cents,
    #[schema(value_type = i64)]
    spent_cents: Cents,
    #[schema(value_type = i64)]
    reserved_cents: Cents,
    utilization_pct: i64,
    allowed_endpoints: Vec<String>,
    expires_at: DateTime<Utc>,
    /// `flag`, `block` or `off`.
    #[schema(value_type = String)]
    duplicate_policy: DuplicatePolicy,
    /// The connected account every call must name, if any.
    stripe_account: Option<String>,
    status: &'static str,
    revoked_at: Option<DateTime<Utc>>,
    revoke_reason: Option<String>,
    created_at: DateTime<Utc>,
}

impl From<VaultKeyRow> for KeyView {
    fn from(row: VaultKeyRow) -> Self {
        let status = row.status(Utc::now()).as_str();
        Self {
            id: row.id,
            vendor: "stripe",
            utilization_pct: Cents(row.spent_cents.0 + row.reserved_cents.0)
                .percent_of(row.cap_cents),
            label: row.label,
            prefix: row.secret_prefix,
            billing_period: row.billing_period,
            currency: row.currency,
            expected_total_cents: row.expected_total_cents,
            buffer_pct: f64::from(row.buffer_bps) / 100.0,
            cap_cents: row.cap_cents,
            spent_cents: row.spent_cents,
            reserved_cents: row.reserved_cents,
            allowed_endpoints: row.allowed_endpoints,
            expires_at: row.expires_at,
            duplicate_policy: row.duplicate_policy,
            stripe_account: row.stripe_account,
            status,
            revoked_at: row.revoked_at,
            revoke_reason: row.revoke_reason,
            created_at: row.created_at,
        }
    }
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct CreatedKey {
    /// The secret, shown only in this response.
    vault_key: String,
    #[serde(flatten)]
    key: KeyView,
}

/// Issue a vault key (201), or, beyond the key policy, ask for it (202): a
/// different approver decides in the console, and the key works from then
/// on. The secret is in this response only, either way.
#[utoipa::path(post, path = "/vault/keys", request_body = CreateKey,
    responses((status = 201, body = CreatedKey), (status = 202, body = RequestedKey),
              (status = 400, body = ApiErrorBody), (status = 401, body = ApiErrorBody)),
    security(("api_token" = [])))]
pub async fn create(
    State(state): State<AppState>,
    token: ApiToken,
    ApiJson(body): ApiJson<CreateKey>,
) -> Result<axum::response::Response, ApiError> {
    let key = body.parse(Utc::now())?;
    let outcome =
        key_requests::issue_or_request(&state.pool, &state.key_policy, token.actor(), key).await?;
    Ok(match outcome {
        Outcome::Issued { secret, key } => (
            StatusCode::CREATED,
            Json(CreatedKey {
                vault_key: secret,
                key: key.into(),
            }),
        )
            .into_response(),
        Outcome::Waiting { secret, request } => (
            StatusCode::ACCEPTED,
            Json(RequestedKey {
                status: "pending_approval",
                vault_key: secret,
                key_request: request.into(),
            }),
        )
            .into_response(),
    })
}

/// A key beyond policy, asked for: its secret works once approved.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct RequestedKey {
    /// `pending_approval`.
    status: &'static str,
    /// The key's secret: refused (401) until an approver issues the key.
    vault_key: String,
    key_request: KeyRequestView,
}

/// A key request and its decision.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct KeyRequestView {
    #[schema(value_type = i64)]
    id: KeyRequestId,
    label: String,
    #[schema(value_type = String)]
    billing_period: BillingPeriod,
    #[schema(value_type = String)]
    currency: Currency,
    #[schema(value_type = i64)]
    expected_total_cents: Cents,
    #[schema(value_type = i64)]
    cap_cents: Cents,
    /// The most policy would have issued without an approver.
    #[schema(value_type = i64)]
    policy_cap_cents: Cents,
    /// Why it needs an approver.
    over_policy: String,
    /// `pending`, `approved`, `rejected` or `expired`.
    #[schema(value_type = String)]
    state: RequestState,
    requested_at: DateTime<Utc>,
    expires_at: DateTime<Utc>,
    decided_at: Option<DateTime<Utc>>,
    decided_by: Option<String>,
    decision_note: Option<String>,
    /// The key issued on approval.
    #[schema(value_type = Option<i64>)]
    vault_key_id: Option<VaultKeyId>,
}

impl From<KeyRequest> for KeyRequestView {
    fn from(request: KeyRequest) -> Self {
        Self {
            id: request.id,
            label: request.label,
            billing_period: request.billing_period,
            currency: request.currency,
            expected_total_cents: request.expected_total_cents,
            cap_cents: request.cap_cents,
            policy_cap_cents: request.policy_cap_cents,
            over_policy: request.over_policy,
            state: request.state,
            requested_at: request.requested_at,
            expires_at: request.expires_at,
            decided_at: request.decided_at,
            decided_by: request.decided_by,
            decision_note: request.decision_note,
            vault_key_id: request.vault_key_id,
        }
    }
}

/// A key request: whether an approver has decided, and the key it issued.
#[utoipa::path(get, path = "/vault/key-requests/{id}", params(("id" = i64, Path)),
    responses((status = 200, body = KeyRequestView), (status = 404, body = ApiErrorBody)),
    security(("api_token" = [])))]
pub async fn show_request(
    State(state): State<AppState>,
    _token: ApiToken,
    Path(id): Path<KeyRequestId>,
) -> Result<Json<KeyRequestView>, ApiError> {
    let request = key_request_rows::find(&state.pool, id)
        .await?
        .ok_or(AppError::NotFound)?;
    Ok(Json(request.into()))
}

/// The newest keys, at most this many.
const LIST_LIMIT: i64 = 500;

/// The newest keys (at most 500).
#[utoipa::path(get, path = "/vault/keys", responses((status = 200, body = [KeyView]), (status = 401, body = ApiErrorBody)),
    security(("api_token" = [])))]
pub async fn list(
    State(state): State<AppState>,
    _token: ApiToken,
) -> Result<Json<Vec<KeyView>>, ApiError> {
    let rows = key_rows::list(&state.pool, LIST_LIMIT).await?;
    Ok(Json(rows.into_iter().map(KeyView::from).collect()))
}

/// One key with its spend, reservations and utilization.
#[utoipa::path(get, path = "/vault/keys/{id}", params(("id" = i64, Path)),
    responses((status = 200, body = KeyView), (status = 404, body = ApiErrorBody)), security(("api_token" = [])))]
pub async fn show(
    State(state): State<AppState>,
    _token: ApiToken,
    Path(id): Path<VaultKeyId>,
) -> Result<Json<KeyView>, ApiError> {
    let row = key_rows::find(&state.pool, id)
        .await?
        .ok_or(AppError::NotFound)?;
    Ok(Json(row.into()))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Revoke {
    reason: String,
}

/// Revoke a key: the proxy refuses it from the next call.
#[utoipa::path(post, path = "/vault/keys/{id}/revoke", params(("id" = i64, Path)), request_body = Revoke,
    responses((status = 200, body = KeyView), (status = 400, body = ApiErrorBody), (status = 404, body = ApiErrorBody)),
    security(("api_token" = [])))]
pub async fn revoke(
    State(state): State<AppState>,
    token: ApiToken,
    Path(id): Path<VaultKeyId>,
    ApiJson(body): ApiJson<Revoke>,
) -> Result<Json<KeyView>, ApiError> {
    let row = vault_keys::revoke(&state.pool, token.actor(), id, &body.reason).await?;
    Ok(Json(row.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_period_is_read_from_a_label_that_ends_with_one() {
        assert_eq!(
            period_in_label("billing-run-2026-07").unwrap().to_string(),
            "2026-07"
        );
        assert_eq!(period_in_label("sqs-billing-run-2026-13"), None);
        assert_eq!(period_in_label("run"), None);
        assert_eq!(period_in_label("é-2026-07").unwrap().to_string(), "2026-07");
    }
}
