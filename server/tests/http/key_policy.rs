//! Keys beyond policy: issued at once within the buffer policy and the
//! asker's ceiling, otherwise held for a different approver. The secret is
//! shown when asked and opens nothing until the key is approved.

use std::time::Duration;

use axum::http::StatusCode;
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::{
    fake_stripe::FakeStripe,
    helpers::{enc, TestApp},
    new_key::with,
    proxy::CHARGE,
};
use app::{
    domain::{ApiScope, Role},
    key_requests::rules::KeyPolicy,
};

fn native(expected: i64, cap: i64) -> Value {
    json!({
        "label": "month-end", "billing_period": "2026-12", "currency": "usd",
        "expected_total_cents": expected, "cap_cents": cap,
        "allowed_endpoints": ["POST /v1/charges"], "expires_at": crate::helpers::in_a_month(),
    })
}

/// Decides as the console does: an approval comes from its confirmation page.
async fn decide_key(app: &TestApp, id: i64, verdict: &str, note: &str, cookie: &str) -> String {
    let response = app
        .post_form(
            &format!("/key-requests/{id}/decide"),
            &format!("verdict={verdict}&note={}&confirmed=yes", enc(note)),
            Some(cookie),
        )
        .await;
    assert_eq!(response.status, StatusCode::SEE_OTHER, "{}", response.body);
    app.notice("/approvals", cookie).await
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_key_beyond_the_buffer_policy_works_only_once_another_person_approves_it(pool: PgPool) {
    let stripe = FakeStripe::start().await;
    let app = TestApp::with_upstream(pool.clone(), &stripe.base, Duration::from_secs(2));
    let token = app
        .api_token_with(&[ApiScope::KeysCreate, ApiScope::KeysRead])
        .await;

    // Expected 100.00 × 1.10 = 110.00: issued at once.
    let within = app
        .post_json("/vault/keys", &token, native(10_000, 11_000))
        .await;
    assert_eq!(within.status, StatusCode::CREATED, "{}", within.body);

    // One cent more waits.
    let asked = app
        .post_json("/vault/keys", &token, native(10_000, 11_001))
        .await;
    assert_eq!(asked.status, StatusCode::ACCEPTED, "{}", asked.body);
    let asked = asked.json();
    assert_eq!(asked["status"], "pending_approval");
    let request = &asked["key_request"];
    assert_eq!(request["state"], "pending");
    assert_eq!(request["policy_cap_cents"], 11_000);
    assert_eq!(
        request["over_policy"],
        "the cap 110.01 USD is above the expected total 100.00 USD plus the 10 % buffer policy (110.00 USD)"
    );
    let id = request["id"].as_i64().unwrap();
    let secret = asked["vault_key"].as_str().unwrap().to_owned();
    let keys = crate::helpers::count(&pool, "SELECT count(*) FROM vault_keys").await;
    assert_eq!(keys, 1, "the waiting key is not issued");

    // Until approved, the secret opens nothing and nothing reaches Stripe.
    let refused = app.charge(&secret, CHARGE).await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED, "{}", refused.body);
    assert!(stripe.seen().is_empty());

    // An approver sees it and approves it.
    let approver = app.signed_in("lead@example.com", Role::Approver).await;
    let approvals = app.get("/approvals", Some(&approver)).await.body;
    assert!(approvals.contains("New keys beyond policy"));
    assert!(approvals.contains(&format!("Approve key request {id}")));
    assert!(
        approvals.contains(&format!(
            r#"formaction="/key-requests/{id}/confirm" formmethod="get""#
        )),
        "Approve opens the confirmation first"
    );

    // Approving straight from the list, without the confirmation, issues nothing.
    let unconfirmed = app
        .post_form(
            &format!("/key-requests/{id}/decide"),
            "verdict=approve&note=",
            Some(&approver),
        )
        .await;
    assert_eq!(unconfirmed.status, StatusCode::SEE_OTHER);
    let said = app.notice("/approvals", &approver).await;
    assert!(said.contains("was not approved: press Approve"), "{said}");
    let refused = app.charge(&secret, CHARGE).await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED, "{}", refused.body);

    // The confirmation says what the key may charge and how far beyond policy.
    let confirm = app
        .get(
            &format!("/key-requests/{id}/confirm?note=month-end+seats"),
            Some(&approver),
        )
        .await;
    assert_eq!(confirm.status, StatusCode::OK, "{}", confirm.body);
    assert!(
        confirm.body.contains("may charge up to 110.01 USD")
            && confirm.body.contains("0.01 USD more than policy allows"),
        "{}",
        confirm.body
    );
    assert!(confirm.body.contains(r#"value="month-end seats""#));
    assert!(confirm.body.contains(r#"name="confirmed" value="yes""#));

    let said = decide_key(&app, id, "approve", "month-end seats", &approver).await;
    assert!(
        said.contains(&format!("Approved key request #{id}")),
        "{said}"
    );

    let shown = app
        .get_api(&format!("/vault/key-requests/{id}"), &token)
        .await
        .json();
    assert_eq!(shown["state"], "approved");
    assert_eq!(shown["decided_by"], "lead@example.com");
    let key_id = shown["vault_key_id"].as_i64().expect("a key was issued");
    let (cap, by_token): (i64, Option<i64>) =
        sqlx::query_as("SELECT cap_cents, created_by_token FROM vault_keys WHERE id = $1")
            .bind(key_id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(cap, 11_001);
    assert!(by_token.is_some(), "the key is the requester's");

    let charged = app.charge(&secret, CHARGE).await;
    assert_eq!(charged.status, StatusCode::OK, "{}", charged.body);
    assert_eq!(stripe.seen().len(), 1);

    // Decided once.
    let again = decide_key(&app, id, "reject", "changed my mind", &approver).await;
    assert!(again.contains("was already approved"), "{again}");
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn nobody_issues_their_own_key_beyond_policy(pool: PgPool) {
    let app = TestApp::new(pool.clone());

    // An approver asks in the console with a 20 % buffer: it waits.
    let asker = app.signed_in("asker@example.com", Role::Approver).await;
    let created = app
        .post_form("/keys", &with(&[("buffer_pct", "20")]), Some(&asker))
        .await;
    assert_eq!(created.location(), "/approvals");
    let said = app.notice("/approvals", &created.revealing(&asker)).await;
    assert!(said.contains("waits for an approver"), "{said}");
    let id = crate::helpers::count(&pool, "SELECT max(id) FROM key_requests").await;

    // Nobody rewrites who asked, or for what, before deciding.
    let err = sqlx::query(
        "UPDATE key_requests SET requested_by = (SELECT min(id) FROM operators), cap_cents = 1
         WHERE id = $1",
    )
    .bind(id)
    .execute(&pool)
    .await
    .unwrap_err();
    assert_eq!(
        err.as_database_error().unwrap().constraint(),
        Some("key_request_unchanged")
    );

    // Asking again for the same key while it waits files nothing new.
    let twice = app
        .post_form("/keys", &with(&[("buffer_pct", "20")]), Some(&asker))
        .await;
    let form = app.get(twice.location(), Some(&asker)).await.body;
    assert!(
        form.contains(&format!(
            "key request #{id} for billing-run-2026-12 in 2026-12 already waits"
        )),
        "{form}"
    );
    let requests = crate::helpers::count(&pool, "SELECT count(*) FROM key_requests").await;
    assert_eq!(requests, 1);

    // They cannot decide it, here or in the database.
    let page = app.get("/approvals", Some(&asker)).await.body;
    assert!(page.contains("You asked for this key"));
    let refused = decide_key(&app, id, "approve", "", &asker).await;
    assert!(refused.contains("four-eyes rule"), "{refused}");
    let err = sqlx::query(
        "UPDATE key_requests SET decision = 'rejected', decided_at = now(), decided_by = requested_by
         WHERE id = $1",
    )
    .bind(id)
    .execute(&pool)
    .await
    .unwrap_err();
    assert_eq!(
        err.as_database_error().unwrap().constraint(),
        Some("key_request_four_eyes")
    );
    assert!(
        app::cap_increases::rules::decision_refused(err, "key_request")
            .to_string()
            .contains("four-eyes rule")
    );

    // Nor can the admin who made the token that asks for another.
    let admin = app.signed_in("admin@example.com", Role::Admin).await;
    let made = app
        .post_form(
            "/tokens",
            "name=admins+job&scope=keys%3Acreate&days=1",
            Some(&admin),
        )
        .await;
    let page = app.get("/tokens", Some(&made.revealing(&admin))).await;
    let token = crate::helpers::one_time_secret(&page.body).unwrap();
    let asked = app
        .post_json("/vault/keys", &token, native(10_000, 20_000))
        .await;
    assert_eq!(asked.status, StatusCode::ACCEPTED, "{}", asked.body);
    let token_request = asked.json()["key_request"]["id"].as_i64().unwrap();
    let refused = decide_key(&app, token_request, "approve", "", &admin).await;
    assert!(refused.contains("four-eyes rule"), "{refused}");
    let err = sqlx::query(
        "UPDATE key_requests r SET decision = 'rejected', decided_at = now(), decided_by = t.created_by
         FROM api_tokens t WHERE t.id = r.requested_by_token AND r.id = $1",
    )
    .bind(token_request)
    .execute(&pool)
    .await
    .unwrap_err();
    assert_eq!(
        err.as_database_error().unwrap().constraint(),
        Some("key_request_four_eyes")
    );

    // Another approver rejects the first, with a reason; no key is issued.
    let said = decide_key(&app, id, "reject", "", &admin).await;
    assert!(said.contains("say why the key is rejected"), "{said}");
    let said = decide_key(&app, id, "reject", "the run is smaller", &admin).await;
    assert!(
        said.contains(&format!("Rejected key request #{id}")),
        "{said}"
    );
    let keys = crate::helpers::count(&pool, "SELECT count(*) FROM vault_keys").await;
    assert_eq!(keys, 0);
    let logged: Vec<String> = sqlx::query_scalar(
        "SELECT action FROM operator_actions WHERE subject_type = 'key_request' ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        logged,
        ["request_vault_key", "request_vault_key", "reject_vault_key"]
    );
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_tokens_or_a_roles_ceiling_holds_keys_that_are_within_the_buffer(pool: PgPool) {
    let app = TestApp::with_key_policy(
        pool.clone(),
        KeyPolicy {
            role_ceilings: vec![(Role::Operator, app::domain::Cents(100_000))],
            ..KeyPolicy::default()
        },
    );

    // A token that may issue keys up to 50.00 alone.
    let admin = app.signed_in("admin@example.com", Role::Admin).await;
    let made = app
        .post_form(
            "/tokens",
            "name=small+job&scope=keys%3Acreate&days=1&max_cap_cents=5000",
            Some(&admin),
        )
        .await;
    let page = app.get("/tokens", Some(&made.revealing(&admin))).await;
    assert!(page
        .body
        .contains("keys up to 5,000 (minor units) without an approver"));
    let token = crate::helpers::one_time_secret(&page.body).unwrap();
    let small = app
        .post_json("/vault/keys", &token, native(5_000, 5_000))
        .await;
    assert_eq!(small.status, StatusCode::CREATED);
    let big = app
        .post_json("/vault/keys", &token, native(6_000, 6_000))
        .await;
    assert_eq!(big.status, StatusCode::ACCEPTED);
    assert_eq!(
        big.json()["key_request"]["over_policy"],
        "the cap 60.00 USD is above this token's ceiling of 50.00 USD"
    );

    // An operator's role ceiling is 1,000.00: the 5,500.00 key waits.
    let operator = app.signed_in("ops@example.com", Role::Operator).await;
    let created = app.post_form("/keys", &with(&[]), Some(&operator)).await;
    assert_eq!(created.location(), "/approvals");
    let said = app
        .notice("/approvals", &created.revealing(&operator))
        .await;
    assert!(
        said.contains("the cap 5,500.00 USD is above this role's ceiling of 1,000.00 USD"),
        "{said}"
    );
}

/// The seeds' body sends the cap (`daily_usd_cap`); the expected total is
/// derived from it. Whatever the cap, that key is within the buffer policy:
/// no billing job using the seeds' body waits for an approver.
#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_seed_body_key_is_always_within_the_buffer_policy(pool: PgPool) {
    let app = TestApp::new(pool);
    let token = app.api_token_with(&[ApiScope::KeysCreate]).await;
    for dollars in [5000.0, 1.0, 0.07, 123.45, 99_999.99] {
        let created = app
            .post_json("/vault/keys", &token, json!({
                    "vendor": "stripe", "label": "seeds", "daily_usd_cap": dollars,
                    "allowed_endpoints": ["/v1/charges"], "expires_at": crate::helpers::in_a_month(),
                }))
            .await;
        assert_eq!(
            created.status,
            StatusCode::CREATED,
            "${dollars}: {}",
            created.body
        );
    }
}
