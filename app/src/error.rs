use leptos::server_fn::{
    codec::JsonEncoding,
    error::{FromServerFnError, ServerFnErrorErr},
};
use serde::{Deserialize, Serialize};

use crate::domain::{ParseError, Role};

/// The one error type of the console's server functions. Messages are meant
/// for the person at the screen; internal causes are logged on the server and
/// never sent to the browser.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum AppError {
    #[error("Sign in to continue.")]
    Unauthenticated,
    #[error("This needs the {0} role. Ask an administrator if you should have it.")]
    Forbidden(Role),
    #[error("{0}")]
    Invalid(String),
    #[error("Not found.")]
    NotFound,
    #[error("Something went wrong on our side; it has been logged. Try again in a moment.")]
    Internal,
    #[error("The server could not be reached: {0}")]
    Transport(String),
}

impl FromServerFnError for AppError {
    type Encoder = JsonEncoding;

    fn from_server_fn_error(value: ServerFnErrorErr) -> Self {
        AppError::Transport(value.to_string())
    }
}

impl From<ParseError> for AppError {
    fn from(err: ParseError) -> Self {
        AppError::Invalid(err.0)
    }
}

#[cfg(feature = "ssr")]
impl From<sqlx::Error> for AppError {
    fn from(err: sqlx::Error) -> Self {
        // A key for a signed-off period, however it was asked for (the
        // console, the key API, an approval): the database's refusal said.
        if let Some(db) = err.as_database_error() {
            if db.constraint() == Some("vault_key_period_open") {
                return AppError::Invalid(format!(
                    "{}: its keys were revoked at sign-off and no new key is issued for it",
                    db.message()
                ));
            }
        }
        tracing::error!(error = %err, "database error");
        AppError::Internal
    }
}
