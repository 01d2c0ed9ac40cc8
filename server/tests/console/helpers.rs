use std::sync::Arc;

use axum::{
    body::Body,
    http::{header, Request, StatusCode},
    Router,
};
use http_body_util::BodyExt;
use leptos::config::LeptosOptions;
use sqlx::PgPool;
use tower::ServiceExt;

use app::{
    domain::{Email, Role},
    ssr::{accounts, data::actions::Actor, AppState, AuthConfig},
};

pub const PASSWORD: &str = "a long test password";

/// The application on a test database, driven without a socket.
pub struct TestApp {
    pub router: Router,
    pub pool: PgPool,
}

impl TestApp {
    pub fn new(pool: PgPool) -> Self {
        Self::with_auth(pool, AuthConfig::default())
    }

    pub fn with_auth(pool: PgPool, auth: AuthConfig) -> Self {
        let state = AppState {
            leptos_options: LeptosOptions::builder().output_name("vaultcap").build(),
            pool: pool.clone(),
            auth: Arc::new(auth),
        };
        Self {
            router: server::http::router(state),
            pool,
        }
    }

    pub async fn add_operator(&self, email: &str, role: Role) -> i64 {
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
        let response = self
            .router
            .clone()
            .oneshot(request)
            .await
            .expect("the router answers");
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
        }
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

pub fn enc(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

pub struct TestResponse {
    pub status: StatusCode,
    pub headers: axum::http::HeaderMap,
    pub body: String,
}

impl TestResponse {
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

    /// `vaultcap_session=…`, ready for a `Cookie` header.
    pub fn session_cookie(&self) -> Option<String> {
        self.set_cookie()
            .map(|c| c.split(';').next().unwrap().to_owned())
    }
}
