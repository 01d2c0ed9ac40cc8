use chrono::{DateTime, Utc};
use sqlx::{PgExecutor, Postgres};

use crate::domain::{Email, Me, OperatorId, OperatorSummary, Role};

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct OperatorRow {
    pub id: OperatorId,
    pub email: String,
    #[sqlx(try_from = "String")]
    pub role: Role,
    pub password_hash: String,
    pub disabled_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    /// When the second factor was turned on: sign-in then asks for a code.
    pub totp_enabled_at: Option<DateTime<Utc>>,
}

impl OperatorRow {
    pub fn me(&self) -> Me {
        Me {
            id: self.id,
            email: self.email.clone(),
            role: self.role,
        }
    }

    pub fn summary(&self) -> OperatorSummary {
        OperatorSummary {
            id: self.id,
            email: self.email.clone(),
            role: self.role,
            disabled: self.disabled_at.is_some(),
            created_at: self.created_at,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum InsertError {
    #[error("an operator with this email already exists")]
    EmailTaken,
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

const COLUMNS: &str = "id, email, role, password_hash, disabled_at, created_at, totp_enabled_at";

#[tracing::instrument(skip_all)]
pub async fn insert(
    db: impl PgExecutor<'_>,
    email: &Email,
    role: Role,
    password_hash: &str,
    created_by: Option<OperatorId>,
) -> Result<OperatorRow, InsertError> {
    sqlx::query_as::<Postgres, OperatorRow>(&format!(
        "INSERT INTO operators (email, role, password_hash, created_by)
         VALUES ($1, $2, $3, $4) RETURNING {COLUMNS}"
    ))
    .bind(email.as_str())
    .bind(role.as_str())
    .bind(password_hash)
    .bind(created_by)
    .fetch_one(db)
    .await
    .map_err(|err| match &err {
        sqlx::Error::Database(db_err) if db_err.constraint() == Some("operators_email_key") => {
            InsertError::EmailTaken
        }
        _ => InsertError::Database(err),
    })
}

#[tracing::instrument(skip_all)]
pub async fn find_by_email(
    db: impl PgExecutor<'_>,
    email: &Email,
) -> Result<Option<OperatorRow>, sqlx::Error> {
    sqlx::query_as(&format!("SELECT {COLUMNS} FROM operators WHERE email = $1"))
        .bind(email.as_str())
        .fetch_optional(db)
        .await
}

#[tracing::instrument(skip_all)]
pub async fn find_by_id(
    db: impl PgExecutor<'_>,
    id: OperatorId,
) -> Result<Option<OperatorRow>, sqlx::Error> {
    sqlx::query_as(&format!("SELECT {COLUMNS} FROM operators WHERE id = $1"))
        .bind(id)
        .fetch_optional(db)
        .await
}

/// Every operator, active first, then by email.
#[tracing::instrument(skip_all)]
pub async fn list(db: impl PgExecutor<'_>) -> Result<Vec<OperatorRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM operators ORDER BY disabled_at IS NOT NULL, email"
    ))
    .fetch_all(db)
    .await
}

#[tracing::instrument(skip_all)]
pub async fn count(db: impl PgExecutor<'_>) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT count(*) FROM operators")
        .fetch_one(db)
        .await
}

/// Active admins other than `except`: an admin change must leave at least one.
#[tracing::instrument(skip_all)]
pub async fn count_other_active_admins(
    db: impl PgExecutor<'_>,
    except: OperatorId,
) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT count(*) FROM operators WHERE role = 'admin' AND disabled_at IS NULL AND id <> $1",
    )
    .bind(except)
    .fetch_one(db)
    .await
}

#[tracing::instrument(skip_all)]
pub async fn set_role(
    db: impl PgExecutor<'_>,
    id: OperatorId,
    role: Role,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query("UPDATE operators SET role = $2 WHERE id = $1")
        .bind(id)
        .bind(role.as_str())
        .execute(db)
        .await?;
    Ok(done.rows_affected() == 1)
}

#[tracing::instrument(skip_all)]
pub async fn set_disabled(
    db: impl PgExecutor<'_>,
    id: OperatorId,
    disabled: bool,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "UPDATE operators SET disabled_at = CASE WHEN $2 THEN coalesce(disabled_at, now()) END
         WHERE id = $1",
    )
    .bind(id)
    .bind(disabled)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

#[tracing::instrument(skip_all)]
pub async fn set_password_hash(
    db: impl PgExecutor<'_>,
    id: OperatorId,
    hash: &str,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query("UPDATE operators SET password_hash = $2 WHERE id = $1")
        .bind(id)
        .bind(hash)
        .execute(db)
        .await?;
    Ok(done.rows_affected() == 1)
}
