//! Finding the vault key a call presents.
//!
//! Charges look keys up through a short-lived cache: under load the lookup
//! would otherwise be one more query per call. This is safe because what the
//! proxy reads from a cached key before reserving never changes after the
//! key is issued (endpoints, currency, period, expiry), except revocation,
//! and the reservation itself re-checks revocation and expiry in the same
//! statement that reserves. Calls that move no money (nothing re-checks them)
//! always read the key from the database.

use std::{sync::Arc, time::Duration};

use moka::future::Cache;
use sqlx::PgPool;

use app::{
    domain::EndpointPattern,
    keys::sql::{self as vault_keys, VaultKeyRow},
};

/// How long a looked-up key is reused for charges.
const TTL: Duration = Duration::from_secs(2);

/// A vault key as the proxy decides on it: its row, with its allowed
/// endpoints read once, when the key is loaded.
#[derive(Debug)]
pub struct ProxyKey {
    pub row: VaultKeyRow,
    pub endpoints: Vec<EndpointPattern>,
    pub secret_hash: Vec<u8>,
}

impl ProxyKey {
    /// An endpoint the key's row holds that is no pattern is an error
    /// naming the key: never dropped, which would quietly narrow (or, for a
    /// later rule, widen) what the key may call.
    pub fn new(row: VaultKeyRow, secret_hash: Vec<u8>) -> Result<Self, sqlx::Error> {
        let endpoints = row
            .allowed_endpoints
            .iter()
            .map(|raw| {
                EndpointPattern::parse(raw).map_err(|err| {
                    sqlx::Error::Protocol(format!(
                        "vault key {} holds the allowed endpoint {raw:?}, which is not a pattern: {err}",
                        row.id
                    ))
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            row,
            endpoints,
            secret_hash,
        })
    }

    pub fn allows(&self, method: &str, path: &str) -> bool {
        self.endpoints
            .iter()
            .any(|pattern| pattern.matches(method, path))
    }
}

#[derive(Clone)]
pub struct KeyLookup {
    by_hash: Cache<Vec<u8>, Arc<ProxyKey>>,
}

impl KeyLookup {
    pub fn new() -> Self {
        Self {
            by_hash: Cache::builder()
                .max_capacity(10_000)
                .time_to_live(TTL)
                .build(),
        }
    }

    /// The key with this secret hash, as of at most [`TTL`] ago. Unknown
    /// keys are not remembered.
    pub async fn for_charge(
        &self,
        pool: &PgPool,
        hash: &[u8],
    ) -> Result<Option<Arc<ProxyKey>>, sqlx::Error> {
        if let Some(key) = self.by_hash.get(hash).await {
            return Ok(Some(key));
        }
        let Some(key) = load(pool, hash).await? else {
            return Ok(None);
        };
        self.by_hash.insert(hash.to_vec(), key.clone()).await;
        Ok(Some(key))
    }

    /// The key as the database has it now (and forgets any cached copy).
    pub async fn current(
        &self,
        pool: &PgPool,
        hash: &[u8],
    ) -> Result<Option<Arc<ProxyKey>>, sqlx::Error> {
        self.by_hash.invalidate(hash).await;
        load(pool, hash).await
    }
}

async fn load(pool: &PgPool, hash: &[u8]) -> Result<Option<Arc<ProxyKey>>, sqlx::Error> {
    let Some(row) = vault_keys::find_by_secret_hash(pool, hash).await? else {
        return Ok(None);
    };
    Ok(Some(Arc::new(ProxyKey::new(row, hash.to_vec())?)))
}

impl Default for KeyLookup {
    fn default() -> Self {
        Self::new()
    }
}

/// A usable USD key allowing every endpoint, as `edit` leaves it, for the
/// steps' unit tests.
#[cfg(test)]
pub fn test_key(edit: impl FnOnce(&mut VaultKeyRow)) -> ProxyKey {
    use app::domain::{Cents, Currency, DuplicatePolicy, KNOWN_ENDPOINTS};
    use chrono::{Duration, Utc};

    let mut row = VaultKeyRow {
        id: app::domain::VaultKeyId(7),
        label: "nightly billing".into(),
        secret_prefix: "vk_test_ab12".into(),
        billing_period: "2026-12".parse().unwrap(),
        currency: Currency::usd(),
        expected_total_cents: Cents(10_000),
        buffer_bps: 1_000,
        cap_cents: Cents(11_000),
        spent_cents: Cents(0),
        reserved_cents: Cents(0),
        allowed_endpoints: KNOWN_ENDPOINTS.iter().map(|e| e.to_string()).collect(),
        expires_at: Utc::now() + Duration::days(30),
        revoked_at: None,
        revoke_reason: None,
        alert_thresholds_pct: vec![90],
        created_at: Utc::now(),
        parent_key_id: None,
        duplicate_policy: DuplicatePolicy::Flag,
        stripe_account: None,
    };
    edit(&mut row);
    ProxyKey::new(row, vec![1; 32]).expect("a valid key")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_read_once_and_a_bad_one_names_its_key() {
        let key = test_key(|row| row.allowed_endpoints = vec!["POST /v1/charges".into()]);
        assert!(key.allows("POST", "/v1/charges"));
        assert!(!key.allows("POST", "/v1/refunds"));

        let mut row = test_key(|_| {}).row;
        row.allowed_endpoints = vec!["POST /v1/charges".into(), "DELETE /v1/everything".into()];
        let err = ProxyKey::new(row, vec![]).unwrap_err().to_string();
        assert!(err.contains("vault key 7"), "{err}");
        assert!(err.contains("DELETE /v1/everything"), "{err}");
    }
}
