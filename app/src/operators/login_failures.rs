//! Failed sign-ins, counted per account and per client address to slow down
//! password guessing. Kept in the database so every instance sees them.
//!
//! An attempt is written down as a failure *before* its password is
//! checked, under a lock on its account and address, and forgotten only if
//! the password was right: a burst of parallel guesses cannot all pass the
//! count before any of them is recorded.

use std::net::IpAddr;

use chrono::{DateTime, Duration, Utc};
use sqlx::PgPool;

/// The rules an attempt is measured against.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Failures are counted over this window.
    pub window: Duration,
    /// This many failures per account cost nothing; after them each
    /// attempt waits this long after the last failure, then twice as long…
    pub free_per_account: i64,
    pub first_delay: Duration,
    /// …up to this long.
    pub max_delay: Duration,
    /// An address with this many failures in the window is refused
    /// outright until they age out.
    pub max_per_ip: i64,
}

/// Whether an attempt may check a password.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// Recorded as failure `id` until [`forget`] says otherwise.
    Claimed { id: i64 },
    /// Not now: try again after this long.
    Refused { retry_after: Duration },
}

#[tracing::instrument(skip_all)]
pub async fn claim(
    pool: &PgPool,
    account: &str,
    ip: Option<IpAddr>,
    limits: Limits,
) -> Result<Attempt, sqlx::Error> {
    let ip = ip.map(|ip| ip.to_string());
    let mut tx = pool.begin().await?;
    // Account first, then address, always: no two attempts wait on each
    // other in opposite orders.
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('vaultcap.sign_in:' || $1, 0))")
        .bind(account)
        .execute(&mut *tx)
        .await?;
    if let Some(ip) = &ip {
        sqlx::query(
            "SELECT pg_advisory_xact_lock(hashtextextended('vaultcap.sign_in_ip:' || $1, 0))",
        )
        .bind(ip)
        .execute(&mut *tx)
        .await?;
    }
    #[derive(sqlx::FromRow)]
    struct Counts {
        account_failures: i64,
        last_failure: Option<DateTime<Utc>>,
        ip_failures: i64,
        oldest_ip_failure: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
    }
    let Counts {
        account_failures,
        last_failure,
        ip_failures,
        oldest_ip_failure,
        now,
    } = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE email = $1) AS account_failures,
                max(failed_at) FILTER (WHERE email = $1) AS last_failure,
                count(*) FILTER (WHERE ip = $2::inet) AS ip_failures,
                min(failed_at) FILTER (WHERE ip = $2::inet) AS oldest_ip_failure,
                clock_timestamp() AS now
         FROM login_failures
         WHERE failed_at >= clock_timestamp() - $3::interval AND (email = $1 OR ip = $2::inet)",
    )
    .bind(account)
    .bind(&ip)
    .bind(limits.window)
    .fetch_one(&mut *tx)
    .await?;

    if ip_failures >= limits.max_per_ip {
        let ages_out = oldest_ip_failure.unwrap_or(now) + limits.window;
        return Ok(Attempt::Refused {
            retry_after: ages_out - now,
        });
    }
    if let Some(last) = last_failure {
        let wait = delay(account_failures, limits);
        if now < last + wait {
            return Ok(Attempt::Refused {
                retry_after: last + wait - now,
            });
        }
    }
    let id = sqlx::query_scalar(
        "INSERT INTO login_failures (email, ip, failed_at) VALUES ($1, $2::inet, clock_timestamp())
         RETURNING id",
    )
    .bind(account)
    .bind(&ip)
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Attempt::Claimed { id })
}

/// How long after the last failure the next attempt must wait, given
/// `failures` in the window.
pub fn delay(failures: i64, limits: Limits) -> Duration {
    if failures < limits.free_per_account {
        return Duration::zero();
    }
    let doublings = (failures - limits.free_per_account).min(20) as i32;
    (limits.first_delay * (1 << doublings)).min(limits.max_delay)
}

/// The attempt turned out not to be a failure after all (the password was
/// right, or it was never checked).
#[tracing::instrument(skip_all)]
pub async fn forget(pool: &PgPool, id: i64) -> Result<(), sqlx::Error> {
    sqlx::query("DELETE FROM login_failures WHERE id = $1")
        .bind(id)
        .execute(pool)
        .await?;
    Ok(())
}

/// A successful sign-in clears the account's failures; old rows go too.
#[tracing::instrument(skip_all)]
pub async fn clear(pool: &PgPool, email: &str, window: Duration) -> Result<(), sqlx::Error> {
    sqlx::query("DELETE FROM login_failures WHERE email = $1 OR failed_at < now() - $2::interval")
        .bind(email)
        .bind(window)
        .execute(pool)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_delay_doubles_after_the_free_failures_up_to_the_cap() {
        let limits = Limits {
            window: Duration::minutes(15),
            free_per_account: 5,
            first_delay: Duration::seconds(1),
            max_delay: Duration::seconds(60),
            max_per_ip: 50,
        };
        let waits: Vec<i64> = (3..=13)
            .map(|failures| delay(failures, limits).num_seconds())
            .collect();
        assert_eq!(waits, [0, 0, 1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(delay(i64::MAX, limits).num_seconds(), 60);
    }
}
