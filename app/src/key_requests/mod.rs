//! Keys beyond policy: a key asked for with a cap or a ceiling the policy
//! does not allow is held as a request until a second person approves it.
//! The request as the Approvals page shows it is here; `rules` decides it
//! and `sql` stores it, on the server.

#[cfg(feature = "ssr")]
pub mod rules;
#[cfg(feature = "ssr")]
pub mod sql;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::domain::{
    BillingPeriod, Cents, Currency, KeyRequestId, OperatorId, RequestState, VaultKeyId,
};

/// A vault key asked for beyond policy, waiting for (or past) a second
/// person's decision. Its secret was shown to the requester when asked and
/// opens nothing until the key is issued on approval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(sqlx::FromRow))]
pub struct KeyRequest {
    pub id: KeyRequestId,
    pub label: String,
    pub billing_period: BillingPeriod,
    pub currency: Currency,
    pub expected_total_cents: Cents,
    pub cap_cents: Cents,
    /// The most policy would have issued without an approver.
    pub policy_cap_cents: Cents,
    /// Why it is beyond policy, in a sentence.
    pub over_policy: String,
    pub secret_prefix: String,
    pub requested_at: DateTime<Utc>,
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
    /// The key issued on approval.
    pub vault_key_id: Option<VaultKeyId>,
}

/// What approving a key request does, shown before the approver confirms.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRequestPreview {
    pub request: KeyRequest,
    /// The caps of the period's live keys in the request's currency, before
    /// this one: what billing jobs may charge in it altogether.
    pub live_caps: Cents,
    /// The approver's note, carried from the Approvals page.
    pub note: String,
}

impl KeyRequestPreview {
    /// How far the cap goes beyond what policy issues without an approver.
    pub fn above_policy(&self) -> Cents {
        Cents((self.request.cap_cents.0 - self.request.policy_cap_cents.0).max(0))
    }

    pub fn live_caps_after(&self) -> Cents {
        Cents(self.live_caps.0 + self.request.cap_cents.0)
    }
}
