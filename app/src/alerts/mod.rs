//! Alerts: raised by the ledger's SQL when a key's utilization crosses one
//! of its thresholds, delivered by the server's notifier, handled on the
//! Alerts page. The types here are shared with the browser; `sql` reads
//! and changes them on the server.

#[cfg(feature = "ssr")]
pub mod sql;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::domain::{AlertId, Cents, Currency, VaultKeyId};

/// An alert's state, derived from its acknowledgement and snooze.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AlertState {
    Open,
    Snoozed,
    Acknowledged,
}

impl AlertState {
    pub const ALL: [AlertState; 3] = [Self::Open, Self::Snoozed, Self::Acknowledged];

    pub fn parse(raw: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|state| state.as_str() == raw)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Snoozed => "snoozed",
            Self::Acknowledged => "acknowledged",
        }
    }
}

/// An alert on a vault key, with who has handled it and how its webhook
/// deliveries went.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(sqlx::FromRow))]
pub struct Alert {
    pub id: AlertId,
    pub vault_key_id: VaultKeyId,
    pub key_label: String,
    pub currency: Currency,
    pub key_expires_at: DateTime<Utc>,
    /// `threshold`, `cap_refused` or `expiring`.
    pub kind: String,
    pub threshold_pct: i16,
    /// Spent + reserved when raised (cap refusals: at the latest refusal;
    /// expiring: spent).
    pub committed_cents: Cents,
    pub cap_cents: Cents,
    /// The refused charge (cap refusals) or the expected billing left
    /// unspent (expiring).
    pub amount_cents: Option<Cents>,
    pub occurrences: i32,
    /// `open`, `snoozed` or `acknowledged` (see [`AlertState`]).
    pub state: String,
    pub raised_at: DateTime<Utc>,
    pub last_occurred_at: DateTime<Utc>,
    pub acknowledged_at: Option<DateTime<Utc>>,
    /// The operator's email, or `api token <name>`.
    pub acknowledged_by: Option<String>,
    pub ack_note: Option<String>,
    pub assigned_to: Option<String>,
    pub snoozed_until: Option<DateTime<Utc>>,
    pub deliveries_delivered: i64,
    pub deliveries_pending: i64,
    pub deliveries_failed: i64,
}

impl Alert {
    /// What happened, in a sentence, amounts in the key's currency.
    pub fn describe(&self) -> String {
        let currency = &self.currency;
        let money = |cents: Cents| format!("{} {currency}", cents.format(currency));
        let committed = money(self.committed_cents);
        let cap = money(self.cap_cents);
        let amount = money(self.amount_cents.unwrap_or_default());
        let label = &self.key_label;
        match self.kind.as_str() {
            "threshold" => format!(
                "{label} passed {} % of its cap: {committed} of {cap} committed.",
                self.threshold_pct
            ),
            "cap_refused" => format!(
                "{label} refused a charge of {amount} for its cap: {committed} of {cap} already committed."
            ),
            "expiring" => format!(
                "{label} expires {} UTC with {amount} of expected billing not yet spent.",
                self.key_expires_at.format("%Y-%m-%d %H:%M")
            ),
            other => format!("{label}: {other}"),
        }
    }

    pub fn kind_label(&self) -> String {
        match self.kind.as_str() {
            "threshold" => format!("{} % of cap", self.threshold_pct),
            "cap_refused" => "Refused for cap".into(),
            "expiring" => "Expiring".into(),
            other => other.into(),
        }
    }
}

/// What the Alerts page shows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AlertsView {
    pub alerts: Vec<Alert>,
    /// How many alerts are in each state, for the filter tabs.
    pub open: i64,
    pub snoozed: i64,
    pub acknowledged: i64,
    /// Operators an alert can be assigned to: (id, email).
    pub assignees: Vec<(crate::domain::OperatorId, String)>,
}
