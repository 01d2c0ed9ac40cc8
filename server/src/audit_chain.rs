//! The audit log's hash chain, checked from outside the database.
//!
//! Each audit row's `row_hash` is SHA-256(previous row's hash ‖ the row's
//! fields), chained per UTC day of writing and numbered by `chain_seq`; the
//! database computes it as the row is inserted (migration
//! `20261202000018_tamper_evidence.sql`). Here the same hash is computed
//! again, in Rust, from the rows as they are now, so a row changed, deleted
//! or slipped in behind the application's back, by whoever could do it
//! (a superuser disabling the append-only trigger, say), breaks the chain at
//! that row. `vaultcap audit verify` walks every day from its first row;
//! `vaultcap serve` checks new rows each minute and every day again from
//! its first row once a day, and records what it found for the console.

use std::collections::{BTreeMap, BTreeSet};

use app::{
    audit::chain_sql::{self as audit_chain, DayCheck},
    domain::Cents,
};
use chrono::{DateTime, NaiveDate, Utc};
use futures::TryStreamExt;
use sha2::{Digest, Sha256};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

/// Every column of an audit row, in the order the hash takes them. Raw
/// column values on purpose (text, not the domain types): the verifier
/// hashes exactly what is stored, so a value someone changed by hand shows
/// as a broken chain at its row, not as a row that cannot be read.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ChainedRow {
    pub id: i64,
    pub at: DateTime<Utc>,
    pub request_id: Uuid,
    pub vault_key_id: Option<i64>,
    pub key_prefix: Option<String>,
    pub method: String,
    pub path: String,
    pub stripe_customer: Option<String>,
    pub metadata_customer_id: Option<String>,
    pub billing_period: Option<String>,
    pub amount_cents: Option<Cents>,
    pub currency: Option<String>,
    pub idempotency_key: Option<String>,
    pub decision: String,
    pub upstream_status: Option<i16>,
    pub stripe_object_id: Option<String>,
    pub error_code: Option<String>,
    pub latency_ms: Option<i32>,
    pub metadata_billing_period: Option<String>,
    pub message: Option<String>,
    pub chain_day: NaiveDate,
    pub chain_seq: i64,
    pub row_hash: Vec<u8>,
}

/// The columns the hash covers, as `ChainedRow` reads them (`row_hash` is
/// the hash itself). A test compares this list with the table.
pub const HASHED_COLUMNS: &[&str] = &[
    "id",
    "at",
    "request_id",
    "vault_key_id",
    "key_prefix",
    "method",
    "path",
    "stripe_customer",
    "metadata_customer_id",
    "billing_period",
    "amount_cents",
    "currency",
    "idempotency_key",
    "decision",
    "upstream_status",
    "stripe_object_id",
    "error_code",
    "latency_ms",
    "metadata_billing_period",
    "message",
    "chain_day",
    "chain_seq",
];

/// The hash a day's first row follows.
pub fn genesis(day: NaiveDate) -> [u8; 32] {
    Sha256::digest(format!("vaultcap audit chain {}", day.format("%Y-%m-%d"))).into()
}

/// The hash `row` must carry when it follows a row hashed `prev`: each field
/// as text, a 4-byte big-endian length and its UTF-8 bytes, or ff ff ff ff
/// for NULL (the database's `audit_chain_field`).
pub fn row_hash(prev: &[u8], row: &ChainedRow) -> [u8; 32] {
    fn field(hash: &mut Sha256, value: Option<&str>) {
        match value {
            None => hash.update([0xff; 4]),
            Some(text) => {
                hash.update((text.len() as u32).to_be_bytes());
                hash.update(text.as_bytes());
            }
        }
    }
    let mut hash = Sha256::new();
    hash.update(prev);
    let number = |n: Option<i64>| n.map(|n| n.to_string());
    field(&mut hash, Some(&row.id.to_string()));
    field(
        &mut hash,
        Some(&row.at.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()),
    );
    field(&mut hash, Some(&row.request_id.to_string()));
    field(&mut hash, number(row.vault_key_id).as_deref());
    field(&mut hash, row.key_prefix.as_deref());
    field(&mut hash, Some(&row.method));
    field(&mut hash, Some(&row.path));
    field(&mut hash, row.stripe_customer.as_deref());
    field(&mut hash, row.metadata_customer_id.as_deref());
    field(&mut hash, row.billing_period.as_deref());
    field(
        &mut hash,
        number(row.amount_cents.map(|cents| cents.0)).as_deref(),
    );
    field(&mut hash, row.currency.as_deref());
    field(&mut hash, row.idempotency_key.as_deref());
    field(&mut hash, Some(&row.decision));
    field(
        &mut hash,
        number(row.upstream_status.map(i64::from)).as_deref(),
    );
    field(&mut hash, row.stripe_object_id.as_deref());
    field(&mut hash, row.error_code.as_deref());
    field(&mut hash, number(row.latency_ms.map(i64::from)).as_deref());
    field(&mut hash, row.metadata_billing_period.as_deref());
    field(&mut hash, row.message.as_deref());
    field(
        &mut hash,
        Some(&row.chain_day.format("%Y-%m-%d").to_string()),
    );
    field(&mut hash, Some(&row.chain_seq.to_string()));
    hash.finalize().into()
}

/// Where a day's check starts: from its first row, or after a row already
/// verified.
#[derive(Debug, Clone)]
struct Start {
    day: NaiveDate,
    after_seq: i64,
    after_hash: Vec<u8>,
}

impl Start {
    fn first_row(day: NaiveDate) -> Self {
        Self {
            day,
            after_seq: 0,
            after_hash: genesis(day).to_vec(),
        }
    }
}

/// What checking some days found.
#[derive(Debug, Default)]
pub struct Report {
    pub days: usize,
    /// Rows whose hash was computed in this check.
    pub rows: u64,
    /// The earliest day that does not hold.
    pub broken: Option<DayCheck>,
    /// The newest day's last verified row: its day and place.
    pub verified_through: Option<(NaiveDate, i64)>,
}

/// Checks every day between `from` and `to` (inclusive, UTC days of
/// writing; unbounded when `None`) from its first row, and records what it
/// found.
pub async fn verify(
    pool: &PgPool,
    from: Option<NaiveDate>,
    to: Option<NaiveDate>,
) -> anyhow::Result<Report> {
    let from = from.unwrap_or(NaiveDate::MIN);
    let to = to.unwrap_or(NaiveDate::MAX);
    let days = chain_days(pool).await?;
    let starts = days
        .into_iter()
        .filter(|day| (from..=to).contains(day))
        .map(Start::first_row)
        .collect();
    check_days(pool, starts).await
}

/// `vaultcap serve`'s check: each day's rows written since its last check,
/// and a day last checked over a day ago again from its first row. A day
/// found broken stays broken (until `vaultcap audit verify` finds it whole).
pub async fn check_new_rows(pool: &PgPool) -> anyhow::Result<Report> {
    let checks: BTreeMap<NaiveDate, DayCheck> = audit_chain::day_checks(pool)
        .await?
        .into_iter()
        .map(|check| (check.day, check))
        .collect();
    let heads: BTreeMap<NaiveDate, i64> =
        sqlx::query_as::<_, (NaiveDate, i64)>("SELECT day, seq FROM audit_chain_heads")
            .fetch_all(pool)
            .await?
            .into_iter()
            .collect();
    let stale = Utc::now() - chrono::Duration::days(1);
    let mut starts = Vec::new();
    for day in chain_days(pool).await? {
        match checks.get(&day) {
            Some(check) if check.problem.is_some() => {}
            Some(check) if check.checked_at < stale => starts.push(Start::first_row(day)),
            Some(check) if heads.get(&day) == Some(&check.verified_seq) => {}
            Some(check) => starts.push(Start {
                day,
                after_seq: check.verified_seq,
                after_hash: check.verified_hash.clone(),
            }),
            None => starts.push(Start::first_row(day)),
        }
    }
    check_days(pool, starts).await
}

/// `check_new_rows` by one instance of the fleet at a time (the others skip
/// the round), logging what it found.
pub async fn check_in_background(pool: &PgPool) -> anyhow::Result<()> {
    let Some(report) =
        crate::jobs::once_in_fleet(pool, "audit_chain", check_new_rows(pool)).await?
    else {
        return Ok(());
    };
    if let Some(broken) = report?.broken {
        tracing::error!(
            day = %broken.day,
            row = ?broken.broken_row_id,
            problem = broken.problem.as_deref().unwrap_or_default(),
            "the audit log's hash chain is broken"
        );
    }
    Ok(())
}

async fn check_days(pool: &PgPool, starts: Vec<Start>) -> anyhow::Result<Report> {
    let mut report = Report::default();
    for start in starts {
        let (check, rows) = check_day(pool, &start).await?;
        audit_chain::record_check(pool, &check).await?;
        report.days += 1;
        report.rows += rows;
        if check.problem.is_some() {
            report.broken.get_or_insert(check);
        } else if check.verified_seq > 0
            && report
                .verified_through
                .is_none_or(|(day, _)| day <= check.day)
        {
            report.verified_through = Some((check.day, check.verified_seq));
        }
    }
    Ok(report)
}

/// Every day with a chain head, a check or a row (days with rows are found
/// one index probe each, not by reading the rows).
async fn chain_days(pool: &PgPool) -> sqlx::Result<BTreeSet<NaiveDate>> {
    let days: Vec<NaiveDate> = sqlx::query_scalar(
        "WITH RECURSIVE row_days (day) AS (
             SELECT min(chain_day) FROM audit_log
             UNION ALL
             SELECT (SELECT min(chain_day) FROM audit_log WHERE chain_day > row_days.day)
             FROM row_days WHERE row_days.day IS NOT NULL)
         SELECT day FROM row_days WHERE day IS NOT NULL
         UNION SELECT day FROM audit_chain_heads
         UNION SELECT day FROM audit_chain_checks",
    )
    .fetch_all(pool)
    .await?;
    Ok(days.into_iter().collect())
}

/// Walks one day's chain after `start`, in one snapshot, so rows being
/// written meanwhile are neither half seen nor mistaken for strangers.
async fn check_day(pool: &PgPool, start: &Start) -> anyhow::Result<(DayCheck, u64)> {
    let mut tx = pool.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .execute(&mut *tx)
        .await?;
    let head: Option<(i64, Vec<u8>)> =
        sqlx::query_as("SELECT seq, hash FROM audit_chain_heads WHERE day = $1")
            .bind(start.day)
            .fetch_optional(&mut *tx)
            .await?;
    let walk = walk_rows(&mut tx, start).await?;
    tx.commit().await?;

    let mut check = DayCheck {
        day: start.day,
        verified_seq: walk.seq,
        verified_hash: walk.hash.clone(),
        verified_at: walk.at,
        checked_at: Utc::now(),
        broken_row_id: None,
        problem: None,
    };
    let day = start.day;
    let problem = match (walk.broken, head) {
        (Some((row_id, problem)), _) => Some((row_id, problem)),
        (None, None) => Some((
            None,
            format!("the chain head of {day} is missing: it was deleted outside Vaultcap"),
        )),
        (None, Some((head_seq, _))) if head_seq > walk.seq => Some((
            None,
            format!(
                "rows #{} to #{head_seq} of {day} are missing: deleted after they were written",
                walk.seq + 1
            ),
        )),
        (None, Some((head_seq, head_hash))) if head_seq == walk.seq && head_hash != walk.hash => {
            Some((
                walk.last_id,
                format!(
                    "the last row of {day} (#{head_seq}) does not match the day's chain head: \
                     it was changed after it was written"
                ),
            ))
        }
        (None, Some(_)) => None,
    };
    if let Some((row_id, problem)) = problem {
        check.broken_row_id = row_id;
        check.problem = Some(problem);
    }
    Ok((check, walk.rows))
}

#[derive(Debug)]
struct Walk {
    /// The last row that held, and its hash.
    seq: i64,
    hash: Vec<u8>,
    at: Option<DateTime<Utc>>,
    last_id: Option<i64>,
    rows: u64,
    broken: Option<(Option<i64>, String)>,
}

async fn walk_rows(conn: &mut PgConnection, start: &Start) -> sqlx::Result<Walk> {
    let day = start.day;
    let mut walk = Walk {
        seq: start.after_seq,
        hash: start.after_hash.clone(),
        at: None,
        last_id: None,
        rows: 0,
        broken: None,
    };
    let mut rows = sqlx::query_as::<_, ChainedRow>(
        "SELECT id, at, request_id, vault_key_id, key_prefix, method, path, stripe_customer,
                metadata_customer_id, billing_period, amount_cents, currency, idempotency_key,
                decision, upstream_status, stripe_object_id, error_code, latency_ms,
                metadata_billing_period, message, chain_day, chain_seq, row_hash
         FROM audit_log WHERE chain_day = $1 AND chain_seq > $2 ORDER BY chain_seq",
    )
    .bind(day)
    .bind(start.after_seq)
    .fetch(conn);
    while let Some(row) = rows.try_next().await? {
        // Each row counts against the runtime's cooperative budget, not
        // only each socket read (which brings many rows). Without it the
        // walk of a minute of rows under load (0.5-0.8 s of decoding and
        // hashing) held its worker thread for tens of milliseconds at a
        // time, and the tasks queued behind it (the ledger writer, the
        // calls) waited as long: writes took 35-131 ms instead of 5.
        tokio::task::coop::consume_budget().await;
        walk.rows += 1;
        let expected = walk.seq + 1;
        if row.chain_seq != expected {
            walk.broken = Some((
                Some(row.id),
                format!(
                    "row #{expected} of {day} is missing before audit row {} (#{}): deleted \
                     after it was written",
                    row.id, row.chain_seq
                ),
            ));
            break;
        }
        if row_hash(&walk.hash, &row)[..] != row.row_hash[..] {
            walk.broken = Some((
                Some(row.id),
                format!(
                    "audit row {} (#{} of {day}) does not match its hash: it, or the row before \
                     it, was changed after it was written",
                    row.id, row.chain_seq
                ),
            ));
            break;
        }
        walk.seq = row.chain_seq;
        walk.hash = row.row_hash;
        walk.at = Some(row.at);
        walk.last_id = Some(row.id);
    }
    Ok(walk)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row() -> ChainedRow {
        ChainedRow {
            id: 7,
            at: DateTime::parse_from_rfc3339("2026-12-02T03:04:05.000006Z")
                .unwrap()
                .into(),
            request_id: Uuid::nil(),
            vault_key_id: Some(3),
            key_prefix: Some("vk_live_ab".into()),
            method: "POST".into(),
            path: "/v1/charges".into(),
            stripe_customer: None,
            metadata_customer_id: Some("cus_1".into()),
            billing_period: Some("2026-12".into()),
            amount_cents: Some(Cents(1_999)),
            currency: Some("usd".into()),
            idempotency_key: Some("k-1".into()),
            decision: "allowed".into(),
            upstream_status: Some(200),
            stripe_object_id: Some("ch_1".into()),
            error_code: None,
            latency_ms: Some(12),
            metadata_billing_period: None,
            message: None,
            chain_day: NaiveDate::from_ymd_opt(2026, 12, 2).unwrap(),
            chain_seq: 1,
            row_hash: vec![],
        }
    }

    #[test]
    fn every_field_changes_the_hash() {
        let prev = genesis(row().chain_day);
        let original = row_hash(&prev, &row());
        let changes: Vec<fn(&mut ChainedRow)> = vec![
            |r| r.amount_cents = Some(Cents(1_998)),
            |r| r.amount_cents = None,
            |r| r.stripe_customer = Some(String::new()),
            |r| r.at += chrono::Duration::microseconds(1),
            |r| r.decision = "refused_cap".into(),
            |r| r.chain_seq = 2,
            // Moving a byte from one field to the next is a change too.
            |r| {
                r.method = "POS".into();
                r.path = "T/v1/charges".into();
            },
        ];
        for change in changes {
            let mut changed = row();
            change(&mut changed);
            assert_ne!(row_hash(&prev, &changed), original, "{changed:?}");
        }
        assert_ne!(
            row_hash(&[0; 32], &row()),
            original,
            "the previous hash counts"
        );
    }
}
