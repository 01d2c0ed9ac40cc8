//! The spend-cap proxy: a drop-in Stripe API base for billing jobs. Each
//! call goes auth → policy → reserve → forward → settle → audit, and every
//! call that reaches it leaves exactly one audit row, refusals included.

mod intents;
mod keys;
mod ledger;
mod request;
mod settle;
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
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use app::{
    domain::{moves_money, Decision, EndpointPattern},
    ssr::{
        data::{
            audit::AuditEntry,
            spend::{self, CallRecord, IntentRelease, ReserveCall, Reserved, Settlement},
        },
        secrets,
    },
};
pub use keys::KeyLookup;
pub use ledger::{Ledger, LedgerError, RESERVE_QUEUE};
use request::{CallHeaders, Params, MAX_IDEMPOTENCY_KEY};
pub(crate) use settle::answered as settle_answer;
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
    /// Every call in flight, so shutdown can wait for each to settle.
    pub calls: TaskTracker,
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
        // As sent, for the audit row, but never longer than Stripe allows:
        // an oversized key is refused, and its row must still be written.
        let idempotency_key = headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .map(|key| key.chars().take(MAX_IDEMPOTENCY_KEY).collect());
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
        let record = CallRecord::audit_only(entry);
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
    // reserved, it must forward and settle, or money is left hanging. The
    // tracker lets shutdown wait for it after its connection is gone.
    let calls = state.calls.clone();
    let call = calls.spawn(decide_and_forward(state, method, uri, headers, body));
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

    // 1. What is asked: the method and path as Stripe routes them.
    if let Err(error) = request::check_target(&method, &uri) {
        return call
            .refuse(ledger, Decision::RefusedInvalidRequest, error)
            .await;
    }

    // 2. Who is calling: the vault key, as Stripe SDKs send a key (once).
    if headers.get_all(header::AUTHORIZATION).iter().count() > 1 {
        let error =
            StripeError::invalid_request("the Authorization header was sent more than once");
        return call
            .refuse(ledger, Decision::RefusedInvalidRequest, error)
            .await;
    }
    let presented = match presented_key(&headers) {
        Presented::Missing => {
            return call
                .refuse(ledger, Decision::RefusedUnknownKey, StripeError::no_key())
                .await
        }
        Presented::Malformed => {
            return call
                .refuse(
                    ledger,
                    Decision::RefusedUnknownKey,
                    StripeError::unknown_key(),
                )
                .await
        }
        Presented::Key(key) => key,
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
        Err(err) => return unavailable(call, ledger, err).await,
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

    // 3. What it may call, and the headers Stripe acts on, each sent once
    // (refused with the key named in the audit row).
    let call_headers = match CallHeaders::read(&headers) {
        Ok(read) => read,
        Err(error) => {
            return call
                .refuse(ledger, Decision::RefusedInvalidRequest, error)
                .await
        }
    };
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
    if call_headers.stripe_account != key.stripe_account {
        // Money on another account than the key's is money its cap was
        // never set for.
        let error = StripeError::wrong_account(call_headers.stripe_account.as_deref(), &key);
        return call
            .refuse(ledger, Decision::RefusedInvalidRequest, error)
            .await;
    }

    // 4. What it says: Stripe's form-encoded parameters, read as Stripe reads them.
    let body = match body {
        Ok(body) => body,
        Err(rejection) => {
            let error = StripeError::unreadable_body(rejection.status(), &rejection.body_text());
            return call
                .refuse(ledger, Decision::RefusedInvalidRequest, error)
                .await;
        }
    };
    let params = match Params::read(&method, &uri, &headers, &body) {
        Ok(params) => params,
        Err(error) => {
            return call
                .refuse(ledger, Decision::RefusedInvalidRequest, error)
                .await
        }
    };
    let param = |name| params.get(name).map(str::to_owned);
    call.entry.stripe_customer = param("customer");
    call.entry.metadata_customer_id = param("metadata[customer_id]");
    call.entry.metadata_billing_period = param("metadata[billing_period]");
    call.entry.currency = param("currency").map(|c| c.to_ascii_lowercase());

    if !state.upstream.is_configured() {
        return call
            .refuse(
                ledger,
                Decision::RefusedUnavailable,
                StripeError::not_configured(),
            )
            .await;
    }

    // 5. Money: checked, then reserved against the cap before anything
    // leaves. Creations are metered whole; steps on a payment intent only
    // for intents this key created, and an update for what it adds.
    let mut reservation = None;
    let mut retrying_unknown = false;
    let mut duplicate_of = None;
    let mut decision = Decision::Allowed;
    let creates = moves_money(method.as_str(), path);
    let intent_step = intents::step(&method, path);
    let mut metered = None;
    let mut keep = None;
    if creates {
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
        match params.amount() {
            Ok(amount) => metered = Some(amount),
            Err(error) => return call.refuse(ledger, Decision::RefusedAmount, error).await,
        }
    } else if let Some((intent, step)) = &intent_step {
        let bound = match spend::intent_metered(pool, key.id, intent).await {
            Ok(bound) => bound,
            Err(err) => return unavailable(call, ledger, err).await,
        };
        call.entry.stripe_object_id = Some(intent.clone());
        let Some(so_far) = bound else {
            let error = StripeError::intent_not_bound(intent, &key);
            return call.refuse(ledger, Decision::RefusedEndpoint, error).await;
        };
        match step.plan(&params, so_far, &key.currency) {
            Ok(plan) => {
                metered = plan.raise;
                keep = plan.keep;
            }
            Err(error) => return call.refuse(ledger, Decision::RefusedAmount, error).await,
        }
    }
    if let Some(amount) = metered {
        call.entry.amount_cents = Some(amount.0);
        let raises_intent = intent_step.as_ref().map(|(intent, _)| intent.clone());
        let reserve = ReserveCall {
            key: key.id,
            request: call.entry.request_id,
            amount: amount.0,
            idempotency_key: call_headers.idempotency_key.clone(),
            fingerprint: hex::encode(params.fingerprint(
                &method,
                path,
                call_headers.stripe_account.as_deref(),
            )),
            method: method.to_string(),
            path: path.to_owned(),
            stripe_customer: call.entry.stripe_customer.clone(),
            // The duplicate guard looks at new charges, not at an intent's update.
            metadata_customer_id: call
                .entry
                .metadata_customer_id
                .clone()
                .filter(|_| raises_intent.is_none()),
            billing_period: key.billing_period.clone(),
            currency: Some(key.currency.clone()),
            payment_intent: raises_intent,
            request_body: call_headers
                .idempotency_key
                .is_some()
                .then(|| String::from_utf8_lossy(&body).into_owned()),
            lease_secs: i32::try_from(state.upstream.lease().as_secs()).unwrap_or(i32::MAX),
            stripe_version: headers
                .get("stripe-version")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
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
            Ok(Reserved::RetryUnknown { reservation_id }) => {
                decision = Decision::Replay;
                reservation = Some(reservation_id);
                retrying_unknown = true;
                call.entry.message = Some(
                    "a retry of a call whose outcome was unknown: Stripe's answer settles that call's reservation"
                        .into(),
                );
            }
            Ok(Reserved::InFlight) => {
                let idempotency_key = call_headers.idempotency_key.as_deref().unwrap_or_default();
                let error = StripeError::idempotency_in_flight(idempotency_key);
                return call
                    .refuse(ledger, Decision::RefusedInvalidRequest, error)
                    .await;
            }
            Ok(Reserved::IdempotencyMismatch) => {
                let idempotency_key = call_headers.idempotency_key.as_deref().unwrap_or_default();
                let error = StripeError::idempotency_mismatch(idempotency_key);
                return call
                    .refuse(ledger, Decision::RefusedInvalidRequest, error)
                    .await;
            }
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
            Err(LedgerError::Overloaded) => {
                crate::metrics::ledger_failed("overloaded");
                return call
                    .refuse(
                        ledger,
                        Decision::RefusedUnavailable,
                        StripeError::overloaded(),
                    )
                    .await;
            }
            Err(err) => return unavailable(call, ledger, err).await,
        }
    }

    // 6. Forward with the real key; no transaction is open meanwhile.
    let path_and_query = uri.path_and_query().map(|pq| pq.as_str()).unwrap_or(path);
    let forwarded_at = Instant::now();
    let outcome = state
        .upstream
        .forward(&method, path_and_query, &headers, body)
        .await;
    crate::metrics::upstream_answered(forwarded_at.elapsed());

    // 7. Settle and audit, then answer with Stripe's own response.
    let mut release = None;
    let (settlement, response) = match outcome {
        Ok(answer) => {
            call.entry.upstream_status = Some(answer.status.as_u16() as i16);
            let outcome = settle::answered(
                &state.upstream,
                answer.status,
                &answer.body,
                creates && reservation.is_some(),
                retrying_unknown,
            )
            .await;
            call.entry.stripe_object_id = outcome.object.or(call.entry.stripe_object_id.take());
            if outcome.note.is_some() {
                call.entry.message = outcome.note;
            }
            let settlement = outcome.settlement;
            match settlement {
                Settlement::Spent => {
                    release = intent_step
                        .zip(keep)
                        .map(|((intent, _), keep_cents)| IntentRelease { intent, keep_cents })
                }
                Settlement::Unknown => decision = Decision::OutcomeUnknown,
                Settlement::Released => {}
            }
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
        release,
    };
    if let Err(err) = ledger.record(record).await {
        crate::metrics::ledger_failed("settle");
        // Stripe has answered; the reservation stays pending and the
        // sweep records it as outcome unknown.
        tracing::error!(error = %err, %request_id, "could not settle a forwarded call");
    }
    response
}

/// The ledger could not be written: fail closed, forward nothing. The audit
/// row is attempted in the background (a call that failed alone, on a
/// working database, still gets one); the answer does not wait for it.
async fn unavailable(mut call: Call, ledger: &Ledger, err: impl std::fmt::Display) -> Response {
    crate::metrics::ledger_failed("check_or_reserve");
    tracing::error!(error = %err, "proxy refused a call: the spend ledger could not be written");
    call.entry.error_code = Some("spend_ledger_unavailable".into());
    let entry = call.finish(Decision::RefusedUnavailable);
    let request_id = entry.request_id;
    let ledger = ledger.clone();
    tokio::spawn(async move {
        let record = CallRecord::audit_only(entry);
        if let Err(err) = ledger.record(record).await {
            tracing::error!(error = %err, %request_id, "could not write the audit row of a call refused as unavailable");
        }
    });
    StripeError::unavailable()
        .with_request_id(request_id)
        .into_response()
}

/// What an `Authorization` header presents.
enum Presented {
    Missing,
    /// Not a key any vault key could be: undecodable, or holding bytes no
    /// key has (the call's audit row then names no key prefix).
    Malformed,
    Key(String),
}

/// The key from `Authorization: Bearer …` or HTTP Basic with the key as the
/// user name (both are how Stripe SDKs authenticate).
fn presented_key(headers: &HeaderMap) -> Presented {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Presented::Missing;
    };
    let Ok(value) = value.to_str() else {
        return Presented::Malformed;
    };
    let Some((scheme, credentials)) = value.trim().split_once(' ') else {
        return Presented::Malformed;
    };
    let key = if scheme.eq_ignore_ascii_case("bearer") {
        credentials.trim().to_owned()
    } else if scheme.eq_ignore_ascii_case("basic") {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(credentials.trim())
            .ok()
            .and_then(|bytes| String::from_utf8(bytes).ok());
        let Some(decoded) = decoded else {
            return Presented::Malformed;
        };
        decoded
            .split_once(':')
            .map(|(user, _)| user)
            .unwrap_or(&decoded)
            .to_owned()
    } else {
        return Presented::Malformed;
    };
    let plausible =
        !key.is_empty() && key.len() <= 200 && key.bytes().all(|b| b.is_ascii_graphic());
    if plausible {
        Presented::Key(key)
    } else {
        Presented::Malformed
    }
}
