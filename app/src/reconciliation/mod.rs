//! Reconciliation: Stripe's charges against the billing ledger. The
//! findings as operators see them are here, shared with the browser; on
//! the server, `stripe_charges` holds what a sync brought, `billing_records`
//! the ledger, `findings` detection and resolution, `rules` what an operator
//! may do to a finding.

#[cfg(feature = "ssr")]
pub mod billing_records;
#[cfg(feature = "ssr")]
pub mod findings;
#[cfg(feature = "ssr")]
pub mod rules;
#[cfg(feature = "ssr")]
pub mod stripe_charges;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::domain::{BillingPeriod, Cents, Currency, ParseError};

/// The findings a page, an export or a bulk action covers: one period (the
/// current UTC one when not given), optionally one kind, open (default),
/// resolved or all, optionally customers whose id starts with a text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FindingFilter {
    pub period: BillingPeriod,
    pub kind: Option<FindingKind>,
    /// `Some(true)` open, `Some(false)` resolved, `None` all.
    pub open: Option<bool>,
    /// The start of the billing job's customer id.
    pub customer: Option<String>,
}

/// The longest customer search.
const MAX_CUSTOMER_CHARS: usize = 200;

impl FindingFilter {
    pub fn parse(
        period: Option<&str>,
        kind: Option<&str>,
        state: Option<&str>,
        customer: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<Self, ParseError> {
        let customer = match customer.map(str::trim) {
            None | Some("") => None,
            Some(raw) if raw.chars().count() > MAX_CUSTOMER_CHARS => {
                return Err(ParseError::new(format!(
                    "a customer search has at most {MAX_CUSTOMER_CHARS} characters"
                )))
            }
            Some(raw) => Some(raw.to_owned()),
        };
        let period = match period.map(str::trim) {
            None | Some("") => BillingPeriod::containing(now),
            Some(raw) => raw.parse()?,
        };
        let kind = match kind.map(str::trim) {
            None | Some("") | Some("all") => None,
            Some(raw) => Some(FindingKind::parse(raw).ok_or_else(|| {
                ParseError::new(format!(
                    "{raw:?} is not a kind of finding: use orphaned, duplicate, missing or unmetered"
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
        Ok(Self {
            period,
            kind,
            open,
            customer,
        })
    }

    /// The filter as a query string (`period=…&kind=…&state=…&customer=…`).
    pub fn query(&self) -> String {
        let mut query = format!(
            "period={}&kind={}&state={}",
            self.period,
            self.kind.map(FindingKind::as_str).unwrap_or("all"),
            self.state()
        );
        if let Some(customer) = &self.customer {
            query.push_str(&format!(
                "&customer={}",
                crate::keys::list::encode(customer)
            ));
        }
        query
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
    /// A charge in Stripe that no vault key's call made: the real key was
    /// used directly.
    Unmetered,
}

impl FindingKind {
    pub const ALL: [FindingKind; 4] = [
        Self::Orphaned,
        Self::Duplicate,
        Self::Missing,
        Self::Unmetered,
    ];

    pub fn parse(raw: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.as_str() == raw)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Orphaned => "orphaned",
            Self::Duplicate => "duplicate",
            Self::Missing => "missing",
            Self::Unmetered => "unmetered",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Self::Orphaned => "Orphaned charges",
            Self::Duplicate => "Duplicate charges",
            Self::Missing => "Missing charges",
            Self::Unmetered => "Unmetered charges",
        }
    }

    /// One finding of this kind, as a row names it.
    pub fn one(self) -> &'static str {
        match self {
            Self::Orphaned => "Orphaned charge",
            Self::Duplicate => "Duplicate charges",
            Self::Missing => "Missing charge",
            Self::Unmetered => "Unmetered charge",
        }
    }

    /// What to do about one, in a phrase.
    pub fn next_step(self) -> &'static str {
        match self {
            Self::Orphaned => "adopt it (write the missing billing record) or dismiss it",
            Self::Duplicate => "refund all but the keeper, or dismiss it as legitimate",
            Self::Missing => "investigate the billing record, then dismiss it with what you found",
            Self::Unmetered => {
                "find who used the real Stripe key, then attribute the charge to its vault key or dismiss it"
            }
        }
    }
}

/// One finding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(sqlx::FromRow))]
pub struct Finding {
    pub id: crate::domain::FindingId,
    pub kind: FindingKind,
    pub billing_period: BillingPeriod,
    pub customer_id: String,
    pub currency: Currency,
    pub charge_ids: Vec<String>,
    pub keeper_charge_id: Option<String>,
    /// The money at risk, in `currency`.
    #[cfg_attr(feature = "ssr", sqlx(rename = "amount_at_risk_cents"))]
    pub at_risk: Cents,
    pub explanation: String,
    pub detected_at: DateTime<Utc>,
    pub resolution: Option<String>,
    pub resolved_at: Option<DateTime<Utc>>,
    pub resolved_by: Option<String>,
    pub resolution_note: Option<String>,
    /// The vault key an unmetered charge was attributed to (its label).
    pub attributed_to: Option<String>,
}

impl Finding {
    pub fn is_open(&self) -> bool {
        self.resolution.is_none()
    }
}

/// Open findings of one kind in one currency, and the money at risk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(sqlx::FromRow))]
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
    pub intents_seen: i32,
    pub error: Option<String>,
}

impl SyncSummary {
    /// `120 charges and 4 payment intents in 3 pages`.
    pub fn seen(&self) -> String {
        let count = |n: i32, one, many| counted(usize::try_from(n).unwrap_or(0), one, many);
        format!(
            "{} and {} in {}",
            count(self.charges_seen, "charge", "charges"),
            count(self.intents_seen, "payment intent", "payment intents"),
            count(self.pages, "page", "pages"),
        )
    }
}

/// A finished sync older than this no longer speaks for Stripe: charges
/// made since are unchecked.
pub const SYNC_STALE_AFTER_HOURS: i64 = 24;

/// Where a period's sync from Stripe stands. The page words each state
/// once, and says that Stripe and the billing records agree only when a
/// recent sync found nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SyncState {
    /// No sync of the period ever started.
    Never,
    Running(SyncSummary),
    /// The last sync stopped with an error; syncing again resumes it.
    Failed(SyncSummary),
    /// The last sync finished more than [`SYNC_STALE_AFTER_HOURS`] ago.
    Stale(SyncSummary),
    Fresh(SyncSummary),
}

impl SyncState {
    pub fn of(last: Option<SyncSummary>, now: DateTime<Utc>) -> Self {
        let Some(sync) = last else {
            return Self::Never;
        };
        match (sync.finished_at, &sync.error) {
            (Some(at), _) if now - at > chrono::Duration::hours(SYNC_STALE_AFTER_HOURS) => {
                Self::Stale(sync)
            }
            (Some(_), _) => Self::Fresh(sync),
            (None, Some(_)) => Self::Failed(sync),
            (None, None) => Self::Running(sync),
        }
    }

    /// Whether starting a sync now makes sense (one is not under way).
    pub fn can_start(&self) -> bool {
        !matches!(self, Self::Running(_))
    }
}

/// What the Reconciliation page shows for one period.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReconciliationView {
    /// The query string of the page's filters, for the CSV export's link.
    pub export_query: String,
    pub period: BillingPeriod,
    /// Periods with synced charges or billing records, newest first.
    pub periods: Vec<BillingPeriod>,
    pub sync: SyncState,
    /// Why this server cannot sync from Stripe at all (no secret key), if so.
    pub sync_unavailable: Option<String>,
    pub totals: Vec<FindingTotal>,
    pub findings: Vec<Finding>,
    /// `open` (default), `resolved` or `all`.
    pub state: String,
    pub kind: Option<FindingKind>,
    /// The customer search, as typed.
    pub customer: String,
}

/// A charge as a finding's page compares it: what Stripe last said, and
/// what the proxy saw when it was made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvidenceCharge {
    pub id: String,
    /// False when the last sync did not see it (a missing charge).
    pub synced: bool,
    pub in_finding: bool,
    pub keeper: bool,
    pub created_at: Option<DateTime<Utc>>,
    pub amount: Cents,
    pub refunded: Cents,
    pub currency: Currency,
    pub status: Option<String>,
    pub payment_intent: Option<String>,
    pub stripe_customer: Option<String>,
    pub metadata_customer_id: Option<String>,
    pub metadata_billing_period: Option<String>,
    /// The Idempotency-Key of the proxy call that made it, if one did.
    pub idempotency_key: Option<String>,
    /// The vault key prefix of that call.
    pub key_prefix: Option<String>,
}

/// The billing job's row for the finding's customer and period.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(sqlx::FromRow))]
pub struct EvidenceRecord {
    pub charge_id: Option<String>,
    #[cfg_attr(feature = "ssr", sqlx(rename = "amount_cents"))]
    pub amount: Cents,
    pub currency: Currency,
    pub status: String,
    pub stripe_customer_id: Option<String>,
    pub created_at: DateTime<Utc>,
}

/// A proxy call for the finding's customer and period, or for one of its
/// charges.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(sqlx::FromRow))]
pub struct EvidenceCall {
    /// The audit row.
    pub id: crate::domain::AuditId,
    pub at: DateTime<Utc>,
    pub key_prefix: Option<String>,
    pub method: String,
    pub path: String,
    pub idempotency_key: Option<String>,
    #[cfg_attr(feature = "ssr", sqlx(rename = "amount_cents"))]
    pub amount: Option<Cents>,
    pub decision: crate::domain::Decision,
    pub upstream_status: Option<i16>,
    pub stripe_object_id: Option<String>,
    pub message: Option<String>,
}

/// Everything a finding's page shows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FindingEvidence {
    pub finding: Finding,
    /// The finding's charges and the customer's other charges in the period,
    /// oldest first.
    pub charges: Vec<EvidenceCharge>,
    pub record: Option<EvidenceRecord>,
    pub calls: Vec<EvidenceCall>,
    /// What people did about it, oldest first.
    pub history: Vec<crate::domain::ActionEntry>,
    pub last_synced_at: Option<DateTime<Utc>>,
    /// The vault keys an unmetered charge may be attributed to: those of
    /// its period and currency (none for other kinds).
    pub keys: Vec<KeyChoice>,
}

/// A vault key as a chooser lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(sqlx::FromRow))]
pub struct KeyChoice {
    pub id: crate::domain::VaultKeyId,
    pub label: String,
    pub secret_prefix: String,
}

/// The most findings one bulk action resolves: a larger set is previewed
/// and resolved in parts.
pub const MAX_BULK: usize = 200;

/// One resolution applied to every finding of a filtered set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BulkAction {
    /// Adopt every orphaned charge.
    Adopt,
    /// Refund every duplicate's extra charges.
    Refund,
    /// Dismiss every finding with one reason.
    Dismiss,
}

impl BulkAction {
    pub const ALL: [BulkAction; 3] = [Self::Adopt, Self::Refund, Self::Dismiss];

    pub fn parse(raw: &str) -> Result<Self, ParseError> {
        Self::ALL
            .into_iter()
            .find(|action| action.as_str() == raw.trim())
            .ok_or_else(|| {
                ParseError::new(format!(
                    "{raw:?} is not a bulk action: use adopt, refund or dismiss"
                ))
            })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Adopt => "adopt",
            Self::Refund => "refund",
            Self::Dismiss => "dismiss",
        }
    }

    /// The only kind it applies to (dismissing applies to any).
    pub fn kind(self) -> Option<FindingKind> {
        match self {
            Self::Adopt => Some(FindingKind::Orphaned),
            Self::Refund => Some(FindingKind::Duplicate),
            Self::Dismiss => None,
        }
    }

    /// The form's option.
    pub fn label(self) -> &'static str {
        match self {
            Self::Adopt => "Adopt the orphaned charges",
            Self::Refund => "Refund the duplicate charges",
            Self::Dismiss => "Dismiss with one reason",
        }
    }

    /// `Refunded`, as a result's notice starts.
    pub fn done(self) -> &'static str {
        match self {
            Self::Adopt => "Adopted",
            Self::Refund => "Refunded",
            Self::Dismiss => "Dismissed",
        }
    }
}

/// What a bulk action would do, shown before it is confirmed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BulkPreview {
    pub action: BulkAction,
    pub period: BillingPeriod,
    /// The page's kind filter.
    pub kind: Option<FindingKind>,
    /// The page's customer search.
    pub customer: String,
    /// The query string back to the page's filtered list.
    pub back_query: String,
    /// The findings it applies to, the largest risk first (at most
    /// [`MAX_BULK`]).
    pub findings: Vec<Finding>,
    /// Open findings of the filter it leaves for a next round.
    pub left_over: i64,
    /// The money at risk it resolves, per currency.
    pub totals: Vec<(Currency, Cents)>,
}

/// `1 finding`, `3 findings`, `1,212 calls`.
pub fn counted(n: usize, one: &str, many: &str) -> String {
    let noun = if n == 1 { one } else { many };
    format!("{} {noun}", crate::domain::group_thousands(n as u64))
}

/// The findings' money at risk per currency, in the order first seen.
pub fn at_risk_by_currency(findings: &[Finding]) -> Vec<(Currency, Cents)> {
    let mut totals: Vec<(Currency, Cents)> = Vec::new();
    for finding in findings {
        let currency = finding.currency.clone();
        match totals.iter_mut().find(|(c, _)| *c == currency) {
            Some((_, total)) => total.0 += finding.at_risk.0,
            None => totals.push((currency, finding.at_risk)),
        }
    }
    totals
}

/// `150.00 USD and 20.00 EUR`.
pub fn money_text(totals: &[(Currency, Cents)]) -> String {
    let parts: Vec<String> = totals
        .iter()
        .map(|(currency, cents)| format!("{} {currency}", cents.format(currency)))
        .collect();
    match parts.as_slice() {
        [] => "nothing".into(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

impl BulkPreview {
    /// `150.00 USD and 20.00 EUR`.
    pub fn total_text(&self) -> String {
        money_text(&self.totals)
    }

    /// The findings' ids, as the confirmation form sends them back.
    pub fn ids(&self) -> String {
        self.findings
            .iter()
            .map(|f| f.id.to_string())
            .collect::<Vec<_>>()
            .join(",")
    }
}

#[cfg(test)]
mod tests {
    use chrono::{Duration, TimeZone};

    use super::*;

    #[test]
    fn counts_read_right_for_one_and_group_their_thousands() {
        assert_eq!(counted(1, "call", "calls"), "1 call");
        assert_eq!(counted(0, "call", "calls"), "0 calls");
        assert_eq!(counted(1_212, "call", "calls"), "1,212 calls");
    }

    fn sync(finished: Option<DateTime<Utc>>, error: Option<&str>) -> SyncSummary {
        SyncSummary {
            started_at: Utc.with_ymd_and_hms(2026, 11, 30, 8, 0, 0).unwrap(),
            finished_at: finished,
            pages: 1,
            charges_seen: 3,
            intents_seen: 0,
            error: error.map(str::to_owned),
        }
    }

    #[test]
    fn a_sync_is_stale_a_day_after_it_finished_and_only_a_finished_one_is() {
        let finished = Utc.with_ymd_and_hms(2026, 11, 30, 8, 5, 0).unwrap();
        let done = sync(Some(finished), None);
        let within = finished + Duration::hours(SYNC_STALE_AFTER_HOURS);
        let after = within + Duration::seconds(1);
        assert_eq!(SyncState::of(None, after), SyncState::Never);
        assert_eq!(
            SyncState::of(Some(done.clone()), within),
            SyncState::Fresh(done.clone())
        );
        assert_eq!(
            SyncState::of(Some(done.clone()), after),
            SyncState::Stale(done)
        );
        let failed = sync(None, Some("Stripe answered 401"));
        assert_eq!(
            SyncState::of(Some(failed.clone()), after),
            SyncState::Failed(failed)
        );
        let running = sync(None, None);
        let state = SyncState::of(Some(running.clone()), after);
        assert_eq!(state, SyncState::Running(running));
        assert!(!state.can_start(), "one sync at a time");
        assert!(SyncState::Never.can_start());
    }
}
