//! Step 2, what the key may do and what the call says: the endpoint, the
//! account, the headers Stripe acts on and the parameters, read as Stripe
//! reads them; then what the call moves. Nothing here writes: a call is
//! either refused or admitted with the amount to reserve.

use axum::body::Bytes;

use app::{
    audit::sql::AuditEntry,
    domain::{moves_money, Cents, Decision},
};

use super::{
    call::{Refusal, Request},
    intents::{self, Step},
    keys::ProxyKey,
    request::{CallHeaders, Params},
    stripe_error::StripeError,
};

/// A call the policy lets through, as read.
#[derive(Debug)]
pub struct Admitted {
    pub headers: CallHeaders,
    pub params: Params,
    pub body: Bytes,
    /// It creates a charge or payment intent (metered whole).
    pub creates: bool,
    /// It is a step on this payment intent, which the key created.
    pub intent: Option<(String, Step)>,
    /// Reserve this much before forwarding (none: it moves no money).
    pub metered: Option<Cents>,
    /// Once Stripe agrees, the intent takes only this much (a cancel, a
    /// partial capture): the rest goes back to the key.
    pub keep: Option<Cents>,
}

/// Decides whether `key` may make this call and what it moves.
/// `intent_metered` tells what the key has metered for a payment intent
/// (none: the key did not create it); it is asked only for steps on one.
/// Names the call's customer, period, currency and amount in the audit
/// row as they are read.
#[tracing::instrument(level = "debug", skip_all)]
pub async fn policy(
    key: &ProxyKey,
    request: &Request,
    upstream_configured: bool,
    intent_metered: impl AsyncFnOnce(&str) -> Result<Option<Cents>, sqlx::Error>,
    entry: &mut AuditEntry,
) -> Result<Admitted, Refusal> {
    let (method, path) = (&request.method, request.uri.path());
    // The headers Stripe acts on, each sent once.
    let headers = CallHeaders::read(&request.headers).map_err(Refusal::invalid)?;
    if !key.allows(method.as_str(), path) {
        return Err(Refusal::Refused(
            Decision::RefusedEndpoint,
            StripeError::endpoint_not_allowed(method, path, &key.row),
        ));
    }
    if headers.stripe_account != key.row.stripe_account {
        // Money on another account than the key's is money its cap was
        // never set for.
        return Err(Refusal::invalid(StripeError::wrong_account(
            headers.stripe_account.as_deref(),
            &key.row,
        )));
    }

    let body = match &request.body {
        Ok(body) => body.clone(),
        Err(rejection) => {
            return Err(Refusal::invalid(StripeError::unreadable_body(
                rejection.status(),
                &rejection.body_text(),
            )))
        }
    };
    let params =
        Params::read(method, &request.uri, &request.headers, &body).map_err(Refusal::invalid)?;
    let param = |name| params.get(name).map(str::to_owned);
    entry.stripe_customer = param("customer");
    entry.metadata_customer_id = param("metadata[customer_id]");
    entry.metadata_billing_period = param("metadata[billing_period]");
    entry.currency = param("currency").map(|c| c.to_ascii_lowercase());

    if !upstream_configured {
        return Err(Refusal::Refused(
            Decision::RefusedUnavailable,
            StripeError::not_configured(),
        ));
    }

    let mut admitted = Admitted {
        headers,
        params,
        body,
        creates: moves_money(method.as_str(), path),
        intent: intents::step(method, path),
        metered: None,
        keep: None,
    };
    if admitted.creates {
        // Creations are metered whole, in the key's currency.
        if entry.currency.as_deref() != Some(key.row.currency.as_str()) {
            return Err(Refusal::Refused(
                Decision::RefusedCurrency,
                StripeError::currency(entry.currency.as_deref(), &key.row),
            ));
        }
        let amount = admitted.params.amount().map_err(refused_amount)?;
        admitted.metered = Some(amount);
    } else if let Some((intent, step)) = &admitted.intent {
        // Steps on an intent only for intents this key created; an update
        // is metered for what it adds.
        let so_far = intent_metered(intent).await?;
        entry.stripe_object_id = Some(intent.clone());
        let Some(so_far) = so_far else {
            return Err(Refusal::Refused(
                Decision::RefusedEndpoint,
                StripeError::intent_not_bound(intent, &key.row),
            ));
        };
        let plan = step
            .plan(&admitted.params, so_far, &key.row.currency)
            .map_err(refused_amount)?;
        admitted.metered = plan.raise;
        admitted.keep = plan.keep;
    }
    entry.amount_cents = admitted.metered;
    Ok(admitted)
}

fn refused_amount(error: StripeError) -> Refusal {
    Refusal::Refused(Decision::RefusedAmount, error)
}

#[cfg(test)]
mod tests {
    use axum::http::{header, HeaderMap, HeaderValue, Method, Uri};

    use super::*;
    use crate::proxy::{call::Call, keys::test_key};

    fn request(method: Method, path: &str, body: &str, extra: &[(&str, &str)]) -> Request {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-www-form-urlencoded"),
        );
        for (name, value) in extra {
            headers.append(
                header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        Request {
            method,
            uri: path.parse::<Uri>().unwrap(),
            headers,
            body: Ok(Bytes::from(body.to_owned())),
        }
    }

    fn charge(body: &str) -> Request {
        request(Method::POST, "/v1/charges", body, &[])
    }

    /// Runs the policy for `key` with intents metered as `bound` says.
    async fn decide(
        key: &ProxyKey,
        request: &Request,
        bound: Option<Cents>,
    ) -> (Result<Admitted, Refusal>, AuditEntry) {
        let mut entry = Call::new(request).entry;
        let admitted = policy(key, request, true, async |_| Ok(bound), &mut entry).await;
        (admitted, entry)
    }

    fn refused(outcome: Result<Admitted, Refusal>) -> (Decision, &'static str) {
        match outcome {
            Err(Refusal::Refused(decision, error)) => (decision, error.code),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_charge_is_metered_whole_in_the_keys_currency() {
        let key = test_key(|_| {});
        let call = charge("amount=2500&currency=USD&customer=cus_1&metadata[customer_id]=c1");
        let (admitted, entry) = decide(&key, &call, None).await;
        let admitted = admitted.unwrap();
        assert_eq!(admitted.metered, Some(Cents(2500)));
        assert!(admitted.creates);
        assert_eq!(entry.amount_cents, Some(Cents(2500)));
        assert_eq!(entry.currency.as_deref(), Some("usd"));
        assert_eq!(entry.metadata_customer_id.as_deref(), Some("c1"));

        let (eur, _) = decide(&key, &charge("amount=2500&currency=eur"), None).await;
        assert_eq!(
            refused(eur),
            (Decision::RefusedCurrency, "currency_mismatch")
        );
        let (junk, _) = decide(&key, &charge("amount=25.00&currency=usd"), None).await;
        assert_eq!(refused(junk), (Decision::RefusedAmount, "invalid_amount"));
    }

    #[tokio::test]
    async fn a_call_outside_the_keys_endpoints_or_account_is_refused() {
        let key = test_key(|row| row.allowed_endpoints = vec!["POST /v1/charges".into()]);
        let refund = request(Method::POST, "/v1/refunds", "charge=ch_1", &[]);
        assert_eq!(
            refused(decide(&key, &refund, None).await.0),
            (Decision::RefusedEndpoint, "endpoint_not_allowed")
        );
        let elsewhere = request(
            Method::POST,
            "/v1/charges",
            "amount=1&currency=usd",
            &[("stripe-account", "acct_other")],
        );
        assert_eq!(
            refused(decide(&key, &elsewhere, None).await.0).0,
            Decision::RefusedInvalidRequest
        );
        let twice = request(
            Method::POST,
            "/v1/charges",
            "amount=1&currency=usd",
            &[("idempotency-key", "a"), ("idempotency-key", "b")],
        );
        assert_eq!(
            refused(decide(&key, &twice, None).await.0).0,
            Decision::RefusedInvalidRequest
        );
    }

    #[tokio::test]
    async fn steps_on_an_intent_are_metered_only_for_the_keys_own_intents() {
        let key = test_key(|_| {});
        let raise = request(Method::POST, "/v1/payment_intents/pi_1", "amount=900", &[]);
        let (unbound, entry) = decide(&key, &raise, None).await;
        assert_eq!(
            refused(unbound),
            (Decision::RefusedEndpoint, "payment_intent_not_bound")
        );
        assert_eq!(entry.stripe_object_id.as_deref(), Some("pi_1"));

        // Metered 600 so far: raising it to 900 reserves 300 more.
        let admitted = decide(&key, &raise, Some(Cents(600))).await.0.unwrap();
        assert_eq!(admitted.metered, Some(Cents(300)));
        let cancel = request(Method::POST, "/v1/payment_intents/pi_1/cancel", "", &[]);
        let admitted = decide(&key, &cancel, Some(Cents(600))).await.0.unwrap();
        assert_eq!((admitted.metered, admitted.keep), (None, Some(Cents(0))));
    }

    #[tokio::test]
    async fn a_read_moves_nothing_and_asks_about_no_intent() {
        let key = test_key(|_| {});
        let read = request(Method::GET, "/v1/charges/ch_1", "", &[]);
        let mut entry = Call::new(&read).entry;
        let asked = async |_: &str| -> Result<Option<Cents>, sqlx::Error> {
            panic!("a read asked about an intent")
        };
        let admitted = policy(&key, &read, true, asked, &mut entry).await.unwrap();
        assert_eq!((admitted.metered, admitted.creates), (None, false));
        assert_eq!(entry.amount_cents, None);
    }

    #[tokio::test]
    async fn without_a_stripe_key_nothing_is_admitted() {
        let key = test_key(|_| {});
        let call = charge("amount=100&currency=usd");
        let mut entry = Call::new(&call).entry;
        let outcome = policy(&key, &call, false, async |_| Ok(None), &mut entry).await;
        assert_eq!(
            refused(outcome),
            (Decision::RefusedUnavailable, "proxy_not_configured")
        );
    }
}
