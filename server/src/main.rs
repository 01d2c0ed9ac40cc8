//! `vaultcap`: the console's server and the command line around it.

use clap::{Parser, Subcommand};
use server::{cli, config};

#[derive(Parser)]
#[command(
    name = "vaultcap",
    version,
    about = "Spend governance for Stripe billing"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the console (and run migrations first).
    Serve(Box<config::ServeArgs>),
    /// Manage operators (the people who sign in to the console).
    #[command(subcommand)]
    Operator(cli::operator::OperatorCommand),
    /// Manage admin API tokens (for the key API).
    #[command(subcommand)]
    Token(cli::token::TokenCommand),
    /// Check the audit log's hash chain.
    #[command(subcommand)]
    Audit(cli::audit::AuditCommand),
    /// Benchmarks that print figures (in a private cluster made for the run).
    #[command(subcommand)]
    Bench(cli::bench::BenchCommand),
    /// Sync a billing period's charges from Stripe and detect orphaned,
    /// duplicate, missing and unmetered charges against the billing records.
    Reconcile(cli::reconcile::ReconcileArgs),
    /// Fill the database with realistic demo data.
    Demo(cli::demo::DemoArgs),
    /// Run only the private PostgreSQL cluster until interrupted, printing
    /// its DATABASE_URL (for tests and tools such as psql).
    Postgres(cli::postgres::PostgresArgs),
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // async-stripe-webhook warns on every event whose API version
                // is not the one it was built for; Vaultcap reads only fields
                // every version has (its tests run localstripe's 2017-08-15
                // events), so that warning would be one line per event.
                .unwrap_or_else(|_| {
                    "info,sqlx=warn,tower_sessions=warn,stripe_webhook=error".into()
                }),
        )
        .with_writer(std::io::stderr)
        // VAULTCAP_LOG_SPANS=1: a line as each request, proxied call,
        // ledger write, database and Stripe call ends, with its time, under
        // the request id of the request it served.
        .with_span_events(if std::env::var_os("VAULTCAP_LOG_SPANS").is_some() {
            tracing_subscriber::fmt::format::FmtSpan::CLOSE
        } else {
            tracing_subscriber::fmt::format::FmtSpan::NONE
        })
        .init();
    let result = match Cli::parse().command {
        Command::Serve(args) => cli::serve::run(*args).await,
        Command::Operator(command) => cli::operator::run(command).await,
        Command::Token(command) => cli::token::run(command).await,
        Command::Demo(args) => cli::demo::run(args).await,
        Command::Reconcile(args) => cli::reconcile::run(args).await,
        Command::Audit(command) => cli::audit::run(command).await,
        Command::Bench(command) => cli::bench::run(command).await,
        Command::Postgres(args) => cli::postgres::run(args).await,
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serve_reads_every_flag_it_declares() {
        let cli = Cli::try_parse_from([
            "vaultcap",
            "serve",
            "--nightly-sync-hour",
            "off",
            "--stripe-webhook-secret",
            "whsec_old,whsec_new",
        ])
        .unwrap();
        let Command::Serve(args) = cli.command else {
            panic!("serve parses as serve");
        };
        assert_eq!(args.stripe.nightly_sync_hour.0, None);
        assert_eq!(
            args.stripe.stripe_webhook_secrets,
            ["whsec_old", "whsec_new"]
        );
        assert!(Cli::try_parse_from(["vaultcap", "serve", "--nightly-sync-hour", "24"]).is_err());
    }
}
