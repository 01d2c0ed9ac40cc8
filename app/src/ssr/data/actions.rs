//! The operator action log: who did what, when. Append-only.

use std::net::IpAddr;

use sqlx::PgExecutor;

/// Who performed an action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Actor {
    /// A signed-in operator in the console.
    Operator { id: i64, ip: Option<IpAddr> },
    /// A billing job or tool with an admin API token.
    ApiToken { id: i64 },
    /// The `vaultcap` command line on the server host.
    Cli,
    /// Vaultcap itself (bootstrap, sweeps).
    System,
}

pub async fn record(
    db: impl PgExecutor<'_>,
    actor: Actor,
    action: &str,
    subject_type: &str,
    subject_id: Option<String>,
    details: serde_json::Value,
) -> Result<(), sqlx::Error> {
    let (operator_id, api_token_id, via, ip) = match actor {
        Actor::Operator { id, ip } => (Some(id), None, "console", ip),
        Actor::ApiToken { id } => (None, Some(id), "api", None),
        Actor::Cli => (None, None, "cli", None),
        Actor::System => (None, None, "system", None),
    };
    sqlx::query(
        "INSERT INTO operator_actions (operator_id, api_token_id, via, ip, action, subject_type, subject_id, details)
         VALUES ($1, $2, $3, $4::inet, $5, $6, $7, $8)",
    )
    .bind(operator_id)
    .bind(api_token_id)
    .bind(via)
    .bind(ip.map(|ip| ip.to_string()))
    .bind(action)
    .bind(subject_type)
    .bind(subject_id)
    .bind(details)
    .execute(db)
    .await?;
    Ok(())
}
