//! Alerts on vault keys. Threshold and cap-refusal alerts are raised by the
//! ledger statements (reserve_spend, see the migrations); expiry alerts by
//! [`raise_expiring`]. People acknowledge, assign and snooze them here.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgExecutor, PgPool};

use super::actions::{self, Actor};

/// An alert's state, derived from its acknowledgement and snooze.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AlertState {
    Open,
    Acknowledged,
    Snoozed,
}

impl AlertState {
    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "open" => Some(Self::Open),
            "acknowledged" => Some(Self::Acknowledged),
            "snoozed" => Some(Self::Snoozed),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Acknowledged => "acknowledged",
            Self::Snoozed => "snoozed",
        }
    }
}

/// The SQL that derives [`AlertState`] from an `alerts` row aliased `a`.
const STATE_SQL: &str = "CASE WHEN a.acknowledged_at IS NOT NULL THEN 'acknowledged'
                              WHEN a.snoozed_until > now() THEN 'snoozed'
                              ELSE 'open' END";

#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct AlertRow {
    pub id: i64,
    pub vault_key_id: i64,
    pub key_label: String,
    pub kind: String,
    pub threshold_pct: i16,
    pub message: String,
    pub occurrences: i32,
    pub state: String,
    pub raised_at: DateTime<Utc>,
    pub last_occurred_at: DateTime<Utc>,
    pub acknowledged_at: Option<DateTime<Utc>>,
    /// The operator's email, or `api token <name>`.
    pub acknowledged_by: Option<String>,
    pub ack_note: Option<String>,
    pub assigned_to: Option<String>,
    pub snoozed_until: Option<DateTime<Utc>>,
    /// Webhook deliveries: how many were made, are still being tried, failed.
    pub deliveries_delivered: i64,
    pub deliveries_pending: i64,
    pub deliveries_failed: i64,
}

fn select_sql() -> String {
    format!(
        "SELECT a.id, a.vault_key_id, k.label AS key_label, a.kind, a.threshold_pct, a.message,
                a.occurrences, {STATE_SQL} AS state, a.raised_at, a.last_occurred_at,
                a.acknowledged_at,
                COALESCE(ack.email, 'api token ' || tok.name) AS acknowledged_by,
                a.ack_note, assignee.email AS assigned_to, a.snoozed_until,
                COALESCE(d.delivered, 0) AS deliveries_delivered,
                COALESCE(d.pending, 0) AS deliveries_pending,
                COALESCE(d.failed, 0) AS deliveries_failed
         FROM alerts a
         JOIN vault_keys k ON k.id = a.vault_key_id
         LEFT JOIN operators ack ON ack.id = a.acknowledged_by
         LEFT JOIN api_tokens tok ON tok.id = a.acknowledged_by_token
         LEFT JOIN operators assignee ON assignee.id = a.assigned_to
         LEFT JOIN LATERAL (
             SELECT count(*) FILTER (WHERE ad.state = 'delivered') AS delivered,
                    count(*) FILTER (WHERE ad.state = 'pending') AS pending,
                    count(*) FILTER (WHERE ad.state = 'failed') AS failed
             FROM alert_notifications n JOIN alert_deliveries ad ON ad.notification_id = n.id
             WHERE n.alert_id = a.id
         ) d ON true"
    )
}

/// Alerts, newest first, optionally for one key and in one state.
pub async fn list(
    db: impl PgExecutor<'_>,
    key: Option<i64>,
    state: Option<AlertState>,
    limit: i64,
) -> Result<Vec<AlertRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "{} WHERE ($1::bigint IS NULL OR a.vault_key_id = $1)
              AND ($2::text IS NULL OR {STATE_SQL} = $2)
         ORDER BY a.raised_at DESC, a.id DESC LIMIT $3",
        select_sql()
    ))
    .bind(key)
    .bind(state.map(AlertState::as_str))
    .bind(limit)
    .fetch_all(db)
    .await
}

pub async fn find(db: impl PgExecutor<'_>, id: i64) -> Result<Option<AlertRow>, sqlx::Error> {
    sqlx::query_as(&format!("{} WHERE a.id = $1", select_sql()))
        .bind(id)
        .fetch_optional(db)
        .await
}

/// Alerts that need someone: neither acknowledged nor snoozed.
pub async fn open_count(db: impl PgExecutor<'_>) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(&format!(
        "SELECT count(*) FROM alerts a WHERE a.acknowledged_at IS NULL AND {STATE_SQL} = 'open'"
    ))
    .fetch_one(db)
    .await
}

/// Why an alert could not be changed.
#[derive(Debug, thiserror::Error)]
pub enum AlertChangeError {
    #[error("there is no alert {0}")]
    NotFound(i64),
    #[error("alert {0} was already acknowledged")]
    AlreadyAcknowledged(i64),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// Acknowledges an open or snoozed alert, once; recorded in the action log.
pub async fn acknowledge(
    pool: &PgPool,
    actor: Actor,
    id: i64,
    note: Option<&str>,
) -> Result<AlertRow, AlertChangeError> {
    let (operator, token) = match actor {
        Actor::Operator { id, .. } => (Some(id), None),
        Actor::ApiToken { id } => (None, Some(id)),
        Actor::Cli | Actor::System => (None, None),
    };
    let mut tx = pool.begin().await?;
    let updated = sqlx::query(
        "UPDATE alerts SET acknowledged_at = now(), acknowledged_by = $2, acknowledged_by_token = $3,
                ack_note = $4, snoozed_until = NULL
         WHERE id = $1 AND acknowledged_at IS NULL",
    )
    .bind(id)
    .bind(operator)
    .bind(token)
    .bind(note)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if updated == 0 {
        let exists: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM alerts WHERE id = $1)")
            .bind(id)
            .fetch_one(&mut *tx)
            .await?;
        return Err(if exists {
            AlertChangeError::AlreadyAcknowledged(id)
        } else {
            AlertChangeError::NotFound(id)
        });
    }
    actions::record(
        &mut *tx,
        actor,
        "alert.acknowledge",
        "alert",
        Some(id.to_string()),
        serde_json::json!({ "note": note }),
    )
    .await?;
    tx.commit().await?;
    find(pool, id).await?.ok_or(AlertChangeError::NotFound(id))
}

/// Raises an expiry alert for each active key that expires within a day
/// with less spent than expected (once per key). Returns how many.
pub async fn raise_expiring(db: impl PgExecutor<'_>) -> Result<u64, sqlx::Error> {
    Ok(sqlx::query(
        "INSERT INTO alerts (vault_key_id, kind, message)
         SELECT k.id, 'expiring',
                format('%s expires at %s UTC with %s of %s expected cents not yet spent',
                       k.label, to_char(k.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI'),
                       k.expected_total_cents - k.spent_cents, k.expected_total_cents)
         FROM vault_keys k
         WHERE k.revoked_at IS NULL AND k.expires_at > now() AND k.expires_at <= now() + interval '24 hours'
           AND k.spent_cents < k.expected_total_cents
         ON CONFLICT ON CONSTRAINT alerts_once DO NOTHING",
    )
    .execute(db)
    .await?
    .rows_affected())
}
