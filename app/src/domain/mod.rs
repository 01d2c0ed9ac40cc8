//! Types both the server and the browser use. Parsed once at the edge,
//! impossible to misuse after; no I/O here. The vocabulary every feature
//! shares lives here (money, billing periods, ids, decisions, endpoints);
//! each feature's own types live in its folder and are re-exported below,
//! so `crate::domain::X` names any of them.

#[cfg(feature = "ssr")]
mod columns;
mod decision;
mod duplicate_policy;
mod endpoint;
mod ids;
mod money;
mod period;
mod replica;

pub use crate::actions::query::{
    ActionEntry, ActionFilter, ActionPage, ActionQuery, ACTION_SOURCES,
};
pub use crate::actions::words::{action_phrase, ActionSubject};
pub use crate::alerts::{Alert, AlertState, AlertsView};
pub use crate::audit::chain::{ChainStatus, LogIntegrity};
pub use crate::audit::query::{
    datetime_local, AuditCall, AuditCallDetail, AuditFilter, AuditPage, AuditQuery, Cursor,
    DecisionFilter, Position, AUDIT_PAGE_SIZES, DEFAULT_AUDIT_PAGE_SIZE,
};
pub use crate::cap_increases::{
    ApplyAs, ApprovalPreview, ApprovalsView, CapIncrease, CapIncreaseDraft, CapIncreaseForm,
    CapSuggestion, RefusedCharges, RequestState,
};
pub use crate::key_requests::{KeyRequest, KeyRequestPreview};
pub use crate::keys::draft::{
    field_error, FieldErrors, KeyDraft, KeyForm, Suggestion, DEFAULT_ENDPOINTS,
};
pub use crate::keys::list::{
    CallSummary, DecisionCount, KeyDetail, KeyFilter, KeyList, KeyQuery, KeySort, KEYS_PER_PAGE,
};
pub use crate::keys::{KeyStatus, KeySummary};
pub use crate::operators::api_scope::{
    parse_token_ceiling, parse_token_days, ApiScope, ApiTokenSummary, TokenStatus,
    DEFAULT_TOKEN_DAYS, MAX_TOKEN_DAYS,
};
pub use crate::operators::email::Email;
pub use crate::operators::role::Role;
pub use crate::operators::two_factor::{Enrollment, TwoFactorView};
pub use crate::operators::OperatorSummary;
pub use crate::periods::{
    PeriodClose, PeriodCloseView, PeriodMoney, PeriodReport, PeriodState, PeriodStatus,
    ReportCapIncrease, ReportFinding, ReportKey,
};
pub use crate::reconciliation::{
    at_risk_by_currency, counted, money_text, BulkAction, BulkPreview, EvidenceCall,
    EvidenceCharge, EvidenceRecord, Finding, FindingEvidence, FindingFilter, FindingKind,
    FindingTotal, KeyChoice, ReconciliationView, SyncState, SyncSummary, MAX_BULK,
};
pub use decision::Decision;
pub use duplicate_policy::DuplicatePolicy;
pub use endpoint::{moves_money, EndpointPattern, KNOWN_ENDPOINTS};
pub use ids::{
    AlertId, ApiTokenId, AuditId, CapIncreaseId, FindingId, KeyRequestId, OperatorId, VaultKeyId,
};
pub use money::{group_thousands, Cents, Currency, MAX_CENTS, ZERO_DECIMAL};
pub use period::BillingPeriod;
pub use replica::ReplicaLag;

use serde::{Deserialize, Serialize};

/// Passwords chosen by people must be at least this long.
pub const MIN_PASSWORD_CHARS: usize = 12;

/// The signed-in operator, as the console shows them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Me {
    pub id: OperatorId,
    pub email: String,
    pub role: Role,
}

/// Why a value from outside was refused: a message a person can act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ParseError(pub String);

impl ParseError {
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

/// A one-time message shown at the top of the next page after a form was
/// submitted (post/redirect/get). `secret` holds something shown only this
/// once, such as a generated password.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Notice {
    pub kind: NoticeKind,
    pub message: String,
    pub secret: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum NoticeKind {
    Success,
    Error,
}

impl Notice {
    pub fn success(message: impl Into<String>) -> Self {
        Self {
            kind: NoticeKind::Success,
            message: message.into(),
            secret: None,
        }
    }

    pub fn error(message: impl Into<String>) -> Self {
        Self {
            kind: NoticeKind::Error,
            message: message.into(),
            secret: None,
        }
    }

    pub fn with_secret(mut self, secret: String) -> Self {
        self.secret = Some(secret);
        self
    }
}

/// One currency's totals over a billing period's keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeriodTotals {
    pub currency: Currency,
    pub keys: i64,
    pub active_keys: i64,
    pub expected_total: Cents,
    pub cap: Cents,
    pub spent: Cents,
    pub reserved: Cents,
}

/// What the overview shows for one billing period.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Overview {
    pub period: BillingPeriod,
    /// As milliseconds: the browser bundle then needs no date parser.
    #[serde(with = "chrono::serde::ts_milliseconds")]
    pub as_of: chrono::DateTime<chrono::Utc>,
    pub totals: Vec<PeriodTotals>,
    pub billing_records: i64,
    pub billed_customers_amount: Vec<(Currency, Cents)>,
    /// The period's keys at or above one of their thresholds, fullest
    /// first (at most a page), and how many there are.
    pub at_threshold: Vec<KeySummary>,
    pub at_threshold_count: i64,
    pub open_alerts: i64,
    /// Calls refused in the last 24 hours (whole hours), every reason.
    pub refused_last_24h: i64,
    pub daily_spend: Vec<SpendChart>,
    /// The latest billing periods and where each stands with finance.
    pub periods: Vec<PeriodStatus>,
}

/// One row of a chart's figures: the day (`2026-12-01`, written on the
/// server so the browser bundle needs no date parser) and an amount per
/// column.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DayFigures {
    pub day: String,
    pub amounts: Vec<Cents>,
}

/// A chart of daily spend per key in one currency, drawn on the server,
/// and its legend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpendChart {
    pub currency: Currency,
    pub svg: String,
    /// (key id, label, CSS colour of its line, spent this period).
    pub legend: Vec<(VaultKeyId, String, String, Cents)>,
    /// The chart's figures, its text alternative: a column per key of the
    /// legend, a row per day that spent anything.
    pub by_day: Vec<DayFigures>,
}

/// Whether a `next` address is a path on this site, safe to redirect to
/// after sign-in. Browsers parse a `Location` by the URL standard: they
/// drop tabs and newlines anywhere, trim control characters and spaces,
/// and read `\\` as `/`, so `/\t/evil.example` and `/\\evil.example` mean
/// `//evil.example`, another host. Only a plain path is accepted: one `/`
/// first, then no backslash, control character or whitespace at all.
pub fn is_local_path(path: &str) -> bool {
    const LONGEST: usize = 2048;
    path.len() <= LONGEST
        && path.starts_with('/')
        && !path[1..].starts_with('/')
        && !path
            .chars()
            .any(|c| c == '\\' || c.is_control() || c.is_whitespace())
}

#[cfg(test)]
mod tests {
    use super::is_local_path;

    #[test]
    fn only_plain_paths_on_this_site_are_return_addresses() {
        for local in ["/", "/keys/12", "/audit?from=2026-12-01&key=3", "/a%2F%2Fb"] {
            assert!(is_local_path(local), "{local}");
        }
        for foreign in [
            "//evil.example",
            "/\\evil.example",
            "/\t/evil.example",
            "/\n/evil.example",
            "/\r/evil.example",
            "\t//evil.example",
            " /keys",
            "/keys\\..\\..",
            "/\u{0}/x",
            "/\u{a0}/x",
            "https://evil.example/",
            "javascript:alert(1)",
            "keys",
            "",
        ] {
            assert!(!is_local_path(foreign), "{foreign:?}");
        }
        assert!(!is_local_path(&format!("/{}", "a".repeat(2048))));
    }
}
