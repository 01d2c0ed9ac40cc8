use std::io::BufRead;

use anyhow::Context;
use app::{
    actions::sql::{self as actions, Actor},
    domain::{Email, Role},
    operators::{
        accounts,
        auth::{check_password_strength, generate_password, hash_password},
        second_factor, sql as operators,
    },
};
use clap::{Args, Subcommand};

use crate::{config::DatabaseArgs, db::Database};

#[derive(Debug, Subcommand)]
pub enum OperatorCommand {
    /// Add an operator. Prints a generated password once, unless
    /// --password-stdin supplies one.
    Add {
        #[command(flatten)]
        who: Who,
        /// viewer, operator, approver or admin.
        #[arg(long, value_parser = parse_role)]
        role: Role,
        #[command(flatten)]
        password: PasswordSource,
        #[command(flatten)]
        database: DatabaseArgs,
    },
    /// Give an operator a new password (for a locked-out admin, say).
    ResetPassword {
        #[command(flatten)]
        who: Who,
        #[command(flatten)]
        password: PasswordSource,
        #[command(flatten)]
        database: DatabaseArgs,
    },
    /// Turn off an operator's two-factor sign-in and void their recovery
    /// codes (they lost their authenticator); they sign in with their
    /// password alone and can set it up again.
    ResetTwoFactor {
        #[command(flatten)]
        who: Who,
        #[command(flatten)]
        database: DatabaseArgs,
    },
    /// List operators.
    List {
        #[command(flatten)]
        database: DatabaseArgs,
    },
}

#[derive(Debug, Args)]
pub struct Who {
    #[arg(long, value_parser = parse_email)]
    email: Email,
}

#[derive(Debug, Args)]
pub struct PasswordSource {
    /// Read the password from the first line of standard input instead of
    /// generating one.
    #[arg(long)]
    password_stdin: bool,
}

impl PasswordSource {
    fn read(&self) -> anyhow::Result<Option<String>> {
        if !self.password_stdin {
            return Ok(None);
        }
        let mut line = String::new();
        std::io::stdin()
            .lock()
            .read_line(&mut line)
            .context("reading the password from stdin")?;
        Ok(Some(line.trim_end_matches(['\r', '\n']).to_owned()))
    }
}

fn parse_role(raw: &str) -> Result<Role, String> {
    raw.parse().map_err(|err: app::domain::ParseError| err.0)
}

fn parse_email(raw: &str) -> Result<Email, String> {
    Email::parse(raw).map_err(|err| err.0)
}

pub async fn run(command: OperatorCommand) -> anyhow::Result<()> {
    match command {
        OperatorCommand::Add {
            who,
            role,
            password,
            database,
        } => {
            let password = password.read()?;
            let db = Database::open(&database).await?;
            let result =
                accounts::add_operator(&db.pool, Actor::Cli, &who.email, role, password).await;
            db.close().await?;
            let (operator, generated) = result.map_err(|err| anyhow::anyhow!("{err}"))?;
            println!(
                "Added {} ({}), id {}.",
                operator.email, operator.role, operator.id
            );
            if let Some(password) = generated {
                println!("Password (shown once): {password}");
            }
        }
        OperatorCommand::ResetPassword {
            who,
            password,
            database,
        } => {
            let (password, generated) = match password.read()? {
                Some(chosen) => {
                    check_password_strength(&chosen).map_err(|err| anyhow::anyhow!("{err}"))?;
                    (chosen, false)
                }
                None => (generate_password(), true),
            };
            let to_hash = password.clone();
            let hash = tokio::task::spawn_blocking(move || hash_password(&to_hash)).await?;
            let db = Database::open(&database).await?;
            let result = reset_password(&db, &who.email, &hash).await;
            db.close().await?;
            result?;
            println!("New password set for {}.", who.email);
            if generated {
                println!("Password (shown once): {password}");
            }
        }
        OperatorCommand::ResetTwoFactor { who, database } => {
            let db = Database::open(&database).await?;
            let result = async {
                let operator = operators::find_by_email(&db.pool, &who.email)
                    .await?
                    .with_context(|| format!("no operator with email {}", who.email))?;
                second_factor::reset(&db.pool, Actor::Cli, operator.id, "second_factor.reset")
                    .await
                    .map_err(|err| anyhow::anyhow!("{err}"))
            }
            .await;
            db.close().await?;
            result?;
            println!(
                "Two-factor sign-in is off for {}: they sign in with their password and can set it up again.",
                who.email
            );
        }
        OperatorCommand::List { database } => {
            let db = Database::open(&database).await?;
            let rows = operators::list(&db.pool).await;
            db.close().await?;
            for op in rows? {
                let state = if op.disabled_at.is_some() {
                    "disabled"
                } else {
                    "active"
                };
                println!(
                    "{:>5}  {:<9} {:<8}  {}",
                    op.id,
                    op.role.as_str(),
                    state,
                    op.email
                );
            }
        }
    }
    Ok(())
}

async fn reset_password(db: &Database, email: &Email, hash: &str) -> anyhow::Result<()> {
    let operator = operators::find_by_email(&db.pool, email)
        .await?
        .with_context(|| format!("no operator with email {email}"))?;
    let mut tx = db.pool.begin().await?;
    operators::set_password_hash(&mut *tx, operator.id, hash).await?;
    actions::record(
        &mut *tx,
        Actor::Cli,
        "reset_password",
        "operator",
        Some(operator.id.to_string()),
        serde_json::json!({ "email": operator.email }),
    )
    .await?;
    tx.commit().await?;
    Ok(())
}
