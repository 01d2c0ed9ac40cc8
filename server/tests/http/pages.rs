use axum::http::StatusCode;
use sqlx::PgPool;

use crate::helpers::TestApp;
use app::domain::Role;

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn every_console_page_renders_for_a_viewer(pool: PgPool) {
    let app = TestApp::new(pool);
    let cookie = app.signed_in("viewer@example.com", Role::Viewer).await;
    for (path, heading) in [
        ("/", "Overview"),
        ("/keys", "Vault keys"),
        ("/alerts", "Alerts"),
        ("/audit", "Audit log"),
        ("/reconciliation", "Reconciliation"),
        ("/approvals", "Approvals"),
    ] {
        let page = app.get(path, Some(&cookie)).await;
        assert_eq!(page.status, StatusCode::OK, "{path}");
        assert!(
            page.body.contains(&format!("<h1>{heading}")),
            "{path} has its heading"
        );
        assert!(
            !page.body.contains(">Operators</a>"),
            "{path}: a viewer is not offered the Operators page"
        );
    }
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn the_keys_page_lists_keys_with_amounts_in_their_currency(pool: PgPool) {
    let app = TestApp::new(pool.clone());
    app.add_operator("viewer@example.com", Role::Viewer).await;
    sqlx::query(
        "INSERT INTO vault_keys (secret_hash, secret_prefix, label, billing_period, currency,
             expected_total_cents, cap_cents, spent_cents, reserved_cents, allowed_endpoints, expires_at)
         VALUES (sha256('s'), 'vk_abc123', 'billing-run-2026-07', '2026-07', 'eur',
             500000, 550000, 495000, 5000, ARRAY['POST /v1/charges'], now() + interval '1 day')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let cookie = app.sign_in("viewer@example.com").await;
    let page = app.get("/keys", Some(&cookie)).await;
    assert!(page.body.contains("billing-run-2026-07"));
    assert!(
        page.body.contains("5,500.00"),
        "the cap, grouped with two decimals"
    );
    assert!(page.body.contains("4,950.00"));
    assert!(page.body.contains("EUR"));
    assert!(
        page.body.contains("90 %"),
        "utilization counts reserved spend"
    );
    assert!(!page.body.contains("sha256"), "no secret material");
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn an_unknown_address_is_a_404_page(pool: PgPool) {
    let app = TestApp::new(pool);
    let cookie = app.signed_in("viewer@example.com", Role::Viewer).await;
    let page = app.get("/no-such-page", Some(&cookie)).await;
    assert_eq!(page.status, StatusCode::NOT_FOUND);
    assert!(page.body.contains("Page not found"));
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn server_functions_check_the_role_themselves(pool: PgPool) {
    let app = TestApp::new(pool);
    let cookie = app.signed_in("viewer@example.com", Role::Viewer).await;

    let anonymous = app.post_form("/api/list_operators", "", None).await;
    assert_eq!(
        anonymous.status,
        StatusCode::UNAUTHORIZED,
        "{}",
        anonymous.body
    );
    let viewer = app
        .post_form("/api/list_operators", "", Some(&cookie))
        .await;
    assert_eq!(viewer.status, StatusCode::FORBIDDEN, "{}", viewer.body);
    assert!(viewer.body.contains("Forbidden"));
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn health_answers_always_and_readiness_only_while_the_database_does(pool: PgPool) {
    let app = TestApp::new(pool.clone());
    assert_eq!(app.get("/healthz", None).await.body, "ok");
    let ready = app.get("/readyz", None).await;
    assert_eq!(
        (ready.status, ready.body.as_str()),
        (StatusCode::OK, "ready")
    );

    app.pool.close().await;
    assert_eq!(app.get("/healthz", None).await.status, StatusCode::OK);
    assert_eq!(
        app.get("/readyz", None).await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn every_console_request_is_named_by_a_request_id_it_answers_with(pool: PgPool) {
    let app = TestApp::new(pool);
    let page = app.get("/login", None).await;
    let id = page.headers["x-request-id"].to_str().unwrap();
    assert!(uuid::Uuid::parse_str(id).is_ok(), "{id}");

    // One a load balancer already gave is kept, so both logs agree.
    let given = axum::http::Request::get("/login")
        .header("x-request-id", "lb-7f3a")
        .body(axum::body::Body::empty())
        .unwrap();
    let page = app.send(given).await;
    assert_eq!(page.headers["x-request-id"], "lb-7f3a");
}
