use axum::http::StatusCode;
use sqlx::PgPool;

use crate::helpers::{one_time_secret, TestApp};
use app::{
    domain::{Email, Role},
    ssr::accounts,
};

async fn action_count(pool: &PgPool, action: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM operator_actions WHERE action = $1")
        .bind(action)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn an_admin_adds_an_operator_whose_password_is_shown_once_and_stored_hashed(pool: PgPool) {
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
        page.body.contains("Added bea@example.com as approver."),
        "{}",
        page.body
    );
    let password = one_time_secret(&page.body).expect("the generated password is on the page");
    assert_eq!(password.len(), 20);

    let again = app.get("/operators", Some(&cookie)).await;
    assert!(
        !again.body.contains(&password),
        "the password is shown only once"
    );

    let hash: String =
        sqlx::query_scalar("SELECT password_hash FROM operators WHERE email = 'bea@example.com'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(hash.starts_with("$argon2id$"));
    assert!(!hash.contains(&password));
    assert_eq!(
        action_count(&pool, "add_operator").await,
        2,
        "the CLI's and the console's additions are both logged"
    );

    // And the new operator can sign in with it.
    let body = format!("email=bea%40example.com&password={password}");
    assert_eq!(
        app.post_form("/auth/login", &body, None).await.location(),
        "/"
    );
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
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM operators")
        .fetch_one(&pool)
        .await
        .unwrap();
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
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM operators WHERE role = 'admin'")
        .fetch_one(&pool)
        .await
        .unwrap();
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
