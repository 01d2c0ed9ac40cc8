//! `vaultcap audit verify`: recomputes the audit log's hash chain.

use std::path::PathBuf;

use chrono::NaiveDate;
use clap::Subcommand;
use sqlx::ConnectOptions;

use app::{
    actions::sql::Actor,
    audit::chain_sql as audit_chain,
    domain::{group_thousands, BillingPeriod},
};

use crate::{
    audit_archive::archive_before, audit_chain::verify, config::DatabaseArgs, db::Database,
};

#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Recompute every audit row's hash from its contents and the row before
    /// it, each UTC day from its first row, and name the first row that does
    /// not hold (changed, deleted or added outside Vaultcap). Fails when one
    /// does not.
    Verify {
        /// The first day to check (YYYY-MM-DD, the UTC day rows were written).
        #[arg(long)]
        from: Option<NaiveDate>,
        /// The last day to check.
        #[arg(long)]
        to: Option<NaiveDate>,
        #[command(flatten)]
        database: DatabaseArgs,
    },
    /// Archive the months of the audit log before --before: each to a
    /// gzipped CSV file in --to, its row count and SHA-256 recorded in the
    /// database and the action log, then dropped. A month still being
    /// written is never archived. Runs as the schema's owner
    /// (VAULTCAP_MIGRATION_DATABASE_URL when it is set).
    Archive {
        /// The first month kept (YYYY-MM), at most this month.
        #[arg(long)]
        before: BillingPeriod,
        /// The directory the files are written to (made if missing).
        #[arg(long)]
        to: PathBuf,
        #[command(flatten)]
        database: DatabaseArgs,
    },
}

pub async fn run(command: AuditCommand) -> anyhow::Result<()> {
    match command {
        AuditCommand::Verify { from, to, database } => check(from, to, database).await,
        AuditCommand::Archive {
            before,
            to,
            database,
        } => archive(before, to, database).await,
    }
}

async fn archive(before: BillingPeriod, to: PathBuf, database: DatabaseArgs) -> anyhow::Result<()> {
    let db = Database::open(&database).await?;
    let archived = async {
        let mut owner = db.owner().connect().await?;
        archive_before(&mut owner, before.starts_at().date_naive(), &to, Actor::Cli).await
    }
    .await;
    db.close().await?;
    let archived = archived?;
    if archived.is_empty() {
        println!("No month of the audit log before {before} is left to archive.");
    }
    for month in archived {
        println!(
            "Archived {}: {} rows to {} (SHA-256 {}), then dropped it.",
            month.partition,
            group_thousands(month.rows),
            month.file.display(),
            month.sha256
        );
    }
    Ok(())
}

async fn check(
    from: Option<NaiveDate>,
    to: Option<NaiveDate>,
    database: DatabaseArgs,
) -> anyhow::Result<()> {
    if let (Some(from), Some(to)) = (from, to) {
        anyhow::ensure!(from <= to, "--from {from} is after --to {to}");
    }
    let db = Database::open(&database).await?;
    let checked = async {
        let protection = audit_chain::log_protection(&db.pool).await?;
        let report = verify(&db.pool, from, to).await?;
        anyhow::Ok((protection, report))
    }
    .await;
    db.close().await?;
    let (protection, report) = checked?;
    println!(
        "Checked {} {} and {} {} of the audit log's hash chain.",
        report.days,
        if report.days == 1 { "day" } else { "days" },
        report.rows,
        if report.rows == 1 { "row" } else { "rows" },
    );
    if protection.can_rewrite {
        println!(
            "Warning: the application connects as {}, which can rewrite the audit log; only the \
             hash chain shows a change.",
            protection.role
        );
    } else {
        println!(
            "The application connects as {}, which can only append to the logs.",
            protection.role
        );
    }
    if let Some(broken) = report.broken {
        anyhow::bail!(
            "the audit log's hash chain is broken: {}",
            broken.problem.unwrap_or_default()
        );
    }
    match report.verified_through {
        Some((day, seq)) => println!("Chain verified up to row #{seq} of those written on {day}."),
        None => println!("No audit rows in that range."),
    }
    Ok(())
}
