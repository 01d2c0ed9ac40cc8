use axum::{
    http::StatusCode,
    response::{Html, IntoResponse, Response},
};

use app::error::AppError;

/// A refusal or failure of a console request as a short page that says what
/// happened, with the matching status. Internal causes are logged where they
/// happen and never shown.
#[derive(Debug)]
pub struct HttpError {
    status: StatusCode,
    message: String,
}

impl HttpError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }
}

impl From<AppError> for HttpError {
    fn from(err: AppError) -> Self {
        let status = match &err {
            AppError::Unauthenticated => StatusCode::UNAUTHORIZED,
            AppError::Forbidden(_) => StatusCode::FORBIDDEN,
            AppError::Invalid(_) => StatusCode::UNPROCESSABLE_ENTITY,
            AppError::NotFound => StatusCode::NOT_FOUND,
            AppError::Internal | AppError::Transport(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self::new(status, err.to_string())
    }
}

impl From<sqlx::Error> for HttpError {
    fn from(err: sqlx::Error) -> Self {
        AppError::from(err).into()
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let status = self.status;
        let message = html_escape(&self.message);
        let page = format!(
            "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{status} · Vaultcap</title>\
             <link rel=\"stylesheet\" href=\"/pkg/vaultcap.css\"><link rel=\"icon\" type=\"image/svg+xml\" href=\"/pkg/favicon.svg\"></head><body><main class=\"centered\">\
             <section class=\"panel panel-error\" role=\"alert\"><h1>{status}</h1><p>{message}</p>\
             <p><a href=\"/\">Back to the console</a></p></section></main></body></html>"
        );
        (status, Html(page)).into_response()
    }
}

fn html_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
