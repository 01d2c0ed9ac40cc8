use std::time::Duration;

use axum::http::StatusCode;
use serde_json::json;
use sqlx::PgPool;

use crate::{fake_stripe::FakeStripe, helpers::TestApp};

pub(crate) const CHARGE: &str = "amount=1000&currency=usd&customer=cus_1&metadata%5Bcustomer_id%5D=cust_1&metadata%5Bbilling_period%5D=2026-07";

/// A proxy in front of the fake Stripe (waiting 500 ms for an answer), and
/// a vault key with a cap of `cap_cents`.
pub(crate) async fn proxy_with_key(
    pool: PgPool,
    cap_cents: i64,
) -> (TestApp, FakeStripe, String, i64) {
    proxy_waiting(pool, cap_cents, Duration::from_millis(500)).await
}

/// [`proxy_with_key`], waiting `timeout` for Stripe's answers.
pub(crate) async fn proxy_waiting(
    pool: PgPool,
    cap_cents: i64,
    timeout: Duration,
) -> (TestApp, FakeStripe, String, i64) {
    let stripe = FakeStripe::start().await;
    let app = TestApp::with_upstream(pool, &stripe.base, timeout);
    let token = app.api_token().await;
    let body = json!({
        "label": "billing-run-2026-07", "expected_total_cents": cap_cents, "cap_cents": cap_cents,
        "allowed_endpoints": ["POST /v1/charges", "GET /v1/charges/{id}"],
        "expires_at": crate::helpers::in_a_month(),
    });
    let created = app.post_json("/vault/keys", &token, body).await.json();
    let key = created["vault_key"].as_str().unwrap().to_owned();
    (app, stripe, key, created["id"].as_i64().unwrap())
}

/// `count` charges of [`CHARGE`] sent at once; their statuses.
pub(crate) async fn charge_at_once(app: &TestApp, key: &str, count: usize) -> Vec<StatusCode> {
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..count {
        let (router, key) = (app.router.clone(), key.to_owned());
        calls.spawn(async move {
            let request = axum::http::Request::post("/v1/charges")
                .header("authorization", format!("Bearer {key}"))
                .header("content-type", "application/x-www-form-urlencoded")
                .body(axum::body::Body::from(CHARGE))
                .unwrap();
            tower::ServiceExt::oneshot(router, request)
                .await
                .unwrap()
                .status()
        });
    }
    calls.join_all().await
}

/// A key's spent and reserved cents.
pub(crate) async fn money(pool: &PgPool, key_id: i64) -> (i64, i64) {
    sqlx::query_as("SELECT spent_cents, reserved_cents FROM vault_keys WHERE id = $1")
        .bind(key_id)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn decisions(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar("SELECT decision FROM audit_log ORDER BY id")
        .fetch_all(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn charges_go_through_until_the_cap_refuses_the_next_one(pool: PgPool) {
    let (app, stripe, key, key_id) = proxy_with_key(pool.clone(), 3000).await;
    for n in 1..=3 {
        let response = app.charge(&key, CHARGE).await;
        assert_eq!(
            response.status,
            StatusCode::OK,
            "charge {n}: {}",
            response.body
        );
        assert_eq!(
            response.json()["id"],
            format!("ch_fake{n}"),
            "Stripe's body passes through"
        );
        assert_eq!(response.headers["request-id"], format!("req_fake{n}"));
    }
    let refused = app.charge(&key, CHARGE).await;
    assert_eq!(refused.status, StatusCode::PAYMENT_REQUIRED);
    let error = &refused.json()["error"];
    assert_eq!(error["type"], "invalid_request_error");
    assert_eq!(error["code"], "spend_cap_exceeded");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("cap 30.00 USD, spent 30.00 USD, reserved 0.00 USD, attempted 10.00 USD"),
        "{message}"
    );
    assert!(message.contains(&format!("POST /vault/keys/{key_id}/cap-increase-requests")));

    assert_eq!(
        stripe.seen().len(),
        3,
        "the refused charge never reached Stripe"
    );
    assert_eq!(money(&pool, key_id).await, (3000, 0));
    assert_eq!(
        decisions(&pool).await,
        ["allowed", "allowed", "allowed", "refused_cap"]
    );
    let row: serde_json::Value = sqlx::query_scalar(
        "SELECT json_build_object('customer', stripe_customer, 'metadata_customer_id', metadata_customer_id,
                'metadata_billing_period', metadata_billing_period, 'amount', amount_cents,
                'object', stripe_object_id, 'status', upstream_status, 'period', billing_period)
         FROM audit_log ORDER BY id LIMIT 1",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        row,
        json!({ "customer": "cus_1", "metadata_customer_id": "cust_1", "metadata_billing_period": "2026-07",
                "amount": 1000, "object": "ch_fake1", "status": 200, "period": "2026-07" })
    );
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn the_real_key_goes_upstream_and_the_request_passes_through_byte_for_byte(pool: PgPool) {
    let (app, stripe, key, _) = proxy_with_key(pool, 5000).await;
    let headers = [
        ("idempotency-key", "cust_1:2026-07"),
        ("stripe-version", "2024-06-20"),
    ];
    app.stripe("/v1/charges", &key, CHARGE, &headers).await;
    let seen = &stripe.seen()[0];
    assert_eq!(
        (seen.method.as_str(), seen.path.as_str()),
        ("POST", "/v1/charges")
    );
    assert_eq!(seen.authorization, "Bearer sk_test_real");
    assert!(!seen.authorization.contains(&key));
    assert_eq!(seen.body, CHARGE);
    assert_eq!(seen.idempotency_key.as_deref(), Some("cust_1:2026-07"));
    assert_eq!(seen.stripe_version.as_deref(), Some("2024-06-20"));
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn http_basic_with_the_key_as_user_name_works_like_bearer(pool: PgPool) {
    use base64::Engine;
    let (app, _, key, _) = proxy_with_key(pool, 5000).await;
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("{key}:"));
    let response = app
        .send(
            axum::http::Request::post("/v1/charges")
                .header("authorization", format!("Basic {basic}"))
                .header("content-type", "application/x-www-form-urlencoded")
                .body(axum::body::Body::from(CHARGE))
                .unwrap(),
        )
        .await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.body);
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_retry_with_the_same_idempotency_key_is_forwarded_but_not_reserved_twice(pool: PgPool) {
    let (app, stripe, key, key_id) = proxy_with_key(pool.clone(), 5000).await;
    let idempotent = [("idempotency-key", "cust_1:2026-07")];
    app.stripe("/v1/charges", &key, CHARGE, &idempotent).await;
    let retry = app.stripe("/v1/charges", &key, CHARGE, &idempotent).await;
    assert_eq!(retry.status, StatusCode::OK);
    assert_eq!(
        stripe.seen().len(),
        2,
        "Stripe answers the retry with the original object"
    );
    assert_eq!(money(&pool, key_id).await, (1000, 0), "counted once");
    assert_eq!(decisions(&pool).await, ["allowed", "replay"]);
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_declined_card_releases_the_reservation_and_passes_stripes_error_through(pool: PgPool) {
    let (app, _, key, key_id) = proxy_with_key(pool.clone(), 5000).await;
    let declined = app
        .charge(&key, "amount=1000&currency=usd&customer=cus_decline")
        .await;
    assert_eq!(declined.status, StatusCode::PAYMENT_REQUIRED);
    assert_eq!(declined.error_code(), "card_declined");
    assert_eq!(money(&pool, key_id).await, (0, 0));
    let state: String = sqlx::query_scalar("SELECT state FROM reservations")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(state, "released");
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn an_upstream_500_or_timeout_keeps_the_amount_reserved_as_outcome_unknown(pool: PgPool) {
    let (app, _, key, key_id) = proxy_with_key(pool.clone(), 5000).await;
    let failed = app
        .charge(&key, "amount=1000&currency=usd&customer=cus_500")
        .await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    let slow = app
        .charge(&key, "amount=700&currency=usd&customer=cus_slow")
        .await;
    assert_eq!(slow.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(slow.error_code(), "outcome_unknown");

    assert_eq!(
        money(&pool, key_id).await,
        (0, 1700),
        "unknown outcomes stay reserved"
    );
    assert_eq!(
        decisions(&pool).await,
        ["outcome_unknown", "outcome_unknown"]
    );
    let states: Vec<String> = sqlx::query_scalar("SELECT state FROM reservations ORDER BY id")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(states, ["outcome_unknown", "outcome_unknown"]);
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn an_unreachable_upstream_releases_the_reservation_with_a_502(pool: PgPool) {
    let app = TestApp::with_upstream(
        pool.clone(),
        "http://127.0.0.1:9",
        Duration::from_millis(500),
    );
    let token = app.api_token().await;
    let body = json!({ "label": "run", "expected_total_cents": 5000, "allowed_endpoints": ["/v1/charges"],
                       "expires_at": crate::helpers::in_a_month() });
    let created = app.post_json("/vault/keys", &token, body).await.json();
    let response = app
        .charge(created["vault_key"].as_str().unwrap(), CHARGE)
        .await;
    assert_eq!(response.status, StatusCode::BAD_GATEWAY);
    assert_eq!(response.error_code(), "upstream_unreachable");
    assert_eq!(money(&pool, created["id"].as_i64().unwrap()).await, (0, 0));
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn refusals_are_stripe_shaped_audited_and_never_forwarded(pool: PgPool) {
    let (app, stripe, key, key_id) = proxy_with_key(pool.clone(), 5000).await;
    let cases: [(&str, &str, &str, StatusCode, &str); 10] = [
        (
            "/v1/charges",
            "vk_doesnotexist",
            CHARGE,
            StatusCode::UNAUTHORIZED,
            "invalid_api_key",
        ),
        (
            "/v1/refunds",
            &key,
            "charge=ch_1",
            StatusCode::FORBIDDEN,
            "endpoint_not_allowed",
        ),
        (
            "/v1/charges",
            &key,
            "amount=1000&currency=eur",
            StatusCode::BAD_REQUEST,
            "currency_mismatch",
        ),
        (
            "/v1/charges",
            &key,
            "amount=1000",
            StatusCode::BAD_REQUEST,
            "currency_mismatch",
        ),
        (
            "/v1/charges",
            &key,
            "amount=0&currency=usd",
            StatusCode::BAD_REQUEST,
            "invalid_amount",
        ),
        (
            "/v1/charges",
            &key,
            "amount=-5&currency=usd",
            StatusCode::BAD_REQUEST,
            "invalid_amount",
        ),
        (
            "/v1/charges",
            &key,
            "amount=10.5&currency=usd",
            StatusCode::BAD_REQUEST,
            "invalid_amount",
        ),
        (
            "/v1/charges",
            &key,
            "amount=99999999999999999999&currency=usd",
            StatusCode::BAD_REQUEST,
            "invalid_amount",
        ),
        (
            "/v1/charges",
            &key,
            "amount=100&amount=100&currency=usd",
            StatusCode::BAD_REQUEST,
            // Stripe's parser would keep the last: refused as unreadable.
            "invalid_request",
        ),
        (
            "/v1/charges",
            &key,
            "currency=usd",
            StatusCode::BAD_REQUEST,
            "invalid_amount",
        ),
    ];
    for (path, vault_key, form, status, code) in cases {
        let response = app.stripe(path, vault_key, form, &[]).await;
        assert_eq!(response.status, status, "{path} {form}: {}", response.body);
        assert_eq!(response.error_code(), code, "{path} {form}");
        assert_eq!(response.json()["error"]["type"], "invalid_request_error");
    }
    let json_body = app
        .send(
            axum::http::Request::post("/v1/charges")
                .header("authorization", format!("Bearer {key}"))
                .header("content-type", "application/json")
                .body(axum::body::Body::from(r#"{"amount": 100}"#))
                .unwrap(),
        )
        .await;
    assert_eq!(json_body.status, StatusCode::BAD_REQUEST);
    let huge = format!(
        "amount=100&currency=usd&description={}",
        "x".repeat(server::proxy::MAX_BODY)
    );
    assert_eq!(
        app.charge(&key, &huge).await.status,
        StatusCode::PAYLOAD_TOO_LARGE
    );
    let no_key = app
        .send(
            axum::http::Request::post("/v1/charges")
                .body(axum::body::Body::from(CHARGE))
                .unwrap(),
        )
        .await;
    assert_eq!(no_key.error_code(), "missing_api_key");

    assert!(stripe.seen().is_empty(), "nothing refused reached Stripe");
    assert_eq!(money(&pool, key_id).await, (0, 0));
    let audited = decisions(&pool).await;
    assert_eq!(audited.len(), 13, "one audit row per call: {audited:?}");
    let unknown_prefix: String =
        sqlx::query_scalar("SELECT key_prefix FROM audit_log ORDER BY id LIMIT 1")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        unknown_prefix, "vk_doesnote",
        "an unknown key is audited by its prefix only"
    );
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_revoked_key_is_refused_from_the_next_call(pool: PgPool) {
    let (app, stripe, key, key_id) = proxy_with_key(pool.clone(), 5000).await;
    let token = app.api_token().await;
    app.post_json(
        &format!("/vault/keys/{key_id}/revoke"),
        &token,
        json!({ "reason": "leaked" }),
    )
    .await;
    let response = app.charge(&key, CHARGE).await;
    assert_eq!(response.status, StatusCode::UNAUTHORIZED);
    assert_eq!(response.error_code(), "api_key_revoked");
    assert!(response.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("leaked"));
    assert!(stripe.seen().is_empty());
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn concurrent_charges_never_exceed_the_cap(pool: PgPool) {
    // The cap admits exactly 7 charges of 1,000; 40 arrive at once.
    let (app, stripe, key, key_id) = proxy_with_key(pool.clone(), 7000).await;
    let statuses = charge_at_once(&app, &key, 40).await;
    assert_eq!(statuses.iter().filter(|s| **s == StatusCode::OK).count(), 7);
    assert_eq!(
        statuses
            .iter()
            .filter(|s| **s == StatusCode::PAYMENT_REQUIRED)
            .count(),
        33
    );
    assert_eq!(stripe.seen().len(), 7);
    assert_eq!(money(&pool, key_id).await, (7000, 0));
    assert_eq!(decisions(&pool).await.len(), 40);
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn with_the_database_gone_the_proxy_fails_closed(pool: PgPool) {
    let (app, stripe, key, _) = proxy_with_key(pool.clone(), 5000).await;
    app.pool.close().await;
    app.ledger_pool.close().await;
    let response = app.charge(&key, CHARGE).await;
    assert_eq!(response.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.json()["error"]["type"], "api_error");
    assert!(stripe.seen().is_empty(), "nothing unmetered was forwarded");
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn calls_are_counted_by_decision_in_the_metrics(pool: PgPool) {
    server::metrics::install();
    let (app, _, key, _) = proxy_with_key(pool, 1000).await;
    app.charge(&key, CHARGE).await;
    app.charge(&key, CHARGE).await;
    let metrics = app.get("/metrics", None).await;
    assert_eq!(
        metrics.status,
        StatusCode::FORBIDDEN,
        "not from this host, no token"
    );
    let from_this_host =
        |forwarded: Option<&str>| {
            let mut request = axum::http::Request::get("/metrics").header("host", "localhost");
            if let Some(client) = forwarded {
                request = request.header("x-forwarded-for", client);
            }
            let mut request = request.body(axum::body::Body::empty()).unwrap();
            request.extensions_mut().insert(axum::extract::ConnectInfo(
                std::net::SocketAddr::from(([127, 0, 0, 1], 5000)),
            ));
            request
        };
    assert_eq!(app.send(from_this_host(None)).await.status, StatusCode::OK);
    assert_eq!(
        app.send(from_this_host(Some("203.0.113.9"))).await.status,
        StatusCode::FORBIDDEN,
        "a proxy on this host forwards someone who is not local"
    );
    // The same process's metrics through an instance with a scraper token.
    let mut state = app.state.clone();
    state.auth = std::sync::Arc::new(app::ssr::AuthConfig {
        metrics_token: Some("scraper-token".into()),
        ..Default::default()
    });
    let upstream =
        server::proxy::upstream::Upstream::new("http://127.0.0.1:9", None, Duration::from_secs(1))
            .unwrap();
    let scraped = |token: &str| {
        let router = server::http::router(state.clone(), upstream.clone(), app.ledger_pool.clone());
        let request = axum::http::Request::get("/metrics")
            .header("host", "localhost")
            .header("authorization", format!("Bearer {token}"))
            .body(axum::body::Body::empty())
            .unwrap();
        async move {
            let response = tower::ServiceExt::oneshot(router, request).await.unwrap();
            let status = response.status();
            let body = http_body_util::BodyExt::collect(response.into_body())
                .await
                .unwrap()
                .to_bytes();
            (status, String::from_utf8_lossy(&body).into_owned())
        }
    };
    assert_eq!(scraped("guess").await.0, StatusCode::FORBIDDEN);
    let (status, body) = scraped("scraper-token").await;
    assert_eq!(status, StatusCode::OK);
    let metrics = crate::helpers::TestResponse {
        status,
        headers: Default::default(),
        raw: body.clone().into_bytes(),
        body,
    };
    // Other tests in this process count too: only presence is certain.
    assert!(
        metrics
            .body
            .contains("vaultcap_proxy_calls_total{decision=\"allowed\"}"),
        "{}",
        metrics.body
    );
    assert!(metrics
        .body
        .contains("vaultcap_proxy_calls_total{decision=\"refused_cap\"}"));
    assert!(metrics
        .body
        .contains("vaultcap_upstream_latency_seconds_bucket"));
    // The ledger writer's turns: how busy the one writer is.
    assert!(metrics.body.contains("vaultcap_ledger_write_seconds_sum"));
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_reservation_cut_off_mid_call_is_swept_into_the_audit_log(pool: PgPool) {
    let (_, _, _, key_id) = proxy_with_key(pool.clone(), 5000).await;
    // What a proxy killed between reserve and settle leaves behind.
    sqlx::query(
        "WITH r AS (INSERT INTO reservations (vault_key_id, request_id, amount_cents, path, created_at, claimed_until)
                    VALUES ($1, gen_random_uuid(), 1200, '/v1/charges', now() - interval '1 hour',
                            now() - interval '1 hour'))
         UPDATE vault_keys SET reserved_cents = 1200 WHERE id = $1",
    )
    .bind(key_id)
    .execute(&pool)
    .await
    .unwrap();
    assert_eq!(
        app::keys::spend::sweep_abandoned(&pool, 120).await.unwrap(),
        1
    );
    assert_eq!(
        app::keys::spend::sweep_abandoned(&pool, 120).await.unwrap(),
        0,
        "swept once"
    );
    assert_eq!(decisions(&pool).await, ["outcome_unknown"]);
    assert_eq!(
        money(&pool, key_id).await,
        (0, 1200),
        "still reserved until reconciliation decides"
    );
}
