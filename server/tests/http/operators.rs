use axum::http::StatusCode;
use sqlx::PgPool;

use crate::helpers::{enc, one_time_secret, TestApp, TestResponse};
use app::{
    domain::{Email, Role},
    operators::accounts,
};

async fn action_count(pool: &PgPool, action: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM operator_actions WHERE action = $1")
        .bind(action)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Sets a password from an invitation link: where it lands.
async fn accept(app: &TestApp, token: &str, password: &str, again: &str) -> TestResponse {
    app.post_form(
        "/auth/invite",
        &format!(
            "token={}&password={}&password_again={}",
            enc(token),
            enc(password),
            enc(again)
        ),
        None,
    )
    .await
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn an_admin_invites_an_operator_who_sets_a_password_nobody_else_sees(pool: PgPool) {
    let app = TestApp::new(pool.clone());
    let cookie = app.signed_in("root@example.com", Role::Admin).await;

    let added = app
        .post_form(
            "/operators",
            "email=Bea%40Example.com&role=approver",
            Some(&cookie),
        )
        .await;
    assert_eq!(added.status, StatusCode::SEE_OTHER);
    assert_eq!(added.location(), "/operators");
    let page = app.get("/operators", Some(&added.revealing(&cookie))).await;
    assert!(
        page.body
            .contains("Added bea@example.com as approver. Send them this invitation link"),
        "{}",
        page.body
    );
    let link = one_time_secret(&page.body).expect("the invitation link is on the page");
    let token = link
        .strip_prefix("http://localhost/invite/")
        .expect("a link to this console")
        .to_owned();

    // Until the link is used nobody can sign in as bea, with any password.
    let hash: String =
        sqlx::query_scalar("SELECT password_hash FROM operators WHERE email = 'bea@example.com'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(hash, "!");
    let stored: Vec<u8> = sqlx::query_scalar("SELECT token_hash FROM operator_invitations")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        stored,
        app::ssr::secrets::hash(&token),
        "only its hash is kept"
    );

    // The page for the link is open without signing in.
    let invite = app.get(&format!("/invite/{token}"), None).await;
    assert_eq!(invite.status, StatusCode::OK);
    assert!(invite.body.contains("Set password"));

    let mismatch = accept(&app, &token, "a password of bea's", "another one entirely").await;
    assert_eq!(mismatch.location(), format!("/invite/{token}"));
    let set = accept(&app, &token, "a password of bea's", "a password of bea's").await;
    assert_eq!(set.location(), "/login?invited=1");
    let body = format!(
        "email=bea%40example.com&password={}",
        enc("a password of bea's")
    );
    assert_eq!(
        app.post_form("/auth/login", &body, None).await.location(),
        "/"
    );

    // Used once: a second use changes nothing and says why.
    let again = accept(&app, &token, "someone else's pass", "someone else's pass").await;
    let cookie = again
        .session_cookie()
        .expect("the message rides in a session");
    let said = app.get(again.location(), Some(&cookie)).await.body;
    assert!(
        said.contains("this invitation link was already used"),
        "{said}"
    );
    let body = format!(
        "email=bea%40example.com&password={}",
        enc("someone else's pass")
    );
    assert_eq!(
        app.post_form("/auth/login", &body, None).await.location(),
        "/login?error=invalid"
    );
    let logged: Vec<String> = sqlx::query_scalar(
        "SELECT action FROM operator_actions WHERE subject_type = 'operator' AND subject_id =
            (SELECT id::text FROM operators WHERE email = 'bea@example.com') ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(logged, ["add_operator", "accept_invitation", "sign_in"]);
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn an_expired_or_unknown_invitation_sets_nothing(pool: PgPool) {
    let app = TestApp::new(pool.clone());
    let admin = app.add_operator("root@example.com", Role::Admin).await;
    let actor = app::actions::sql::Actor::Operator {
        id: admin,
        ip: None,
    };
    let email = Email::parse("cid@example.com").unwrap();
    let (_, token) = accounts::invite_operator(&pool, actor, &email, Role::Viewer)
        .await
        .unwrap();
    sqlx::query(
        "UPDATE operator_invitations SET created_at = now() - interval '2 days',
                expires_at = now() - interval '1 day'",
    )
    .execute(&pool)
    .await
    .unwrap();
    for (token, says) in [
        (token.as_str(), "this invitation link expired on"),
        ("inv_made_up", "this invitation link is not valid"),
    ] {
        let refused = accept(&app, token, "a fine password!", "a fine password!").await;
        let cookie = refused.session_cookie().unwrap();
        let said = app.get(refused.location(), Some(&cookie)).await.body;
        assert!(said.contains(says), "{said}");
    }
    let hash: String =
        sqlx::query_scalar("SELECT password_hash FROM operators WHERE email = 'cid@example.com'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(hash, "!", "nothing was set");
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn adding_an_operator_twice_or_with_bad_fields_explains_and_changes_nothing(pool: PgPool) {
    let app = TestApp::new(pool.clone());
    let cookie = app.signed_in("root@example.com", Role::Admin).await;

    let cases = [
        (
            "email=root%40example.com&role=viewer",
            "Nothing was changed: root@example.com already has an account",
        ),
        ("email=not-an-email&role=viewer", "is not an email address"),
        ("email=new%40example.com&role=superuser", "unknown role"),
        ("email=new%40example.com", "the form could not be read"),
        ("email=%3Cscript%3E%40x.com&role=viewer", "Added"),
    ];
    for (body, expected) in cases {
        let response = app.post_form("/operators", body, Some(&cookie)).await;
        assert_eq!(response.status, StatusCode::SEE_OTHER, "{body}");
        let page = app.get("/operators", Some(&cookie)).await;
        assert!(
            page.body.contains(expected),
            "{body}: expected {expected:?}"
        );
        assert!(!page.body.contains("<script>"), "user input is escaped");
    }
    let count = crate::helpers::count(&pool, "SELECT count(*) FROM operators").await;
    assert_eq!(count, 2, "only the valid addition went through");
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_viewer_is_denied_the_operators_page_and_its_forms(pool: PgPool) {
    let app = TestApp::new(pool.clone());
    let cookie = app.signed_in("viewer@example.com", Role::Viewer).await;

    let page = app.get("/operators", Some(&cookie)).await;
    assert_eq!(page.status, StatusCode::FORBIDDEN);
    assert!(page.body.contains("You do not have access to this page"));

    let post = app
        .post_form(
            "/operators",
            "email=x%40example.com&role=admin",
            Some(&cookie),
        )
        .await;
    assert_eq!(post.status, StatusCode::FORBIDDEN);
    let role = app
        .post_form("/operators/1/role", "role=admin", Some(&cookie))
        .await;
    assert_eq!(role.status, StatusCode::FORBIDDEN);
    let count =
        crate::helpers::count(&pool, "SELECT count(*) FROM operators WHERE role = 'admin'").await;
    assert_eq!(count, 0);
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn an_admin_changes_roles_and_disables_operators_but_never_the_last_admin(pool: PgPool) {
    let app = TestApp::new(pool.clone());
    let root = app.add_operator("root@example.com", Role::Admin).await;
    let bea = app.add_operator("bea@example.com", Role::Viewer).await;
    let cookie = app.sign_in("root@example.com").await;

    app.post_form(
        &format!("/operators/{bea}/role"),
        "role=operator",
        Some(&cookie),
    )
    .await;
    assert!(app
        .get("/operators", Some(&cookie))
        .await
        .body
        .contains("bea@example.com is now operator."));

    app.post_form(
        &format!("/operators/{root}/role"),
        "role=viewer",
        Some(&cookie),
    )
    .await;
    assert!(app
        .get("/operators", Some(&cookie))
        .await
        .body
        .contains("root@example.com is the only active admin"));

    app.post_form(
        &format!("/operators/{root}/disabled"),
        "disabled=true",
        Some(&cookie),
    )
    .await;
    assert!(app
        .get("/operators", Some(&cookie))
        .await
        .body
        .contains("you cannot disable your own account"));

    app.post_form(
        &format!("/operators/{bea}/disabled"),
        "disabled=true",
        Some(&cookie),
    )
    .await;
    assert!(app
        .get("/operators", Some(&cookie))
        .await
        .body
        .contains("bea@example.com is disabled."));

    let missing = app
        .post_form("/operators/999999/disabled", "disabled=true", Some(&cookie))
        .await;
    assert_eq!(missing.status, StatusCode::SEE_OTHER);
    assert!(app
        .get("/operators", Some(&cookie))
        .await
        .body
        .contains("That operator no longer exists."));

    let roles: Vec<(String, String, bool)> =
        sqlx::query_as("SELECT email, role, disabled_at IS NOT NULL FROM operators ORDER BY email")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        roles,
        vec![
            ("bea@example.com".into(), "operator".into(), true),
            ("root@example.com".into(), "admin".into(), false)
        ]
    );
    assert_eq!(action_count(&pool, "change_role").await, 1);
    assert_eq!(action_count(&pool, "disable_operator").await, 1);
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn the_first_start_creates_one_admin_and_later_starts_none(pool: PgPool) {
    let email = Email::parse("admin@localhost").unwrap();
    let password = accounts::bootstrap_admin(&pool, &email)
        .await
        .unwrap()
        .expect("a password for the first admin");
    assert_eq!(password.len(), 20);
    assert_eq!(
        accounts::bootstrap_admin(&pool, &email).await.unwrap(),
        None
    );

    let admins: Vec<(String, String)> = sqlx::query_as("SELECT email, role FROM operators")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(admins, vec![("admin@localhost".into(), "admin".into())]);
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn an_oversized_console_form_keeps_its_413_rather_than_a_redirect(pool: PgPool) {
    let app = TestApp::new(pool);
    let cookie = app.signed_in("root@example.com", Role::Admin).await;
    let huge = format!(
        "email=a%40b.com&role={}",
        "x".repeat(server::http::MAX_FORM_BODY + 1)
    );
    let response = app.post_form("/operators", &huge, Some(&cookie)).await;
    assert_eq!(response.status, StatusCode::PAYLOAD_TOO_LARGE);
}
