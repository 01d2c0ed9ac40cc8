//! `vaultcap reconcile --period 2026-07`: sync the period's charges from
//! Stripe, then detect orphaned, duplicate, missing and unmetered charges, printing
//! the progress and what was found.

use clap::Args;

use app::{actions::sql::Actor, domain::BillingPeriod};

use crate::{
    config::{DatabaseArgs, StripeArgs},
    db::Database,
    reconcile::{self, sync},
};

#[derive(Debug, Args)]
pub struct ReconcileArgs {
    /// The billing period, YYYY-MM.
    #[arg(long)]
    period: BillingPeriod,

    /// Hours before the period starts and after it ends whose charges are
    /// synced too.
    #[arg(long, default_value_t = 72, value_parser = clap::value_parser!(i64).range(0..=720))]
    margin_hours: i64,

    /// Charges per page asked of Stripe (1 to 100).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i64).range(1..=100))]
    page_size: i64,

    #[command(flatten)]
    database: DatabaseArgs,

    #[command(flatten)]
    stripe: StripeArgs,
}

pub async fn run(args: ReconcileArgs) -> anyhow::Result<()> {
    let period = args.period;
    let Some(key) = args.stripe.stripe_secret_key.as_deref() else {
        anyhow::bail!("STRIPE_SECRET_KEY is not set: the sync needs the real Stripe key");
    };
    let options = sync::SyncOptions {
        margin: chrono::Duration::hours(args.margin_hours),
        page_size: args.page_size,
        ..sync::SyncOptions::default()
    };
    let client = sync::client(&args.stripe.stripe_api_base, key, &options)?;
    let db = Database::open(&args.database).await?;
    let result = async {
        println!("Syncing {period} from {}", args.stripe.stripe_api_base);
        let progress = |progress: &app::reconciliation::stripe_charges::SyncRow| {
            println!(
                "  page {}: {} payment intents, {} charges seen",
                progress.pages, progress.intents_seen, progress.charges_seen
            );
        };
        let (synced, detected) =
            reconcile::sync_and_detect(&db.pool, &client, period, &options, Actor::Cli, progress).await?;
        let reconcile::Detected { findings: found, unknown } = detected;
        println!(
            "Synced {} charges and {} payment intents in {} pages. Findings: {} orphaned, {} duplicate, \
             {} missing, {} unmetered; {} cleared. Calls of unknown outcome: {} settled by Stripe's charge, {} still unknown.",
            synced.charges_seen, synced.intents_seen, synced.pages, found.orphaned, found.duplicate, found.missing,
            found.unmetered, found.cleared,
            unknown.settled, unknown.still_unknown
        );
        anyhow::Ok(())
    }
    .await;
    db.close().await?;
    result
}
