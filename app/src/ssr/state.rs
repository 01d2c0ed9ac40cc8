use std::sync::Arc;

use axum::extract::FromRef;
use leptos::config::LeptosOptions;
use sqlx::PgPool;

/// What every request handler and server function can reach. Holds no
/// per-process state beyond configuration: the database is the one source
/// of truth, so several instances can run side by side.
#[derive(Clone)]
pub struct AppState {
    pub leptos_options: LeptosOptions,
    pub pool: PgPool,
    pub auth: Arc<AuthConfig>,
    pub cap_increases: CapIncreaseRules,
}

/// How cap increase requests are bounded.
#[derive(Debug, Clone, Copy)]
pub struct CapIncreaseRules {
    /// A request not decided within this long expires (sooner if its key
    /// expires first).
    pub request_ttl: chrono::Duration,
    /// The most a key may be raised to, in percent of its expected total.
    pub ceiling_pct: u32,
}

impl Default for CapIncreaseRules {
    fn default() -> Self {
        Self {
            request_ttl: chrono::Duration::hours(24),
            ceiling_pct: 300,
        }
    }
}

/// Session and sign-in rules.
#[derive(Debug, Clone)]
pub struct AuthConfig {
    /// A session unused for this long is over.
    pub idle_timeout: chrono::Duration,
    /// A session is over this long after sign-in, however busy.
    pub absolute_timeout: chrono::Duration,
    /// Set the cookie's `Secure` flag (the console is served over TLS).
    pub secure_cookies: bool,
    /// Failed sign-ins counted over this window…
    pub throttle_window: chrono::Duration,
    /// …lock the account after this many…
    pub max_failures_per_account: i64,
    /// …and the client address after this many.
    pub max_failures_per_ip: i64,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            idle_timeout: chrono::Duration::minutes(30),
            absolute_timeout: chrono::Duration::hours(12),
            secure_cookies: false,
            throttle_window: chrono::Duration::minutes(15),
            max_failures_per_account: 5,
            max_failures_per_ip: 50,
        }
    }
}

impl FromRef<AppState> for LeptosOptions {
    fn from_ref(state: &AppState) -> Self {
        state.leptos_options.clone()
    }
}
