//! Calls of unknown outcome are decided by asking Stripe: the job that
//! `vaultcap serve` runs each minute sends a lost call again with its
//! Idempotency-Key, and asks about a declined payment intent it could not
//! cancel. Nothing is released on a guess.

use std::time::Duration;

use axum::http::StatusCode;
use serde_json::json;
use sqlx::PgPool;

use crate::{
    fake_stripe::FakeStripe,
    helpers::{TestApp, REAL_STRIPE_KEY},
    proxy::{money, proxy_with_key},
};
use server::{
    jobs::unknown_outcomes::{resolve, Resolved},
    proxy::upstream::{StripeSecret, Upstream},
};

fn upstream(stripe: &FakeStripe) -> Upstream {
    let secret = StripeSecret::new(REAL_STRIPE_KEY.into());
    Upstream::new(&stripe.base, Some(secret), Duration::from_secs(2)).unwrap()
}

/// Five minutes and a bit pass since the calls became unknown.
async fn later(pool: &PgPool) {
    sqlx::query("UPDATE reservations SET settled_at = settled_at - interval '6 minutes'")
        .execute(pool)
        .await
        .unwrap();
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_call_whose_answer_was_lost_is_settled_by_sending_it_again(pool: PgPool) {
    let (app, stripe, key, key_id) = proxy_with_key(pool.clone(), 5000).await;
    let body = "amount=800&currency=usd&customer=cus_lost";
    let lost = app
        .stripe("/v1/charges", &key, body, &[("idempotency-key", "K")])
        .await;
    assert_eq!(lost.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(
        resolve(&app.pool, &upstream(&stripe)).await.unwrap(),
        Resolved::default(),
        "the billing job's own retry comes first"
    );
    later(&pool).await;
    let resolved = resolve(&app.pool, &upstream(&stripe)).await.unwrap();
    assert_eq!(resolved.settled, 1, "{resolved:?}");
    assert_eq!(money(&pool, key_id).await, (800, 0));
    assert_eq!(stripe.charged(), (800, 1), "Stripe replayed, charged once");
    let (decision, object): (String, Option<String>) =
        sqlx::query_as("SELECT decision, stripe_object_id FROM audit_log ORDER BY id DESC LIMIT 1")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(decision, "replay");
    assert!(object.unwrap().starts_with("ch_lost"));
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_call_without_an_idempotency_key_stays_reserved_for_a_person(pool: PgPool) {
    let (app, stripe, key, key_id) = proxy_with_key(pool.clone(), 5000).await;
    let lost = app
        .charge(&key, "amount=800&currency=usd&customer=cus_lost")
        .await;
    assert_eq!(lost.status, StatusCode::GATEWAY_TIMEOUT);
    later(&pool).await;
    assert_eq!(
        resolve(&app.pool, &upstream(&stripe)).await.unwrap(),
        Resolved::default()
    );
    assert_eq!(money(&pool, key_id).await, (0, 800));
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_declined_intent_left_alive_is_cancelled_later_and_then_released(pool: PgPool) {
    let stripe = FakeStripe::start().await;
    let app = TestApp::with_upstream(pool.clone(), &stripe.base, Duration::from_secs(5));
    let token = app.api_token().await;
    let created = app
        .post_json("/vault/keys", &token, json!({
                "label": "intents", "expected_total_cents": 5000, "cap_cents": 5000,
                "allowed_endpoints": ["POST /v1/payment_intents"], "expires_at": crate::helpers::in_a_month(),
            }))
        .await
        .json();
    let key = created["vault_key"].as_str().unwrap();
    let key_id = created["id"].as_i64().unwrap();
    stripe.fail_cancels(true);
    let declined = app
        .stripe(
            "/v1/payment_intents",
            key,
            "amount=900&currency=usd&confirm=true&payment_method=pm_card_chargeCustomerFail",
            &[],
        )
        .await;
    assert_eq!(declined.status, StatusCode::PAYMENT_REQUIRED);
    let intent = declined.json()["error"]["payment_intent"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(money(&pool, key_id).await, (0, 900));
    // Asked while Stripe still fails: it stays bound to its key, reserved.
    later(&pool).await;
    let resolved = resolve(&app.pool, &upstream(&stripe)).await.unwrap();
    assert_eq!(resolved.still_unknown, 1, "{resolved:?}");
    let bound: Option<String> = sqlx::query_scalar("SELECT stripe_charge_id FROM reservations")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(bound.as_deref(), Some(intent.as_str()));
    stripe.fail_cancels(false);
    later(&pool).await;
    let resolved = resolve(&app.pool, &upstream(&stripe)).await.unwrap();
    assert_eq!(resolved.released, 1, "{resolved:?}");
    assert_eq!(stripe.intent_status(&intent), Some("canceled"));
    assert_eq!(money(&pool, key_id).await, (0, 0));
}
