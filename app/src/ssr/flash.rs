//! One-time notices carried across a post/redirect/get in the session.

use tower_sessions::Session;

use crate::domain::{CapIncreaseDraft, FieldErrors, KeyDraft, Notice, Suggestion};

const KEY: &str = "notice";

pub async fn set(session: &Session, notice: Notice) {
    if let Err(err) = session.insert(KEY, notice).await {
        tracing::error!(error = %err, "could not store a notice in the session");
    }
}

pub async fn take(session: &Session) -> Option<Notice> {
    session.remove::<Notice>(KEY).await.ok().flatten()
}

const KEY_DRAFT: &str = "key_draft";

/// The new-key form as typed, with what was wrong, kept under `id` (carried
/// in the redirect's URL) for the page to show again. Reading does not
/// remove it, so a page rendered twice or reloaded shows the same; the next
/// refused form replaces it.
pub async fn set_key_draft(session: &Session, id: &str, draft: &KeyDraft, errors: &FieldErrors) {
    if let Err(err) = session.insert(KEY_DRAFT, (id, draft, errors)).await {
        tracing::error!(error = %err, "could not store a form in the session");
    }
}

pub async fn key_draft(session: &Session, id: &str) -> Option<(KeyDraft, FieldErrors)> {
    let (stored, draft, errors): (String, KeyDraft, FieldErrors) =
        session.get(KEY_DRAFT).await.ok().flatten()?;
    (stored == id).then_some((draft, errors))
}

/// Forgets the refused form and any uploaded suggestion: a key was created.
pub async fn clear_key_draft(session: &Session) {
    let _ = session.remove_value(KEY_DRAFT).await;
    let _ = session.remove_value(KEY_SUGGESTION).await;
}

const KEY_SUGGESTION: &str = "key_suggestion";

/// An expected total computed from an uploaded file, which the new-key form
/// offers instead of the previous period's until a key is created.
pub async fn set_key_suggestion(session: &Session, suggestion: &Suggestion) {
    if let Err(err) = session.insert(KEY_SUGGESTION, suggestion).await {
        tracing::error!(error = %err, "could not store a suggestion in the session");
    }
}

pub async fn key_suggestion(session: &Session) -> Option<Suggestion> {
    session.get(KEY_SUGGESTION).await.ok().flatten()
}

const CAP_INCREASE_DRAFT: &str = "cap_increase_draft";

/// The cap increase form as typed when it was refused, kept under `id` like
/// [`set_key_draft`].
pub async fn set_cap_increase_draft(session: &Session, id: &str, draft: &CapIncreaseDraft) {
    if let Err(err) = session.insert(CAP_INCREASE_DRAFT, (id, draft)).await {
        tracing::error!(error = %err, "could not store a form in the session");
    }
}

pub async fn cap_increase_draft(session: &Session, id: &str) -> Option<CapIncreaseDraft> {
    let (stored, draft): (String, CapIncreaseDraft) =
        session.get(CAP_INCREASE_DRAFT).await.ok().flatten()?;
    (stored == id).then_some(draft)
}
