//! One-time notices carried across a post/redirect/get in the session.
//!
//! A secret in a notice (a new vault key, an API token, a generated
//! password) never reaches the session store in clear: it is sealed with a
//! one-time key (ChaCha20-Poly1305), the session row keeps the ciphertext
//! and the browser the key, in a cookie that lives a minute. Neither half
//! alone tells anything; both are gone once the notice is shown.

use chacha20poly1305::{
    aead::{Aead, AeadCore, KeyInit, OsRng},
    ChaCha20Poly1305, Key, Nonce,
};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tower_sessions::Session;

use crate::domain::{CapIncreaseDraft, FieldErrors, KeyDraft, Notice, Suggestion};

const KEY: &str = "notice";
const SEALED: &str = "notice_secret";

/// The cookie holding the key to a sealed secret.
pub const REVEAL_COOKIE: &str = "vaultcap_reveal";
/// How long a sealed secret can be opened.
const REVEAL_SECONDS: i64 = 60;

/// A secret as the session row keeps it.
#[derive(Serialize, Deserialize)]
struct Sealed {
    nonce: Vec<u8>,
    ciphertext: Vec<u8>,
    until: DateTime<Utc>,
}

/// Keeps `notice` for the next page. When it carries a secret, answers the
/// `Set-Cookie` value the response must carry for the secret to be shown.
#[must_use = "a sealed secret can only be shown with the cookie this returns"]
pub async fn set(session: &Session, mut notice: Notice) -> Option<String> {
    let mut cookie = None;
    if let Some(secret) = notice.secret.take() {
        let key = ChaCha20Poly1305::generate_key(&mut OsRng);
        let nonce = ChaCha20Poly1305::generate_nonce(&mut OsRng);
        let ciphertext = ChaCha20Poly1305::new(&key)
            .encrypt(&nonce, secret.as_bytes())
            .expect("sealing a short secret cannot fail");
        let sealed = Sealed {
            nonce: nonce.to_vec(),
            ciphertext,
            until: Utc::now() + chrono::Duration::seconds(REVEAL_SECONDS),
        };
        if let Err(err) = session.insert(SEALED, sealed).await {
            tracing::error!(error = %err, "could not store a sealed secret in the session");
        }
        cookie = Some(format!(
            "{REVEAL_COOKIE}={}; Max-Age={REVEAL_SECONDS}; Path=/; HttpOnly; SameSite=Strict",
            hex::encode(key)
        ));
    }
    if cookie.is_none() {
        // An earlier secret never shown must not ride on this notice.
        let _ = session.remove_value(SEALED).await;
    }
    if let Err(err) = session.insert(KEY, notice).await {
        tracing::error!(error = %err, "could not store a notice in the session");
    }
    cookie
}

/// The notice left for this page, removed as it is read, with its secret
/// opened by the key in `cookies` (the request's `Cookie` header). A secret
/// that can no longer be opened (the minute passed, the cookie is gone) is
/// not shown, and the notice says so.
pub async fn take(session: &Session, cookies: Option<&str>) -> Option<Notice> {
    let mut notice = session.remove::<Notice>(KEY).await.ok().flatten()?;
    let sealed = session.remove::<Sealed>(SEALED).await.ok().flatten();
    if let Some(sealed) = sealed {
        let key = cookies.and_then(reveal_key);
        match key.and_then(|key| open(&sealed, &key)) {
            Some(secret) => notice.secret = Some(secret),
            None => notice.message.push_str(
                " The secret is no longer shown: it could be read once, within a minute. Revoke what it belongs to and make another.",
            ),
        }
    }
    Some(notice)
}

/// The `Set-Cookie` value that removes the key from the browser.
pub fn forget_reveal_cookie() -> String {
    format!("{REVEAL_COOKIE}=; Max-Age=0; Path=/; HttpOnly; SameSite=Strict")
}

fn open(sealed: &Sealed, key: &[u8]) -> Option<String> {
    if Utc::now() > sealed.until || key.len() != 32 || sealed.nonce.len() != 12 {
        return None;
    }
    let cipher = ChaCha20Poly1305::new(Key::from_slice(key));
    let plain = cipher
        .decrypt(
            Nonce::from_slice(&sealed.nonce),
            sealed.ciphertext.as_slice(),
        )
        .ok()?;
    String::from_utf8(plain).ok()
}

/// The reveal key from a `Cookie` header.
fn reveal_key(cookies: &str) -> Option<Vec<u8>> {
    let value = cookies.split(';').find_map(|pair| {
        let (name, value) = pair.trim().split_once('=')?;
        (name == REVEAL_COOKIE).then_some(value)
    })?;
    hex::decode(value).ok()
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
