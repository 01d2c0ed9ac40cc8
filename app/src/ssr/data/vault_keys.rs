//! Vault keys as the key API and the proxy read and write them.

use chrono::{DateTime, Utc};
use sqlx::{PgExecutor, Row};

use crate::domain::{
    BillingPeriod, Cents, Currency, KeyStatus, KeySummary, ParseError, PeriodTotals,
};

/// A vault key's row (never its secret, only the hash's lookup).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct VaultKeyRow {
    pub id: i64,
    pub label: String,
    pub secret_prefix: String,
    pub billing_period: String,
    pub currency: String,
    pub expected_total_cents: i64,
    pub buffer_bps: i32,
    pub cap_cents: i64,
    pub spent_cents: i64,
    pub reserved_cents: i64,
    pub allowed_endpoints: Vec<String>,
    pub expires_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
    pub revoke_reason: Option<String>,
    pub created_at: DateTime<Utc>,
}

impl VaultKeyRow {
    /// Revoked, expired or active: derived, never stored.
    pub fn status(&self, now: DateTime<Utc>) -> KeyStatus {
        if self.revoked_at.is_some() {
            KeyStatus::Revoked
        } else if self.expires_at <= now {
            KeyStatus::Expired
        } else {
            KeyStatus::Active
        }
    }

    /// The key as the console lists it.
    pub fn summary(&self, now: DateTime<Utc>) -> Result<KeySummary, ParseError> {
        Ok(KeySummary {
            id: self.id,
            label: self.label.clone(),
            secret_prefix: self.secret_prefix.clone(),
            billing_period: self.billing_period.clone(),
            currency: Currency::parse(&self.currency)?,
            expected_total: Cents(self.expected_total_cents),
            cap: Cents(self.cap_cents),
            spent: Cents(self.spent_cents),
            reserved: Cents(self.reserved_cents),
            status: self.status(now),
            expires_at: self.expires_at,
        })
    }
}

const COLUMNS: &str = "id, label, secret_prefix, billing_period, currency, expected_total_cents, buffer_bps,
    cap_cents, spent_cents, reserved_cents, allowed_endpoints, expires_at, revoked_at, revoke_reason, created_at";

/// What a new key row holds; the caller has validated it.
pub struct NewKeyRow<'a> {
    pub secret_hash: &'a [u8],
    pub secret_prefix: &'a str,
    pub label: &'a str,
    pub billing_period: &'a str,
    pub currency: &'a str,
    pub expected_total_cents: i64,
    pub buffer_bps: i32,
    pub cap_cents: i64,
    pub allowed_endpoints: &'a [String],
    pub expires_at: DateTime<Utc>,
    pub alert_thresholds_pct: &'a [i16],
    pub created_by: Option<i64>,
    pub created_by_token: Option<i64>,
}

pub async fn insert(
    db: impl PgExecutor<'_>,
    key: &NewKeyRow<'_>,
) -> Result<VaultKeyRow, sqlx::Error> {
    sqlx::query_as(&format!(
        "INSERT INTO vault_keys (secret_hash, secret_prefix, label, billing_period, currency,
             expected_total_cents, buffer_bps, cap_cents, allowed_endpoints, expires_at, created_by, created_by_token,
             alert_thresholds_pct)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
         RETURNING {COLUMNS}"
    ))
    .bind(key.secret_hash)
    .bind(key.secret_prefix)
    .bind(key.label)
    .bind(key.billing_period)
    .bind(key.currency)
    .bind(key.expected_total_cents)
    .bind(key.buffer_bps)
    .bind(key.cap_cents)
    .bind(key.allowed_endpoints)
    .bind(key.expires_at)
    .bind(key.created_by)
    .bind(key.created_by_token)
    .bind(key.alert_thresholds_pct)
    .fetch_one(db)
    .await
}

pub async fn find_by_secret_hash(
    db: impl PgExecutor<'_>,
    hash: &[u8],
) -> Result<Option<VaultKeyRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM vault_keys WHERE secret_hash = $1"
    ))
    .bind(hash)
    .fetch_optional(db)
    .await
}

pub async fn find(db: impl PgExecutor<'_>, id: i64) -> Result<Option<VaultKeyRow>, sqlx::Error> {
    sqlx::query_as(&format!("SELECT {COLUMNS} FROM vault_keys WHERE id = $1"))
        .bind(id)
        .fetch_optional(db)
        .await
}

/// Keys newest first, at most `limit`.
pub async fn list(db: impl PgExecutor<'_>, limit: i64) -> Result<Vec<VaultKeyRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM vault_keys ORDER BY created_at DESC, id DESC LIMIT $1"
    ))
    .bind(limit)
    .fetch_all(db)
    .await
}

/// Revokes a key that is not revoked yet; `None` if it was (or is missing).
pub async fn revoke(
    db: impl PgExecutor<'_>,
    id: i64,
    reason: &str,
    revoked_by: Option<i64>,
) -> Result<Option<VaultKeyRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "UPDATE vault_keys SET revoked_at = now(), revoke_reason = $2, revoked_by = $3
         WHERE id = $1 AND revoked_at IS NULL RETURNING {COLUMNS}"
    ))
    .bind(id)
    .bind(reason)
    .bind(revoked_by)
    .fetch_optional(db)
    .await
}

/// Totals of a period's keys, one row per currency.
pub async fn period_totals(
    db: impl PgExecutor<'_>,
    period: BillingPeriod,
) -> Result<Vec<PeriodTotals>, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT currency, count(*) AS keys,
                count(*) FILTER (WHERE revoked_at IS NULL AND expires_at > now()) AS active_keys,
                sum(expected_total_cents)::bigint AS expected, sum(cap_cents)::bigint AS cap,
                sum(spent_cents)::bigint AS spent, sum(reserved_cents)::bigint AS reserved
         FROM vault_keys WHERE billing_period = $1
         GROUP BY currency ORDER BY currency",
    )
    .bind(period.to_string())
    .fetch_all(db)
    .await?;
    rows.into_iter()
        .map(|row| {
            Ok(PeriodTotals {
                currency: Currency::parse(row.try_get("currency")?).map_err(|err| {
                    sqlx::Error::ColumnDecode {
                        index: "currency".into(),
                        source: Box::new(err),
                    }
                })?,
                keys: row.try_get("keys")?,
                active_keys: row.try_get("active_keys")?,
                expected_total: Cents(row.try_get("expected")?),
                cap: Cents(row.try_get("cap")?),
                spent: Cents(row.try_get("spent")?),
                reserved: Cents(row.try_get("reserved")?),
            })
        })
        .collect()
}
