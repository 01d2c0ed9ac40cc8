//! Failed sign-ins, counted per account and per client address to slow down
//! password guessing. Kept in the database so every instance sees them.

use std::net::IpAddr;

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;

pub async fn record(
    db: impl PgExecutor<'_>,
    email: &str,
    ip: Option<IpAddr>,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO login_failures (email, ip) VALUES ($1, $2::inet)")
        .bind(email)
        .bind(ip.map(|ip| ip.to_string()))
        .execute(db)
        .await?;
    Ok(())
}

/// Failures since `since` for the account and for the address.
pub async fn count_since(
    db: impl PgExecutor<'_>,
    email: &str,
    ip: Option<IpAddr>,
    since: DateTime<Utc>,
) -> Result<(i64, i64), sqlx::Error> {
    sqlx::query_as(
        "SELECT count(*) FILTER (WHERE email = $1),
                count(*) FILTER (WHERE ip = $2::inet)
         FROM login_failures
         WHERE failed_at >= $3 AND (email = $1 OR ip = $2::inet)",
    )
    .bind(email)
    .bind(ip.map(|ip| ip.to_string()))
    .bind(since)
    .fetch_one(db)
    .await
}

/// A successful sign-in clears the account's failures; old rows go too.
pub async fn clear(
    db: impl PgExecutor<'_>,
    email: &str,
    older_than: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    sqlx::query("DELETE FROM login_failures WHERE email = $1 OR failed_at < $2")
        .bind(email)
        .bind(older_than)
        .execute(db)
        .await?;
    Ok(())
}
