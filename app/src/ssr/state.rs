use std::sync::Arc;

use axum::extract::FromRef;
use leptos::config::LeptosOptions;
use sqlx::PgPool;

use super::Reads;
use crate::{
    key_requests::rules::KeyPolicy,
    operators::{auth::PasswordChecks, login_failures::Limits},
};

/// What every request handler and server function can reach. Holds no
/// per-process state beyond configuration: the database is the one source
/// of truth, so several instances can run side by side.
#[derive(Clone)]
pub struct AppState {
    pub leptos_options: LeptosOptions,
    /// The primary: money, alerts, approvals, sign-in and every write.
    pub pool: PgPool,
    /// The console's long reads: a streaming replica when one is set.
    pub reads: Reads,
    pub auth: Arc<AuthConfig>,
    pub cap_increases: CapIncreaseRules,
    /// How far a new key may go without a second person.
    pub key_policy: KeyPolicy,
    /// The bounded pool sign-ins check passwords in.
    pub password_checks: PasswordChecks,
    /// A Stripe secret key is configured, so the console can sync periods
    /// (and the proxy forward calls).
    pub stripe_configured: bool,
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
    /// How failed sign-ins slow down guessing (per account: a growing
    /// delay, never a lock an attacker could impose; per address: a limit).
    pub throttle: Limits,
    /// Reverse proxies (TLS terminators, load balancers) whose
    /// `X-Forwarded-For` names the client; from anyone else it is ignored.
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// The bearer token `/metrics` wants; without one, only this host
    /// may read it.
    pub metrics_token: Option<String>,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            idle_timeout: chrono::Duration::minutes(30),
            absolute_timeout: chrono::Duration::hours(12),
            secure_cookies: false,
            throttle: Limits {
                window: chrono::Duration::minutes(15),
                free_per_account: 5,
                first_delay: chrono::Duration::seconds(1),
                max_delay: chrono::Duration::seconds(60),
                max_per_ip: 50,
            },
            trusted_proxies: Vec::new(),
            metrics_token: None,
        }
    }
}

impl FromRef<AppState> for LeptosOptions {
    fn from_ref(state: &AppState) -> Self {
        state.leptos_options.clone()
    }
}
