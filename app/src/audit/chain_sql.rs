//! What the checks of the audit log's hash chain found (`audit_chain_checks`,
//! written by `vaultcap serve`'s checker and `vaultcap audit verify`), and
//! whether the application's database role could rewrite the logs at all.

use chrono::{DateTime, NaiveDate, Utc};
use sqlx::PgExecutor;

use crate::domain::ChainStatus;

/// The database role the application runs as, and whether it could change
/// or delete audit rows (it owns the table, is a superuser, or holds UPDATE,
/// DELETE or TRUNCATE on it). Vaultcap's own role, `vaultcap_app`, cannot.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct LogProtection {
    pub role: String,
    pub can_rewrite: bool,
}

#[tracing::instrument(skip_all)]
pub async fn log_protection(db: impl PgExecutor<'_>) -> sqlx::Result<LogProtection> {
    sqlx::query_as(
        "SELECT current_user::text AS role,
                has_table_privilege('audit_log', 'UPDATE')
                OR has_table_privilege('audit_log', 'DELETE')
                OR has_table_privilege('audit_log', 'TRUNCATE')
                OR pg_has_role((SELECT relowner FROM pg_class WHERE oid = 'audit_log'::regclass), 'MEMBER')
                AS can_rewrite",
    )
    .fetch_one(db)
    .await
}

/// One day's chain as last checked.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct DayCheck {
    pub day: NaiveDate,
    /// Rows verified, from the first: the check resumes after this one.
    pub verified_seq: i64,
    pub verified_hash: Vec<u8>,
    /// When the last verified row was written.
    pub verified_at: Option<DateTime<Utc>>,
    pub checked_at: DateTime<Utc>,
    pub broken_row_id: Option<i64>,
    pub problem: Option<String>,
}

#[tracing::instrument(skip_all)]
pub async fn day_checks(db: impl PgExecutor<'_>) -> sqlx::Result<Vec<DayCheck>> {
    sqlx::query_as(
        "SELECT day, verified_seq, verified_hash, verified_at, checked_at, broken_row_id, problem
         FROM audit_chain_checks ORDER BY day",
    )
    .fetch_all(db)
    .await
}

#[tracing::instrument(skip_all)]
pub async fn record_check(db: impl PgExecutor<'_>, check: &DayCheck) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO audit_chain_checks
             (day, verified_seq, verified_hash, verified_at, checked_at, broken_row_id, problem)
         VALUES ($1, $2, $3, $4, $5, $6, $7)
         ON CONFLICT (day) DO UPDATE SET
             verified_seq = EXCLUDED.verified_seq, verified_hash = EXCLUDED.verified_hash,
             verified_at = EXCLUDED.verified_at, checked_at = EXCLUDED.checked_at,
             broken_row_id = EXCLUDED.broken_row_id, problem = EXCLUDED.problem",
    )
    .bind(check.day)
    .bind(check.verified_seq)
    .bind(&check.verified_hash)
    .bind(check.verified_at)
    .bind(check.checked_at)
    .bind(check.broken_row_id)
    .bind(&check.problem)
    .execute(db)
    .await?;
    Ok(())
}

/// The chain as its checks last found it, in one reading.
#[tracing::instrument(skip_all)]
pub async fn status(db: impl PgExecutor<'_> + Copy) -> sqlx::Result<ChainStatus> {
    let checks = day_checks(db).await?;
    if let Some(broken) = checks.iter().find(|c| c.problem.is_some()) {
        return Ok(ChainStatus::Broken {
            day: broken.day,
            row_id: broken.broken_row_id,
            problem: broken.problem.clone().unwrap_or_default(),
            checked_at: broken.checked_at,
        });
    }
    let (written, checked_rows): (Option<i64>, Option<i64>) = sqlx::query_as(
        "SELECT (SELECT sum(seq) FROM audit_chain_heads)::bigint,
                (SELECT sum(verified_seq) FROM audit_chain_checks)::bigint",
    )
    .fetch_one(db)
    .await?;
    let written = written.unwrap_or(0);
    let Some(newest) = checks.iter().max_by_key(|c| c.checked_at) else {
        return Ok(if written == 0 {
            ChainStatus::Empty
        } else {
            ChainStatus::NotChecked
        });
    };
    let rows = checked_rows.unwrap_or(0);
    Ok(ChainStatus::Verified {
        checked_at: newest.checked_at,
        rows,
        unchecked_rows: (written - rows).max(0),
    })
}
