//! A webhook delivery from Stripe, checked and read: the `Stripe-Signature`
//! verified with async-stripe against each configured secret (two while
//! one is rotated), within Stripe's 5-minute tolerance, and the event read
//! into what Vaultcap keeps of it.

use std::sync::Arc;

use chrono::{DateTime, TimeZone, Utc};
use stripe_webhook::{Event, EventObject, Webhook, WebhookError};

use crate::reconcile::sync::{synced, synced_intent};
use app::reconciliation::stripe_charges::{SyncedCharge, SyncedIntent};

/// The secrets Stripe signs deliveries with (`whsec_…`): one, or during a
/// rotation the old and the new. Never printed.
#[derive(Clone, Default)]
pub struct WebhookSecrets(Arc<[String]>);

impl WebhookSecrets {
    pub fn new(secrets: Vec<String>) -> Self {
        Self(
            secrets
                .into_iter()
                .filter(|s| !s.trim().is_empty())
                .collect(),
        )
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for WebhookSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WebhookSecrets({} configured)", self.0.len())
    }
}

/// An event that Stripe signed, as Vaultcap keeps it.
#[derive(Debug, Clone)]
pub struct Received {
    pub id: String,
    pub type_: String,
    pub created: DateTime<Utc>,
    pub livemode: bool,
    pub about: About,
    /// The body as Stripe sent it.
    pub payload: serde_json::Value,
}

/// What an event tells Vaultcap.
#[derive(Debug, Clone)]
pub enum About {
    /// A charge as it now is, with the Idempotency-Key of the request that
    /// caused the event when Stripe names one.
    Charge(SyncedCharge),
    PaymentIntent(SyncedIntent),
    /// A type Vaultcap does not use (it is stored, and answered 2xx).
    Unused {
        object_id: Option<String>,
    },
}

impl About {
    pub fn object_id(&self) -> Option<&str> {
        match self {
            Self::Charge(charge) => Some(&charge.id),
            Self::PaymentIntent(intent) => Some(&intent.id),
            Self::Unused { object_id } => object_id.as_deref(),
        }
    }
}

/// Why a delivery is refused (400): nothing of it is kept but the refusal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("no Stripe-Signature header")]
    NoSignature,
    #[error("the Stripe-Signature header is not t=…,v1=…")]
    BadHeader,
    #[error("no signature in Stripe-Signature matches a configured webhook secret")]
    BadSignature,
    #[error("the signature's timestamp {0} is more than 5 minutes from now")]
    Stale(i64),
    #[error("the body is not a Stripe event: {0}")]
    Malformed(String),
    #[error("{object} is not a {type_} event's object")]
    UnknownObject { type_: String, object: String },
}

/// The event types whose objects Vaultcap reads.
fn used(type_: &str) -> bool {
    type_.starts_with("charge.")
        && !type_.starts_with("charge.dispute.")
        && type_ != "charge.refund.updated"
        || type_.starts_with("payment_intent.")
}

/// Checks `signature` over `body` with each secret and reads the event.
pub fn verify(
    secrets: &WebhookSecrets,
    body: &str,
    signature: Option<&str>,
) -> Result<Received, Refused> {
    verify_at(secrets, body, signature, Utc::now())
}

/// As [`verify`], with the tolerance counted from `now`.
pub fn verify_at(
    secrets: &WebhookSecrets,
    body: &str,
    signature: Option<&str>,
    now: DateTime<Utc>,
) -> Result<Received, Refused> {
    let signature = signature.ok_or(Refused::NoSignature)?;
    let mut last = Refused::BadSignature;
    for secret in secrets.0.iter() {
        match Webhook::construct_event_with_timestamp(body, signature, secret, now.timestamp()) {
            Ok(event) => return read(event, body),
            // Signed with another secret, perhaps: try the next.
            Err(WebhookError::BadSignature | WebhookError::BadKey) => continue,
            Err(WebhookError::BadHeader(_)) => return Err(Refused::BadHeader),
            Err(WebhookError::BadTimestamp(at)) => last = Refused::Stale(at),
            // The signature held; the object is not what its type says.
            Err(WebhookError::BadParse(_)) => return read_untyped(body),
        }
    }
    Err(last)
}

/// The typed event, reduced to what Vaultcap keeps.
fn read(event: Event, body: &str) -> Result<Received, Refused> {
    let payload = payload(body)?;
    let idempotency_key = event
        .request
        .as_ref()
        .and_then(|r| r.idempotency_key.clone());
    let about = match event.data.object {
        EventObject::ChargeCaptured(charge)
        | EventObject::ChargeExpired(charge)
        | EventObject::ChargeFailed(charge)
        | EventObject::ChargePending(charge)
        | EventObject::ChargeRefunded(charge)
        | EventObject::ChargeSucceeded(charge)
        | EventObject::ChargeUpdated(charge) => About::Charge(SyncedCharge {
            idempotency_key,
            ..synced(&charge)
        }),
        EventObject::PaymentIntentAmountCapturableUpdated(intent)
        | EventObject::PaymentIntentCanceled(intent)
        | EventObject::PaymentIntentCreated(intent)
        | EventObject::PaymentIntentPartiallyFunded(intent)
        | EventObject::PaymentIntentPaymentFailed(intent)
        | EventObject::PaymentIntentProcessing(intent)
        | EventObject::PaymentIntentRequiresAction(intent)
        | EventObject::PaymentIntentSucceeded(intent) => {
            About::PaymentIntent(synced_intent(&intent))
        }
        _ => About::Unused {
            object_id: object_id(&payload),
        },
    };
    if let About::Charge(charge) = &about {
        if !(charge.id.starts_with("ch_") || charge.id.starts_with("py_")) {
            return Err(Refused::UnknownObject {
                type_: event.type_.to_string(),
                object: charge.id.clone(),
            });
        }
    }
    Ok(Received {
        id: event.id.to_string(),
        type_: event.type_.to_string(),
        created: timestamp(event.created),
        livemode: event.livemode,
        about,
        payload,
    })
}

/// A signed event async-stripe could not read: kept if Vaultcap does not
/// use its type, refused if it does (its object is not what the type says).
fn read_untyped(body: &str) -> Result<Received, Refused> {
    #[derive(serde::Deserialize)]
    struct Envelope {
        id: String,
        #[serde(rename = "type")]
        type_: String,
        created: i64,
        #[serde(default)]
        livemode: bool,
    }
    let payload = payload(body)?;
    let envelope: Envelope = serde_json::from_value(payload.clone())
        .map_err(|err| Refused::Malformed(err.to_string()))?;
    if !envelope.id.starts_with("evt_") {
        return Err(Refused::Malformed(format!(
            "{:?} is not an event id",
            envelope.id
        )));
    }
    let object_id = object_id(&payload);
    if used(&envelope.type_) {
        return Err(Refused::UnknownObject {
            type_: envelope.type_,
            object: object_id.unwrap_or_else(|| "an object without an id".into()),
        });
    }
    Ok(Received {
        id: envelope.id,
        type_: envelope.type_,
        created: timestamp(envelope.created),
        livemode: envelope.livemode,
        about: About::Unused { object_id },
        payload,
    })
}

fn payload(body: &str) -> Result<serde_json::Value, Refused> {
    serde_json::from_str(body).map_err(|err| Refused::Malformed(err.to_string()))
}

fn object_id(payload: &serde_json::Value) -> Option<String> {
    payload
        .pointer("/data/object/id")
        .and_then(|id| id.as_str())
        .map(str::to_owned)
}

fn timestamp(secs: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(secs, 0)
        .single()
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_test";

    fn charge_event(id: &str, type_: &str, created: i64) -> String {
        serde_json::json!({
            "id": id, "object": "event", "type": type_, "created": created, "livemode": false,
            "pending_webhooks": 1, "api_version": "2017-08-15",
            "request": {"id": "req_1", "idempotency_key": "order-7"},
            "data": {"object": {
                "id": "ch_1", "object": "charge", "amount": 1500, "amount_captured": 1500,
                "amount_refunded": 0, "captured": true, "created": created, "currency": "usd",
                "customer": null, "disputed": false, "livemode": false, "metadata": {"customer_id": "c-7", "billing_period": "2026-12"},
                "paid": true, "payment_intent": null, "refunded": false, "status": "succeeded",
                "billing_details": {"address": null, "email": null, "name": null, "phone": null}
            }}
        })
        .to_string()
    }

    fn signed(body: &str, secret: &str, at: i64) -> String {
        Webhook::generate_test_header(body, secret, Some(at))
    }

    fn secrets(list: &[&str]) -> WebhookSecrets {
        WebhookSecrets::new(list.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn a_charge_event_signed_with_any_configured_secret_is_read() {
        let now = Utc::now();
        let body = charge_event("evt_1", "charge.succeeded", now.timestamp());
        let rotated = secrets(&["whsec_old", SECRET]);
        let event = verify_at(
            &rotated,
            &body,
            Some(&signed(&body, SECRET, now.timestamp())),
            now,
        )
        .unwrap();
        assert_eq!(
            (event.id.as_str(), event.type_.as_str()),
            ("evt_1", "charge.succeeded")
        );
        let About::Charge(charge) = event.about else {
            panic!("a charge event is about a charge");
        };
        assert_eq!((charge.id.as_str(), charge.amount_cents.0), ("ch_1", 1500));
        assert_eq!(charge.customer_id.as_deref(), Some("c-7"));
        assert_eq!(charge.idempotency_key.as_deref(), Some("order-7"));
    }

    #[test]
    fn forged_stale_and_unsigned_deliveries_are_refused_each_with_its_reason() {
        let now = Utc::now();
        let at = now.timestamp();
        let body = charge_event("evt_1", "charge.succeeded", at);
        let ours = secrets(&[SECRET]);
        assert_eq!(
            verify_at(&ours, &body, None, now).unwrap_err(),
            Refused::NoSignature
        );
        let forged = signed(&body, "whsec_someone_else", at);
        assert_eq!(
            verify_at(&ours, &body, Some(&forged), now).unwrap_err(),
            Refused::BadSignature
        );
        let tampered = body.replace("1500", "15");
        let signature = signed(&body, SECRET, at);
        assert_eq!(
            verify_at(&ours, &tampered, Some(&signature), now).unwrap_err(),
            Refused::BadSignature
        );
        let old = signed(&body, SECRET, at - 301);
        assert_eq!(
            verify_at(&ours, &body, Some(&old), now).unwrap_err(),
            Refused::Stale(at - 301)
        );
        assert_eq!(
            verify_at(&ours, &body, Some("v1=abc"), now).unwrap_err(),
            Refused::BadSignature
        );
        assert_eq!(
            verify_at(&ours, &body, Some("t=soon,v1=abc"), now).unwrap_err(),
            Refused::BadHeader
        );
        assert_eq!(
            verify_at(&WebhookSecrets::default(), &body, Some(&signature), now).unwrap_err(),
            Refused::BadSignature,
            "without a secret nothing verifies"
        );
    }

    #[test]
    fn a_signed_event_of_an_unused_type_is_kept_and_one_whose_object_is_wrong_is_refused() {
        let now = Utc::now();
        let at = now.timestamp();
        let ours = secrets(&[SECRET]);
        let customer = serde_json::json!({
            "id": "evt_2", "object": "event", "type": "customer.created", "created": at, "livemode": false,
            "pending_webhooks": 1, "data": {"object": {"id": "cus_1", "object": "customer"}}
        })
        .to_string();
        let event = verify_at(&ours, &customer, Some(&signed(&customer, SECRET, at)), now).unwrap();
        assert!(
            matches!(event.about, About::Unused { ref object_id } if object_id.as_deref() == Some("cus_1"))
        );

        let wrong = customer.replace("customer.created", "charge.succeeded");
        let refused = verify_at(&ours, &wrong, Some(&signed(&wrong, SECRET, at)), now).unwrap_err();
        assert!(
            matches!(refused, Refused::UnknownObject { .. }),
            "{refused:?}"
        );

        let junk = "{\"id\": 1}";
        let refused = verify_at(&ours, junk, Some(&signed(junk, SECRET, at)), now).unwrap_err();
        assert!(matches!(refused, Refused::Malformed(_)), "{refused:?}");
    }
}
