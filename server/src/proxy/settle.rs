//! Step 5, what Stripe's answer means: the call's reservation settles and
//! its audit row is made with it, and the client gets Stripe's own answer.
//! [`answered`] is the one rule for the proxy and for the job that asks
//! Stripe about unknown outcomes.

use axum::{
    http::StatusCode,
    response::{IntoResponse, Response},
};

use super::{
    call::Call,
    intents,
    policy::Admitted,
    reserve::Held,
    stripe_error::StripeError,
    upstream::{Upstream, UpstreamError, UpstreamResponse},
};
use app::{
    domain::Decision,
    keys::spend::{CallRecord, IntentRelease, Settlement},
};

/// The record to write for a forwarded call (its reservation's settlement
/// with its audit row) and the answer for the client.
#[tracing::instrument(level = "debug", skip_all)]
pub async fn settle(
    upstream: &Upstream,
    forwarded: Result<UpstreamResponse, UpstreamError>,
    admitted: Admitted,
    held: Held,
    mut call: Call,
) -> (CallRecord, Response) {
    let mut decision = held.decision;
    let mut release = None;
    let request_id = call.entry.request_id;
    let (settlement, response) = match forwarded {
        Ok(answer) => {
            call.entry.upstream_status = Some(answer.status.as_u16() as i16);
            let creates = admitted.creates && held.reservation.is_some();
            let outcome = answered(
                upstream,
                answer.status,
                &answer.body,
                creates,
                held.retrying_unknown,
            )
            .await;
            call.entry.stripe_object_id = outcome.object.or(call.entry.stripe_object_id.take());
            if outcome.note.is_some() {
                call.entry.message = outcome.note;
            }
            match outcome.settlement {
                Settlement::Spent => {
                    release = admitted
                        .intent
                        .zip(admitted.keep)
                        .map(|((intent, _), keep_cents)| IntentRelease { intent, keep_cents })
                }
                Settlement::Unknown => decision = Decision::OutcomeUnknown,
                Settlement::Released => {}
            }
            let response = (answer.status, answer.headers, answer.body).into_response();
            (outcome.settlement, response)
        }
        Err(UpstreamError::NotSent(reason)) => {
            call.entry.error_code = Some("upstream_unreachable".into());
            call.entry.message = Some(reason);
            let error = StripeError::upstream_unreachable();
            (
                Settlement::Released,
                error.with_request_id(request_id).into_response(),
            )
        }
        Err(UpstreamError::Unknown(reason)) => {
            decision = Decision::OutcomeUnknown;
            call.entry.error_code = Some("upstream_timeout".into());
            call.entry.message = Some(reason);
            let error = StripeError::outcome_unknown();
            (
                Settlement::Unknown,
                error.with_request_id(request_id).into_response(),
            )
        }
    };
    let record = CallRecord {
        entry: call.finish(decision),
        reservation_id: held.reservation,
        settlement: held.reservation.map(|_| settlement),
        duplicate_of: held.duplicate_of,
        release,
    };
    (record, response)
}

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
    use std::time::Duration;

    use axum::http::{HeaderMap, Method};
    use bytes::Bytes;

    use super::*;
    use crate::proxy::{
        call::Request,
        intents::Step,
        request::{CallHeaders, Params},
    };
    use app::domain::Cents;

    fn call_on(intent: Option<(&str, Step)>, keep: Option<Cents>) -> (Call, Admitted) {
        let request = Request {
            method: Method::POST,
            uri: "/v1/payment_intents/pi_1/capture".parse().unwrap(),
            headers: HeaderMap::new(),
            body: Ok(Bytes::new()),
        };
        let admitted = Admitted {
            headers: CallHeaders::default(),
            params: Params::default(),
            body: Bytes::new(),
            creates: intent.is_none(),
            intent: intent.map(|(id, step)| (id.to_owned(), step)),
            metered: None,
            keep,
        };
        (Call::new(&request), admitted)
    }

    fn holding(reservation: i64) -> Held {
        Held {
            reservation: Some(reservation),
            retrying_unknown: false,
            duplicate_of: None,
            decision: Decision::Allowed,
        }
    }

    fn stripe(status: u16, body: &'static str) -> Result<UpstreamResponse, UpstreamError> {
        Ok(UpstreamResponse {
            status: StatusCode::from_u16(status).unwrap(),
            headers: HeaderMap::new(),
            body: Bytes::from_static(body.as_bytes()),
        })
    }

    async fn settled(
        forwarded: Result<UpstreamResponse, UpstreamError>,
        intent: Option<(&str, Step)>,
        keep: Option<Cents>,
    ) -> (CallRecord, Response) {
        // Nothing listens there: no step below may need Stripe again.
        let upstream = Upstream::new("http://127.0.0.1:9", None, Duration::from_secs(1)).unwrap();
        let (call, admitted) = call_on(intent, keep);
        settle(&upstream, forwarded, admitted, holding(3), call).await
    }

    #[tokio::test]
    async fn stripes_answer_settles_the_reservation_and_is_passed_on() {
        let (record, response) = settled(stripe(200, r#"{"id":"ch_1"}"#), None, None).await;
        assert_eq!(record.settlement, Some(Settlement::Spent));
        assert_eq!(record.entry.stripe_object_id.as_deref(), Some("ch_1"));
        assert_eq!(record.entry.upstream_status, Some(200));
        assert_eq!(response.status(), StatusCode::OK);

        let declined = r#"{"error":{"type":"card_error"}}"#;
        let (record, response) = settled(stripe(402, declined), None, None).await;
        assert_eq!(record.settlement, Some(Settlement::Released));
        assert_eq!(response.status(), StatusCode::PAYMENT_REQUIRED);
    }

    #[tokio::test]
    async fn a_partial_capture_gives_the_rest_back_once_stripe_agrees() {
        let capture = Some(("pi_1", Step::Capture));
        let (record, _) = settled(stripe(200, r#"{"id":"pi_1"}"#), capture, Some(Cents(300))).await;
        assert_eq!(
            record.release,
            Some(IntentRelease {
                intent: "pi_1".into(),
                keep_cents: Cents(300)
            })
        );
        let (refused, _) = settled(stripe(400, "{}"), capture, Some(Cents(300))).await;
        assert_eq!(refused.release, None);
    }

    #[tokio::test]
    async fn no_answer_releases_only_a_call_that_never_left() {
        let never = Err(UpstreamError::NotSent("connection refused".into()));
        let (record, response) = settled(never, None, None).await;
        assert_eq!(record.settlement, Some(Settlement::Released));
        assert_eq!(record.entry.decision, Decision::Allowed);
        assert_eq!(response.status(), StatusCode::BAD_GATEWAY);

        let lost = Err(UpstreamError::Unknown("timed out".into()));
        let (record, response) = settled(lost, None, None).await;
        assert_eq!(record.settlement, Some(Settlement::Unknown));
        assert_eq!(record.entry.decision, Decision::OutcomeUnknown);
        assert_eq!(record.entry.error_code.as_deref(), Some("upstream_timeout"));
        assert!(response.status().is_server_error());
    }

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
