//! Alerts on vault keys. Threshold and cap-refusal alerts are raised by the
//! ledger statements (reserve_spend, see the migrations); expiry alerts by
//! [`raise_expiring`]. People acknowledge, assign and snooze them here.

use chrono::{DateTime, Utc};
use sqlx::{PgExecutor, PgPool};

use crate::actions::sql::{self as actions, Actor};
pub use crate::domain::{Alert, AlertState};
use crate::domain::{AlertId, OperatorId, VaultKeyId};

/// The SQL that derives [`AlertState`] from an `alerts` row aliased `a`.
const STATE_SQL: &str = "CASE WHEN a.acknowledged_at IS NOT NULL THEN 'acknowledged'
                              WHEN a.snoozed_until > now() THEN 'snoozed'
                              ELSE 'open' END";

fn select_sql() -> String {
    format!(
        "SELECT a.id, a.vault_key_id, k.label AS key_label, k.currency, k.expires_at AS key_expires_at,
                a.kind, a.threshold_pct, a.committed_cents, a.cap_cents, a.amount_cents, a.occurrences, {STATE_SQL} AS state, a.raised_at, a.last_occurred_at,
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
#[tracing::instrument(skip_all)]
pub async fn list(
    db: impl PgExecutor<'_>,
    key: Option<VaultKeyId>,
    state: Option<AlertState>,
    limit: i64,
) -> Result<Vec<Alert>, sqlx::Error> {
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

#[tracing::instrument(skip_all)]
pub async fn find(db: impl PgExecutor<'_>, id: AlertId) -> Result<Option<Alert>, sqlx::Error> {
    sqlx::query_as(&format!("{} WHERE a.id = $1", select_sql()))
        .bind(id)
        .fetch_optional(db)
        .await
}

/// Alerts that need someone: neither acknowledged nor snoozed.
#[tracing::instrument(skip_all)]
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
    NotFound(AlertId),
    #[error("alert {0} was already acknowledged")]
    AlreadyAcknowledged(AlertId),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// Acknowledges an open or snoozed alert, once; recorded in the action log.
#[tracing::instrument(skip_all)]
pub async fn acknowledge(
    pool: &PgPool,
    actor: Actor,
    id: AlertId,
    note: Option<&str>,
) -> Result<Alert, AlertChangeError> {
    let (operator, token) = match actor {
        Actor::Operator { id, .. } => (Some(id), None),
        Actor::ApiToken { id, .. } => (None, Some(id)),
        Actor::Visitor { .. } | Actor::Cli | Actor::System => (None, None),
    };
    let update = sqlx::query(
        "UPDATE alerts SET acknowledged_at = now(), acknowledged_by = $2, acknowledged_by_token = $3,
                ack_note = $4, snoozed_until = NULL
         WHERE id = $1 AND acknowledged_at IS NULL",
    )
    .bind(id)
    .bind(operator)
    .bind(token)
    .bind(note);
    let details = serde_json::json!({ "note": note });
    change(pool, actor, id, update, "alert.acknowledge", details).await
}

/// Applies one change (`update`, binding the alert's id as $1) and records
/// it in the action log, in one transaction; then reads the alert back. An
/// update that touches no row means the alert is gone or, where the update
/// skips them, already acknowledged.
#[tracing::instrument(skip_all)]
async fn change(
    pool: &PgPool,
    actor: Actor,
    id: AlertId,
    update: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
    action: &str,
    details: serde_json::Value,
) -> Result<Alert, AlertChangeError> {
    let mut tx = pool.begin().await?;
    if update.execute(&mut *tx).await?.rows_affected() == 0 {
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
        action,
        "alert",
        Some(id.to_string()),
        details,
    )
    .await?;
    tx.commit().await?;
    find(pool, id).await?.ok_or(AlertChangeError::NotFound(id))
}

/// Raises an expiry alert for each active key that expires within a day
/// with less spent than expected (once per key, whatever its cap). Returns
/// how many.
#[tracing::instrument(skip_all)]
pub async fn raise_expiring(db: impl PgExecutor<'_>) -> Result<u64, sqlx::Error> {
    Ok(sqlx::query(
        "INSERT INTO alerts (vault_key_id, kind, committed_cents, cap_cents, amount_cents)
         SELECT k.id, 'expiring', k.spent_cents, k.cap_cents, k.expected_total_cents - k.spent_cents
         FROM vault_keys k
         WHERE k.revoked_at IS NULL AND k.expires_at > now() AND k.expires_at <= now() + interval '24 hours'
           AND k.spent_cents < k.expected_total_cents
           AND NOT EXISTS (SELECT 1 FROM alerts a WHERE a.vault_key_id = k.id AND a.kind = 'expiring')
         ON CONFLICT ON CONSTRAINT alerts_once DO NOTHING",
    )
    .execute(db)
    .await?
    .rows_affected())
}

/// How many alerts are open, snoozed and acknowledged.
#[tracing::instrument(skip_all)]
pub async fn counts(db: impl PgExecutor<'_>) -> Result<(i64, i64, i64), sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT count(*) FILTER (WHERE s = 'open'), count(*) FILTER (WHERE s = 'snoozed'),
                count(*) FILTER (WHERE s = 'acknowledged')
         FROM (SELECT {STATE_SQL} AS s FROM alerts a) states"
    ))
    .fetch_one(db)
    .await
}

/// Assigns an alert to an operator (`None`: to nobody); recorded.
#[tracing::instrument(skip_all)]
pub async fn assign(
    pool: &PgPool,
    actor: Actor,
    id: AlertId,
    operator: Option<OperatorId>,
) -> Result<Alert, AlertChangeError> {
    let update = sqlx::query("UPDATE alerts SET assigned_to = $2 WHERE id = $1")
        .bind(id)
        .bind(operator);
    let details = serde_json::json!({ "operator_id": operator });
    change(pool, actor, id, update, "alert.assign", details).await
}

/// Snoozes an unacknowledged alert until `until`; recorded.
#[tracing::instrument(skip_all)]
pub async fn snooze(
    pool: &PgPool,
    actor: Actor,
    id: AlertId,
    until: DateTime<Utc>,
) -> Result<Alert, AlertChangeError> {
    let update = sqlx::query(
        "UPDATE alerts SET snoozed_until = $2 WHERE id = $1 AND acknowledged_at IS NULL",
    )
    .bind(id)
    .bind(until);
    let details = serde_json::json!({ "until": until });
    change(pool, actor, id, update, "alert.snooze", details).await
}
