//! The restore drill of docs/deploy.md, as the suite runs it: money moves
//! through a real `vaultcap serve`, the cluster is backed up (roles with
//! `pg_dumpall --globals-only`, the database with `pg_dump`), restored into
//! a new cluster, and the ledger, the reservations and the audit log with
//! its hash chain must be the same there; `vaultcap audit verify` passes on
//! the restored copy.

use std::process::Command;

use server::{
    cli::bench::{issue_key, stripe_answering, BenchDatabase, ServeProcess},
    embedded_pg::{EmbeddedPostgres, DATABASE},
};
use sqlx::PgPool;

/// Runs a PostgreSQL tool, failing the test with what it said.
fn run(mut command: Command) -> String {
    let output = command.output().unwrap();
    assert!(
        output.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// What a restore must keep to the cent and to the byte.
async fn books(
    pool: &PgPool,
) -> (
    Vec<(i64, i64, i64, i64)>,
    Vec<(i64, String, i64)>,
    Vec<(i64, Vec<u8>)>,
) {
    let keys = sqlx::query_as(
        "SELECT id, cap_cents, spent_cents, reserved_cents FROM vault_keys ORDER BY id",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let reservations =
        sqlx::query_as("SELECT id, state::text, amount_cents FROM reservations ORDER BY id")
            .fetch_all(pool)
            .await
            .unwrap();
    let audit = sqlx::query_as("SELECT id, row_hash FROM audit_log ORDER BY id")
        .fetch_all(pool)
        .await
        .unwrap();
    (keys, reservations, audit)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_backup_restored_into_a_new_cluster_keeps_the_ledger_and_an_unbroken_audit_chain() {
    let db = BenchDatabase::start().await.unwrap();
    let (secret, _key) = issue_key(&db.pool, app::domain::Cents(1_500))
        .await
        .unwrap();
    let env = db.serve_env(&stripe_answering("ch_drill").await.unwrap());
    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_vaultcap"));
    let proxy = ServeProcess::start(binary, &env, &db.scratch().join("serve.log"))
        .await
        .unwrap();
    let client = reqwest::Client::new();
    let mut answers = Vec::new();
    for n in 0..20 {
        let answer = client
            .post(format!("{}/v1/charges", proxy.base))
            .bearer_auth(&secret)
            .header("idempotency-key", format!("drill-{n}"))
            .form(&[("amount", "100"), ("currency", "usd")])
            .send()
            .await
            .unwrap();
        answers.push(answer.status().as_u16());
    }
    proxy.stop().await.unwrap();
    assert_eq!(answers.iter().filter(|s| **s == 200).count(), 15);
    assert_eq!(answers.iter().filter(|s| **s == 402).count(), 5);
    let before = books(&db.pool).await;
    assert_eq!(before.0, [(1, 1_500, 1_500, 0)]);
    assert_eq!(before.2.len(), 20, "one audit row per call");

    // Back up: the roles (the application role the migrations made), then
    // the database in pg_dump's custom format.
    let backup = db.scratch().join("backup");
    std::fs::create_dir_all(&backup).unwrap();
    let globals = backup.join("globals.sql");
    let dump = backup.join("vaultcap.dump");
    let mut dumpall = db.pg.client("pg_dumpall");
    dumpall.arg("--globals-only").arg("-f").arg(&globals);
    run(dumpall);
    let mut pg_dump = db.pg.client("pg_dump");
    pg_dump
        .args(["--format=custom", "-d", DATABASE, "-f"])
        .arg(&dump);
    run(pg_dump);

    // Restore into a new cluster: roles first (the one that exists there
    // already, postgres, is said to and skipped), then the database.
    let restored = EmbeddedPostgres::start(&db.scratch().join("restored"))
        .await
        .unwrap();
    let mut roles = restored.client("psql");
    roles.args(["-d", "postgres", "-q", "-f"]).arg(&globals);
    run(roles);
    let mut pg_restore = restored.client("pg_restore");
    pg_restore
        .args(["--exit-on-error", "-d", DATABASE])
        .arg(&dump);
    run(pg_restore);
    let restored_pool = PgPool::connect(&restored.url(DATABASE)).await.unwrap();
    assert_eq!(books(&restored_pool).await, before);

    // The chain verifies in the restored copy, day by day from its first row.
    let verified = Command::new(binary)
        .args(["audit", "verify"])
        .env("DATABASE_URL", restored.url(DATABASE))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&verified.stdout);
    assert!(
        verified.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&verified.stderr)
    );
    assert!(
        said.contains("Chain verified up to row #20 of those written on"),
        "{said}"
    );
    restored_pool.close().await;
    restored.stop().await.unwrap();
    db.stop().await.unwrap();
}
