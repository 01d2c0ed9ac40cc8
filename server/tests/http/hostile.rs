//! The proxy attacked: reused and raced Idempotency-Keys, bytes Stripe
//! would read another way than Vaultcap, junk mixed into honest traffic.
//! Each test states what must hold: Stripe takes no cent over the cap, the
//! ledger's spent equals what Stripe took, every call leaves one audit row,
//! and a refused call costs no other call anything.

use axum::{
    body::Body,
    http::{Request, StatusCode},
};
use serde_json::Value;
use sqlx::PgPool;

use crate::{
    helpers::{TestApp, TestResponse},
    proxy::{money, proxy_waiting, proxy_with_key},
};

/// A charge of `cents` for Stripe customer `customer`.
fn charge(cents: i64, customer: &str) -> String {
    format!(
        "amount={cents}&currency=usd&customer={customer}&metadata%5Bcustomer_id%5D=c_{customer}"
    )
}

async fn audit_rows(pool: &PgPool) -> Vec<(String, Option<String>)> {
    sqlx::query_as("SELECT decision, error_code FROM audit_log ORDER BY id")
        .fetch_all(pool)
        .await
        .unwrap()
}

fn error_code(response: &TestResponse) -> String {
    let body: Value = response.json();
    body["error"]["code"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// A raw call through the proxy: every header as given, repeated ones too.
async fn raw(app: &TestApp, uri: &str, headers: &[(&str, &str)], body: &str) -> TestResponse {
    let mut request = Request::post(uri);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    app.send(request.body(Body::from(body.to_owned())).unwrap())
        .await
}

fn form_headers(key: &str) -> Vec<(&'static str, String)> {
    vec![
        ("authorization", format!("Bearer {key}")),
        (
            "content-type",
            "application/x-www-form-urlencoded".to_owned(),
        ),
    ]
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_key_whose_first_call_failed_at_stripe_is_no_free_pass(pool: PgPool) {
    let (app, stripe, key, key_id) = proxy_with_key(pool.clone(), 1000).await;
    let reused = [("idempotency-key", "K")];
    let failed = app
        .stripe("/v1/charges", &key, &charge(500, "cus_missing"), &reused)
        .await;
    assert_eq!(failed.status, StatusCode::NOT_FOUND);
    let big = app
        .stripe("/v1/charges", &key, &charge(100_000, "cus_1"), &reused)
        .await;
    assert_eq!(big.status, StatusCode::PAYMENT_REQUIRED, "{}", big.body);
    assert_eq!(error_code(&big), "spend_cap_exceeded");
    let fits = app
        .stripe("/v1/charges", &key, &charge(900, "cus_1"), &reused)
        .await;
    assert_eq!(fits.status, StatusCode::OK, "{}", fits.body);
    assert_eq!(stripe.charged(), (900, 1));
    assert_eq!(money(&pool, key_id).await, (900, 0));
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_key_reused_with_other_parameters_is_stripes_idempotency_error_before_stripe(
    pool: PgPool,
) {
    let (app, stripe, key, key_id) = proxy_with_key(pool.clone(), 5000).await;
    let reused = [("idempotency-key", "K")];
    let first = app
        .stripe("/v1/charges", &key, &charge(500, "cus_1"), &reused)
        .await;
    assert_eq!(first.status, StatusCode::OK);
    let other = app
        .stripe("/v1/charges", &key, &charge(600, "cus_1"), &reused)
        .await;
    assert_eq!(other.status, StatusCode::BAD_REQUEST, "{}", other.body);
    assert_eq!(other.json()["error"]["type"], "idempotency_error");
    // The same parameters in another order are the same request.
    let reordered = "currency=usd&amount=500&metadata%5Bcustomer_id%5D=c_cus_1&customer=cus_1";
    let replay = app.stripe("/v1/charges", &key, reordered, &reused).await;
    assert_eq!(replay.status, StatusCode::OK, "{}", replay.body);
    assert_eq!(replay.json()["id"], first.json()["id"], "Stripe's original");
    assert_eq!(stripe.seen().len(), 2, "the mismatch never reached Stripe");
    assert_eq!(stripe.charged(), (500, 1));
    assert_eq!(money(&pool, key_id).await, (500, 0));
    let decisions: Vec<String> = audit_rows(&pool).await.into_iter().map(|r| r.0).collect();
    assert_eq!(decisions, ["allowed", "refused_invalid_request", "replay"]);
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_key_reused_after_stripes_24_hours_is_a_new_charge_reserved_and_capped(pool: PgPool) {
    let (app, stripe, key, key_id) = proxy_with_key(pool.clone(), 1000).await;
    let reused = [("idempotency-key", "cust_1:2026-07")];
    let first = app
        .stripe("/v1/charges", &key, &charge(600, "cus_1"), &reused)
        .await;
    assert_eq!(first.status, StatusCode::OK);
    // A day and an hour later, for Vaultcap and for Stripe.
    sqlx::query("UPDATE reservations SET created_at = created_at - interval '25 hours'")
        .execute(&pool)
        .await
        .unwrap();
    stripe.advance_hours(25);
    let redelivered = app
        .stripe("/v1/charges", &key, &charge(600, "cus_1"), &reused)
        .await;
    assert_eq!(
        redelivered.status,
        StatusCode::PAYMENT_REQUIRED,
        "{}",
        redelivered.body
    );
    assert_eq!(stripe.charged(), (600, 1));
    assert_eq!(money(&pool, key_id).await, (600, 0));
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_twin_sent_while_the_first_is_in_flight_gets_stripes_409_and_is_not_forwarded(
    pool: PgPool,
) {
    // Stripe holds the first call until the test lets it answer.
    let patient = std::time::Duration::from_secs(60);
    let (app, stripe, key, key_id) = proxy_waiting(pool.clone(), 5000, patient).await;
    let first = tokio::spawn({
        let (router, key) = (app.router.clone(), key.clone());
        async move {
            let request = Request::post("/v1/charges")
                .header("authorization", format!("Bearer {key}"))
                .header("content-type", "application/x-www-form-urlencoded")
                .header("idempotency-key", "K")
                .body(Body::from(charge(700, "cus_hold")))
                .unwrap();
            tower::ServiceExt::oneshot(router, request)
                .await
                .unwrap()
                .status()
        }
    });
    // The first call is in flight once Stripe has it.
    while stripe.seen().is_empty() {
        tokio::task::yield_now().await;
    }
    let twin = app
        .stripe(
            "/v1/charges",
            &key,
            &charge(700, "cus_hold"),
            &[("idempotency-key", "K")],
        )
        .await;
    assert_eq!(twin.status, StatusCode::CONFLICT, "{}", twin.body);
    assert_eq!(twin.json()["error"]["type"], "idempotency_error");
    stripe.release();
    assert_eq!(first.await.unwrap(), StatusCode::OK);
    assert_eq!(stripe.seen().len(), 1);
    assert_eq!(money(&pool, key_id).await, (700, 0));
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_retry_of_a_call_whose_answer_was_lost_settles_it_with_stripes_original(pool: PgPool) {
    let (app, stripe, key, key_id) = proxy_with_key(pool.clone(), 5000).await;
    let reused = [("idempotency-key", "K")];
    let lost = app
        .stripe("/v1/charges", &key, &charge(800, "cus_lost"), &reused)
        .await;
    assert_eq!(lost.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(money(&pool, key_id).await, (0, 800), "unknown: reserved");
    let retry = app
        .stripe("/v1/charges", &key, &charge(800, "cus_lost"), &reused)
        .await;
    assert_eq!(retry.status, StatusCode::OK, "{}", retry.body);
    let charge_id = retry.json()["id"].as_str().unwrap().to_owned();
    assert!(charge_id.starts_with("ch_lost"), "{charge_id}");
    assert_eq!(money(&pool, key_id).await, (800, 0), "spent once");
    assert_eq!(stripe.charged(), (800, 1));
    let (state, object): (String, Option<String>) =
        sqlx::query_as("SELECT state, stripe_charge_id FROM reservations")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((state.as_str(), object), ("settled", Some(charge_id)));
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_retry_of_an_unknown_outcome_that_stripe_answers_500_again_stays_reserved(pool: PgPool) {
    let (app, _stripe, key, key_id) = proxy_with_key(pool.clone(), 5000).await;
    let reused = [("idempotency-key", "K")];
    for _ in 0..2 {
        let answer = app
            .stripe("/v1/charges", &key, &charge(800, "cus_500"), &reused)
            .await;
        assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
    }
    assert_eq!(money(&pool, key_id).await, (0, 800));
    let states: Vec<String> = sqlx::query_scalar("SELECT state FROM reservations")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(
        states,
        ["outcome_unknown"],
        "one reservation, still unknown"
    );
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn headers_stripe_acts_on_sent_twice_are_refused_before_anything_is_reserved(pool: PgPool) {
    let (app, stripe, key, key_id) = proxy_with_key(pool.clone(), 5000).await;
    let body = charge(600, "cus_1");
    for name in [
        "idempotency-key",
        "stripe-account",
        "stripe-version",
        "authorization",
    ] {
        let mut headers = form_headers(&key);
        let value = if name == "authorization" {
            format!("Bearer {key}")
        } else {
            "x".to_owned()
        };
        headers.push((name, value.clone()));
        headers.push((name, value));
        let borrowed: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        let refused = raw(&app, "/v1/charges", &borrowed, &body).await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{name}");
        assert!(
            refused.json()["error"]["message"]
                .as_str()
                .unwrap()
                .to_lowercase()
                .contains(name),
            "{name}: {}",
            refused.body
        );
    }
    assert!(stripe.seen().is_empty());
    assert_eq!(money(&pool, key_id).await, (0, 0));
    let rows = audit_rows(&pool).await;
    assert_eq!(rows.len(), 4, "one audit row per refused call");
    assert!(rows.iter().all(|(d, _)| d == "refused_invalid_request"));
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn bytes_stripes_parser_would_read_another_way_are_refused(pool: PgPool) {
    let (app, stripe, key, key_id) = proxy_with_key(pool.clone(), 5000).await;
    let long_value = "v".repeat(501);
    let many_keys: String = (0..51).map(|n| format!("&metadata%5Bk{n}%5D=v")).collect();
    let cases = [
        (
            "a `;` separator",
            format!("{};amount=4000", charge(100, "cus_1")),
        ),
        (
            "a repeated amount",
            format!("{}&amount=4000", charge(100, "cus_1")),
        ),
        ("unnested brackets", "amount%5D=100&currency=usd".to_owned()),
        ("a NUL byte", format!("{}%00", charge(100, "cus_1"))),
        (
            "a control character",
            format!("{}%01", charge(100, "cus_1")),
        ),
        ("a signed amount", "amount=%2B100&currency=usd".to_owned()),
        (
            "a long metadata value",
            format!("{}&metadata%5Bnote%5D={long_value}", charge(100, "cus_1")),
        ),
        (
            "51 metadata keys",
            format!("{}{many_keys}", charge(100, "cus_1")),
        ),
        (
            "a long metadata key",
            format!(
                "{}&metadata%5B{}%5D=v",
                charge(100, "cus_1"),
                "k".repeat(41)
            ),
        ),
    ];
    for (what, body) in &cases {
        let refused = app.charge(&key, body).await;
        assert_eq!(
            refused.status,
            StatusCode::BAD_REQUEST,
            "{what}: {}",
            refused.body
        );
    }
    let query = app
        .stripe("/v1/charges?amount=9000", &key, &charge(100, "cus_1"), &[])
        .await;
    assert_eq!(query.status, StatusCode::BAD_REQUEST, "a query on a write");
    let long_key = "k".repeat(256);
    let long = app
        .stripe(
            "/v1/charges",
            &key,
            &charge(100, "cus_1"),
            &[("idempotency-key", &long_key)],
        )
        .await;
    assert_eq!(long.status, StatusCode::BAD_REQUEST, "{}", long.body);
    assert!(stripe.seen().is_empty(), "nothing reached Stripe");
    assert_eq!(money(&pool, key_id).await, (0, 0), "nothing reserved");
    assert_eq!(audit_rows(&pool).await.len(), cases.len() + 2);
    let stored: Option<String> =
        sqlx::query_scalar("SELECT idempotency_key FROM audit_log ORDER BY id DESC LIMIT 1")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        stored.map(|k| k.len()),
        Some(255),
        "kept, cut to Stripe's limit"
    );
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_key_charges_only_on_the_account_it_is_for(pool: PgPool) {
    let (app, stripe, platform_key, _) = proxy_with_key(pool.clone(), 5000).await;
    let token = app.api_token().await;
    let connected = app
        .post_json("/vault/keys", &token, serde_json::json!({
                "label": "connected", "expected_total_cents": 5000, "stripe_account": "acct_1",
                "allowed_endpoints": ["POST /v1/charges"], "expires_at": crate::helpers::in_a_month(),
            }))
        .await;
    assert_eq!(connected.status, StatusCode::CREATED, "{}", connected.body);
    assert_eq!(connected.json()["stripe_account"], "acct_1");
    let connected = connected.json()["vault_key"].as_str().unwrap().to_owned();
    let body = charge(100, "cus_1");
    for (key, account, status) in [
        (&connected, Some("acct_1"), StatusCode::OK),
        (&connected, None, StatusCode::BAD_REQUEST),
        (&connected, Some("acct_2"), StatusCode::BAD_REQUEST),
        (&platform_key, Some("acct_1"), StatusCode::BAD_REQUEST),
        (&platform_key, None, StatusCode::OK),
    ] {
        let headers: Vec<(&str, &str)> =
            account.map(|a| ("stripe-account", a)).into_iter().collect();
        let answer = app.stripe("/v1/charges", key, &body, &headers).await;
        assert_eq!(answer.status, status, "{account:?}: {}", answer.body);
    }
    assert_eq!(
        stripe.charged(),
        (200, 2),
        "only the two on their own accounts"
    );
    let bad = app
        .post_json("/vault/keys", &token, serde_json::json!({
                "label": "bad", "expected_total_cents": 5000, "stripe_account": "acct_../x",
                "allowed_endpoints": ["POST /v1/charges"], "expires_at": crate::helpers::in_a_month(),
            }))
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.body);
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn junk_sent_beside_honest_charges_costs_them_nothing(pool: PgPool) {
    let (app, stripe, key, key_id) = proxy_with_key(pool.clone(), 1_000_000).await;
    let long_key = "k".repeat(6000);
    let nul_key = "Basic AAAAAA==".to_owned();
    let mut calls = tokio::task::JoinSet::new();
    for n in 0..40 {
        let router = app.router.clone();
        let key = key.clone();
        let (long_key, nul_key) = (long_key.clone(), nul_key.clone());
        calls.spawn(async move {
            let honest = n % 2 == 0;
            let mut request = Request::post("/v1/charges")
                .header("content-type", "application/x-www-form-urlencoded");
            let body = if honest {
                request = request
                    .header("authorization", format!("Bearer {key}"))
                    .header("idempotency-key", format!("honest-{n}"));
                charge(100, &format!("cus_{n}"))
            } else {
                match n % 6 {
                    1 => {
                        request = request.header("authorization", nul_key);
                        charge(100, "cus_junk")
                    }
                    3 => {
                        request = request
                            .header("authorization", format!("Bearer {key}"))
                            .header("idempotency-key", long_key);
                        charge(100, "cus_junk")
                    }
                    _ => {
                        request = request.header("authorization", format!("Bearer {key}"));
                        "amount=100&currency=usd&metadata%5Bcustomer_id%5D=a%00b".to_owned()
                    }
                }
            };
            let request = request.body(Body::from(body)).unwrap();
            let status = tower::ServiceExt::oneshot(router, request)
                .await
                .unwrap()
                .status();
            (honest, status)
        });
    }
    let answers = calls.join_all().await;
    for (honest, status) in &answers {
        if *honest {
            assert_eq!(*status, StatusCode::OK);
        } else {
            assert!(status.is_client_error(), "{status}");
        }
    }
    assert_eq!(stripe.charged(), (2000, 20));
    assert_eq!(money(&pool, key_id).await, (2000, 0));
    assert_eq!(audit_rows(&pool).await.len(), 40, "one audit row per call");
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn two_deliveries_racing_through_the_same_keys_charge_each_once(pool: PgPool) {
    let (app, stripe, key, key_id) = proxy_with_key(pool.clone(), 1_000_000).await;
    let mut calls = tokio::task::JoinSet::new();
    for delivery in 0..2 {
        for n in 0..40 {
            let (router, key) = (app.router.clone(), key.clone());
            calls.spawn(async move {
                let request = Request::post("/v1/charges")
                    .header("authorization", format!("Bearer {key}"))
                    .header("content-type", "application/x-www-form-urlencoded")
                    .header("idempotency-key", format!("cust_{n}:2026-07"))
                    .body(Body::from(charge(100 + n, &format!("cus_{n}"))))
                    .unwrap();
                let status = tower::ServiceExt::oneshot(router, request)
                    .await
                    .unwrap()
                    .status();
                (delivery, status)
            });
        }
    }
    let answers = calls.join_all().await;
    assert!(
        answers
            .iter()
            .all(|(_, s)| *s == StatusCode::OK || *s == StatusCode::CONFLICT),
        "every call charged, replayed or told its twin is in flight: {answers:?}"
    );
    let expected: i64 = (0..40).map(|n| 100 + n).sum();
    assert_eq!(stripe.charged(), (expected, 40), "each customer once");
    assert_eq!(
        money(&pool, key_id).await,
        (expected, 0),
        "nothing left reserved"
    );
    assert_eq!(audit_rows(&pool).await.len(), 80);
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_retry_takes_over_a_call_whose_process_stopped_and_settles_it(pool: PgPool) {
    let (app, stripe, key, key_id) = proxy_with_key(pool.clone(), 5000).await;
    let reused = [("idempotency-key", "K")];
    let lost = app
        .stripe("/v1/charges", &key, &charge(800, "cus_lost"), &reused)
        .await;
    assert_eq!(lost.status, StatusCode::GATEWAY_TIMEOUT);
    // As a process killed mid-call leaves it: pending, past the time that
    // process answered for it.
    sqlx::query(
        "UPDATE reservations SET state = 'pending', claimed_until = now() - interval '1 second'",
    )
    .execute(&pool)
    .await
    .unwrap();
    let retry = app
        .stripe("/v1/charges", &key, &charge(800, "cus_lost"), &reused)
        .await;
    assert_eq!(retry.status, StatusCode::OK, "{}", retry.body);
    assert_eq!(money(&pool, key_id).await, (800, 0));
    assert_eq!(stripe.charged(), (800, 1));
    let decisions: Vec<String> = audit_rows(&pool).await.into_iter().map(|r| r.0).collect();
    assert_eq!(
        decisions,
        ["outcome_unknown", "outcome_unknown", "replay"],
        "the lost answer, the stopped call, the retry"
    );
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn console_work_holding_every_connection_does_not_starve_billing(pool: PgPool) {
    let (app, stripe, key, key_id) = proxy_with_key(pool.clone(), 5000).await;
    // Ten slow exports or syncs: every connection of the console's pool held.
    let mut held = Vec::new();
    for _ in 0..10 {
        held.push(app.pool.acquire().await.unwrap());
    }
    let charged = app.charge(&key, &charge(700, "cus_1")).await;
    assert_eq!(charged.status, StatusCode::OK, "{}", charged.body);
    assert_eq!(stripe.charged(), (700, 1));
    drop(held);
    assert_eq!(money(&pool, key_id).await, (700, 0));
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn methods_and_paths_an_http_client_would_rewrite_are_refused(pool: PgPool) {
    let (app, stripe, key, key_id) = proxy_with_key(pool.clone(), 5000).await;
    for (method, uri) in [
        ("post", "/v1/charges"),
        ("PUT", "/v1/charges"),
        ("POST", "/v1/customers/%2e%2e/charges"),
        ("POST", "/v1/x/../charges"),
    ] {
        let request = Request::builder()
            .method(method)
            .uri(uri)
            .header("authorization", format!("Bearer {key}"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(Body::from(charge(100, "cus_1")))
            .unwrap();
        let refused = app.send(request).await;
        assert_eq!(
            refused.status,
            StatusCode::BAD_REQUEST,
            "{method} {uri}: {}",
            refused.body
        );
    }
    assert!(stripe.seen().is_empty());
    assert_eq!(money(&pool, key_id).await, (0, 0));
}
