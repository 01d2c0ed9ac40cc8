use std::fmt;

use serde::{Deserialize, Serialize};

use crate::domain::ParseError;

/// An operator's sign-in name: trimmed, lower-cased, one `@` with text on
/// both sides and a dot in the domain (or `localhost`). Deliverability is not
/// our business; typos that would lock someone out are.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Email(String);

impl Email {
    pub const MAX_LEN: usize = 254;

    pub fn parse(raw: &str) -> Result<Self, ParseError> {
        let email = raw.trim().to_lowercase();
        if email.is_empty() {
            return Err(ParseError::new("enter an email address"));
        }
        if email.len() > Self::MAX_LEN {
            return Err(ParseError::new(
                "an email address has at most 254 characters",
            ));
        }
        let valid = match email.split_once('@') {
            Some((local, domain)) => {
                !local.is_empty()
                    && !domain.contains('@')
                    && (domain.contains('.') || domain == "localhost")
                    && !domain.starts_with('.')
                    && !domain.ends_with('.')
                    && !email.chars().any(|c| c.is_whitespace() || c.is_control())
            }
            None => false,
        };
        if valid {
            Ok(Self(email))
        } else {
            Err(ParseError::new(format!(
                "{:?} is not an email address",
                raw.trim()
            )))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Email {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_email_is_trimmed_and_lower_cased() {
        assert_eq!(
            Email::parse("  Ana@Example.COM ").unwrap().as_str(),
            "ana@example.com"
        );
        assert_eq!(
            Email::parse("admin@localhost").unwrap().as_str(),
            "admin@localhost"
        );
    }

    #[test]
    fn malformed_emails_are_refused() {
        for raw in [
            "",
            "ana",
            "ana@",
            "@example.com",
            "a@b@c.com",
            "ana@example",
            "a b@c.com",
            "ana@.com",
        ] {
            assert!(Email::parse(raw).is_err(), "{raw:?} was accepted");
        }
        assert!(Email::parse(&format!("{}@example.com", "a".repeat(250))).is_err());
    }
}
