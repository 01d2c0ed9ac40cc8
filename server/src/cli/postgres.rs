use std::path::PathBuf;

use clap::Args;

use crate::embedded_pg::{EmbeddedPostgres, DATABASE};

#[derive(Debug, Args)]
pub struct PostgresArgs {
    /// Directory for the cluster (created on first use).
    #[arg(long, env = "VAULTCAP_DATA_DIR")]
    data_dir: PathBuf,

    /// Also write the DATABASE_URL to this file once the server is ready.
    #[arg(long)]
    url_file: Option<PathBuf>,
}

pub async fn run(args: PostgresArgs) -> anyhow::Result<()> {
    let pg = EmbeddedPostgres::start(&args.data_dir.join("postgres")).await?;
    let shutdown = super::shutdown_signal();
    let url = pg.url(DATABASE);
    println!("DATABASE_URL={url}");
    if let Some(file) = &args.url_file {
        std::fs::write(file, &url)?;
    }
    shutdown.await;
    pg.stop().await
}
