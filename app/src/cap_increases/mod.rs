//! Cap increases: a request to let a key move more money, decided by a
//! second person (the four-eyes rule).

#[cfg(feature = "ssr")]
pub mod rules;
#[cfg(feature = "ssr")]
pub mod sql;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::domain::{
    CapIncreaseId, Cents, Currency, KeySummary, OperatorId, ParseError, VaultKeyId,
};

/// How an approved increase takes effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApplyAs {
    /// The key's own cap rises; the billing job keeps its key.
    RaiseCap,
    /// A new key for the additional amount, linked to the original.
    FollowOnKey,
}

impl ApplyAs {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RaiseCap => "raise_cap",
            Self::FollowOnKey => "follow_on_key",
        }
    }

    pub fn parse(raw: &str) -> Result<Self, ParseError> {
        match raw.trim() {
            "" | "raise_cap" => Ok(Self::RaiseCap),
            "follow_on_key" => Ok(Self::FollowOnKey),
            other => Err(ParseError::new(format!(
                "{other:?} is not a way to apply an increase: use raise_cap or follow_on_key"
            ))),
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Self::RaiseCap => "Raise this key's cap",
            Self::FollowOnKey => "Issue a follow-on key",
        }
    }
}

/// Where a request's state stands; derived from its decision, its expiry
/// and its key, never stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RequestState {
    Pending,
    Approved,
    Rejected,
    Expired,
}

impl RequestState {
    pub fn parse(raw: &str) -> Option<Self> {
        [Self::Pending, Self::Approved, Self::Rejected, Self::Expired]
            .into_iter()
            .find(|state| state.as_str() == raw)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Approved => "approved",
            Self::Rejected => "rejected",
            Self::Expired => "expired",
        }
    }
}

/// One cap increase request as people see it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(sqlx::FromRow))]
pub struct CapIncrease {
    pub id: CapIncreaseId,
    pub vault_key_id: VaultKeyId,
    pub key_label: String,
    pub currency: Currency,
    /// The key's figures now (not when asked): cap, spent + reserved.
    pub key_cap_cents: Cents,
    pub key_committed_cents: Cents,
    /// What the key could move when asked, and what it should move.
    pub from_cap_cents: Cents,
    pub to_cap_cents: Cents,
    pub apply_as: ApplyAs,
    pub reason: String,
    pub origin: String,
    pub requested_at: DateTime<Utc>,
    /// How long ago it was asked for, when read.
    pub age_minutes: i64,
    /// The requester's email, or `API token <name>`.
    pub requested_by: String,
    /// The operator who asked, or who made the API token that asked: the
    /// one person who may not decide it.
    pub requested_by_id: Option<OperatorId>,
    pub expires_at: DateTime<Utc>,
    pub state: RequestState,
    pub decided_at: Option<DateTime<Utc>>,
    pub decided_by: Option<String>,
    pub decision_note: Option<String>,
    pub follow_on_key_id: Option<i64>,
}

impl CapIncrease {
    pub fn additional(&self) -> Cents {
        Cents(self.to_cap_cents.0 - self.from_cap_cents.0)
    }

    /// `5,500.00 → 6,050.00 USD (+550.00)`.
    pub fn change(&self) -> String {
        let currency = &self.currency;
        format!(
            "{} → {} {currency} (+{})",
            self.from_cap_cents.format(currency),
            self.to_cap_cents.format(currency),
            self.additional().format(currency)
        )
    }

    /// `45 min`, `3 h 5 min`, `2 d 4 h`.
    pub fn age(&self) -> String {
        let minutes = self.age_minutes.max(0);
        match minutes {
            0..=59 => format!("{minutes} min"),
            60..=1439 => format!("{} h {} min", minutes / 60, minutes % 60),
            _ => format!("{} d {} h", minutes / 1440, minutes % 1440 / 60),
        }
    }

    /// The key's utilization now, in whole percent.
    pub fn utilization_pct(&self) -> i64 {
        self.key_committed_cents.percent_of(self.key_cap_cents)
    }

    pub fn origin_label(&self) -> &'static str {
        match self.origin.split(':').next().unwrap_or_default() {
            "alert" => "from an alert",
            "call" => "from a refused call",
            "api" => "through the API",
            _ => "from the key page",
        }
    }

    /// The request in a sentence, as the approvers' webhook says it.
    pub fn describe_request(&self) -> String {
        format!(
            "{} asks to raise the cap of {}: {}. Reason: {}",
            self.requested_by,
            self.key_label,
            self.change(),
            self.reason
        )
    }

    /// The decision in a sentence (the request if it is still undecided).
    pub fn describe_decision(&self) -> String {
        match self.state {
            RequestState::Pending => self.describe_request(),
            RequestState::Expired => format!(
                "The cap increase for {} ({}) expired undecided",
                self.key_label,
                self.change()
            ),
            decided => format!(
                "{} {} the cap increase for {} ({}) asked by {}{}",
                self.decided_by.as_deref().unwrap_or("an approver"),
                decided.as_str(),
                self.key_label,
                self.change(),
                self.requested_by,
                self.decision_note
                    .as_deref()
                    .map(|note| format!(". Note: {note}"))
                    .unwrap_or_default()
            ),
        }
    }
}

/// What approving a cap increase changes, shown to the approver before
/// they confirm: figures read when the page was drawn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalPreview {
    pub request: CapIncrease,
    pub expected_total: Cents,
    /// The most the key's cap may be raised to.
    pub ceiling: Cents,
    /// What the key can move now: its cap plus its live follow-on keys'.
    pub granted: Cents,
    /// The note typed on the Approvals page, carried to the decision.
    pub note: String,
}

impl ApprovalPreview {
    pub fn cap_now(&self) -> Cents {
        self.request.key_cap_cents
    }

    /// The key's cap once approved: raised by the increase, or unchanged
    /// when the increase becomes a follow-on key.
    pub fn cap_after(&self) -> Cents {
        match self.request.apply_as {
            ApplyAs::RaiseCap => Cents(self.cap_now().0 + self.request.additional().0),
            ApplyAs::FollowOnKey => self.cap_now(),
        }
    }

    pub fn committed(&self) -> Cents {
        self.request.key_committed_cents
    }

    pub fn utilization_after_pct(&self) -> i64 {
        self.committed().percent_of(self.cap_after())
    }

    /// What billing jobs may still charge through this key now.
    pub fn headroom_now(&self) -> Cents {
        Cents((self.cap_now().0 - self.committed().0).max(0))
    }

    /// What they may charge once approved, through this key and a
    /// follow-on key together: the money the approval puts at risk.
    pub fn headroom_after(&self) -> Cents {
        Cents(self.headroom_now().0 + self.request.additional().0)
    }

    /// Whether the key can move more or less than when this was asked (its
    /// cap or a follow-on key changed since): the decision refuses to
    /// approve it then, so the page offers no approval.
    pub fn cap_moved(&self) -> bool {
        self.granted != self.request.from_cap_cents
    }
}

/// The cap a request suggests, and how it was worked out: what the key has
/// committed, plus the billing still expected to come, with the key's
/// buffer on top. When that is still within the current cap there is
/// nothing to suggest: the person enters the billing still to come.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapSuggestion {
    pub spent: Cents,
    pub reserved: Cents,
    /// The billing still to come: what was entered, or the expected total
    /// not yet spent, and never less than a refused charge being retried.
    pub remaining: Cents,
    pub buffer_bps: u32,
    /// What the key can move now (its cap and its follow-on keys').
    pub granted: Cents,
    /// `spent + reserved + remaining × (1 + buffer)`, rounded up to a whole
    /// unit of the currency.
    pub by_formula: Cents,
}

impl CapSuggestion {
    pub fn new(
        key: &KeySummary,
        granted: Cents,
        buffer_bps: u32,
        remaining: Cents,
    ) -> Result<Self, ParseError> {
        let buffered = remaining.with_buffer(buffer_bps)?;
        let unit = 10i64.pow(key.currency.exponent());
        let round_up = |cents: i64| (cents + unit - 1) / unit * unit;
        let too_large = || ParseError::new("the suggestion is too large");
        let by_formula = round_up(
            key.committed()
                .0
                .checked_add(buffered.0)
                .ok_or_else(too_large)?,
        );
        Ok(Self {
            spent: key.spent,
            reserved: key.reserved,
            remaining,
            buffer_bps,
            granted,
            by_formula: Cents(by_formula),
        })
    }

    /// The cap to prefill: the formula's, when it is above the current cap.
    pub fn suggested_cap(&self) -> Option<Cents> {
        (self.by_formula > self.granted).then_some(self.by_formula)
    }

    /// The derivation, in words a person can check.
    pub fn derivation(&self, currency: &Currency) -> String {
        let bps = self.buffer_bps;
        let factor = format!("{}.{:04}", 1 + bps / 10_000, bps % 10_000);
        let factor = factor.trim_end_matches('0').trim_end_matches('.');
        let formula = format!(
            "spent {} + reserved {} + remaining billing {} × {factor} = {}",
            self.spent.format(currency),
            self.reserved.format(currency),
            self.remaining.format(currency),
            self.by_formula.format(currency),
        );
        if self.suggested_cap().is_some() {
            format!("{formula} {currency}, rounded up")
        } else {
            format!(
                "{formula} {currency}: the current cap {} already covers it. If the run is bigger than expected, enter the billing still to come.",
                self.granted.format(currency),
            )
        }
    }
}

/// Charges the cap refused on a key that no later call with the same
/// Idempotency-Key got through: billing still to come.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedCharges {
    pub charges: i64,
    pub total: Cents,
}

/// What the request form shows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CapIncreaseForm {
    pub key: KeySummary,
    /// The key's cap plus its live follow-on keys' caps.
    pub granted: Cents,
    /// The most a request may ask for (a multiple of the expected total).
    pub ceiling: Cents,
    pub suggestion: CapSuggestion,
    /// Where the form was opened from: `key_page`, `alert:ID` or `call:ID`.
    pub origin: String,
    /// A refused charge the request is about (from an alert or a call).
    pub refused_charge: Option<Cents>,
    /// The charges the cap refused that have not got through since
    /// (opened from the key's page).
    pub refused_waiting: RefusedCharges,
    /// A request already waiting for this key: a second one is refused.
    pub pending: Option<CapIncrease>,
    /// The form as typed when it was refused last.
    pub draft: Option<CapIncreaseDraft>,
    /// When a request made now expires undecided.
    pub decide_by: DateTime<Utc>,
}

/// The request form's fields as typed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapIncreaseDraft {
    #[serde(default)]
    pub new_cap: String,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub apply_as: String,
    #[serde(default)]
    pub origin: String,
}

/// What the Approvals page shows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalsView {
    /// New keys beyond policy waiting for a decision (on the pending tab).
    pub key_requests: Vec<crate::domain::KeyRequest>,
    pub requests: Vec<CapIncrease>,
    pub pending: i64,
    /// Decided and expired.
    pub history: i64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::KeyStatus;

    fn key(spent: i64, reserved: i64, cap: i64) -> KeySummary {
        KeySummary {
            id: VaultKeyId(1),
            label: "run".into(),
            secret_prefix: "vk_x".into(),
            billing_period: "2026-07".parse().unwrap(),
            currency: Currency::usd(),
            expected_total: Cents(500_000),
            cap: Cents(cap),
            spent: Cents(spent),
            reserved: Cents(reserved),
            status: KeyStatus::Active,
            expires_at: Utc::now(),
            thresholds_pct: vec![90],
        }
    }

    #[test]
    fn the_suggestion_adds_the_buffered_remaining_billing_to_what_is_committed() {
        let key = key(550_000, 0, 550_000);
        let s = CapSuggestion::new(&key, key.cap, 1000, Cents(50_000)).unwrap();
        assert_eq!(s.suggested_cap(), Some(Cents(605_000)));
        assert_eq!(
            s.derivation(&Currency::usd()),
            "spent 5,500.00 + reserved 0.00 + remaining billing 500.00 × 1.1 = 6,050.00 USD, rounded up"
        );
        let s = CapSuggestion::new(&key, key.cap, 0, Cents(20_001)).unwrap();
        assert_eq!(
            s.suggested_cap(),
            Some(Cents(570_100)),
            "570,001 rounded up"
        );
    }

    #[test]
    fn within_the_current_cap_there_is_nothing_to_suggest() {
        let key = key(100_000, 1, 110_000);
        let s = CapSuggestion::new(&key, key.cap, 1000, Cents(1_000)).unwrap();
        assert_eq!(s.suggested_cap(), None);
        assert_eq!(
            s.derivation(&Currency::usd()),
            "spent 1,000.00 + reserved 0.01 + remaining billing 10.00 × 1.1 = 1,012.00 USD: the current cap 1,100.00 \
             already covers it. If the run is bigger than expected, enter the billing still to come."
        );
    }

    #[test]
    fn apply_as_defaults_to_raising_the_cap_and_refuses_other_words() {
        assert_eq!(ApplyAs::parse(""), Ok(ApplyAs::RaiseCap));
        assert_eq!(ApplyAs::parse("follow_on_key"), Ok(ApplyAs::FollowOnKey));
        assert!(ApplyAs::parse("both").is_err());
    }
}
