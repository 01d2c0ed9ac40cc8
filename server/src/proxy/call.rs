//! A call as it arrived, and the audit row it becomes: every call that
//! reaches the proxy leaves exactly one, refusals included.

use std::time::Instant;

use axum::{
    body::Bytes,
    extract::rejection::BytesRejection,
    http::{HeaderMap, Method, Uri},
    response::{IntoResponse, Response},
};

use app::{audit::sql::AuditEntry, domain::Decision, keys::spend::CallRecord};

use super::{ledger::Ledger, request::MAX_IDEMPOTENCY_KEY, stripe_error::StripeError};

/// The call as the client sent it.
pub struct Request {
    pub method: Method,
    pub uri: Uri,
    pub headers: HeaderMap,
    pub body: Result<Bytes, BytesRejection>,
}

/// Why a step will not let a call go on.
#[derive(Debug)]
pub enum Refusal {
    /// A rule refused it: audited as `decision`, answered with the error.
    Refused(Decision, StripeError),
    /// The ledger or the key store could not be read or written: fail
    /// closed, forward nothing.
    Unavailable(String),
}

impl Refusal {
    /// The call is not one Stripe would read as it was meant.
    pub fn invalid(error: StripeError) -> Self {
        Self::Refused(Decision::RefusedInvalidRequest, error)
    }
}

impl From<sqlx::Error> for Refusal {
    fn from(err: sqlx::Error) -> Self {
        Self::Unavailable(err.to_string())
    }
}

/// One call as it is being decided: becomes its audit row.
pub struct Call {
    started: Instant,
    pub entry: AuditEntry,
}

impl Call {
    pub fn new(request: &Request) -> Self {
        // As sent, for the audit row, but never longer than Stripe allows:
        // an oversized key is refused, and its row must still be written.
        let idempotency_key = request
            .headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .map(|key| key.chars().take(MAX_IDEMPOTENCY_KEY).collect());
        Self {
            started: Instant::now(),
            entry: AuditEntry {
                idempotency_key,
                ..AuditEntry::received(request.method.as_str(), request.uri.path())
            },
        }
    }

    /// The audit row, decided and timed.
    pub fn finish(mut self, decision: Decision) -> AuditEntry {
        crate::metrics::call_decided(decision);
        self.entry.decision = decision;
        self.entry.latency_ms =
            i32::try_from(self.started.elapsed().as_millis()).unwrap_or(i32::MAX);
        self.entry
    }

    /// Refuses the call: audits it, answers in Stripe's error shape.
    pub async fn refuse(self, ledger: &Ledger, refusal: Refusal) -> Response {
        match refusal {
            Refusal::Refused(decision, error) => self.refused(ledger, decision, error).await,
            Refusal::Unavailable(reason) => self.unavailable(ledger, &reason),
        }
    }

    async fn refused(
        mut self,
        ledger: &Ledger,
        decision: Decision,
        error: StripeError,
    ) -> Response {
        self.entry.error_code = Some(error.code.to_owned());
        self.entry.message = Some(error.message.clone());
        let entry = self.finish(decision);
        let request_id = entry.request_id;
        if let Err(err) = ledger.record(CallRecord::audit_only(entry)).await {
            // Refusing is always safe; the log says the row is missing.
            tracing::error!(error = %err, %request_id, decision = decision.as_str(),
                "could not write the audit row of a refused call");
        }
        error.with_request_id(request_id).into_response()
    }

    /// The ledger could not be written. The audit row is attempted in the
    /// background (a call that failed alone, on a working database, still
    /// gets one); the answer does not wait for it.
    fn unavailable(mut self, ledger: &Ledger, reason: &str) -> Response {
        crate::metrics::ledger_failed("check_or_reserve");
        tracing::error!(error = %reason, "proxy refused a call: the spend ledger could not be written");
        self.entry.error_code = Some("spend_ledger_unavailable".into());
        let entry = self.finish(Decision::RefusedUnavailable);
        let request_id = entry.request_id;
        let ledger = ledger.clone();
        tokio::spawn(async move {
            if let Err(err) = ledger.record(CallRecord::audit_only(entry)).await {
                tracing::error!(error = %err, %request_id, "could not write the audit row of a call refused as unavailable");
            }
        });
        StripeError::unavailable()
            .with_request_id(request_id)
            .into_response()
    }
}
