//! The JSON API billing jobs and tools call with a scoped API token.
//! Errors have one shape: `{"error": {"code": "…", "message": "…"}}`.

pub mod alerts;
pub mod cap_increases;
pub mod keys;
mod openapi;

use std::net::IpAddr;

use axum::{
    extract::{rejection::JsonRejection, FromRequest, FromRequestParts, Request, State},
    handler::Handler,
    http::{header, request::Parts, Method, StatusCode},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::{on, MethodFilter},
    Json, Router,
};
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::http::ClientIp;
use app::{
    actions::sql::{self as actions, Actor},
    domain::ApiScope,
    error::AppError,
    operators::tokens_sql::{self as api_tokens, Presented},
    ssr::{secrets, AppState},
};

#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }
}

impl From<AppError> for ApiError {
    fn from(err: AppError) -> Self {
        match err {
            AppError::Invalid(message) => Self::invalid(message),
            AppError::NotFound => Self::new(StatusCode::NOT_FOUND, "not_found", "no such resource"),
            AppError::Unauthenticated => {
                Self::new(StatusCode::UNAUTHORIZED, "unauthenticated", err.to_string())
            }
            AppError::Forbidden(_) => {
                Self::new(StatusCode::FORBIDDEN, "forbidden", err.to_string())
            }
            AppError::Internal | AppError::Transport(_) => Self::internal(),
        }
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(err: sqlx::Error) -> Self {
        AppError::from(err).into()
    }
}

impl From<app::domain::ParseError> for ApiError {
    fn from(err: app::domain::ParseError) -> Self {
        Self::invalid(err.0)
    }
}

impl ApiError {
    fn internal() -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            "something went wrong on our side; it has been logged",
        )
    }
}

/// The API's error shape, for the OpenAPI document.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct ApiErrorBody {
    error: ApiErrorDetail,
}

#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct ApiErrorDetail {
    /// Stable, machine-readable: `invalid_request`, `unauthenticated`, `not_found`, …
    code: String,
    message: String,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(json!({ "error": { "code": self.code, "message": self.message } })),
        )
            .into_response()
    }
}

/// A JSON body whose rejections use the API's error shape.
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        match Json::<T>::from_request(request, state).await {
            Ok(Json(value)) => Ok(Self(value)),
            Err(JsonRejection::JsonDataError(err)) => Err(ApiError::invalid(err.body_text())),
            Err(rejection) => Err(ApiError::new(
                rejection.status(),
                "invalid_request",
                rejection.body_text(),
            )),
        }
    }
}

/// The API token behind a request, as [`require_scope`] found it.
#[derive(Debug, Clone, Copy)]
pub struct ApiToken {
    pub id: app::domain::ApiTokenId,
    pub ip: Option<IpAddr>,
}

impl ApiToken {
    pub fn actor(self) -> Actor {
        Actor::ApiToken {
            id: self.id,
            ip: self.ip,
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for ApiToken {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        parts.extensions.get::<ApiToken>().copied().ok_or_else(|| {
            tracing::error!(path = %parts.uri.path(), "an API handler ran without a scope check");
            ApiError::internal()
        })
    }
}

/// One route of the API and what a token needs to call it.
#[derive(Debug, Clone)]
pub struct ApiRoute {
    pub method: Method,
    /// The route's pattern, e.g. `/vault/keys/{id}/revoke`.
    pub path: &'static str,
    /// `None` for the few routes anyone may read (the OpenAPI document).
    pub scope: Option<ApiScope>,
}

/// The API's routes, each registered with the scope it needs: a route
/// cannot be added without one, and [`ApiRoutes::table`] lists them all
/// for the access tests.
pub struct ApiRoutes {
    state: AppState,
    router: Router<AppState>,
    table: Vec<ApiRoute>,
}

impl ApiRoutes {
    /// `handler` answers `method` on `path` for tokens holding `scope`;
    /// every other caller is refused before it runs.
    pub fn route<H, T>(
        mut self,
        method: Method,
        path: &'static str,
        scope: ApiScope,
        handler: H,
    ) -> Self
    where
        H: Handler<T, AppState>,
        T: 'static,
    {
        let guard = middleware::from_fn_with_state((self.state.clone(), scope), require_scope);
        self.router = self
            .router
            .route(path, on(filter(&method), handler).route_layer(guard));
        self.table.push(ApiRoute {
            method,
            path,
            scope: Some(scope),
        });
        self
    }

    /// A route anyone may call, without a token.
    pub fn public<H, T>(mut self, method: Method, path: &'static str, handler: H) -> Self
    where
        H: Handler<T, AppState>,
        T: 'static,
    {
        self.router = self.router.route(path, on(filter(&method), handler));
        self.table.push(ApiRoute {
            method,
            path,
            scope: None,
        });
        self
    }

    pub fn table(&self) -> &[ApiRoute] {
        &self.table
    }

    pub fn into_router(self) -> Router<AppState> {
        self.router
    }
}

fn filter(method: &Method) -> MethodFilter {
    MethodFilter::try_from(method.clone()).expect("the API uses standard methods only")
}

/// Every route of the API.
pub fn routes(state: AppState) -> ApiRoutes {
    let routes = ApiRoutes {
        state,
        router: Router::new(),
        table: Vec::new(),
    };
    let routes = keys::routes(routes);
    let routes = cap_increases::routes(routes);
    let routes = alerts::routes(routes);
    routes.route(
        Method::GET,
        "/api/audit.csv",
        ApiScope::AuditExport,
        crate::http::audit_export_api,
    )
}

/// Lets the request through when it carries an active token holding
/// `scope`; otherwise answers 401 (no, unknown, revoked or expired token)
/// or 403 naming the missing scope, and writes the refusal of a known
/// token to the action log.
async fn require_scope(
    State((state, scope)): State<(AppState, ApiScope)>,
    ClientIp(ip): ClientIp,
    mut request: Request,
    next: Next,
) -> Response {
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|token| !token.is_empty());
    let Some(presented) = presented else {
        return ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
            "send an API token as `Authorization: Bearer …` (an admin creates one on the API tokens page or with `vaultcap token add`)",
        )
        .into_response();
    };
    let refusal = match api_tokens::authenticate(&state.pool, &secrets::hash(presented)).await {
        Err(err) => return ApiError::from(err).into_response(),
        Ok(Presented::Unknown) => {
            return ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthenticated",
                "unknown API token",
            )
            .into_response()
        }
        Ok(Presented::Revoked { id, at }) => (
            id,
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "token_revoked",
                format!(
                    "this API token was revoked on {}",
                    at.format("%Y-%m-%d %H:%M UTC")
                ),
            ),
        ),
        Ok(Presented::Expired { id, at }) => (
            id,
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "token_expired",
                format!(
                    "this API token expired on {}; ask an admin for a new one",
                    at.format("%Y-%m-%d %H:%M UTC")
                ),
            ),
        ),
        Ok(Presented::Active { id, scopes }) if scopes.contains(&scope) => {
            if let Err(err) = api_tokens::mark_used(&state.pool, id).await {
                return ApiError::from(err).into_response();
            }
            request.extensions_mut().insert(ApiToken { id, ip });
            return next.run(request).await;
        }
        Ok(Presented::Active { id, .. }) => (
            id,
            ApiError::new(
                StatusCode::FORBIDDEN,
                "insufficient_scope",
                format!(
                    "this API token lacks the `{scope}` scope this call needs; nothing was done"
                ),
            ),
        ),
    };
    let (id, error) = refusal;
    let details = json!({
        "method": request.method().as_str(),
        "path": request.uri().path(),
        "scope": scope.as_str(),
        "reason": error.code,
    });
    let logged = actions::record(
        &state.pool,
        Actor::ApiToken { id, ip },
        "refused_api_call",
        "api_token",
        Some(id.to_string()),
        details,
    )
    .await;
    match logged {
        Ok(()) => error.into_response(),
        Err(err) => ApiError::from(err).into_response(),
    }
}
