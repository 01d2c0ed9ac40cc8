use serde::{Deserialize, Serialize};

/// What the proxy decided about a call, as the audit log records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Forwarded to Stripe (its answer is in the upstream status).
    Allowed,
    /// A retry with an Idempotency-Key already used under this key:
    /// forwarded without reserving again.
    Replay,
    /// Forwarded, but Stripe's answer never arrived (timeout, reset, 5xx):
    /// the amount stays reserved until reconciliation settles it.
    OutcomeUnknown,
    RefusedUnknownKey,
    RefusedRevoked,
    RefusedExpired,
    RefusedEndpoint,
    RefusedCurrency,
    RefusedAmount,
    RefusedInvalidRequest,
    RefusedCap,
    RefusedDuplicate,
    /// The database could not be reached: the proxy fails closed.
    RefusedUnavailable,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Allowed => "allowed",
            Decision::Replay => "replay",
            Decision::OutcomeUnknown => "outcome_unknown",
            Decision::RefusedUnknownKey => "refused_unknown_key",
            Decision::RefusedRevoked => "refused_revoked",
            Decision::RefusedExpired => "refused_expired",
            Decision::RefusedEndpoint => "refused_endpoint",
            Decision::RefusedCurrency => "refused_currency",
            Decision::RefusedAmount => "refused_amount",
            Decision::RefusedInvalidRequest => "refused_invalid_request",
            Decision::RefusedCap => "refused_cap",
            Decision::RefusedDuplicate => "refused_duplicate",
            Decision::RefusedUnavailable => "refused_unavailable",
        }
    }
}
