//! Row ids, one type per table: a finding's id cannot be passed where a
//! vault key's is wanted. Each holds the `bigint` PostgreSQL gave the row,
//! reads and writes as that number (JSON, paths, forms, columns, page
//! attributes) and prints as it.

use std::{fmt, num::ParseIntError, str::FromStr};

use serde::{Deserialize, Serialize};

macro_rules! ids {
    ($($(#[$doc:meta])* $name:ident;)*) => {$(
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        #[cfg_attr(feature = "ssr", derive(sqlx::Type), sqlx(transparent))]
        pub struct $name(pub i64);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        /// In a page, as the number (`data-key=key.id`).
        impl leptos::prelude::IntoAttributeValue for $name {
            type Output = i64;

            fn into_attribute_value(self) -> i64 {
                self.0
            }
        }

        impl FromStr for $name {
            type Err = ParseIntError;

            fn from_str(raw: &str) -> Result<Self, Self::Err> {
                raw.parse().map(Self)
            }
        }
    )*};
}

ids! {
    /// A vault key (`vault_keys.id`).
    VaultKeyId;
    /// A reconciliation finding (`reconciliation_findings.id`).
    FindingId;
    /// An alert (`alerts.id`).
    AlertId;
    /// A cap increase request (`cap_increase_requests.id`).
    CapIncreaseId;
    /// A key beyond policy waiting for an approver (`key_requests.id`).
    KeyRequestId;
    /// An operator (`operators.id`).
    OperatorId;
    /// An API token (`api_tokens.id`).
    ApiTokenId;
    /// An audited call (`audit_log.id`).
    AuditId;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_reads_and_writes_as_its_number() {
        let id: VaultKeyId = serde_json::from_str("42").unwrap();
        assert_eq!(id, VaultKeyId(42));
        assert_eq!(serde_json::to_string(&id).unwrap(), "42");
        assert_eq!("42".parse::<VaultKeyId>().unwrap(), id);
        assert_eq!(id.to_string(), "42");
        assert!("4x".parse::<VaultKeyId>().is_err());
    }
}
