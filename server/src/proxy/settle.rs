//! What Stripe's answer means for a metered call's reservation: one rule
//! for the proxy and for the job that asks Stripe about unknown outcomes.

use axum::http::StatusCode;

use super::{intents, upstream::Upstream};
use app::ssr::data::spend::Settlement;

/// How an answered call settles, what Stripe made, and what to note.
#[derive(Debug)]
pub struct Outcome {
    pub settlement: Settlement,
    pub object: Option<String>,
    pub note: Option<String>,
}

/// Settles a call Stripe answered with `status` and `body`. `creates`: the
/// call created a charge or payment intent; `retrying_unknown`: it was the
/// same request again for a call whose outcome was unknown. A declined
/// payment intent stays alive, so it is cancelled here before its amount
/// is released.
pub async fn answered(
    upstream: &Upstream,
    status: StatusCode,
    body: &[u8],
    creates: bool,
    retrying_unknown: bool,
) -> Outcome {
    if status.is_success() {
        return Outcome {
            settlement: Settlement::Spent,
            object: object_id(body),
            note: None,
        };
    }
    if let Some(intent) = creates.then(|| intents::declined(body)).flatten() {
        return match intents::cancel(upstream, &intent).await {
            Ok(()) => Outcome {
                settlement: Settlement::Released,
                note: Some(format!(
                    "declined; Vaultcap cancelled {intent} so it cannot be confirmed later"
                )),
                object: Some(intent),
            },
            Err(reason) => Outcome {
                settlement: Settlement::Unknown,
                note: Some(format!(
                    "declined, and Vaultcap could not cancel {intent} ({reason}): \
                     it stays reserved until Stripe says it is cancelled"
                )),
                object: Some(intent),
            },
        };
    }
    let settlement = if refused_by_stripe(status, body, retrying_unknown) {
        Settlement::Released
    } else {
        Settlement::Unknown
    };
    Outcome {
        settlement,
        object: None,
        note: None,
    }
}

/// Whether Stripe's 4xx shows that no money moved for this call. A fresh
/// call that Stripe refused made nothing. A retry of a call whose outcome
/// was unknown proves it only by an answer about the request itself (bad
/// parameters, a decline, no such object), which Stripe replays for a call
/// that ran: an idempotency error, a 409 (the original still running), a
/// 429 or an auth error says nothing about the original, which stays
/// reserved.
fn refused_by_stripe(status: StatusCode, body: &[u8], retrying_unknown: bool) -> bool {
    if !retrying_unknown {
        return status.is_client_error();
    }
    let idempotency_error = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .is_some_and(|v| v["error"]["type"] == "idempotency_error");
    matches!(status.as_u16(), 400 | 402 | 404) && !idempotency_error
}

/// The `id` of the object Stripe returned (`ch_…`, `pi_…`).
pub fn object_id(body: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    value.get("id")?.as_str().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retry_proves_nothing_by_an_answer_about_another_request() {
        let declined = br#"{"error":{"type":"card_error"}}"#;
        let conflict = br#"{"error":{"type":"idempotency_error"}}"#;
        assert!(refused_by_stripe(
            StatusCode::PAYMENT_REQUIRED,
            declined,
            true
        ));
        assert!(!refused_by_stripe(StatusCode::BAD_REQUEST, conflict, true));
        assert!(!refused_by_stripe(StatusCode::CONFLICT, conflict, true));
        assert!(!refused_by_stripe(StatusCode::TOO_MANY_REQUESTS, b"", true));
        assert!(refused_by_stripe(StatusCode::TOO_MANY_REQUESTS, b"", false));
    }
}
