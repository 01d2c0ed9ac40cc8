//! `vaultcap audit verify`: recomputes the audit log's hash chain.

use chrono::NaiveDate;
use clap::Subcommand;

use app::ssr::data::audit_chain;

use crate::{audit_chain::verify, config::DatabaseArgs, db::Database};

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
}

pub async fn run(command: AuditCommand) -> anyhow::Result<()> {
    let AuditCommand::Verify { from, to, database } = command;
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
