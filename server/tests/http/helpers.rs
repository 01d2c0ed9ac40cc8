use std::sync::Arc;

use axum::{
    body::Body,
    http::{header, Request, StatusCode},
    Router,
};
use http_body_util::BodyExt;
use leptos::config::LeptosOptions;
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    Connection, PgConnection, PgPool,
};
use std::sync::OnceLock;
use tower::ServiceExt;

use std::time::Duration;

use app::{
    actions::sql::Actor,
    domain::{ApiScope, Email, Role},
    key_requests::rules::KeyPolicy,
    operators::{accounts, tokens},
    ssr::{AppState, AuthConfig, Reads},
};
use server::proxy::upstream::{StripeSecret, Upstream};

pub const PASSWORD: &str = "a long test password";

/// An upstream nobody answers at: for tests that proxy nothing.
fn no_upstream() -> Upstream {
    Upstream::new("http://127.0.0.1:9", None, Duration::from_secs(1)).unwrap()
}
pub const REAL_STRIPE_KEY: &str = "sk_test_real";

/// A pool on the test's database as the application runs: as
/// `vaultcap_app`, which may only append to the logs. (The pool
/// `#[sqlx::test]` hands a test is the owner's, which made the schema.)
///
/// The application gets a pool of its own, as `vaultcap serve` does, not the
/// one `#[sqlx::test]` hands the test: that one borrows its connection
/// permits from a pool every test in the binary shares, and a permit
/// stranded there by one test (sqlx 0.8 hands permits back from tasks
/// spawned on drop) starved later tests' page renders until they hit the
/// 60-second request limit. Connections close when released, so none is
/// open when the test ends and sqlx drops the test's database.
pub fn app_pool(test_pool: &PgPool, connections: u32) -> PgPool {
    PgPoolOptions::new()
        .max_connections(connections)
        .acquire_timeout(Duration::from_secs(20))
        .after_release(|_conn, _meta| Box::pin(async { Ok(false) }))
        .connect_lazy_with(app_login(test_pool))
}

/// The test database as `vaultcap`, the private cluster's login role in
/// `vaultcap_app` (a real login, not `SET ROLE`: the application ends its
/// own backends, which only the same login may). Roles belong to the
/// cluster, so it is made once per test run; the test server must let it in
/// without a password (trust, as scripts/test's private cluster does).
fn app_login(test_pool: &PgPool) -> PgConnectOptions {
    static MADE: OnceLock<()> = OnceLock::new();
    let owner = (*test_pool.connect_options()).clone();
    MADE.get_or_init(|| {
        let owner = owner.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                let mut conn = PgConnection::connect_with(&owner).await.unwrap();
                server::db::ensure_login_role(&mut conn, server::db::APP_LOGIN)
                    .await
                    .unwrap();
            })
        })
        .join()
        .unwrap();
    });
    owner.username(server::db::APP_LOGIN)
}

/// `count` refused calls written as the application writes them.
pub async fn audit_rows(app_pool: &PgPool, count: i32) {
    sqlx::query(
        "INSERT INTO audit_log (request_id, method, path, amount_cents, currency, decision)
         SELECT gen_random_uuid(), 'POST', '/v1/charges', 1000 + n, 'usd', 'refused_unknown_key'
         FROM generate_series(1, $1) AS n",
    )
    .bind(count)
    .execute(app_pool)
    .await
    .unwrap();
}

/// The application on a test database, driven without a socket.
pub struct TestApp {
    pub router: Router,
    /// The application's own pool on the test's database.
    pub pool: PgPool,
    /// The proxy's pool (ledger writers and key lookups).
    pub ledger_pool: PgPool,
    pub state: AppState,
}

impl TestApp {
    pub fn new(pool: PgPool) -> Self {
        Self::with_auth(pool, AuthConfig::default())
    }

    pub fn with_auth(pool: PgPool, auth: AuthConfig) -> Self {
        Self::build(pool, auth, KeyPolicy::default(), no_upstream())
    }

    /// The application issuing keys alone only within `policy`.
    pub fn with_key_policy(pool: PgPool, policy: KeyPolicy) -> Self {
        Self::build(pool, AuthConfig::default(), policy, no_upstream())
    }

    /// The application forwarding proxied calls to `base` with the real
    /// Stripe key `sk_test_real`, waiting at most `timeout` for an answer.
    pub fn with_upstream(pool: PgPool, base: &str, timeout: Duration) -> Self {
        let secret = StripeSecret::new(REAL_STRIPE_KEY.into());
        Self::build(
            pool,
            AuthConfig::default(),
            KeyPolicy::default(),
            Upstream::new(base, Some(secret), timeout).unwrap(),
        )
    }

    /// The application with the Stripe side `upstream` as given.
    pub fn with(pool: PgPool, upstream: Upstream) -> Self {
        Self::build(pool, AuthConfig::default(), KeyPolicy::default(), upstream)
    }

    fn build(
        test_pool: PgPool,
        auth: AuthConfig,
        key_policy: KeyPolicy,
        upstream: Upstream,
    ) -> Self {
        let pool = app_pool(&test_pool, 10);
        let ledger_pool = app_pool(&test_pool, 4);
        let state = AppState {
            leptos_options: LeptosOptions::builder().output_name("vaultcap").build(),
            pool: pool.clone(),
            reads: Reads::primary(pool.clone()),
            auth: Arc::new(auth),
            cap_increases: Default::default(),
            password_checks: Default::default(),
            stripe_configured: upstream.is_configured(),
            key_policy,
        };
        Self {
            router: server::http::router(state.clone(), upstream, ledger_pool.clone()),
            pool,
            ledger_pool,
            state,
        }
    }

    /// An API token holding every scope, as `vaultcap token add` makes one.
    pub async fn api_token(&self) -> String {
        self.api_token_with(&ApiScope::ALL).await
    }

    /// An API token holding only `scopes`, valid for 90 days.
    pub async fn api_token_with(&self, scopes: &[ApiScope]) -> String {
        tokens::create(&self.pool, Actor::Cli, "tests", scopes, 90, None)
            .await
            .unwrap()
            .secret
            .plaintext
    }

    /// GETs `path` from the API with a bearer `token`.
    pub async fn get_api(&self, path: &str, token: &str) -> TestResponse {
        self.api("GET", path, Some(token), None).await
    }

    /// POSTs `body` as JSON to the API with a bearer `token`.
    pub async fn post_json(
        &self,
        path: &str,
        token: &str,
        body: serde_json::Value,
    ) -> TestResponse {
        self.api("POST", path, Some(token), Some(body)).await
    }

    /// A JSON request to the key API.
    pub async fn api(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<serde_json::Value>,
    ) -> TestResponse {
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, "localhost");
        if let Some(token) = token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let body = match body {
            Some(json) => {
                request = request.header(header::CONTENT_TYPE, "application/json");
                Body::from(json.to_string())
            }
            None => Body::empty(),
        };
        self.send(request.body(body).unwrap()).await
    }

    /// A Stripe-style call through the proxy with a vault key.
    pub async fn stripe(
        &self,
        path: &str,
        vault_key: &str,
        form: &str,
        extra: &[(&str, &str)],
    ) -> TestResponse {
        let mut request = Request::post(path)
            .header(header::HOST, "localhost")
            .header(header::AUTHORIZATION, format!("Bearer {vault_key}"))
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
        for (name, value) in extra {
            request = request.header(*name, *value);
        }
        self.send(request.body(Body::from(form.to_owned())).unwrap())
            .await
    }

    /// A charge through the proxy with `vault_key`, no extra headers.
    pub async fn charge(&self, vault_key: &str, form: &str) -> TestResponse {
        self.stripe("/v1/charges", vault_key, form, &[]).await
    }

    /// What the page at `path` shows as the one-time notice.
    pub async fn notice(&self, path: &str, cookie: &str) -> String {
        let page = self.get(path, Some(cookie)).await;
        page.body
            .split("class=\"notice notice-")
            .nth(1)
            .and_then(|rest| rest.split("<p>").nth(1))
            .and_then(|rest| rest.split("</p>").next())
            .map(str::to_owned)
            .unwrap_or_else(|| panic!("no notice on {path}: {}", page.body))
    }

    pub async fn add_operator(&self, email: &str, role: Role) -> app::domain::OperatorId {
        let email = Email::parse(email).unwrap();
        let (operator, _) =
            accounts::add_operator(&self.pool, Actor::Cli, &email, role, Some(PASSWORD.into()))
                .await
                .expect("adding a test operator");
        operator.id
    }

    pub async fn get(&self, path: &str, cookie: Option<&str>) -> TestResponse {
        let mut request = Request::get(path).header(header::HOST, "localhost");
        if let Some(cookie) = cookie {
            request = request.header(header::COOKIE, cookie);
        }
        self.send(request.body(Body::empty()).unwrap()).await
    }

    /// A form post as a browser on one of our pages sends it.
    pub async fn post_form(&self, path: &str, body: &str, cookie: Option<&str>) -> TestResponse {
        self.post_form_from(path, body, cookie, Some("http://localhost"))
            .await
    }

    pub async fn post_form_from(
        &self,
        path: &str,
        body: &str,
        cookie: Option<&str>,
        origin: Option<&str>,
    ) -> TestResponse {
        let mut request = Request::post(path)
            .header(header::HOST, "localhost")
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
        if let Some(origin) = origin {
            request = request.header(header::ORIGIN, origin);
        }
        if let Some(cookie) = cookie {
            request = request.header(header::COOKIE, cookie);
        }
        self.send(request.body(Body::from(body.to_owned())).unwrap())
            .await
    }

    pub async fn send(&self, request: Request<Body>) -> TestResponse {
        let what = format!("{} {}", request.method(), request.uri());
        // A page read (GET, no body) that gets no answer is sent once more:
        // in 3 of about 40 runs of this suite (2026-12-01) one in-process page
        // render never answered, with no CPU used and no database connection
        // held, whatever pool the application had; never seen through a real
        // socket in the browser tests. Cause not found yet (README, Tests). A
        // second silence fails the test.
        let again = (request.method() == axum::http::Method::GET).then(|| {
            let mut copy = Request::get(request.uri().clone());
            for (name, value) in request.headers() {
                copy = copy.header(name, value);
            }
            copy.body(Body::empty()).unwrap()
        });
        let mut response = self.answer(request).await;
        if response.is_none() {
            if let Some(request) = again {
                eprintln!("{what} got no answer within 30 s: sending it once more");
                response = self.answer(request).await;
            }
        }
        let response = response.unwrap_or_else(|| {
            panic!(
                "{what} got no answer within 30 s (application pool: {} connections, {} idle)",
                self.pool.size(),
                self.pool.num_idle()
            )
        });
        let status = response.status();
        let headers = response.headers().clone();
        let body = response
            .into_body()
            .collect()
            .await
            .expect("reading the body")
            .to_bytes();
        TestResponse {
            status,
            headers,
            body: String::from_utf8_lossy(&body).into_owned(),
            raw: body.to_vec(),
        }
    }

    /// The router's answer, or `None` after 30 s of silence.
    async fn answer(&self, request: Request<Body>) -> Option<axum::response::Response> {
        tokio::time::timeout(
            Duration::from_secs(30),
            self.router.clone().oneshot(request),
        )
        .await
        .ok()
        .map(|answer| answer.expect("the router answers"))
    }

    /// Adds an operator with `role` and signs them in: the session cookie.
    pub async fn signed_in(&self, email: &str, role: Role) -> String {
        self.add_operator(email, role).await;
        self.sign_in(email).await
    }

    /// Signs in and returns the session cookie to send with later requests.
    pub async fn sign_in(&self, email: &str) -> String {
        let response = self
            .post_form(
                "/auth/login",
                &format!("email={}&password={}", enc(email), enc(PASSWORD)),
                None,
            )
            .await;
        assert_eq!(
            response.status,
            StatusCode::SEE_OTHER,
            "sign-in of {email} failed: {}",
            response.body
        );
        assert_eq!(response.location(), "/");
        response
            .session_cookie()
            .expect("sign-in sets a session cookie")
    }
}

/// The one number `sql` (a query without parameters) answers, e.g. a
/// `count(*)`.
pub async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(pool)
        .await
        .unwrap_or_else(|err| panic!("{sql}: {err}"))
}

/// How many times `action` is in the operator action log.
pub async fn actions_logged(pool: &PgPool, action: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM operator_actions WHERE action = $1")
        .bind(action)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The one-time secret a page shows (a new key, token or password).
pub fn one_time_secret(page: &str) -> Option<String> {
    page.split("data-testid=\"one-time-secret\">")
        .nth(1)
        .and_then(|rest| rest.split('<').next())
        .map(str::to_owned)
}

pub fn enc(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

pub struct TestResponse {
    pub status: StatusCode,
    pub headers: axum::http::HeaderMap,
    pub body: String,
    /// The body as sent, for binary answers (the close pack's zip).
    pub raw: Vec<u8>,
}

impl TestResponse {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|err| panic!("not JSON ({err}): {}", self.body))
    }

    /// The `error.code` of a Stripe-shaped or API error body.
    pub fn error_code(&self) -> String {
        self.json()["error"]["code"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    pub fn location(&self) -> &str {
        self.headers
            .get(header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    /// The full `Set-Cookie` header for the session, if one was set.
    pub fn set_cookie(&self) -> Option<String> {
        self.headers
            .get_all(header::SET_COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find(|v| v.starts_with("vaultcap_session="))
            .map(str::to_owned)
    }

    /// `session` plus the key this response set for its one-time secret
    /// (see `flash`), ready for a `Cookie` header.
    pub fn revealing(&self, session: &str) -> String {
        let reveal = self
            .headers
            .get_all(header::SET_COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find(|v| v.starts_with("vaultcap_reveal="))
            .expect("the response sets the key to a one-time secret");
        format!("{session}; {}", reveal.split(';').next().unwrap())
    }

    /// `vaultcap_session=…`, ready for a `Cookie` header.
    pub fn session_cookie(&self) -> Option<String> {
        self.set_cookie()
            .map(|c| c.split(';').next().unwrap().to_owned())
    }
}

/// An expiry a key may have (within a year), a month from now.
pub fn in_a_month() -> String {
    (chrono::Utc::now() + chrono::Duration::days(30)).to_rfc3339()
}

/// The notifier of an instance whose fleet delivers alerts to `webhooks`
/// (as `vaultcap serve --alert-webhook` records them).
pub async fn notifier(pool: &PgPool, webhooks: &[&str]) -> server::jobs::notifier::Notifier {
    server::fleet::agree(
        pool,
        &[("--alert-webhook", serde_json::json!(webhooks))],
        false,
    )
    .await
    .unwrap();
    server::jobs::notifier::Notifier::new(pool.clone()).unwrap()
}

/// Waits until some statement of this database waits on a lock (one the
/// test's own transaction holds); fails after 30 s of none.
pub async fn until_one_waits_on_a_lock(pool: &PgPool) {
    let waited = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let waiting: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM pg_stat_activity
                            WHERE datname = current_database() AND wait_event_type = 'Lock')",
            )
            .fetch_one(pool)
            .await
            .unwrap();
            if waiting {
                return;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(waited.is_ok(), "no statement waited on a lock within 30 s");
}
