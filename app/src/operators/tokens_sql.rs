//! API tokens for the key API: scoped, expiring, and stored only as hashes.

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;

use crate::domain::{ApiScope, ApiTokenId, ApiTokenSummary, Cents, OperatorId, TokenStatus};

/// A token about to be stored.
pub struct NewApiToken<'a> {
    pub name: &'a str,
    pub hash: &'a [u8],
    pub prefix: &'a str,
    pub scopes: &'a [ApiScope],
    pub expires_at: DateTime<Utc>,
    /// The operator who made it; `None` from the command line.
    pub created_by: Option<OperatorId>,
    /// The largest cap it may have issued without an approver.
    pub max_cap_cents: Option<Cents>,
}

#[tracing::instrument(skip_all)]
pub async fn insert(
    db: impl PgExecutor<'_>,
    token: NewApiToken<'_>,
) -> Result<ApiTokenId, sqlx::Error> {
    sqlx::query_scalar(
        "INSERT INTO api_tokens (name, token_hash, token_prefix, scopes, expires_at, created_by, max_cap_cents)
         VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id",
    )
    .bind(token.name)
    .bind(token.hash)
    .bind(token.prefix)
    .bind(scope_names(token.scopes))
    .bind(token.expires_at)
    .bind(token.created_by)
    .bind(token.max_cap_cents)
    .fetch_one(db)
    .await
}

fn scope_names(scopes: &[ApiScope]) -> Vec<&'static str> {
    scopes.iter().map(|scope| scope.as_str()).collect()
}

/// What a presented token turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Presented {
    Unknown,
    Revoked {
        id: ApiTokenId,
        at: DateTime<Utc>,
    },
    Expired {
        id: ApiTokenId,
        at: DateTime<Utc>,
    },
    Active {
        id: ApiTokenId,
        scopes: Vec<ApiScope>,
    },
}

/// What the token with this hash is, and what it may do while active.
#[tracing::instrument(skip_all)]
pub async fn authenticate(db: impl PgExecutor<'_>, hash: &[u8]) -> Result<Presented, sqlx::Error> {
    #[derive(sqlx::FromRow)]
    struct Row {
        id: ApiTokenId,
        scopes: Vec<String>,
        expires_at: DateTime<Utc>,
        revoked_at: Option<DateTime<Utc>>,
    }
    let row: Option<Row> = sqlx::query_as(
        "SELECT id, scopes, expires_at, revoked_at FROM api_tokens WHERE token_hash = $1",
    )
    .bind(hash)
    .fetch_optional(db)
    .await?;
    let Some(Row {
        id,
        scopes,
        expires_at,
        revoked_at,
    }) = row
    else {
        return Ok(Presented::Unknown);
    };
    if let Some(at) = revoked_at {
        return Ok(Presented::Revoked { id, at });
    }
    if expires_at <= Utc::now() {
        return Ok(Presented::Expired { id, at: expires_at });
    }
    Ok(Presented::Active {
        id,
        scopes: parse_scopes(id, &scopes)?,
    })
}

/// Records that the token was just used (for the API tokens page).
#[tracing::instrument(skip_all)]
pub async fn mark_used(db: impl PgExecutor<'_>, id: ApiTokenId) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE api_tokens SET last_used_at = now() WHERE id = $1")
        .bind(id)
        .execute(db)
        .await?;
    Ok(())
}

/// Scopes as stored; the table's check keeps them known, so an unknown one
/// is corrupt data, named as such rather than skipped.
fn parse_scopes(id: ApiTokenId, names: &[String]) -> Result<Vec<ApiScope>, sqlx::Error> {
    names
        .iter()
        .map(|name| name.parse())
        .collect::<Result<_, _>>()
        .map_err(|err: crate::domain::ParseError| {
            sqlx::Error::Decode(format!("api_tokens row {id}: {err}").into())
        })
}

/// Every token: working ones first, then newest first.
#[tracing::instrument(skip_all)]
pub async fn list(db: impl PgExecutor<'_>) -> Result<Vec<ApiTokenSummary>, sqlx::Error> {
    let rows: Vec<TokenRow> = sqlx::query_as(
        "SELECT t.id, t.name, t.token_prefix, t.scopes, t.created_at,
                COALESCE(o.email, 'command line') AS created_by, t.expires_at, t.last_used_at, t.max_cap_cents,
                CASE WHEN t.revoked_at IS NOT NULL THEN 'revoked'
                     WHEN t.expires_at <= now() THEN 'expired' ELSE 'active' END AS status
         FROM api_tokens t LEFT JOIN operators o ON o.id = t.created_by
         ORDER BY (t.revoked_at IS NULL AND t.expires_at > now()) DESC, t.created_at DESC, t.id DESC",
    )
    .fetch_all(db)
    .await?;
    rows.into_iter().map(TokenRow::summary).collect()
}

#[derive(sqlx::FromRow)]
struct TokenRow {
    id: ApiTokenId,
    name: String,
    token_prefix: String,
    scopes: Vec<String>,
    created_at: DateTime<Utc>,
    created_by: String,
    expires_at: DateTime<Utc>,
    last_used_at: Option<DateTime<Utc>>,
    max_cap_cents: Option<Cents>,
    status: String,
}

impl TokenRow {
    fn summary(self) -> Result<ApiTokenSummary, sqlx::Error> {
        let status = match self.status.as_str() {
            "revoked" => TokenStatus::Revoked,
            "expired" => TokenStatus::Expired,
            "active" => TokenStatus::Active,
            other => {
                return Err(sqlx::Error::Decode(
                    format!("api_tokens row {}: status `{other}`", self.id).into(),
                ))
            }
        };
        Ok(ApiTokenSummary {
            scopes: parse_scopes(self.id, &self.scopes)?,
            id: self.id,
            name: self.name,
            prefix: self.token_prefix,
            created_at: self.created_at,
            created_by: self.created_by,
            expires_at: self.expires_at,
            last_used_at: self.last_used_at,
            max_cap_cents: self.max_cap_cents,
            status,
        })
    }
}

/// Revokes a token, answering its name; `None` when there is no such token
/// or it was already revoked.
#[tracing::instrument(skip_all)]
pub async fn revoke(
    db: impl PgExecutor<'_>,
    id: ApiTokenId,
    by: Option<OperatorId>,
) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar(
        "UPDATE api_tokens SET revoked_at = now(), revoked_by = $2
         WHERE id = $1 AND revoked_at IS NULL RETURNING name",
    )
    .bind(id)
    .bind(by)
    .fetch_optional(db)
    .await
}
