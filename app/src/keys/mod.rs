//! Vault keys: made from an expected total, capped, listed, followed
//! and revoked. `draft` and `list` are shared with the browser; `rules`
//! (the one check a new key passes, API and console alike), `sql`, and
//! `spend` and `call_stats` (what the ledger says a key spent) run on
//! the server.

#[cfg(feature = "ssr")]
pub mod call_stats;
pub mod draft;
pub mod list;
#[cfg(feature = "ssr")]
pub mod rules;
#[cfg(feature = "ssr")]
pub mod spend;
#[cfg(feature = "ssr")]
pub mod sql;

use serde::{Deserialize, Serialize};

use crate::domain::{BillingPeriod, Cents, Currency, VaultKeyId};

/// Whether a vault key can still be used, derived from its revocation and
/// expiry (never stored, so it cannot go stale).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyStatus {
    Active,
    Revoked,
    Expired,
}

impl KeyStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            KeyStatus::Active => "active",
            KeyStatus::Revoked => "revoked",
            KeyStatus::Expired => "expired",
        }
    }
}

/// A vault key as lists show it (never its secret: only the prefix).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeySummary {
    pub id: VaultKeyId,
    pub label: String,
    pub secret_prefix: String,
    pub billing_period: BillingPeriod,
    pub currency: Currency,
    pub expected_total: Cents,
    pub cap: Cents,
    pub spent: Cents,
    pub reserved: Cents,
    pub status: KeyStatus,
    /// As milliseconds: the browser bundle then needs no date parser.
    #[serde(with = "chrono::serde::ts_milliseconds")]
    pub expires_at: chrono::DateTime<chrono::Utc>,
    /// Utilization percentages that raise an alert, ascending.
    pub thresholds_pct: Vec<i16>,
}

impl KeySummary {
    /// `(spent + reserved) / cap` in whole percent, rounded down.
    pub fn utilization_pct(&self) -> i64 {
        Cents(self.spent.0 + self.reserved.0).percent_of(self.cap)
    }
}
