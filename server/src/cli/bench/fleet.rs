//! `vaultcap bench fleet`: N `vaultcap serve` instances over one database,
//! behind HAProxy, metering charges from `wrk` (the same script and keys as
//! `bench proxy`), for N = 1, 2, 4. Prints calls/s and latency per fleet
//! size, the CPU each metered call costs the instances and PostgreSQL, and
//! what those figures say about capacity: calls/s one database core meters,
//! the Vaultcap cores that feed it, and audit rows per GB. Fails if a call
//! is unanswered or the books do not balance.

use anyhow::{bail, Context};
use clap::Args;

use super::{
    cap::HaProxy,
    issue_keys,
    proxy::{books, cluster_cpu, process_cpu, write_keys, wrk, Measured, SCRIPT},
    serve, BenchDatabase, FakeStripe, ServeProcess,
};

#[derive(Debug, Args)]
pub struct FleetBenchArgs {
    /// Fleet sizes to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 2, 4])]
    instances: Vec<usize>,
    /// Calls in flight through the load balancer.
    #[arg(long, default_value_t = 64)]
    in_flight: usize,
    /// Seconds each run lasts.
    #[arg(long, default_value_t = 4)]
    seconds: u32,
    /// Runs per fleet size; the one with the median rate is printed.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
}

pub async fn run(args: FleetBenchArgs) -> anyhow::Result<()> {
    BenchDatabase::around(async |db| measure(db, &args).await).await
}

async fn measure(db: &BenchDatabase, args: &FleetBenchArgs) -> anyhow::Result<()> {
    let binary = std::env::current_exe().context("finding the vaultcap binary")?;
    let stripe = FakeStripe::default();
    let stripe_base = format!("http://{}", serve(stripe.router()).await?);
    // 100 keys with caps no run can reach.
    let keys = issue_keys(&db.pool, 100, app::domain::Cents(1_000_000_000_000)).await?;
    let scratch = db.scratch();
    let keys_file = scratch.join("fleet.keys");
    write_keys(&keys_file, &keys)?;
    let script = scratch.join("charges.lua");
    std::fs::write(&script, SCRIPT)?;
    let mut env = db.serve_env(&stripe_base);
    env.push(("RUST_LOG", "warn".to_owned()));
    let postmaster = db.pg.postmaster_pid()?;

    println!(
        "vaultcap bench fleet: {} in flight through HAProxy, {} s per run, the median of {} runs",
        args.in_flight,
        args.seconds,
        args.repeat.max(1)
    );
    println!(
        "\n{:<10} {:>9} {:>9} {:>9} {:>14} {:>10}  answers",
        "instances", "calls/s", "p50 ms", "p99 ms", "Vaultcap CPU", "PG CPU"
    );
    let mut unanswered = 0;
    let mut measured = Vec::new();
    for &count in &args.instances {
        let mut instances = Vec::with_capacity(count);
        for n in 0..count {
            let log = scratch.join(format!("serve-{count}-{n}.log"));
            instances.push(ServeProcess::start(&binary, &env, &log).await?);
        }
        let pids = instances
            .iter()
            .map(|instance| instance.pid().context("an instance's pid"))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let balancer = HaProxy::start(scratch, &instances).await?;
        let instances_cpu = || -> anyhow::Result<std::time::Duration> {
            pids.iter().map(|pid| process_cpu(*pid)).sum()
        };
        let tag = |run: &str| format!("proxy-fleet{count}-{run}");
        // Warm every instance's connections, caches and plans.
        wrk(
            &script,
            &balancer.base,
            &keys_file,
            false,
            8,
            2,
            &tag("warm"),
        )?;
        let mut runs = Vec::with_capacity(args.repeat);
        for run in 0..args.repeat.max(1) {
            let before = (instances_cpu()?, cluster_cpu(postmaster)?);
            let mut result = wrk(
                &script,
                &balancer.base,
                &keys_file,
                false,
                args.in_flight,
                args.seconds,
                &tag(&run.to_string()),
            )?;
            result.proxy_cpu = instances_cpu()?.saturating_sub(before.0);
            result.postgres_cpu = cluster_cpu(postmaster)?.saturating_sub(before.1);
            unanswered += result.other + result.socket_errors;
            runs.push(result);
        }
        for instance in instances {
            instance.stop().await?;
        }
        drop(balancer);
        runs.sort_by(|a, b| a.rate().total_cmp(&b.rate()));
        let median = runs.swap_remove(runs.len() / 2);
        println!(
            "{count:<10} {:>9.0} {:>9.2} {:>9.2} {:>11.3} ms {:>7.3} ms  {} ok, {} other",
            median.rate(),
            median.p50_ms,
            median.p99_ms,
            median.per_call_ms(median.proxy_cpu),
            median.per_call_ms(median.postgres_cpu),
            median.ok,
            median.other + median.socket_errors,
        );
        measured.push((count, median));
    }

    capacity(db, &measured).await?;
    let books = books(db, &stripe).await?;
    println!("\n{}", books.summary());
    if unanswered > 0 {
        bail!("{unanswered} call(s) answered other than 2xx");
    }
    if !books.balanced() {
        bail!("the books do not balance");
    }
    Ok(())
}

/// What the figures say about sizing, from the fleet size that metered
/// the most calls/s.
async fn capacity(db: &BenchDatabase, measured: &[(usize, Measured)]) -> anyhow::Result<()> {
    let Some((count, best)) = measured
        .iter()
        .max_by(|(_, a), (_, b)| a.rate().total_cmp(&b.rate()))
    else {
        return Ok(());
    };
    let pg_ms = best.per_call_ms(best.postgres_cpu);
    let vaultcap_ms = best.per_call_ms(best.proxy_cpu);
    // The partitions hold the rows; the partitioned table itself has none.
    let (rows, bytes): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM audit_log),
                (SELECT sum(pg_total_relation_size(relid))::bigint
                 FROM pg_partition_tree('audit_log'))",
    )
    .fetch_one(&db.pool)
    .await?;
    let rows_per_gb = rows as f64 * (1u64 << 30) as f64 / bytes.max(1) as f64;
    println!("\ncapacity, from the {count}-instance runs:");
    println!(
        "  one PostgreSQL core meters about {:.0} calls/s ({pg_ms:.3} ms of its CPU per call)",
        1000.0 / pg_ms.max(0.001)
    );
    println!(
        "  which takes {:.2} Vaultcap cores ({vaultcap_ms:.3} ms per call)",
        vaultcap_ms / pg_ms.max(0.001)
    );
    println!(
        "  the audit log holds {:.1} M calls per GB ({} bytes per row with its indexes, {rows} rows)",
        rows_per_gb / 1e6,
        bytes / rows.max(1)
    );
    Ok(())
}
