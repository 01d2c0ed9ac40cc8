//! The JSON API billing jobs and tools call with an admin API token.
//! Errors have one shape: `{"error": {"code": "…", "message": "…"}}`.

pub mod alerts;
pub mod cap_increases;
pub mod keys;
mod openapi;

use axum::{
    extract::{rejection::JsonRejection, FromRequest, FromRequestParts, Request},
    http::{header, request::Parts, StatusCode},
    response::{IntoResponse, Response},
    Json,
};
use serde::de::DeserializeOwned;
use serde_json::json;

use app::{
    error::AppError,
    ssr::{data::api_tokens, secrets, AppState},
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
        tracing::error!(error = %err, "database error in the API");
        Self::internal()
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

/// The admin API token behind a request (`Authorization: Bearer vct_…`).
pub struct ApiToken {
    pub id: i64,
}

impl FromRequestParts<AppState> for ApiToken {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let token = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|token| !token.is_empty());
        let Some(token) = token else {
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthenticated",
                "send an admin API token as `Authorization: Bearer …` (create one with `vaultcap token add`)",
            ));
        };
        match api_tokens::authenticate(&state.pool, &secrets::hash(token)).await? {
            Some(id) => Ok(Self { id }),
            None => Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthenticated",
                "unknown or revoked API token",
            )),
        }
    }
}
