//! The optional second factor: an approver sets up an authenticator, and
//! sign-in then asks for a code that works once; recovery codes work once.

use sqlx::PgPool;
use totp_rs::{Algorithm, TOTP};

use crate::helpers::{enc, one_time_secret, TestApp, PASSWORD};
use app::{actions::sql::Actor, domain::Role};

const EMAIL: &str = "approver@example.com";

/// The code the approver's authenticator shows `steps_ahead` steps from now.
async fn code(pool: &PgPool, column: &str, steps_ahead: u64) -> String {
    let secret: Vec<u8> =
        sqlx::query_scalar(&format!("SELECT {column} FROM operators WHERE email = $1"))
            .bind(EMAIL)
            .fetch_one(pool)
            .await
            .unwrap();
    let totp = TOTP::new(Algorithm::SHA1, 6, 1, 30, secret, None, EMAIL.into()).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    totp.generate(now + 30 * steps_ahead)
}

/// Signs in with the password: the session waiting for its code.
async fn password_step(app: &TestApp) -> String {
    let response = app
        .post_form(
            "/auth/login",
            &format!(
                "email={}&password={}&next=%2Fapprovals",
                enc(EMAIL),
                enc(PASSWORD)
            ),
            None,
        )
        .await;
    assert_eq!(
        response.location(),
        "/login?step=code&next=%2Fapprovals",
        "the password alone does not sign in"
    );
    let cookie = response.session_cookie().unwrap();
    let page = app.get("/approvals", Some(&cookie)).await;
    assert!(
        page.location().starts_with("/login"),
        "a session waiting for its code is not signed in"
    );
    cookie
}

/// The approver, signed in, with two-factor sign-in set up and confirmed.
async fn with_two_factor(app: &TestApp) -> String {
    let approver = app.signed_in(EMAIL, Role::Approver).await;
    app.post_form("/account/two-factor/setup", "", Some(&approver))
        .await;
    let first = code(&app.pool, "totp_pending_secret", 0).await;
    app.post_form(
        "/account/two-factor/confirm",
        &format!("code={first}"),
        Some(&approver),
    )
    .await;
    approver
}

async fn code_step(app: &TestApp, cookie: &str, code: &str) -> crate::helpers::TestResponse {
    app.post_form(
        "/auth/login/code",
        &format!("code={}&next=%2Fapprovals", enc(code)),
        Some(cookie),
    )
    .await
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn with_two_factor_on_sign_in_takes_a_code_once_and_each_recovery_code_once(pool: PgPool) {
    let app = TestApp::new(pool.clone());
    let approver = app.signed_in(EMAIL, Role::Approver).await;
    let page = app.get("/account/two-factor", Some(&approver)).await.body;
    assert!(page.contains("Set up two-factor sign-in"), "{page}");

    app.post_form("/account/two-factor/setup", "", Some(&approver))
        .await;
    let page = app.get("/account/two-factor", Some(&approver)).await.body;
    assert!(page.contains("<svg"), "a QR code to scan");
    assert!(
        page.contains("data-testid=\"totp-secret\""),
        "and the secret to type"
    );

    app.post_form(
        "/account/two-factor/confirm",
        "code=12345x",
        Some(&approver),
    )
    .await;
    assert!(app
        .notice("/account/two-factor", &approver)
        .await
        .contains("that code does not match"));
    let first = code(&pool, "totp_pending_secret", 0).await;
    let confirmed = app
        .post_form(
            "/account/two-factor/confirm",
            &format!("code={first}"),
            Some(&approver),
        )
        .await;
    let page = app
        .get("/account/two-factor", Some(&confirmed.revealing(&approver)))
        .await
        .body;
    let recovery: Vec<String> = one_time_secret(&page)
        .expect("the recovery codes are shown once")
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    assert_eq!(recovery.len(), 10);

    // The code that confirmed the authenticator cannot sign in again.
    let cookie = password_step(&app).await;
    let replayed = code_step(&app, &cookie, &first).await;
    assert!(
        replayed.location().contains("error=code_used"),
        "{}",
        replayed.location()
    );

    let wrong = code_step(&app, &cookie, "000000x").await;
    assert!(
        wrong.location().contains("error=code&"),
        "{}",
        wrong.location()
    );

    let next = code(&pool, "totp_secret", 1).await;
    let signed_in = code_step(&app, &cookie, &next).await;
    assert_eq!(signed_in.location(), "/approvals");
    let session = signed_in.session_cookie().expect("a new session id");
    assert_eq!(app.get("/approvals", Some(&session)).await.status, 200);

    // The same code a second time, from another sign-in: refused.
    let cookie = password_step(&app).await;
    let again = code_step(&app, &cookie, &next).await;
    assert!(again.location().contains("error=code_used"));

    // A recovery code, typed loosely, signs in once.
    let loose = recovery[0].to_uppercase().replace('-', " ");
    assert_eq!(
        code_step(&app, &cookie, &loose).await.location(),
        "/approvals"
    );
    let cookie = password_step(&app).await;
    let used = code_step(&app, &cookie, &recovery[0]).await;
    assert!(used.location().contains("error=code&"));

    let (failed, with_factor): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE action = 'sign_in_failed'),
                count(*) FILTER (WHERE action = 'sign_in' AND details ? 'second_factor')
         FROM operator_actions",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        (failed, with_factor),
        (4, 2),
        "every refused and accepted code is logged"
    );
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn wrong_codes_are_throttled_like_wrong_passwords(pool: PgPool) {
    let app = TestApp::new(pool.clone());
    with_two_factor(&app).await;

    let cookie = password_step(&app).await;
    let mut outcomes = Vec::new();
    for _ in 0..6 {
        outcomes.push(
            code_step(&app, &cookie, "999999x")
                .await
                .location()
                .to_owned(),
        );
    }
    assert!(
        outcomes[..5].iter().all(|l| l.contains("error=code&")),
        "{outcomes:?}"
    );
    assert!(outcomes[5].contains("error=throttled"), "{outcomes:?}");
    // Even the right code waits its turn.
    let right = code(&pool, "totp_secret", 1).await;
    assert!(code_step(&app, &cookie, &right)
        .await
        .location()
        .contains("error=throttled"));
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn turning_two_factor_off_takes_a_current_code(pool: PgPool) {
    let app = TestApp::new(pool.clone());
    let approver = with_two_factor(&app).await;

    app.post_form(
        "/account/two-factor/disable",
        "code=123456x",
        Some(&approver),
    )
    .await;
    assert!(app
        .notice("/account/two-factor", &approver)
        .await
        .starts_with("Nothing was changed"));
    let next = code(&pool, "totp_secret", 1).await;
    app.post_form(
        "/account/two-factor/disable",
        &format!("code={next}"),
        Some(&approver),
    )
    .await;
    assert!(app
        .notice("/account/two-factor", &approver)
        .await
        .contains("Two-factor sign-in is off"));
    app.sign_in(EMAIL).await; // the password alone signs in again
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn an_operator_who_lost_their_authenticator_is_reset_on_the_host(pool: PgPool) {
    let app = TestApp::new(pool.clone());
    with_two_factor(&app).await;
    password_step(&app).await;
    let id: app::domain::OperatorId =
        sqlx::query_scalar("SELECT id FROM operators WHERE email = $1")
            .bind(EMAIL)
            .fetch_one(&pool)
            .await
            .unwrap();
    // What `vaultcap operator reset-two-factor --email …` runs.
    app::operators::second_factor::reset(&app.pool, Actor::Cli, id, "second_factor.reset")
        .await
        .unwrap();
    app.sign_in(EMAIL).await;
    let codes_left = crate::helpers::count(&pool, "SELECT count(*) FROM recovery_codes").await;
    assert_eq!(codes_left, 0, "the old recovery codes are void");
}
