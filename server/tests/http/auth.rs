use axum::http::StatusCode;
use sqlx::PgPool;

use crate::helpers::{enc, TestApp, PASSWORD};
use app::{domain::Role, ssr::AuthConfig};

fn sign_in_body(email: &str, password: &str) -> String {
    format!("email={}&password={}", enc(email), enc(password))
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn signing_in_sets_a_strict_http_only_session_cookie_and_opens_the_console(pool: PgPool) {
    let app = TestApp::new(pool);
    app.add_operator("ana@example.com", Role::Viewer).await;

    let response = app
        .post_form(
            "/auth/login",
            &sign_in_body("Ana@Example.com", PASSWORD),
            None,
        )
        .await;
    assert_eq!(response.status, StatusCode::SEE_OTHER);
    assert_eq!(response.location(), "/");
    let set_cookie = response.set_cookie().unwrap();
    assert!(set_cookie.contains("HttpOnly"), "{set_cookie}");
    assert!(set_cookie.contains("SameSite=Strict"), "{set_cookie}");
    assert!(!set_cookie.contains("Secure"), "no TLS here: {set_cookie}");

    let overview = app.get("/", response.session_cookie().as_deref()).await;
    assert_eq!(overview.status, StatusCode::OK);
    assert!(
        overview.body.contains("ana@example.com"),
        "the frame shows who is signed in"
    );
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn behind_tls_the_session_cookie_is_secure(pool: PgPool) {
    let app = TestApp::with_auth(
        pool,
        AuthConfig {
            secure_cookies: true,
            ..AuthConfig::default()
        },
    );
    app.add_operator("ana@example.com", Role::Viewer).await;
    let response = app
        .post_form(
            "/auth/login",
            &sign_in_body("ana@example.com", PASSWORD),
            None,
        )
        .await;
    assert!(response.set_cookie().unwrap().contains("Secure"));
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn signing_in_rotates_the_session_id(pool: PgPool) {
    let app = TestApp::new(pool);
    app.add_operator("ana@example.com", Role::Viewer).await;
    let first = app.sign_in("ana@example.com").await;

    let again = app
        .post_form(
            "/auth/login",
            &sign_in_body("ana@example.com", PASSWORD),
            Some(&first),
        )
        .await;
    let second = again.session_cookie().expect("a new cookie");
    assert_ne!(first, second, "the session id changes at sign-in");
    assert_eq!(
        app.get("/", Some(&first)).await.status,
        StatusCode::SEE_OTHER,
        "the old id is dead"
    );
    assert_eq!(app.get("/", Some(&second)).await.status, StatusCode::OK);
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_wrong_password_and_an_unknown_email_get_the_same_answer(pool: PgPool) {
    let app = TestApp::new(pool);
    app.add_operator("ana@example.com", Role::Viewer).await;

    let wrong = app
        .post_form(
            "/auth/login",
            &sign_in_body("ana@example.com", "not the password"),
            None,
        )
        .await;
    let unknown = app
        .post_form(
            "/auth/login",
            &sign_in_body("nobody@example.com", PASSWORD),
            None,
        )
        .await;
    for response in [&wrong, &unknown] {
        assert_eq!(response.status, StatusCode::SEE_OTHER);
        assert_eq!(response.location(), "/login?error=invalid");
        assert!(
            response.session_cookie().is_none(),
            "no session for a failed sign-in"
        );
    }
    let page = app.get("/login?error=invalid", None).await;
    assert!(page.body.contains("Email or password is incorrect."));
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_disabled_operator_cannot_sign_in(pool: PgPool) {
    let app = TestApp::new(pool.clone());
    let id = app.add_operator("ana@example.com", Role::Operator).await;
    sqlx::query("UPDATE operators SET disabled_at = now() WHERE id = $1")
        .bind(id)
        .execute(&pool)
        .await
        .unwrap();

    let response = app
        .post_form(
            "/auth/login",
            &sign_in_body("ana@example.com", PASSWORD),
            None,
        )
        .await;
    assert_eq!(response.location(), "/login?error=disabled");
    assert!(app
        .get("/login?error=disabled", None)
        .await
        .body
        .contains("This account is disabled."));
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn disabling_an_operator_ends_their_open_session(pool: PgPool) {
    let app = TestApp::new(pool.clone());
    let id = app.add_operator("ana@example.com", Role::Operator).await;
    let cookie = app.sign_in("ana@example.com").await;
    sqlx::query("UPDATE operators SET disabled_at = now() WHERE id = $1")
        .bind(id)
        .execute(&pool)
        .await
        .unwrap();

    let response = app.get("/keys", Some(&cookie)).await;
    assert_eq!(response.status, StatusCode::SEE_OTHER);
    assert!(
        response.location().starts_with("/login?error=expired"),
        "{}",
        response.location()
    );
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn repeated_failures_lock_the_account_even_for_the_right_password(pool: PgPool) {
    let app = TestApp::new(pool);
    app.add_operator("ana@example.com", Role::Viewer).await;
    for _ in 0..AuthConfig::default().max_failures_per_account {
        let response = app
            .post_form(
                "/auth/login",
                &sign_in_body("ana@example.com", "guess"),
                None,
            )
            .await;
        assert_eq!(response.location(), "/login?error=invalid");
    }
    let response = app
        .post_form(
            "/auth/login",
            &sign_in_body("ANA@example.com", PASSWORD),
            None,
        )
        .await;
    assert_eq!(response.location(), "/login?error=throttled&minutes=15");
    assert!(response.session_cookie().is_none());
    assert!(app
        .get(response.location(), None)
        .await
        .body
        .contains("Try again in 15 minutes"));
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn repeated_failures_from_one_address_are_throttled_across_accounts(pool: PgPool) {
    let auth = AuthConfig {
        max_failures_per_ip: 3,
        ..AuthConfig::default()
    };
    let app = TestApp::with_auth(pool, auth);
    app.add_operator("ana@example.com", Role::Viewer).await;
    let from_one_address =
        |email: &str, password: &str| {
            let mut request = axum::http::Request::post("/auth/login")
                .header("host", "localhost")
                .header("origin", "http://localhost")
                .header("content-type", "application/x-www-form-urlencoded")
                .body(axum::body::Body::from(sign_in_body(email, password)))
                .unwrap();
            request.extensions_mut().insert(axum::extract::ConnectInfo(
                std::net::SocketAddr::from(([203, 0, 113, 7], 4000)),
            ));
            request
        };
    for n in 0..3 {
        let response = app
            .send(from_one_address(&format!("guess{n}@example.com"), "x"))
            .await;
        assert_eq!(response.location(), "/login?error=invalid");
    }
    let response = app
        .send(from_one_address("ana@example.com", PASSWORD))
        .await;
    assert_eq!(response.location(), "/login?error=throttled&minutes=15");
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn an_idle_session_expires_and_says_so(pool: PgPool) {
    // An idle timeout of zero makes every later request idle for too long.
    let auth = AuthConfig {
        idle_timeout: chrono::Duration::zero(),
        ..AuthConfig::default()
    };
    let app = TestApp::with_auth(pool, auth);
    let cookie = app.signed_in("ana@example.com", Role::Viewer).await;

    let response = app.get("/keys", Some(&cookie)).await;
    assert_eq!(response.status, StatusCode::SEE_OTHER);
    assert_eq!(response.location(), "/login?error=expired&next=%2Fkeys");
    assert!(app
        .get(response.location(), None)
        .await
        .body
        .contains("Your session expired."));
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_session_ends_at_the_absolute_timeout_however_active(pool: PgPool) {
    let auth = AuthConfig {
        absolute_timeout: chrono::Duration::zero(),
        ..AuthConfig::default()
    };
    let app = TestApp::with_auth(pool, auth);
    let cookie = app.signed_in("ana@example.com", Role::Viewer).await;
    assert!(app
        .get("/", Some(&cookie))
        .await
        .location()
        .starts_with("/login?error=expired"));
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn signing_out_ends_the_session(pool: PgPool) {
    let app = TestApp::new(pool);
    let cookie = app.signed_in("ana@example.com", Role::Viewer).await;

    let response = app.post_form("/auth/logout", "", Some(&cookie)).await;
    assert_eq!(response.location(), "/login?signed_out=1");
    assert_eq!(
        app.get("/", Some(&cookie)).await.status,
        StatusCode::SEE_OTHER
    );
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn anonymous_visitors_are_sent_to_sign_in_and_come_back_after(pool: PgPool) {
    let app = TestApp::new(pool);
    app.add_operator("ana@example.com", Role::Viewer).await;

    let response = app.get("/keys?period=2026-07", None).await;
    assert_eq!(response.status, StatusCode::SEE_OTHER);
    assert_eq!(
        response.location(),
        "/login?next=%2Fkeys%3Fperiod%3D2026-07"
    );

    let body = format!(
        "{}&next={}",
        sign_in_body("ana@example.com", PASSWORD),
        enc("/keys?period=2026-07")
    );
    let signed_in = app.post_form("/auth/login", &body, None).await;
    assert_eq!(signed_in.location(), "/keys?period=2026-07");
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn sign_in_never_redirects_off_site(pool: PgPool) {
    let app = TestApp::new(pool);
    app.add_operator("ana@example.com", Role::Viewer).await;
    for next in [
        "//evil.example/",
        "https://evil.example/",
        "/\\evil.example",
        // Browsers drop the tab (and newlines) and go to //evil.example.
        "/\t/evil.example",
        "/\n/evil.example",
        "/ /evil.example",
    ] {
        let body = format!(
            "{}&next={}",
            sign_in_body("ana@example.com", PASSWORD),
            enc(next)
        );
        assert_eq!(
            app.post_form("/auth/login", &body, None).await.location(),
            "/",
            "next={next:?}"
        );
        // Nor does a failed sign-in carry the address on.
        let body = format!(
            "{}&next={}",
            sign_in_body("ana@example.com", "wrong password!"),
            enc(next)
        );
        let refused = app.post_form("/auth/login", &body, None).await;
        assert_eq!(refused.location(), "/login?error=invalid", "next={next:?}");
    }
    let page = app
        .get(&format!("/login?next={}", enc("/\t/evil.example")), None)
        .await;
    assert!(page.body.contains("would have sent you to another site"));
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_malformed_sign_in_form_gets_a_message_not_an_error(pool: PgPool) {
    let app = TestApp::new(pool);
    for body in [
        "",
        "email=only@example.com",
        "password=x",
        "email=&password=",
        "%zz=%zz",
    ] {
        let response = app.post_form("/auth/login", body, None).await;
        assert_eq!(response.status, StatusCode::SEE_OTHER, "body {body:?}");
        assert!(
            response.location().starts_with("/login?error=form"),
            "body {body:?}: {}",
            response.location()
        );
    }
    assert!(app
        .get("/login?error=form", None)
        .await
        .body
        .contains("Enter your email and password."));
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_cross_origin_post_is_refused(pool: PgPool) {
    let app = TestApp::new(pool);
    let cookie = app.signed_in("ana@example.com", Role::Admin).await;

    let forged = app
        .post_form_from(
            "/operators",
            "email=mallory%40example.com&role=admin",
            Some(&cookie),
            Some("https://evil.example"),
        )
        .await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);
    assert!(forged.body.contains("did not come from a Vaultcap page"));
    let no_origin = app
        .post_form_from("/auth/logout", "", Some(&cookie), None)
        .await;
    assert_eq!(no_origin.status, StatusCode::FORBIDDEN);

    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM operators")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(count, 1, "nothing was added");
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn an_oversized_body_is_refused_with_413(pool: PgPool) {
    let app = TestApp::new(pool);
    let huge = format!(
        "email=a%40b.com&password={}",
        "x".repeat(server::http::MAX_FORM_BODY + 1)
    );
    let response = app.post_form("/auth/login", &huge, None).await;
    assert_eq!(response.status, StatusCode::PAYLOAD_TOO_LARGE);
}
