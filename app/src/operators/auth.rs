//! Passwords, sessions and the role checks every page and server function
//! makes on the server.

use argon2::{
    password_hash::{rand_core::OsRng, PasswordHash, PasswordHasher, PasswordVerifier, SaltString},
    Algorithm, Argon2, Params, Version,
};
use chrono::{DateTime, Utc};
use rand::{distributions::Slice, Rng};
use sqlx::PgPool;
use tower_sessions::Session;

use crate::{
    domain::{Me, OperatorId, Role, MIN_PASSWORD_CHARS},
    error::AppError,
};
use crate::{operators::sql as operators, ssr::AuthConfig};

/// Argon2id with OWASP's recommended minimum: 19 MiB, 2 passes, 1 lane.
fn argon2() -> Argon2<'static> {
    let params = Params::new(19 * 1024, 2, 1, None).expect("valid argon2 parameters");
    Argon2::new(Algorithm::Argon2id, Version::V0x13, params)
}

/// Hashes a password into a PHC string (algorithm, parameters and salt
/// included, so parameters can change later without breaking old hashes).
pub fn hash_password(password: &str) -> String {
    let salt = SaltString::generate(&mut OsRng);
    argon2()
        .hash_password(password.as_bytes(), &salt)
        .expect("argon2 hashing with valid parameters cannot fail")
        .to_string()
}

/// Checks a password against a stored hash; a malformed hash never matches.
pub fn verify_password(password: &str, hash: &str) -> bool {
    PasswordHash::new(hash)
        .map(|parsed| {
            argon2()
                .verify_password(password.as_bytes(), &parsed)
                .is_ok()
        })
        .unwrap_or(false)
}

/// Verifies against a throwaway hash so that an unknown email costs as much
/// time as a wrong password and sign-in timing does not reveal accounts.
pub fn burn_verification_time(password: &str) {
    static DUMMY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let hash = DUMMY.get_or_init(|| hash_password("not a real password"));
    let _ = verify_password(password, hash);
}

/// At most a few password checks at once: each takes 19 MiB and a core for
/// a few tens of milliseconds, so a burst of sign-ins must queue, briefly,
/// or be told to come back, not take the server's memory.
#[derive(Clone)]
pub struct PasswordChecks {
    permits: std::sync::Arc<tokio::sync::Semaphore>,
    /// How long a sign-in waits for a free slot before it is told to retry.
    queue_wait: std::time::Duration,
    performed: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

/// Every password check slot stayed taken while a sign-in waited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Busy;

impl PasswordChecks {
    pub fn new(concurrent: usize, queue_wait: std::time::Duration) -> Self {
        Self {
            permits: std::sync::Arc::new(tokio::sync::Semaphore::new(concurrent.max(1))),
            queue_wait,
            performed: Default::default(),
        }
    }

    /// Whether `password` matches `hash`; without a hash (no such account)
    /// the same work is done against a throwaway one, so timing says
    /// nothing about which accounts exist.
    pub async fn verify(&self, password: String, hash: Option<String>) -> Result<bool, Busy> {
        let permit = tokio::time::timeout(self.queue_wait, self.permits.clone().acquire_owned())
            .await
            .map_err(|_| Busy)?
            .map_err(|_| Busy)?;
        self.performed
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Argon2 is deliberately slow: keep it off the async workers.
        let verified = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            match hash {
                Some(hash) => verify_password(&password, &hash),
                None => {
                    burn_verification_time(&password);
                    false
                }
            }
        })
        .await;
        Ok(verified.unwrap_or_else(|err| {
            tracing::error!(error = %err, "password verification task failed");
            false
        }))
    }

    /// How many passwords this process has checked (for tests and metrics).
    pub fn performed(&self) -> u64 {
        self.performed.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Default for PasswordChecks {
    /// Four at once, each sign-in waiting at most 3 s for its turn.
    fn default() -> Self {
        Self::new(4, std::time::Duration::from_secs(3))
    }
}

/// A random password for a new operator: 20 characters without look-alikes
/// (about 115 bits), shown once.
pub fn generate_password() -> String {
    const ALPHABET: &[char] = &[
        'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'j', 'k', 'm', 'n', 'p', 'q', 'r', 's', 't', 'u',
        'v', 'w', 'x', 'y', 'z', 'A', 'B', 'C', 'D', 'E', 'F', 'G', 'H', 'J', 'K', 'L', 'M', 'N',
        'P', 'Q', 'R', 'S', 'T', 'U', 'V', 'W', 'X', 'Y', 'Z', '2', '3', '4', '5', '6', '7', '8',
        '9',
    ];
    let dist = Slice::new(ALPHABET).expect("non-empty alphabet");
    rand::thread_rng().sample_iter(dist).take(20).collect()
}

pub fn check_password_strength(password: &str) -> Result<(), AppError> {
    if password.chars().count() < MIN_PASSWORD_CHARS {
        return Err(AppError::Invalid(format!(
            "a password needs at least {MIN_PASSWORD_CHARS} characters"
        )));
    }
    Ok(())
}

// Keys of what the session holds.
const OPERATOR_ID: &str = "operator_id";
const SIGNED_IN_AT: &str = "signed_in_at";
const LAST_SEEN_AT: &str = "last_seen_at";
const PENDING_OPERATOR_ID: &str = "pending_operator_id";
const PENDING_SINCE: &str = "pending_since";
/// How long after the password the code may come.
const PENDING_MINUTES: i64 = 5;

/// Remembers, between the password and the code, whose password was right.
/// The session is not signed in: every page still sends it to sign-in.
pub async fn begin_second_factor(
    session: &Session,
    operator_id: OperatorId,
) -> Result<(), AppError> {
    session.cycle_id().await.map_err(session_error)?;
    session
        .insert(PENDING_OPERATOR_ID, operator_id)
        .await
        .map_err(session_error)?;
    session
        .insert(PENDING_SINCE, Utc::now())
        .await
        .map_err(session_error)
}

/// The operator whose password was right in this session within the last
/// five minutes, waiting for their code.
pub async fn pending_second_factor(session: &Session) -> Result<Option<OperatorId>, AppError> {
    let operator: Option<OperatorId> = session
        .get(PENDING_OPERATOR_ID)
        .await
        .map_err(session_error)?;
    let since: Option<DateTime<Utc>> = session.get(PENDING_SINCE).await.map_err(session_error)?;
    Ok(match (operator, since) {
        (Some(id), Some(since))
            if Utc::now() - since < chrono::Duration::minutes(PENDING_MINUTES) =>
        {
            Some(id)
        }
        _ => None,
    })
}

/// Starts a signed-in session: a new session id (so an id planted before
/// sign-in is worthless afterwards) and the times the timeouts count from.
pub async fn begin_session(session: &Session, operator_id: OperatorId) -> Result<(), AppError> {
    session.cycle_id().await.map_err(session_error)?;
    for pending in [PENDING_OPERATOR_ID, PENDING_SINCE] {
        session.remove_value(pending).await.map_err(session_error)?;
    }
    let now = Utc::now();
    session
        .insert(OPERATOR_ID, operator_id)
        .await
        .map_err(session_error)?;
    session
        .insert(SIGNED_IN_AT, now)
        .await
        .map_err(session_error)?;
    session
        .insert(LAST_SEEN_AT, now)
        .await
        .map_err(session_error)?;
    Ok(())
}

pub async fn end_session(session: &Session) -> Result<(), AppError> {
    session.flush().await.map_err(session_error)
}

fn session_error(err: tower_sessions::session::Error) -> AppError {
    tracing::error!(error = %err, "session store error");
    AppError::Internal
}

/// Who a request's session belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionState {
    Anonymous,
    /// The session was signed in but timed out or its operator was disabled;
    /// it has been ended.
    Expired,
    SignedIn(Me),
}

/// Resolves the session to an operator, enforcing the idle and absolute
/// timeouts and the operator's current state (a disabled operator or a
/// changed role takes effect on their next request).
pub async fn resolve_session(
    session: &Session,
    pool: &PgPool,
    config: &AuthConfig,
) -> Result<SessionState, AppError> {
    let Some(operator_id) = session
        .get::<OperatorId>(OPERATOR_ID)
        .await
        .map_err(session_error)?
    else {
        return Ok(SessionState::Anonymous);
    };
    let signed_in_at: Option<DateTime<Utc>> =
        session.get(SIGNED_IN_AT).await.map_err(session_error)?;
    let last_seen_at: Option<DateTime<Utc>> =
        session.get(LAST_SEEN_AT).await.map_err(session_error)?;
    let now = Utc::now();
    let timed_out = match (signed_in_at, last_seen_at) {
        (Some(signed_in), Some(seen)) => {
            now - signed_in >= config.absolute_timeout || now - seen >= config.idle_timeout
        }
        _ => true,
    };
    let operator = operators::find_by_id(pool, operator_id).await?;
    match operator {
        Some(op) if !timed_out && op.disabled_at.is_none() => {
            session
                .insert(LAST_SEEN_AT, now)
                .await
                .map_err(session_error)?;
            Ok(SessionState::SignedIn(op.me()))
        }
        _ => {
            end_session(session).await?;
            Ok(SessionState::Expired)
        }
    }
}

/// The operator behind the request being served, as the authentication
/// middleware found them.
pub fn current_operator() -> Option<Me> {
    leptos::prelude::use_context::<http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<Me>().cloned())
}

/// The signed-in operator if their role allows `needed`; otherwise the
/// error, with the response status set to 401 or 403 to match.
pub fn require(needed: Role) -> Result<Me, AppError> {
    let outcome = match current_operator() {
        None => Err((AppError::Unauthenticated, http::StatusCode::UNAUTHORIZED)),
        Some(me) if me.role.allows(needed) => Ok(me),
        Some(_) => Err((AppError::Forbidden(needed), http::StatusCode::FORBIDDEN)),
    };
    outcome.map_err(|(error, status)| {
        if let Some(response) = leptos::prelude::use_context::<leptos_axum::ResponseOptions>() {
            response.set_status(status);
        }
        error
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hashed_password_verifies_and_a_wrong_one_does_not() {
        let hash = hash_password("correct horse battery");
        assert!(
            hash.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"),
            "{hash}"
        );
        assert!(verify_password("correct horse battery", &hash));
        assert!(!verify_password("correct horse battery!", &hash));
        assert!(!verify_password("anything", "not a phc string"));
    }

    #[tokio::test]
    async fn password_checks_beyond_the_pool_are_told_to_come_back() {
        let hash = hash_password("correct horse battery");
        let checks = PasswordChecks::new(1, std::time::Duration::ZERO);
        let (first, second) = tokio::join!(
            checks.verify("correct horse battery".into(), Some(hash.clone())),
            checks.verify("correct horse battery".into(), Some(hash.clone())),
        );
        assert_eq!((first, second), (Ok(true), Err(Busy)));
        assert_eq!(checks.performed(), 1);
        assert_eq!(checks.verify("wrong".into(), Some(hash)).await, Ok(false));
        assert_eq!(checks.verify("anything".into(), None).await, Ok(false));
        assert_eq!(checks.performed(), 3);
    }

    #[test]
    fn generated_passwords_are_long_and_differ() {
        let (a, b) = (generate_password(), generate_password());
        assert_eq!(a.len(), 20);
        assert_ne!(a, b);
        assert!(check_password_strength(&a).is_ok());
        assert!(check_password_strength("short").is_err());
    }
}
