//! Creating a vault key from an expected total in the console.

use axum::http::StatusCode;
use sqlx::PgPool;

use crate::helpers::{enc, one_time_secret, TestApp};
use app::domain::Role;

const GOOD: &[(&str, &str)] = &[
    ("period", "2026-12"),
    ("currency", "usd"),
    ("expected_total", "5,000.00"),
    ("buffer_pct", "10"),
    ("endpoint", "POST /v1/charges"),
    ("endpoint", "POST /v1/payment_intents"),
    ("custom_endpoints", "GET /v1/charges/{id}"),
    ("expires_at", "2026-12-31T23:59"),
    ("label", "billing-run-2026-12"),
    ("thresholds", "75, 90"),
];

fn form(fields: &[(&str, &str)]) -> String {
    fields
        .iter()
        .map(|(name, value)| format!("{name}={}", enc(value)))
        .collect::<Vec<_>>()
        .join("&")
}

pub(crate) fn with(changes: &[(&str, &str)]) -> String {
    let fields: Vec<(&str, &str)> = GOOD
        .iter()
        .map(|(name, value)| {
            let changed = changes.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
            (*name, changed.unwrap_or(value))
        })
        .collect();
    form(&fields)
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn an_operator_creates_a_key_from_an_expected_total_and_sees_its_secret_once(pool: PgPool) {
    let app = TestApp::new(pool.clone());
    let cookie = app.signed_in("ops@example.com", Role::Operator).await;

    let page = app.get("/keys/new", Some(&cookie)).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(
        page.body.contains(r#"value="billing-run-"#),
        "label prefilled"
    );

    let created = app.post_form("/keys", &form(GOOD), Some(&cookie)).await;
    assert_eq!(created.status, StatusCode::SEE_OTHER);
    assert_eq!(created.location(), "/keys");
    let list = app.get("/keys", Some(&created.revealing(&cookie))).await;
    assert!(
        list.body
            .contains("Created billing-run-2026-12 for 2026-12: cap 5,500.00 USD."),
        "{}",
        list.body
    );
    let secret = one_time_secret(&list.body).expect("the secret is on the page");
    assert!(secret.starts_with("vk_"));
    assert!(
        !app.get("/keys", Some(&cookie)).await.body.contains(&secret),
        "shown once"
    );

    let (cap, expected, endpoints, thresholds, expires): (i64, i64, Vec<String>, Vec<i16>, String) =
        sqlx::query_as(
            "SELECT cap_cents, expected_total_cents, allowed_endpoints, alert_thresholds_pct,
                to_char(expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI') FROM vault_keys",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!((cap, expected), (550_000, 500_000));
    assert_eq!(
        endpoints,
        [
            "GET /v1/charges/{id}",
            "POST /v1/charges",
            "POST /v1/payment_intents"
        ]
    );
    assert_eq!(thresholds, [75, 90]);
    assert_eq!(expires, "2026-12-31 23:59");
    let logged = crate::helpers::actions_logged(&pool, "create_vault_key").await;
    assert_eq!(logged, 1);
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn each_bad_field_gets_its_message_the_form_keeps_what_was_typed_and_nothing_is_created(
    pool: PgPool,
) {
    let app = TestApp::new(pool.clone());
    let cookie = app.signed_in("ops@example.com", Role::Operator).await;
    // (fields changed from GOOD, the field whose message shows, the message)
    type Case<'a> = (&'a [(&'a str, &'a str)], &'a str, &'a str);
    let cases: &[Case] = &[
        (
            &[("expected_total", "")],
            "expected_total",
            "enter an amount",
        ),
        (
            &[("expected_total", "0")],
            "expected_total",
            "more than zero",
        ),
        (&[("expected_total", "-5")], "expected_total", "is negative"),
        (
            &[("expected_total", "five")],
            "expected_total",
            "is not an amount",
        ),
        (
            &[("expected_total", "10.001")],
            "expected_total",
            "USD has 2 decimals at most",
        ),
        (
            &[("expected_total", "2,000,000,000,000")],
            "expected_total",
            "more than the largest amount",
        ),
        (&[("buffer_pct", "101")], "buffer_pct", "from 0 to 100"),
        (&[("buffer_pct", "-1")], "buffer_pct", "from 0 to 100"),
        (
            &[("expires_at", "2020-01-01T00:00")],
            "expires_at",
            "must be in the future",
        ),
        (
            &[("expires_at", "2099-01-01T00:00")],
            "expires_at",
            "within a year",
        ),
        (
            &[("expires_at", "soon")],
            "expires_at",
            "is not a date and time",
        ),
        (&[("period", "2026-13")], "period", "2026-13"),
        (&[("label", "   ")], "label", "1 to 200 characters"),
        (&[("thresholds", "0")], "thresholds", "from 1 to 100"),
        (&[("thresholds", "90, 90")], "thresholds", "given twice"),
        (
            &[("custom_endpoints", "FETCH everything")],
            "custom_endpoints",
            "FETCH",
        ),
    ];
    for (changes, field, message) in cases {
        let refused = app.post_form("/keys", &with(changes), Some(&cookie)).await;
        assert_eq!(refused.status, StatusCode::SEE_OTHER);
        assert!(
            refused.location().starts_with("/keys/new?draft="),
            "{changes:?}"
        );
        let page = app.get(refused.location(), Some(&cookie)).await;
        let error = page
            .body
            .split(&format!("id=\"{field}-error\" class=\"field-error\">"))
            .nth(1)
            .and_then(|rest| rest.split("</span>").next())
            .unwrap_or_default();
        assert!(
            error.contains(&enc_html(message)),
            "{changes:?}: {error:?} in {}",
            page.body
        );
        for (name, value) in *changes {
            if !value.trim().is_empty() && *name != "custom_endpoints" {
                assert!(
                    page.body
                        .contains(&format!("value=\"{}\"", enc_html(value))),
                    "{name} kept: {value}"
                );
            }
        }
    }
    // Label with HTML and a spreadsheet formula: stored as text, shown escaped.
    let hostile = "<script>x</script>=HYPERLINK(\"x\")";
    app.post_form("/keys", &with(&[("label", hostile)]), Some(&cookie))
        .await;
    let label: String = sqlx::query_scalar("SELECT label FROM vault_keys")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(label, hostile);
    let list = app.get("/keys", Some(&cookie)).await;
    assert!(!list.body.contains("<script>x</script>"));
    assert!(list.body.contains("&lt;script&gt;x&lt;/script&gt;"));
    let count = crate::helpers::count(&pool, "SELECT count(*) FROM vault_keys").await;
    assert_eq!(count, 1, "only the valid submission created a key");
}

fn enc_html(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_viewer_cannot_create_keys(pool: PgPool) {
    let app = TestApp::new(pool.clone());
    let cookie = app.signed_in("viewer@example.com", Role::Viewer).await;
    assert!(!app
        .get("/keys", Some(&cookie))
        .await
        .body
        .contains("/keys/new"));
    let page = app.get("/keys/new", Some(&cookie)).await;
    assert!(!page.body.contains("Create vault key"));
    let refused = app.post_form("/keys", &form(GOOD), Some(&cookie)).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    let count = crate::helpers::count(&pool, "SELECT count(*) FROM vault_keys").await;
    assert_eq!(count, 0);
}

/// Uploads `csv` as the new-key form's expected billing file.
async fn upload(app: &TestApp, cookie: &str, csv: &str) -> crate::helpers::TestResponse {
    let boundary = "vaultcap-test-boundary";
    let body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"currency\"\r\n\r\nusd\r\n\
         --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"run.csv\"\r\n\
         Content-Type: text/csv\r\n\r\n{csv}\r\n--{boundary}--\r\n"
    );
    let request = axum::http::Request::post("/keys/suggestion")
        .header("host", "localhost")
        .header("origin", "http://localhost")
        .header("cookie", cookie)
        .header(
            "content-type",
            format!("multipart/form-data; boundary={boundary}"),
        )
        .body(axum::body::Body::from(body))
        .unwrap();
    app.send(request).await
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn an_uploaded_csv_of_expected_billing_becomes_the_suggestion(pool: PgPool) {
    let app = TestApp::new(pool);
    let cookie = app.signed_in("ops@example.com", Role::Operator).await;

    let sent = upload(
        &app,
        &cookie,
        "customer,amount\ncust_1,4000.00\ncust_2,1000\n",
    )
    .await;
    assert_eq!(sent.status, StatusCode::SEE_OTHER);
    assert_eq!(sent.location(), "/keys/new");
    let page = app.get("/keys/new", Some(&cookie)).await.body;
    assert!(
        page.contains("Suggested: 5,000.00 USD — uploaded file run.csv: 2 customers."),
        "{page}"
    );
    assert!(
        page.contains(r#"value="5,000.00""#),
        "the form starts from it"
    );

    upload(&app, &cookie, "cust_1,10\ncust_1,20\n").await;
    let page = app.get("/keys/new", Some(&cookie)).await.body;
    assert!(
        page.contains("run.csv was not used: line 2: customer \"cust_1\" is listed twice"),
        "{page}"
    );
    assert!(
        page.contains("5,000.00 USD — uploaded file run.csv"),
        "the good file still counts"
    );

    let viewer = app.signed_in("viewer@example.com", Role::Viewer).await;
    assert_eq!(
        upload(&app, &viewer, "cust_1,10\n").await.status,
        StatusCode::FORBIDDEN
    );
}

/// The session row never holds a new key's secret in clear: it keeps the
/// ciphertext, the browser the key (for a minute); neither alone shows it.
#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_new_secret_is_never_stored_in_clear_and_opens_only_with_the_browsers_key(pool: PgPool) {
    let app = TestApp::new(pool.clone());
    let cookie = app.signed_in("ops@example.com", Role::Operator).await;
    let created = app.post_form("/keys", &form(GOOD), Some(&cookie)).await;
    assert_eq!(created.location(), "/keys");
    let reveal = created.revealing(&cookie);
    assert!(reveal.contains("vaultcap_reveal="));
    let set_cookie = created
        .headers
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .find(|v| v.starts_with("vaultcap_reveal="))
        .unwrap();
    assert!(set_cookie.contains("Max-Age=60") && set_cookie.contains("HttpOnly"));

    // Whoever reads the session store (a backup, a replica) gets nothing:
    // no "vk_" secret in any session row while it waits to be shown.
    let sessions: Vec<Vec<u8>> = sqlx::query_scalar("SELECT data FROM tower_sessions.session")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert!(!sessions.is_empty());
    for data in &sessions {
        assert!(
            !data.windows(3).any(|w| w == b"vk_"),
            "a secret sits in a session row in clear"
        );
    }

    // Without the browser's key the secret cannot be shown, and the page says so.
    let without = app.get("/keys", Some(&cookie)).await;
    assert!(one_time_secret(&without.body).is_none());
    assert!(
        without.body.contains("The secret is no longer shown"),
        "{}",
        without.body
    );
    // The ciphertext went with the notice: the key alone opens nothing now.
    let later = app.get("/keys", Some(&reveal)).await;
    assert!(one_time_secret(&later.body).is_none());
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_secret_shown_once_removes_its_key_from_the_browser(pool: PgPool) {
    let app = TestApp::new(pool.clone());
    let cookie = app.signed_in("ops@example.com", Role::Operator).await;
    let created = app.post_form("/keys", &form(GOOD), Some(&cookie)).await;
    let shown = app.get("/keys", Some(&created.revealing(&cookie))).await;
    let secret = one_time_secret(&shown.body).expect("shown with the key");
    assert!(secret.starts_with("vk_"));
    let forgotten = shown
        .headers
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.starts_with("vaultcap_reveal=;") && v.contains("Max-Age=0"));
    assert!(forgotten, "the key cookie is removed once used");
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn check_shows_the_cap_and_a_label_already_live_without_creating_anything(pool: PgPool) {
    let app = TestApp::new(pool.clone());
    let cookie = app.signed_in("ops@example.com", Role::Operator).await;
    let created = app.post_form("/keys", &form(GOOD), Some(&cookie)).await;
    assert_eq!(created.status, StatusCode::SEE_OTHER);
    let live = crate::helpers::count(&pool, "SELECT id FROM vault_keys").await;
    let keys = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM vault_keys")
            .fetch_one(&pool)
            .await
            .unwrap()
    };

    // Without JavaScript, Check is how the cap preview follows what was typed.
    let checked = app
        .post_form(
            "/keys",
            &format!(
                "{}&intent=check",
                with(&[
                    ("expected_total", "1,000.00"),
                    ("label", " Billing-Run-2026-12 ")
                ])
            ),
            Some(&cookie),
        )
        .await;
    assert_eq!(checked.status, StatusCode::SEE_OTHER);
    assert!(
        checked.location().ends_with("&checked=yes"),
        "{}",
        checked.location()
    );
    let page = app.get(checked.location(), Some(&cookie)).await.body;
    assert!(
        page.contains("Checked: the cap below is the one Create vault key issues"),
        "{page}"
    );
    assert!(
        page.contains("1,100.00 USD"),
        "the preview is the checked figures: {page}"
    );
    assert!(
        page.contains("A live key already has this label")
            && page.contains(&format!(r#"href="/keys/{live}""#)),
        "{page}"
    );
    assert_eq!(keys().await, 1, "checking creates nothing");

    // A figure that makes no cap says why, beside the field and in the preview.
    let checked = app
        .post_form(
            "/keys",
            &format!(
                "{}&intent=check",
                with(&[("expected_total", "1.005"), ("label", "other")])
            ),
            Some(&cookie),
        )
        .await;
    let page = app.get(checked.location(), Some(&cookie)).await.body;
    assert!(
        page.contains("Checked: fix the fields marked below"),
        "{page}"
    );
    assert!(
        page.contains("none yet (expected total: USD has 2 decimals at most)"),
        "{page}"
    );
    assert!(
        !page.contains("A live key already has this label"),
        "{page}"
    );
    assert_eq!(keys().await, 1);
}
