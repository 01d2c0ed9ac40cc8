//! `vaultcap serve` as a user starts it: the real binary, no DATABASE_URL,
//! a private PostgreSQL cluster from the machine's binaries.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::TcpStream,
    os::unix::fs::PermissionsExt,
    process::{Command, Stdio},
};

#[test]
fn serve_without_a_database_url_runs_a_private_cluster_and_stops_it_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    // Run as root, PostgreSQL runs as the postgres user, who must get in.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut serve = Command::new(env!("CARGO_BIN_EXE_vaultcap"))
        .args(["serve", "--addr", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .env_remove("DATABASE_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();

    let mut stdout = BufReader::new(serve.stdout.take().unwrap()).lines();
    let first = stdout.next().unwrap().unwrap();
    assert!(
        first.starts_with("First start: created the admin admin@localhost with password "),
        "{first}"
    );
    let _warning = stdout.next().unwrap().unwrap();
    let url_line = stdout.next().unwrap().unwrap();
    let address = url_line
        .strip_prefix("Vaultcap console: http://")
        .expect(&url_line)
        .to_owned();

    let mut health = TcpStream::connect(&address).unwrap();
    health
        .write_all(b"GET /healthz HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut response = String::new();
    health.read_to_string(&mut response).unwrap();
    assert!(
        response.starts_with("HTTP/1.0 200") && response.ends_with("ok"),
        "{response}"
    );

    let pid_file = dir.path().join("postgres/postmaster.pid");
    assert!(pid_file.exists(), "the private cluster is running");

    // In the private cluster too, the application is not the owner of its
    // logs: it connects as `vaultcap`, a member of vaultcap_app.
    let verify = Command::new(env!("CARGO_BIN_EXE_vaultcap"))
        .args(["audit", "verify", "--data-dir"])
        .arg(dir.path())
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&verify.stdout);
    assert!(verify.status.success(), "{printed}");
    assert!(
        printed
            .contains("The application connects as vaultcap, which can only append to the logs."),
        "{printed}"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(serve.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = serve.wait().unwrap();
    assert!(status.success(), "serve exits cleanly: {status}");
    assert!(!pid_file.exists(), "the private cluster was stopped");
}

/// SIGTERM while a charge is at Stripe: serve stops taking new calls but
/// finishes that one (forwarded, answered, settled, audited) before exiting.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_finishes_the_calls_in_flight() {
    in_flight_at_sigterm(false).await;
}

/// The same when the billing job has hung up meanwhile (its timeout, a
/// load generator ending its run): the call has reserved, Stripe charges,
/// so it is settled and audited before serve exits, not left pending.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_settles_a_call_whose_client_hung_up() {
    in_flight_at_sigterm(true).await;
}

async fn in_flight_at_sigterm(client_hangs_up: bool) {
    use std::sync::Arc;

    use axum::{routing::post, Json, Router};
    use server::cli::bench::{issue_key, serve, BenchDatabase};
    use tokio::sync::Notify;

    let db = BenchDatabase::start().await.unwrap();
    let (secret, key) = issue_key(&db.pool, app::domain::Cents(10_000))
        .await
        .unwrap();

    // A Stripe that holds the charge until the test lets it answer.
    let (arrived, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let stripe = Router::new().route(
        "/v1/charges",
        post({
            let (arrived, release) = (arrived.clone(), release.clone());
            move || async move {
                arrived.notify_one();
                release.notified().await;
                Json(serde_json::json!({ "id": "ch_in_flight", "object": "charge" }))
            }
        }),
    );
    let env = db.serve_env(&format!("http://{}", serve(stripe).await.unwrap()));
    let mut proxy = start_serve(&db, &env).await;

    let charge = tokio::spawn(
        reqwest::Client::new()
            .post(format!("{}/v1/charges", proxy.base))
            .bearer_auth(&secret)
            .form(&[("amount", "2500"), ("currency", "usd")])
            .send(),
    );
    arrived.notified().await;
    let charge = if client_hangs_up {
        charge.abort();
        // Its connection is closed once the aborted task is dropped.
        assert!(charge.await.unwrap_err().is_cancelled());
        None
    } else {
        Some(charge)
    };
    proxy.signal(nix::sys::signal::Signal::SIGTERM).unwrap();
    assert_eq!(
        proxy.next_line().await.as_deref(),
        Some("Shutting down: finishing the calls in flight")
    );
    release.notify_one();

    if let Some(charge) = charge {
        let answer = charge.await.unwrap().unwrap();
        assert_eq!(answer.status(), 200);
        let body: serde_json::Value =
            serde_json::from_slice(&answer.bytes().await.unwrap()).unwrap();
        assert_eq!(body["id"], "ch_in_flight");
    }
    proxy.wait().await.unwrap();

    let (spent, reserved): (i64, i64) =
        sqlx::query_as("SELECT spent_cents, reserved_cents FROM vault_keys WHERE id = $1")
            .bind(key.id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!((spent, reserved), (2500, 0), "the call settled before exit");
    let audited: Vec<(String, Option<String>)> =
        sqlx::query_as("SELECT decision, stripe_object_id FROM audit_log WHERE vault_key_id = $1")
            .bind(key.id)
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        audited,
        [("allowed".to_owned(), Some("ch_in_flight".to_owned()))]
    );
    db.stop().await.unwrap();
}

/// `vaultcap audit verify` as an operator runs it on a server of their own:
/// the application's role from DATABASE_URL, migrations as the owner. It
/// passes on an honest log and names the row a superuser changed.
#[tokio::test(flavor = "multi_thread")]
async fn audit_verify_names_the_row_a_superuser_changed() {
    use server::{cli::bench::BenchDatabase, db};

    let db = BenchDatabase::start().await.unwrap();
    db::ensure_login_role(&mut db.pool.acquire().await.unwrap(), "vaultcap")
        .await
        .unwrap();
    let owner_url = db.url();
    let app_url = owner_url.replacen("postgres://postgres@", "postgres://vaultcap@", 1);
    assert_ne!(app_url, owner_url);
    let verify = || {
        let output = Command::new(env!("CARGO_BIN_EXE_vaultcap"))
            .args(["audit", "verify"])
            .env("DATABASE_URL", &app_url)
            .env("VAULTCAP_MIGRATION_DATABASE_URL", &owner_url)
            .output()
            .unwrap();
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    sqlx::query(
        "INSERT INTO audit_log (request_id, method, path, amount_cents, decision)
         SELECT gen_random_uuid(), 'POST', '/v1/charges', 500 * n, 'allowed'
         FROM generate_series(1, 20) AS n",
    )
    .execute(&db.pool)
    .await
    .unwrap();

    let (ok, stdout, stderr) = verify();
    assert!(ok, "{stdout}{stderr}");
    assert!(stdout.contains("Checked 1 day and 20 rows"), "{stdout}");
    assert!(
        stdout.contains("The application connects as vaultcap, which can only append"),
        "{stdout}"
    );
    assert!(
        stdout.contains("Chain verified up to row #20 of those written on"),
        "{stdout}"
    );

    sqlx::raw_sql(
        "ALTER TABLE audit_log DISABLE TRIGGER audit_log_append_only;
         UPDATE audit_log SET amount_cents = 1 WHERE chain_seq = 13;
         ALTER TABLE audit_log ENABLE TRIGGER audit_log_append_only;",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let changed: i64 = sqlx::query_scalar("SELECT id FROM audit_log WHERE chain_seq = 13")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let (ok, stdout, stderr) = verify();
    assert!(!ok, "{stdout}");
    assert!(
        stderr.contains(&format!(
            "the audit log's hash chain is broken: audit row {changed} (#13 of"
        )),
        "{stderr}"
    );
    db.stop().await.unwrap();
}

/// Instances over one database must agree on what they share: a second
/// instance started with another alert webhook refuses to start and names
/// the flag and both values (it used to start, claim notifications and
/// deliver them to nobody); started with --replace-fleet-settings, it
/// starts and its webhook becomes the fleet's.
#[tokio::test(flavor = "multi_thread")]
async fn an_instance_whose_settings_disagree_with_the_fleet_refuses_to_start() {
    use server::cli::bench::BenchDatabase;

    let db = BenchDatabase::start().await.unwrap();
    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_vaultcap"));
    let env = |webhook: &str| {
        vec![
            ("DATABASE_URL", db.url()),
            ("VAULTCAP_ALERT_WEBHOOKS", webhook.to_owned()),
        ]
    };
    let first = start_serve(&db, &env("http://127.0.0.1:9/first")).await;

    let odd = tokio::process::Command::new(binary)
        .args(["serve", "--addr", "127.0.0.1:0"])
        .envs(env("http://127.0.0.1:9/odd"))
        .kill_on_drop(true)
        .output();
    let odd = tokio::time::timeout(std::time::Duration::from_secs(60), odd)
        .await
        .expect("the disagreeing instance exits instead of serving")
        .unwrap();
    let said = String::from_utf8_lossy(&odd.stderr);
    assert!(!odd.status.success());
    assert!(
        said.contains(
            r#"--alert-webhook is ["http://127.0.0.1:9/odd"] here and ["http://127.0.0.1:9/first"] in the fleet"#
        ),
        "{said}"
    );

    let mut replacing = env("http://127.0.0.1:9/odd");
    replacing.push(("VAULTCAP_REPLACE_FLEET_SETTINGS", "true".to_owned()));
    let second = start_serve(&db, &replacing).await;
    let fleet: serde_json::Value =
        sqlx::query_scalar("SELECT value FROM fleet_settings WHERE flag = '--alert-webhook'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(fleet, serde_json::json!(["http://127.0.0.1:9/odd"]));
    first.stop().await.unwrap();
    second.stop().await.unwrap();
    db.stop().await.unwrap();
}

/// Behind a load balancer, SIGTERM first drains: /readyz answers 503 so the
/// balancer's health check takes the instance out, while calls that still
/// arrive are served; only then does the listener close.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_drains_readyz_answers_503_while_calls_are_still_served() {
    use server::cli::bench::{issue_key, stripe_answering, BenchDatabase};

    let db = BenchDatabase::start().await.unwrap();
    let (secret, _key) = issue_key(&db.pool, app::domain::Cents(10_000))
        .await
        .unwrap();
    let mut env = db.serve_env(&stripe_answering("ch_drained").await.unwrap());
    env.push(("VAULTCAP_DRAIN_SECS", "3".to_owned()));
    let mut proxy = start_serve(&db, &env).await;
    let client = reqwest::Client::new();
    let readyz = format!("{}/readyz", proxy.base);
    let ready = || client.get(&readyz).send();
    assert_eq!(ready().await.unwrap().status(), 200);

    proxy.signal(nix::sys::signal::Signal::SIGTERM).unwrap();
    assert_eq!(
        proxy.next_line().await.as_deref(),
        Some("Draining: /readyz answers 503 for 3 s while calls are still served")
    );
    let draining = ready().await.unwrap();
    assert_eq!(draining.status(), 503);
    assert_eq!(draining.text().await.unwrap(), "draining");
    let charge = client
        .post(format!("{}/v1/charges", proxy.base))
        .bearer_auth(&secret)
        .form(&[("amount", "2500"), ("currency", "usd")])
        .send()
        .await
        .unwrap();
    assert_eq!(
        charge.status(),
        200,
        "a call arriving while draining is served"
    );

    assert_eq!(
        proxy.next_line().await.as_deref(),
        Some("Shutting down: finishing the calls in flight")
    );
    proxy.wait().await.unwrap();
    db.stop().await.unwrap();
}

/// With --audit-retention-months, one instance archives the months out of
/// retention at start and then hourly, as the schema's owner: the month's
/// file is written, recorded, and the month dropped.
#[tokio::test(flavor = "multi_thread")]
async fn serve_archives_the_months_out_of_retention() {
    let db = server::cli::bench::BenchDatabase::start().await.unwrap();
    // Calls written in January: behind the chaining trigger, which would
    // give them today's day.
    let mut tx = db.pool.begin().await.unwrap();
    for statement in [
        "SET LOCAL session_replication_role = replica",
        "INSERT INTO audit_log (request_id, method, path, decision, chain_day, chain_seq, row_hash)
         SELECT gen_random_uuid(), 'POST', '/v1/charges', 'refused_unknown_key', '2026-01-15', n,
                sha256(int4send(n))
         FROM generate_series(1, 3) AS n",
    ] {
        sqlx::query(statement).execute(&mut *tx).await.unwrap();
    }
    tx.commit().await.unwrap();
    let archive = db.scratch().join("archive");
    let mut env = db.serve_env("http://127.0.0.1:9");
    env.push(("VAULTCAP_AUDIT_RETENTION_MONTHS", "0".into()));
    env.push(("VAULTCAP_AUDIT_ARCHIVE_DIR", archive.display().to_string()));
    let serve = start_serve(&db, &env).await;

    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let (rows, file): (i64, String) = loop {
        let archived = sqlx::query_as("SELECT rows, file FROM audit_archives")
            .fetch_optional(&db.pool)
            .await
            .unwrap();
        if let Some(archived) = archived {
            break archived;
        }
        assert!(std::time::Instant::now() < deadline, "nothing was archived");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(rows, 3);
    assert_eq!(
        std::path::PathBuf::from(file),
        archive.join("audit_log_history.csv.gz")
    );
    assert!(archive.join("audit_log_history.csv.gz").is_file());
    let gone: bool = sqlx::query_scalar("SELECT to_regclass('audit_log_history') IS NULL")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(gone, "the month is dropped once archived");
    serve.stop().await.unwrap();
    db.stop().await.unwrap();
}

/// The real `vaultcap serve` over `db` with `env`, ready, its log in the
/// run's scratch directory.
async fn start_serve(
    db: &server::cli::bench::BenchDatabase,
    env: &[(&str, String)],
) -> server::cli::bench::ServeProcess {
    server::cli::bench::ServeProcess::start(
        std::path::Path::new(env!("CARGO_BIN_EXE_vaultcap")),
        env,
        &db.scratch().join("serve.log"),
    )
    .await
    .unwrap()
}
