//! `vaultcap bench reconcile`: how long detection takes over a period with
//! many charges and billing records (local work only: no Stripe paging), in
//! a private PostgreSQL cluster made for the run. The target is ≤ 5 s for
//! 100,000 of each.

use std::time::Instant;

use anyhow::ensure;
use app::{domain::BillingPeriod, reconciliation::findings};
use clap::Args;

use super::BenchDatabase;

#[derive(Debug, Args)]
pub struct ReconcileBenchArgs {
    /// Charges in Stripe for the period (and about as many billing records).
    #[arg(long, default_value_t = 100_000)]
    charges: i64,
    /// Detection runs timed (the first finds everything, the others
    /// re-detect the same findings).
    #[arg(long, default_value_t = 3)]
    runs: usize,
}

const PERIOD: &str = "2026-07";

pub async fn run(args: ReconcileBenchArgs) -> anyhow::Result<()> {
    BenchDatabase::around(async |db| measure(db, &args).await).await
}

async fn measure(db: &BenchDatabase, args: &ReconcileBenchArgs) -> anyhow::Result<()> {
    let pool = &db.pool;
    let loading = Instant::now();
    // Customer n has charge ch_n and a billing record naming it, except:
    // every 100th charge is a second one for the customer before it (a
    // duplicate), every 100th customer from 25 has no record (an orphan),
    // and every 100th record from 50 names a charge Stripe does not have
    // (missing).
    sqlx::query(
        "INSERT INTO stripe_charges (id, stripe_customer, amount_cents, currency, status, customer_id,
             billing_period, created_at)
         SELECT 'ch_' || n, 'cus_' || n, 1000 + n % 5000, 'usd', 'succeeded',
                'cust_' || CASE WHEN n % 100 = 0 THEN n - 1 ELSE n END, $2,
                timestamptz '2026-07-01' + n * interval '1 second'
         FROM generate_series(1, $1) AS n",
    )
    .bind(args.charges)
    .bind(PERIOD)
    .execute(pool)
    .await?;
    sqlx::query(
        "INSERT INTO billing_records (customer_id, billing_period, charge_id, amount_cents)
         SELECT 'cust_' || n, $2, CASE WHEN n % 100 = 50 THEN 'ch_lost_' || n ELSE 'ch_' || n END,
                1000 + n % 5000
         FROM generate_series(1, $1) AS n
         WHERE n % 100 NOT IN (0, 25)",
    )
    .bind(args.charges)
    .bind(PERIOD)
    .execute(pool)
    .await?;
    sqlx::query("VACUUM ANALYZE").execute(pool).await?;
    let records: i64 = sqlx::query_scalar("SELECT count(*) FROM billing_records")
        .fetch_one(pool)
        .await?;
    println!(
        "vaultcap bench reconcile: {} charges, {records} billing records in {PERIOD} (loaded in {:.1} s)",
        args.charges,
        loading.elapsed().as_secs_f64()
    );

    let period: BillingPeriod = PERIOD.parse()?;
    let mut first = None;
    for run in 1..=args.runs {
        let started = Instant::now();
        let mut tx = pool.begin().await?;
        let found = findings::detect(&mut tx, period, chrono::Utc::now()).await?;
        tx.commit().await?;
        let seconds = started.elapsed().as_secs_f64();
        println!(
            "run {run}: {seconds:.2} s — {} orphaned, {} duplicate, {} missing, {} cleared",
            found.orphaned, found.duplicate, found.missing, found.cleared
        );
        ensure!(
            first.is_none_or(|first| first == found),
            "detection is idempotent: run {run} found {found:?}, run 1 {first:?}"
        );
        first.get_or_insert(found);
    }
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM reconciliation_findings")
        .fetch_one(pool)
        .await?;
    println!(
        "{rows} findings after {} runs (target: ≤ 5 s a run)",
        args.runs
    );
    Ok(())
}
