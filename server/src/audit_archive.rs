//! Archiving whole months of the audit log. A monthly partition (or the
//! partition of the rows from before partitioning) that has fallen out of
//! retention is written to a gzipped CSV file, read back to count its rows
//! and take its SHA-256, recorded in `audit_archives` and the action log,
//! and only then dropped, with its days' hash chain heads and checks.
//!
//! The partition is detached first (concurrently: calls go on being
//! audited meanwhile), so no row can arrive while it is copied; only
//! months that have ended are archived, so detaching never takes the
//! month calls are written into. A run that stops midway leaves the
//! detached table whole (or half-detached), and the next run finishes it
//! and archives it. Dropping a
//! month needs the schema's owner (the application's own role cannot drop
//! its logs): `vaultcap audit archive` and serve's retention connect as the
//! owner (VAULTCAP_MIGRATION_DATABASE_URL when it is set).

use std::{
    fs::File,
    io::{BufReader, BufWriter, Read, Write},
    path::{Path, PathBuf},
};

use anyhow::{ensure, Context};
use chrono::{Datelike, NaiveDate};
use flate2::{read::GzDecoder, write::GzEncoder, Compression};
use futures::TryStreamExt;
use sha2::{Digest, Sha256};
use sqlx::{postgres::PgConnectOptions, ConnectOptions, Connection, PgConnection};

use app::actions::sql::{self as actions, Actor};

/// A partition archived: where, how many rows, and the file's checksum.
#[derive(Debug)]
pub struct Archived {
    pub partition: String,
    pub file: PathBuf,
    pub rows: u64,
    pub sha256: String,
}

/// The first day of the month `months` before the one `today` is in: the
/// oldest day retention keeps.
pub fn keep_from(today: NaiveDate, months: u32) -> NaiveDate {
    today.with_day(1).expect("every month has a first day") - chrono::Months::new(months)
}

/// Months made ahead of the one being written.
const MONTHS_AHEAD: i32 = 3;

/// Makes this month's and the next months' partitions that are missing
/// (the application's role may call the function that does, as the owner).
pub async fn add_partitions(pool: &sqlx::PgPool) -> sqlx::Result<i32> {
    sqlx::query_scalar("SELECT audit_log_add_partitions($1)")
        .bind(MONTHS_AHEAD)
        .fetch_one(pool)
        .await
}

/// Serve's retention: archives the months before the last `months` ones
/// into `dir`, connected as the schema's owner.
pub async fn apply_retention(
    owner: &PgConnectOptions,
    months: u32,
    dir: &Path,
) -> anyhow::Result<Vec<Archived>> {
    let mut conn = owner.connect().await?;
    let before = keep_from(chrono::Utc::now().date_naive(), months);
    let archived = archive_before(&mut conn, before, dir, Actor::System).await;
    conn.close().await?;
    archived
}

/// Archives every partition holding only days before `before` (at most
/// the first day of this month) into `dir`, oldest first.
pub async fn archive_before(
    owner: &mut PgConnection,
    before: NaiveDate,
    dir: &Path,
    actor: Actor,
) -> anyhow::Result<Vec<Archived>> {
    let this_month = chrono::Utc::now()
        .date_naive()
        .with_day(1)
        .expect("every month has a first day");
    ensure!(
        before <= this_month,
        "only months that have ended can be archived: {before} is after {this_month}, the first \
         day of this month"
    );
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut archived = Vec::new();
    for partition in archivable(owner, before).await? {
        archived.push(archive(owner, &partition, dir, actor).await?);
    }
    Ok(archived)
}

/// Audit log partitions ending on or before `before`, and tables a run that
/// stopped midway detached, oldest first.
async fn archivable(conn: &mut PgConnection, before: NaiveDate) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar(
        r#"SELECT c.relname::text
           FROM pg_class c
           WHERE c.relkind = 'r' AND c.relnamespace = current_schema()::regnamespace
             AND c.relname ~ '^audit_log_([0-9]{4}_[0-9]{2}|history)$'
             AND (NOT c.relispartition
                  OR (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([0-9-]+)''\)'))[1]::date <= $1)
           ORDER BY c.relname <> 'audit_log_history', c.relname"#,
    )
    .bind(before)
    .fetch_all(conn)
    .await
}

async fn archive(
    conn: &mut PgConnection,
    partition: &str,
    dir: &Path,
    actor: Actor,
) -> anyhow::Result<Archived> {
    // The name matched archivable()'s pattern: safe to write into SQL.
    // Detached CONCURRENTLY: a plain detach would queue for an exclusive
    // lock on the whole log behind any long export, and every call's audit
    // row would queue behind it. One a stopped run left half-detached is
    // finished.
    let (attached, pending): (bool, bool) = sqlx::query_as(
        "SELECT c.relispartition, coalesce(i.inhdetachpending, false)
         FROM pg_class c LEFT JOIN pg_inherits i ON i.inhrelid = c.oid
         WHERE c.oid = $1::regclass",
    )
    .bind(partition)
    .fetch_one(&mut *conn)
    .await?;
    let detach = match (attached, pending) {
        (_, true) => Some("FINALIZE"),
        (true, false) => Some("CONCURRENTLY"),
        (false, _) => None,
    };
    if let Some(how) = detach {
        sqlx::query(&format!(
            "ALTER TABLE audit_log DETACH PARTITION {partition} {how}"
        ))
        .execute(&mut *conn)
        .await
        .with_context(|| format!("detaching {partition}"))?;
    }
    let file = dir.join(format!("{partition}.csv.gz"));
    let partial = dir.join(format!("{partition}.csv.gz.partial"));
    let copied = write_csv(conn, partition, &partial).await?;
    let (rows, sha256) = read_back(&partial)?;
    let (stored, first_day, last_day): (i64, Option<NaiveDate>, Option<NaiveDate>) =
        sqlx::query_as(&format!(
            "SELECT count(*), min(chain_day), max(chain_day) FROM {partition}"
        ))
        .fetch_one(&mut *conn)
        .await?;
    ensure!(
        copied == rows && rows == stored as u64,
        "{partition}: {stored} rows in the table, {copied} copied, {rows} in {}: not dropped",
        partial.display()
    );
    std::fs::rename(&partial, &file)?;
    File::open(dir)?.sync_all()?;

    let mut tx = conn.begin().await?;
    sqlx::query(
        "INSERT INTO audit_archives (partition, first_day, last_day, rows, sha256, file)
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(partition)
    .bind(first_day)
    .bind(last_day)
    .bind(stored)
    .bind(&sha256)
    .bind(file.display().to_string())
    .execute(&mut *tx)
    .await?;
    for table in ["audit_chain_heads", "audit_chain_checks"] {
        sqlx::query(&format!("DELETE FROM {table} WHERE day BETWEEN $1 AND $2"))
            .bind(first_day)
            .bind(last_day)
            .execute(&mut *tx)
            .await?;
    }
    sqlx::query(&format!("DROP TABLE {partition}"))
        .execute(&mut *tx)
        .await?;
    actions::record(
        &mut *tx,
        actor,
        "archive_audit_partition",
        "audit_log",
        Some(partition.to_owned()),
        serde_json::json!({
            "rows": stored, "sha256": sha256, "file": file.display().to_string(),
            "first_day": first_day, "last_day": last_day,
        }),
    )
    .await?;
    tx.commit().await?;
    tracing::info!(partition, rows, file = %file.display(), "archived a month of the audit log");
    Ok(Archived {
        partition: partition.to_owned(),
        file,
        rows,
        sha256,
    })
}

/// COPYs the table, oldest row first, into a gzipped CSV with a header;
/// returns the rows copied (COPY sends each row, and the header, in a
/// message of its own).
async fn write_csv(conn: &mut PgConnection, table: &str, path: &Path) -> anyhow::Result<u64> {
    let out = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut gz = GzEncoder::new(BufWriter::new(out), Compression::default());
    let mut messages = conn
        .copy_out_raw(&format!(
            "COPY (SELECT * FROM {table} ORDER BY chain_day, chain_seq) TO STDOUT \
             WITH (FORMAT csv, HEADER)"
        ))
        .await?;
    let mut sent = 0u64;
    while let Some(message) = messages.try_next().await? {
        gz.write_all(&message)?;
        sent += 1;
    }
    let out = gz.finish()?.into_inner().map_err(|e| e.into_error())?;
    out.sync_all()?;
    Ok(sent.saturating_sub(1))
}

/// What the file on disk holds: its data rows (records after the header,
/// as a CSV reader reads them) and its SHA-256, in one streaming read.
fn read_back(path: &Path) -> anyhow::Result<(u64, String)> {
    let mut file = Hashing {
        inner: BufReader::new(File::open(path)?),
        hash: Sha256::new(),
    };
    let rows = csv::Reader::from_reader(GzDecoder::new(&mut file))
        .into_records()
        .try_fold(0u64, |n, record| record.map(|_| n + 1))?;
    // The gzip trailer after the last record is part of the file.
    std::io::copy(&mut file, &mut std::io::sink())?;
    Ok((rows, hex::encode(file.hash.finalize())))
}

/// A reader that hashes what passes through it.
struct Hashing<R> {
    inner: R,
    hash: Sha256,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}
