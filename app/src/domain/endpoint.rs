use std::fmt;

use serde::{Deserialize, Serialize};

use super::ParseError;

/// A Stripe endpoint a vault key may call: method and path, where `{id}`
/// stands for one path segment (`POST /v1/payment_intents/{id}/confirm`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct EndpointPattern {
    method: String,
    path: String,
}

/// The endpoints Vaultcap knows how to meter. Anything else is refused when
/// a key is created, so a typo cannot silently allow nothing (or too much).
pub const KNOWN_ENDPOINTS: [&str; 12] = [
    "POST /v1/charges",
    "GET /v1/charges/{id}",
    "POST /v1/payment_intents",
    "GET /v1/payment_intents/{id}",
    "POST /v1/payment_intents/{id}",
    "POST /v1/payment_intents/{id}/confirm",
    "POST /v1/payment_intents/{id}/capture",
    "POST /v1/payment_intents/{id}/cancel",
    "POST /v1/refunds",
    "POST /v1/customers",
    "GET /v1/customers/{id}",
    "POST /v1/customers/{id}/sources",
];

impl EndpointPattern {
    /// Accepts `POST /v1/charges`, or a bare path as the seed articles'
    /// billing jobs send it (`/v1/charges`, meaning POST).
    pub fn parse(raw: &str) -> Result<Self, ParseError> {
        let raw = raw.trim();
        let (method, path) = match raw.split_once(' ') {
            Some((method, path)) => (method.trim().to_ascii_uppercase(), path.trim()),
            None => ("POST".to_owned(), raw),
        };
        let path = path.trim_end_matches('/').to_owned();
        let candidate = format!("{method} {path}");
        if KNOWN_ENDPOINTS.contains(&candidate.as_str()) {
            Ok(Self { method, path })
        } else {
            Err(ParseError::new(format!(
                "{raw:?} is not an endpoint Vaultcap meters; use one of: {}",
                KNOWN_ENDPOINTS.join(", ")
            )))
        }
    }

    /// Whether a request's method and path fall under this pattern.
    pub fn matches(&self, method: &str, path: &str) -> bool {
        if !self.method.eq_ignore_ascii_case(method) {
            return false;
        }
        let mut pattern = self.path.split('/');
        let mut actual = path.trim_end_matches('/').split('/');
        loop {
            match (pattern.next(), actual.next()) {
                (None, None) => return true,
                (Some("{id}"), Some(segment)) if !segment.is_empty() => {}
                (Some(expected), Some(segment)) if expected == segment => {}
                _ => return false,
            }
        }
    }
}

/// Whether a call moves money and so must carry an amount that is metered
/// against the cap: creating a charge or a payment intent.
pub fn moves_money(method: &str, path: &str) -> bool {
    method.eq_ignore_ascii_case("POST")
        && matches!(
            path.trim_end_matches('/'),
            "/v1/charges" | "/v1/payment_intents"
        )
}

impl fmt::Display for EndpointPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.method, self.path)
    }
}

impl TryFrom<String> for EndpointPattern {
    type Error = ParseError;

    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::parse(&value)
    }
}

impl From<EndpointPattern> for String {
    fn from(pattern: EndpointPattern) -> Self {
        pattern.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_path_means_post_and_patterns_are_normalised() {
        assert_eq!(
            EndpointPattern::parse("/v1/charges").unwrap().to_string(),
            "POST /v1/charges"
        );
        assert_eq!(
            EndpointPattern::parse("post /v1/payment_intents/{id}/confirm/")
                .unwrap()
                .to_string(),
            "POST /v1/payment_intents/{id}/confirm"
        );
    }

    #[test]
    fn unknown_endpoints_are_refused() {
        for raw in [
            "/v1/transfers",
            "DELETE /v1/customers/{id}",
            "",
            "POST",
            "/v1/charges/../refunds",
        ] {
            assert!(EndpointPattern::parse(raw).is_err(), "{raw:?} was accepted");
        }
    }

    #[test]
    fn id_placeholders_match_exactly_one_segment() {
        let confirm = EndpointPattern::parse("POST /v1/payment_intents/{id}/confirm").unwrap();
        assert!(confirm.matches("POST", "/v1/payment_intents/pi_123/confirm"));
        assert!(!confirm.matches("POST", "/v1/payment_intents//confirm"));
        assert!(!confirm.matches("POST", "/v1/payment_intents/pi_1/extra/confirm"));
        assert!(!confirm.matches("GET", "/v1/payment_intents/pi_123/confirm"));
        let charges = EndpointPattern::parse("/v1/charges").unwrap();
        assert!(charges.matches("post", "/v1/charges"));
        assert!(!charges.matches("POST", "/v1/charges/ch_1"));
        assert!(!charges.matches("POST", "/v1/refunds"));
    }

    #[test]
    fn only_creating_charges_and_payment_intents_moves_money() {
        assert!(moves_money("POST", "/v1/charges"));
        assert!(moves_money("POST", "/v1/payment_intents"));
        assert!(!moves_money("POST", "/v1/payment_intents/pi_1/confirm"));
        assert!(!moves_money("GET", "/v1/charges"));
    }
}
