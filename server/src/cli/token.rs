use clap::Subcommand;

use app::{
    actions::sql::Actor,
    domain::{parse_token_ceiling, parse_token_days, ApiScope},
    operators::{tokens, tokens_sql as api_tokens},
};

use crate::{config::DatabaseArgs, db::Database};

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create an API token for the key API; prints it once.
    Add {
        /// What the token is for, e.g. "billing job (prod)".
        #[arg(long)]
        name: String,
        /// What it may do, comma-separated or repeated: keys:create,
        /// keys:read, keys:revoke, alerts:read, alerts:ack, audit:export,
        /// cap_requests:create.
        #[arg(long = "scope", required = true)]
        scopes: Vec<String>,
        /// How many days it lives (1 to 366).
        #[arg(long, default_value = "90")]
        expires_in_days: String,
        /// The largest cap a key made with it may have without an
        /// approver, in minor units of the key's currency (cents).
        #[arg(long)]
        max_cap_cents: Option<String>,
        #[command(flatten)]
        database: DatabaseArgs,
    },
    /// List every token: scopes, expiry, last use, status.
    List {
        #[command(flatten)]
        database: DatabaseArgs,
    },
    /// Revoke a token at once; its next call is refused.
    Revoke {
        /// The token's id, as `token list` shows it.
        id: app::domain::ApiTokenId,
        #[command(flatten)]
        database: DatabaseArgs,
    },
}

pub async fn run(command: TokenCommand) -> anyhow::Result<()> {
    match command {
        TokenCommand::Add {
            name,
            scopes,
            expires_in_days,
            max_cap_cents,
            database,
        } => {
            let scopes = ApiScope::parse_list(&scopes.join(","))?;
            let days = parse_token_days(&expires_in_days)?;
            let ceiling = parse_token_ceiling(max_cap_cents.as_deref().unwrap_or(""))?;
            let db = Database::open(&database).await?;
            let created = tokens::create(&db.pool, Actor::Cli, &name, &scopes, days, ceiling).await;
            db.close().await?;
            let created = created?;
            println!(
                "Created API token {} ({}) with {}, valid {days} days. Token (shown once): {}",
                created.id,
                name.trim(),
                ApiScope::join(&scopes),
                created.secret.plaintext
            );
        }
        TokenCommand::List { database } => {
            let db = Database::open(&database).await?;
            let listed = api_tokens::list(&db.pool).await;
            db.close().await?;
            println!("id\tstatus\tprefix\tname\tscopes\texpires\tlast used");
            for token in listed? {
                println!(
                    "{}\t{}\t{}\t{}\t{}\t{}\t{}",
                    token.id,
                    token.status.as_str(),
                    token.prefix,
                    token.name,
                    ApiScope::join(&token.scopes),
                    token.expires_at.format("%Y-%m-%d %H:%M UTC"),
                    token
                        .last_used_at
                        .map(|at| at.format("%Y-%m-%d %H:%M UTC").to_string())
                        .unwrap_or_else(|| "never".into()),
                );
            }
        }
        TokenCommand::Revoke { id, database } => {
            let db = Database::open(&database).await?;
            let revoked = tokens::revoke(&db.pool, Actor::Cli, id).await;
            db.close().await?;
            println!("Revoked API token {id} ({}).", revoked?);
        }
    }
    Ok(())
}
