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

    /// Every decision, in the order pages list them.
    pub const ALL: [Decision; 13] = [
        Decision::Allowed,
        Decision::Replay,
        Decision::OutcomeUnknown,
        Decision::RefusedCap,
        Decision::RefusedDuplicate,
        Decision::RefusedEndpoint,
        Decision::RefusedCurrency,
        Decision::RefusedAmount,
        Decision::RefusedInvalidRequest,
        Decision::RefusedRevoked,
        Decision::RefusedExpired,
        Decision::RefusedUnknownKey,
        Decision::RefusedUnavailable,
    ];

    pub fn parse(raw: &str) -> Option<Decision> {
        Self::ALL.into_iter().find(|d| d.as_str() == raw)
    }

    pub fn is_refusal(self) -> bool {
        !matches!(
            self,
            Decision::Allowed | Decision::Replay | Decision::OutcomeUnknown
        )
    }

    /// What an operator reads in a table.
    pub fn label(self) -> &'static str {
        match self {
            Decision::Allowed => "Allowed",
            Decision::Replay => "Replay (same idempotency key)",
            Decision::OutcomeUnknown => "Outcome unknown",
            Decision::RefusedUnknownKey => "Refused: unknown key",
            Decision::RefusedRevoked => "Refused: key revoked",
            Decision::RefusedExpired => "Refused: key expired",
            Decision::RefusedEndpoint => "Refused: endpoint not allowed",
            Decision::RefusedCurrency => "Refused: wrong currency",
            Decision::RefusedAmount => "Refused: amount missing or invalid",
            Decision::RefusedInvalidRequest => "Refused: invalid request",
            Decision::RefusedCap => "Refused: over the cap",
            Decision::RefusedDuplicate => "Refused: duplicate charge",
            Decision::RefusedUnavailable => "Refused: unavailable or overloaded",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_decision_round_trips_through_its_name() {
        for decision in Decision::ALL {
            assert_eq!(Decision::parse(decision.as_str()), Some(decision));
        }
        assert_eq!(Decision::parse("allowed'--"), None);
    }
}
