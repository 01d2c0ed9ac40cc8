//! Vault keys as the key API and the proxy read and write them.

use chrono::{DateTime, Utc};
use sqlx::{PgExecutor, PgPool, Postgres, QueryBuilder, Row};

use crate::domain::{
    ApiTokenId, BillingPeriod, Cents, Currency, DuplicatePolicy, KeyFilter, KeySort, KeyStatus,
    KeySummary, OperatorId, PeriodTotals, VaultKeyId,
};

/// A vault key's row (never its secret, only the hash's lookup).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct VaultKeyRow {
    pub id: VaultKeyId,
    pub label: String,
    pub secret_prefix: String,
    pub billing_period: BillingPeriod,
    pub currency: Currency,
    pub expected_total_cents: Cents,
    pub buffer_bps: i32,
    pub cap_cents: Cents,
    pub spent_cents: Cents,
    pub reserved_cents: Cents,
    pub allowed_endpoints: Vec<String>,
    pub expires_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
    pub revoke_reason: Option<String>,
    pub alert_thresholds_pct: Vec<i16>,
    pub created_at: DateTime<Utc>,
    /// Set on a follow-on key issued for a cap increase.
    pub parent_key_id: Option<VaultKeyId>,
    /// What the proxy does with a second charge for a customer and period.
    pub duplicate_policy: DuplicatePolicy,
    /// The connected account (`acct_…`) every call must name in
    /// `Stripe-Account`; none: the platform account, and no call may name one.
    pub stripe_account: Option<String>,
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
    pub fn summary(&self, now: DateTime<Utc>) -> KeySummary {
        KeySummary {
            id: self.id,
            label: self.label.clone(),
            secret_prefix: self.secret_prefix.clone(),
            billing_period: self.billing_period,
            currency: self.currency.clone(),
            expected_total: self.expected_total_cents,
            cap: self.cap_cents,
            spent: self.spent_cents,
            reserved: self.reserved_cents,
            status: self.status(now),
            expires_at: self.expires_at,
            thresholds_pct: self.alert_thresholds_pct.clone(),
        }
    }
}

pub(crate) const COLUMNS: &str = "id, label, secret_prefix, billing_period, currency, expected_total_cents, buffer_bps,
    cap_cents, spent_cents, reserved_cents, allowed_endpoints, expires_at, revoked_at, revoke_reason,
    alert_thresholds_pct, created_at, parent_key_id, duplicate_policy, stripe_account";

/// What a new key row holds; the caller has validated it.
pub struct NewKeyRow<'a> {
    pub secret_hash: &'a [u8],
    pub secret_prefix: &'a str,
    pub label: &'a str,
    pub billing_period: BillingPeriod,
    pub currency: &'a Currency,
    pub expected_total_cents: Cents,
    pub buffer_bps: i32,
    pub cap_cents: Cents,
    pub allowed_endpoints: &'a [String],
    pub expires_at: DateTime<Utc>,
    pub alert_thresholds_pct: &'a [i16],
    pub duplicate_policy: DuplicatePolicy,
    pub stripe_account: Option<&'a str>,
    pub created_by: Option<OperatorId>,
    pub created_by_token: Option<ApiTokenId>,
    /// The key a follow-on key extends.
    pub parent_key_id: Option<VaultKeyId>,
}

#[tracing::instrument(skip_all)]
pub async fn insert(
    db: impl PgExecutor<'_>,
    key: &NewKeyRow<'_>,
) -> Result<VaultKeyRow, sqlx::Error> {
    sqlx::query_as(&format!(
        "INSERT INTO vault_keys (secret_hash, secret_prefix, label, billing_period, currency,
             expected_total_cents, buffer_bps, cap_cents, allowed_endpoints, expires_at, created_by, created_by_token,
             alert_thresholds_pct, parent_key_id, duplicate_policy, stripe_account)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)
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
    .bind(key.parent_key_id)
    .bind(key.duplicate_policy)
    .bind(key.stripe_account)
    .fetch_one(db)
    .await
}

#[tracing::instrument(skip_all)]
pub async fn set_duplicate_policy(
    db: impl PgExecutor<'_>,
    id: VaultKeyId,
    policy: &str,
) -> Result<Option<VaultKeyRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "UPDATE vault_keys SET duplicate_policy = $2 WHERE id = $1 RETURNING {COLUMNS}"
    ))
    .bind(id)
    .bind(policy)
    .fetch_optional(db)
    .await
}

/// Live keys (not revoked, not expired) with `label`, ignoring case and
/// surrounding spaces: (id, billing period), at most five.
#[tracing::instrument(skip_all)]
pub async fn live_with_label(
    db: impl PgExecutor<'_>,
    label: &str,
) -> Result<Vec<(i64, String)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, billing_period FROM vault_keys
         WHERE lower(btrim(label)) = lower(btrim($1)) AND revoked_at IS NULL AND expires_at > now()
         ORDER BY id DESC LIMIT 5",
    )
    .bind(label)
    .fetch_all(db)
    .await
}

#[tracing::instrument(skip_all)]
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

#[tracing::instrument(skip_all)]
pub async fn find(
    db: impl PgExecutor<'_>,
    id: VaultKeyId,
) -> Result<Option<VaultKeyRow>, sqlx::Error> {
    sqlx::query_as(&format!("SELECT {COLUMNS} FROM vault_keys WHERE id = $1"))
        .bind(id)
        .fetch_optional(db)
        .await
}

/// The key, locked for the rest of the transaction, so that changes to its
/// cap are made one after the other.
#[tracing::instrument(skip_all)]
pub async fn lock(
    tx: &mut sqlx::PgConnection,
    id: VaultKeyId,
) -> Result<Option<VaultKeyRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM vault_keys WHERE id = $1 FOR UPDATE"
    ))
    .bind(id)
    .fetch_optional(tx)
    .await
}

/// Keys newest first, at most `limit`.
#[tracing::instrument(skip_all)]
pub async fn list(db: impl PgExecutor<'_>, limit: i64) -> Result<Vec<VaultKeyRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM vault_keys ORDER BY created_at DESC, id DESC LIMIT $1"
    ))
    .bind(limit)
    .fetch_all(db)
    .await
}

/// One page of the keys matching `filter`, in its order, and how many
/// match in all.
#[tracing::instrument(skip_all)]
pub async fn list_filtered(
    pool: &PgPool,
    filter: &KeyFilter,
    per_page: i64,
) -> Result<(Vec<VaultKeyRow>, i64), sqlx::Error> {
    let mut count = QueryBuilder::new("SELECT count(*) FROM vault_keys");
    push_filter(&mut count, filter);
    let matching: i64 = count.build_query_scalar().fetch_one(pool).await?;

    let mut page = QueryBuilder::new(format!("SELECT {COLUMNS} FROM vault_keys"));
    push_filter(&mut page, filter);
    let column = match filter.sort {
        KeySort::Created => "created_at",
        KeySort::Period => "billing_period",
        KeySort::Label => "lower(label)",
        KeySort::Cap => "cap_cents",
        KeySort::Spent => "spent_cents",
        KeySort::Utilization => "(spent_cents + reserved_cents)::numeric / cap_cents",
        KeySort::Expires => "expires_at",
    };
    let dir = if filter.descending { "DESC" } else { "ASC" };
    page.push(format!(" ORDER BY {column} {dir}, id {dir} LIMIT "))
        .push_bind(per_page)
        .push(" OFFSET ")
        .push_bind((filter.page - 1) * per_page);
    let rows = page.build_query_as().fetch_all(pool).await?;
    Ok((rows, matching))
}

fn push_filter(query: &mut QueryBuilder<'_, Postgres>, filter: &KeyFilter) {
    query.push(" WHERE true");
    if let Some(period) = filter.period {
        query
            .push(" AND billing_period = ")
            .push_bind(period.to_string());
    }
    match filter.status {
        None => {}
        Some(KeyStatus::Active) => {
            query.push(" AND revoked_at IS NULL AND expires_at > now()");
        }
        Some(KeyStatus::Expired) => {
            query.push(" AND revoked_at IS NULL AND expires_at <= now()");
        }
        Some(KeyStatus::Revoked) => {
            query.push(" AND revoked_at IS NOT NULL");
        }
    }
    if filter.at_threshold {
        query.push(
            " AND (spent_cents + reserved_cents) * 100
                  >= cap_cents * (SELECT min(t) FROM unnest(alert_thresholds_pct) t)",
        );
    }
    if let Some(search) = &filter.search {
        // Matched literally: LIKE's wildcards in the search are escaped.
        let escaped = search
            .replace('\\', "\\\\")
            .replace('%', "\\%")
            .replace('_', "\\_");
        query
            .push(" AND label ILIKE ")
            .push_bind(format!("%{escaped}%"));
    }
}

/// The period's keys that spent most, most first (only keys that spent).
#[tracing::instrument(skip_all)]
pub async fn top_spenders(
    db: impl PgExecutor<'_>,
    period: BillingPeriod,
    limit: i64,
) -> Result<Vec<VaultKeyRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM vault_keys WHERE billing_period = $1 AND spent_cents > 0
         ORDER BY spent_cents DESC, id LIMIT $2"
    ))
    .bind(period.to_string())
    .bind(limit)
    .fetch_all(db)
    .await
}

/// Billing periods that have keys, newest first.
#[tracing::instrument(skip_all)]
pub async fn periods(db: impl PgExecutor<'_>) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar("SELECT DISTINCT billing_period FROM vault_keys ORDER BY 1 DESC")
        .fetch_all(db)
        .await
}

/// Revokes a key that is not revoked yet; `None` if it was (or is missing).
#[tracing::instrument(skip_all)]
pub async fn revoke(
    db: impl PgExecutor<'_>,
    id: VaultKeyId,
    reason: &str,
    revoked_by: Option<OperatorId>,
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
#[tracing::instrument(skip_all)]
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

/// A key with the people who created and revoked it (their emails; an API
/// token's name when a token created it).
#[derive(sqlx::FromRow)]
pub struct KeyWithPeople {
    #[sqlx(flatten)]
    pub key: VaultKeyRow,
    pub created_by: Option<String>,
    pub revoked_by: Option<String>,
}

#[tracing::instrument(skip_all)]
pub async fn find_with_people(
    db: impl PgExecutor<'_>,
    id: VaultKeyId,
) -> Result<Option<KeyWithPeople>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT k.*, COALESCE(creator.email, 'API token ' || tok.name) AS created_by,
                revoker.email AS revoked_by
         FROM (SELECT {COLUMNS}, created_by AS creator_id, created_by_token AS token_id,
                      revoked_by AS revoker_id
               FROM vault_keys WHERE id = $1) k
         LEFT JOIN operators creator ON creator.id = k.creator_id
         LEFT JOIN api_tokens tok ON tok.id = k.token_id
         LEFT JOIN operators revoker ON revoker.id = k.revoker_id"
    ))
    .bind(id)
    .fetch_optional(db)
    .await
}
