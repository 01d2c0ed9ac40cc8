//! Where the console's long, historical reads go: the audit log and its
//! export, the action log, spend charts and reconciliation listings. A
//! streaming replica when `--read-database-url` names one, else the
//! primary. Money decisions, alerts, approvals and every write use
//! [`AppState::pool`](super::AppState), never this.

use sqlx::PgPool;

use crate::domain::ReplicaLag;

#[derive(Clone)]
pub struct Reads {
    pub pool: PgPool,
    /// `Some` when reads go to a replica: how far it may trail the primary
    /// before pages say so.
    notice_after: Option<chrono::Duration>,
}

impl Reads {
    /// Reads from the primary itself: always current.
    pub fn primary(pool: PgPool) -> Self {
        Self {
            pool,
            notice_after: None,
        }
    }

    /// Reads from a streaming replica; pages say so once it trails the
    /// primary by more than `notice_after`.
    pub fn replica(pool: PgPool, notice_after: chrono::Duration) -> Self {
        Self {
            pool,
            notice_after: Some(notice_after),
        }
    }

    /// How far the replica trails `primary`, when by more than the notice
    /// threshold. Caught up means it has replayed all the primary had
    /// written a moment ago; otherwise it is as old as the last transaction
    /// it replayed (or, before its first, as its own start).
    pub async fn lag(&self, primary: &PgPool) -> Result<Option<ReplicaLag>, sqlx::Error> {
        let Some(notice_after) = self.notice_after else {
            return Ok(None);
        };
        let written: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
            .fetch_one(primary)
            .await?;
        let behind_ms: Option<f64> = sqlx::query_scalar(
            "SELECT CASE WHEN pg_last_wal_replay_lsn() >= $1::pg_lsn THEN 0
                    ELSE EXTRACT(epoch FROM clock_timestamp() - COALESCE(
                             pg_last_xact_replay_timestamp(), pg_postmaster_start_time())) * 1000
                    END::float8",
        )
        .bind(written)
        .fetch_one(&self.pool)
        .await?;
        let behind = chrono::Duration::milliseconds(behind_ms.unwrap_or(0.0).ceil() as i64);
        Ok((behind > notice_after).then(|| ReplicaLag::of(behind)))
    }
}
