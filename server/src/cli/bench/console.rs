//! `vaultcap bench console`: server time to render the console's busiest
//! pages (overview, keys list, a key's page) with many keys and a large
//! audit log, in a private PostgreSQL cluster made for the run.
//!
//! Requests go through the whole router (sessions, auth, SSR) in this
//! process, one at a time, so the figures are the server's own time to
//! produce each page, network excluded.

use std::{sync::Arc, time::Instant};

use anyhow::{ensure, Context};
use app::{
    actions::sql::Actor,
    domain::{BillingPeriod, Email, Role},
    operators::accounts,
    ssr::{AppState, AuthConfig, Reads},
};
use axum::{body::Body, http::Request, Router};
use clap::Args;
use tower::ServiceExt;

use super::{quantile, BenchDatabase};
use crate::{cli::audit_rows, http, proxy::upstream::Upstream};

#[derive(Debug, Args)]
pub struct ConsoleBenchArgs {
    /// Vault keys, spread over this billing period and the two before it.
    #[arg(long, default_value_t = 1000)]
    keys: u32,
    /// Audit rows generated over those keys.
    #[arg(long, default_value_t = 10_000_000)]
    audit_rows: u64,
    /// Timed requests per page (after 20 untimed ones).
    #[arg(long, default_value_t = 200)]
    requests: usize,
}

const PASSWORD: &str = "bench-password-long-enough";

pub async fn run(args: ConsoleBenchArgs) -> anyhow::Result<()> {
    BenchDatabase::around(async |db| measure(db, &args).await).await
}

async fn measure(db: &BenchDatabase, args: &ConsoleBenchArgs) -> anyhow::Result<()> {
    let pool = &db.pool;
    println!(
        "vaultcap bench console: {} keys, {} audit rows, {} requests per page",
        args.keys, args.audit_rows, args.requests
    );
    load(pool, args.keys, args.audit_rows).await?;
    let stats: i64 = sqlx::query_scalar("SELECT count(*) FROM call_stats")
        .fetch_one(pool)
        .await?;
    println!("call_stats rows: {stats}");

    let state = AppState {
        leptos_options: leptos::config::LeptosOptions::builder()
            .output_name("vaultcap")
            .build(),
        pool: pool.clone(),
        reads: Reads::primary(pool.clone()),
        auth: Arc::new(AuthConfig::default()),
        cap_increases: Default::default(),
        password_checks: Default::default(),
        stripe_configured: false,
        key_policy: Default::default(),
    };
    let upstream = Upstream::new(
        "http://127.0.0.1:9",
        None,
        std::time::Duration::from_secs(1),
    )?;
    let router = http::router(state, upstream, pool.clone());
    let cookie = sign_in(pool, &router).await?;
    let busiest: i64 =
        sqlx::query_scalar("SELECT id FROM vault_keys ORDER BY spent_cents DESC, id LIMIT 1")
            .fetch_one(pool)
            .await?;

    println!(
        "{:<34} {:>9} {:>9} {:>9}",
        "page", "p50 ms", "p95 ms", "max ms"
    );
    for path in [
        "/".to_owned(),
        "/keys".to_owned(),
        "/keys?sort=utilization".to_owned(),
        "/keys?at_threshold=1&q=bench".to_owned(),
        format!("/keys/{busiest}"),
    ] {
        let mut times = Vec::with_capacity(args.requests);
        for n in 0..args.requests + 20 {
            let started = Instant::now();
            let body = get(&router, &path, &cookie).await?;
            if n >= 20 {
                times.push(started.elapsed().as_secs_f64() * 1000.0);
            }
            ensure!(body.contains("<h1"), "{path} did not render a page");
        }
        times.sort_by(f64::total_cmp);
        println!(
            "{path:<34} {:>9.2} {:>9.2} {:>9.2}",
            quantile(&times, 0.5),
            quantile(&times, 0.95),
            quantile(&times, 1.0)
        );
    }
    Ok(())
}

/// `keys` vault keys and `audit_rows` generated audit rows over them,
/// vacuumed and analysed: the data the console and audit benches read.
pub(super) async fn load(pool: &sqlx::PgPool, keys: u32, audit_rows: u64) -> anyhow::Result<u64> {
    insert_keys(pool, keys).await?;
    let loading = Instant::now();
    let rows = audit_rows::generate(pool, audit_rows).await?;
    println!(
        "loaded {rows} audit rows in {:.0} s",
        loading.elapsed().as_secs_f64()
    );
    sqlx::query("VACUUM ANALYZE").execute(pool).await?;
    Ok(rows)
}

/// `count` keys over three billing periods with utilizations from 0 to
/// 105 % of the expected total (so some are past their 90 % threshold).
pub(super) async fn insert_keys(pool: &sqlx::PgPool, count: u32) -> anyhow::Result<()> {
    let current = BillingPeriod::containing(chrono::Utc::now());
    let periods = [current, current.previous(), current.previous().previous()]
        .map(|p| p.to_string())
        .to_vec();
    sqlx::query(
        "INSERT INTO vault_keys (secret_hash, secret_prefix, label, billing_period, currency,
             expected_total_cents, cap_cents, spent_cents, allowed_endpoints, expires_at)
         SELECT sha256(convert_to('bench-key-' || n, 'UTF8')), 'vk_' || left(md5(n::text), 8),
                format('bench-%s-%s', period, n), period, 'usd', expected, expected * 11 / 10,
                expected * (abs(hashtext('spent' || n)) % 106) / 100,
                ARRAY['POST /v1/charges'], (period || '-01 00:00:00+00')::timestamptz + interval '1 month'
         FROM generate_series(1, $1) AS n
         CROSS JOIN LATERAL (SELECT ($2::text[])[1 + n % 3] AS period,
                                    100000 + abs(hashtext('expected' || n)) % 10000000 AS expected) k",
    )
    .bind(count as i32)
    .bind(&periods)
    .execute(pool)
    .await?;
    Ok(())
}

async fn sign_in(pool: &sqlx::PgPool, router: &Router) -> anyhow::Result<String> {
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
    let body = format!("email=bench%40example.com&password={PASSWORD}");
    let response = router
        .clone()
        .oneshot(
            Request::post("/auth/login")
                .header("host", "localhost")
                .header("origin", "http://localhost")
                .header("content-type", "application/x-www-form-urlencoded")
                .body(Body::from(body))?,
        )
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

async fn get(router: &Router, path: &str, cookie: &str) -> anyhow::Result<String> {
    let response = router
        .clone()
        .oneshot(
            Request::get(path)
                .header("host", "localhost")
                .header("cookie", cookie)
                .body(Body::empty())?,
        )
        .await?;
    ensure!(
        response.status().is_success(),
        "{path} answered {}",
        response.status()
    );
    let body = axum::body::to_bytes(response.into_body(), usize::MAX).await?;
    Ok(String::from_utf8(body.to_vec())?)
}
