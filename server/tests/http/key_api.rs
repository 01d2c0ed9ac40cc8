use axum::http::StatusCode;
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::helpers::TestApp;

fn seeds_body() -> Value {
    // Exactly what the seed articles' billing jobs send.
    json!({
        "vendor": "stripe",
        "label": "billing-run-2026-07",
        "daily_usd_cap": 5500.0,
        "allowed_endpoints": ["/v1/charges", "/v1/payment_intents"],
        "expires_at": (chrono::Utc::now() + chrono::Duration::hours(6)).to_rfc3339(),
    })
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn the_seed_articles_body_issues_a_key_shown_once_and_stored_hashed(pool: PgPool) {
    let app = TestApp::new(pool.clone());
    let token = app.api_token().await;

    let response = app.post_json("/vault/keys", &token, seeds_body()).await;
    assert_eq!(response.status, StatusCode::CREATED, "{}", response.body);
    let created = response.json();
    let secret = created["vault_key"].as_str().unwrap().to_owned();
    assert!(secret.starts_with("vk_") && secret.len() == 43);
    assert_eq!(created["cap_cents"], 550_000);
    assert_eq!(created["expected_total_cents"], 500_000);
    assert_eq!(created["billing_period"], "2026-07");
    assert_eq!(created["currency"], "usd");
    assert_eq!(
        created["allowed_endpoints"],
        json!(["POST /v1/charges", "POST /v1/payment_intents"])
    );
    assert_eq!(created["status"], "active");

    let id = created["id"].as_i64().unwrap();
    let shown = app.get_api(&format!("/vault/keys/{id}"), &token).await;
    assert_eq!(shown.status, StatusCode::OK);
    assert!(
        !shown.body.contains(&secret),
        "the secret is shown only at creation"
    );
    assert_eq!(shown.json()["utilization_pct"], 0);

    let stored: Vec<u8> = sqlx::query_scalar("SELECT secret_hash FROM vault_keys")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(stored, app::ssr::secrets::hash(&secret));
    let logged = crate::helpers::count(&pool, "SELECT count(*) FROM operator_actions WHERE action = 'create_vault_key' AND via = 'api' AND api_token_id IS NOT NULL").await;
    assert_eq!(logged, 1);
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn the_native_body_computes_the_cap_from_the_expected_total(pool: PgPool) {
    let app = TestApp::new(pool);
    let token = app.api_token().await;
    let body = json!({
        "label": "eu run", "billing_period": "2026-08", "expected_total_cents": 999,
        "buffer_pct": 10, "currency": "EUR",
        "allowed_endpoints": ["POST /v1/payment_intents", "POST /v1/payment_intents/{id}/confirm"],
        "expires_at": crate::helpers::in_a_month(),
    });
    let created = app.post_json("/vault/keys", &token, body).await.json();
    assert_eq!(
        created["cap_cents"], 1098,
        "999 × 1.10 = 1098.9, rounded down"
    );
    assert_eq!(created["currency"], "eur");
    assert_eq!(created["billing_period"], "2026-08");

    let listed = app.get_api("/vault/keys", &token).await.json();
    assert_eq!(listed.as_array().unwrap().len(), 1);
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn bad_key_requests_are_refused_with_a_clear_error(pool: PgPool) {
    let app = TestApp::new(pool.clone());
    let token = app.api_token().await;
    let with = |field: &str, value: Value| {
        let mut body = seeds_body();
        body[field] = value;
        body
    };
    let cases = [
        (
            with("daily_usd_cap", json!(-5.0)),
            "not an amount of dollars",
        ),
        (
            with("daily_usd_cap", json!(1e13)),
            "not an amount of dollars",
        ),
        (with("daily_usd_cap", json!("5500")), "invalid type"),
        (
            with("expires_at", json!("2020-01-01T00:00:00Z")),
            "is not in the future",
        ),
        (
            with("expires_at", json!("next tuesday")),
            "is not an RFC 3339 time",
        ),
        // The console's rules, which the API once did not share.
        (
            with("expires_at", json!("2099-01-01T00:00:00Z")),
            "within a year",
        ),
        (with("buffer_pct", json!(150)), "from 0 to 100 %"),
        (with("buffer_pct", json!(-1)), "is not a percentage"),
        (
            with("allowed_endpoints", json!(["/v1/transfers"])),
            "is not an endpoint Vaultcap meters",
        ),
        (
            with("allowed_endpoints", json!([])),
            "at least one endpoint",
        ),
        (with("vendor", json!("paypal")), "is not supported"),
        (with("label", json!("")), "label must have"),
        (with("expected_total_cents", json!(100)), "not both"),
        (with("surprise", json!(1)), "unknown field"),
    ];
    for (body, expected) in cases {
        let response = app.post_json("/vault/keys", &token, body.clone()).await;
        assert_eq!(
            response.status,
            StatusCode::BAD_REQUEST,
            "{body}: {}",
            response.body
        );
        let message = response.json()["error"]["message"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(message.contains(expected), "{body}: {message}");
    }
    let not_json = app
        .send(
            axum::http::Request::post("/vault/keys")
                .header("authorization", format!("Bearer {token}"))
                .header("content-type", "application/json")
                .body(axum::body::Body::from("{\"daily_usd_cap\": NaN"))
                .unwrap(),
        )
        .await;
    assert_eq!(not_json.status, StatusCode::BAD_REQUEST);
    assert_eq!(not_json.error_code(), "invalid_request");

    let keys = crate::helpers::count(&pool, "SELECT count(*) FROM vault_keys").await;
    assert_eq!(keys, 0, "no key was created by a bad request");
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn the_key_api_needs_a_valid_token(pool: PgPool) {
    let app = TestApp::new(pool);
    let missing = app
        .api("POST", "/vault/keys", None, Some(seeds_body()))
        .await;
    assert_eq!(missing.status, StatusCode::UNAUTHORIZED);
    assert!(missing.body.contains("vaultcap token add"));
    let wrong = app
        .api("GET", "/vault/keys", Some("vct_not-a-token"), None)
        .await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert_eq!(wrong.error_code(), "unauthenticated");
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn revoking_needs_a_reason_and_happens_once(pool: PgPool) {
    let app = TestApp::new(pool);
    let token = app.api_token().await;
    let id = app
        .post_json("/vault/keys", &token, seeds_body())
        .await
        .json()["id"]
        .as_i64()
        .unwrap();
    let path = format!("/vault/keys/{id}/revoke");

    let no_reason = app.post_json(&path, &token, json!({ "reason": " " })).await;
    assert_eq!(no_reason.status, StatusCode::BAD_REQUEST);
    let revoked = app
        .post_json(&path, &token, json!({ "reason": "run finished" }))
        .await;
    assert_eq!(revoked.json()["status"], "revoked");
    let again = app
        .post_json(&path, &token, json!({ "reason": "again" }))
        .await;
    assert!(again.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("already revoked"));
    let missing = app
        .post_json(
            "/vault/keys/999999/revoke",
            &token,
            json!({ "reason": "x" }),
        )
        .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn the_openapi_document_describes_the_key_api(pool: PgPool) {
    let app = TestApp::new(pool);
    let response = app.api("GET", "/api/openapi.json", None, None).await;
    assert_eq!(response.status, StatusCode::OK);
    let doc = response.json();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    for path in [
        "/vault/keys",
        "/vault/keys/{id}",
        "/vault/keys/{id}/revoke",
        "/vault/keys/{id}/cap-increase-requests",
    ] {
        assert!(doc["paths"][path].is_object(), "{path} is documented");
    }
    let ask = &doc["components"]["schemas"]["CreateRequest"]["properties"];
    for field in ["new_cap_cents", "additional_cents", "reason", "apply_as"] {
        assert!(
            ask[field].is_object(),
            "CreateRequest.{field} is documented"
        );
    }
    assert!(doc["paths"]["/vault/keys"]["post"]["requestBody"].is_object());
    let create = &doc["components"]["schemas"]["CreateKey"]["properties"];
    for field in [
        "daily_usd_cap",
        "expected_total_cents",
        "allowed_endpoints",
        "expires_at",
    ] {
        assert!(create[field].is_object(), "CreateKey.{field} is documented");
    }
    assert_eq!(
        doc["components"]["securitySchemes"]["api_token"]["scheme"],
        "bearer"
    );
}
