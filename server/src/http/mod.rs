//! The HTTP surface: the console's pages (rendered by Leptos), its form
//! handlers, health, and the static browser bundle.

mod alerts;
mod api_tokens;
mod audit_export;
mod auth;
mod busy;
mod cap_increases;
mod client_ip;
mod error;
mod findings_export;
mod forms;
mod guard;
mod operators;
mod period_closes;
mod reconciliation;
mod security;
mod two_factor;
mod vault_keys;

use axum::{
    extract::{DefaultBodyLimit, State},
    http::StatusCode,
    middleware,
    routing::get,
    Router,
};
use leptos_axum::{generate_route_list, LeptosRoutes};
use sqlx::PgPool;
use time::Duration;
use tower::ServiceBuilder;
use tower_http::{
    compression::CompressionLayer,
    request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer},
    services::ServeDir,
    trace::TraceLayer,
};
use tower_sessions::{cookie::SameSite, Expiry, SessionManagerLayer};
use tower_sessions_sqlx_store::PostgresStore;

pub use audit_export::api as audit_export_api;
pub use client_ip::{ClientIp, TrustedProxies};
pub use guard::{ConsoleRoute, ConsoleRoutes};

use tokio_util::task::TaskTracker;

use crate::proxy::{upstream::Upstream, KeyLookup, Ledger, ProxyState, RESERVE_QUEUE};
use app::{
    app::{shell, App},
    domain::Role,
    ssr::AppState,
};

/// Console forms are small; anything bigger is refused with 413.
pub const MAX_FORM_BODY: usize = 64 * 1024;

/// The whole application, apart from the socket, so tests can drive it
/// with `oneshot`: the console, the key API and the spend-cap proxy, whose
/// ledger and key lookups use `ledger_pool`'s database only (the ledger's
/// writer on a connection of its own).
pub fn router(state: AppState, upstream: Upstream, ledger_pool: PgPool) -> Router {
    router_tracking(state, upstream, ledger_pool, TaskTracker::new())
}

/// As [`router`], with every proxied call running on `calls`: `serve`
/// waits for them at shutdown, whether or not their clients still listen.
pub fn router_tracking(
    state: AppState,
    upstream: Upstream,
    ledger_pool: PgPool,
    calls: TaskTracker,
) -> Router {
    let routes = generate_route_list(App);
    let trusted_proxies = TrustedProxies(std::sync::Arc::new(state.auth.trusted_proxies.clone()));
    let secure = state.auth.secure_cookies;
    let heavy = busy::HeavyWork::new();
    let leptos_options = state.leptos_options.clone();

    let sessions = SessionManagerLayer::new(PostgresStore::new(state.pool.clone()))
        .with_name("vaultcap_session")
        .with_http_only(true)
        .with_same_site(SameSite::Strict)
        .with_secure(state.auth.secure_cookies)
        // The store keeps a session a little longer than it may live, so
        // that the per-request timeout check can tell the person it expired.
        .with_expiry(Expiry::OnInactivity(Duration::seconds(
            (state.auth.absolute_timeout + state.auth.idle_timeout).num_seconds(),
        )));

    let console = Router::new()
        .leptos_routes(&state, routes, move || shell(leptos_options.clone()))
        .merge(console_routes(state.clone()).into_router())
        .fallback(leptos_axum::file_and_error_handler::<AppState, _>(shell))
        .layer(axum::Extension(heavy.clone()))
        .layer(axum::Extension(reconciliation::Stripe(
            upstream
                .stripe_client(&crate::reconcile::sync::SyncOptions::default())
                .map(std::sync::Arc::new),
        )))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            auth::authenticate,
        ))
        .layer(middleware::from_fn(security::same_origin_writes))
        .layer(sessions)
        .layer(DefaultBodyLimit::max(MAX_FORM_BODY));

    // One of the ledger's connections writes reservations and settlements
    // (see proxy::ledger); key lookups take the others.
    let stripe_events =
        crate::stripe_events::router(state.pool.clone(), upstream.webhook_secrets().clone());
    let proxy = crate::proxy::router(ProxyState {
        ledger: Ledger::start(&ledger_pool, RESERVE_QUEUE),
        pool: ledger_pool,
        upstream,
        keys: KeyLookup::new(),
        calls: calls.clone(),
    });
    let pkg_dir = std::path::Path::new(state.leptos_options.site_root.as_ref()).join("pkg");
    Router::new()
        .merge(console)
        .merge(
            crate::api::routes(state.clone())
                .into_router()
                .layer(axum::Extension(heavy))
                .layer(DefaultBodyLimit::max(MAX_FORM_BODY)),
        )
        .merge(stripe_events)
        .nest_service("/pkg", ServeDir::new(pkg_dir))
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move |state| readyz(state, calls.is_closed())),
        )
        .route("/metrics", get(metrics))
        .with_state(state)
        .layer(CompressionLayer::new())
        .layer(middleware::from_fn_with_state(
            secure,
            security::browser_headers,
        ))
        .layer(axum::Extension(trusted_proxies))
        // Each console and API request runs in a span named by its request
        // id, which the response carries as `x-request-id`: what it logs
        // and every database call it makes can be followed by that id.
        .layer(
            ServiceBuilder::new()
                .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
                .layer(TraceLayer::new_for_http().make_span_with(request_span))
                .layer(PropagateRequestIdLayer::x_request_id()),
        )
        // Stripe's answers pass through as they came: no compression layer.
        // Each proxied call has its own span, named by its audit row's id.
        .merge(proxy)
}

fn request_span(request: &axum::extract::Request) -> tracing::Span {
    let id = request
        .headers()
        .get("x-request-id")
        .and_then(|id| id.to_str().ok())
        .unwrap_or("-");
    tracing::info_span!("request", request_id = %id, method = %request.method(), path = request.uri().path())
}

/// The console's forms and exports, each with the role it needs.
pub fn console_routes(state: AppState) -> ConsoleRoutes {
    use axum::{handler::Handler, http::Method};
    use Role::{Admin, Approver, Operator, Viewer};
    const POST: Method = Method::POST;
    ConsoleRoutes::new(state)
        .open(POST, "/auth/login", auth::login)
        .open(POST, "/auth/logout", auth::logout)
        .open(POST, "/auth/invite", auth::accept_invitation)
        .open(POST, "/auth/login/code", auth::login_code)
        .route(Method::GET, "/audit.csv", Viewer, audit_export::console)
        .route(
            Method::GET,
            "/reconciliation.csv",
            Viewer,
            findings_export::export,
        )
        .route(POST, "/keys", Operator, vault_keys::create)
        .route(
            POST,
            "/keys/suggestion",
            Operator,
            vault_keys::suggest.layer(DefaultBodyLimit::max(vault_keys::MAX_SUGGESTION_CSV)),
        )
        .route(POST, "/keys/{id}/revoke", Operator, vault_keys::revoke)
        .route(
            POST,
            "/keys/{id}/duplicate-policy",
            Operator,
            vault_keys::set_duplicate_policy,
        )
        .route(
            POST,
            "/keys/{id}/cap-increase-requests",
            Operator,
            cap_increases::request,
        )
        .route(
            POST,
            "/approvals/{id}/decide",
            Approver,
            cap_increases::decide,
        )
        .route(
            POST,
            "/key-requests/{id}/decide",
            Approver,
            cap_increases::decide_key,
        )
        .route(
            POST,
            "/periods/{id}/prepare",
            Operator,
            period_closes::prepare,
        )
        .route(
            POST,
            "/periods/{id}/withdraw",
            Operator,
            period_closes::withdraw,
        )
        .route(
            POST,
            "/periods/{id}/sign-off",
            Approver,
            period_closes::sign_off,
        )
        .route(
            Method::GET,
            "/periods/{id}/close-pack.zip",
            Viewer,
            period_closes::pack,
        )
        .route(POST, "/reconciliation/sync", Operator, reconciliation::sync)
        .route(
            POST,
            "/reconciliation/{id}/attribute",
            Operator,
            reconciliation::attribute,
        )
        .route(POST, "/reconciliation/bulk", Operator, reconciliation::bulk)
        .route(
            POST,
            "/reconciliation/{id}/adopt",
            Operator,
            reconciliation::adopt,
        )
        .route(
            POST,
            "/reconciliation/{id}/refund",
            Operator,
            reconciliation::refund,
        )
        .route(
            POST,
            "/reconciliation/{id}/dismiss",
            Operator,
            reconciliation::dismiss,
        )
        .route(POST, "/alerts/{id}/ack", Operator, alerts::acknowledge)
        .route(POST, "/alerts/{id}/assign", Operator, alerts::assign)
        .route(POST, "/alerts/{id}/snooze", Operator, alerts::snooze)
        .route(POST, "/operators", Admin, operators::add)
        .route(POST, "/operators/{id}/role", Admin, operators::change_role)
        .route(
            POST,
            "/operators/{id}/disabled",
            Admin,
            operators::set_disabled,
        )
        .route(
            POST,
            "/account/two-factor/setup",
            Approver,
            two_factor::set_up,
        )
        .route(
            POST,
            "/account/two-factor/confirm",
            Approver,
            two_factor::confirm,
        )
        .route(
            POST,
            "/account/two-factor/disable",
            Approver,
            two_factor::turn_off,
        )
        .route(POST, "/tokens", Admin, api_tokens::create)
        .route(POST, "/tokens/{id}/revoke", Admin, api_tokens::revoke)
}

/// Answers 200 while the database answers (the proxy fails closed without
/// it), and 503 once `serve` is draining (its tracker of proxied calls is
/// closed at SIGTERM) so a load balancer stops sending it calls.
async fn readyz(State(state): State<AppState>, draining: bool) -> (StatusCode, &'static str) {
    if draining {
        return (StatusCode::SERVICE_UNAVAILABLE, "draining");
    }
    match sqlx::query("SELECT 1").execute(&state.pool).await {
        Ok(_) => (StatusCode::OK, "ready"),
        Err(err) => {
            tracing::error!(error = %err, "readiness check: database unreachable");
            (StatusCode::SERVICE_UNAVAILABLE, "database unreachable")
        }
    }
}

/// Prometheus text exposition (see `crate::metrics`), for the scraper
/// holding `--metrics-token`, or without one configured, for this host only.
async fn metrics(
    State(state): State<AppState>,
    ClientIp(ip): ClientIp,
    headers: axum::http::HeaderMap,
) -> axum::response::Response {
    use axum::{http::header, response::IntoResponse};
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "));
    let allowed = match (&state.auth.metrics_token, presented) {
        // Compared as hashes: equal-length digests, no early exit to time.
        (Some(token), Some(presented)) => {
            app::ssr::secrets::hash(token) == app::ssr::secrets::hash(presented)
        }
        (Some(_), None) => false,
        // Forwarded by a proxy on this host: the client is not local.
        (None, _) if headers.contains_key("x-forwarded-for") => false,
        (None, _) => ip.is_some_and(|ip| ip.is_loopback()),
    };
    if !allowed {
        return (
            StatusCode::FORBIDDEN,
            "metrics are for the scraper holding --metrics-token (or, without one, this host only)",
        )
            .into_response();
    }
    match crate::metrics::render() {
        Some(text) => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response(),
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            "metrics are not enabled in this process",
        )
            .into_response(),
    }
}
