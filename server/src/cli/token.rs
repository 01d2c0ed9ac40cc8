use clap::Subcommand;

use app::ssr::{
    data::{
        actions::{self, Actor},
        api_tokens,
    },
    secrets::Secret,
};

use crate::{config::DatabaseArgs, db::Database};

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create an admin API token for the key API; prints it once.
    Add {
        /// What the token is for, e.g. "billing job (prod)".
        #[arg(long)]
        name: String,
        #[command(flatten)]
        database: DatabaseArgs,
    },
}

pub async fn run(command: TokenCommand) -> anyhow::Result<()> {
    match command {
        TokenCommand::Add { name, database } => {
            let name = name.trim().to_owned();
            if name.is_empty() || name.chars().count() > 200 {
                anyhow::bail!("--name needs between 1 and 200 characters");
            }
            let secret = Secret::generate("vct_");
            let db = Database::open(&database).await?;
            let result = async {
                let mut tx = db.pool.begin().await?;
                let id =
                    api_tokens::insert(&mut *tx, &name, &secret.hash, &secret.prefix, None).await?;
                actions::record(
                    &mut *tx,
                    Actor::Cli,
                    "create_api_token",
                    "api_token",
                    Some(id.to_string()),
                    serde_json::json!({ "name": name, "prefix": secret.prefix }),
                )
                .await?;
                tx.commit().await?;
                Ok::<_, sqlx::Error>(id)
            }
            .await;
            db.close().await?;
            let id = result?;
            println!(
                "Created API token {id} ({name}). Token (shown once): {}",
                secret.plaintext
            );
        }
    }
    Ok(())
}
