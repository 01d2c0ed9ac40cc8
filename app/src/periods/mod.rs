//! Closing a billing period: where it stands (open, closing, signed off),
//! the report finance signs, and what still stands in the way.

#[cfg(feature = "ssr")]
pub mod pack;
#[cfg(feature = "ssr")]
pub mod rules;
#[cfg(feature = "ssr")]
pub mod sql;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::domain::{
    ActionEntry, BillingPeriod, CapIncreaseId, Cents, Currency, FindingId, FindingKind, KeyStatus,
    VaultKeyId,
};

/// Where a billing period stands with finance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PeriodState {
    /// Nobody has prepared its close (or the close was withdrawn).
    Open,
    /// An operator prepared the close; an approver has yet to sign it.
    Closing,
    SignedOff,
}

impl PeriodState {
    pub fn label(self) -> &'static str {
        match self {
            Self::Open => "Open",
            Self::Closing => "Closing",
            Self::SignedOff => "Signed off",
        }
    }
}

/// A period's live close: who prepared it and, once signed, who signed it
/// and the hash of the report they signed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(sqlx::FromRow))]
pub struct PeriodClose {
    pub id: i64,
    pub billing_period: BillingPeriod,
    pub prepared_at: DateTime<Utc>,
    pub prepared_by: String,
    pub prepared_by_id: crate::domain::OperatorId,
    pub note: Option<String>,
    pub signed_at: Option<DateTime<Utc>>,
    pub signed_by: Option<String>,
    pub report_sha256: Option<String>,
}

impl PeriodClose {
    pub fn state(&self) -> PeriodState {
        if self.signed_at.is_some() {
            PeriodState::SignedOff
        } else {
            PeriodState::Closing
        }
    }
}

/// One currency's money in a period: what the keys expected and could move,
/// what they moved through the proxy, and what Stripe holds (as synced).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(sqlx::FromRow))]
pub struct PeriodMoney {
    pub currency: Currency,
    pub keys: i64,
    pub expected: Cents,
    pub capped: Cents,
    /// Settled through the proxy.
    pub metered: Cents,
    /// Succeeded charges in Stripe for the period.
    pub charged: Cents,
    pub refunded: Cents,
}

impl PeriodMoney {
    pub fn net(&self) -> Cents {
        Cents(self.charged.0 - self.refunded.0)
    }
}

/// A finding as the report lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(sqlx::FromRow))]
pub struct ReportFinding {
    pub id: FindingId,
    pub kind: FindingKind,
    pub customer_id: String,
    pub currency: Currency,
    pub at_risk: Cents,
    pub charge_ids: Vec<String>,
    pub detected_at: DateTime<Utc>,
    pub resolution: Option<String>,
    pub resolved_at: Option<DateTime<Utc>>,
    pub resolved_by: Option<String>,
    pub resolution_note: Option<String>,
}

/// A key of the period as the report lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(sqlx::FromRow))]
pub struct ReportKey {
    pub id: VaultKeyId,
    pub label: String,
    pub secret_prefix: String,
    pub currency: Currency,
    pub expected: Cents,
    pub cap: Cents,
    pub spent: Cents,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
    pub revoke_reason: Option<String>,
}

impl ReportKey {
    pub fn status(&self, at: DateTime<Utc>) -> KeyStatus {
        match self.revoked_at {
            Some(revoked) if revoked <= at => KeyStatus::Revoked,
            _ if self.expires_at <= at => KeyStatus::Expired,
            _ => KeyStatus::Active,
        }
    }
}

/// A cap increase asked for one of the period's keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(sqlx::FromRow))]
pub struct ReportCapIncrease {
    pub id: CapIncreaseId,
    pub vault_key_id: VaultKeyId,
    pub key_label: String,
    pub currency: Currency,
    pub from_cap: Cents,
    pub to_cap: Cents,
    pub reason: String,
    pub requested_at: DateTime<Utc>,
    pub requested_by: String,
    /// approved, rejected, or none yet.
    pub decision: Option<String>,
    pub decided_at: Option<DateTime<Utc>>,
    pub decided_by: Option<String>,
}

/// A billing period's report: the figures finance signs. Frozen at sign-off
/// (stored as these exact JSON bytes with their SHA-256); live before.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeriodReport {
    pub period: BillingPeriod,
    pub as_of: DateTime<Utc>,
    pub money: Vec<PeriodMoney>,
    pub findings: Vec<ReportFinding>,
    pub keys: Vec<ReportKey>,
    pub cap_increases: Vec<ReportCapIncrease>,
    /// Calls audited for the period's keys until `as_of`.
    pub calls: i64,
    /// Calls still reserved: in flight, or of unknown outcome.
    pub undecided_calls: i64,
    /// When the period's last finished sync from Stripe started; Stripe's
    /// events keep the charges current in between.
    #[serde(default)]
    pub synced_at: Option<DateTime<Utc>>,
}

impl PeriodReport {
    /// Whether Stripe was synced for the period after it ended, so that a
    /// refund or charge an event missed at the month's end is counted.
    pub fn synced_after_end(&self) -> bool {
        self.synced_at.is_some_and(|at| at >= self.period.ends_at())
    }

    pub fn open_findings(&self) -> usize {
        self.findings
            .iter()
            .filter(|f| f.resolution.is_none())
            .count()
    }

    /// Why the period cannot be signed off now, one sentence per reason;
    /// empty when it can.
    pub fn blockers(&self) -> Vec<String> {
        let mut blockers = Vec::new();
        match self.open_findings() {
            0 => {}
            1 => blockers.push("1 finding is open: resolve it on the reconciliation page".into()),
            n => blockers.push(format!(
                "{n} findings are open: resolve them on the reconciliation page"
            )),
        }
        match self.undecided_calls {
            0 => {}
            1 => blockers.push(
                "1 call is in flight or of unknown outcome: sync the period so Stripe's answer settles it"
                    .into(),
            ),
            n => blockers.push(format!(
                "{n} calls are in flight or of unknown outcome: sync the period so Stripe's answers settle them"
            )),
        }
        blockers
    }
}

/// The period close page: the report (frozen once signed), the close if
/// there is one, and the period's entries in the action log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeriodCloseView {
    pub report: PeriodReport,
    pub close: Option<PeriodClose>,
    /// The report's hash matches the stored one (always true before sign-off).
    pub report_intact: bool,
    pub ended: bool,
    pub actions: Vec<ActionEntry>,
    /// Once signed: findings of the period open now, found or reopened by
    /// detection after the sign-off (the frozen report cannot show them).
    pub open_after_sign_off: i64,
}

impl PeriodCloseView {
    pub fn state(&self) -> PeriodState {
        self.close
            .as_ref()
            .map_or(PeriodState::Open, PeriodClose::state)
    }
}

/// A period as the overview lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeriodStatus {
    pub period: BillingPeriod,
    pub state: PeriodState,
    pub keys: i64,
    pub open_findings: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(findings: Vec<Option<&str>>, undecided_calls: i64) -> PeriodReport {
        PeriodReport {
            period: "2026-11".parse().unwrap(),
            as_of: Utc::now(),
            money: vec![],
            findings: findings
                .into_iter()
                .enumerate()
                .map(|(i, resolution)| ReportFinding {
                    id: FindingId(i as i64),
                    kind: FindingKind::Duplicate,
                    customer_id: "cust_1".into(),
                    currency: Currency::parse("usd").unwrap(),
                    at_risk: Cents(100),
                    charge_ids: vec![],
                    detected_at: Utc::now(),
                    resolution: resolution.map(str::to_owned),
                    resolved_at: None,
                    resolved_by: None,
                    resolution_note: None,
                })
                .collect(),
            keys: vec![],
            cap_increases: vec![],
            calls: 0,
            undecided_calls,
            synced_at: None,
        }
    }

    #[test]
    fn open_findings_and_undecided_calls_each_block_the_sign_off() {
        assert!(report(vec![Some("dismissed")], 0).blockers().is_empty());
        let blocked = report(vec![None, None, Some("adopted")], 1).blockers();
        assert_eq!(blocked.len(), 2);
        assert!(blocked[0].starts_with("2 findings are open"), "{blocked:?}");
        assert!(blocked[1].starts_with("1 call is in flight"), "{blocked:?}");
    }
}
