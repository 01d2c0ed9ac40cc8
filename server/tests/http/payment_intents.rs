//! Payment intents metered through their life: a declined creation keeps
//! its reservation until Vaultcap has cancelled the intent, steps on an
//! intent are bound to the key that created it, an update reserves what it
//! adds, a capture takes no more than was metered, and a cancel or partial
//! capture gives the rest back.

use std::time::Duration;

use axum::http::StatusCode;
use serde_json::json;
use sqlx::PgPool;

use crate::{fake_stripe::FakeStripe, helpers::TestApp};

const INTENT_ENDPOINTS: [&str; 5] = [
    "POST /v1/payment_intents",
    "POST /v1/payment_intents/{id}",
    "POST /v1/payment_intents/{id}/confirm",
    "POST /v1/payment_intents/{id}/capture",
    "POST /v1/payment_intents/{id}/cancel",
];

struct Setup {
    app: TestApp,
    stripe: FakeStripe,
    token: String,
}

impl Setup {
    async fn new(pool: PgPool) -> Self {
        let stripe = FakeStripe::start().await;
        let app = TestApp::with_upstream(pool, &stripe.base, Duration::from_secs(5));
        let token = app.api_token().await;
        Self { app, stripe, token }
    }

    /// A vault key for payment intents: its secret and id.
    async fn key(&self, cap_cents: i64) -> (String, i64) {
        let body = json!({
            "label": "intents", "expected_total_cents": cap_cents, "cap_cents": cap_cents,
            "allowed_endpoints": INTENT_ENDPOINTS, "expires_at": crate::helpers::in_a_month(),
        });
        let created = self
            .app
            .post_json("/vault/keys", &self.token, body)
            .await
            .json();
        (
            created["vault_key"].as_str().unwrap().to_owned(),
            created["id"].as_i64().unwrap(),
        )
    }

    async fn call(&self, key: &str, path: &str, form: &str) -> (StatusCode, serde_json::Value) {
        let response = self.app.stripe(path, key, form, &[]).await;
        let body = serde_json::from_str(&response.body).unwrap_or_default();
        (response.status, body)
    }

    async fn money(&self, key_id: i64) -> (i64, i64) {
        crate::proxy::money(&self.app.pool, key_id).await
    }
}

const DECLINED: &str =
    "amount=900&currency=usd&confirm=true&payment_method=pm_card_chargeCustomerFail";

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_declined_intent_is_cancelled_so_confirming_it_later_charges_nothing(pool: PgPool) {
    let setup = Setup::new(pool).await;
    let (key, key_id) = setup.key(1000).await;
    for _ in 0..3 {
        let (status, body) = setup.call(&key, "/v1/payment_intents", DECLINED).await;
        assert_eq!(status, StatusCode::PAYMENT_REQUIRED, "{body}");
        let intent = body["error"]["payment_intent"]["id"]
            .as_str()
            .unwrap()
            .to_owned();
        assert_eq!(setup.stripe.intent_status(&intent), Some("canceled"));
        let path = format!("/v1/payment_intents/{intent}/confirm");
        let (confirmed, body) = setup.call(&key, &path, "payment_method=pm_card_visa").await;
        assert_eq!(
            confirmed,
            StatusCode::FORBIDDEN,
            "released: no longer the key's"
        );
        assert_eq!(body["error"]["code"], "payment_intent_not_bound");
    }
    assert_eq!(setup.stripe.charged(), (0, 0));
    assert_eq!(setup.money(key_id).await, (0, 0));
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_declined_intent_that_could_not_be_cancelled_stays_reserved(pool: PgPool) {
    let setup = Setup::new(pool).await;
    let (key, key_id) = setup.key(1000).await;
    setup.stripe.fail_cancels(true);
    let (status, body) = setup.call(&key, "/v1/payment_intents", DECLINED).await;
    assert_eq!(status, StatusCode::PAYMENT_REQUIRED);
    let intent = body["error"]["payment_intent"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(setup.money(key_id).await, (0, 900), "kept reserved");
    let path = format!("/v1/payment_intents/{intent}/confirm");
    let (confirmed, _) = setup.call(&key, &path, "payment_method=pm_card_visa").await;
    assert_eq!(
        confirmed,
        StatusCode::OK,
        "its own key may confirm it again"
    );
    let (second, body) = setup.call(&key, "/v1/payment_intents", DECLINED).await;
    assert_eq!(second, StatusCode::PAYMENT_REQUIRED);
    assert_eq!(body["error"]["code"], "spend_cap_exceeded", "{body}");
    assert_eq!(setup.stripe.charged(), (900, 1), "never over the cap");
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn steps_on_an_intent_another_key_created_are_refused_before_stripe(pool: PgPool) {
    let setup = Setup::new(pool).await;
    let (creator, _) = setup.key(5000).await;
    let (other, _) = setup.key(5000).await;
    let (status, body) = setup
        .call(&creator, "/v1/payment_intents", "amount=500&currency=usd")
        .await;
    assert_eq!(status, StatusCode::OK);
    let intent = body["id"].as_str().unwrap().to_owned();
    let seen = setup.stripe.seen().len();
    for step in ["confirm", "capture", "cancel"] {
        let path = format!("/v1/payment_intents/{intent}/{step}");
        let (status, body) = setup.call(&other, &path, "").await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{step}: {body}");
        assert_eq!(body["error"]["code"], "payment_intent_not_bound");
    }
    let (status, _) = setup
        .call(
            &other,
            &format!("/v1/payment_intents/{intent}"),
            "amount=100",
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = setup
        .call(&creator, "/v1/payment_intents/pi_made_up/confirm", "")
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(setup.stripe.seen().len(), seen, "none reached Stripe");
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn an_update_that_raises_the_amount_reserves_the_difference_under_the_cap(pool: PgPool) {
    let setup = Setup::new(pool).await;
    let (key, key_id) = setup.key(1000).await;
    let (_, body) = setup
        .call(&key, "/v1/payment_intents", "amount=500&currency=usd")
        .await;
    let intent = body["id"].as_str().unwrap().to_owned();
    assert_eq!(setup.money(key_id).await, (500, 0));
    let path = format!("/v1/payment_intents/{intent}");
    let (raised, _) = setup.call(&key, &path, "amount=800").await;
    assert_eq!(raised, StatusCode::OK);
    assert_eq!(setup.money(key_id).await, (800, 0));
    let (over, body) = setup.call(&key, &path, "amount=1200").await;
    assert_eq!(over, StatusCode::PAYMENT_REQUIRED, "{body}");
    assert_eq!(body["error"]["code"], "spend_cap_exceeded");
    let (confirmed, _) = setup
        .call(
            &key,
            &format!("{path}/confirm"),
            "payment_method=pm_card_visa",
        )
        .await;
    assert_eq!(confirmed, StatusCode::OK);
    assert_eq!(setup.stripe.charged(), (800, 1));
    assert_eq!(setup.money(key_id).await, (800, 0));
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_capture_takes_no_more_than_was_metered_and_a_partial_one_gives_the_rest_back(
    pool: PgPool,
) {
    let setup = Setup::new(pool).await;
    let (key, key_id) = setup.key(5000).await;
    let (_, body) = setup
        .call(
            &key,
            "/v1/payment_intents",
            "amount=900&currency=usd&capture_method=manual&confirm=true&payment_method=pm_card_visa",
        )
        .await;
    let intent = body["id"].as_str().unwrap().to_owned();
    let capture = format!("/v1/payment_intents/{intent}/capture");
    let (too_much, body) = setup.call(&key, &capture, "amount_to_capture=1000").await;
    assert_eq!(too_much, StatusCode::BAD_REQUEST, "{body}");
    let (partial, body) = setup
        .call(&key, &capture, "amount_to_capture=100&final_capture=false")
        .await;
    assert_eq!(
        partial,
        StatusCode::BAD_REQUEST,
        "one final capture: {body}"
    );
    let (captured, body) = setup.call(&key, &capture, "amount_to_capture=600").await;
    assert_eq!(captured, StatusCode::OK, "{body}");
    assert_eq!(setup.stripe.charged(), (600, 1));
    assert_eq!(setup.money(key_id).await, (600, 0), "300 given back");
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_cancelled_intent_gives_its_amount_back(pool: PgPool) {
    let setup = Setup::new(pool).await;
    let (key, key_id) = setup.key(1000).await;
    let (_, body) = setup
        .call(&key, "/v1/payment_intents", "amount=700&currency=usd")
        .await;
    let intent = body["id"].as_str().unwrap().to_owned();
    assert_eq!(setup.money(key_id).await, (700, 0));
    let (cancelled, _) = setup
        .call(&key, &format!("/v1/payment_intents/{intent}/cancel"), "")
        .await;
    assert_eq!(cancelled, StatusCode::OK);
    assert_eq!(setup.money(key_id).await, (0, 0));
    let (again, _) = setup
        .call(&key, "/v1/payment_intents", "amount=1000&currency=usd")
        .await;
    assert_eq!(again, StatusCode::OK, "the whole cap is free again");
}
