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
async fn behind_tls_the_key_to_a_one_time_secret_is_secure_too(pool: PgPool) {
    let app = TestApp::with_auth(
        pool,
        AuthConfig {
            secure_cookies: true,
            ..AuthConfig::default()
        },
    );
    let admin = app.signed_in("admin@example.com", Role::Admin).await;
    let created = app
        .post_form(
            "/tokens",
            "name=billing+job&scope=keys%3Acreate&days=30",
            Some(&admin),
        )
        .await;
    let reveal: Vec<&str> = created
        .headers
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .filter(|v| v.starts_with("vaultcap_reveal="))
        .collect();
    assert_eq!(reveal.len(), 1, "{:?}", created.headers);
    assert!(reveal[0].ends_with("; Secure"), "{}", reveal[0]);
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
async fn repeated_failures_slow_the_account_down_without_locking_it(pool: PgPool) {
    // A minute's delay, so that a slow test machine cannot outwait it.
    let mut auth = AuthConfig::default();
    auth.throttle.first_delay = chrono::Duration::seconds(60);
    let app = TestApp::with_auth(pool.clone(), auth);
    app.add_operator("ana@example.com", Role::Viewer).await;
    for _ in 0..AuthConfig::default().throttle.free_per_account {
        let response = app
            .post_form(
                "/auth/login",
                &sign_in_body("ana@example.com", "guess"),
                None,
            )
            .await;
        assert_eq!(response.location(), "/login?error=invalid");
    }
    // At once after the free failures: even the right password waits.
    let response = app
        .post_form(
            "/auth/login",
            &sign_in_body("ANA@example.com", PASSWORD),
            None,
        )
        .await;
    assert_eq!(response.location(), "/login?error=throttled&wait=60");
    assert!(response.session_cookie().is_none());
    assert!(app
        .get(response.location(), None)
        .await
        .body
        .contains("Try again in 60 seconds"));

    // A minute later (the failures are moved back instead of waiting), the
    // owner signs in: an attacker's guesses cost them a delay, not a lock.
    sqlx::query("UPDATE login_failures SET failed_at = failed_at - interval '61 seconds'")
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
    assert_eq!(response.location(), "/");
}

/// A sign-in form post from `peer`, with `X-Forwarded-For` when given.
fn sign_in_from(
    peer: [u8; 4],
    forwarded_for: Option<&str>,
    email: &str,
    password: &str,
) -> axum::http::Request<axum::body::Body> {
    let mut request = axum::http::Request::post("/auth/login")
        .header("host", "localhost")
        .header("origin", "http://localhost")
        .header("content-type", "application/x-www-form-urlencoded");
    if let Some(hops) = forwarded_for {
        request = request.header("x-forwarded-for", hops);
    }
    let mut request = request
        .body(axum::body::Body::from(sign_in_body(email, password)))
        .unwrap();
    request
        .extensions_mut()
        .insert(axum::extract::ConnectInfo(std::net::SocketAddr::from((
            peer, 4000,
        ))));
    request
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn repeated_failures_from_one_address_are_throttled_across_accounts(pool: PgPool) {
    let mut auth = AuthConfig::default();
    auth.throttle.max_per_ip = 3;
    let app = TestApp::with_auth(pool, auth);
    app.add_operator("ana@example.com", Role::Viewer).await;
    for n in 0..3 {
        let response = app
            .send(sign_in_from(
                [203, 0, 113, 7],
                None,
                &format!("guess{n}@example.com"),
                "x",
            ))
            .await;
        assert_eq!(response.location(), "/login?error=invalid");
    }
    let response = app
        .send(sign_in_from(
            [203, 0, 113, 7],
            None,
            "ana@example.com",
            PASSWORD,
        ))
        .await;
    assert!(
        response
            .location()
            .starts_with("/login?error=throttled&wait="),
        "{}",
        response.location()
    );
}

/// Behind a TLS proxy every sign-in comes from the proxy's address: the
/// client it names counts, so one client's guesses do not lock out the
/// rest; a client talking to us directly cannot pick its address.
#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_trusted_proxy_names_the_client_and_nobody_else_can(pool: PgPool) {
    let mut auth = AuthConfig::default();
    auth.throttle.max_per_ip = 3;
    auth.trusted_proxies = vec!["10.0.0.0/8".parse().unwrap()];
    let app = TestApp::with_auth(pool.clone(), auth);
    app.add_operator("ana@example.com", Role::Viewer).await;
    const PROXY: [u8; 4] = [10, 0, 0, 2];

    for n in 0..3 {
        let guess = sign_in_from(
            PROXY,
            Some("198.51.100.66"),
            &format!("guess{n}@example.com"),
            "x",
        );
        assert_eq!(app.send(guess).await.location(), "/login?error=invalid");
    }
    let attacker = app
        .send(sign_in_from(
            PROXY,
            Some("198.51.100.66"),
            "guess9@example.com",
            "x",
        ))
        .await;
    assert!(attacker.location().starts_with("/login?error=throttled"));
    // Ana comes through the same proxy from elsewhere: not throttled.
    let ana = app
        .send(sign_in_from(
            PROXY,
            Some("192.0.2.10"),
            "ana@example.com",
            PASSWORD,
        ))
        .await;
    assert_eq!(ana.location(), "/");

    // Straight to us, claiming to be someone else: its own address counts.
    let spoofer = app
        .send(sign_in_from(
            [203, 0, 113, 7],
            Some("192.0.2.10"),
            "guess0@example.com",
            "x",
        ))
        .await;
    assert_eq!(spoofer.location(), "/login?error=invalid");
    let failed: Vec<(String, String)> = sqlx::query_as(
        "SELECT host(ip), details->>'email' FROM operator_actions
         WHERE action = 'sign_in_failed' ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let addresses: Vec<&str> = failed.iter().map(|(ip, _)| ip.as_str()).collect();
    assert_eq!(
        addresses,
        [
            "198.51.100.66",
            "198.51.100.66",
            "198.51.100.66",
            "203.0.113.7"
        ],
        "failed sign-ins are in the action log with the client's address"
    );
    let signed_in: String =
        sqlx::query_scalar("SELECT host(ip) FROM operator_actions WHERE action = 'sign_in'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(signed_in, "192.0.2.10");
}

/// The failure is recorded before the password is checked, under a lock:
/// a burst of guesses cannot all pass the count first.
#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_hundred_parallel_guesses_check_only_the_free_failures(pool: PgPool) {
    // A minute's delay after the free failures: the burst is over long
    // before it, however slow the machine.
    let mut auth = AuthConfig::default();
    auth.throttle.first_delay = chrono::Duration::seconds(60);
    let app = TestApp::with_auth(pool.clone(), auth);
    app.add_operator("ana@example.com", Role::Viewer).await;
    let before = app.state.password_checks.performed();

    let guesses = (0..100).map(|n| {
        let router = app.router.clone();
        let request = axum::http::Request::post("/auth/login")
            .header("host", "localhost")
            .header("origin", "http://localhost")
            .header("content-type", "application/x-www-form-urlencoded")
            .body(axum::body::Body::from(sign_in_body(
                "ana@example.com",
                &format!("guess number {n}"),
            )))
            .unwrap();
        tokio::spawn(async move {
            use tower::ServiceExt;
            let response = router.oneshot(request).await.unwrap();
            response.headers()["location"].to_str().unwrap().to_owned()
        })
    });
    let mut outcomes = std::collections::BTreeMap::<String, usize>::new();
    for guess in futures::future::join_all(guesses).await {
        let location = guess.unwrap();
        let kind = location.split('&').next().unwrap().to_owned();
        *outcomes.entry(kind).or_default() += 1;
    }

    let free = AuthConfig::default().throttle.free_per_account as u64;
    let checked = app.state.password_checks.performed() - before;
    assert_eq!(checked, free, "outcomes: {outcomes:?}");
    assert_eq!(outcomes["/login?error=invalid"], free as usize);
    assert_eq!(outcomes["/login?error=throttled"], 100 - free as usize);
    let recorded = crate::helpers::count(&pool, "SELECT count(*) FROM login_failures").await;
    assert_eq!(recorded, free as i64);
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
    for (n, next) in [
        "//evil.example/",
        "https://evil.example/",
        "/\\evil.example",
        // Browsers drop the tab (and newlines) and go to //evil.example.
        "/\t/evil.example",
        "/\n/evil.example",
        "/ /evil.example",
    ]
    .into_iter()
    .enumerate()
    {
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
            sign_in_body(&format!("nobody{n}@example.com"), "wrong password!"),
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

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn pages_carry_a_nonce_policy_their_own_scripts_satisfy(pool: PgPool) {
    let app = TestApp::new(pool);
    let cookie = app.signed_in("ana@example.com", Role::Viewer).await;
    let page = app.get("/keys", Some(&cookie)).await;
    assert_eq!(page.status, StatusCode::OK);
    let header = |name: &str| {
        page.headers
            .get(name)
            .unwrap_or_else(|| panic!("no {name} header"))
            .to_str()
            .unwrap()
            .to_owned()
    };
    let policy = header("content-security-policy");
    assert!(policy.contains("frame-ancestors 'none'"), "{policy}");
    assert!(policy.contains("object-src 'none'"), "{policy}");
    let nonce = policy
        .split("'nonce-")
        .nth(1)
        .and_then(|rest| rest.split('\'').next())
        .expect("script-src names a nonce");
    assert!(nonce.len() >= 16, "{nonce}");
    let scripts = page.body.matches("<script").count();
    assert!(scripts > 0);
    assert_eq!(
        page.body.matches(&format!("nonce=\"{nonce}\"")).count(),
        scripts,
        "every script carries this response's nonce"
    );
    assert_eq!(header("x-frame-options"), "DENY");
    assert_eq!(header("referrer-policy"), "same-origin");
    assert_eq!(header("x-content-type-options"), "nosniff");
    assert!(
        page.headers.get("strict-transport-security").is_none(),
        "no HSTS without TLS"
    );

    let again = app.get("/keys", Some(&cookie)).await;
    let other = again.headers["content-security-policy"].to_str().unwrap();
    assert!(!other.contains(nonce), "a new nonce for every response");
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn behind_tls_pages_ask_for_https_only(pool: PgPool) {
    let app = TestApp::with_auth(
        pool,
        AuthConfig {
            secure_cookies: true,
            ..AuthConfig::default()
        },
    );
    let login = app.get("/login", None).await;
    assert_eq!(
        login.headers["strict-transport-security"],
        "max-age=31536000"
    );
}
