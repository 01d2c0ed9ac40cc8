//! Cap increases: an operator (or a billing job's token) asks, a second
//! person with the approver role decides, the proxy sees the new cap on the
//! next call. The four-eyes rule and "decided once" hold in the database.

use axum::http::StatusCode;
use serde_json::json;
use sqlx::PgPool;

use crate::{
    alerts::receiver,
    helpers::{enc, one_time_secret, TestApp},
    proxy::{proxy_with_key, CHARGE},
};
use app::{
    cap_increases::rules::{self as cap_increases, Verdict},
    domain::{Me, Role},
    error::AppError,
};

/// The request form's body.
fn ask(new_cap: &str, reason: &str, apply_as: &str) -> String {
    format!(
        "new_cap={}&reason={}&apply_as={apply_as}&origin=key_page",
        enc(new_cap),
        enc(reason)
    )
}

async fn cap(pool: &PgPool, key: i64) -> i64 {
    sqlx::query_scalar("SELECT cap_cents FROM vault_keys WHERE id = $1")
        .bind(key)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn requests(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM cap_increase_requests")
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn latest_request(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT max(id) FROM cap_increase_requests")
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn decide(app: &TestApp, id: i64, verdict: &str, note: &str, cookie: &str) -> String {
    let response = app
        .post_form(
            &format!("/approvals/{id}/decide"),
            // As the confirmation page sends an approval.
            &format!("verdict={verdict}&note={}&confirmed=yes", enc(note)),
            Some(cookie),
        )
        .await;
    assert_eq!(response.status, StatusCode::SEE_OTHER, "{}", response.body);
    assert_eq!(response.location(), "/approvals");
    app.notice("/approvals", cookie).await
}

async fn me(app: &TestApp, email: &str, role: Role) -> Me {
    Me {
        id: app.add_operator(email, role).await,
        email: email.into(),
        role,
    }
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn an_operator_asks_an_approver_approves_and_the_refused_charge_goes_through(pool: PgPool) {
    // Cap 50.00, charges of 10.00: the sixth is refused.
    let (app, _stripe, secret, key) = proxy_with_key(pool.clone(), 5_000).await;
    for _ in 0..5 {
        let charged = app.charge(&secret, CHARGE).await;
        assert_eq!(charged.status, StatusCode::OK, "{}", charged.body);
    }
    let refused = app.charge(&secret, CHARGE).await;
    assert_eq!(refused.status, StatusCode::PAYMENT_REQUIRED);
    assert!(refused.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains(&format!("POST /vault/keys/{key}/cap-increase-requests")));

    let operator = app.signed_in("ops@example.com", Role::Operator).await;
    let form = app
        .get(&format!("/keys/{key}/cap-increase"), Some(&operator))
        .await;
    assert_eq!(form.status, StatusCode::OK);
    assert!(
        form.body.contains(
            "spent 50.00 + reserved 0.00 + remaining billing 10.00 × 1.1 = 61.00 USD, rounded up"
        ),
        "{}",
        form.body
    );
    let filed = app
        .post_form(
            &format!("/keys/{key}/cap-increase-requests"),
            &ask(
                "60.00",
                "Ten new customers signed up on the 30th",
                "raise_cap",
            ),
            Some(&operator),
        )
        .await;
    assert_eq!(filed.status, StatusCode::SEE_OTHER, "{}", filed.body);
    assert_eq!(filed.location(), format!("/keys/{key}"));
    assert!(&app
        .notice(&format!("/keys/{key}"), &operator)
        .await
        .contains("50.00 → 60.00 USD (+10.00)"));
    assert_eq!(
        cap(&pool, key).await,
        5_000,
        "nothing changes until approved"
    );
    let id = latest_request(&pool).await;

    // An operator may not decide at all.
    let refused = app
        .post_form(
            &format!("/approvals/{id}/decide"),
            "verdict=approve",
            Some(&operator),
        )
        .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);

    let approver = app.signed_in("lead@example.com", Role::Approver).await;
    let page = app.get("/", Some(&approver)).await;
    assert!(
        page.body.contains(r#"aria-label="1 waiting""#),
        "the navigation counts pending requests"
    );
    let approvals = app.get("/approvals", Some(&approver)).await;
    assert!(approvals
        .body
        .contains("Ten new customers signed up on the 30th"));
    assert!(approvals
        .body
        .contains("by ops@example.com from the key page"));
    assert!(approvals.body.contains(&format!("Approve request {id}")));
    assert!(
        approvals.body.contains(&format!(
            r#"formaction="/approvals/{id}/confirm" formmethod="get""#
        )),
        "Approve opens the confirmation first"
    );

    // Approving straight from the list, without the confirmation, changes nothing.
    let unconfirmed = app
        .post_form(
            &format!("/approvals/{id}/decide"),
            "verdict=approve&note=",
            Some(&approver),
        )
        .await;
    assert_eq!(unconfirmed.status, StatusCode::SEE_OTHER);
    let said = app.notice("/approvals", &approver).await;
    assert!(said.contains("was not approved: press Approve"), "{said}");
    assert_eq!(cap(&pool, key).await, 5_000);

    // The confirmation says what approving changes, and carries the note.
    let confirm = app
        .get(
            &format!("/approvals/{id}/confirm?note=Checked+the+sign-ups"),
            Some(&approver),
        )
        .await;
    assert_eq!(confirm.status, StatusCode::OK, "{}", confirm.body);
    for figure in [
        "The cap of ",
        "goes from 50.00 to 60.00 USD",
        "Still chargeable",
        "Ceiling for this key",
        "Approve: cap 60.00 USD",
        r#"value="Checked the sign-ups""#,
        r#"name="confirmed" value="yes""#,
    ] {
        assert!(confirm.body.contains(figure), "{figure} missing");
    }
    // An operator cannot open it at all.
    let own = app
        .get(&format!("/approvals/{id}/confirm"), Some(&operator))
        .await;
    assert_eq!(own.status, StatusCode::FORBIDDEN);

    let said = decide(&app, id, "approve", "Checked the sign-ups", &approver).await;
    assert!(said.contains("now has a cap of 60.00 USD"), "{said}");
    assert_eq!(cap(&pool, key).await, 6_000);

    // The proxy sees the new cap on the very next call.
    let retried = app.charge(&secret, CHARGE).await;
    assert_eq!(retried.status, StatusCode::OK, "{}", retried.body);
    // The raised cap re-arms the 90 % alert: 60.00 of 60.00 is a new crossing.
    let alerts: Vec<(String, i64)> =
        sqlx::query_as("SELECT kind, cap_cents FROM alerts WHERE vault_key_id = $1 ORDER BY id")
            .bind(key)
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        alerts,
        [
            ("threshold".into(), 5_000),
            ("cap_refused".into(), 5_000),
            ("threshold".into(), 6_000)
        ]
    );

    let history = app.get(&format!("/keys/{key}"), Some(&operator)).await.body;
    assert!(history.contains("Cap history"));
    assert!(
        history.contains("approved by lead@example.com"),
        "{history}"
    );
    assert!(history.contains("Checked the sign-ups"));
    let actions: Vec<(String, Option<String>)> = sqlx::query_as(
        "SELECT a.action, o.email FROM operator_actions a LEFT JOIN operators o ON o.id = a.operator_id
         WHERE a.action LIKE 'cap_increase.%' ORDER BY a.id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        actions,
        [
            (
                "cap_increase.request".into(),
                Some("ops@example.com".into())
            ),
            (
                "cap_increase.approve".into(),
                Some("lead@example.com".into())
            ),
        ]
    );
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn the_requester_can_never_decide_their_own_request(pool: PgPool) {
    let (app, _stripe, _secret, key) = proxy_with_key(pool.clone(), 5_000).await;
    let admin = app.signed_in("admin@example.com", Role::Admin).await;
    app.post_form(
        &format!("/keys/{key}/cap-increase-requests"),
        &ask("70", "Month-end upgrades", "raise_cap"),
        Some(&admin),
    )
    .await;
    let id = latest_request(&pool).await;

    let approvals = app.get("/approvals", Some(&admin)).await.body;
    assert!(approvals.contains("You asked for this increase"));
    assert!(!approvals.contains(&format!("Approve request {id}")));
    // Nor does the confirmation open for them.
    let confirm = app
        .get(&format!("/approvals/{id}/confirm"), Some(&admin))
        .await;
    assert!(
        confirm
            .body
            .contains("another approver must decide it (four-eyes rule)"),
        "{}",
        confirm.body
    );
    assert!(!confirm.body.contains(r#"name="confirmed""#));
    // Posting anyway is refused with the rule's name.
    let said = decide(&app, id, "approve", "", &admin).await;
    assert!(said.contains("four-eyes rule"), "{said}");
    assert_eq!(cap(&pool, key).await, 5_000);

    // And the database refuses it whoever asks, even bypassing Vaultcap.
    let err = sqlx::query(
        "UPDATE cap_increase_requests SET decision = 'approved', decided_at = now(),
                decided_by = requested_by WHERE id = $1",
    )
    .bind(id)
    .execute(&pool)
    .await
    .unwrap_err();
    assert_eq!(
        err.as_database_error().unwrap().constraint(),
        Some("cap_increase_four_eyes")
    );
    // A decision that raced past the checks says which rule it broke.
    assert!(
        app::cap_increases::rules::decision_refused(err, "cap_increase")
            .to_string()
            .contains("four-eyes rule")
    );
    // Nor may someone without the approver role decide.
    let viewer = app.add_operator("viewer@example.com", Role::Operator).await;
    let err = sqlx::query(
        "UPDATE cap_increase_requests SET decision = 'approved', decided_at = now(), decided_by = $2
         WHERE id = $1",
    )
    .bind(id)
    .bind(viewer)
    .execute(&pool)
    .await
    .unwrap_err();
    assert_eq!(
        err.as_database_error().unwrap().constraint(),
        Some("cap_increase_decided_by_approver")
    );
    assert!(matches!(
        app::cap_increases::rules::decision_refused(err, "cap_increase"),
        app::error::AppError::Forbidden(Role::Approver)
    ));
}

/// An admin who makes an API token and asks for more with it is still the
/// one asking: they cannot approve it (otherwise one person could do both).
#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn the_maker_of_the_token_that_asked_cannot_decide_either(pool: PgPool) {
    let (app, _stripe, _secret, key) = proxy_with_key(pool.clone(), 5_000).await;
    let admin = app.signed_in("admin@example.com", Role::Admin).await;
    let created = app
        .post_form(
            "/tokens",
            "name=my+own+job&scope=cap_requests%3Acreate&days=1",
            Some(&admin),
        )
        .await;
    let page = app.get("/tokens", Some(&created.revealing(&admin))).await;
    let token = one_time_secret(&page.body).expect("the new token is shown once");
    let asked = app
        .post_json(
            &format!("/vault/keys/{key}/cap-increase-requests"),
            &token,
            json!({ "new_cap_cents": 7_000, "reason": "more seats" }),
        )
        .await;
    assert_eq!(asked.status, StatusCode::CREATED, "{}", asked.body);
    let id = latest_request(&pool).await;

    let approvals = app.get("/approvals", Some(&admin)).await.body;
    assert!(!approvals.contains(&format!("Approve request {id}")));
    let said = decide(&app, id, "approve", "", &admin).await;
    assert!(said.contains("made the API token that did"), "{said}");
    assert_eq!(cap(&pool, key).await, 5_000);

    // The database refuses it too, whoever writes the row.
    let err = sqlx::query(
        "UPDATE cap_increase_requests r SET decision = 'approved', decided_at = now(),
                decided_by = t.created_by
         FROM api_tokens t WHERE t.id = r.requested_by_token AND r.id = $1",
    )
    .bind(id)
    .execute(&pool)
    .await
    .unwrap_err();
    assert_eq!(
        err.as_database_error().unwrap().constraint(),
        Some("cap_increase_four_eyes")
    );

    // Another approver decides it.
    let approver = app.signed_in("approver@example.com", Role::Approver).await;
    let said = decide(&app, id, "approve", "", &approver).await;
    assert!(said.contains("Approved"), "{said}");
    assert_eq!(cap(&pool, key).await, 7_000);
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn two_approvers_deciding_at_once_make_exactly_one_decision(pool: PgPool) {
    let (app, _stripe, _secret, key) = proxy_with_key(pool.clone(), 5_000).await;
    let token = app.api_token().await;
    let first = me(&app, "first@example.com", Role::Approver).await;
    let second = me(&app, "second@example.com", Role::Admin).await;
    for round in 1..=10 {
        let asked = app
            .post_json(
                &format!("/vault/keys/{key}/cap-increase-requests"),
                &token,
                json!({ "additional_cents": 100, "reason": format!("round {round}") }),
            )
            .await;
        assert_eq!(asked.status, StatusCode::CREATED, "{}", asked.body);
        let id = app::domain::CapIncreaseId(asked.json()["id"].as_i64().unwrap());
        let (a, b) = tokio::join!(
            cap_increases::decide(&pool, &first, None, id, Verdict::Approve, ""),
            cap_increases::decide(&pool, &second, None, id, Verdict::Reject, "too much"),
        );
        let (won, lost) = match (a, b) {
            (Ok(won), Err(lost)) | (Err(lost), Ok(won)) => (won, lost),
            (a, b) => panic!("round {round}: exactly one decision wins, got {a:?} and {b:?}"),
        };
        let AppError::Invalid(message) = lost else {
            panic!("round {round}: {lost:?}");
        };
        assert!(
            message.contains(&format!("request #{id} was already")),
            "{message}"
        );
        let raised = i64::from(won.request.state == app::domain::RequestState::Approved);
        let expected_cap = crate::helpers::count(
            &pool,
            "SELECT 5000 + 100 * count(*) FROM cap_increase_requests WHERE decision = 'approved'",
        )
        .await;
        assert_eq!(cap(&pool, key).await, expected_cap, "round {round}");
        assert!(raised <= 1);
    }
    let decisions = crate::helpers::count(&pool, "SELECT count(*) FROM operator_actions WHERE action IN ('cap_increase.approve', 'cap_increase.reject')").await;
    assert_eq!(decisions, 10, "one recorded decision per request");
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn bad_requests_are_refused_with_a_message_and_change_nothing(pool: PgPool) {
    let (app, _stripe, _secret, key) = proxy_with_key(pool.clone(), 5_000).await;
    let operator = app.signed_in("ops@example.com", Role::Operator).await;
    let cases = [
        (
            ask("50.00", "same", "raise_cap"),
            "must be above the current cap 50.00 USD",
        ),
        (
            ask("49", "less", "raise_cap"),
            "must be above the current cap",
        ),
        (
            ask("150.01", "too much", "raise_cap"),
            "above the ceiling of 150.00 USD (300 % of the expected total 50.00 USD)",
        ),
        (ask("60", "  ", "raise_cap"), "say why the run needs more"),
        (
            ask("sixty", "reason", "raise_cap"),
            "the new cap: \"sixty\" is not an amount",
        ),
        (ask("-60", "reason", "raise_cap"), "is negative"),
        (ask("60.001", "reason", "raise_cap"), "2 decimals at most"),
        (
            ask("60", "reason", "both"),
            "\"both\" is not a way to apply an increase",
        ),
        (
            ask("60", &"x".repeat(2001), "raise_cap"),
            "longer than 2000 characters",
        ),
    ];
    for (body, message) in cases {
        let response = app
            .post_form(
                &format!("/keys/{key}/cap-increase-requests"),
                &body,
                Some(&operator),
            )
            .await;
        assert_eq!(response.status, StatusCode::SEE_OTHER);
        let back = response.location().to_owned();
        assert!(
            back.starts_with(&format!("/keys/{key}/cap-increase?origin=key_page&draft=")),
            "{back}"
        );
        let page = app.get(&back, Some(&operator)).await.body;
        assert!(page.contains("Nothing was requested"), "{page}");
        assert!(
            page.contains(&message.replace('"', "&quot;")) || page.contains(message),
            "{message}: {page}"
        );
        assert_eq!(requests(&pool).await, 0, "{message}");
    }
    // The reason typed comes back with the refused form.
    let response = app
        .post_form(
            &format!("/keys/{key}/cap-increase-requests"),
            &ask("1", "Keep this reason", "raise_cap"),
            Some(&operator),
        )
        .await;
    let page = app.get(response.location(), Some(&operator)).await.body;
    assert!(page.contains(">Keep this reason</textarea>"), "{page}");

    // One request at a time per key.
    let ok = app
        .post_form(
            &format!("/keys/{key}/cap-increase-requests"),
            &ask("60", "first", "raise_cap"),
            Some(&operator),
        )
        .await;
    assert_eq!(ok.location(), format!("/keys/{key}"));
    let again = app
        .post_form(
            &format!("/keys/{key}/cap-increase-requests"),
            &ask("70", "second", "raise_cap"),
            Some(&operator),
        )
        .await;
    let page = app.get(again.location(), Some(&operator)).await.body;
    assert!(
        page.contains("is already waiting for a decision on this key"),
        "{page}"
    );
    assert_eq!(requests(&pool).await, 1);

    // A revoked or expired key cannot be raised.
    let token = app.api_token().await;
    app.post_json(
        &format!("/vault/keys/{key}/revoke"),
        &token,
        json!({"reason": "done"}),
    )
    .await;
    let revoked = app
        .post_json(
            &format!("/vault/keys/{key}/cap-increase-requests"),
            &token,
            json!({ "new_cap_cents": 8000, "reason": "more" }),
        )
        .await;
    assert_eq!(revoked.status, StatusCode::BAD_REQUEST);
    assert!(revoked.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("is revoked"));
    let (_app2, _stripe2, _secret2, other) = proxy_with_key(pool.clone(), 5_000).await;
    sqlx::query("UPDATE vault_keys SET expires_at = now() - interval '1 second' WHERE id = $1")
        .bind(other)
        .execute(&pool)
        .await
        .unwrap();
    let expired = app
        .post_json(
            &format!("/vault/keys/{other}/cap-increase-requests"),
            &token,
            json!({ "new_cap_cents": 8000, "reason": "more" }),
        )
        .await;
    assert!(expired.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("is expired"));
    assert_eq!(requests(&pool).await, 1);
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn bad_decisions_are_refused_with_a_message_and_change_nothing(pool: PgPool) {
    let (app, _stripe, _secret, key) = proxy_with_key(pool.clone(), 5_000).await;
    let token = app.api_token().await;
    let file = |cents: i64| {
        let app = &app;
        let token = token.clone();
        async move {
            let asked = app
                .post_json(
                    &format!("/vault/keys/{key}/cap-increase-requests"),
                    &token,
                    json!({ "new_cap_cents": cents, "reason": "bigger run" }),
                )
                .await;
            assert_eq!(asked.status, StatusCode::CREATED, "{}", asked.body);
            asked.json()["id"].as_i64().unwrap()
        }
    };
    let approver = app.signed_in("lead@example.com", Role::Approver).await;
    let viewer = app.signed_in("viewer@example.com", Role::Viewer).await;

    let id = file(6_000).await;
    let forbidden = app
        .post_form(
            &format!("/approvals/{id}/decide"),
            "verdict=approve",
            Some(&viewer),
        )
        .await;
    assert_eq!(forbidden.status, StatusCode::FORBIDDEN);
    let said = decide(&app, id, "reject", "  ", &approver).await;
    assert!(said.contains("say why the increase is rejected"), "{said}");
    let said = decide(&app, id, "maybe", "", &approver).await;
    assert!(
        said.contains("\"maybe\" is not a decision")
            || said.contains("&quot;maybe&quot; is not a decision"),
        "{said}"
    );
    let said = decide(&app, id + 100, "approve", "", &approver).await;
    assert!(said.contains("That request no longer exists"), "{said}");
    assert_eq!(cap(&pool, key).await, 5_000);

    let said = decide(&app, id, "reject", "Run the numbers again", &approver).await;
    assert!(said.contains("Rejected"), "{said}");
    let said = decide(&app, id, "approve", "", &approver).await;
    assert!(
        said.contains(&format!(
            "request #{id} was already rejected by lead@example.com"
        )),
        "{said}"
    );
    assert_eq!(cap(&pool, key).await, 5_000);

    // An expired request cannot be decided, and says so.
    let id = file(6_000).await;
    sqlx::query(
        "UPDATE cap_increase_requests SET expires_at = now() - interval '1 minute' WHERE id = $1",
    )
    .bind(id)
    .execute(&pool)
    .await
    .unwrap();
    let said = decide(&app, id, "approve", "", &approver).await;
    assert!(
        said.contains(&format!("request #{id} expired at")),
        "{said}"
    );
    assert_eq!(cap(&pool, key).await, 5_000);
    let history = app
        .get("/approvals?tab=history", Some(&approver))
        .await
        .body;
    assert!(history.contains("status-request-expired"));
    assert!(history.contains("status-request-rejected"));
    assert!(history.contains("Note: Run the numbers again"));

    // A cap changed since the request was made: the approver is told.
    let id = file(7_000).await;
    sqlx::query("UPDATE vault_keys SET cap_cents = 5500 WHERE id = $1")
        .bind(key)
        .execute(&pool)
        .await
        .unwrap();
    let said = decide(&app, id, "approve", "", &approver).await;
    assert!(
        said.contains("cap changed since the request (from 50.00 to 55.00 USD)"),
        "{said}"
    );
    assert_eq!(cap(&pool, key).await, 5_500);
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_billing_job_asks_through_the_api_and_reads_the_decision(pool: PgPool) {
    let (app, _stripe, _secret, key) = proxy_with_key(pool.clone(), 5_000).await;
    let token = app.api_token().await;
    let path = format!("/vault/keys/{key}/cap-increase-requests");
    for (body, message) in [
        (
            json!({ "reason": "more" }),
            "give either new_cap_cents or additional_cents",
        ),
        (
            json!({ "new_cap_cents": 6000, "additional_cents": 1, "reason": "more" }),
            "give either",
        ),
        (
            json!({ "additional_cents": -5, "reason": "more" }),
            "must be a positive number of cents",
        ),
        (json!({ "additional_cents": 100, "reason": "" }), "say why"),
        (
            json!({ "additional_cents": 100, "reason": "x", "apply_as": "double" }),
            "not a way to apply",
        ),
        (
            json!({ "additional_cents": 100, "reason": "x", "approve": true }),
            "unknown field",
        ),
    ] {
        let refused = app.post_json(&path, &token, body).await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{message}");
        assert!(
            refused.json()["error"]["message"]
                .as_str()
                .unwrap()
                .contains(message),
            "{}",
            refused.body
        );
    }
    assert_eq!(
        app.api("POST", &path, None, Some(json!({}))).await.status,
        StatusCode::UNAUTHORIZED
    );
    let missing = app
        .post_json(
            "/vault/keys/999999/cap-increase-requests",
            &token,
            json!({ "additional_cents": 100, "reason": "x" }),
        )
        .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(requests(&pool).await, 0);

    let asked = app
        .post_json(
            &path,
            &token,
            json!({ "additional_cents": 2500, "reason": "Queue backlog after the outage" }),
        )
        .await;
    assert_eq!(asked.status, StatusCode::CREATED, "{}", asked.body);
    let asked = asked.json();
    assert_eq!(asked["state"], "pending");
    assert_eq!(
        (
            asked["from_cap_cents"].as_i64(),
            asked["to_cap_cents"].as_i64()
        ),
        (Some(5_000), Some(7_500))
    );
    assert_eq!(asked["requested_by"], "API token tests");

    let approver = app.signed_in("lead@example.com", Role::Approver).await;
    let approvals = app.get("/approvals", Some(&approver)).await.body;
    assert!(
        approvals.contains("by API token tests through the API"),
        "{approvals}"
    );
    decide(
        &app,
        asked["id"].as_i64().unwrap(),
        "approve",
        "ok",
        &approver,
    )
    .await;
    let listed = app.get_api(&path, &token).await.json();
    assert_eq!(listed[0]["state"], "approved");
    assert_eq!(listed[0]["decided_by"], "lead@example.com");
    assert_eq!(cap(&pool, key).await, 7_500);
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn approving_a_follow_on_key_issues_a_linked_key_for_the_difference(pool: PgPool) {
    let (app, _stripe, secret, key) = proxy_with_key(pool.clone(), 1_000).await;
    assert_eq!(app.charge(&secret, CHARGE).await.status, StatusCode::OK);
    let operator = app.signed_in("ops@example.com", Role::Operator).await;
    app.post_form(
        &format!("/keys/{key}/cap-increase-requests"),
        &ask("30.00", "Second batch of customers", "follow_on_key"),
        Some(&operator),
    )
    .await;
    let id = latest_request(&pool).await;
    let approver = app.signed_in("lead@example.com", Role::Approver).await;
    let confirm = app
        .get(&format!("/approvals/{id}/confirm"), Some(&approver))
        .await
        .body;
    assert!(
        confirm.contains("This key's cap stays as it is."),
        "{confirm}"
    );
    assert!(
        confirm.contains("Approve: issue a key for 20.00"),
        "{confirm}"
    );
    let approved = app
        .post_form(
            &format!("/approvals/{id}/decide"),
            "verdict=approve&confirmed=yes",
            Some(&approver),
        )
        .await;
    assert_eq!(approved.location(), "/approvals");
    let page = app
        .get("/approvals", Some(&approved.revealing(&approver)))
        .await
        .body;
    let follow_on_secret =
        one_time_secret(&page).expect("the follow-on key's secret is shown once");
    assert!(
        page.contains(&format!(
            "issued billing-run-2026-07 (follow-on #{id}) with a cap of 20.00 USD"
        )),
        "{page}"
    );

    let (child, child_cap, parent): (i64, i64, Option<i64>) = sqlx::query_as(
        "SELECT id, cap_cents, parent_key_id FROM vault_keys WHERE parent_key_id IS NOT NULL",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((child_cap, parent), (2_000, Some(key)));
    assert_eq!(
        cap(&pool, key).await,
        1_000,
        "the original key keeps its cap"
    );
    assert_eq!(
        app.charge(&secret, CHARGE).await.status,
        StatusCode::PAYMENT_REQUIRED
    );
    for _ in 0..2 {
        let charged = app.charge(&follow_on_secret, CHARGE).await;
        assert_eq!(charged.status, StatusCode::OK, "{}", charged.body);
    }
    // What the key can move in all now counts its follow-on key.
    let form = app
        .get(&format!("/keys/{key}/cap-increase"), Some(&operator))
        .await
        .body;
    assert!(form.contains("Above the current cap 30.00"), "{form}");
    let child_page = app
        .get(&format!("/keys/{child}"), Some(&operator))
        .await
        .body;
    assert!(child_page.contains(&format!("follow-on of key {key}")));
    let history = app.get(&format!("/keys/{key}"), Some(&operator)).await.body;
    assert!(
        history.contains(&format!("href=\"/keys/{child}\">Follow-on key")),
        "{history}"
    );
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn requests_and_decisions_reach_the_webhooks(pool: PgPool) {
    let (app, _stripe, _secret, key) = proxy_with_key(pool.clone(), 5_000).await;
    let (url, received) = receiver(StatusCode::OK).await;
    let notifier = crate::helpers::notifier(&pool, &[&url]).await;
    let operator = app.signed_in("ops@example.com", Role::Operator).await;
    app.post_form(
        &format!("/keys/{key}/cap-increase-requests"),
        &ask("60", "Plan upgrades", "raise_cap"),
        Some(&operator),
    )
    .await;
    assert_eq!(notifier.pass().await.unwrap().delivered, 1);
    let approver = app.signed_in("lead@example.com", Role::Approver).await;
    decide(
        &app,
        latest_request(&pool).await,
        "approve",
        "Fine",
        &approver,
    )
    .await;
    assert_eq!(notifier.pass().await.unwrap().delivered, 1);

    let sent = received.lock().unwrap().clone();
    let events: Vec<&str> = sent.iter().map(|b| b["event"].as_str().unwrap()).collect();
    assert_eq!(events, ["cap_increase.requested", "cap_increase.decided"]);
    assert_eq!(
        sent[0]["text"],
        "Vaultcap approval: ops@example.com asks to raise the cap of billing-run-2026-07: 50.00 → 60.00 USD (+10.00). Reason: Plan upgrades"
    );
    assert_eq!(
        sent[1]["text"],
        "Vaultcap approval: lead@example.com approved the cap increase for billing-run-2026-07 (50.00 → 60.00 USD (+10.00)) asked by ops@example.com. Note: Fine"
    );
    assert_eq!(sent[1]["cap_increase"]["to_cap_cents"], 6_000);
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_refused_call_and_its_alert_lead_to_a_prefilled_request(pool: PgPool) {
    let (app, _stripe, secret, key) = proxy_with_key(pool.clone(), 1_000).await;
    app.charge(&secret, CHARGE).await;
    let refused = app.charge(&secret, CHARGE).await;
    assert_eq!(refused.status, StatusCode::PAYMENT_REQUIRED);
    let call = crate::helpers::count(
        &pool,
        "SELECT id FROM audit_log WHERE decision = 'refused_cap'",
    )
    .await;
    let alert =
        crate::helpers::count(&pool, "SELECT id FROM alerts WHERE kind = 'cap_refused'").await;
    let operator = app.signed_in("ops@example.com", Role::Operator).await;

    let call_page = app
        .get(&format!("/audit/{call}"), Some(&operator))
        .await
        .body;
    let link = format!("/keys/{key}/cap-increase?origin=call:{call}");
    assert!(call_page.contains(&link), "{call_page}");
    let alerts_page = app.get("/alerts", Some(&operator)).await.body;
    assert!(alerts_page.contains(&format!("/keys/{key}/cap-increase?origin=alert:{alert}")));

    for origin in [format!("call:{call}"), format!("alert:{alert}")] {
        let form = app
            .get(
                &format!("/keys/{key}/cap-increase?origin={origin}"),
                Some(&operator),
            )
            .await
            .body;
        assert!(
            form.contains("The refused charge this request is about"),
            "{form}"
        );
        assert!(
            form.contains(
                "spent 10.00 + reserved 0.00 + remaining billing 10.00 × 1.1 = 21.00 USD, rounded up"
            ),
            "{form}"
        );
        assert!(form.contains(&format!("name=\"origin\" value=\"{origin}\"")));
    }
    // Recalculated with the billing still to come, as typed.
    let form = app
        .get(
            &format!("/keys/{key}/cap-increase?origin=key_page&remaining=25.50"),
            Some(&operator),
        )
        .await
        .body;
    assert!(
        form.contains("remaining billing 25.50 × 1.1 = 39.00 USD"),
        "{form}"
    );
    let bad = app
        .get(
            &format!("/keys/{key}/cap-increase?remaining=lots"),
            Some(&operator),
        )
        .await;
    assert!(
        bad.body
            .contains("remaining billing: &quot;lots&quot; is not an amount")
            || bad
                .body
                .contains("remaining billing: \"lots\" is not an amount"),
        "{}",
        bad.body
    );

    app.post_form(
        &format!("/keys/{key}/cap-increase-requests"),
        &format!("new_cap=20&reason=retry&apply_as=raise_cap&origin=call:{call}"),
        Some(&operator),
    )
    .await;
    let origin: String = sqlx::query_scalar("SELECT origin FROM cap_increase_requests")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(origin, format!("call:{call}"));
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_request_whose_key_moved_since_offers_no_approval(pool: PgPool) {
    let (app, _stripe, _secret, key) = proxy_with_key(pool.clone(), 5_000).await;
    let operator = app.signed_in("ops@example.com", Role::Operator).await;
    app.post_form(
        &format!("/keys/{key}/cap-increase-requests"),
        &ask("60.00", "Ten new customers", "raise_cap"),
        Some(&operator),
    )
    .await;
    let id = latest_request(&pool).await;
    sqlx::query("UPDATE vault_keys SET cap_cents = 5500 WHERE id = $1")
        .bind(key)
        .execute(&pool)
        .await
        .unwrap();

    let approver = app.signed_in("lead@example.com", Role::Approver).await;
    let confirm = app
        .get(&format!("/approvals/{id}/confirm"), Some(&approver))
        .await
        .body;
    assert!(
        confirm.contains("cap changed since the request (from 50.00 to 55.00 USD)"),
        "{confirm}"
    );
    assert!(!confirm.contains(r#"name="confirmed""#));
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn the_suggestion_from_a_keys_page_counts_the_charges_the_cap_refused(pool: PgPool) {
    // Cap 50.00, charges of 10.00: five go through, three more are refused
    // (one retried under its Idempotency-Key, still one charge).
    let (app, _stripe, secret, key) = proxy_with_key(pool.clone(), 5_000).await;
    for _ in 0..5 {
        let charged = app.charge(&secret, CHARGE).await;
        assert_eq!(charged.status, StatusCode::OK, "{}", charged.body);
    }
    for idempotency_key in ["run-6", "run-7", "run-8", "run-8"] {
        let refused = app
            .stripe(
                "/v1/charges",
                &secret,
                CHARGE,
                &[("Idempotency-Key", idempotency_key)],
            )
            .await;
        assert_eq!(
            refused.status,
            StatusCode::PAYMENT_REQUIRED,
            "{}",
            refused.body
        );
    }
    let operator = app.signed_in("ops@example.com", Role::Operator).await;
    let from_the_key_page = format!("/keys/{key}/cap-increase");

    let page = app.get(&from_the_key_page, Some(&operator)).await.body;
    assert!(
        page.contains("3 charges the cap refused have not got through since"),
        "{page}"
    );
    assert!(
        page.contains(
            "spent 50.00 + reserved 0.00 + remaining billing 30.00 × 1.1 = 83.00 USD, rounded up"
        ),
        "{page}"
    );
    assert!(!page.contains("already covers it"), "{page}");

    // Once one of them gets through, two wait.
    sqlx::query("UPDATE vault_keys SET cap_cents = 6000 WHERE id = $1")
        .bind(key)
        .execute(&pool)
        .await
        .unwrap();
    let retried = app
        .stripe(
            "/v1/charges",
            &secret,
            CHARGE,
            &[("Idempotency-Key", "run-7")],
        )
        .await;
    assert_eq!(retried.status, StatusCode::OK, "{}", retried.body);
    let page = app.get(&from_the_key_page, Some(&operator)).await.body;
    assert!(
        page.contains("2 charges the cap refused have not got through since"),
        "{page}"
    );
    assert!(page.contains("remaining billing 20.00 × 1.1"), "{page}");
}
