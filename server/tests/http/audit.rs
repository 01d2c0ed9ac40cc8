//! The audit log browser, one call's page and the CSV export.

use axum::http::StatusCode;
use http_body_util::BodyExt;
use sqlx::PgPool;

use crate::helpers::{enc, TestApp};
use app::{
    audit::csv::neutralise,
    domain::{Cents, Currency, Role},
};

/// `count` audited calls a second apart, newest last: customers
/// `cust_0`…`cust_6` in turn, every third refused at the cap, key 1 (whose
/// label is a spreadsheet formula). Returns the key's id.
async fn calls(pool: &PgPool, count: i32) -> i64 {
    let key = crate::helpers::count(
        pool,
        "INSERT INTO vault_keys (secret_hash, secret_prefix, label, billing_period, currency,
             expected_total_cents, cap_cents, allowed_endpoints, expires_at)
         VALUES ('\\x01', 'vk_audit', '=HYPERLINK(\"x\")', '2026-11', 'usd', 100000, 110000,
                 ARRAY['POST /v1/charges'], now() + interval '30 days')
         RETURNING id",
    )
    .await;
    sqlx::query(
        "INSERT INTO audit_log (at, request_id, vault_key_id, key_prefix, method, path,
             metadata_customer_id, billing_period, amount_cents, currency, idempotency_key,
             decision, upstream_status)
         SELECT timestamptz '2026-11-30 12:00:00+00' + make_interval(secs => n), gen_random_uuid(),
                $1, 'vk_audit', 'POST', '/v1/charges', 'cust_' || n % 7, '2026-11', 1000 + n, 'usd',
                'bill-' || n, CASE WHEN n % 3 = 0 THEN 'refused_cap' ELSE 'allowed' END,
                CASE WHEN n % 3 = 0 THEN NULL ELSE 200 END
         FROM generate_series(1, $2) AS n",
    )
    .bind(key)
    .bind(count)
    .execute(pool)
    .await
    .unwrap();
    key
}

/// The ids of the calls listed on an audit page, in order.
fn listed(body: &str) -> Vec<i64> {
    body.split("data-call=\"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next()?.parse().ok())
        .collect()
}

/// The href of the pager link with `rel`.
fn link(body: &str, rel: &str) -> Option<String> {
    let tag = body
        .split("<a ")
        .skip(1)
        .map(|rest| rest.split('>').next().unwrap_or(""))
        .find(|tag| tag.contains(&format!("rel=\"{rel}\"")))?;
    let href = tag.split("href=\"").nth(1)?.split('"').next()?;
    Some(href.replace("&amp;", "&"))
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn pages_go_back_and_forth_in_a_stable_newest_first_order(pool: PgPool) {
    calls(&pool, 120).await;
    let app = TestApp::new(pool.clone());
    let cookie = app.signed_in("auditor@example.com", Role::Viewer).await;

    let mut seen: Vec<i64> = Vec::new();
    let mut pages = Vec::new();
    let mut next = Some("/audit?limit=25".to_owned());
    while let Some(path) = next {
        let body = app.get(&path, Some(&cookie)).await.body;
        let ids = listed(&body);
        assert!(ids.len() <= 25, "{path}");
        seen.extend(&ids);
        next = link(&body, "next");
        pages.push((path, body));
    }
    let all: Vec<i64> = sqlx::query_scalar("SELECT id FROM audit_log ORDER BY at DESC, id DESC")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(seen, all, "every call once, newest first");
    assert_eq!(pages.len(), 5);

    // Back from the third page is the second page exactly.
    let back = link(&pages[2].1, "prev").expect("a newer page");
    assert_eq!(
        listed(&app.get(&back, Some(&cookie)).await.body),
        listed(&pages[1].1)
    );
    assert!(
        link(&pages[0].1, "prev").is_none(),
        "nothing is newer than the first page"
    );
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn filters_show_exactly_the_matching_calls(pool: PgPool) {
    calls(&pool, 120).await;
    let app = TestApp::new(pool.clone());
    let cookie = app.signed_in("auditor@example.com", Role::Viewer).await;

    let body = app
        .get(
            "/audit?customer_id=cust_3&decision=refused_cap&limit=200",
            Some(&cookie),
        )
        .await
        .body;
    let expected: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM audit_log WHERE metadata_customer_id = 'cust_3' AND decision = 'refused_cap'
         ORDER BY at DESC, id DESC",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(!expected.is_empty());
    assert_eq!(listed(&body), expected);
    assert!(
        body.contains(r#"value="cust_3""#),
        "the form keeps the filter"
    );

    let range = app
        .get(
            &format!(
                "/audit?from={}&to={}&currency=usd&min_amount=10.10&max_amount=10.12",
                enc("2026-11-30T12:00:05"),
                enc("2026-11-30T12:01")
            ),
            Some(&cookie),
        )
        .await
        .body;
    assert_eq!(listed(&range).len(), 3, "amounts 10.10 to 10.12 USD");
    let refused = app
        .get("/audit?decision=refused&limit=200", Some(&cookie))
        .await
        .body;
    assert_eq!(listed(&refused).len(), 40);
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn bad_filters_explain_themselves_and_never_fail_the_page(pool: PgPool) {
    calls(&pool, 5).await;
    let app = TestApp::new(pool.clone());
    let cookie = app.signed_in("auditor@example.com", Role::Viewer).await;
    for (query, message) in [
        ("from=yesterday", "\"yesterday\" is not a time"),
        (
            "from=2026-12-02&to=2026-12-01",
            "the time range ends before it starts",
        ),
        ("decision=approved", "\"approved\" is not a decision"),
        ("limit=1000000", "\"1000000\" is not a page size"),
        ("currency=usd&min_amount=-5", "negative"),
        ("min_amount=5", "choose the currency the amounts are in"),
        ("after=9999999999999999999.1", "the page link is damaged"),
        (
            "key=1%3B%20DROP%20TABLE%20audit_log",
            "is not a vault key id",
        ),
        ("status=abc", "\"abc\" is not an HTTP status"),
    ] {
        let page = app.get(&format!("/audit?{query}"), Some(&cookie)).await;
        assert_eq!(page.status, StatusCode::OK, "{query}");
        assert!(page.body.contains(message), "{query}: {}", page.body);
        assert!(
            page.body.contains(r#"aria-label="Filter the audit log""#),
            "{query}: the form stays"
        );
    }
    let html = app
        .get(
            &format!(
                "/audit?customer_id={}",
                enc("<script>alert(1)</script>' OR 1=1 --")
            ),
            Some(&cookie),
        )
        .await
        .body;
    assert!(html.contains("No calls match these filters."));
    assert!(!html.contains("<script>alert(1)"), "escaped");
    let count = crate::helpers::count(&pool, "SELECT count(*) FROM audit_log").await;
    assert_eq!(count, 5, "nothing was touched");
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_calls_page_shows_everything_and_links_to_related_calls(pool: PgPool) {
    let key = calls(&pool, 3).await;
    let app = TestApp::new(pool.clone());
    let cookie = app.signed_in("auditor@example.com", Role::Viewer).await;
    let id = crate::helpers::count(
        &pool,
        "SELECT id FROM audit_log WHERE idempotency_key = 'bill-3'",
    )
    .await;
    let body = app.get(&format!("/audit/{id}"), Some(&cookie)).await.body;
    assert!(
        body.contains("POST /v1/charges · Refused: over the cap"),
        "{body}"
    );
    assert!(body.contains("href=\"/audit?idempotency_key=bill-3\""));
    assert!(body.contains("href=\"/audit?customer_id=cust_3\""));
    assert!(body.contains(&format!("href=\"/keys/{key}\"")));
    assert!(app
        .get("/audit/999999", Some(&cookie))
        .await
        .body
        .contains("Call not found"));
}

/// The CSV's rows (header first), parsed with the csv crate.
fn parse_csv(text: &str) -> Vec<Vec<String>> {
    csv::ReaderBuilder::new()
        .has_headers(false)
        .from_reader(text.as_bytes())
        .records()
        .map(|r| r.unwrap().iter().map(str::to_owned).collect())
        .collect()
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn the_csv_has_exactly_the_filtered_calls_neutralised_and_is_recorded(pool: PgPool) {
    calls(&pool, 120).await;
    let app = TestApp::new(pool.clone());
    let cookie = app.signed_in("auditor@example.com", Role::Viewer).await;

    let export = app
        .get(
            "/audit.csv?customer_id=cust_3&decision=refused_cap&after=1.1",
            Some(&cookie),
        )
        .await;
    assert_eq!(export.status, StatusCode::OK);
    assert_eq!(export.headers["content-type"], "text/csv; charset=utf-8");
    let disposition = export.headers["content-disposition"].to_str().unwrap();
    assert!(
        disposition.contains("-customer_id-cust_3-decision-refused_cap.csv"),
        "{disposition}"
    );
    let rows = parse_csv(&export.body);
    assert_eq!(rows[0][..3], ["id", "at_utc", "vault_key_id"]);
    let ids: Vec<i64> = rows[1..].iter().map(|r| r[0].parse().unwrap()).collect();
    let expected: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM audit_log WHERE metadata_customer_id = 'cust_3' AND decision = 'refused_cap'
         ORDER BY at DESC, id DESC",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        ids, expected,
        "the page position does not narrow the export"
    );
    let first = &rows[1];
    assert_eq!(
        first[3], "'=HYPERLINK(\"x\")",
        "the formula arrives as text"
    );
    assert!(first[1].ends_with('Z') && first[1].starts_with("2026-11-30T12:"));
    assert_eq!(
        first[11],
        format!(
            "{}.{:02}",
            first[10].parse::<i64>().unwrap() / 100,
            first[10].parse::<i64>().unwrap() % 100
        )
    );

    let (details,): (serde_json::Value,) =
        sqlx::query_as("SELECT details FROM operator_actions WHERE action = 'export_audit_csv'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(details["rows"], expected.len());
    assert_eq!(details["cancelled"], false);
    assert_eq!(details["filter"], "customer_id=cust_3&decision=refused_cap");

    let bad = app.get("/audit.csv?from=yesterday", Some(&cookie)).await;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(bad.body.contains("is not a time"), "{}", bad.body);
    assert_eq!(
        app.get("/audit.csv", None).await.status,
        StatusCode::SEE_OTHER,
        "sign in first"
    );
}

/// Cells a spreadsheet, a CSV parser or SQL quoting could get wrong, each
/// exported as the page shows them: PostgreSQL writes the file, and must
/// write what `neutralise` and `Cents::decimal` would.
#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn the_export_writes_odd_cells_as_the_rules_say_and_filters_hold_against_quotes(
    pool: PgPool,
) {
    let key = calls(&pool, 1).await;
    let odd = [
        // (customer id, idempotency key, amount, currency)
        ("-1+1", "it's \"quoted\", with a comma", 123456, "jpy"),
        ("@SUM(A1)", "two\nlines", 5, "usd"),
        ("\tlead", "back\\slash", 250, "EUR"),
        ("", "=1+1", 9223372036854775807, "bhd"),
        ("o'brien", "", 0, "us"),
        ("ünïcødé", "\rcarriage", 100, " usd "),
    ];
    for (customer, idempotency_key, amount, currency) in odd {
        sqlx::query(
            "INSERT INTO audit_log (request_id, vault_key_id, key_prefix, method, path,
                 metadata_customer_id, amount_cents, currency, idempotency_key, decision)
             VALUES (gen_random_uuid(), $1, 'vk_audit', 'POST', '/v1/charges', $2, $3, $4, $5, 'allowed')",
        )
        .bind(key)
        .bind(customer)
        .bind(amount)
        .bind(currency)
        .bind(idempotency_key)
        .execute(&pool)
        .await
        .unwrap();
    }
    let app = TestApp::new(pool.clone());
    let cookie = app.signed_in("auditor@example.com", Role::Viewer).await;
    let export = app.get("/audit.csv", Some(&cookie)).await;
    assert_eq!(export.status, StatusCode::OK, "{}", export.body);
    let rows = parse_csv(&export.body);
    assert_eq!(rows[0], app::audit::csv::HEADER);
    for (customer, idempotency_key, amount, currency) in odd {
        let row = rows
            .iter()
            .find(|r| r[13] == neutralise(idempotency_key))
            .unwrap_or_else(|| panic!("no row for {idempotency_key:?}: {rows:?}"));
        assert_eq!(row.len(), 19);
        assert_eq!(row[3], "'=HYPERLINK(\"x\")");
        assert_eq!(row[8], neutralise(customer), "{row:?}");
        assert_eq!(row[10], amount.to_string());
        let parsed = Currency::parse(currency).ok();
        assert_eq!(row[12], parsed.as_ref().map_or("", |c| c.as_str()));
        let decimal = parsed.map_or(String::new(), |c| Cents(amount).decimal(&c));
        assert_eq!(row[11], decimal, "{row:?}");
        assert!(row[1].ends_with('Z') && row[1].len() == 27, "{}", row[1]);
    }

    // A filter value is a literal in the COPY: quotes and backslashes in
    // it match exactly, and change nothing else.
    for (customer, expected) in [
        ("o'brien", 1),
        ("'; SELECT 1; --", 0),
        ("x\\' OR true --", 0),
    ] {
        let url = format!("/audit.csv?customer_id={}", enc(customer));
        let export = app.get(&url, Some(&cookie)).await;
        assert_eq!(export.status, StatusCode::OK, "{customer}: {}", export.body);
        assert_eq!(parse_csv(&export.body).len(), 1 + expected, "{customer}");
    }
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn the_api_exports_with_a_token_and_refuses_bad_filters_with_400(pool: PgPool) {
    calls(&pool, 10).await;
    let app = TestApp::new(pool.clone());
    let token = app.api_token().await;
    let unauthenticated = app.api("GET", "/api/audit.csv", None, None).await;
    assert_eq!(unauthenticated.status, StatusCode::UNAUTHORIZED);
    let bad = app
        .get_api("/api/audit.csv?limit=5&decision=nope", &token)
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert!(bad.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("\"nope\" is not a decision"));
    let good = app.get_api("/api/audit.csv?decision=allowed", &token).await;
    assert_eq!(good.status, StatusCode::OK);
    assert_eq!(parse_csv(&good.body).len(), 1 + 7);
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_cancelled_download_stops_its_query(pool: PgPool) {
    calls(&pool, 200_000).await;
    let app = TestApp::new(pool.clone());
    let cookie = app.signed_in("auditor@example.com", Role::Viewer).await;
    let request = axum::http::Request::get("/audit.csv")
        .header("host", "localhost")
        .header("cookie", &cookie)
        .body(axum::body::Body::empty())
        .unwrap();
    let response = tower::ServiceExt::oneshot(app.router.clone(), request)
        .await
        .unwrap();
    let mut body = response.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert!(first.data_ref().unwrap().starts_with(b"id,at_utc"));
    drop(body);

    // The export records itself once its query has stopped.
    let recorded = async {
        loop {
            let found: Option<serde_json::Value> = sqlx::query_scalar(
                "SELECT details FROM operator_actions WHERE action = 'export_audit_csv'",
            )
            .fetch_optional(&pool)
            .await
            .unwrap();
            match found {
                Some(details) => return details,
                None => tokio::task::yield_now().await,
            }
        }
    };
    let details = tokio::time::timeout(std::time::Duration::from_secs(30), recorded)
        .await
        .expect("the cancelled export was recorded");
    assert_eq!(details["cancelled"], true);
    assert!(details["rows"].as_u64().unwrap() < 200_000);
    let running = crate::helpers::count(
        &pool,
        "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND state = 'active'
           AND query LIKE '%FROM audit_log a LEFT JOIN vault_keys%' AND pid <> pg_backend_pid()",
    )
    .await;
    assert_eq!(running, 0, "the query was cancelled, not left running");
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn the_action_log_shows_who_did_what_filtered_and_paged(pool: PgPool) {
    calls(&pool, 3).await;
    let app = TestApp::new(pool.clone());
    let ops = app.signed_in("ops@example.com", Role::Operator).await;
    let key = crate::helpers::count(&pool, "SELECT id FROM vault_keys").await;
    app.post_form(
        &format!("/keys/{key}/revoke"),
        "reason=rotated&confirm=yes",
        Some(&ops),
    )
    .await;
    app.get("/audit.csv?decision=allowed", Some(&ops)).await;

    let all = app.get("/actions", Some(&ops)).await.body;
    // Each entry reads as a phrase, with what it touched linked.
    assert!(
        all.contains(&format!(r#"Revoked vault key <a href="/keys/{key}">"#)),
        "{all}"
    );
    assert!(all.contains("Exported the audit log as CSV"));
    assert!(
        !all.contains("{&quot;") && !all.contains("revoke_vault_key</td>"),
        "no raw JSON or stored names in the table"
    );
    let revokes = app
        .get(
            "/actions?action=revoke_vault_key&operator=OPS%40example.com",
            Some(&ops),
        )
        .await
        .body;
    assert_eq!(revokes.matches("data-action=").count(), 1, "{revokes}");
    assert!(
        revokes.contains("<dt>Reason</dt><dd>rotated</dd>"),
        "{revokes}"
    );

    let paged = app.get("/actions?limit=25", Some(&ops)).await.body;
    assert!(
        link(&paged, "next").is_none(),
        "a handful of actions fit one page"
    );
    for (query, message) in [
        ("via=email", "\"email\" is not a source"),
        ("action=x%27%3B", "is not an action name"),
    ] {
        let body = app.get(&format!("/actions?{query}"), Some(&ops)).await.body;
        assert!(body.contains(message), "{query}: {body}");
    }
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn amounts_are_filtered_in_the_decimals_of_the_currency_named(pool: PgPool) {
    calls(&pool, 3).await;
    // One yen call of 500: 500 in JPY's minor unit, where USD's 500.00 is 50,000.
    let yen = crate::helpers::count(
        &pool,
        "INSERT INTO audit_log (request_id, method, path, amount_cents, currency, decision)
         VALUES (gen_random_uuid(), 'POST', '/v1/charges', 500, 'jpy', 'allowed') RETURNING id",
    )
    .await;
    let app = TestApp::new(pool);
    let cookie = app.signed_in("auditor@example.com", Role::Viewer).await;
    let page = |query: &'static str| {
        let (app, cookie) = (&app, cookie.clone());
        async move { app.get(&format!("/audit?{query}"), Some(&cookie)).await }
    };
    let found = page("currency=jpy&min_amount=500&max_amount=500").await;
    assert_eq!(listed(&found.body), vec![yen]);
    // The same figures in dollars are 50,000 cents: no call that large.
    let dollars = page("currency=usd&min_amount=500&max_amount=500").await;
    assert!(listed(&dollars.body).is_empty());
    let yen_decimals = page("currency=jpy&min_amount=5.5").await;
    assert!(yen_decimals.body.contains("JPY has no decimals"));
}
