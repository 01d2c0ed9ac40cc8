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

use app::ssr::data::vault_keys::{self, VaultKeyRow};

/// How long a looked-up key is reused for charges.
const TTL: Duration = Duration::from_secs(2);

#[derive(Clone)]
pub struct KeyLookup {
    by_hash: Cache<Vec<u8>, Arc<VaultKeyRow>>,
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
    ) -> Result<Option<Arc<VaultKeyRow>>, sqlx::Error> {
        if let Some(key) = self.by_hash.get(hash).await {
            return Ok(Some(key));
        }
        let Some(key) = vault_keys::find_by_secret_hash(pool, hash).await? else {
            return Ok(None);
        };
        let key = Arc::new(key);
        self.by_hash.insert(hash.to_vec(), key.clone()).await;
        Ok(Some(key))
    }

    /// The key as the database has it now (and forgets any cached copy).
    pub async fn current(
        &self,
        pool: &PgPool,
        hash: &[u8],
    ) -> Result<Option<Arc<VaultKeyRow>>, sqlx::Error> {
        self.by_hash.invalidate(hash).await;
        Ok(vault_keys::find_by_secret_hash(pool, hash)
            .await?
            .map(Arc::new))
    }
}

impl Default for KeyLookup {
    fn default() -> Self {
        Self::new()
    }
}
