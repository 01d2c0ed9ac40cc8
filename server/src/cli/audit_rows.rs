//! Scale data: realistic audit rows, generated inside PostgreSQL (multi-row
//! `INSERT … SELECT`), so tens of millions load in minutes. Every key gets
//! an equal share of calls spread over its billing period up to now, with
//! the mix a busy billing proxy sees: mostly allowed charges, some declined
//! cards, retries recognised as replays, refusals, a few unknown outcomes.
//!
//! The rows are for measuring the console and the audit log at scale: the
//! keys' spent totals are left as they are.

use std::time::Instant;

use anyhow::bail;
use futures::StreamExt;
use sqlx::PgPool;

/// Rows per statement: big enough to be fast, small enough to report
/// progress and keep each transaction short.
const ROWS_PER_STATEMENT: u64 = 500_000;

/// Appends about `rows` audit rows over the existing vault keys, printing
/// progress. Returns how many were appended.
pub async fn generate(pool: &PgPool, rows: u64) -> anyhow::Result<u64> {
    let keys: Vec<i64> = sqlx::query_scalar("SELECT id FROM vault_keys ORDER BY id")
        .fetch_all(pool)
        .await?;
    if keys.is_empty() {
        bail!("there are no vault keys to generate calls for: run `vaultcap demo` first");
    }
    let per_key = rows.div_ceil(keys.len() as u64).max(1);
    let keys_per_statement = (ROWS_PER_STATEMENT / per_key).max(1) as usize;
    let started = Instant::now();
    let mut appended = 0u64;
    let mut statements = futures::stream::iter(keys.chunks(keys_per_statement))
        .map(|chunk| insert(pool, chunk, per_key))
        .buffer_unordered(WORKERS);
    while let Some(rows) = statements.next().await {
        appended += rows?;
        println!(
            "  {appended} audit rows ({:.0} rows/s)",
            appended as f64 / started.elapsed().as_secs_f64()
        );
    }
    Ok(appended)
}

/// Statements running at once: one per core of a small machine.
const WORKERS: usize = 2;

async fn insert(pool: &PgPool, keys: &[i64], per_key: u64) -> anyhow::Result<u64> {
    let mut conn = pool.acquire().await?;
    // Scale data, not money: no need to wait for each commit's flush, and
    // compiling this one-off statement (JIT) costs more than it saves.
    sqlx::query("SET synchronous_commit = off")
        .execute(&mut *conn)
        .await?;
    sqlx::query("SET jit = off").execute(&mut *conn).await?;
    let done = sqlx::query(INSERT_SQL)
        .bind(keys)
        .bind(per_key as i64)
        .execute(&mut *conn)
        .await?;
    sqlx::query("RESET ALL").execute(&mut *conn).await?;
    Ok(done.rows_affected())
}

/// $1: key ids, $2: calls per key.
const INSERT_SQL: &str = "
INSERT INTO audit_log (at, request_id, vault_key_id, key_prefix, method, path, stripe_customer,
    metadata_customer_id, metadata_billing_period, billing_period, amount_cents, currency,
    idempotency_key, decision, upstream_status, stripe_object_id, error_code, latency_ms)
SELECT span.start + (span.finish - span.start) * (i::float8 / $2),
       gen_random_uuid(), k.id, k.secret_prefix, 'POST', '/v1/charges',
       format('cus_%s', lpad(c.n::text, 8, '0')), format('cust_%s', lpad(c.n::text, 6, '0')),
       k.billing_period, k.billing_period, 500 + h.v % 29500, k.currency,
       format('bill-cust_%s-%s-%s', c.n, k.billing_period, i),
       d.decision, d.status,
       CASE WHEN d.status = 200 THEN 'ch_' || left(md5(k.id || ':' || i), 24) END,
       d.error_code, 80 + h.v % 700
FROM vault_keys k
CROSS JOIN LATERAL (
    SELECT (k.billing_period || '-01 00:00:00+00')::timestamptz AS start
) p
CROSS JOIN LATERAL (
    SELECT p.start, greatest(p.start, least(now(), p.start + interval '1 month')) AS finish
) span
CROSS JOIN generate_series(1, $2) AS i
CROSS JOIN LATERAL (SELECT abs(hashtext(k.id || ':' || i)) AS v) h
CROSS JOIN LATERAL (SELECT h.v % 100000 AS n, h.v % 100 AS pick) c
CROSS JOIN LATERAL (
    SELECT CASE WHEN c.pick < 92 THEN 'allowed' WHEN c.pick < 95 THEN 'replay'
                WHEN c.pick < 97 THEN 'refused_cap' WHEN c.pick = 97 THEN 'refused_endpoint'
                WHEN c.pick = 98 THEN 'refused_amount' ELSE 'outcome_unknown' END AS decision,
           CASE WHEN c.pick < 90 OR c.pick BETWEEN 92 AND 94 THEN 200
                WHEN c.pick < 92 THEN 402 END AS status,
           CASE WHEN c.pick BETWEEN 90 AND 91 THEN 'card_declined'
                WHEN c.pick BETWEEN 95 AND 96 THEN 'spend_cap_exceeded'
                WHEN c.pick = 97 THEN 'endpoint_not_allowed'
                WHEN c.pick = 98 THEN 'amount_invalid'
                WHEN c.pick = 99 THEN 'upstream_timeout' END AS error_code
) d
WHERE k.id = ANY($1)";
