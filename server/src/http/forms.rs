//! What every console form handler shares: reading the form, and
//! answering with a redirect back to its page and a one-time notice
//! (post/redirect/get), so every form works without JavaScript. The role
//! check happens before a handler runs (see `guard`).

use axum::{
    extract::{rejection::FormRejection, FromRequest, FromRequestParts, Request},
    http::{header, HeaderValue, StatusCode},
    response::{IntoResponse, Redirect, Response},
    Form,
};
use serde::de::DeserializeOwned;
use tower_sessions::Session;

use super::error::HttpError;
use app::{domain::Notice, error::AppError, ssr::flash};

/// Why a form could not be handled: a message for the page, or a response
/// of its own (an oversized body keeps its 413).
pub enum Failure {
    App(AppError),
    Rejected(FormRejection),
}

impl From<AppError> for Failure {
    fn from(err: AppError) -> Self {
        Self::App(err)
    }
}

impl From<sqlx::Error> for Failure {
    fn from(err: sqlx::Error) -> Self {
        Self::App(err.into())
    }
}

impl From<app::domain::ParseError> for Failure {
    fn from(err: app::domain::ParseError) -> Self {
        Self::App(err.into())
    }
}

pub fn readable<T>(form: Result<Form<T>, FormRejection>) -> Result<T, Failure> {
    match form {
        Ok(Form(form)) => Ok(form),
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            Err(Failure::Rejected(rejection))
        }
        Err(rejection) => Err(Failure::App(AppError::Invalid(format!(
            "the form could not be read: {}",
            rejection.body_text()
        )))),
    }
}

/// A form that belongs to one page: where the operator is sent back to
/// when the form cannot be read.
pub trait PageForm {
    const PAGE: Page;
}

/// Names the page each of the form types given belongs to:
/// `page_forms!(PAGE: AckForm, SnoozeForm);`.
macro_rules! page_forms {
    ($page:ident: $($form:ty),+ $(,)?) => {
        $(impl $crate::http::forms::PageForm for $form {
            const PAGE: $crate::http::forms::Page = $page;
        })+
    };
}
pub(crate) use page_forms;

/// A console form, read. A form that cannot be read never reaches the
/// handler: the operator is sent back to its page with the reason (an
/// oversized body keeps its 413), so a handler shows only what it decides.
pub struct ConsoleForm<T>(pub T);

impl<S, T> FromRequest<S> for ConsoleForm<T>
where
    S: Send + Sync,
    T: DeserializeOwned + PageForm + Send,
{
    type Rejection = Response;

    async fn from_request(request: Request, state: &S) -> Result<Self, Response> {
        let (mut parts, body) = request.into_parts();
        let session = Session::from_request_parts(&mut parts, state)
            .await
            .map_err(IntoResponse::into_response)?;
        let form = Form::<T>::from_request(Request::from_parts(parts, body), state).await;
        match readable(form) {
            Ok(form) => Ok(Self(form)),
            Err(failure) => Err(T::PAGE.back_with(&session, Err(failure)).await),
        }
    }
}

/// A console page that forms post back to.
pub struct Page {
    pub path: &'static str,
    /// The notice when the form's subject no longer exists.
    pub gone: &'static str,
}

impl Page {
    /// Back to the page with the outcome of the action as a notice.
    pub async fn back_with(&self, session: &Session, outcome: Result<Notice, Failure>) -> Response {
        self.back_to(self.path, session, outcome).await
    }

    /// Like [`Page::back_with`], to `path` (the page with its filters).
    pub async fn back_to(
        &self,
        path: &str,
        session: &Session,
        outcome: Result<Notice, Failure>,
    ) -> Response {
        let notice = match outcome {
            Ok(notice) => notice,
            Err(Failure::Rejected(rejection)) => return rejection.into_response(),
            Err(Failure::App(AppError::Invalid(message))) => {
                Notice::error(format!("Nothing was changed: {message}."))
            }
            Err(Failure::App(AppError::NotFound)) => Notice::error(self.gone),
            Err(Failure::App(other)) => return HttpError::from(other).into_response(),
        };
        redirect_with(session, notice, path).await
    }
}

/// Leaves `notice` for the next page and redirects there, with the cookie
/// that opens its sealed secret when it has one (see `flash`).
pub async fn redirect_with(session: &Session, notice: Notice, path: &str) -> Response {
    let reveal = flash::set(session, notice).await;
    let mut response = Redirect::to(path).into_response();
    if let Some(cookie) = reveal.and_then(|cookie| HeaderValue::from_str(&cookie).ok()) {
        response.headers_mut().append(header::SET_COOKIE, cookie);
    }
    response
}
