//! The keys list (filters, sorting, search), a key's page (utilization,
//! chart, calls, revoke) and the overview, against real proxy traffic.

use axum::http::StatusCode;
use serde_json::json;
use sqlx::PgPool;

use crate::{
    helpers::{enc, TestApp},
    proxy::{charge_at_once, proxy_with_key},
};
use app::domain::Role;

/// A key made through the key API: (id, secret).
async fn key(
    app: &TestApp,
    token: &str,
    label: &str,
    period: &str,
    cap_cents: i64,
) -> (i64, String) {
    let body = json!({
        "label": label, "billing_period": period, "expected_total_cents": cap_cents,
        "cap_cents": cap_cents, "allowed_endpoints": ["POST /v1/charges"],
        "expires_at": crate::helpers::in_a_month(),
    });
    let created = app.post_json("/vault/keys", token, body).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    let created = created.json();
    (
        created["id"].as_i64().unwrap(),
        created["vault_key"].as_str().unwrap().to_owned(),
    )
}

/// The labels of the keys list's rows, in order.
fn labels(body: &str) -> Vec<String> {
    body.split("<tr data-key=")
        .skip(1)
        .filter_map(|row| {
            let link = row.split("<a href=\"/keys/").nth(1)?;
            link.split_once("\">")?
                .1
                .split('<')
                .next()
                .map(str::to_owned)
        })
        .collect()
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_keys_page_shows_its_spend_calls_and_chart(pool: PgPool) {
    // Cap 5,000 cents, charges of 1,000: five allowed, then refused.
    let (app, _stripe, secret, id) = proxy_with_key(pool.clone(), 5_000).await;
    let statuses = charge_at_once(&app, &secret, 6).await;
    assert_eq!(statuses.iter().filter(|s| s.is_success()).count(), 5);
    let cookie = app.signed_in("viewer@example.com", Role::Viewer).await;

    let page = app.get(&format!("/keys/{id}"), Some(&cookie)).await;
    assert_eq!(page.status, StatusCode::OK);
    let body = &page.body;
    assert!(
        body.contains(r#"<svg role="img" aria-label="Cumulative spend"#),
        "chart drawn on the server"
    );
    assert!(body.contains(r#"value="100""#), "the meter is full: {body}");
    assert!(
        body.contains("Refused: over the cap</td><td class=\"num\">1</td>"),
        "{body}"
    );
    assert!(
        body.contains("Allowed</td><td class=\"num\">5</td>"),
        "{body}"
    );
    assert_eq!(
        body.matches("<code>POST /v1/charges</code>").count(),
        6 + 1,
        "latest calls and the endpoint list"
    );
    assert!(!body.contains("Revoke this key"), "viewers cannot revoke");
    assert!(
        body.contains(&format!(r#"href="/audit.csv?key={id}""#)),
        "the key's CSV"
    );
    assert!(
        body.contains(&format!(r#"href="/audit?key={id}""#)),
        "its calls in the audit log"
    );

    let spent: i64 = sqlx::query_scalar(
        "SELECT sum(spent_cents)::bigint FROM call_stats WHERE vault_key_id = $1",
    )
    .bind(id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(spent, 5_000, "the counters agree with the key's spend");

    let missing = app.get("/keys/999999", Some(&cookie)).await;
    assert!(missing.body.contains("Vault key not found"));
    let nonsense = app.get("/keys/abc", Some(&cookie)).await;
    assert!(nonsense.body.contains("Vault key not found"));
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn the_keys_list_filters_sorts_and_searches(pool: PgPool) {
    let (app, _stripe, secret, _) = proxy_with_key(pool.clone(), 5_000).await;
    charge_at_once(&app, &secret, 5).await; // billing-run-2026-07 is full.
    let token = app.api_token().await;
    key(&app, &token, "eu-enterprise", "2026-08", 900_000).await;
    let (small, _) = key(&app, &token, "100%_backfill", "2026-08", 100).await;
    let cookie = app.signed_in("ops@example.com", Role::Operator).await;
    app.post_form(
        &format!("/keys/{small}/revoke"),
        "reason=replanned&confirm=yes",
        Some(&cookie),
    )
    .await;

    let list = |query: &str| {
        let (app, cookie) = (&app, cookie.clone());
        let path = format!("/keys{query}");
        async move { app.get(&path, Some(&cookie)).await.body }
    };
    let all = list("").await;
    assert_eq!(
        labels(&all),
        ["100%_backfill", "eu-enterprise", "billing-run-2026-07"]
    );
    assert_eq!(
        labels(&list("?period=2026-08").await),
        ["100%_backfill", "eu-enterprise"]
    );
    assert_eq!(labels(&list("?status=revoked").await), ["100%_backfill"]);
    assert_eq!(
        labels(&list("?status=active&sort=cap&dir=asc").await),
        ["billing-run-2026-07", "eu-enterprise"]
    );
    assert_eq!(
        labels(&list("?at_threshold=1").await),
        ["billing-run-2026-07"]
    );
    assert_eq!(labels(&list("?q=ENTER").await), ["eu-enterprise"]);
    // LIKE wildcards in the search match themselves only.
    assert_eq!(
        labels(&list(&format!("?q={}", enc("0%_"))).await),
        ["100%_backfill"]
    );
    assert_eq!(labels(&list("?q=%25").await), ["100%_backfill"]);

    let sorted = list("?sort=utilization").await;
    assert_eq!(labels(&sorted)[0], "billing-run-2026-07");
    assert!(sorted.contains(r#"aria-sort="descending""#));
    assert!(
        sorted.contains(r#"href="/keys?sort=utilization&amp;dir=asc""#),
        "the same header flips the order"
    );

    let filtered_out = list("?q=nothing-like-this").await;
    assert!(filtered_out.contains("No vault keys match these filters."));
    for (query, named) in [
        ("?status=deleted", "\"deleted\" is not a key status"),
        ("?period=2026-13", "2026-13"),
        (
            "?sort=secret_hash",
            "\"secret_hash\" is not a column to sort by",
        ),
        ("?page=0", "\"0\" is not a page number"),
        ("?q=%3Cscript%3E", "No vault keys match"),
    ] {
        let body = list(query).await;
        assert!(
            body.contains(&named.replace('"', "&quot;")) || body.contains(named),
            "{query}: {body}"
        );
        assert!(!body.contains("<script>"), "{query}: the search is escaped");
        assert!(
            body.contains(r#"aria-label="Filter vault keys""#),
            "{query}: the filters stay usable"
        );
    }
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn revoking_needs_a_reason_and_a_confirmation_and_an_operator(pool: PgPool) {
    let (app, _stripe, secret, id) = proxy_with_key(pool.clone(), 5_000).await;
    let path = format!("/keys/{id}/revoke");
    let revoked = || async {
        sqlx::query_scalar::<_, bool>("SELECT revoked_at IS NOT NULL FROM vault_keys WHERE id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap()
    };

    let viewer = app.signed_in("viewer@example.com", Role::Viewer).await;
    let refused = app
        .post_form(&path, "reason=x&confirm=yes", Some(&viewer))
        .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);

    let ops = app.signed_in("ops@example.com", Role::Operator).await;
    let page = app.get(&format!("/keys/{id}"), Some(&ops)).await;
    assert!(page.body.contains("Revoke this key"));
    for (form, message) in [
        ("reason=queue+replayed", "tick the box to confirm"),
        ("reason=+&confirm=yes", "say why the key is revoked"),
    ] {
        let answer = app.post_form(&path, form, Some(&ops)).await;
        assert_eq!(answer.location(), format!("/keys/{id}"));
        let shown = app.get(&format!("/keys/{id}"), Some(&ops)).await;
        assert!(shown.body.contains(message), "{form}: {}", shown.body);
        assert!(!revoked().await, "{form}: nothing changed");
    }

    app.post_form(&path, "reason=queue+replayed&confirm=yes", Some(&ops))
        .await;
    assert!(revoked().await);
    let shown = app.get(&format!("/keys/{id}"), Some(&ops)).await;
    assert!(
        shown.body.contains("Reason: queue replayed"),
        "{}",
        shown.body
    );
    assert!(!shown.body.contains("Revoke this key"), "revoked once");
    let action: String = sqlx::query_scalar(
        "SELECT details->>'reason' FROM operator_actions WHERE action = 'revoke_vault_key'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(action, "queue replayed");
    let again = app
        .post_form(&path, "reason=twice&confirm=yes", Some(&ops))
        .await;
    assert_eq!(again.location(), format!("/keys/{id}"));
    assert!(app
        .get(&format!("/keys/{id}"), Some(&ops))
        .await
        .body
        .contains("already revoked"));

    let charge = charge_at_once(&app, &secret, 1).await;
    assert_eq!(
        charge,
        [StatusCode::UNAUTHORIZED],
        "the proxy refuses a revoked key at once"
    );
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn the_overview_counts_keys_near_their_caps_alerts_and_refusals(pool: PgPool) {
    let (app, _stripe, _, _) = proxy_with_key(pool.clone(), 5_000).await;
    let token = app.api_token().await;
    let period = app::domain::BillingPeriod::containing(chrono::Utc::now()).to_string();
    let (_, secret) = key(&app, &token, "this-month", &period, 5_000).await;
    let statuses = charge_at_once(&app, &secret, 7).await;
    assert_eq!(statuses.iter().filter(|s| !s.is_success()).count(), 2);
    let cookie = app.signed_in("viewer@example.com", Role::Viewer).await;

    let body = app.get("/", Some(&cookie)).await.body;
    let figure = |name: &str| {
        body.split(&format!("data-figure=\"{name}\""))
            .nth(1)
            .and_then(|rest| rest.split_once('>')?.1.split('<').next())
            .unwrap_or_else(|| panic!("{name} is shown: {body}"))
            .to_owned()
    };
    assert_eq!(figure("at-threshold"), "1");
    assert_eq!(figure("refused-24h"), "2");
    assert_eq!(
        figure("open-alerts"),
        "2",
        "the 90 % crossing and the cap refusals"
    );
    assert!(
        body.contains(r#"aria-label="Daily spend per key""#),
        "the daily chart is drawn"
    );
    assert!(
        body.contains(">this-month</a>"),
        "the chart's legend names the key"
    );
}
