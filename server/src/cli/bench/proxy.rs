//! `vaultcap bench proxy`: the proxy's added latency and metered throughput,
//! measured against an instant local upstream, with durable reservations and
//! audit rows in a private PostgreSQL cluster made for the run (and removed
//! after it), next to pgbench's simple-update figure on the same cluster.
//!
//! Client, proxy and upstream share this process and the machine's cores,
//! so the figures are an upper bound on what the proxy adds.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{bail, Context};
use app::ssr::{AppState, AuthConfig};
use axum::{routing::post, Json, Router};
use clap::Args;

use super::{issue_keys, serve, BenchDatabase};
use crate::{
    embedded_pg::EmbeddedPostgres,
    http,
    proxy::upstream::{StripeSecret, Upstream},
};

#[derive(Debug, Args)]
pub struct ProxyBenchArgs {
    /// Requests per measurement.
    #[arg(long, default_value_t = 5000)]
    requests: usize,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Seconds pgbench runs for the comparison.
    #[arg(long, default_value_t = 10)]
    pgbench_seconds: u32,
}

pub async fn run(args: ProxyBenchArgs) -> anyhow::Result<()> {
    let db = BenchDatabase::start().await?;
    let result = measure(&db, &args).await;
    db.stop().await?;
    result
}

async fn measure(db: &BenchDatabase, args: &ProxyBenchArgs) -> anyhow::Result<()> {
    let pool = &db.pool;
    let upstream_addr = serve(Router::new().route(
        "/v1/charges",
        post(|| async { Json(serde_json::json!({ "id": "ch_bench", "object": "charge" })) }),
    ))
    .await?;
    let upstream_base = format!("http://{upstream_addr}");
    let state = AppState {
        leptos_options: leptos::config::LeptosOptions::builder()
            .output_name("vaultcap")
            .build(),
        pool: pool.clone(),
        auth: Arc::new(AuthConfig::default()),
        cap_increases: Default::default(),
        password_checks: Default::default(),
        key_policy: Default::default(),
        stripe_configured: true,
    };
    let upstream = Upstream::new(
        &upstream_base,
        Some(StripeSecret::new("sk_bench".into())),
        Duration::from_secs(30),
    )?;
    let proxy_addr = serve(http::router(state, upstream, pool.clone())).await?;
    let proxy_base = format!("http://{proxy_addr}");

    // Caps no run can reach.
    let keys = issue_keys(pool, 101, 1_000_000_000_000).await?;
    let (hot, spread) = keys.split_first().context("keys were issued")?;
    let spread: Vec<String> = spread.iter().map(|(secret, _)| secret.clone()).collect();

    println!(
        "vaultcap bench proxy: {} requests per run, {} in flight",
        args.requests, args.concurrency
    );
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency)
        .build()?;
    let mut spread_rate = 0.0;
    // Warm connections and caches on both paths.
    fire(
        &client,
        &upstream_base,
        &[String::from("sk_bench")],
        500,
        args.concurrency,
    )
    .await?;
    fire(&client, &proxy_base, &spread, 500, args.concurrency).await?;

    let direct_key = [String::from("sk_bench")];
    println!("\nlatency                p50        p99      calls/s");
    for in_flight in [args.concurrency, 1] {
        let requests = if in_flight == 1 { 1_000 } else { args.requests };
        let direct = fire(&client, &upstream_base, &direct_key, requests, in_flight).await?;
        let proxied = fire(&client, &proxy_base, &spread, requests, in_flight).await?;
        direct.print(&format!("direct, {in_flight} in flight"));
        proxied.print(&format!("proxy, {in_flight} in flight"));
        println!(
            "{:<20} {:>7.2} ms {:>7.2} ms   (targets: <= 1 ms p50, <= 5 ms p99)",
            "added",
            proxied.p50() - direct.p50(),
            proxied.p99() - direct.p99()
        );
        if in_flight == args.concurrency {
            spread_rate = proxied.rate();
        }
    }

    let hot_run = fire(
        &client,
        &proxy_base,
        std::slice::from_ref(&hot.0),
        args.requests,
        args.concurrency,
    )
    .await?;
    println!("\nmetered throughput");
    println!("100 keys     {spread_rate:>9.0} calls/s");
    println!("1 hot key    {:>9.0} calls/s", hot_run.rate());

    let audited: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_log")
        .fetch_one(pool)
        .await?;
    let spent: i64 = sqlx::query_scalar("SELECT sum(spent_cents)::bigint FROM vault_keys")
        .fetch_one(pool)
        .await?;
    println!(
        "audit rows {audited}, spent {spent} cents (every proxied call metered: {})",
        audited * 100 == spent
    );

    let tps = pgbench(&db.pg, args.pgbench_seconds, args.concurrency.min(16))?;
    println!(
        "pgbench simple-update {tps:.0} tps (same cluster, {} clients)",
        args.concurrency.min(16)
    );
    println!(
        "ratio: 100 keys {:.2}x, hot key {:.2}x of pgbench (targets: >= 0.5x, >= 0.2x)",
        spread_rate / tps,
        hot_run.rate() / tps
    );
    Ok(())
}

struct Run {
    latencies_ms: Vec<f64>,
    elapsed: Duration,
}

impl Run {
    fn percentile(&self, p: f64) -> f64 {
        let index = ((self.latencies_ms.len() as f64 - 1.0) * p).round() as usize;
        self.latencies_ms[index]
    }
    fn p50(&self) -> f64 {
        self.percentile(0.50)
    }
    fn p99(&self) -> f64 {
        self.percentile(0.99)
    }
    fn rate(&self) -> f64 {
        self.latencies_ms.len() as f64 / self.elapsed.as_secs_f64()
    }
    fn print(&self, name: &str) {
        println!(
            "{name:<20} {:>7.2} ms {:>7.2} ms {:>9.0}",
            self.p50(),
            self.p99(),
            self.rate()
        );
    }
}

/// `total` charges of 100 cents, each for another customer, `concurrency`
/// at a time, keys in turn.
async fn fire(
    client: &reqwest::Client,
    base: &str,
    keys: &[String],
    total: usize,
    concurrency: usize,
) -> anyhow::Result<Run> {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (client, url, keys, next) = (
            client.clone(),
            format!("{base}/v1/charges"),
            keys.to_vec(),
            next.clone(),
        );
        workers.spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if n >= total {
                    return Ok::<_, anyhow::Error>(latencies);
                }
                let sent = Instant::now();
                let response = client
                    .post(&url)
                    .bearer_auth(&keys[n % keys.len()])
                    .header("content-type", "application/x-www-form-urlencoded")
                    // One charge per customer, as a billing run makes them:
                    // the duplicate guard looks each customer up.
                    .body(format!(
                        "amount=100&currency=usd&customer=cus_bench&metadata%5Bcustomer_id%5D=cust_{n}"
                    ))
                    .send()
                    .await?;
                if !response.status().is_success() {
                    bail!(
                        "{url} answered {}: {}",
                        response.status(),
                        response.text().await.unwrap_or_default()
                    );
                }
                response.bytes().await?;
                latencies.push(sent.elapsed().as_secs_f64() * 1000.0);
            }
        });
    }
    let mut latencies_ms = Vec::with_capacity(total);
    for batch in workers.join_all().await {
        latencies_ms.extend(batch?);
    }
    let elapsed = started.elapsed();
    latencies_ms.sort_by(f64::total_cmp);
    Ok(Run {
        latencies_ms,
        elapsed,
    })
}

/// pgbench's simple-update transactions per second on the same cluster.
fn pgbench(pg: &EmbeddedPostgres, seconds: u32, clients: usize) -> anyhow::Result<f64> {
    let init = pg
        .pgbench("postgres")
        .args(["-i", "-q", "-s", "10"])
        .output()
        .context("running pgbench -i")?;
    if !init.status.success() {
        bail!(
            "pgbench -i failed: {}",
            String::from_utf8_lossy(&init.stderr)
        );
    }
    let run = pg
        .pgbench("postgres")
        .args([
            "-b",
            "simple-update",
            "-n",
            "-c",
            &clients.to_string(),
            "-j",
            "2",
            "-T",
            &seconds.to_string(),
        ])
        .output()
        .context("running pgbench")?;
    let out = String::from_utf8_lossy(&run.stdout);
    out.lines()
        .find_map(|line| {
            line.strip_prefix("tps = ")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .with_context(|| format!("no tps in pgbench output: {out}"))
}
