use serde::{Deserialize, Serialize};

use super::ParseError;

/// What the proxy does with a charge for a customer and billing period that
/// already has one through the proxy under another Idempotency-Key (a
/// redelivered message with a rotated key).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DuplicatePolicy {
    /// Forwarded like any other charge.
    Off,
    /// Forwarded; a duplicate finding opens as soon as Stripe confirms it.
    #[default]
    Flag,
    /// Refused (409) before it reaches Stripe, naming the earlier charge.
    Block,
}

impl DuplicatePolicy {
    pub const ALL: [DuplicatePolicy; 3] = [Self::Flag, Self::Block, Self::Off];

    pub fn parse(raw: &str) -> Result<Self, ParseError> {
        Self::ALL
            .into_iter()
            .find(|policy| policy.as_str() == raw.trim())
            .ok_or_else(|| {
                ParseError::new(format!(
                    "{raw:?} is not a duplicate guard: use flag, block or off"
                ))
            })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Flag => "flag",
            Self::Block => "block",
        }
    }

    /// What the proxy does, in a phrase.
    pub fn explain(self) -> &'static str {
        match self {
            Self::Flag => "a second charge for a customer and period under another idempotency key is forwarded and opens a duplicate finding",
            Self::Block => "a second charge for a customer and period under another idempotency key is refused before it reaches Stripe",
            Self::Off => "second charges are forwarded like any other",
        }
    }

    /// What it does, as a form's option says it.
    pub fn label(self) -> &'static str {
        match self {
            Self::Flag => "Flag: forward it and open a duplicate finding",
            Self::Block => "Block: refuse it before it reaches Stripe",
            Self::Off => "Off: forward it like any charge",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_round_trips_through_its_name_and_flag_is_the_default() {
        for policy in DuplicatePolicy::ALL {
            assert_eq!(DuplicatePolicy::parse(policy.as_str()), Ok(policy));
        }
        assert_eq!(DuplicatePolicy::default(), DuplicatePolicy::Flag);
        assert!(DuplicatePolicy::parse("warn")
            .unwrap_err()
            .0
            .contains("flag, block or off"));
    }
}
