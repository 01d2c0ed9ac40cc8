//! Refusals in Stripe's own error shape, so a Stripe SDK raises a normal
//! error: `{"error": {"type": …, "code": …, "message": …}}`.

use axum::{
    http::{HeaderValue, Method, StatusCode},
    response::{IntoResponse, Response},
    Json,
};
use serde_json::json;
use uuid::Uuid;

use app::{
    domain::{Cents, Currency},
    keys::sql::VaultKeyRow,
};

#[derive(Debug)]
pub struct StripeError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub code: &'static str,
    pub message: String,
    /// The charge the error is about, in Stripe's `error.charge` field.
    charge: Option<String>,
    request_id: Option<Uuid>,
}

fn money(cents: Cents, currency: &Currency) -> String {
    format!("{} {currency}", cents.format(currency))
}

impl StripeError {
    fn new(
        status: StatusCode,
        kind: &'static str,
        code: &'static str,
        message: impl Into<String>,
    ) -> Self {
        Self {
            status,
            kind,
            code,
            message: message.into(),
            charge: None,
            request_id: None,
        }
    }

    fn invalid(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self::new(status, "invalid_request_error", code, message)
    }

    pub fn with_request_id(mut self, request_id: Uuid) -> Self {
        self.request_id = Some(request_id);
        self
    }

    pub fn no_key() -> Self {
        Self::invalid(
            StatusCode::UNAUTHORIZED,
            "missing_api_key",
            "No vault key provided. Send it as the Stripe API key (Authorization: Bearer vk_…).",
        )
    }

    pub fn unknown_key() -> Self {
        Self::invalid(
            StatusCode::UNAUTHORIZED,
            "invalid_api_key",
            "Invalid vault key: no such key exists.",
        )
    }

    pub fn revoked(key: &VaultKeyRow) -> Self {
        Self::invalid(
            StatusCode::UNAUTHORIZED,
            "api_key_revoked",
            format!(
                "Vault key {} ({}) was revoked: {}.",
                key.secret_prefix,
                key.label,
                key.revoke_reason.as_deref().unwrap_or("no longer valid")
            ),
        )
    }

    pub fn expired(key: &VaultKeyRow) -> Self {
        Self::invalid(
            StatusCode::UNAUTHORIZED,
            "api_key_expired",
            format!(
                "Vault key {} ({}) expired at {}.",
                key.secret_prefix,
                key.label,
                key.expires_at.to_rfc3339()
            ),
        )
    }

    pub fn endpoint_not_allowed(method: &Method, path: &str, key: &VaultKeyRow) -> Self {
        Self::invalid(
            StatusCode::FORBIDDEN,
            "endpoint_not_allowed",
            format!(
                "Vault key {} may not call {method} {path}; it allows: {}.",
                key.secret_prefix,
                key.allowed_endpoints.join(", ")
            ),
        )
    }

    /// A step on a payment intent this key did not create.
    pub fn intent_not_bound(intent: &str, key: &VaultKeyRow) -> Self {
        Self::invalid(
            StatusCode::FORBIDDEN,
            "payment_intent_not_bound",
            format!(
                "Vault key {} did not create payment intent {intent}: it may confirm, capture, update or \
                 cancel only the payment intents it created. Nothing was sent to Stripe.",
                key.secret_prefix
            ),
        )
    }

    pub fn unreadable_body(status: StatusCode, reason: &str) -> Self {
        Self::invalid(
            status,
            "invalid_request",
            format!("The request body could not be read: {reason}."),
        )
    }

    /// Bytes Stripe's parser could read another way than Vaultcap's, or
    /// that break Stripe's own limits: refused before anything is reserved.
    pub fn invalid_request(reason: impl std::fmt::Display) -> Self {
        Self::invalid(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            format!("Invalid request: {reason}. Nothing was sent to Stripe."),
        )
    }

    /// A `Stripe-Account` other than the one the key is for (or one for a
    /// platform key, or none for a connected account's key).
    pub fn wrong_account(sent: Option<&str>, key: &VaultKeyRow) -> Self {
        let key_is_for = match &key.stripe_account {
            Some(account) => format!("connected account {account}: send Stripe-Account: {account}"),
            None => "the platform account: send no Stripe-Account header".to_owned(),
        };
        let sent = sent.map_or("no Stripe-Account".to_owned(), |a| {
            format!("Stripe-Account {a}")
        });
        Self::invalid_request(format!(
            "this call names {sent}, and vault key {} is for {key_is_for}",
            key.secret_prefix
        ))
    }

    /// Stripe's answer to a reused Idempotency-Key with other parameters.
    pub fn idempotency_mismatch(key: &str) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "idempotency_error",
            "idempotency_key_in_use",
            format!(
                "Keys for idempotent requests can only be used with the same parameters they were first used with. \
                 Idempotency-Key {key:?} was used for another request (method, path, parameters or Stripe-Account) \
                 within the last 24 hours; nothing was sent to Stripe. Use a new key for a new request."
            ),
        )
    }

    /// Stripe's answer while a request with the same Idempotency-Key is in flight.
    pub fn idempotency_in_flight(key: &str) -> Self {
        Self::new(
            StatusCode::CONFLICT,
            "idempotency_error",
            "idempotency_key_in_use",
            format!(
                "There is currently another in-progress request using this vault key and Idempotency-Key {key:?}. \
                 Retry after it completes; nothing was sent to Stripe."
            ),
        )
    }

    /// The ledger cannot keep up: turned away before anything is reserved.
    pub fn overloaded() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "api_error",
            "vaultcap_overloaded",
            "Vaultcap has more calls waiting for the spend ledger than it takes at once; nothing was reserved or \
             sent to Stripe. Retry shortly with the same Idempotency-Key.",
        )
    }

    pub fn not_form_encoded() -> Self {
        Self::invalid(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "The request body must be form-encoded (application/x-www-form-urlencoded), as Stripe expects.",
        )
    }

    pub fn currency(given: Option<&str>, key: &VaultKeyRow) -> Self {
        let message = match given {
            Some(given) => format!(
                "Vault key {} is for {}; this call is in {}.",
                key.secret_prefix,
                key.currency,
                given.to_uppercase()
            ),
            None => format!(
                "Missing `currency`: vault key {} is for {}.",
                key.secret_prefix, key.currency
            ),
        };
        Self::invalid(StatusCode::BAD_REQUEST, "currency_mismatch", message)
    }

    pub fn invalid_amount(reason: &str) -> Self {
        Self::invalid(
            StatusCode::BAD_REQUEST,
            "invalid_amount",
            format!("Invalid amount: {reason}."),
        )
    }

    pub fn cap_exceeded(
        key: &VaultKeyRow,
        cap: Cents,
        spent: Cents,
        reserved: Cents,
        attempted: Cents,
    ) -> Self {
        let currency = &key.currency;
        Self::invalid(
            StatusCode::PAYMENT_REQUIRED,
            "spend_cap_exceeded",
            format!(
                "Spend cap exceeded for vault key {} ({}): cap {}, spent {}, reserved {}, attempted {}. \
                 If this run is legitimately bigger, request a cap increase with \
                 POST /vault/keys/{}/cap-increase-requests.",
                key.secret_prefix,
                key.label,
                money(cap, currency),
                money(spent, currency),
                money(reserved, currency),
                money(attempted, currency),
                key.id
            ),
        )
    }

    /// The key's duplicate guard refused a second charge for a customer and
    /// period; `earlier_state` is the earlier call's reservation state.
    pub fn duplicate(
        key: &VaultKeyRow,
        customer: &str,
        earlier_charge: Option<&str>,
        earlier_state: &str,
    ) -> Self {
        let period = &key.billing_period;
        let earlier = match (earlier_charge, earlier_state) {
            (Some(charge), _) => format!("already has charge {charge} in {period}"),
            (None, "outcome_unknown") => format!(
                "already has a charge in {period} whose outcome is unknown (Stripe did not answer it); \
                 reconcile {period} before charging again"
            ),
            (None, _) => format!(
                "already has a charge in flight in {period}; if that one fails, this charge is let through"
            ),
        };
        let mut error = Self::invalid(
            StatusCode::CONFLICT,
            "duplicate_charge",
            format!(
                "Duplicate charge blocked: customer {customer} {earlier}, made under another Idempotency-Key. \
                 Nothing was sent to Stripe. Vault key {} ({}) blocks duplicates; if this second charge is \
                 intended, an operator can set its duplicate guard to flag.",
                key.secret_prefix, key.label
            ),
        );
        error.charge = earlier_charge.map(str::to_owned);
        error
    }

    pub fn not_configured() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "api_error",
            "proxy_not_configured",
            "The spend-cap proxy has no Stripe secret key configured (STRIPE_SECRET_KEY); nothing was sent to Stripe.",
        )
    }

    pub fn unavailable() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "api_error",
            "spend_ledger_unavailable",
            "The spend ledger is unreachable, so the call was not forwarded (the proxy fails closed). Retry later.",
        )
    }

    /// A bug in the proxy (a panic); the call's fate is in the server log.
    pub fn internal() -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "api_error",
            "proxy_internal_error",
            "Vaultcap failed while handling this call; its outcome is in the server log. Do not retry without an Idempotency-Key.",
        )
    }

    pub fn upstream_unreachable() -> Self {
        Self::new(
            StatusCode::BAD_GATEWAY,
            "api_error",
            "upstream_unreachable",
            "Stripe could not be reached; the request was not sent and nothing was reserved.",
        )
    }

    pub fn outcome_unknown() -> Self {
        Self::new(
            StatusCode::GATEWAY_TIMEOUT,
            "api_error",
            "outcome_unknown",
            "Stripe did not answer in time. The call may have succeeded: retry with the same Idempotency-Key; \
             the amount stays reserved until reconciliation settles it.",
        )
    }
}

impl IntoResponse for StripeError {
    fn into_response(self) -> Response {
        let mut error = json!({ "type": self.kind, "code": self.code, "message": self.message });
        if let Some(charge) = self.charge {
            error["charge"] = charge.into();
        }
        let body = json!({ "error": error });
        let mut response = (self.status, Json(body)).into_response();
        if let Some(request_id) = self.request_id {
            if let Ok(value) = HeaderValue::from_str(&format!("vc_{}", request_id.simple())) {
                response.headers_mut().insert("request-id", value);
            }
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::keys::test_key;

    #[test]
    fn a_duplicates_message_reads_as_one_sentence_after_another() {
        let key = test_key(|_| {}).row;
        for (charge, state) in [
            (Some("ch_1"), "settled"),
            (None, "outcome_unknown"),
            (None, "pending"),
        ] {
            let error = StripeError::duplicate(&key, "c1", charge, state);
            assert!(!error.message.contains("  "), "{:?}", error.message);
            assert_eq!(error.charge.as_deref(), charge);
        }
    }
}
