//! Period close: an operator prepares it, a different approver signs it
//! off; sign-off refuses while findings are open or calls undecided,
//! revokes the period's keys, freezes the report with its hash, and the
//! signed report downloads as a zip of CSV files. The database holds the
//! rules whatever the caller.

use std::io::Read;

use axum::http::StatusCode;
use sha2::{Digest, Sha256};
use sqlx::PgPool;

use crate::helpers::{enc, until_one_waits_on_a_lock, TestApp};
use app::{
    actions::sql::Actor,
    domain::{BillingPeriod, Me, Role},
    periods::rules as period_close,
};

/// The month before this one: ended, so it can be closed.
fn last_month() -> BillingPeriod {
    BillingPeriod::containing(chrono::Utc::now()).previous()
}

/// A key of `period` that spent `spent` of a 110.00 USD cap, with `calls`
/// settled calls in the audit log; its id.
async fn key(pool: &PgPool, period: BillingPeriod, label: &str, spent: i64, calls: i32) -> i64 {
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO vault_keys (secret_hash, secret_prefix, label, billing_period, currency,
             expected_total_cents, cap_cents, spent_cents, allowed_endpoints, expires_at)
         VALUES (sha256(convert_to($1, 'UTF8')), 'vk_test', $1, $2, 'usd', 10000, 11000, $3,
                 ARRAY['POST /v1/charges'], now() + interval '30 days')
         RETURNING id",
    )
    .bind(label)
    .bind(period)
    .bind(spent)
    .fetch_one(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO audit_log (request_id, vault_key_id, billing_period, method, path,
             amount_cents, currency, decision, upstream_status)
         SELECT gen_random_uuid(), $1, $2, 'POST', '/v1/charges', 1000, 'usd', 'allowed', 200
         FROM generate_series(1, $3)",
    )
    .bind(id)
    .bind(period)
    .bind(calls)
    .execute(pool)
    .await
    .unwrap();
    id
}

async fn open_finding(pool: &PgPool, period: BillingPeriod) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO reconciliation_findings (kind, billing_period, customer_id, currency,
             charge_ids, amount_at_risk_cents, explanation)
         VALUES ('orphaned', $1, 'cust_7', 'usd', ARRAY['ch_7'], 500, 'No billing record')
         RETURNING id",
    )
    .bind(period)
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn live_keys(pool: &PgPool, period: BillingPeriod) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM vault_keys WHERE billing_period = $1 AND revoked_at IS NULL",
    )
    .bind(period)
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn signed(pool: &PgPool, period: BillingPeriod) -> bool {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM period_closes WHERE billing_period = $1 AND signed_at IS NOT NULL)",
    )
    .bind(period)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Posts one of the close page's forms; the notice it leaves.
async fn post(
    app: &TestApp,
    period: BillingPeriod,
    action: &str,
    body: &str,
    cookie: &str,
) -> String {
    let path = format!("/periods/{period}");
    let response = app
        .post_form(&format!("{path}/{action}"), body, Some(cookie))
        .await;
    assert_eq!(response.status, StatusCode::SEE_OTHER, "{}", response.body);
    assert_eq!(response.location(), path);
    app.notice(&path, cookie).await
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn an_operator_prepares_another_approver_signs_and_the_period_is_closed(pool: PgPool) {
    let app = TestApp::new(pool.clone());
    let period = last_month();
    let first = key(&pool, period, "nightly billing", 9_000, 9).await;
    key(&pool, period, "late invoices", 1_000, 1).await;
    let finding = open_finding(&pool, period).await;
    let preparer = app.signed_in("prep@example.com", Role::Approver).await;
    let signer = app.signed_in("sign@example.com", Role::Approver).await;
    let operator = app.signed_in("ops@example.com", Role::Operator).await;

    let page = app
        .get(&format!("/periods/{period}"), Some(&operator))
        .await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(
        page.body.contains("Nobody has prepared this period"),
        "{}",
        page.body
    );
    assert!(page.body.contains("1 finding is open"), "{}", page.body);
    // Stripe was never synced for it: the page says the figures may miss
    // what the events did; a sync after the month's end answers that.
    assert!(
        page.body.contains("Not synced from Stripe since"),
        "{}",
        page.body
    );
    sqlx::query(
        "INSERT INTO stripe_syncs (billing_period, created_from, created_to, finished_at)
         VALUES ($1, now() - interval '40 days', now(), now())",
    )
    .bind(period)
    .execute(&pool)
    .await
    .unwrap();
    let page = app
        .get(&format!("/periods/{period}"), Some(&operator))
        .await;
    assert!(
        page.body.contains("last synced from Stripe at"),
        "{}",
        page.body
    );
    assert!(!page.body.contains("sync-caution"), "{}", page.body);

    let prepared = post(
        &app,
        period,
        "prepare",
        &format!("note={}", enc("Ledger matches")),
        &preparer,
    )
    .await;
    assert!(
        prepared.contains(&format!("The close of {period} is prepared")),
        "{prepared}"
    );
    let again = post(&app, period, "prepare", "note=", &operator).await;
    assert!(
        again.contains("prep@example.com already prepared the close"),
        "{again}"
    );

    // An operator may not sign; the preparer may not either (four-eyes).
    let refused = app
        .post_form(&format!("/periods/{period}/sign-off"), "", Some(&operator))
        .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    let own = post(&app, period, "sign-off", "", &preparer).await;
    assert!(own.contains("you prepared the close"), "{own}");
    assert!(own.contains("four-eyes"), "{own}");
    // An open finding blocks the sign-off, with the reason.
    let blocked = post(&app, period, "sign-off", "", &signer).await;
    assert!(blocked.contains("1 finding is open"), "{blocked}");
    assert!(!signed(&pool, period).await);
    assert_eq!(live_keys(&pool, period).await, 2, "nothing changed");

    sqlx::query(
        "UPDATE reconciliation_findings SET resolution = 'dismissed', resolved_at = now(),
             resolution_note = 'refunded by hand' WHERE id = $1",
    )
    .bind(finding)
    .execute(&pool)
    .await
    .unwrap();
    let done = post(&app, period, "sign-off", "", &signer).await;
    assert!(
        done.contains(&format!("{period} is signed off: 2 key(s) revoked")),
        "{done}"
    );
    assert_eq!(live_keys(&pool, period).await, 0);
    let twice = post(&app, period, "sign-off", "", &signer).await;
    assert!(
        twice.contains("already signed off by sign@example.com"),
        "{twice}"
    );

    // The frozen report: its hash is the stored one, and it says what the
    // sign-off did to the keys.
    let (report, sha256): (String, String) =
        sqlx::query_as("SELECT report, report_sha256 FROM period_closes WHERE billing_period = $1")
            .bind(period)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(hex::encode(Sha256::digest(report.as_bytes())), sha256);
    let frozen: serde_json::Value = serde_json::from_str(&report).unwrap();
    assert_eq!(frozen["calls"], 10);
    assert_eq!(frozen["money"][0]["metered"], 10_000);
    let reason: String = sqlx::query_scalar("SELECT revoke_reason FROM vault_keys WHERE id = $1")
        .bind(first)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(frozen["keys"][0]["revoke_reason"], reason.as_str());

    // Nothing more for the closed period: no new key, no edit of the report.
    let new_key = sqlx::query(
        "INSERT INTO vault_keys (secret_hash, secret_prefix, label, billing_period, currency,
             expected_total_cents, cap_cents, allowed_endpoints, expires_at)
         VALUES ('\\x00', 'vk_x', 'late', $1, 'usd', 100, 110, ARRAY['POST /v1/charges'], now() + interval '1 day')",
    )
    .bind(period)
    .execute(&pool)
    .await
    .unwrap_err();
    assert_eq!(
        new_key.as_database_error().and_then(|e| e.constraint()),
        Some("vault_key_period_open")
    );
    let edit = sqlx::query("UPDATE period_closes SET report = '{}', report_sha256 = $1")
        .bind(hex::encode(Sha256::digest(b"{}")))
        .execute(&pool)
        .await
        .unwrap_err();
    assert_eq!(
        edit.as_database_error().and_then(|e| e.constraint()),
        Some("period_close_signed_once")
    );

    // Who did what, in the action log and the notification outbox.
    let logged: Vec<String> = sqlx::query_scalar(
        "SELECT action FROM operator_actions WHERE subject_type = 'billing_period' ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(logged, ["period.prepare", "period.sign_off"]);
    let events: Vec<String> = sqlx::query_scalar(
        "SELECT event FROM alert_notifications WHERE period_close_id IS NOT NULL ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(events, ["period.prepared", "period.signed_off"]);

    let page = app
        .get(&format!("/periods/{period}"), Some(&operator))
        .await;
    assert!(page.body.contains("Signed off"), "{}", page.body);
    assert!(page.body.contains(&sha256), "{}", page.body);
    assert!(page.body.contains("its bytes still match the stored hash"));
    let overview = app.get("/", Some(&operator)).await;
    assert!(
        overview
            .body
            .contains(&format!("href=\"/periods/{period}\"")),
        "{}",
        overview.body
    );

    // A finding detection opens after the sign-off is said on the page, as
    // the frozen report cannot show it.
    assert!(!page.body.contains("open-after-sign-off"), "{}", page.body);
    sqlx::query(
        "INSERT INTO reconciliation_findings (kind, billing_period, customer_id, currency,
             charge_ids, amount_at_risk_cents, explanation)
         VALUES ('unmetered', $1, 'cust_8', 'usd', ARRAY['ch_8'], 700, 'Made around the proxy')",
    )
    .bind(period)
    .execute(&pool)
    .await
    .unwrap();
    let page = app
        .get(&format!("/periods/{period}"), Some(&operator))
        .await;
    assert!(
        page.body.contains(&format!(
            "1 finding(s) of {period} are open now, found or reopened after the sign-off"
        )),
        "{}",
        page.body
    );

    // No new key for the signed period, and the billing job is told why.
    let token = app.api_token().await;
    let refused = app
        .post_json(
            "/vault/keys",
            &token,
            serde_json::json!({
                "label": "late run", "billing_period": period.to_string(), "currency": "usd",
                "expected_total_cents": 10_000, "allowed_endpoints": ["/v1/charges"],
                "expires_at": (chrono::Utc::now() + chrono::Duration::hours(6)).to_rfc3339(),
            }),
        )
        .await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{}", refused.body);
    assert!(
        refused
            .body
            .contains(&format!("billing period {period} is signed off")),
        "{}",
        refused.body
    );
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn the_pack_holds_the_signed_report_its_hash_and_every_call(pool: PgPool) {
    let app = TestApp::new(pool.clone());
    let period = last_month();
    key(&pool, period, "=HYPERLINK(\"x\")", 5_000, 25).await;
    // A call of another period is not in the pack.
    key(&pool, period.previous(), "older", 0, 3).await;
    let preparer = app.signed_in("prep@example.com", Role::Operator).await;
    let signer = app.signed_in("sign@example.com", Role::Approver).await;
    let viewer = app.signed_in("view@example.com", Role::Viewer).await;
    let early = app
        .get(&format!("/periods/{period}/close-pack.zip"), Some(&viewer))
        .await;
    assert_eq!(
        early.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        early.body
    );
    assert!(early.body.contains("is not signed off"), "{}", early.body);
    post(&app, period, "prepare", "", &preparer).await;
    post(&app, period, "sign-off", "", &signer).await;

    let pack = app
        .get(&format!("/periods/{period}/close-pack.zip"), Some(&viewer))
        .await;
    assert_eq!(pack.status, StatusCode::OK);
    assert_eq!(pack.headers["content-type"], "application/zip");
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(pack.raw.clone())).unwrap();
    let mut file = |name: &str| {
        let mut text = String::new();
        zip.by_name(name)
            .unwrap_or_else(|_| panic!("{name} is in the pack"))
            .read_to_string(&mut text)
            .unwrap();
        text
    };
    let report = file("report.json");
    let sha256 = hex::encode(Sha256::digest(report.as_bytes()));
    assert_eq!(file("report.sha256"), format!("{sha256}  report.json\n"));
    let calls = file("calls.csv");
    assert_eq!(calls.lines().count(), 1 + 25, "{calls}");
    assert!(calls.starts_with("id,at_utc,vault_key_id"));
    let keys = file("keys.csv");
    let mut rows = csv::Reader::from_reader(keys.as_bytes());
    let row = rows.records().next().unwrap().unwrap();
    assert_eq!(&row[1], "'=HYPERLINK(\"x\")", "a label is never a formula");
    assert_eq!(&row[9], "50.00");
    let money = file("money.csv");
    assert!(
        money.starts_with("currency,keys,expected_minor_units"),
        "{money}"
    );
    assert!(file("sign_off.csv").contains(&sha256));
    for name in ["findings.csv", "cap_increases.csv"] {
        assert!(!file(name).is_empty(), "{name}");
    }
    let logged = crate::helpers::count(
        &pool,
        "SELECT count(*) FROM operator_actions WHERE action = 'period.export_pack'
         AND (details->>'calls')::int = 25",
    )
    .await;
    assert_eq!(logged, 1);
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn undecided_calls_and_unended_periods_are_refused(pool: PgPool) {
    let app = TestApp::new(pool.clone());
    let period = last_month();
    let key_id = key(&pool, period, "nightly", 0, 0).await;
    sqlx::query(
        "INSERT INTO reservations (vault_key_id, request_id, amount_cents, state)
         VALUES ($1, gen_random_uuid(), 1000, 'outcome_unknown')",
    )
    .bind(key_id)
    .execute(&pool)
    .await
    .unwrap();
    let preparer = app.signed_in("prep@example.com", Role::Operator).await;
    let signer = app.signed_in("sign@example.com", Role::Approver).await;

    let current = BillingPeriod::containing(chrono::Utc::now());
    let early = post(&app, current, "prepare", "", &preparer).await;
    assert!(
        early.contains(&format!("{current} has not ended yet")),
        "{early}"
    );

    post(&app, period, "prepare", "", &preparer).await;
    let blocked = post(&app, period, "sign-off", "", &signer).await;
    assert!(
        blocked.contains("1 call is in flight or of unknown outcome"),
        "{blocked}"
    );
    assert!(!signed(&pool, period).await);
    assert_eq!(live_keys(&pool, period).await, 1);

    // Withdrawn, the period is open again and can be prepared anew.
    let withdrawn = post(&app, period, "withdraw", "", &preparer).await;
    assert!(withdrawn.contains("was withdrawn"), "{withdrawn}");
    let page = app
        .get(&format!("/periods/{period}"), Some(&preparer))
        .await;
    assert!(page.body.contains("Nobody has prepared this period"));
    post(&app, period, "prepare", "", &preparer).await;

    // Bad periods in the path: the page's "not found", never a 500.
    for bad in ["2026-13", "nope", "2026-1"] {
        let page = app.get(&format!("/periods/{bad}"), Some(&preparer)).await;
        assert!(
            page.body.contains("Period close not found"),
            "{bad}: {}",
            page.body
        );
        let form = app
            .post_form(&format!("/periods/{bad}/prepare"), "", Some(&preparer))
            .await;
        assert_eq!(form.status, StatusCode::SEE_OTHER, "{bad}");
    }
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn the_database_refuses_whatever_the_caller(pool: PgPool) {
    let app = TestApp::new(pool.clone());
    let period = last_month();
    key(&pool, period, "nightly", 0, 0).await;
    let preparer = app.add_operator("prep@example.com", Role::Approver).await;
    let viewer = app.add_operator("view@example.com", Role::Viewer).await;
    let constraint = |err: sqlx::Error| {
        err.as_database_error()
            .and_then(|e| e.constraint())
            .map(str::to_owned)
            .unwrap_or_else(|| panic!("refused by a named rule: {err}"))
    };
    let by_viewer =
        sqlx::query("INSERT INTO period_closes (billing_period, prepared_by) VALUES ($1, $2)")
            .bind(period)
            .bind(viewer)
            .execute(&pool)
            .await
            .unwrap_err();
    assert_eq!(constraint(by_viewer), "period_close_prepared_by_operator");
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO period_closes (billing_period, prepared_by) VALUES ($1, $2) RETURNING id",
    )
    .bind(period)
    .bind(preparer)
    .fetch_one(&pool)
    .await
    .unwrap();
    let own = sqlx::query(
        "UPDATE period_closes SET signed_at = now(), signed_by = prepared_by, report = '{}',
             report_sha256 = encode(sha256('{}'), 'hex') WHERE id = $1",
    )
    .bind(id)
    .execute(&pool)
    .await
    .unwrap_err();
    assert_eq!(constraint(own), "period_close_four_eyes");
    let wrong_hash = sqlx::query(
        "UPDATE period_closes SET signed_at = now(), signed_by = $2, report = '{}',
             report_sha256 = 'not the hash' WHERE id = $1",
    )
    .bind(id)
    .bind(app.add_operator("sign@example.com", Role::Approver).await)
    .execute(&pool)
    .await
    .unwrap_err();
    assert_eq!(constraint(wrong_hash), "period_close_report_hash");
    // Signed by SQL with a finding open: the trigger counts it, whoever asks.
    open_finding(&pool, period).await;
    let with_finding = sqlx::query(
        "UPDATE period_closes SET signed_at = now(), signed_by = $2, report = '{}',
             report_sha256 = encode(sha256(convert_to('{}', 'UTF8')), 'hex') WHERE id = $1",
    )
    .bind(id)
    .bind(app.add_operator("other@example.com", Role::Approver).await)
    .execute(&pool)
    .await
    .unwrap_err();
    assert_eq!(constraint(with_finding), "period_close_findings_resolved");
    // Nor is a close inserted already signed, which would skip all of that.
    let signed_at_birth = sqlx::query(
        "INSERT INTO period_closes (billing_period, prepared_by, signed_at, signed_by, report, report_sha256)
         VALUES ($1, $2, now(), $3, '{}', encode(sha256(convert_to('{}', 'UTF8')), 'hex'))",
    )
    .bind(last_month().previous())
    .bind(preparer)
    .bind(viewer)
    .execute(&pool)
    .await
    .unwrap_err();
    assert_eq!(constraint(signed_at_birth), "period_close_prepared_first");
    // Vaultcap's own login may not delete a close at all.
    let deleted = sqlx::query("DELETE FROM period_closes")
        .execute(&app.pool)
        .await
        .unwrap_err();
    assert!(
        deleted.to_string().contains("permission denied"),
        "{deleted}"
    );
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn two_sign_offs_at_once_make_one(pool: PgPool) {
    let app = TestApp::new(pool.clone());
    let period = last_month();
    key(&pool, period, "nightly", 100, 1).await;
    let preparer = app.add_operator("prep@example.com", Role::Operator).await;
    let mut approvers = Vec::new();
    for email in ["a@example.com", "b@example.com"] {
        let id = app.add_operator(email, Role::Approver).await;
        approvers.push(Me {
            id,
            email: email.into(),
            role: Role::Approver,
        });
    }
    let me = Me {
        id: preparer,
        email: "prep@example.com".into(),
        role: Role::Operator,
    };
    period_close::prepare(&app.pool, &me, Actor::Cli, period, "")
        .await
        .unwrap();
    let (a, b) = tokio::join!(
        period_close::sign_off(&app.pool, &approvers[0], Actor::Cli, period),
        period_close::sign_off(&app.pool, &approvers[1], Actor::Cli, period),
    );
    let outcomes = [a.map(|_| ()), b.map(|_| ())];
    assert_eq!(
        outcomes.iter().filter(|o| o.is_ok()).count(),
        1,
        "{outcomes:?}"
    );
    let refusal = outcomes.iter().find_map(|o| o.as_ref().err()).unwrap();
    assert!(
        refusal.to_string().contains("already signed off"),
        "{refusal}"
    );
    let signed_offs = crate::helpers::actions_logged(&pool, "period.sign_off").await;
    assert_eq!(signed_offs, 1);
}

/// What is made while a period is being signed off is not missed: a call
/// being reserved (its key locked, not committed) is counted and stops the
/// sign-off; a key being made is waited for, listed and revoked.
#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn what_is_made_during_a_sign_off_is_counted(pool: PgPool) {
    let app = TestApp::new(pool.clone());
    let (calls_period, keys_period) = (last_month(), last_month().previous());
    let busy = key(&pool, calls_period, "busy", 100, 1).await;
    key(&pool, keys_period, "early", 100, 1).await;
    let preparer = Me {
        id: app.add_operator("prep@example.com", Role::Operator).await,
        email: "prep@example.com".into(),
        role: Role::Operator,
    };
    let signer = Me {
        id: app.add_operator("sign@example.com", Role::Approver).await,
        email: "sign@example.com".into(),
        role: Role::Approver,
    };
    for period in [calls_period, keys_period] {
        period_close::prepare(&app.pool, &preparer, Actor::Cli, period, "")
            .await
            .unwrap();
    }
    let sign = |period| {
        let (pool, signer) = (app.pool.clone(), signer.clone());
        tokio::spawn(
            async move { period_close::sign_off(&pool, &signer, Actor::Cli, period).await },
        )
    };

    // A call on `busy`, as the proxy reserves it: the key locked first.
    let mut call = pool.begin().await.unwrap();
    sqlx::query("SELECT id FROM vault_keys WHERE id = $1 FOR UPDATE")
        .bind(busy)
        .execute(&mut *call)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO reservations (vault_key_id, request_id, amount_cents)
         VALUES ($1, gen_random_uuid(), 500)",
    )
    .bind(busy)
    .execute(&mut *call)
    .await
    .unwrap();
    let signing = sign(calls_period);
    until_one_waits_on_a_lock(&pool).await;
    call.commit().await.unwrap();
    let refused = signing.await.unwrap().unwrap_err().to_string();
    assert!(refused.contains("in flight"), "{refused}");
    assert!(!signed(&pool, calls_period).await);
    assert_eq!(live_keys(&pool, calls_period).await, 1);

    // A key being made for the other period, not committed yet.
    let mut late = pool.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO vault_keys (secret_hash, secret_prefix, label, billing_period, currency,
             expected_total_cents, cap_cents, allowed_endpoints, expires_at)
         VALUES (sha256('late'), 'vk_test', 'late', $1, 'usd', 10000, 11000,
                 ARRAY['POST /v1/charges'], now() + interval '30 days')",
    )
    .bind(keys_period)
    .execute(&mut *late)
    .await
    .unwrap();
    let signing = sign(keys_period);
    until_one_waits_on_a_lock(&pool).await;
    late.commit().await.unwrap();
    let signed_off = signing.await.unwrap().unwrap();
    assert_eq!(signed_off.keys_revoked, 2, "the late key is in the report");
    assert_eq!(live_keys(&pool, keys_period).await, 0);
}
