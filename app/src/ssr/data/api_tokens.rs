//! Admin API tokens for the key API; only their hashes are stored.

use sqlx::PgExecutor;

pub async fn insert(
    db: impl PgExecutor<'_>,
    name: &str,
    hash: &[u8],
    prefix: &str,
    created_by: Option<i64>,
) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "INSERT INTO api_tokens (name, token_hash, token_prefix, created_by) VALUES ($1, $2, $3, $4) RETURNING id",
    )
    .bind(name)
    .bind(hash)
    .bind(prefix)
    .bind(created_by)
    .fetch_one(db)
    .await
}

/// The id of the active token with this hash, marking it used.
pub async fn authenticate(
    db: impl PgExecutor<'_>,
    hash: &[u8],
) -> Result<Option<i64>, sqlx::Error> {
    sqlx::query_scalar(
        "UPDATE api_tokens SET last_used_at = now() WHERE token_hash = $1 AND revoked_at IS NULL RETURNING id",
    )
    .bind(hash)
    .fetch_optional(db)
    .await
}
