//! Payment intents, metered through their life.
//!
//! An intent's creation is metered like a charge. What follows it is bound
//! to the vault key that created it: confirm, capture, update and cancel
//! are forwarded only for intents this key created, an update that raises
//! the amount reserves the difference, a capture may not take more than
//! was metered, and a cancel or a partial capture gives the rest back. A
//! creation Stripe declines leaves the intent alive (it can be confirmed
//! again), so its reservation is kept until Vaultcap has cancelled it.

use axum::http::{HeaderMap, Method};
use bytes::Bytes;

use super::{request::Params, stripe_error::StripeError, upstream::Upstream};
use app::domain::{Cents, Currency};

/// What a call does to an existing payment intent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Update,
    Confirm,
    Capture,
    Cancel,
}

/// `POST /v1/payment_intents/{id}` and its `/confirm`, `/capture`,
/// `/cancel`: the intent's id and the step.
pub fn step(method: &Method, path: &str) -> Option<(String, Step)> {
    if method != Method::POST {
        return None;
    }
    let rest = path
        .trim_end_matches('/')
        .strip_prefix("/v1/payment_intents/")?;
    let (id, step) = match rest.split_once('/') {
        None => (rest, Step::Update),
        Some((id, "confirm")) => (id, Step::Confirm),
        Some((id, "capture")) => (id, Step::Capture),
        Some((id, "cancel")) => (id, Step::Cancel),
        Some(_) => return None,
    };
    (!id.is_empty()).then(|| (id.to_owned(), step))
}

/// What the proxy does about one step on an intent `metered` cents deep.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// An update raising the amount: reserve this much more.
    pub raise: Option<Cents>,
    /// Once Stripe agrees, the intent takes only this much (a cancel: 0; a
    /// capture of less than was metered).
    pub keep: Option<Cents>,
}

impl Step {
    pub fn plan(
        self,
        params: &Params,
        metered: Cents,
        currency: &Currency,
    ) -> Result<Plan, StripeError> {
        match self {
            Step::Confirm => {
                if params.get("amount").is_some() {
                    return Err(StripeError::invalid_amount(
                        "a confirmation cannot change the amount; update the payment intent first",
                    ));
                }
                Ok(Plan::default())
            }
            Step::Cancel => Ok(Plan {
                raise: None,
                keep: Some(Cents(0)),
            }),
            Step::Capture => {
                // Several captures of one intent (multicapture) would each
                // give back what the others take: one final capture only.
                if params.get("final_capture").is_some_and(|v| v != "true") {
                    return Err(StripeError::invalid_request(
                        "a vault key captures a payment intent once: final_capture must be true",
                    ));
                }
                let Some(raw) = params.get("amount_to_capture") else {
                    return Ok(Plan::default());
                };
                let capture = Params::whole_cents(raw, "amount_to_capture")?;
                if capture > metered {
                    return Err(StripeError::invalid_amount(&format!(
                        "amount_to_capture {} is more than the {} cents metered for this payment intent",
                        capture.0, metered.0
                    )));
                }
                Ok(Plan {
                    raise: None,
                    keep: (capture < metered).then_some(capture),
                })
            }
            Step::Update => {
                if let Some(given) = params.get("currency") {
                    if !given.eq_ignore_ascii_case(currency.as_str()) {
                        return Err(StripeError::invalid_request(format!(
                            "this vault key is for {currency}; a payment intent cannot move to {}",
                            given.to_uppercase()
                        )));
                    }
                }
                if params.get("amount").is_none() {
                    return Ok(Plan::default());
                }
                let amount = params.amount()?;
                Ok(Plan {
                    raise: (amount > metered).then(|| Cents(amount.0 - metered.0)),
                    keep: None,
                })
            }
        }
    }
}

/// The intent a declined creation left alive (`error.payment_intent.id`).
pub fn declined(body: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let id = value.pointer("/error/payment_intent/id")?.as_str()?;
    id.starts_with("pi_").then(|| id.to_owned())
}

/// Cancels an intent at Stripe: whether Stripe says it is cancelled.
#[tracing::instrument(skip_all)]
pub async fn cancel(upstream: &Upstream, intent: &str) -> Result<(), String> {
    let mut headers = HeaderMap::new();
    headers.insert(
        axum::http::header::CONTENT_TYPE,
        "application/x-www-form-urlencoded"
            .parse()
            .expect("a valid header"),
    );
    let path = format!("/v1/payment_intents/{intent}/cancel");
    match upstream
        .forward(&Method::POST, &path, &headers, Bytes::new())
        .await
    {
        Ok(answer) if answer.status.is_success() => Ok(()),
        Ok(answer) => Err(format!("Stripe answered {}", answer.status)),
        Err(err) => Err(format!("{err:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_on_an_intent_are_read_from_the_path() {
        let post = Method::POST;
        assert_eq!(
            step(&post, "/v1/payment_intents/pi_1/capture"),
            Some(("pi_1".into(), Step::Capture))
        );
        assert_eq!(
            step(&post, "/v1/payment_intents/pi_1"),
            Some(("pi_1".into(), Step::Update))
        );
        assert_eq!(step(&post, "/v1/payment_intents"), None);
        assert_eq!(step(&Method::GET, "/v1/payment_intents/pi_1"), None);
        assert_eq!(step(&post, "/v1/payment_intents/pi_1/other"), None);
    }

    #[test]
    fn a_declined_creation_names_its_intent() {
        let body = br#"{"error":{"type":"card_error","payment_intent":{"id":"pi_9","status":"requires_payment_method"}}}"#;
        assert_eq!(declined(body).as_deref(), Some("pi_9"));
        assert_eq!(declined(br#"{"error":{"type":"card_error"}}"#), None);
    }
}
