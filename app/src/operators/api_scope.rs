use std::{fmt, str::FromStr};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::domain::{Cents, ParseError};

/// What an API token may do. A token holds only the scopes it was given:
/// a billing job that creates its period's key needs `keys:create` and
/// nothing else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ApiScope {
    #[serde(rename = "keys:create")]
    KeysCreate,
    #[serde(rename = "keys:read")]
    KeysRead,
    #[serde(rename = "keys:revoke")]
    KeysRevoke,
    #[serde(rename = "alerts:read")]
    AlertsRead,
    #[serde(rename = "alerts:ack")]
    AlertsAck,
    #[serde(rename = "audit:export")]
    AuditExport,
    #[serde(rename = "cap_requests:create")]
    CapRequestsCreate,
}

impl ApiScope {
    pub const ALL: [ApiScope; 7] = [
        ApiScope::KeysCreate,
        ApiScope::KeysRead,
        ApiScope::KeysRevoke,
        ApiScope::AlertsRead,
        ApiScope::AlertsAck,
        ApiScope::AuditExport,
        ApiScope::CapRequestsCreate,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ApiScope::KeysCreate => "keys:create",
            ApiScope::KeysRead => "keys:read",
            ApiScope::KeysRevoke => "keys:revoke",
            ApiScope::AlertsRead => "alerts:read",
            ApiScope::AlertsAck => "alerts:ack",
            ApiScope::AuditExport => "audit:export",
            ApiScope::CapRequestsCreate => "cap_requests:create",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            ApiScope::KeysCreate => "create vault keys within the key policy",
            ApiScope::KeysRead => "read vault keys and their cap increase requests",
            ApiScope::KeysRevoke => "revoke vault keys",
            ApiScope::AlertsRead => "read alerts",
            ApiScope::AlertsAck => "acknowledge alerts",
            ApiScope::AuditExport => "export the audit log as CSV",
            ApiScope::CapRequestsCreate => "ask for cap increases (an approver decides)",
        }
    }

    /// `keys:create,keys:read`: the form [`ApiScope::parse_list`] reads.
    pub fn join(scopes: &[ApiScope]) -> String {
        scopes
            .iter()
            .map(|scope| scope.as_str())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Scopes from a comma-separated list (`keys:create,keys:read`),
    /// sorted and without repeats; at least one.
    pub fn parse_list(text: &str) -> Result<Vec<ApiScope>, ParseError> {
        let mut scopes = text
            .split(',')
            .map(str::trim)
            .filter(|part| !part.is_empty())
            .map(str::parse)
            .collect::<Result<Vec<ApiScope>, _>>()?;
        scopes.sort();
        scopes.dedup();
        if scopes.is_empty() {
            return Err(ParseError::new(format!(
                "name at least one scope: {}",
                ApiScope::ALL.map(ApiScope::as_str).join(", ")
            )));
        }
        Ok(scopes)
    }
}

impl fmt::Display for ApiScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ApiScope {
    type Err = ParseError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        ApiScope::ALL
            .into_iter()
            .find(|scope| scope.as_str() == text)
            .ok_or_else(|| {
                ParseError::new(format!(
                    "`{text}` is not a scope; the scopes are {}",
                    ApiScope::ALL.map(ApiScope::as_str).join(", ")
                ))
            })
    }
}

/// How long a new API token lives unless told otherwise.
pub const DEFAULT_TOKEN_DAYS: i64 = 90;
/// The longest a token may live: a forgotten token should die on its own.
pub const MAX_TOKEN_DAYS: i64 = 366;

/// The lifetime of a new token in days, from what a person typed (empty
/// means the default).
pub fn parse_token_days(text: &str) -> Result<i64, ParseError> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(DEFAULT_TOKEN_DAYS);
    }
    match text.parse::<i64>() {
        Ok(days) if (1..=MAX_TOKEN_DAYS).contains(&days) => Ok(days),
        _ => Err(ParseError::new(format!(
            "a token lives between 1 and {MAX_TOKEN_DAYS} days, not `{text}`"
        ))),
    }
}

/// The largest cap a token may have issued without an approver, in minor
/// units, from what a person typed (empty: no ceiling beyond the policy).
pub fn parse_token_ceiling(text: &str) -> Result<Option<Cents>, ParseError> {
    let text = text.trim().replace([',', '_'], "");
    if text.is_empty() {
        return Ok(None);
    }
    match text.parse::<i64>() {
        Ok(cents) if cents > 0 => Ok(Some(Cents(cents))),
        _ => Err(ParseError::new(format!(
            "the largest cap is a positive whole number of minor units (cents), not `{text}`"
        ))),
    }
}

/// An API token as the console lists it (never its secret: only the prefix).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApiTokenSummary {
    pub id: crate::domain::ApiTokenId,
    pub name: String,
    pub prefix: String,
    pub scopes: Vec<ApiScope>,
    pub created_at: DateTime<Utc>,
    /// Who made it: an operator's email, or "command line".
    pub created_by: String,
    pub expires_at: DateTime<Utc>,
    pub last_used_at: Option<DateTime<Utc>>,
    /// The largest cap it may have issued without an approver, in minor
    /// units of the key's currency.
    pub max_cap_cents: Option<Cents>,
    pub status: TokenStatus,
}

/// Whether a token works, as of when it was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TokenStatus {
    Active,
    Expired,
    Revoked,
}

impl TokenStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            TokenStatus::Active => "active",
            TokenStatus::Expired => "expired",
            TokenStatus::Revoked => "revoked",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scope_reads_back_from_its_name() {
        for scope in ApiScope::ALL {
            assert_eq!(scope.as_str().parse::<ApiScope>(), Ok(scope));
        }
    }

    #[test]
    fn a_scope_list_is_sorted_without_repeats_and_never_empty() {
        assert_eq!(
            ApiScope::parse_list(" keys:read, keys:create,keys:read "),
            Ok(vec![ApiScope::KeysCreate, ApiScope::KeysRead])
        );
        assert!(ApiScope::parse_list(" , ").is_err());
        let err = ApiScope::parse_list("keys:create,keys:*").unwrap_err();
        assert!(err.0.contains("`keys:*` is not a scope"), "{err}");
    }

    #[test]
    fn token_lifetimes_are_bounded() {
        assert_eq!(parse_token_days(""), Ok(DEFAULT_TOKEN_DAYS));
        assert_eq!(parse_token_days(" 30 "), Ok(30));
        assert!(parse_token_days("0").is_err());
        assert!(parse_token_days("367").is_err());
        assert!(parse_token_days("1e3").is_err());
    }
}
