//! The proxy's duplicate guard: a second charge for a customer and period
//! under another Idempotency-Key (a redelivered message with a rotated key)
//! is flagged, blocked or let through, as the key's policy says.

use std::time::Duration;

use axum::http::StatusCode;
use serde_json::json;
use sqlx::PgPool;

use crate::{
    fake_stripe::FakeStripe,
    helpers::{enc, TestApp},
    proxy::CHARGE,
};
use app::domain::Role;

/// A proxy in front of the fake Stripe and a key with this duplicate guard
/// (`None`: the API's default), issued through the key API.
async fn guarded(pool: PgPool, policy: Option<&str>) -> (TestApp, FakeStripe, String, i64) {
    let stripe = FakeStripe::start().await;
    let app = TestApp::with_upstream(pool, &stripe.base, Duration::from_millis(500));
    let token = app.api_token().await;
    let mut body = json!({
        "label": "billing-run-2026-07", "expected_total_cents": 100_000,
        "allowed_endpoints": ["POST /v1/charges"], "expires_at": crate::helpers::in_a_month(),
    });
    if let Some(policy) = policy {
        body["duplicate_policy"] = policy.into();
    }
    let created = app.post_json("/vault/keys", &token, body).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    let created = created.json();
    assert_eq!(created["duplicate_policy"], policy.unwrap_or("flag"));
    let key = created["vault_key"].as_str().unwrap().to_owned();
    (app, stripe, key, created["id"].as_i64().unwrap())
}

/// [`CHARGE`] (cust_1, 2026-07, 10.00 USD) under this Idempotency-Key.
async fn charge(app: &TestApp, key: &str, idempotency_key: &str) -> crate::helpers::TestResponse {
    app.stripe(
        "/v1/charges",
        key,
        CHARGE,
        &[("idempotency-key", idempotency_key)],
    )
    .await
}

/// (charges, keeper, at risk, resolution) of the open duplicate findings.
async fn duplicates(pool: &PgPool) -> Vec<(Vec<String>, Option<String>, i64, Option<String>)> {
    sqlx::query_as(
        "SELECT charge_ids, keeper_charge_id, amount_at_risk_cents, resolution
         FROM reconciliation_findings WHERE kind = 'duplicate' ORDER BY id",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// cust_2's first charge: the guard never stands in its way.
async fn other_customer(app: &TestApp, key: &str) -> StatusCode {
    app.stripe(
        "/v1/charges",
        key,
        &CHARGE.replace("cust_1", "cust_2"),
        &[("idempotency-key", "msg-2:try-1")],
    )
    .await
    .status
}

fn ids(ids: &[&str]) -> Vec<String> {
    ids.iter().map(|id| id.to_string()).collect()
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn flag_forwards_a_rotated_key_redelivery_and_opens_a_duplicate_finding_at_once(
    pool: PgPool,
) {
    let (app, stripe, key, _) = guarded(pool.clone(), None).await;
    assert_eq!(
        charge(&app, &key, "msg-1:try-1").await.status,
        StatusCode::OK
    );
    assert!(duplicates(&pool).await.is_empty());

    // The same message redelivered with the same key is a replay, not news.
    assert_eq!(
        charge(&app, &key, "msg-1:try-1").await.status,
        StatusCode::OK
    );
    assert!(duplicates(&pool).await.is_empty());

    // Redelivered with a rotated key: forwarded, and flagged.
    let second = charge(&app, &key, "msg-1:try-2").await;
    assert_eq!(second.status, StatusCode::OK, "{}", second.body);
    assert_eq!(stripe.seen().len(), 3);
    assert_eq!(
        duplicates(&pool).await,
        [(
            ids(&["ch_fake1", "ch_fake3"]),
            Some("ch_fake1".into()),
            1000,
            None
        )]
    );
    let message: String =
        sqlx::query_scalar("SELECT message FROM audit_log WHERE stripe_object_id = 'ch_fake3'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(
        message.contains("flagged as a duplicate of ch_fake1"),
        "{message}"
    );

    // A third delivery joins the open finding; another customer is fine.
    charge(&app, &key, "msg-1:try-3").await;
    assert_eq!(other_customer(&app, &key).await, StatusCode::OK);
    assert_eq!(
        duplicates(&pool).await,
        [(
            ids(&["ch_fake1", "ch_fake3", "ch_fake4"]),
            Some("ch_fake1".into()),
            2000,
            None
        )]
    );

    // The finding is on the Reconciliation page with the proxy's reason.
    let operator = app.signed_in("ops@example.com", Role::Operator).await;
    let page = app
        .get("/reconciliation?period=2026-07", Some(&operator))
        .await;
    assert!(
        page.body.contains("The proxy flagged ch_fake4"),
        "{}",
        page.body
    );
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn block_refuses_the_second_charge_before_stripe_naming_the_first(pool: PgPool) {
    let (app, stripe, key, key_id) = guarded(pool.clone(), Some("block")).await;
    assert_eq!(
        charge(&app, &key, "msg-1:try-1").await.status,
        StatusCode::OK
    );

    let blocked = charge(&app, &key, "msg-1:try-2").await;
    assert_eq!(blocked.status, StatusCode::CONFLICT, "{}", blocked.body);
    let error = &blocked.json()["error"];
    assert_eq!(error["type"], "invalid_request_error");
    assert_eq!(error["code"], "duplicate_charge");
    assert_eq!(error["charge"], "ch_fake1");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("customer cust_1 already has charge ch_fake1 in 2026-07"),
        "{message}"
    );
    assert!(message.contains("Nothing was sent to Stripe"), "{message}");
    assert_eq!(stripe.seen().len(), 1, "the blocked charge never left");

    // The first message's own retry still replays; another customer charges.
    assert_eq!(
        charge(&app, &key, "msg-1:try-1").await.status,
        StatusCode::OK
    );
    assert_eq!(other_customer(&app, &key).await, StatusCode::OK);

    let (spent, reserved): (i64, i64) =
        sqlx::query_as("SELECT spent_cents, reserved_cents FROM vault_keys WHERE id = $1")
            .bind(key_id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        (spent, reserved),
        (2000, 0),
        "nothing reserved for the blocked call"
    );
    let decisions: Vec<String> = sqlx::query_scalar("SELECT decision FROM audit_log ORDER BY id")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(
        decisions,
        ["allowed", "refused_duplicate", "replay", "allowed"]
    );
    assert!(duplicates(&pool).await.is_empty(), "blocked: no finding");
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn block_holds_a_charge_back_while_the_first_ones_outcome_is_unknown(pool: PgPool) {
    let (app, _, key, _) = guarded(pool.clone(), Some("block")).await;
    // Stripe never answers the first (the fake sleeps past the timeout).
    let slow = CHARGE.replace("customer=cus_1", "customer=cus_slow");
    let first = app
        .stripe("/v1/charges", &key, &slow, &[("idempotency-key", "try-1")])
        .await;
    assert_eq!(first.status, StatusCode::GATEWAY_TIMEOUT);

    let second = app
        .stripe("/v1/charges", &key, &slow, &[("idempotency-key", "try-2")])
        .await;
    assert_eq!(second.status, StatusCode::CONFLICT);
    let error = &second.json()["error"];
    assert!(error["charge"].is_null());
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("whose outcome is unknown") && message.contains("reconcile 2026-07"),
        "{message}"
    );
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_charge_refunded_in_full_no_longer_blocks_the_next(pool: PgPool) {
    let (app, _, key, _) = guarded(pool.clone(), Some("block")).await;
    charge(&app, &key, "try-1").await;
    // Reconciliation refunded it (as a sync stores it).
    sqlx::query(
        "INSERT INTO stripe_charges (id, amount_cents, amount_refunded_cents, currency, status,
             customer_id, billing_period, created_at)
         VALUES ('ch_fake1', 1000, 1000, 'usd', 'succeeded', 'cust_1', '2026-07', now())",
    )
    .execute(&pool)
    .await
    .unwrap();
    assert_eq!(charge(&app, &key, "try-2").await.status, StatusCode::OK);
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn off_lets_every_charge_through_without_a_finding(pool: PgPool) {
    let (app, stripe, key, _) = guarded(pool.clone(), Some("off")).await;
    for n in 1..=3 {
        let response = charge(&app, &key, &format!("try-{n}")).await;
        assert_eq!(response.status, StatusCode::OK);
    }
    assert_eq!(stripe.seen().len(), 3);
    assert!(duplicates(&pool).await.is_empty());
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn an_operator_changes_the_guard_from_the_key_page_and_the_next_call_obeys(pool: PgPool) {
    let (app, stripe, key, key_id) = guarded(pool.clone(), None).await;
    let operator = app.signed_in("ops@example.com", Role::Operator).await;
    let page = app.get(&format!("/keys/{key_id}"), Some(&operator)).await;
    assert!(page
        .body
        .contains(r#"data-testid="duplicate-policy">flag<"#));

    let path = format!("/keys/{key_id}/duplicate-policy");
    let refused = app
        .post_form(&path, "duplicate_policy=warn", Some(&operator))
        .await;
    assert_eq!(refused.location(), format!("/keys/{key_id}"));
    let message = app.notice(&format!("/keys/{key_id}"), &operator).await;
    assert!(message.contains("is not a duplicate guard"), "{message}");

    let viewer = app.signed_in("viewer@example.com", Role::Viewer).await;
    let forbidden = app
        .post_form(&path, "duplicate_policy=off", Some(&viewer))
        .await;
    assert_eq!(forbidden.status, StatusCode::FORBIDDEN);
    let policy: String = sqlx::query_scalar("SELECT duplicate_policy FROM vault_keys")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(policy, "flag", "refused changes change nothing");

    let saved = app
        .post_form(
            &path,
            &format!("duplicate_policy={}", enc("block")),
            Some(&operator),
        )
        .await;
    assert_eq!(saved.status, StatusCode::SEE_OTHER);
    let message = app.notice(&format!("/keys/{key_id}"), &operator).await;
    assert!(message.contains("is now block"), "{message}");
    let logged: serde_json::Value = sqlx::query_scalar(
        "SELECT details FROM operator_actions WHERE action = 'vault_key.duplicate_policy'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(logged["from"], "flag");
    assert_eq!(logged["to"], "block");

    charge(&app, &key, "try-1").await;
    assert_eq!(
        charge(&app, &key, "try-2").await.status,
        StatusCode::CONFLICT
    );
    assert_eq!(stripe.seen().len(), 1);
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn the_key_api_refuses_an_unknown_guard(pool: PgPool) {
    let app = TestApp::new(pool);
    let token = app.api_token().await;
    let body = json!({
        "label": "billing-run-2026-07", "expected_total_cents": 1000,
        "allowed_endpoints": ["POST /v1/charges"], "expires_at": crate::helpers::in_a_month(),
        "duplicate_policy": "warn",
    });
    let refused = app.post_json("/vault/keys", &token, body).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    assert!(
        refused.body.contains("flag, block or off"),
        "{}",
        refused.body
    );
}
