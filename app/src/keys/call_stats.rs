//! Calls per key, hour and decision (kept by a trigger on the audit log, see
//! the migrations): what the console counts and charts without scanning the
//! audit log.

use chrono::{DateTime, NaiveDate, Utc};
use sqlx::PgExecutor;

use crate::domain::{Cents, Decision, DecisionCount, VaultKeyId};

/// A key's calls by decision, most frequent first.
#[tracing::instrument(skip_all)]
pub async fn by_decision(
    db: impl PgExecutor<'_>,
    key: VaultKeyId,
) -> Result<Vec<DecisionCount>, sqlx::Error> {
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT decision, sum(calls)::bigint FROM call_stats WHERE vault_key_id = $1
         GROUP BY decision ORDER BY 2 DESC, 1",
    )
    .bind(key)
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .filter_map(|(decision, calls)| {
            Some(DecisionCount {
                decision: Decision::parse(&decision)?,
                calls,
            })
        })
        .collect())
}

/// What a key spent in each hour that it spent anything, oldest first.
#[tracing::instrument(skip_all)]
pub async fn hourly_spend(
    db: impl PgExecutor<'_>,
    key: VaultKeyId,
) -> Result<Vec<(DateTime<Utc>, Cents)>, sqlx::Error> {
    let rows: Vec<(DateTime<Utc>, i64)> = sqlx::query_as(
        "SELECT hour, sum(spent_cents)::bigint FROM call_stats
         WHERE vault_key_id = $1 AND spent_cents > 0 GROUP BY hour ORDER BY hour",
    )
    .bind(key)
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(|(hour, c)| (hour, Cents(c))).collect())
}

/// Refused calls (every refusal reason, known keys or not) in the hours
/// starting at or after `since`.
#[tracing::instrument(skip_all)]
pub async fn refused_since(
    db: impl PgExecutor<'_>,
    since: DateTime<Utc>,
) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT coalesce(sum(calls), 0)::bigint FROM call_stats
         WHERE hour >= date_trunc('hour', $1::timestamptz, 'UTC') AND decision LIKE 'refused%'",
    )
    .bind(since)
    .fetch_one(db)
    .await
}

/// Daily spend of the given keys from `from` to `to`: (key id, UTC day,
/// spent), by key then day.
#[tracing::instrument(skip_all)]
pub async fn daily_spend(
    db: impl PgExecutor<'_>,
    keys: &[VaultKeyId],
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<Vec<(VaultKeyId, NaiveDate, Cents)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT vault_key_id, (hour AT TIME ZONE 'UTC')::date, sum(spent_cents)::bigint
         FROM call_stats
         WHERE vault_key_id = ANY($1) AND hour >= $2 AND hour < $3 AND spent_cents > 0
         GROUP BY 1, 2 ORDER BY 1, 2",
    )
    .bind(keys)
    .bind(from)
    .bind(to)
    .fetch_all(db)
    .await
}
