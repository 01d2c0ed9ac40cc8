//! The spend-cap proxy: a drop-in Stripe API base for billing jobs. Each
//! call goes auth → policy → reserve → forward → settle → audit, and every
//! call that reaches it leaves exactly one audit row, refusals included.

mod keys;
mod ledger;
mod stripe_error;
pub mod upstream;

use std::time::Instant;

use axum::{
    body::Bytes,
    extract::{DefaultBodyLimit, State},
    http::{header, HeaderMap, Method, Uri},
    response::{IntoResponse, Response},
    routing::any,
    Router,
};
use base64::Engine;
use chrono::Utc;
use sqlx::PgPool;
use uuid::Uuid;

use app::{
    domain::{moves_money, Cents, Decision, EndpointPattern},
    ssr::{
        data::{
            audit::AuditEntry,
            spend::{CallRecord, ReserveCall, Reserved, Settlement},
        },
        secrets,
    },
};
pub use keys::KeyLookup;
pub use ledger::Ledger;
use stripe_error::StripeError;
use upstream::{Upstream, UpstreamError};

/// Stripe accepts request bodies far smaller than this.
pub const MAX_BODY: usize = 1024 * 1024;

#[derive(Clone)]
pub struct ProxyState {
    pub pool: PgPool,
    pub upstream: Upstream,
    pub ledger: Ledger,
    pub keys: KeyLookup,
}

pub fn router(state: ProxyState) -> Router {
    Router::new()
        .route("/v1/{*rest}", any(handle))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(state)
}

/// One call as it is being decided: becomes its audit row.
struct Call {
    started: Instant,
    entry: AuditEntry,
}

impl Call {
    fn new(method: &Method, uri: &Uri, headers: &HeaderMap) -> Self {
        let idempotency_key = headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        Self {
            started: Instant::now(),
            entry: AuditEntry {
                request_id: Uuid::new_v4(),
                vault_key_id: None,
                key_prefix: None,
                method: method.to_string(),
                path: uri.path().to_owned(),
                stripe_customer: None,
                metadata_customer_id: None,
                metadata_billing_period: None,
                billing_period: None,
                amount_cents: None,
                currency: None,
                idempotency_key,
                decision: Decision::Allowed,
                upstream_status: None,
                stripe_object_id: None,
                error_code: None,
                message: None,
                latency_ms: 0,
            },
        }
    }

    fn finish(mut self, decision: Decision) -> AuditEntry {
        crate::metrics::call_decided(decision);
        self.entry.decision = decision;
        self.entry.latency_ms =
            i32::try_from(self.started.elapsed().as_millis()).unwrap_or(i32::MAX);
        self.entry
    }

    /// Refuses the call: audits it, answers in Stripe's error shape.
    async fn refuse(mut self, ledger: &Ledger, decision: Decision, error: StripeError) -> Response {
        self.entry.error_code = Some(error.code.to_owned());
        self.entry.message = Some(error.message.clone());
        let entry = self.finish(decision);
        let request_id = entry.request_id;
        let record = CallRecord {
            entry,
            reservation_id: None,
            settlement: None,
            duplicate_of: None,
        };
        if let Err(err) = ledger.record(record).await {
            // Refusing is always safe; the log says the row is missing.
            tracing::error!(error = %err, %request_id, decision = decision.as_str(),
                "could not write the audit row of a refused call");
        }
        error.with_request_id(request_id).into_response()
    }
}

async fn handle(
    State(state): State<ProxyState>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    // A call runs to its end even if the client hangs up: once it has
    // reserved, it must forward and settle, or money is left hanging.
    let call = tokio::spawn(decide_and_forward(state, method, uri, headers, body));
    call.await.unwrap_or_else(|err| {
        tracing::error!(error = %err, "a proxied call panicked");
        StripeError::internal().into_response()
    })
}

async fn decide_and_forward(
    state: ProxyState,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    let mut call = Call::new(&method, &uri, &headers);
    let (pool, ledger) = (&state.pool, &state.ledger);

    // 1. Who is calling: the vault key, as Stripe SDKs send a key.
    let Some(presented) = presented_key(&headers) else {
        return call
            .refuse(ledger, Decision::RefusedUnknownKey, StripeError::no_key())
            .await;
    };
    call.entry.key_prefix = Some(secrets::prefix(&presented));
    let hash = secrets::hash(&presented);
    let looked_up = if moves_money(method.as_str(), uri.path()) {
        state.keys.for_charge(pool, &hash).await
    } else {
        state.keys.current(pool, &hash).await
    };
    let key = match looked_up {
        Ok(Some(key)) => key,
        Ok(None) => {
            return call
                .refuse(
                    ledger,
                    Decision::RefusedUnknownKey,
                    StripeError::unknown_key(),
                )
                .await
        }
        Err(err) => return unavailable(call, err).await,
    };
    call.entry.vault_key_id = Some(key.id);
    call.entry.billing_period = Some(key.billing_period.clone());
    if key.revoked_at.is_some() {
        return call
            .refuse(ledger, Decision::RefusedRevoked, StripeError::revoked(&key))
            .await;
    }
    if key.expires_at <= Utc::now() {
        return call
            .refuse(ledger, Decision::RefusedExpired, StripeError::expired(&key))
            .await;
    }

    // 2. What it may call.
    let path = uri.path();
    let allowed = key
        .allowed_endpoints
        .iter()
        .filter_map(|raw| EndpointPattern::parse(raw).ok())
        .any(|pattern| pattern.matches(method.as_str(), path));
    if !allowed {
        return call
            .refuse(
                ledger,
                Decision::RefusedEndpoint,
                StripeError::endpoint_not_allowed(&method, path, &key),
            )
            .await;
    }

    // 3. What it says: Stripe's form-encoded parameters.
    let body = match body {
        Ok(body) => body,
        Err(rejection) => {
            let error = StripeError::unreadable_body(rejection.status(), &rejection.body_text());
            return call
                .refuse(ledger, Decision::RefusedInvalidRequest, error)
                .await;
        }
    };
    let params = match Params::parse(&method, &uri, &headers, &body) {
        Ok(params) => params,
        Err(error) => {
            return call
                .refuse(ledger, Decision::RefusedInvalidRequest, error)
                .await
        }
    };
    call.entry.stripe_customer = params.single("customer");
    call.entry.metadata_customer_id = params.single("metadata[customer_id]");
    call.entry.metadata_billing_period = params.single("metadata[billing_period]");
    call.entry.currency = params.single("currency").map(|c| c.to_ascii_lowercase());

    if !state.upstream.is_configured() {
        return call
            .refuse(
                ledger,
                Decision::RefusedUnavailable,
                StripeError::not_configured(),
            )
            .await;
    }

    // 4. Money: checked, then reserved against the cap before anything leaves.
    let mut reservation = None;
    let mut duplicate_of = None;
    let mut decision = Decision::Allowed;
    if moves_money(method.as_str(), path) {
        match call.entry.currency.clone().as_deref() {
            Some(currency) if currency == key.currency => {}
            other => {
                return call
                    .refuse(
                        ledger,
                        Decision::RefusedCurrency,
                        StripeError::currency(other, &key),
                    )
                    .await;
            }
        }
        let amount = match params.amount() {
            Ok(amount) => amount,
            Err(error) => return call.refuse(ledger, Decision::RefusedAmount, error).await,
        };
        call.entry.amount_cents = Some(amount.0);
        let reserve = ReserveCall {
            key: key.id,
            request: call.entry.request_id,
            amount: amount.0,
            idempotency_key: call.entry.idempotency_key.clone(),
            method: method.to_string(),
            path: path.to_owned(),
            stripe_customer: call.entry.stripe_customer.clone(),
            metadata_customer_id: call.entry.metadata_customer_id.clone(),
            billing_period: key.billing_period.clone(),
            currency: call.entry.currency.clone(),
        };
        match ledger.reserve(reserve).await {
            Ok(Reserved::New {
                reservation_id,
                duplicate_of: flagged,
            }) => {
                reservation = Some(reservation_id);
                duplicate_of = flagged;
                if let Some(earlier) = &duplicate_of {
                    call.entry.message = Some(format!(
                        "flagged as a duplicate of {earlier}: a second charge for this customer and period \
                         under another Idempotency-Key (forwarded; a duplicate finding opens when Stripe confirms it)"
                    ));
                }
            }
            Ok(Reserved::Duplicate {
                earlier_charge,
                earlier_state,
            }) => {
                let customer = call.entry.metadata_customer_id.clone().unwrap_or_default();
                let error = StripeError::duplicate(
                    &key,
                    &customer,
                    earlier_charge.as_deref(),
                    &earlier_state,
                );
                return call.refuse(ledger, Decision::RefusedDuplicate, error).await;
            }
            Ok(Reserved::Replay) => decision = Decision::Replay,
            Ok(Reserved::OverCap {
                cap,
                spent,
                reserved,
            }) => {
                let error = StripeError::cap_exceeded(&key, cap, spent, reserved, amount);
                return call.refuse(ledger, Decision::RefusedCap, error).await;
            }
            Ok(Reserved::KeyUnusable) => {
                // Revoked since it was cached (expiry never changes).
                let key = match state.keys.current(pool, &hash).await {
                    Ok(Some(current)) => current,
                    _ => key,
                };
                return call
                    .refuse(ledger, Decision::RefusedRevoked, StripeError::revoked(&key))
                    .await;
            }
            Err(err) => return unavailable(call, err).await,
        }
    }

    // 5. Forward with the real key; no transaction is open meanwhile.
    let path_and_query = uri.path_and_query().map(|pq| pq.as_str()).unwrap_or(path);
    let forwarded_at = Instant::now();
    let outcome = state
        .upstream
        .forward(&method, path_and_query, &headers, body)
        .await;
    crate::metrics::upstream_answered(forwarded_at.elapsed());

    // 6. Settle and audit, then answer with Stripe's own response.
    let (settlement, response) = match outcome {
        Ok(answer) => {
            call.entry.upstream_status = Some(answer.status.as_u16() as i16);
            let settlement = if answer.status.is_success() {
                call.entry.stripe_object_id = object_id(&answer.body);
                Settlement::Spent
            } else if answer.status.is_client_error() {
                Settlement::Released
            } else {
                decision = Decision::OutcomeUnknown;
                Settlement::Unknown
            };
            (
                settlement,
                (answer.status, answer.headers, answer.body).into_response(),
            )
        }
        Err(UpstreamError::NotSent(reason)) => {
            call.entry.error_code = Some("upstream_unreachable".into());
            call.entry.message = Some(reason);
            (
                Settlement::Released,
                StripeError::upstream_unreachable()
                    .with_request_id(call.entry.request_id)
                    .into_response(),
            )
        }
        Err(UpstreamError::Unknown(reason)) => {
            decision = Decision::OutcomeUnknown;
            call.entry.error_code = Some("upstream_timeout".into());
            call.entry.message = Some(reason);
            (
                Settlement::Unknown,
                StripeError::outcome_unknown()
                    .with_request_id(call.entry.request_id)
                    .into_response(),
            )
        }
    };
    let entry = call.finish(decision);
    let request_id = entry.request_id;
    let record = CallRecord {
        entry,
        reservation_id: reservation,
        settlement: reservation.map(|_| settlement),
        duplicate_of,
    };
    if let Err(err) = ledger.record(record).await {
        crate::metrics::ledger_failed("settle");
        // Stripe has answered; the reservation stays pending and the
        // sweep records it as outcome unknown.
        tracing::error!(error = %err, %request_id, "could not settle a forwarded call");
    }
    response
}

/// The database is unreachable: fail closed, forward nothing.
async fn unavailable(call: Call, err: impl std::fmt::Display) -> Response {
    crate::metrics::ledger_failed("check_or_reserve");
    let request_id = call.finish(Decision::RefusedUnavailable).request_id;
    tracing::error!(error = %err, "proxy refused a call: database unavailable");
    // The audit row cannot be written either; the log line above stands in.
    StripeError::unavailable()
        .with_request_id(request_id)
        .into_response()
}

/// The key from `Authorization: Bearer …` or HTTP Basic with the key as the
/// user name (both are how Stripe SDKs authenticate).
fn presented_key(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, credentials) = value.split_once(' ')?;
    let key = if scheme.eq_ignore_ascii_case("bearer") {
        credentials.trim().to_owned()
    } else if scheme.eq_ignore_ascii_case("basic") {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(credentials.trim())
            .ok()?;
        let decoded = String::from_utf8(decoded).ok()?;
        decoded
            .split_once(':')
            .map(|(user, _)| user)
            .unwrap_or(&decoded)
            .to_owned()
    } else {
        return None;
    };
    (!key.is_empty() && key.len() <= 200).then_some(key)
}

/// The `id` of the object Stripe returned (`ch_…`, `pi_…`).
fn object_id(body: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    value.get("id")?.as_str().map(str::to_owned)
}

/// A request's parameters: the form body for writes, the query for reads.
struct Params(Vec<(String, String)>);

impl Params {
    fn parse(
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<Self, StripeError> {
        if body.is_empty() || method == Method::GET {
            let query = uri.query().unwrap_or("");
            return Ok(Self(
                form_urlencoded::parse(query.as_bytes())
                    .into_owned()
                    .collect(),
            ));
        }
        let form = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.starts_with("application/x-www-form-urlencoded"));
        if !form || std::str::from_utf8(body).is_err() {
            return Err(StripeError::not_form_encoded());
        }
        Ok(Self(form_urlencoded::parse(body).into_owned().collect()))
    }

    /// A parameter given exactly once (or `None`).
    fn single(&self, name: &str) -> Option<String> {
        let mut values = self.0.iter().filter(|(key, _)| key == name);
        match (values.next(), values.next()) {
            (Some((_, value)), None) => Some(value.clone()),
            _ => None,
        }
    }

    fn amount(&self) -> Result<Cents, StripeError> {
        let values: Vec<&String> = self
            .0
            .iter()
            .filter(|(key, _)| key == "amount")
            .map(|(_, v)| v)
            .collect();
        match values.as_slice() {
            [] => Err(StripeError::invalid_amount(
                "missing: a charge needs an `amount` in cents",
            )),
            [raw] => Cents::parse_positive(raw).map_err(|err| StripeError::invalid_amount(&err.0)),
            _ => Err(StripeError::invalid_amount(
                "`amount` was given more than once",
            )),
        }
    }
}
