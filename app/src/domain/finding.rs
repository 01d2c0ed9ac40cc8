//! Reconciliation findings as operators see them.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{BillingPeriod, Cents, Currency, ParseError};

/// The findings a page or an export shows: one period (the current UTC one
/// when not given), optionally one kind, open (default), resolved or all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FindingFilter {
    pub period: BillingPeriod,
    pub kind: Option<FindingKind>,
    /// `Some(true)` open, `Some(false)` resolved, `None` all.
    pub open: Option<bool>,
}

impl FindingFilter {
    pub fn parse(
        period: Option<&str>,
        kind: Option<&str>,
        state: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<Self, ParseError> {
        let period = match period.map(str::trim) {
            None | Some("") => BillingPeriod::containing(now),
            Some(raw) => raw.parse()?,
        };
        let kind = match kind.map(str::trim) {
            None | Some("") | Some("all") => None,
            Some(raw) => Some(FindingKind::parse(raw).ok_or_else(|| {
                ParseError::new(format!(
                    "{raw:?} is not a kind of finding: use orphaned, duplicate or missing"
                ))
            })?),
        };
        let open = match state.map(str::trim).unwrap_or("open") {
            "open" => Some(true),
            "resolved" => Some(false),
            "all" => None,
            other => {
                return Err(ParseError::new(format!(
                    "{other:?} is not a state: use open, resolved or all"
                )))
            }
        };
        Ok(Self { period, kind, open })
    }

    /// `open`, `resolved` or `all`.
    pub fn state(&self) -> &'static str {
        match self.open {
            Some(true) => "open",
            Some(false) => "resolved",
            None => "all",
        }
    }
}

/// What a finding is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    /// A live charge in Stripe with no billing record.
    Orphaned,
    /// Two or more live charges for one customer and period.
    Duplicate,
    /// A billing record whose charge Stripe does not have.
    Missing,
}

impl FindingKind {
    pub const ALL: [FindingKind; 3] = [Self::Orphaned, Self::Duplicate, Self::Missing];

    pub fn parse(raw: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.as_str() == raw)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Orphaned => "orphaned",
            Self::Duplicate => "duplicate",
            Self::Missing => "missing",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Self::Orphaned => "Orphaned charges",
            Self::Duplicate => "Duplicate charges",
            Self::Missing => "Missing charges",
        }
    }

    /// One finding of this kind, as a row names it.
    pub fn one(self) -> &'static str {
        match self {
            Self::Orphaned => "Orphaned charge",
            Self::Duplicate => "Duplicate charges",
            Self::Missing => "Missing charge",
        }
    }

    /// What to do about one, in a phrase.
    pub fn next_step(self) -> &'static str {
        match self {
            Self::Orphaned => "adopt it (write the missing billing record) or dismiss it",
            Self::Duplicate => "refund all but the keeper, or dismiss it as legitimate",
            Self::Missing => "investigate the billing record, then dismiss it with what you found",
        }
    }
}

/// One finding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(sqlx::FromRow))]
pub struct Finding {
    pub id: i64,
    /// `orphaned`, `duplicate` or `missing` (see [`FindingKind`]).
    pub kind: String,
    pub billing_period: String,
    pub customer_id: String,
    pub currency: String,
    pub charge_ids: Vec<String>,
    pub keeper_charge_id: Option<String>,
    pub amount_at_risk_cents: i64,
    pub explanation: String,
    pub detected_at: DateTime<Utc>,
    pub resolution: Option<String>,
    pub resolved_at: Option<DateTime<Utc>>,
    pub resolved_by: Option<String>,
    pub resolution_note: Option<String>,
}

impl Finding {
    pub fn kind(&self) -> Option<FindingKind> {
        FindingKind::parse(&self.kind)
    }

    pub fn currency(&self) -> Currency {
        Currency::parse(&self.currency).unwrap_or_else(|_| Currency::usd())
    }

    pub fn at_risk(&self) -> Cents {
        Cents(self.amount_at_risk_cents)
    }

    pub fn is_open(&self) -> bool {
        self.resolution.is_none()
    }
}

/// Open findings of one kind in one currency, and the money at risk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FindingTotal {
    pub kind: FindingKind,
    pub currency: Currency,
    pub open: i64,
    pub at_risk: Cents,
}

/// The last sync of a period, as the page reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncSummary {
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub pages: i32,
    pub charges_seen: i32,
    pub error: Option<String>,
}

/// What the Reconciliation page shows for one period.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReconciliationView {
    /// The query string of the page's filters, for the CSV export's link.
    pub export_query: String,
    pub period: String,
    /// Periods with synced charges or billing records, newest first.
    pub periods: Vec<String>,
    pub last_sync: Option<SyncSummary>,
    pub totals: Vec<FindingTotal>,
    pub findings: Vec<Finding>,
    /// `open` (default), `resolved` or `all`.
    pub state: String,
    pub kind: Option<FindingKind>,
}
