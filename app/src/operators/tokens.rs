//! Making and revoking API tokens: the rules the console and the command
//! line share (a name, at least one scope, a bounded lifetime, the action
//! log).

use chrono::{Duration, Utc};
use serde_json::json;
use sqlx::PgPool;

use crate::{
    actions::sql::{self as actions, Actor},
    operators::tokens_sql::{self as api_tokens, NewApiToken},
    ssr::secrets::Secret,
};
use crate::{
    domain::{ApiScope, ApiTokenId, Cents},
    error::AppError,
};

/// A token just made: its id and the secret, shown once.
pub struct Created {
    pub id: ApiTokenId,
    pub secret: Secret,
}

pub async fn create(
    pool: &PgPool,
    actor: Actor,
    name: &str,
    scopes: &[ApiScope],
    days: i64,
    max_cap_cents: Option<Cents>,
) -> Result<Created, AppError> {
    let name = name.trim();
    if name.is_empty() || name.chars().count() > 200 {
        return Err(AppError::Invalid(
            "a token needs a name of 1 to 200 characters, e.g. \"billing job (prod)\"".into(),
        ));
    }
    if scopes.is_empty() {
        return Err(AppError::Invalid("a token needs at least one scope".into()));
    }
    let secret = Secret::generate("vct_");
    let created_by = match actor {
        Actor::Operator { id, .. } => Some(id),
        _ => None,
    };
    let expires_at = Utc::now() + Duration::days(days);
    let mut tx = pool.begin().await?;
    let id = api_tokens::insert(
        &mut *tx,
        NewApiToken {
            name,
            hash: &secret.hash,
            prefix: &secret.prefix,
            scopes,
            expires_at,
            created_by,
            max_cap_cents,
        },
    )
    .await?;
    actions::record(
        &mut *tx,
        actor,
        "create_api_token",
        "api_token",
        Some(id.to_string()),
        json!({
            "name": name,
            "prefix": secret.prefix,
            "scopes": scopes,
            "expires_at": expires_at,
            "max_cap_cents": max_cap_cents,
        }),
    )
    .await?;
    tx.commit().await?;
    Ok(Created { id, secret })
}

/// Revokes a token at once: its next call is refused. Answers its name.
pub async fn revoke(pool: &PgPool, actor: Actor, id: ApiTokenId) -> Result<String, AppError> {
    let by = match actor {
        Actor::Operator { id, .. } => Some(id),
        _ => None,
    };
    let mut tx = pool.begin().await?;
    let Some(name) = api_tokens::revoke(&mut *tx, id, by).await? else {
        return Err(AppError::Invalid(format!(
            "token {id} does not exist or was already revoked"
        )));
    };
    actions::record(
        &mut *tx,
        actor,
        "revoke_api_token",
        "api_token",
        Some(id.to_string()),
        json!({ "name": name }),
    )
    .await?;
    tx.commit().await?;
    Ok(name)
}
