//! `vaultcap bench proxy`: what the proxy costs per metered call, next to
//! the physical bound of durable per-call writes on the same PostgreSQL.
//!
//! Three processes: `wrk` (the client, driven by `charges.lua`), a real
//! `vaultcap serve` child (the proxy), and this one (the instant fake Stripe
//! and the private cluster made for the run). Every charge carries its own
//! Idempotency-Key and customer, as a billing run sends them, so the
//! idempotency check and the duplicate guard run on every call. Loads: the
//! upstream alone, 1/8/64 calls in flight over 100 keys and on one hot key,
//! and twins (every charge sent twice at once), then pgbench's simple-update
//! at the same concurrencies, in every round: each load's ratio is to
//! pgbench in its own round. The proxy's and PostgreSQL's CPU time per call
//! are read from /proc, so a regression shows on a noisy machine too, and
//! the proxy's /metrics tell how busy its one ledger writer was. The CPU
//! per call is also counted in pgbench transactions (PostgreSQL's CPU per
//! pgbench transaction in the same round), which moves with the code and
//! not with the machine's speed: that figure has budgets in
//! `scripts/budgets`. Fails when a budget is broken or a call is
//! unaccounted for, and, unless `--no-targets`, when one of issue 20's
//! targets is missed.

use std::{path::Path, process::Stdio, time::Duration};

use anyhow::{bail, ensure, Context};
use clap::Args;

use super::{issue_keys, serve, BenchDatabase, FakeStripe, ServeProcess};
use crate::embedded_pg::EmbeddedPostgres;
use app::domain::Cents;
use app::keys::sql::VaultKeyRow;

pub(super) const SCRIPT: &str = include_str!("charges.lua");

#[derive(Debug, Args)]
pub struct ProxyBenchArgs {
    /// Seconds each run of a load (and of pgbench) lasts.
    #[arg(long, default_value_t = 4)]
    seconds: u32,
    /// Runs of each load (and of pgbench); the one with the median rate is
    /// printed and checked (this machine's figures vary by a fifth from one
    /// run to the next).
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Do not fail on issue 20's targets (the budgets in scripts/budgets
    /// and the books still fail the run).
    #[arg(long)]
    no_targets: bool,
    /// Load pg_stat_statements (nested statements too) and print the
    /// statements that took the most time over the proxied loads.
    #[arg(long)]
    statements: bool,
    /// A server setting for the run's cluster, `name=value` (repeatable):
    /// to see what a setting does to the figures. Printed with the others.
    #[arg(long = "pg", value_name = "NAME=VALUE", value_parser = pg_setting)]
    pg_settings: Vec<String>,
}

pub async fn run(args: ProxyBenchArgs) -> anyhow::Result<()> {
    let mut settings: Vec<&str> = args.pg_settings.iter().map(String::as_str).collect();
    if args.statements {
        settings.extend([
            "shared_preload_libraries=pg_stat_statements",
            "pg_stat_statements.track=all",
            "pg_stat_statements.track_planning=on",
        ]);
    }
    BenchDatabase::around_with(&settings, async |db| {
        if args.statements {
            sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                .execute(&db.pool)
                .await?;
        }
        measure(db, &args).await
    })
    .await
}

/// A `--pg` setting: passed to the server on its command line, where a
/// space would split it.
fn pg_setting(setting: &str) -> Result<String, String> {
    match setting.split_once('=') {
        Some((name, value)) if !name.is_empty() && !value.is_empty() => {}
        _ => return Err("expected NAME=VALUE, e.g. wal_init_zero=off".into()),
    }
    if setting.contains(char::is_whitespace) {
        return Err("a setting with a space cannot be passed on the server's command line".into());
    }
    Ok(setting.to_owned())
}

/// One load: who is called, how, with how many in flight.
struct Load {
    name: &'static str,
    in_flight: usize,
    target: Target,
    keys: Keys,
    twins: bool,
}

#[derive(Clone, Copy, PartialEq)]
enum Target {
    Upstream,
    Proxy,
}

impl Target {
    fn tag(self) -> &'static str {
        match self {
            Self::Upstream => "direct",
            Self::Proxy => "proxy",
        }
    }
}

#[derive(Clone, Copy)]
enum Keys {
    Spread,
    Hot,
}

const LOADS: &[Load] = &[
    Load::upstream(1),
    Load::upstream(64),
    Load::proxy("100 keys", 1, Keys::Spread, false),
    Load::proxy("100 keys", 8, Keys::Spread, false),
    Load::proxy("100 keys", 64, Keys::Spread, false),
    Load::proxy("1 hot key", 8, Keys::Hot, false),
    Load::proxy("1 hot key", 64, Keys::Hot, false),
    Load::proxy("100 keys, twins", 8, Keys::Spread, true),
    Load::proxy("100 keys, twins", 64, Keys::Spread, true),
];

impl Load {
    const fn upstream(in_flight: usize) -> Self {
        Self {
            name: "direct (no proxy)",
            in_flight,
            target: Target::Upstream,
            keys: Keys::Spread,
            twins: false,
        }
    }

    const fn proxy(name: &'static str, in_flight: usize, keys: Keys, twins: bool) -> Self {
        Self {
            name,
            in_flight,
            target: Target::Proxy,
            keys,
            twins,
        }
    }
}

/// What wrk measured, and the CPU it, the proxy and PostgreSQL spent
/// meanwhile.
pub(super) struct Measured {
    calls: u64,
    seconds: f64,
    pub(super) p50_ms: f64,
    pub(super) p99_ms: f64,
    /// Answers 2xx, 409 (a twin while the first is in flight), other.
    pub(super) ok: u64,
    conflict: u64,
    pub(super) other: u64,
    pub(super) socket_errors: u64,
    pub(super) proxy_cpu: Duration,
    pub(super) postgres_cpu: Duration,
    /// wrk's own CPU time: the client shares the machine's cores too.
    client_cpu: Duration,
    /// What the proxy's ledger writers did meanwhile (proxied loads only).
    batches: Option<Batches>,
    /// The round it ran in, whose pgbench runs it is compared with.
    round: usize,
}

impl Measured {
    pub(super) fn rate(&self) -> f64 {
        self.calls as f64 / self.seconds
    }

    pub(super) fn per_call_ms(&self, cpu: Duration) -> f64 {
        cpu.as_secs_f64() * 1000.0 / self.calls.max(1) as f64
    }

    /// The most calls/s this machine's cores could carry at the CPU per
    /// call measured here (wrk's, the proxy's and PostgreSQL's), were
    /// every core busy with nothing else: a rate target above it needs less
    /// CPU per call, not more overlap.
    fn cpu_ceiling(&self) -> f64 {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let per_call = self.per_call_ms(self.client_cpu + self.proxy_cpu + self.postgres_cpu);
        cores as f64 * 1000.0 / per_call.max(0.001)
    }
}

async fn measure(db: &BenchDatabase, args: &ProxyBenchArgs) -> anyhow::Result<()> {
    let binary = std::env::current_exe().context("finding the vaultcap binary")?;
    let stripe = FakeStripe::default();
    let stripe_base = format!("http://{}", serve(stripe.router()).await?);
    // Caps no run can reach.
    let keys = issue_keys(&db.pool, 101, app::domain::Cents(1_000_000_000_000)).await?;
    let (hot, spread) = keys.split_first().context("keys were issued")?;
    let scratch = db.scratch();
    let hot_file = scratch.join("hot.keys");
    let spread_file = scratch.join("spread.keys");
    write_keys(&hot_file, std::slice::from_ref(hot))?;
    write_keys(&spread_file, spread)?;
    let script = scratch.join("charges.lua");
    std::fs::write(&script, SCRIPT)?;

    let mut env = db.serve_env(&stripe_base);
    env.push(("RUST_LOG", "warn".to_owned()));
    let log = scratch.join("serve.log");
    let proxy = ServeProcess::start(&binary, &env, &log).await?;
    let proxy_pid = proxy.pid().context("the proxy's pid")?;
    let postmaster = db.pg.postmaster_pid()?;

    pgbench_init(&db.pg)?;
    let client = reqwest::Client::new();
    println!(
        "vaultcap bench proxy: {} s per run, the median of {} rounds, each load and pgbench once a round",
        args.seconds,
        args.repeat.max(1)
    );
    println!(
        "PostgreSQL: {}",
        settings(&db.pool, &args.pg_settings).await?
    );
    // Warm connections, caches and plans on both paths.
    let warm = |target: &str, tag: &str| wrk(&script, target, &spread_file, false, 8, 2, tag);
    warm(&stripe_base, "directwarm")?;
    warm(&proxy.base, "proxywarm")?;
    // The planner's statistics still describe the empty tables of a new
    // cluster (autovacuum looks once a minute), and plans made from them
    // scan whole tables the warm-up filled: a reservation cost twice its
    // steady-state time in the first loads. A deployment reaches the steady
    // state within its first minute; pgbench vacuums before it runs too.
    sqlx::query("VACUUM ANALYZE").execute(&db.pool).await?;

    println!(
        "\n{:<18} {:>9} {:>9} {:>9} {:>9} {:>10} {:>10} {:>10} {:>11}  answers",
        "load",
        "in flight",
        "calls/s",
        "p50 ms",
        "p99 ms",
        "wrk CPU",
        "proxy CPU",
        "PG CPU",
        "CPU allows"
    );
    // Round by round, each load once a round: this machine's speed drifts
    // by a fifth within a minute, and loads compared with each other (twins
    // with the run without) should meet the same drift, not each its own.
    let mut runs: Vec<Vec<Measured>> = LOADS.iter().map(|_| Vec::new()).collect();
    // pgbench in every round too, so a ratio compares a load with the
    // physical bound measured a minute away, not five.
    let mut pgbench_rounds: Vec<Vec<(usize, Pgbench)>> = Vec::new();
    // Over every run, not only the ones that stand for their load.
    let mut unanswered = 0;
    for round in 0..args.repeat.max(1) {
        for (index, load) in LOADS.iter().enumerate() {
            let (base, keys) = match (load.target, load.keys) {
                (Target::Upstream, _) => (&stripe_base, &spread_file),
                (Target::Proxy, Keys::Spread) => (&proxy.base, &spread_file),
                (Target::Proxy, Keys::Hot) => (&proxy.base, &hot_file),
            };
            let cpu_before = (
                process_cpu(proxy_pid)?,
                cluster_cpu(postmaster)?,
                children_cpu()?,
            );
            let batches_before = batches(&client, &proxy.base).await?;
            let mut run = wrk(
                &script,
                base,
                keys,
                load.twins,
                load.in_flight,
                args.seconds,
                &format!("{}{index}-{round}", load.target.tag()),
            )?;
            run.proxy_cpu = process_cpu(proxy_pid)?.saturating_sub(cpu_before.0);
            run.postgres_cpu = cluster_cpu(postmaster)?.saturating_sub(cpu_before.1);
            run.client_cpu = children_cpu()?.saturating_sub(cpu_before.2);
            if load.target == Target::Proxy {
                run.batches = Some(batches(&client, &proxy.base).await?.since(&batches_before));
            }
            unanswered += run.other + run.socket_errors;
            run.round = round;
            runs[index].push(run);
        }
        pgbench_rounds.push(
            PGBENCH_CLIENTS
                .into_iter()
                .map(|clients| {
                    let log = scratch.join(format!("pgbench-{round}-{clients}"));
                    let run = pgbench(&db.pg, postmaster, args.seconds, clients, &log)?;
                    Ok((clients, run))
                })
                .collect::<anyhow::Result<_>>()?,
        );
    }
    let mut results = Vec::new();
    for (load, mut runs) in LOADS.iter().zip(runs) {
        let in_tx = (load.target == Target::Proxy)
            .then(|| CpuInTx::median(&runs, &pgbench_rounds, load.in_flight))
            .transpose()?;
        // The run with the median rate stands for the load, whole.
        runs.sort_by(|a, b| a.rate().total_cmp(&b.rate()));
        let measured = runs.swap_remove(runs.len() / 2);
        // CPU figures are the proxy's: the upstream alone has none.
        let proxied = |figure: String| {
            if load.target == Target::Proxy {
                figure
            } else {
                "-".into()
            }
        };
        let cpu = |cpu| proxied(format!("{:.3} ms", measured.per_call_ms(cpu)));
        let ceiling = proxied(format!("{:.0}/s", measured.cpu_ceiling()));
        println!(
            "{:<18} {:>9} {:>9.0} {:>9.2} {:>9.2} {:>10} {:>10} {:>10} {ceiling:>11}  {} ok, {} 409, {} other{}",
            load.name,
            load.in_flight,
            measured.rate(),
            measured.p50_ms,
            measured.p99_ms,
            cpu(measured.client_cpu),
            cpu(measured.proxy_cpu),
            cpu(measured.postgres_cpu),
            measured.ok,
            measured.conflict,
            measured.other,
            if measured.socket_errors > 0 {
                format!(", {} socket errors", measured.socket_errors)
            } else {
                String::new()
            }
        );
        results.push((load, measured, in_tx));
    }
    println!(
        "\nledger writes per load: calls each and ms each (commit included), the \
         share of the run the one writer spent writing, the share of its turns over \
         {SLOW_SECS} s (a call alone waits for two: from 0.5 % on, slow turns set its p99) and \
         its turns over {STALLED_SECS} s"
    );
    println!(
        "{:<18} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "load", "in flight", "reserve", "ms", "record", "ms", "busy", "slow", "stalled"
    );
    for (load, measured, _) in &results {
        if let Some(batches) = &measured.batches {
            let [reserve_calls, reserve_ms] = batches.reserve.per_batch();
            let [record_calls, record_ms] = batches.record.per_batch();
            let busy = 100.0 * batches.writing / measured.seconds;
            let slow = 100.0 * batches.slow / batches.turns.max(1.0);
            println!(
                "{:<18} {:>9} {reserve_calls:>9.1} {reserve_ms:>9.2} {record_calls:>9.1} {record_ms:>9.2} {busy:>8.0}% {slow:>8.1}% {:>9.0}",
                load.name, load.in_flight, batches.stalled
            );
        }
    }
    let failed_batches = std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .filter(|line| line.contains("a ledger batch failed"))
        .count();
    proxy.stop().await?;

    let books = books(db, &stripe).await?;
    if args.statements {
        print_statements(&db.pool).await?;
    }
    println!("\npgbench simple-update, same cluster, the median of the rounds");
    for clients in PGBENCH_CLIENTS {
        let mut runs: Vec<&Pgbench> = pgbench_rounds
            .iter()
            .filter_map(|round| pgbench_in(round, clients))
            .collect();
        runs.sort_by(|a, b| a.tps.total_cmp(&b.tps));
        let run = runs[runs.len() / 2];
        println!(
            "{clients:>3} clients {:>9.0} tps   {:.3} ms per transaction, p99 {:.2} ms   PG CPU {:.3} ms per transaction",
            run.tps, run.latency_ms, run.p99_ms, run.cpu_ms
        );
    }

    // A load is compared with pgbench at its concurrency in the round of
    // the run that stands for it.
    let tps = |measured: &Measured, clients| pgbench_beside(&pgbench_rounds, measured, clients);
    let find = |name: &str, in_flight| {
        results
            .iter()
            .find(|(load, ..)| load.name == name && load.in_flight == in_flight)
            .map(|(_, measured, _)| measured)
            .context("a load that was run")
    };
    // Issue 20's targets, which this machine does not reach (see the
    // README), fail the run unless --no-targets; budgets and the books
    // always do.
    let mut missed = Vec::new();
    let mut broken = Vec::new();
    println!("\ntargets");
    let mut check = |what: String, ok: bool| verdict(&mut missed, what, ok);
    let alone = find("100 keys", 1)?;
    let one = tps(alone, 1)?;
    let one_tx = one.latency_ms;
    let p50_limit = 2.0 * one_tx + 0.3;
    check(
        format!(
            "one call alone: p50 {:.2} ms <= 2 x {one_tx:.2} + 0.3 = {p50_limit:.2} ms, p99 {:.2} ms <= 3 ms \
             (a pgbench transaction's p99 in its round: {:.2} ms)",
            alone.p50_ms, alone.p99_ms, one.p99_ms
        ),
        alone.p50_ms <= p50_limit && alone.p99_ms <= 3.0,
    );
    for (name, in_flight, factor) in [
        ("100 keys", 8, 0.5),
        ("1 hot key", 8, 0.5),
        ("100 keys", 64, 0.75),
        ("1 hot key", 64, 0.75),
    ] {
        let measured = find(name, in_flight)?;
        let bound = tps(measured, in_flight)?.tps;
        let rate = measured.rate();
        check(
            format!(
                "{name}, {in_flight} in flight: {rate:.0} calls/s = {:.2} x pgbench in its round, {bound:.0} tps (>= {factor}); \
                 the target, {:.0}/s, is {:.2} x what the CPU per call allows",
                rate / bound,
                factor * bound,
                factor * bound / measured.cpu_ceiling()
            ),
            rate >= factor * bound,
        );
    }
    for in_flight in [8, 64] {
        let plain = find("100 keys", in_flight)?.rate();
        let twins = find("100 keys, twins", in_flight)?.rate();
        check(
            format!(
                "twins, {in_flight} in flight: {twins:.0} calls/s = {:.2} x without twins (>= 0.8)",
                twins / plain
            ),
            twins >= 0.8 * plain,
        );
    }
    println!(
        "\nbudgets (scripts/budgets): CPU per call in pgbench transactions, i.e. divided by \
         PostgreSQL's CPU per pgbench transaction at the same concurrency in the same round; \
         the median of the rounds"
    );
    for (load, in_tx) in results
        .iter()
        .filter_map(|(load, _, in_tx)| Some((load, in_tx.as_ref()?)))
    {
        let CpuInTx { postgres, proxy } = *in_tx;
        let postgres_budget = budget(&format!("PROXY_PG_CPU_IN_TX_{}", load.in_flight))?;
        let proxy_budget = budget(&format!("PROXY_OWN_CPU_IN_TX_{}", load.in_flight))?;
        verdict(
            &mut broken,
            format!(
                "{}, {} in flight: PostgreSQL {postgres:.2} tx (<= {postgres_budget}), proxy {proxy:.2} tx (<= {proxy_budget})",
                load.name, load.in_flight
            ),
            postgres <= postgres_budget && proxy <= proxy_budget,
        );
    }
    println!("\nbooks");
    verdict(
        &mut broken,
        format!("ledger batches that failed and were written call by call: {failed_batches}"),
        failed_batches == 0,
    );
    verdict(
        &mut broken,
        format!("calls answered other than 2xx or 409: {unanswered}"),
        unanswered == 0,
    );
    verdict(&mut broken, books.summary(), books.balanced());
    ensure!(
        broken.is_empty(),
        "{} budget(s) or book check(s) failed",
        broken.len()
    );
    if missed.is_empty() || args.no_targets {
        Ok(())
    } else {
        bail!("{} target(s) missed", missed.len())
    }
}

/// Prints a check's outcome and adds it to `failed` when it failed.
fn verdict(failed: &mut Vec<String>, what: String, ok: bool) {
    println!("{} {what}", if ok { "ok    " } else { "FAILED" });
    if !ok {
        failed.push(what);
    }
}

/// The budgets the build and the benchmarks enforce, one `NAME=value` a line.
const BUDGETS: &str = include_str!("../../../../scripts/budgets");

fn budget(name: &str) -> anyhow::Result<f64> {
    BUDGETS
        .lines()
        .find_map(|line| {
            line.strip_prefix(name)?
                .strip_prefix('=')?
                .trim()
                .parse()
                .ok()
        })
        .with_context(|| format!("no {name} in scripts/budgets"))
}

/// One kind of ledger write's running totals, from the proxy's `/metrics`.
#[derive(Clone, Copy, Default)]
struct Writes {
    batches: f64,
    calls: f64,
    seconds: f64,
}

impl Writes {
    /// Calls per batch and milliseconds per batch.
    fn per_batch(&self) -> [f64; 2] {
        let batches = self.batches.max(1.0);
        [self.calls / batches, self.seconds * 1000.0 / batches]
    }
}

#[derive(Clone, Copy, Default)]
struct Batches {
    reserve: Writes,
    record: Writes,
    /// Seconds the one writer was writing (both kinds together).
    writing: f64,
    /// The writer's turns, and those that took longer than [`SLOW_SECS`].
    turns: f64,
    slow: f64,
    /// Turns of the writer that took longer than [`STALLED_SECS`]: every
    /// call waiting meanwhile waited as long.
    stalled: f64,
}

/// A turn of the ledger writer this long is a stall: 5-10 times a turn at
/// 64 calls in flight. A bucket bound of `vaultcap_ledger_write_seconds`.
const STALLED_SECS: &str = "0.025";

/// A turn this long is slow for a call alone: with its other turn (0.5-1.1
/// ms there) it takes more than the 3 ms issue 20 allows the call's p99.
/// Telling these apart shows whether a missed p99 was PostgreSQL's commits
/// or the rest of the call. A bucket bound too.
const SLOW_SECS: &str = "0.002";

impl Batches {
    fn since(&self, before: &Self) -> Self {
        let minus = |now: Writes, then: Writes| Writes {
            batches: now.batches - then.batches,
            calls: now.calls - then.calls,
            seconds: now.seconds - then.seconds,
        };
        Self {
            reserve: minus(self.reserve, before.reserve),
            record: minus(self.record, before.record),
            writing: self.writing - before.writing,
            turns: self.turns - before.turns,
            slow: self.slow - before.slow,
            stalled: self.stalled - before.stalled,
        }
    }
}

/// The ledger writers' totals so far (`crate::metrics`: a histogram of
/// calls per batch and one of seconds per batch, for each kind).
async fn batches(client: &reqwest::Client, base: &str) -> anyhow::Result<Batches> {
    let text = client
        .get(format!("{base}/metrics"))
        .send()
        .await?
        .error_for_status()
        .context("reading the proxy's /metrics")?
        .text()
        .await?;
    let value = |series: String| -> f64 {
        let prefix = format!("{series} ");
        text.lines()
            .find_map(|line| line.strip_prefix(prefix.as_str())?.trim().parse().ok())
            .unwrap_or(0.0)
    };
    let writes = |kind| {
        let series = |name| value(format!("{name}{{kind=\"{kind}\"}}"));
        Writes {
            batches: series("vaultcap_ledger_batch_calls_count"),
            calls: series("vaultcap_ledger_batch_calls_sum"),
            seconds: series("vaultcap_ledger_batch_seconds_sum"),
        }
    };
    let turns = value("vaultcap_ledger_write_seconds_count".into());
    let over = |bound| {
        turns
            - value(format!(
                "vaultcap_ledger_write_seconds_bucket{{le=\"{bound}\"}}"
            ))
    };
    Ok(Batches {
        reserve: writes("reserve"),
        record: writes("record"),
        writing: value("vaultcap_ledger_write_seconds_sum".into()),
        turns,
        slow: over(SLOW_SECS),
        stalled: over(STALLED_SECS),
    })
}

/// Where PostgreSQL's time went: the statements with the most total time,
/// nested ones (inside the ledger's functions and triggers) included.
async fn print_statements(pool: &sqlx::PgPool) -> anyhow::Result<()> {
    let rows: Vec<(f64, i64, f64, i64, f64, String)> = sqlx::query_as(
        "SELECT total_exec_time, calls, mean_exec_time, plans, total_plan_time,
                left(regexp_replace(query, '\\s+', ' ', 'g'), 100)
         FROM pg_stat_statements
         WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
         ORDER BY total_exec_time DESC LIMIT 15",
    )
    .fetch_all(pool)
    .await?;
    println!("\nstatements by total time (pg_stat_statements, nested included)");
    println!(
        "{:>10} {:>9} {:>9} {:>9} {:>9}  query",
        "total ms", "calls", "mean ms", "plans", "plan ms"
    );
    for (total, calls, mean, plans, plan_ms, query) in rows {
        println!("{total:>10.0} {calls:>9} {mean:>9.3} {plans:>9} {plan_ms:>9.0}  {query}");
    }
    Ok(())
}

/// The settings that decide what a durable write costs, and those given
/// with `--pg`.
async fn settings(pool: &sqlx::PgPool, given: &[String]) -> anyhow::Result<String> {
    let given: Vec<&str> = given
        .iter()
        .filter_map(|setting| setting.split('=').next())
        .collect();
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT name, setting || coalesce(unit, '') FROM pg_settings
         WHERE name IN ('shared_buffers', 'synchronous_commit', 'fsync', 'wal_sync_method',
                        'commit_delay', 'max_connections', 'wal_buffers', 'server_version',
                        'max_wal_size', 'checkpoint_timeout')
            OR name = ANY($1)
         ORDER BY name",
    )
    .bind(given)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .iter()
        .map(|(name, value)| format!("{name}={value}"))
        .collect::<Vec<_>>()
        .join(" "))
}

/// Runs wrk for `seconds` with `in_flight` connections; `tag` starts this
/// run's Idempotency-Keys and customer ids, so no two runs share one.
pub(super) fn wrk(
    script: &Path,
    base: &str,
    keys: &Path,
    twins: bool,
    in_flight: usize,
    seconds: u32,
    tag: &str,
) -> anyhow::Result<Measured> {
    let output = std::process::Command::new("wrk")
        .arg("-t")
        .arg(in_flight.min(2).to_string())
        .arg("-c")
        .arg(in_flight.to_string())
        .arg("-d")
        .arg(format!("{seconds}s"))
        .args(["--timeout", "10s", "-s"])
        .arg(script)
        .arg(format!("{base}/v1/charges"))
        .arg("--")
        .arg(keys)
        .arg(if twins { "twins" } else { "single" })
        .arg(tag)
        .stderr(Stdio::inherit())
        .output()
        .context("running wrk (apt-get install wrk)")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    ensure!(output.status.success(), "wrk failed: {stdout}");
    let line = stdout
        .lines()
        .find_map(|line| line.strip_prefix("VAULTCAP "))
        .with_context(|| format!("no figures in wrk's output: {stdout}"))?;
    let field = |name: &str| -> anyhow::Result<u64> {
        line.split_whitespace()
            .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
            .with_context(|| format!("{name} in {line}"))?
            .parse()
            .with_context(|| format!("{name} in {line}"))
    };
    Ok(Measured {
        calls: field("requests")?,
        seconds: field("duration_us")? as f64 / 1e6,
        p50_ms: field("p50_us")? as f64 / 1000.0,
        p99_ms: field("p99_us")? as f64 / 1000.0,
        ok: field("ok")?,
        conflict: field("conflict")?,
        other: field("other")?,
        socket_errors: field("socket_errors")?,
        proxy_cpu: Duration::ZERO,
        postgres_cpu: Duration::ZERO,
        client_cpu: Duration::ZERO,
        batches: None,
        round: 0,
    })
}

/// The file of vault keys `charges.lua` takes them in turn from: one
/// secret a line.
pub(super) fn write_keys(path: &Path, keys: &[(String, VaultKeyRow)]) -> std::io::Result<()> {
    let lines: String = keys
        .iter()
        .map(|(secret, _)| format!("{secret}\n"))
        .collect();
    std::fs::write(path, lines)
}

/// Fields of `/proc/PID/stat` after the command name: (ppid, user + system
/// ticks, children's user + system ticks).
fn proc_stat(pid: u32) -> Option<(u32, u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let number = |i: usize| fields.get(i)?.parse::<u64>().ok();
    Some((
        u32::try_from(number(1)?).ok()?,
        number(11)? + number(12)?,
        number(13)? + number(14)?,
    ))
}

fn ticks(ticks: u64) -> Duration {
    // /proc counts CPU time in USER_HZ, 100 on every Linux architecture
    // Vaultcap runs on (it is part of the kernel's ABI, unlike HZ).
    Duration::from_millis(ticks * 10)
}

/// CPU time (user + system) one process has used.
pub(super) fn process_cpu(pid: u32) -> anyhow::Result<Duration> {
    let (_, own, _) = proc_stat(pid).context("reading the proxy's CPU time")?;
    Ok(ticks(own))
}

/// CPU time this process's children have used once they ended: wrk's,
/// read around its run (the proxy and PostgreSQL are still running).
fn children_cpu() -> anyhow::Result<Duration> {
    let (_, _, children) =
        proc_stat(std::process::id()).context("reading the children's CPU time")?;
    Ok(ticks(children))
}

/// CPU time of the whole cluster: the postmaster, its live children (the
/// backends, the WAL writer, the checkpointer) and those that have exited.
pub(super) fn cluster_cpu(postmaster: u32) -> anyhow::Result<Duration> {
    let postmaster_cpu = || proc_stat(postmaster).context("reading PostgreSQL's CPU time");
    loop {
        let (_, _, before) = postmaster_cpu()?;
        let mut live = 0;
        for entry in std::fs::read_dir("/proc")? {
            let Some(pid) = entry?.file_name().to_str().and_then(|n| n.parse().ok()) else {
                continue;
            };
            if let Some((ppid, used, _)) = proc_stat(pid) {
                if ppid == postmaster {
                    live += used;
                }
            }
        }
        // A child reaped while /proc was read is in neither figure: read
        // again (backends end in dozens as pgbench does, and a pgbench
        // transaction cost half its CPU in runs that missed them).
        let (_, own, after) = postmaster_cpu()?;
        if after == before {
            return Ok(ticks(own + after + live));
        }
    }
}

struct Pgbench {
    tps: f64,
    latency_ms: f64,
    /// What a lone call's p99 can be compared with: one commit's tail.
    p99_ms: f64,
    /// PostgreSQL's CPU time per transaction: the unit the proxy's CPU
    /// budgets are in, since it slows and speeds with the machine as the
    /// proxy's own CPU time does.
    cpu_ms: f64,
}

/// A proxied load's CPU per call counted in pgbench transactions: each
/// run's divided by PostgreSQL's CPU per pgbench transaction at the same
/// concurrency in its own round.
#[derive(Clone, Copy, Debug, PartialEq)]
struct CpuInTx {
    postgres: f64,
    proxy: f64,
}

impl CpuInTx {
    /// The median over the load's rounds, PostgreSQL's and the proxy's
    /// each on its own, which is what the budgets are checked against: one
    /// round in a slow moment of the machine (seen here: 4.4 tx at 8 in
    /// flight in one run of nine, the others 2.8 to 3.2) neither fails a
    /// budget nor hides a regression that most rounds show.
    fn median(
        runs: &[Measured],
        rounds: &[Vec<(usize, Pgbench)>],
        in_flight: usize,
    ) -> anyhow::Result<Self> {
        let mut postgres = Vec::with_capacity(runs.len());
        let mut proxy = Vec::with_capacity(runs.len());
        for run in runs {
            let unit = pgbench_beside(rounds, run, in_flight)?.cpu_ms.max(0.001);
            postgres.push(run.per_call_ms(run.postgres_cpu) / unit);
            proxy.push(run.per_call_ms(run.proxy_cpu) / unit);
        }
        let median = |mut figures: Vec<f64>| {
            figures.sort_by(f64::total_cmp);
            super::quantile(&figures, 0.5)
        };
        Ok(Self {
            postgres: median(postgres),
            proxy: median(proxy),
        })
    }
}

/// The concurrencies pgbench runs at: those of the proxied loads.
const PGBENCH_CLIENTS: [usize; 3] = [1, 8, 64];

/// The run at `clients` clients in one round's pgbench runs.
fn pgbench_in(round: &[(usize, Pgbench)], clients: usize) -> Option<&Pgbench> {
    round
        .iter()
        .find(|(at, _)| *at == clients)
        .map(|(_, run)| run)
}

/// pgbench at `clients` clients in the round `run` ran in: what a load
/// is compared with.
fn pgbench_beside<'a>(
    rounds: &'a [Vec<(usize, Pgbench)>],
    run: &Measured,
    clients: usize,
) -> anyhow::Result<&'a Pgbench> {
    rounds
        .get(run.round)
        .and_then(|round| pgbench_in(round, clients))
        .context("pgbench at this concurrency in the load's round")
}

fn pgbench_init(pg: &EmbeddedPostgres) -> anyhow::Result<()> {
    let init = pg
        .client("pgbench")
        .arg("postgres")
        .args(["-i", "-q", "-s", "10"])
        .output()
        .context("running pgbench -i")?;
    ensure!(
        init.status.success(),
        "pgbench -i failed: {}",
        String::from_utf8_lossy(&init.stderr)
    );
    Ok(())
}

/// pgbench's simple-update on the same cluster with `clients` connections.
/// `postmaster` is the cluster's, whose CPU time is read around the run;
/// every transaction's latency is logged under the new directory `log`.
fn pgbench(
    pg: &EmbeddedPostgres,
    postmaster: u32,
    seconds: u32,
    clients: usize,
    log: &Path,
) -> anyhow::Result<Pgbench> {
    std::fs::create_dir(log).with_context(|| format!("creating {}", log.display()))?;
    let cpu_before = cluster_cpu(postmaster)?;
    let run = pg
        .client("pgbench")
        .arg("postgres")
        .args(["-b", "simple-update", "-n", "-c", &clients.to_string()])
        .args([
            "-j",
            &clients.min(2).to_string(),
            "-T",
            &seconds.to_string(),
        ])
        .arg("--log")
        .arg(format!("--log-prefix={}", log.join("tx").display()))
        .output()
        .context("running pgbench")?;
    let cpu = cluster_cpu(postmaster)?.saturating_sub(cpu_before);
    let out = String::from_utf8_lossy(&run.stdout);
    let figure = |prefix: &str| -> Option<f64> {
        out.lines().find_map(|line| {
            line.strip_prefix(prefix)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
    };
    let transactions = figure("number of transactions actually processed: ")
        .with_context(|| format!("no transaction count in pgbench output: {out}"))?;
    Ok(Pgbench {
        tps: figure("tps = ").with_context(|| format!("no tps in pgbench output: {out}"))?,
        latency_ms: figure("latency average = ")
            .with_context(|| format!("no latency in pgbench output: {out}"))?,
        p99_ms: logged_p99_ms(log)?,
        cpu_ms: cpu.as_secs_f64() * 1000.0 / transactions.max(1.0),
    })
}

/// The 99th percentile of the latencies pgbench logged in `dir`, one file
/// per thread, a line per transaction: `client transaction latency_us ...`.
fn logged_p99_ms(dir: &Path) -> anyhow::Result<f64> {
    let mut latencies_us = Vec::new();
    for file in std::fs::read_dir(dir)? {
        let path = file?.path();
        let text = std::fs::read_to_string(&path)?;
        for line in text.lines() {
            let latency: f64 = line
                .split_whitespace()
                .nth(2)
                .and_then(|field| field.parse().ok())
                .with_context(|| format!("no latency in {}: {line:?}", path.display()))?;
            latencies_us.push(latency);
        }
    }
    ensure!(!latencies_us.is_empty(), "pgbench logged no transaction");
    latencies_us.sort_unstable_by(f64::total_cmp);
    Ok(super::quantile(&latencies_us, 0.99) / 1000.0)
}

/// Every call the proxy answered, against what Stripe made and what the
/// ledger says.
pub(super) struct Books {
    stripe_charges: i64,
    settled: i64,
    open: i64,
    spent: Cents,
}

pub(super) async fn books(db: &BenchDatabase, stripe: &FakeStripe) -> anyhow::Result<Books> {
    let (settled, open, spent): (i64, i64, Cents) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE state = 'settled'),
                count(*) FILTER (WHERE state IN ('pending', 'outcome_unknown')),
                (SELECT coalesce(sum(spent_cents), 0)::bigint FROM vault_keys)
         FROM reservations",
    )
    .fetch_one(&db.pool)
    .await?;
    // The warm-up and direct loads' charges are not the proxied loads'.
    let proxied = stripe
        .charges()
        .keys()
        .filter(|key| key.starts_with("proxy"))
        .count();
    Ok(Books {
        stripe_charges: proxied as i64,
        settled,
        open,
        spent,
    })
}

impl Books {
    pub(super) fn balanced(&self) -> bool {
        self.stripe_charges == self.settled
            && self.open == 0
            && self.spent == Cents(self.settled * 100)
    }

    pub(super) fn summary(&self) -> String {
        format!(
            "charges Stripe made {}, reservations settled {}, left open {}, spent {} cents (100 each)",
            self.stripe_charges, self.settled, self.open, self.spent.0
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_proxied_load_has_its_cpu_budgets() {
        for load in LOADS.iter().filter(|load| load.target == Target::Proxy) {
            for name in ["PROXY_PG_CPU_IN_TX", "PROXY_OWN_CPU_IN_TX"] {
                let name = format!("{name}_{}", load.in_flight);
                let value = budget(&name).unwrap_or_else(|err| panic!("{err:#}"));
                assert!(value > 0.0, "{name} is {value}");
            }
        }
    }

    #[test]
    fn a_budget_is_read_by_its_whole_name() {
        assert_eq!(budget("PROXY_PG_CPU_IN_TX_64").ok(), Some(1.7));
        // A prefix of PROXY_PG_CPU_IN_TX_64 is not a budget of its own.
        assert!(budget("PROXY_PG_CPU_IN_TX_6").is_err());
    }

    #[test]
    fn a_budgets_figure_is_the_median_round_each_over_its_own_pgbench() {
        // 1,000 calls in a round: PostgreSQL's and the proxy's CPU in ms.
        let run = |round, postgres_ms: u64, proxy_ms: u64| Measured {
            calls: 1000,
            seconds: 4.0,
            p50_ms: 0.0,
            p99_ms: 0.0,
            ok: 1000,
            conflict: 0,
            other: 0,
            socket_errors: 0,
            proxy_cpu: Duration::from_millis(proxy_ms),
            postgres_cpu: Duration::from_millis(postgres_ms),
            client_cpu: Duration::ZERO,
            batches: None,
            round,
        };
        // pgbench at 8 clients spent 0.2, 0.1 and 0.25 ms a transaction.
        let pgbench = |cpu_ms| {
            vec![(
                8,
                Pgbench {
                    tps: 5000.0,
                    latency_ms: 1.0,
                    p99_ms: 2.0,
                    cpu_ms,
                },
            )]
        };
        let rounds = [pgbench(0.2), pgbench(0.1), pgbench(0.25)];
        // PostgreSQL: 3.0, 4.0 and an outlier of 8.0 tx; the proxy 1.0,
        // 0.5 and 0.8 tx.
        let runs = [run(0, 600, 200), run(1, 400, 50), run(2, 2000, 200)];
        assert_eq!(
            CpuInTx::median(&runs, &rounds, 8).unwrap(),
            CpuInTx {
                postgres: 4.0,
                proxy: 0.8
            }
        );
        // A load with no pgbench at its concurrency in its round is an error.
        assert!(CpuInTx::median(&runs, &rounds, 64).is_err());
    }

    #[test]
    fn pgbenchs_p99_is_read_over_every_threads_log() {
        let dir = tempfile::tempdir().unwrap();
        // pgbench's lines: client, transaction, latency in µs, script, epoch, µs.
        let lines = |from: u64, to: u64| -> String {
            (from..to)
                .map(|n| format!("0 {n} {} 0 1796000000 123456\n", n * 10))
                .collect()
        };
        std::fs::write(dir.path().join("tx.41"), lines(1, 101)).unwrap();
        std::fs::write(dir.path().join("tx.41.1"), lines(101, 201)).unwrap();
        // 200 transactions of 10 µs to 2,000 µs: by nearest rank (the
        // benches' `quantile`), the 198th from the fastest, 1,980 µs.
        assert_eq!(logged_p99_ms(dir.path()).unwrap(), 1.98);

        std::fs::write(dir.path().join("tx.41.2"), "junk\n").unwrap();
        assert!(logged_p99_ms(dir.path()).is_err());
    }
}
