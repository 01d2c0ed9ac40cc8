//! The console's long reads from a streaming replica, as a fleet runs it: a
//! real hot standby made with `pg_basebackup` from the primary, and
//! `vaultcap serve` given both. With replay paused on the standby, the
//! proxy still meters on the primary, while the audit export and the audit
//! log page show the standby's (older) rows and say how far behind it is;
//! the export is recorded in the primary's action log. Once replay resumes
//! the replica catches up and the notice goes.

use std::time::{Duration, Instant};

use app::{
    actions::sql::Actor,
    domain::{ApiScope, Email, Role},
    operators::{accounts, tokens},
};
use server::{
    cli::bench::{issue_key, stripe_answering, BenchDatabase, ServeProcess},
    embedded_pg::DATABASE,
};
use sqlx::PgPool;

const PASSWORD: &str = "a long test password";

/// Waits until the standby has replayed everything the primary had written
/// when asked (at most 30 s).
async fn caught_up(primary: &PgPool, replica: &PgPool) {
    let written: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
        .fetch_one(primary)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let replayed: bool = sqlx::query_scalar("SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn")
            .bind(&written)
            .fetch_one(replica)
            .await
            .unwrap();
        if replayed {
            return;
        }
        assert!(Instant::now() < deadline, "the standby never caught up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Rows in an audit export (its header aside).
async fn exported_rows(client: &reqwest::Client, base: &str, token: &str) -> usize {
    let answer = client
        .get(format!("{base}/api/audit.csv"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let csv = answer.text().await.unwrap();
    csv::Reader::from_reader(csv.as_bytes()).records().count()
}

#[tokio::test(flavor = "multi_thread")]
async fn exports_and_log_pages_read_the_replica_while_the_proxy_meters_on_the_primary() {
    let db = BenchDatabase::start().await.unwrap();
    let (secret, key) = issue_key(&db.pool, app::domain::Cents(1_000))
        .await
        .unwrap();
    let token = tokens::create(
        &db.pool,
        Actor::Cli,
        "replica test",
        &[ApiScope::AuditExport],
        1,
        None,
    )
    .await
    .unwrap()
    .secret
    .plaintext;
    let email = Email::parse("viewer@example.com").unwrap();
    accounts::add_operator(
        &db.pool,
        Actor::Cli,
        &email,
        Role::Viewer,
        Some(PASSWORD.into()),
    )
    .await
    .unwrap();
    let standby = db
        .pg
        .start_standby(&db.scratch().join("standby"))
        .await
        .unwrap();
    let replica = PgPool::connect(&standby.url(DATABASE)).await.unwrap();

    let mut env = db.serve_env(&stripe_answering("ch_replica").await.unwrap());
    env.push(("VAULTCAP_READ_DATABASE_URL", standby.url(DATABASE)));
    env.push(("VAULTCAP_REPLICA_LAG_NOTICE_SECS", "2".into()));
    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_vaultcap"));
    let serve = ServeProcess::start(binary, &env, &db.scratch().join("serve.log"))
        .await
        .unwrap();
    let base = serve.base.clone();
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let charge = |n: usize| {
        client
            .post(format!("{base}/v1/charges"))
            .bearer_auth(&secret)
            .header("idempotency-key", format!("replica-{n}"))
            .form(&[("amount", "100"), ("currency", "usd")])
            .send()
    };
    let signed_in = client
        .post(format!("{base}/auth/login"))
        .header("origin", &base)
        .form(&[("email", email.as_str()), ("password", PASSWORD)])
        .send()
        .await
        .unwrap();
    assert_eq!(signed_in.status(), 303);
    let cookie = signed_in.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let audit_page = || async {
        let page = client
            .get(format!("{base}/audit"))
            .header("cookie", &cookie)
            .send()
            .await
            .unwrap();
        assert_eq!(page.status(), 200);
        page.text().await.unwrap()
    };

    for n in 0..4 {
        assert_eq!(charge(n).await.unwrap().status(), 200);
    }
    caught_up(&db.pool, &replica).await;
    assert_eq!(exported_rows(&client, &base, &token).await, 4);
    assert!(!audit_page().await.contains("data-testid=\"replica-lag\""));

    // The standby stops replaying: the primary goes on alone.
    sqlx::query("SELECT pg_wal_replay_pause()")
        .execute(&replica)
        .await
        .unwrap();
    for n in 4..10 {
        assert_eq!(
            charge(n).await.unwrap().status(),
            200,
            "metered on the primary"
        );
    }
    assert_eq!(
        charge(10).await.unwrap().status(),
        402,
        "the cap holds there"
    );
    let spent: i64 = sqlx::query_scalar("SELECT spent_cents FROM vault_keys WHERE id = $1")
        .bind(key.id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(spent, 1_000);
    assert_eq!(
        exported_rows(&client, &base, &token).await,
        4,
        "the export reads the standby, which has only the first four calls"
    );
    let recorded: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM operator_actions WHERE action = 'export_audit_csv'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(recorded, 2, "each export is recorded on the primary");

    // The page says so once the standby trails by more than the notice's
    // two seconds.
    let deadline = Instant::now() + Duration::from_secs(30);
    let page = loop {
        let page = audit_page().await;
        if page.contains("data-testid=\"replica-lag\"") || Instant::now() > deadline {
            break page;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        page.contains("read from a replica up to "),
        "the audit page says the replica trails: {page}"
    );

    sqlx::query("SELECT pg_wal_replay_resume()")
        .execute(&replica)
        .await
        .unwrap();
    caught_up(&db.pool, &replica).await;
    assert_eq!(exported_rows(&client, &base, &token).await, 11);
    assert!(!audit_page().await.contains("data-testid=\"replica-lag\""));

    serve.stop().await.unwrap();
    replica.close().await;
    standby.stop().await.unwrap();
    db.stop().await.unwrap();
}
