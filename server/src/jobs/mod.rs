//! Background work `vaultcap serve` runs beside the HTTP server.

use std::future::Future;

use sqlx::PgPool;

pub mod notifier;
pub mod unknown_outcomes;

/// Runs `job` unless another instance of the fleet is running the job
/// named `name` right now (then `None`: that instance's round serves for
/// both). The claim is a transaction-scoped advisory lock, held by an open
/// transaction while the job runs on other connections: it goes with the
/// connection if this process dies, and it works through a pooler in
/// transaction mode, where a session lock could be taken on one server
/// connection and released on another.
pub async fn once_in_fleet<T>(
    pool: &PgPool,
    name: &str,
    job: impl Future<Output = T>,
) -> Result<Option<T>, sqlx::Error> {
    let mut claim = pool.begin().await?;
    let mine: bool = sqlx::query_scalar(
        "SELECT pg_try_advisory_xact_lock(hashtextextended('vaultcap.job:' || $1, 0))",
    )
    .bind(name)
    .fetch_one(&mut *claim)
    .await?;
    if !mine {
        return Ok(None);
    }
    let done = job.await;
    claim.rollback().await?;
    Ok(Some(done))
}
