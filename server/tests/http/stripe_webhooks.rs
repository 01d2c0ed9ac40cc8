//! Stripe's webhook events at `POST /stripe/webhooks`: verified, stored
//! once, applied in Stripe's order; a lost answer settled by its charge's
//! event; duplicates and charges made around the proxy found without a
//! sync; everything else refused with its reason and recorded.

use std::time::Duration;

use axum::{
    body::Body,
    http::{Request, StatusCode},
};
use chrono::Utc;
use serde_json::{json, Value};
use sqlx::PgPool;
use stripe_webhook::Webhook;

use crate::{
    alerts::receiver,
    fake_stripe::FakeStripe,
    helpers::{TestApp, TestResponse, REAL_STRIPE_KEY},
    proxy::{money, CHARGE},
};
use server::{
    proxy::upstream::{StripeSecret, Upstream},
    stripe_events::{live, WebhookSecrets},
};

const SECRET: &str = "whsec_vaultcap_test";

/// The proxy in front of the fake Stripe, taking Stripe's events signed
/// with [`SECRET`] (or the old secret of a rotation), and a key of `cap`.
async fn receiving(pool: PgPool, cap: i64) -> (TestApp, FakeStripe, String, i64) {
    let stripe = FakeStripe::start().await;
    let upstream = Upstream::new(
        &stripe.base,
        Some(StripeSecret::new(REAL_STRIPE_KEY.into())),
        Duration::from_millis(500),
    )
    .unwrap()
    .with_webhook_secrets(WebhookSecrets::new(vec!["whsec_old".into(), SECRET.into()]));
    let app = TestApp::with(pool, upstream);
    let token = app.api_token().await;
    let body = json!({
        "label": "billing-run-2026-07", "expected_total_cents": cap, "cap_cents": cap,
        "allowed_endpoints": ["POST /v1/charges"], "expires_at": crate::helpers::in_a_month(),
    });
    let created = app.post_json("/vault/keys", &token, body).await.json();
    let key = created["vault_key"].as_str().unwrap().to_owned();
    (app, stripe, key, created["id"].as_i64().unwrap())
}

/// A charge event as Stripe sends it.
fn charge_event(event: &str, type_: &str, created: i64, charge: Value) -> String {
    let mut object = json!({
        "object": "charge", "amount_captured": 0, "amount_refunded": 0, "captured": true,
        "created": created, "currency": "usd", "customer": null, "disputed": false, "livemode": false,
        "metadata": {}, "paid": true, "payment_intent": null, "refunded": false, "status": "succeeded",
        "billing_details": {"address": null, "email": null, "name": null, "phone": null},
    });
    object
        .as_object_mut()
        .unwrap()
        .extend(charge.as_object().unwrap().clone());
    json!({
        "id": event, "object": "event", "type": type_, "created": created, "livemode": false,
        "pending_webhooks": 1, "api_version": "2017-08-15",
        "request": {"id": "req_1", "idempotency_key": object.get("idempotency_key").cloned()},
        "data": {"object": object},
    })
    .to_string()
}

/// `charge` of `amount` for the billing job's customer `customer` in 2026-07.
fn charge(id: &str, amount: i64, customer: &str) -> Value {
    json!({ "id": id, "amount": amount, "amount_captured": amount,
            "metadata": {"customer_id": customer, "billing_period": "2026-07"} })
}

async fn deliver(app: &TestApp, body: &str, signature: Option<String>) -> TestResponse {
    let mut request = Request::post("/stripe/webhooks").header("content-type", "application/json");
    if let Some(signature) = signature {
        request = request.header("stripe-signature", signature);
    }
    app.send(request.body(Body::from(body.to_owned())).unwrap())
        .await
}

async fn signed(app: &TestApp, body: &str) -> TestResponse {
    deliver(
        app,
        body,
        Some(Webhook::generate_test_header(body, SECRET, None)),
    )
    .await
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_call_whose_answer_was_lost_is_settled_when_its_charge_event_arrives(pool: PgPool) {
    let (app, _stripe, key, key_id) = receiving(pool.clone(), 5000).await;
    let body = "amount=800&currency=usd&customer=cus_lost&metadata%5Bcustomer_id%5D=cust_9&metadata%5Bbilling_period%5D=2026-07";
    let lost = app
        .stripe("/v1/charges", &key, body, &[("idempotency-key", "K-9")])
        .await;
    assert_eq!(lost.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(
        money(&pool, key_id).await,
        (0, 800),
        "reserved while unknown"
    );

    let now = Utc::now().timestamp();
    let mut made = charge("ch_lost1", 800, "cust_9");
    made["idempotency_key"] = json!("K-9");
    let event = charge_event("evt_lost", "charge.succeeded", now, made);
    let answer = signed(&app, &event).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert_eq!(answer.json()["outcome"], "applied");

    assert_eq!(
        money(&pool, key_id).await,
        (800, 0),
        "settled by the event, no sync"
    );
    let named: Option<String> = sqlx::query_scalar("SELECT stripe_charge_id FROM reservations")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(named.as_deref(), Some("ch_lost1"));
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM operator_actions WHERE action = 'reservation.settle'"
        )
        .await,
        1
    );
}

/// Stripe may announce the charge before the proxy gives up waiting for
/// its answer: the next live pass settles the call.
#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_charge_announced_before_its_call_was_given_up_settles_it_on_the_next_pass(pool: PgPool) {
    let (app, _stripe, key, key_id) = receiving(pool.clone(), 5000).await;
    let mut made = charge("ch_early", 800, "cust_9");
    made["idempotency_key"] = json!("K-early");
    let event = charge_event(
        "evt_early",
        "charge.succeeded",
        Utc::now().timestamp(),
        made,
    );
    assert_eq!(signed(&app, &event).await.json()["outcome"], "applied");
    let body = "amount=800&currency=usd&customer=cus_lost&metadata%5Bcustomer_id%5D=cust_9";
    let lost = app
        .stripe("/v1/charges", &key, body, &[("idempotency-key", "K-early")])
        .await;
    assert_eq!(lost.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(money(&pool, key_id).await, (0, 800));

    assert_eq!(live::pass(&pool, None).await.unwrap().settled, 1);
    assert_eq!(money(&pool, key_id).await, (800, 0));
    assert_eq!(live::pass(&pool, None).await.unwrap().settled, 0, "once");
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn an_event_delivered_again_or_late_changes_nothing_twice(pool: PgPool) {
    let (app, ..) = receiving(pool.clone(), 5000).await;
    let now = Utc::now().timestamp();
    let succeeded = charge_event(
        "evt_1",
        "charge.succeeded",
        now - 20,
        charge("ch_1", 1000, "cust_1"),
    );
    let mut part_refunded = charge("ch_1", 1000, "cust_1");
    part_refunded["amount_refunded"] = json!(400);
    let refunded = charge_event("evt_2", "charge.refunded", now - 10, part_refunded);

    assert_eq!(signed(&app, &refunded).await.json()["outcome"], "applied");
    let late = signed(&app, &succeeded).await;
    assert_eq!(late.status, StatusCode::OK);
    assert_eq!(late.json()["outcome"], "stale", "older than what is stored");
    let again = signed(&app, &refunded).await;
    assert_eq!(
        (again.status, again.json()["stored"].clone()),
        (StatusCode::OK, json!(false))
    );

    let stored: (i64, i64) = sqlx::query_as(
        "SELECT amount_cents, amount_refunded_cents FROM stripe_charges WHERE id = 'ch_1'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(stored, (1000, 400), "the refund stands");
    assert_eq!(count(&pool, "SELECT count(*) FROM stripe_events").await, 2);
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM operator_actions WHERE action = 'stripe_event.receive'"
        )
        .await,
        2
    );
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn bad_deliveries_are_refused_with_their_reason_and_recorded(pool: PgPool) {
    let (app, ..) = receiving(pool.clone(), 5000).await;
    let now = Utc::now().timestamp();
    let event = charge_event(
        "evt_1",
        "charge.succeeded",
        now,
        charge("ch_1", 1000, "cust_1"),
    );
    let cases = [
        (event.clone(), None, "no Stripe-Signature"),
        (
            event.clone(),
            Some(Webhook::generate_test_header(&event, "whsec_forged", None)),
            "matches a configured webhook secret",
        ),
        (
            event.clone(),
            Some(Webhook::generate_test_header(
                &event,
                SECRET,
                Some(now - 301),
            )),
            "more than 5 minutes",
        ),
        (
            event.replace("1000", "1"),
            Some(Webhook::generate_test_header(&event, SECRET, None)),
            "matches a configured webhook secret",
        ),
        (
            "{\"not\": \"an event\"}".into(),
            Some(Webhook::generate_test_header(
                "{\"not\": \"an event\"}",
                SECRET,
                None,
            )),
            "not a Stripe event",
        ),
    ];
    for (body, signature, reason) in cases {
        let refused = deliver(&app, &body, signature).await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{reason}");
        let message = refused.json()["error"]["message"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(
            message.contains(reason),
            "{message:?} should say {reason:?}"
        );
    }
    assert_eq!(count(&pool, "SELECT count(*) FROM stripe_events").await, 0);
    assert_eq!(count(&pool, "SELECT count(*) FROM stripe_charges").await, 0);
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM operator_actions WHERE action = 'stripe_event.refuse'"
        )
        .await,
        5
    );

    // Signed with the secret being rotated out: still Stripe's.
    let old = deliver(
        &app,
        &event,
        Some(Webhook::generate_test_header(&event, "whsec_old", None)),
    )
    .await;
    assert_eq!(old.status, StatusCode::OK, "{}", old.body);
    // A type Vaultcap does not use: 2xx, kept, nothing changed.
    let customer = json!({
        "id": "evt_cus", "object": "event", "type": "customer.created", "created": now, "livemode": false,
        "pending_webhooks": 1, "data": {"object": {"id": "cus_1", "object": "customer"}}
    })
    .to_string();
    let ignored = signed(&app, &customer).await;
    assert_eq!(
        (ignored.status, ignored.json()["outcome"].clone()),
        (StatusCode::OK, json!("ignored"))
    );
    assert_eq!(count(&pool, "SELECT count(*) FROM stripe_charges").await, 1);
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn without_a_webhook_secret_stripe_is_told_to_come_back(pool: PgPool) {
    let app = TestApp::new(pool.clone());
    let event = charge_event(
        "evt_1",
        "charge.succeeded",
        Utc::now().timestamp(),
        charge("ch_1", 1, "c"),
    );
    let answer = signed(&app, &event).await;
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        answer.body.contains("STRIPE_WEBHOOK_SECRET"),
        "{}",
        answer.body
    );
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_charge_made_around_the_proxy_is_unmetered_and_announced_once(pool: PgPool) {
    let (app, _stripe, key, _key_id) = receiving(pool.clone(), 5000).await;
    let (url, received) = receiver(StatusCode::OK).await;
    let notifier = crate::helpers::notifier(&pool, &[&url]).await;
    let metered = app.charge(&key, CHARGE).await.json();
    let metered_id = metered["id"].as_str().unwrap().to_owned();

    let now = Utc::now().timestamp();
    let through_proxy = charge_event(
        "evt_a",
        "charge.succeeded",
        now,
        charge(&metered_id, 1000, "cust_1"),
    );
    let around = charge_event(
        "evt_b",
        "charge.succeeded",
        now,
        charge("ch_direct", 2500, "cust_2"),
    );
    for event in [&through_proxy, &around] {
        assert_eq!(signed(&app, event).await.status, StatusCode::OK);
    }
    for _ in 0..2 {
        live::pass(&pool, None).await.unwrap();
    }
    let found: Vec<(String, String, Vec<String>, i64)> = sqlx::query_as(
        "SELECT kind, customer_id, charge_ids, amount_at_risk_cents FROM reconciliation_findings ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        found,
        vec![(
            "unmetered".into(),
            "cust_2".into(),
            vec!["ch_direct".into()],
            2500
        )],
        "the proxy's own charge is not unmetered, and not yet an orphan"
    );
    let pass = notifier.pass().await.unwrap();
    assert_eq!(pass.delivered, 1);
    let sent = received.lock().unwrap().clone();
    assert_eq!(
        sent.len(),
        1,
        "one announcement however often it is detected"
    );
    assert_eq!(sent[0]["event"], "finding.unmetered");
    assert!(
        sent[0]["text"].as_str().unwrap().contains("ch_direct"),
        "{}",
        sent[0]
    );
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_second_charge_for_a_customer_shows_as_a_duplicate_without_a_sync(pool: PgPool) {
    let (app, _stripe, key, _key_id) = receiving(pool.clone(), 5000).await;
    let metered = app.charge(&key, CHARGE).await.json();
    let now = Utc::now().timestamp();
    let events = [
        charge_event(
            "evt_1",
            "charge.succeeded",
            now,
            charge(metered["id"].as_str().unwrap(), 1000, "cust_1"),
        ),
        charge_event(
            "evt_2",
            "charge.succeeded",
            now,
            charge("ch_twin", 1000, "cust_1"),
        ),
    ];
    for event in &events {
        assert_eq!(signed(&app, event).await.status, StatusCode::OK);
    }
    let before = Utc::now() - chrono::Duration::seconds(5);
    let first = live::pass(&pool, None).await.unwrap();
    assert_eq!(first.periods.len(), 1, "a process's first pass detects");
    // The next passes detect the period again only for events since they
    // last ran (with a margin for late commits), not while it is recent.
    assert_eq!(
        live::pass(&pool, Some(Utc::now() + chrono::Duration::seconds(20)))
            .await
            .unwrap()
            .periods,
        [],
        "nothing new since the last pass"
    );
    assert_eq!(
        live::pass(&pool, Some(before)).await.unwrap().periods,
        first.periods,
        "events since the last pass"
    );
    let kinds: Vec<(String, Vec<String>)> =
        sqlx::query_as("SELECT kind, charge_ids FROM reconciliation_findings ORDER BY kind")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(kinds.len(), 2, "{kinds:?}");
    assert_eq!(kinds[0].0, "duplicate");
    assert_eq!(kinds[0].1.len(), 2);
    assert_eq!(
        kinds[1],
        ("unmetered".into(), vec!["ch_twin".into()]),
        "made around the proxy"
    );
}
