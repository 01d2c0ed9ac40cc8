//! `vaultcap bench audit`: the audit log at scale. Server time of the audit
//! page (first page, and a page 100,000 rows deep) for each filter alone and
//! three combined, then a CSV export of about a million rows against
//! psql's COPY of the same rows, with the server's peak memory. Runs a real
//! `vaultcap serve` child over a private PostgreSQL cluster made for the run.

use std::time::Instant;

use anyhow::{ensure, Context};
use app::{
    actions::sql::Actor,
    domain::{AuditQuery, Email, Role},
    operators::accounts,
};
use clap::Args;
use sqlx::{PgPool, Postgres, QueryBuilder};

use super::{console::load, quantile, BenchDatabase, ServeProcess};

#[derive(Debug, Args)]
pub struct AuditBenchArgs {
    /// Audit rows generated before measuring.
    #[arg(long, default_value_t = 10_000_000)]
    rows: u64,
    /// Vault keys the rows are spread over.
    #[arg(long, default_value_t = 1000)]
    keys: u32,
    /// Timed requests per page (after 5 untimed ones).
    #[arg(long, default_value_t = 40)]
    requests: usize,
    /// Rows the CSV export measurement exports (about).
    #[arg(long, default_value_t = 1_000_000)]
    export_rows: i64,
}

const PASSWORD: &str = "bench-password-long-enough";
/// How deep the deep page starts.
const DEPTH: i64 = 100_000;

pub async fn run(args: AuditBenchArgs) -> anyhow::Result<()> {
    BenchDatabase::around(async |db| measure(db, &args).await).await
}

async fn measure(db: &BenchDatabase, args: &AuditBenchArgs) -> anyhow::Result<()> {
    let pool = &db.pool;
    println!(
        "vaultcap bench audit: {} audit rows over {} keys, {} requests per page",
        args.rows, args.keys, args.requests
    );
    load(pool, args.keys, args.rows).await?;

    let binary = std::env::current_exe().context("finding the vaultcap binary")?;
    let server = ServeProcess::start(
        &binary,
        &[("DATABASE_URL", db.url())],
        &db.scratch().join("serve.log"),
    )
    .await?;
    let client = reqwest::Client::new();
    let cookie = sign_in(pool, &server.base).await?;

    println!(
        "\n{:<34} {:>10} {:>10} {:>10} {:>10}",
        "audit page, 50 rows", "first p50", "first p95", "deep p50", "deep p95"
    );
    for (name, query) in filters(pool).await? {
        let first = time_page(&client, &server.base, &cookie, &query, args.requests).await?;
        let deep = match deep_cursor(pool, &query).await? {
            Some(after) => {
                let deep = format!("{query}&after={after}");
                Some(time_page(&client, &server.base, &cookie, &deep, args.requests).await?)
            }
            None => None,
        };
        let (deep50, deep95) = deep
            .map(|(p50, p95)| (format!("{p50:.2}"), format!("{p95:.2}")))
            .unwrap_or_else(|| ("< 100k".into(), "rows".into()));
        println!(
            "{name:<34} {:>10.2} {:>10.2} {deep50:>10} {deep95:>10}",
            first.0, first.1
        );
    }

    export(db, &client, &server, &cookie, args.export_rows).await?;
    server.stop().await
}

/// Each filter alone with a value the data has, then three combined.
async fn filters(pool: &PgPool) -> anyhow::Result<Vec<(&'static str, String)>> {
    let sample: (i64, String, String, String, String, String) = sqlx::query_as(
        "SELECT vault_key_id, billing_period, stripe_customer, metadata_customer_id, idempotency_key,
                (SELECT stripe_object_id FROM audit_log WHERE stripe_object_id IS NOT NULL ORDER BY id DESC LIMIT 1)
         FROM audit_log ORDER BY id DESC LIMIT 1",
    )
    .fetch_one(pool)
    .await?;
    let (key, period, customer, customer_id, idempotency, object) = sample;
    let week_ago = (chrono::Utc::now() - chrono::Duration::days(7)).format("%Y-%m-%d");
    Ok(vec![
        ("no filter", "limit=50".into()),
        ("key", format!("key={key}")),
        ("billing period", format!("period={period}")),
        ("Stripe customer", format!("customer={customer}")),
        (
            "customer_id (metadata)",
            format!("customer_id={customer_id}"),
        ),
        ("endpoint", "endpoint=/v1/charges".into()),
        ("decision allowed", "decision=allowed".into()),
        ("decision refused_cap", "decision=refused_cap".into()),
        ("any refusal", "decision=refused".into()),
        ("Stripe status 402", "status=402".into()),
        (
            "amount 100.00 to 120.00",
            "currency=usd&min_amount=100&max_amount=120".into(),
        ),
        ("idempotency key", format!("idempotency_key={idempotency}")),
        ("Stripe object", format!("object={object}")),
        ("last 7 days", format!("from={week_ago}")),
        (
            "period + any refusal + amount",
            format!("period={period}&decision=refused&currency=usd&min_amount=100"),
        ),
    ])
}

/// p50 and p95 in milliseconds of `requests` GETs of the audit page.
async fn time_page(
    client: &reqwest::Client,
    base: &str,
    cookie: &str,
    query: &str,
    requests: usize,
) -> anyhow::Result<(f64, f64)> {
    let url = format!("{base}/audit?{query}&limit=50");
    let mut times = Vec::with_capacity(requests);
    for n in 0..requests + 5 {
        let started = Instant::now();
        let page = client.get(&url).header("cookie", cookie).send().await?;
        ensure!(
            page.status().is_success(),
            "{url} answered {}",
            page.status()
        );
        let body = page.text().await?;
        if n >= 5 {
            times.push(started.elapsed().as_secs_f64() * 1000.0);
        }
        ensure!(!body.contains("panel-error"), "{url} showed an error");
    }
    times.sort_by(f64::total_cmp);
    Ok((quantile(&times, 0.5), quantile(&times, 0.95)))
}

/// The position `DEPTH` rows down the filtered order, if there are that many.
async fn deep_cursor(pool: &PgPool, query: &str) -> anyhow::Result<Option<String>> {
    let filter = AuditQuery::from_pairs(form_urlencoded::parse(query.as_bytes())).parse()?;
    let mut sql = QueryBuilder::<Postgres>::new("SELECT a.at, a.id FROM audit_log a");
    app::audit::sql::push_filter(&mut sql, &filter);
    sql.push(" ORDER BY a.at DESC, a.id DESC OFFSET ")
        .push_bind(DEPTH)
        .push(" LIMIT 1");
    let row: Option<(chrono::DateTime<chrono::Utc>, i64)> =
        sql.build_query_as().fetch_optional(pool).await?;
    Ok(row.map(|(at, id)| app::domain::Position { at, id }.encode()))
}

/// Exports about `rows` rows through the server and through psql's COPY.
async fn export(
    db: &BenchDatabase,
    client: &reqwest::Client,
    server: &ServeProcess,
    cookie: &str,
    rows: i64,
) -> anyhow::Result<()> {
    let from: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT at FROM audit_log ORDER BY at DESC, id DESC OFFSET $1 LIMIT 1")
            .bind(rows - 1)
            .fetch_one(&db.pool)
            .await?;
    let from_param = from.to_rfc3339_opts(chrono::SecondsFormat::Micros, true);

    let started = Instant::now();
    let response = client
        .get(format!("{}/audit.csv", server.base))
        .query(&[("from", &from_param)])
        .header("cookie", cookie)
        .send()
        .await?;
    ensure!(
        response.status().is_success(),
        "the export answered {}",
        response.status()
    );
    let (mut bytes, mut lines) = (0usize, 0usize);
    let mut response = response;
    while let Some(chunk) = response.chunk().await? {
        bytes += chunk.len();
        lines += chunk.iter().filter(|b| **b == b'\n').count();
    }
    let ours = started.elapsed().as_secs_f64();
    let peak = peak_rss_mb(server.pid().context("serve's pid")?)?;

    let filter = AuditQuery {
        from: Some(from_param.clone()),
        ..AuditQuery::default()
    }
    .parse()?;
    // The same statement the export runs, through psql's own COPY client.
    let copy_sql = app::audit::sql::export_copy(&filter);
    let started = Instant::now();
    let out = tokio::process::Command::new("psql")
        .arg(db.url())
        .arg("-qAt")
        .arg("-c")
        .arg(&copy_sql)
        .output()
        .await
        .context("running psql (the PostgreSQL client)")?;
    let theirs = started.elapsed().as_secs_f64();
    ensure!(
        out.status.success(),
        "psql failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let copied = out.stdout.iter().filter(|b| **b == b'\n').count();

    let rows = lines.saturating_sub(1);
    println!("\nCSV export of {rows} rows ({:.0} MB)", bytes as f64 / 1e6);
    println!(
        "  vaultcap /audit.csv  {ours:>7.2} s  {:>9.0} rows/s  peak RSS of vaultcap serve {peak:.0} MB",
        rows as f64 / ours
    );
    println!(
        "  psql COPY            {theirs:>7.2} s  {:>9.0} rows/s  ({copied} rows)",
        copied as f64 / theirs
    );
    let ratio = (rows as f64 / ours) / (copied as f64 / theirs);
    println!("  throughput ratio {ratio:.2} (target >= 0.9), peak RSS target <= 100 MB");
    ensure!(
        ratio >= 0.9 && peak <= 100.0,
        "the export missed its target: {ratio:.2} of psql's rows/s, {peak:.0} MB peak RSS"
    );
    Ok(())
}

/// The process's peak resident memory so far (VmHWM), in MB.
fn peak_rss_mb(pid: u32) -> anyhow::Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("VmHWM in /proc/pid/status")?;
    Ok(kb / 1024.0)
}

async fn sign_in(pool: &PgPool, base: &str) -> anyhow::Result<String> {
    let email = Email::parse("bench@example.com")?;
    accounts::add_operator(
        pool,
        Actor::Cli,
        &email,
        Role::Viewer,
        Some(PASSWORD.into()),
    )
    .await
    .map_err(|e| anyhow::anyhow!("adding the bench operator: {e}"))?;
    let no_redirects = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let response = no_redirects
        .post(format!("{base}/auth/login"))
        .header("origin", base)
        .form(&[("email", "bench@example.com"), ("password", PASSWORD)])
        .send()
        .await?;
    let cookie = response
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with("vaultcap_session="))
        .and_then(|v| v.split(';').next())
        .context("signing in set no session cookie")?;
    Ok(cookie.to_owned())
}
