//! Alerts: raised exactly once by the ledger, delivered through the outbox,
//! read and acknowledged through the API.

use std::sync::{Arc, Mutex};

use axum::{extract::State, http::StatusCode, routing::post, Json, Router};
use serde_json::json;
use sqlx::PgPool;

use crate::proxy::{charge_at_once, proxy_with_key, CHARGE};
use server::jobs::notifier::Notifier;

async fn alerts_of(pool: &PgPool, key_id: i64) -> Vec<(String, i16, i32)> {
    sqlx::query_as(
        "SELECT kind, threshold_pct, occurrences FROM alerts WHERE vault_key_id = $1 ORDER BY id",
    )
    .bind(key_id)
    .fetch_all(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn sixty_four_concurrent_charges_crossing_90_percent_raise_one_alert(pool: PgPool) {
    // 64 charges of 1,000 under a 70,000 cap: the 63rd takes it past 90 %.
    let (app, _stripe, key, key_id) = proxy_with_key(pool.clone(), 70_000).await;
    let statuses = charge_at_once(&app, &key, 64).await;
    assert!(statuses.iter().all(|s| *s == StatusCode::OK));
    assert_eq!(
        alerts_of(&pool, key_id).await,
        [("threshold".into(), 90, 1)]
    );

    // Further spend past the threshold raises nothing new.
    for _ in 0..3 {
        app.charge(&key, CHARGE).await;
    }
    assert_eq!(
        alerts_of(&pool, key_id).await,
        [("threshold".into(), 90, 1)]
    );
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn refusals_for_the_cap_raise_one_alert_and_count_the_rest(pool: PgPool) {
    let (app, _stripe, key, key_id) = proxy_with_key(pool.clone(), 1000).await;
    let statuses: Vec<StatusCode> =
        futures::future::join_all((0..3).map(|_| async { app.charge(&key, CHARGE).await.status }))
            .await;
    assert_eq!(statuses.iter().filter(|s| **s == StatusCode::OK).count(), 1);
    assert_eq!(
        alerts_of(&pool, key_id).await,
        [("threshold".into(), 90, 1), ("cap_refused".into(), 0, 2)]
    );
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_key_close_to_expiry_with_unspent_expected_billing_raises_one_alert(pool: PgPool) {
    let (_app, _stripe, _key, key_id) = proxy_with_key(pool.clone(), 5000).await;
    sqlx::query("UPDATE vault_keys SET expires_at = now() + interval '3 hours' WHERE id = $1")
        .bind(key_id)
        .execute(&pool)
        .await
        .unwrap();
    let raise = || app::alerts::sql::raise_expiring(&pool);
    assert_eq!(raise().await.unwrap(), 1);
    assert_eq!(raise().await.unwrap(), 0, "raised once");
    assert_eq!(alerts_of(&pool, key_id).await, [("expiring".into(), 0, 1)]);
}

/// A webhook receiver that answers `status` and keeps what it was sent.
pub(crate) async fn receiver(status: StatusCode) -> (String, Arc<Mutex<Vec<serde_json::Value>>>) {
    let received = Arc::new(Mutex::new(Vec::new()));
    let router = Router::new()
        .route(
            "/hook",
            post(
                move |State(received): State<Arc<Mutex<Vec<serde_json::Value>>>>,
                      Json(body): Json<serde_json::Value>| async move {
                    received.lock().unwrap().push(body);
                    status
                },
            ),
        )
        .with_state(received.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });
    (url, received)
}

/// The notifier of an instance given no webhook of its own (one of three
/// started without --alert-webhook used to claim alerts and send them to
/// nobody) delivers what it claims to the fleet's webhooks.
#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn whichever_instance_claims_an_alert_delivers_it_to_the_fleets_webhooks(pool: PgPool) {
    let (app, _stripe, key, _key_id) = proxy_with_key(pool.clone(), 1000).await;
    let (url, received) = receiver(StatusCode::OK).await;
    let configured = crate::helpers::notifier(&pool, &[&url]).await;
    let unconfigured = Notifier::new(pool.clone()).unwrap();
    app.charge(&key, CHARGE).await;

    let claimed = unconfigured.pass().await.unwrap();
    assert_eq!((claimed.planned, claimed.delivered), (1, 1));
    let after = configured.pass().await.unwrap();
    assert_eq!((after.planned, after.delivered), (0, 0));
    assert_eq!(received.lock().unwrap().len(), 1);
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn each_webhook_gets_one_delivery_and_a_failing_one_is_retried_later(pool: PgPool) {
    let (app, _stripe, key, key_id) = proxy_with_key(pool.clone(), 1000).await;
    app.charge(&key, CHARGE).await;
    let (good, good_received) = receiver(StatusCode::OK).await;
    let (down, down_received) = receiver(StatusCode::SERVICE_UNAVAILABLE).await;
    let notifier = crate::helpers::notifier(&pool, &[&good, &down]).await;

    let first = notifier.pass().await.unwrap();
    assert_eq!(
        (first.planned, first.delivered, first.failed_attempts),
        (2, 1, 1)
    );
    let second = notifier.pass().await.unwrap();
    assert_eq!(
        (second.planned, second.delivered, second.failed_attempts),
        (0, 0, 0),
        "nothing sent twice, the retry waits"
    );

    let sent = good_received.lock().unwrap().clone();
    assert_eq!(sent.len(), 1);
    assert!(
        sent[0]["text"].as_str().unwrap().contains(
            "billing-run-2026-07 passed 90 % of its cap: 10.00 USD of 10.00 USD committed."
        ),
        "{}",
        sent[0]
    );
    assert_eq!(sent[0]["event"], "alert.raised");
    assert_eq!(sent[0]["alert"]["vault_key_id"], key_id);
    assert_eq!(sent[0]["alert"]["threshold_pct"], 90);
    assert_eq!(down_received.lock().unwrap().len(), 1);

    let token = app.api_token().await;
    let listed = app
        .get_api(&format!("/api/alerts?key={key_id}"), &token)
        .await
        .json();
    assert_eq!(
        listed[0]["deliveries"],
        json!({ "delivered": 1, "pending": 1, "failed": 0 })
    );
    let (attempts, error): (i32, String) =
        sqlx::query_as("SELECT attempts, last_error FROM alert_deliveries WHERE state = 'pending'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(attempts, 1);
    assert!(error.contains("503"), "{error}");
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn on_call_tooling_lists_and_acknowledges_alerts_through_the_api(pool: PgPool) {
    let (app, _stripe, key, key_id) = proxy_with_key(pool.clone(), 1000).await;
    app.charge(&key, CHARGE).await;
    let token = app.api_token().await;

    let open = app.get_api("/api/alerts?state=open", &token).await;
    assert_eq!(open.status, StatusCode::OK);
    let alert = &open.json()[0];
    assert_eq!(alert["kind"], "threshold");
    assert_eq!(alert["state"], "open");
    let id = alert["id"].as_i64().unwrap();

    let acked = app
        .post_json(
            &format!("/api/alerts/{id}/ack"),
            &token,
            json!({ "note": "expected: month-end run" }),
        )
        .await;
    assert_eq!(acked.status, StatusCode::OK, "{}", acked.body);
    assert_eq!(acked.json()["state"], "acknowledged");
    assert_eq!(acked.json()["acknowledged_by"], "api token tests");
    assert_eq!(acked.json()["ack_note"], "expected: month-end run");

    let again = app
        .api("POST", &format!("/api/alerts/{id}/ack"), Some(&token), None)
        .await;
    assert_eq!(again.status, StatusCode::CONFLICT);
    assert_eq!(again.error_code(), "already_acknowledged");
    let open = app
        .get_api(&format!("/api/alerts?state=open&key={key_id}"), &token)
        .await;
    assert_eq!(open.json(), json!([]));
    let logged = crate::helpers::actions_logged(&pool, "alert.acknowledge").await;
    assert_eq!(logged, 1);
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn bad_alert_requests_get_clear_errors(pool: PgPool) {
    let app = crate::helpers::TestApp::new(pool);
    let token = app.api_token().await;
    for (path, code) in [
        ("/api/alerts?state=closed", "invalid_request"),
        ("/api/alerts?key=abc", "invalid_request"),
        ("/api/alerts?limit=100000", "invalid_request"),
        (
            "/api/alerts?key=1%27%3B%20DROP%20TABLE%20alerts",
            "invalid_request",
        ),
    ] {
        let response = app.get_api(path, &token).await;
        assert_eq!(response.status, StatusCode::BAD_REQUEST, "{path}");
        assert_eq!(response.error_code(), code, "{path}");
    }
    let unknown = app
        .api("POST", "/api/alerts/999/ack", Some(&token), None)
        .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    let malformed = app
        .post_json("/api/alerts/999/ack", &token, json!({ "note": 5 }))
        .await;
    assert_eq!(malformed.status, StatusCode::BAD_REQUEST);
    let anonymous = app.api("GET", "/api/alerts", None, None).await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
}

/// A key past 90 % (one alert), and the operator's session cookie.
async fn console_with_an_alert(
    pool: &PgPool,
    role: app::domain::Role,
) -> (crate::helpers::TestApp, String, i64) {
    let (app, _stripe, key, _) = proxy_with_key(pool.clone(), 1000).await;
    app.charge(&key, CHARGE).await;
    let cookie = app.signed_in("ops@example.com", role).await;
    let id = crate::helpers::count(pool, "SELECT id FROM alerts").await;
    (app, cookie, id)
}

async fn alert_state(pool: &PgPool, id: i64) -> (Option<i64>, bool, bool) {
    sqlx::query_as(
        "SELECT assigned_to, COALESCE(snoozed_until > now(), false), acknowledged_at IS NOT NULL FROM alerts WHERE id = $1",
    )
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn an_operator_assigns_snoozes_and_acknowledges_an_alert_from_the_page(pool: PgPool) {
    use app::domain::Role;
    let (app, cookie, id) = console_with_an_alert(&pool, Role::Operator).await;
    let me = crate::helpers::count(
        &pool,
        "SELECT id FROM operators WHERE email = 'ops@example.com'",
    )
    .await;

    let page = app.get("/alerts", Some(&cookie)).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains("90 % of cap"), "{}", page.body);
    assert!(page
        .body
        .contains("billing-run-2026-07 passed 90 % of its cap: 10.00 USD of 10.00 USD committed."));
    assert!(
        page.body.contains(r#"aria-label="1 open""#),
        "the navigation shows the open count"
    );

    let assigned = app
        .post_form(
            &format!("/alerts/{id}/assign"),
            &format!("operator={me}"),
            Some(&cookie),
        )
        .await;
    assert_eq!(assigned.status, StatusCode::SEE_OTHER);
    assert!(app
        .get("/alerts", Some(&cookie))
        .await
        .body
        .contains("Assigned the alert on billing-run-2026-07 to ops@example.com."));
    assert_eq!(alert_state(&pool, id).await, (Some(me), false, false));

    app.post_form(&format!("/alerts/{id}/snooze"), "hours=4", Some(&cookie))
        .await;
    assert_eq!(alert_state(&pool, id).await, (Some(me), true, false));
    let snoozed = app.get("/alerts?state=snoozed", Some(&cookie)).await;
    assert!(
        snoozed.body.contains(&format!("data-alert=\"{id}\"")),
        "{}",
        snoozed.body
    );
    assert!(
        !app.get("/alerts", Some(&cookie))
            .await
            .body
            .contains(&format!("data-alert=\"{id}\"")),
        "no longer open"
    );

    app.post_form(
        &format!("/alerts/{id}/ack"),
        "note=month-end+run%2C+expected",
        Some(&cookie),
    )
    .await;
    assert_eq!(alert_state(&pool, id).await, (Some(me), false, true));
    let done = app.get("/alerts?state=acknowledged", Some(&cookie)).await;
    assert!(done.body.contains("Note: month-end run, expected"));
    assert!(done.body.contains("by ops@example.com at"));

    let logged: Vec<String> = sqlx::query_scalar(
        "SELECT action FROM operator_actions WHERE action LIKE 'alert.%' ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        logged,
        ["alert.assign", "alert.snooze", "alert.acknowledge"]
    );
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn bad_alert_forms_explain_and_change_nothing(pool: PgPool) {
    use app::domain::Role;
    let (app, cookie, id) = console_with_an_alert(&pool, Role::Operator).await;
    let viewer = app.add_operator("viewer@example.com", Role::Viewer).await;
    for (path, body, message) in [
        (
            format!("/alerts/{id}/snooze"),
            "hours=0".to_owned(),
            "snooze for 1 to 168 hours",
        ),
        (
            format!("/alerts/{id}/snooze"),
            "hours=%3Cb%3E".to_owned(),
            "snooze for 1 to 168 hours",
        ),
        (
            format!("/alerts/{id}/assign"),
            format!("operator={viewer}"),
            "only to active operators",
        ),
        (
            format!("/alerts/{id}/assign"),
            "operator=x%27%3B".to_owned(),
            "is not an operator",
        ),
        (
            format!("/alerts/{id}/ack"),
            format!("note={}", "n".repeat(2001)),
            "longer than 2,000",
        ),
        (
            "/alerts/999/ack".to_owned(),
            String::new(),
            "That alert no longer exists.",
        ),
    ] {
        let response = app.post_form(&path, &body, Some(&cookie)).await;
        assert_eq!(response.status, StatusCode::SEE_OTHER, "{path} {body}");
        let page = app.get("/alerts", Some(&cookie)).await;
        assert!(page.body.contains(message), "{path} {body}: {}", page.body);
    }
    assert_eq!(alert_state(&pool, id).await, (None, false, false));

    app.post_form(&format!("/alerts/{id}/ack"), "", Some(&cookie))
        .await;
    app.post_form(&format!("/alerts/{id}/ack"), "", Some(&cookie))
        .await;
    let page = app.get("/alerts", Some(&cookie)).await;
    assert!(page.body.contains("already acknowledged"), "{}", page.body);
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_viewer_reads_alerts_but_cannot_act_on_them(pool: PgPool) {
    let (app, cookie, id) = console_with_an_alert(&pool, app::domain::Role::Viewer).await;
    let page = app.get("/alerts", Some(&cookie)).await;
    assert!(page.body.contains(&format!("data-alert=\"{id}\"")));
    assert!(
        !page.body.contains(&format!("/alerts/{id}/ack")),
        "no actions for a viewer: {}",
        page.body
    );
    let refused = app
        .post_form(&format!("/alerts/{id}/ack"), "", Some(&cookie))
        .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    assert_eq!(alert_state(&pool, id).await, (None, false, false));
}
