//! Issuing and revoking vault keys: the rules shared by the key API and the
//! console.

use chrono::{DateTime, Utc};
use serde_json::json;
use sqlx::PgPool;

use super::{
    data::{
        actions::{self, Actor},
        vault_keys::{self, NewKeyRow, VaultKeyRow},
    },
    secrets::Secret,
};
use crate::{
    domain::{BillingPeriod, Cents, Currency, EndpointPattern},
    error::AppError,
};

/// A key to issue, validated.
#[derive(Debug, Clone)]
pub struct NewVaultKey {
    pub label: String,
    pub billing_period: BillingPeriod,
    pub currency: Currency,
    pub expected_total: Cents,
    pub buffer_bps: u32,
    pub cap: Cents,
    pub allowed_endpoints: Vec<EndpointPattern>,
    pub expires_at: DateTime<Utc>,
}

impl NewVaultKey {
    /// Checks what the parts cannot check alone.
    pub fn validate(&self, now: DateTime<Utc>) -> Result<(), AppError> {
        let label_len = self.label.trim().chars().count();
        if label_len == 0 || label_len > 200 {
            return Err(AppError::Invalid(
                "label must have between 1 and 200 characters".into(),
            ));
        }
        if self.expires_at <= now {
            return Err(AppError::Invalid(format!(
                "expires_at {} is not in the future",
                self.expires_at.to_rfc3339()
            )));
        }
        if self.allowed_endpoints.is_empty() {
            return Err(AppError::Invalid(
                "allowed_endpoints must name at least one endpoint".into(),
            ));
        }
        if self.cap.0 <= 0 {
            return Err(AppError::Invalid("the cap must be positive".into()));
        }
        Ok(())
    }
}

/// Issues a key; returns the secret (to show once) and the stored row.
pub async fn issue(
    pool: &PgPool,
    actor: Actor,
    key: NewVaultKey,
) -> Result<(String, VaultKeyRow), AppError> {
    key.validate(Utc::now())?;
    let secret = Secret::generate("vk_");
    let mut endpoints: Vec<String> = key
        .allowed_endpoints
        .iter()
        .map(ToString::to_string)
        .collect();
    endpoints.sort();
    endpoints.dedup();
    let (created_by, created_by_token) = match actor {
        Actor::Operator { id, .. } => (Some(id), None),
        Actor::ApiToken { id } => (None, Some(id)),
        Actor::Cli | Actor::System => (None, None),
    };
    let mut tx = pool.begin().await?;
    let row = vault_keys::insert(
        &mut *tx,
        &NewKeyRow {
            secret_hash: &secret.hash,
            secret_prefix: &secret.prefix,
            label: key.label.trim(),
            billing_period: &key.billing_period.to_string(),
            currency: key.currency.as_str(),
            expected_total_cents: key.expected_total.0,
            buffer_bps: key.buffer_bps as i32,
            cap_cents: key.cap.0,
            allowed_endpoints: &endpoints,
            expires_at: key.expires_at,
            created_by,
            created_by_token,
        },
    )
    .await?;
    actions::record(
        &mut *tx,
        actor,
        "create_vault_key",
        "vault_key",
        Some(row.id.to_string()),
        json!({ "label": row.label, "billing_period": row.billing_period, "cap_cents": row.cap_cents,
                "currency": row.currency, "prefix": row.secret_prefix }),
    )
    .await?;
    tx.commit().await?;
    Ok((secret.plaintext, row))
}

/// Revokes a key at once: the proxy refuses it from the next call.
pub async fn revoke(
    pool: &PgPool,
    actor: Actor,
    id: i64,
    reason: &str,
) -> Result<VaultKeyRow, AppError> {
    let reason = reason.trim();
    if reason.is_empty() {
        return Err(AppError::Invalid("say why the key is revoked".into()));
    }
    let revoked_by = match actor {
        Actor::Operator { id, .. } => Some(id),
        _ => None,
    };
    let mut tx = pool.begin().await?;
    let Some(row) = vault_keys::revoke(&mut *tx, id, reason, revoked_by).await? else {
        return match vault_keys::find(&mut *tx, id).await? {
            Some(_) => Err(AppError::Invalid(format!("key {id} is already revoked"))),
            None => Err(AppError::NotFound),
        };
    };
    actions::record(
        &mut *tx,
        actor,
        "revoke_vault_key",
        "vault_key",
        Some(id.to_string()),
        json!({ "label": row.label, "reason": reason }),
    )
    .await?;
    tx.commit().await?;
    Ok(row)
}
