//! The audit log by month: partitions the application's own role makes
//! ahead of time (and still cannot rewrite, detach or drop), and a month out
//! of retention archived to a gzipped CSV, with its count and checksum
//! recorded, before it is dropped.

use std::io::Read;

use chrono::{Datelike, NaiveDate};
use sha2::{Digest, Sha256};
use sqlx::{Connection, PgConnection, PgPool};

use crate::helpers::{app_pool, audit_rows};
use app::actions::sql::Actor;
use server::{audit_archive::archive_before, audit_chain::verify};

fn this_month() -> NaiveDate {
    chrono::Utc::now().date_naive().with_day(1).unwrap()
}

fn partition_of(month: NaiveDate) -> String {
    format!("audit_log_{}", month.format("%Y_%m"))
}

async fn owner_connection(owner: &PgPool) -> PgConnection {
    PgConnection::connect_with(&owner.connect_options())
        .await
        .unwrap()
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn the_application_makes_months_ahead_and_cannot_rewrite_or_drop_one(owner: PgPool) {
    let app = app_pool(&owner, 1);
    let made: i32 = sqlx::query_scalar("SELECT audit_log_add_partitions(3)")
        .fetch_one(&app)
        .await
        .unwrap();
    assert_eq!(made, 0, "the migration made them already");
    let partitions: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
         WHERE i.inhparent = 'audit_log'::regclass ORDER BY 1",
    )
    .fetch_all(&app)
    .await
    .unwrap();
    let mut expected: Vec<String> = (0..4)
        .map(|n| partition_of(this_month() + chrono::Months::new(n)))
        .collect();
    expected.push("audit_log_history".into());
    assert_eq!(partitions, expected);

    audit_rows(&app, 2).await;
    let (partition, ids): (String, Vec<i64>) = sqlx::query_as(
        "SELECT min(tableoid::regclass::text), array_agg(id ORDER BY id) FROM audit_log",
    )
    .fetch_one(&app)
    .await
    .unwrap();
    assert_eq!(partition, partition_of(this_month()));
    assert_eq!(ids, [1, 2], "ids as before partitioning, one after another");

    let this = partition_of(this_month());
    for statement in [
        format!("UPDATE {this} SET amount_cents = 1"),
        format!("DELETE FROM {this}"),
        format!("TRUNCATE {this}"),
        format!("DROP TABLE {this}"),
        format!("ALTER TABLE audit_log DETACH PARTITION {this}"),
        format!(
            "INSERT INTO {this} (request_id, method, path, decision)
             VALUES (gen_random_uuid(), 'GET', '/', 'refused_unknown_key')"
        ),
        // As GENERATED ALWAYS refused it before partitioning.
        "INSERT INTO audit_log (id, request_id, method, path, decision)
         VALUES (99, gen_random_uuid(), 'GET', '/', 'refused_unknown_key')"
            .to_owned(),
        "SELECT setval('audit_log_id_seq', 1)".to_owned(),
    ] {
        let refused = sqlx::query(&statement).execute(&app).await;
        let code = refused
            .as_ref()
            .err()
            .and_then(|e| e.as_database_error())
            .and_then(|e| e.code())
            .map(|c| c.into_owned());
        assert!(
            code.as_deref() == Some("42501"),
            "{statement} is refused: {refused:?}"
        );
    }
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_month_out_of_retention_is_archived_to_gzipped_csv_then_dropped(owner: PgPool) {
    let app = app_pool(&owner, 1);
    // Three calls written in January, before partitioning began: the
    // chaining trigger gives every row today's day, so they are written as a
    // superuser with triggers off, with January's chain day.
    let mut conn = owner_connection(&owner).await;
    let mut tx = conn.begin().await.unwrap();
    sqlx::query("SET LOCAL session_replication_role = replica")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO audit_log (id, request_id, method, path, decision, message, chain_day, chain_seq, row_hash)
         SELECT nextval('audit_log_id_seq'), gen_random_uuid(), 'POST', '/v1/charges', 'refused_unknown_key',
                E'a message, \"quoted\"\nover two lines', '2026-01-15', n, sha256(int4send(n))
         FROM generate_series(1, 3) AS n",
    )
    .execute(&mut *tx)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO audit_chain_heads (day, seq, hash) VALUES ('2026-01-15', 3, sha256(int4send(3)))",
    )
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    audit_rows(&app, 2).await;

    let dir = tempfile::tempdir().unwrap();
    let archived = archive_before(&mut conn, this_month(), dir.path(), Actor::Cli)
        .await
        .unwrap();
    assert_eq!(archived.len(), 1, "{archived:?}");
    let month = &archived[0];
    assert_eq!(
        (month.partition.as_str(), month.rows),
        ("audit_log_history", 3)
    );

    // The file holds the three rows, whole, and is what the checksum says.
    let mut bytes = Vec::new();
    std::fs::File::open(&month.file)
        .unwrap()
        .read_to_end(&mut bytes)
        .unwrap();
    assert_eq!(hex::encode(Sha256::digest(&bytes)), month.sha256);
    let mut csv = csv::Reader::from_reader(flate2::read::GzDecoder::new(bytes.as_slice()));
    let header = csv.headers().unwrap().clone();
    assert_eq!(&header[0], "id");
    let records: Vec<csv::StringRecord> = csv.records().map(Result::unwrap).collect();
    assert_eq!(records.len(), 3);
    let column = |name: &str| header.iter().position(|h| h == name).unwrap();
    assert!(records
        .iter()
        .all(|r| &r[column("chain_day")] == "2026-01-15"
            && &r[column("message")] == "a message, \"quoted\"\nover two lines"));

    // Recorded, dropped with its day's chain head, and in the action log.
    let (rows, sha256): (i64, String) = sqlx::query_as(
        "SELECT rows, sha256 FROM audit_archives WHERE partition = 'audit_log_history'",
    )
    .fetch_one(&app)
    .await
    .unwrap();
    assert_eq!((rows, sha256.as_str()), (3, month.sha256.as_str()));
    let (gone, heads, left, logged): (bool, i64, i64, i64) = sqlx::query_as(
        "SELECT to_regclass('audit_log_history') IS NULL,
                (SELECT count(*) FROM audit_chain_heads WHERE day = '2026-01-15'),
                (SELECT count(*) FROM audit_log),
                (SELECT count(*) FROM operator_actions WHERE action = 'archive_audit_partition')",
    )
    .fetch_one(&app)
    .await
    .unwrap();
    assert_eq!((gone, heads, left, logged), (true, 0, 2, 1));
    let report = verify(&app, None, None).await.unwrap();
    assert!(report.broken.is_none(), "this month's chain still holds");
    assert_eq!(report.rows, 2);

    // Nothing more is old enough; this month is never archived.
    assert!(
        archive_before(&mut conn, this_month(), dir.path(), Actor::Cli)
            .await
            .unwrap()
            .is_empty()
    );
    let refused = archive_before(
        &mut conn,
        this_month() + chrono::Months::new(1),
        dir.path(),
        Actor::Cli,
    )
    .await
    .unwrap_err();
    assert!(
        refused.to_string().contains("only months that have ended"),
        "{refused}"
    );
}

/// A log written before partitioning is attached whole as
/// `audit_log_history` (through the end of the month of its last row), and
/// its chain goes on from where it was.
#[sqlx::test(migrations = false)]
async fn a_log_written_before_partitioning_becomes_its_first_partition(owner: PgPool) {
    let earlier = tempfile::tempdir().unwrap();
    let migrations = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations");
    for entry in std::fs::read_dir(migrations).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        if name.ends_with(".sql") && name.as_str() < "20261203000022" {
            std::fs::copy(&path, earlier.path().join(name)).unwrap();
        }
    }
    sqlx::migrate::Migrator::new(earlier.path())
        .await
        .unwrap()
        .run(&owner)
        .await
        .unwrap();
    let app = app_pool(&owner, 1);
    audit_rows(&app, 5).await;

    server::db::MIGRATOR.run(&owner).await.unwrap();
    let (rows, bound): (i64, String) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM audit_log_history), pg_get_expr(relpartbound, oid)
         FROM pg_class WHERE relname = 'audit_log_history'",
    )
    .fetch_one(&app)
    .await
    .unwrap();
    let next_month = this_month() + chrono::Months::new(1);
    assert_eq!(rows, 5);
    assert_eq!(
        bound,
        format!("FOR VALUES FROM (MINVALUE) TO ('{next_month}')")
    );
    audit_rows(&app, 2).await;
    let (ids, partitions): (Vec<i64>, Vec<String>) = sqlx::query_as(
        "SELECT array_agg(id ORDER BY id), array_agg(DISTINCT tableoid::regclass::text) FROM audit_log",
    )
    .fetch_one(&app)
    .await
    .unwrap();
    assert_eq!(ids, [1, 2, 3, 4, 5, 6, 7]);
    assert_eq!(
        partitions,
        ["audit_log_history"],
        "this month is still history's"
    );
    let report = verify(&app, None, None).await.unwrap();
    assert!(report.broken.is_none(), "{:?}", report.broken);
    assert_eq!(report.rows, 7);
}
