//! One-time notices carried across a post/redirect/get in the session.

use tower_sessions::Session;

use crate::domain::Notice;

const KEY: &str = "notice";

pub async fn set(session: &Session, notice: Notice) {
    if let Err(err) = session.insert(KEY, notice).await {
        tracing::error!(error = %err, "could not store a notice in the session");
    }
}

pub async fn take(session: &Session) -> Option<Notice> {
    session.remove::<Notice>(KEY).await.ok().flatten()
}
