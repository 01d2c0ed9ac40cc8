//! Step 3, money held before anything leaves: the metered amount reserved
//! against the key's cap, committed before the call is forwarded. The
//! same statement applies the key's Idempotency-Key and duplicate rules.

use app::{
    audit::sql::AuditEntry,
    domain::{Cents, Decision},
    keys::spend::{ReserveCall, Reserved},
};

use super::{
    authenticate::revoked,
    call::{Refusal, Request},
    keys::ProxyKey,
    ledger::LedgerError,
    policy::Admitted,
    stripe_error::StripeError,
    ProxyState,
};

/// What the reservation leaves for the rest of the call.
#[derive(Debug, PartialEq, Eq)]
pub struct Held {
    /// The reservation Stripe's answer settles (none: nothing is metered,
    /// or a replay that Stripe answers from its own record).
    pub reservation: Option<i64>,
    /// The call repeats one whose outcome was unknown.
    pub retrying_unknown: bool,
    /// The earlier charge the duplicate guard flagged this one against.
    pub duplicate_of: Option<String>,
    /// `Allowed`, or `Replay` for a call Stripe has seen before.
    pub decision: Decision,
}

impl Held {
    /// A call that moves no money.
    fn nothing() -> Self {
        Self {
            reservation: None,
            retrying_unknown: false,
            duplicate_of: None,
            decision: Decision::Allowed,
        }
    }
}

/// Reserves what the policy metered, if anything.
#[tracing::instrument(level = "debug", skip_all)]
pub async fn reserve(
    state: &ProxyState,
    request: &Request,
    key: &ProxyKey,
    admitted: &Admitted,
    entry: &mut AuditEntry,
) -> Result<Held, Refusal> {
    let Some(amount) = admitted.metered else {
        return Ok(Held::nothing());
    };
    let lease_secs = i32::try_from(state.upstream.lease().as_secs()).unwrap_or(i32::MAX);
    let call = reserve_call(request, key, admitted, entry, lease_secs);
    let reserved = match state.ledger.reserve(call).await {
        Ok(reserved) => reserved,
        Err(LedgerError::Overloaded) => {
            crate::metrics::ledger_failed("overloaded");
            return Err(Refusal::Refused(
                Decision::RefusedUnavailable,
                StripeError::overloaded(),
            ));
        }
        Err(LedgerError::Failed(reason)) => return Err(Refusal::Unavailable(reason.to_string())),
    };
    if reserved == Reserved::KeyUnusable {
        // Revoked since it was cached (expiry never changes): refused with
        // the key as the database has it now, and no longer cached.
        let current = state
            .keys
            .current(&state.pool, &key.secret_hash)
            .await
            .ok()
            .flatten();
        return Err(revoked(current.as_deref().unwrap_or(key)));
    }
    held(reserved, key, amount, admitted, entry)
}

/// The reservation request: what the money is for, kept with it so a call
/// cut off midway can still be audited and asked about.
fn reserve_call(
    request: &Request,
    key: &ProxyKey,
    admitted: &Admitted,
    entry: &AuditEntry,
    lease_secs: i32,
) -> ReserveCall {
    let (method, path) = (&request.method, request.uri.path());
    let idempotency_key = admitted.headers.idempotency_key.clone();
    let raises_intent = admitted.intent.as_ref().map(|(intent, _)| intent.clone());
    ReserveCall {
        key: key.row.id,
        request: entry.request_id,
        amount: admitted.metered.unwrap_or_default(),
        fingerprint: hex::encode(admitted.params.fingerprint(
            method,
            path,
            admitted.headers.stripe_account.as_deref(),
        )),
        method: method.to_string(),
        path: path.to_owned(),
        stripe_customer: entry.stripe_customer.clone(),
        // The duplicate guard looks at new charges, not at an intent's update.
        metadata_customer_id: entry
            .metadata_customer_id
            .clone()
            .filter(|_| raises_intent.is_none()),
        billing_period: key.row.billing_period,
        currency: key.row.currency.clone(),
        payment_intent: raises_intent,
        request_body: idempotency_key
            .is_some()
            .then(|| String::from_utf8_lossy(&admitted.body).into_owned()),
        idempotency_key,
        lease_secs,
        stripe_version: request
            .headers
            .get("stripe-version")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
    }
}

/// What the ledger's answer means for the call: go on holding a
/// reservation (or as a replay), or a refusal in Stripe's shape.
fn held(
    reserved: Reserved,
    key: &ProxyKey,
    amount: Cents,
    admitted: &Admitted,
    entry: &mut AuditEntry,
) -> Result<Held, Refusal> {
    let idempotency_key = || admitted.headers.idempotency_key.clone().unwrap_or_default();
    match reserved {
        Reserved::New {
            reservation_id,
            duplicate_of,
        } => {
            if let Some(earlier) = &duplicate_of {
                entry.message = Some(format!(
                    "flagged as a duplicate of {earlier}: a second charge for this customer and period \
                     under another Idempotency-Key (forwarded; a duplicate finding opens when Stripe confirms it)"
                ));
            }
            Ok(Held {
                reservation: Some(reservation_id),
                duplicate_of,
                ..Held::nothing()
            })
        }
        Reserved::Replay => Ok(Held {
            decision: Decision::Replay,
            ..Held::nothing()
        }),
        Reserved::RetryUnknown { reservation_id } => {
            entry.message = Some(
                "a retry of a call whose outcome was unknown: Stripe's answer settles that call's reservation"
                    .into(),
            );
            Ok(Held {
                reservation: Some(reservation_id),
                retrying_unknown: true,
                decision: Decision::Replay,
                ..Held::nothing()
            })
        }
        Reserved::Duplicate {
            earlier_charge,
            earlier_state,
        } => {
            let customer = entry.metadata_customer_id.clone().unwrap_or_default();
            Err(Refusal::Refused(
                Decision::RefusedDuplicate,
                StripeError::duplicate(
                    &key.row,
                    &customer,
                    earlier_charge.as_deref(),
                    &earlier_state,
                ),
            ))
        }
        Reserved::InFlight => Err(Refusal::invalid(StripeError::idempotency_in_flight(
            &idempotency_key(),
        ))),
        Reserved::IdempotencyMismatch => Err(Refusal::invalid(StripeError::idempotency_mismatch(
            &idempotency_key(),
        ))),
        Reserved::OverCap {
            cap,
            spent,
            reserved,
        } => Err(Refusal::Refused(
            Decision::RefusedCap,
            StripeError::cap_exceeded(&key.row, cap, spent, reserved, amount),
        )),
        Reserved::KeyUnusable => Err(revoked(key)),
    }
}

#[cfg(test)]
mod tests {
    use axum::http::{HeaderMap, Method, StatusCode};
    use bytes::Bytes;

    use super::*;
    use crate::proxy::{
        call::Call,
        keys::test_key,
        request::{CallHeaders, Params},
    };
    use app::domain::VaultKeyId;

    fn charge() -> (Request, Admitted) {
        let request = Request {
            method: Method::POST,
            uri: "/v1/charges".parse().unwrap(),
            headers: HeaderMap::new(),
            body: Ok(Bytes::from_static(b"amount=500&currency=usd")),
        };
        let admitted = Admitted {
            headers: CallHeaders {
                idempotency_key: Some("order-1".into()),
                stripe_account: None,
            },
            params: Params::default(),
            body: Bytes::from_static(b"amount=500&currency=usd"),
            creates: true,
            intent: None,
            metered: Some(Cents(500)),
            keep: None,
        };
        (request, admitted)
    }

    fn read(reserved: Reserved) -> (Result<Held, Refusal>, AuditEntry) {
        let (request, admitted) = charge();
        let mut entry = Call::new(&request).entry;
        let key = test_key(|_| {});
        (
            held(reserved, &key, Cents(500), &admitted, &mut entry),
            entry,
        )
    }

    fn refusal(outcome: Result<Held, Refusal>) -> (Decision, StatusCode, &'static str) {
        match outcome {
            Err(Refusal::Refused(decision, error)) => (decision, error.status, error.code),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn a_reservation_holds_its_id_and_a_flagged_duplicate_says_so() {
        let (held, entry) = read(Reserved::New {
            reservation_id: 41,
            duplicate_of: Some("ch_earlier".into()),
        });
        let held = held.unwrap();
        assert_eq!(held.reservation, Some(41));
        assert_eq!(held.duplicate_of.as_deref(), Some("ch_earlier"));
        assert_eq!(held.decision, Decision::Allowed);
        assert!(entry.message.unwrap().contains("ch_earlier"));
    }

    #[test]
    fn replays_go_on_and_only_a_retry_of_an_unknown_outcome_settles() {
        let replay = read(Reserved::Replay).0.unwrap();
        assert_eq!(
            (replay.reservation, replay.decision),
            (None, Decision::Replay)
        );
        let retry = read(Reserved::RetryUnknown { reservation_id: 9 })
            .0
            .unwrap();
        assert_eq!(retry.reservation, Some(9));
        assert!(retry.retrying_unknown);
    }

    #[test]
    fn what_the_ledger_refuses_is_answered_in_stripes_shape() {
        let over = Reserved::OverCap {
            cap: Cents(11_000),
            spent: Cents(10_800),
            reserved: Cents(0),
        };
        assert_eq!(
            refusal(read(over).0),
            (
                Decision::RefusedCap,
                StatusCode::PAYMENT_REQUIRED,
                "spend_cap_exceeded"
            )
        );
        // The twin of a call in flight: Stripe's 409 while the first runs.
        assert_eq!(
            refusal(read(Reserved::InFlight).0),
            (
                Decision::RefusedInvalidRequest,
                StatusCode::CONFLICT,
                "idempotency_key_in_use"
            )
        );
        let duplicate = Reserved::Duplicate {
            earlier_charge: Some("ch_1".into()),
            earlier_state: "settled".into(),
        };
        assert_eq!(
            refusal(read(duplicate).0),
            (
                Decision::RefusedDuplicate,
                StatusCode::CONFLICT,
                "duplicate_charge"
            )
        );
        assert_eq!(
            refusal(read(Reserved::KeyUnusable).0).0,
            Decision::RefusedRevoked
        );
    }

    #[test]
    fn the_reservation_keeps_what_a_retry_needs() {
        let (request, admitted) = charge();
        let entry = Call::new(&request).entry;
        let call = reserve_call(&request, &test_key(|_| {}), &admitted, &entry, 70);
        assert_eq!(
            (call.key, call.amount, call.lease_secs),
            (VaultKeyId(7), Cents(500), 70)
        );
        assert_eq!(call.request, entry.request_id);
        assert_eq!(call.idempotency_key.as_deref(), Some("order-1"));
        assert_eq!(
            call.request_body.as_deref(),
            Some("amount=500&currency=usd")
        );
        assert_eq!(call.fingerprint.len(), 64);
    }
}
