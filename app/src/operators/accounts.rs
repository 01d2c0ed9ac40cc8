//! Operator accounts: sign-in, adding operators, roles and disabling. The
//! console's handlers and the command line both call these, so the rules
//! (last admin, self-lockout, throttling) live in one place.

use std::net::IpAddr;

use chrono::{Duration, Utc};
use serde_json::json;
use sqlx::PgPool;

use crate::{
    actions::sql::{self as actions, Actor},
    operators::{
        auth::{check_password_strength, generate_password, hash_password, Busy, PasswordChecks},
        login_failures::{self, Attempt},
        second_factor,
        sql::{self as operators, InsertError, OperatorRow},
    },
    ssr::{secrets, AuthConfig},
};
use crate::{
    domain::{Email, OperatorId, Role},
    error::AppError,
};

/// Why a sign-in was refused. Deliberately coarse: an unknown email and a
/// wrong password look the same to the person signing in.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignInError {
    #[error("Email or password is incorrect.")]
    Invalid,
    #[error("Too many failed sign-in attempts. Try again in {} seconds.", retry_after.num_seconds())]
    Throttled { retry_after: Duration },
    #[error("This account is disabled. Ask an administrator to enable it.")]
    Disabled,
    #[error("{0}")]
    Code(second_factor::CodeRefused),
    #[error("Vaultcap is busy checking other sign-ins. Try again in a few seconds.")]
    Busy,
    #[error("Something went wrong on our side; it has been logged. Try again in a moment.")]
    Internal,
}

impl From<sqlx::Error> for SignInError {
    fn from(err: sqlx::Error) -> Self {
        tracing::error!(error = %err, "database error during sign-in");
        SignInError::Internal
    }
}

/// Checks an email and password. The attempt is recorded as a failure
/// before the password is checked (see `login_failures`), so at most the
/// throttle's free failures are checked however many guesses arrive at once.
pub async fn sign_in(
    pool: &PgPool,
    config: &AuthConfig,
    checks: &PasswordChecks,
    raw_email: &str,
    password: String,
    ip: Option<IpAddr>,
) -> Result<PasswordChecked, SignInError> {
    // Count failures against the normalised address when there is one, so
    // "Ana@x.com" and "ana@x.com" share a budget.
    let email = Email::parse(raw_email);
    let throttle_key = email
        .as_ref()
        .map(|e| e.as_str().to_owned())
        .unwrap_or_else(|_| raw_email.trim().to_lowercase());
    let attempt = match login_failures::claim(pool, &throttle_key, ip, config.throttle).await? {
        Attempt::Claimed { id } => id,
        Attempt::Refused { retry_after } => return Err(SignInError::Throttled { retry_after }),
    };

    let operator = match &email {
        Ok(email) => operators::find_by_email(pool, email).await?,
        Err(_) => None,
    };
    let hash = operator.as_ref().map(|op| op.password_hash.clone());
    let verified = match checks.verify(password, hash).await {
        Ok(verified) => verified,
        Err(Busy) => {
            login_failures::forget(pool, attempt).await?;
            return Err(SignInError::Busy);
        }
    };
    let operator = match operator {
        Some(operator) if verified => operator,
        _ => {
            actions::record(
                pool,
                Actor::Visitor { ip },
                "sign_in_failed",
                "operator",
                None,
                json!({ "email": throttle_key, "reason": "wrong email or password" }),
            )
            .await?;
            return Err(SignInError::Invalid);
        }
    };
    if operator.disabled_at.is_some() {
        return Err(SignInError::Disabled);
    }
    login_failures::forget(pool, attempt).await?;
    if second_factor::required_for(&operator) {
        // The password was right; the failures stay counted until the code is.
        return Ok(PasswordChecked::NeedsCode(operator));
    }
    signed_in(pool, config, &throttle_key, &operator, ip, None).await?;
    Ok(PasswordChecked::SignedIn(operator))
}

/// What a right password leads to.
#[derive(Debug, Clone)]
pub enum PasswordChecked {
    SignedIn(OperatorRow),
    /// The operator has a second factor: sign-in asks for a code next.
    NeedsCode(OperatorRow),
}

/// The second step of signing in, for an operator whose password was right:
/// a code from their authenticator or a recovery code. A wrong code counts
/// as a failed sign-in, under the same throttle as passwords.
pub async fn sign_in_with_code(
    pool: &PgPool,
    config: &AuthConfig,
    operator_id: OperatorId,
    code: &str,
    ip: Option<IpAddr>,
) -> Result<OperatorRow, SignInError> {
    let operator = operators::find_by_id(pool, operator_id)
        .await?
        .ok_or(SignInError::Invalid)?;
    let attempt = match login_failures::claim(pool, &operator.email, ip, config.throttle).await? {
        Attempt::Claimed { id } => id,
        Attempt::Refused { retry_after } => return Err(SignInError::Throttled { retry_after }),
    };
    if operator.disabled_at.is_some() {
        return Err(SignInError::Disabled);
    }
    let checked = second_factor::check(pool, operator.id, &operator.email, code)
        .await
        .map_err(|_| SignInError::Internal)?;
    match checked {
        Ok(factor) => {
            login_failures::forget(pool, attempt).await?;
            signed_in(pool, config, &operator.email, &operator, ip, Some(factor)).await?;
            Ok(operator)
        }
        Err(refused) => {
            actions::record(
                pool,
                Actor::Visitor { ip },
                "sign_in_failed",
                "operator",
                Some(operator.id.to_string()),
                json!({ "email": operator.email, "reason": refused.to_string() }),
            )
            .await?;
            Err(SignInError::Code(refused))
        }
    }
}

/// Forgets the account's failures and records the sign-in.
async fn signed_in(
    pool: &PgPool,
    config: &AuthConfig,
    throttle_key: &str,
    operator: &OperatorRow,
    ip: Option<IpAddr>,
    factor: Option<second_factor::Factor>,
) -> Result<(), sqlx::Error> {
    login_failures::clear(pool, throttle_key, config.throttle.window).await?;
    let details = match factor {
        Some(factor) => json!({ "second_factor": factor.as_str() }),
        None => json!({}),
    };
    actions::record(
        pool,
        Actor::Operator {
            id: operator.id,
            ip,
        },
        "sign_in",
        "operator",
        Some(operator.id.to_string()),
        details,
    )
    .await
}

/// A new operator. Without a password one is generated and returned, to be
/// shown once.
pub async fn add_operator(
    pool: &PgPool,
    actor: Actor,
    email: &Email,
    role: Role,
    password: Option<String>,
) -> Result<(OperatorRow, Option<String>), AppError> {
    let (password, generated) = match password {
        Some(password) => {
            check_password_strength(&password)?;
            (password, false)
        }
        None => (generate_password(), true),
    };
    let hash = hash_in_background(password.clone()).await?;
    let created_by = match actor {
        Actor::Operator { id, .. } => Some(id),
        _ => None,
    };
    let mut tx = pool.begin().await?;
    let operator = operators::insert(&mut *tx, email, role, &hash, created_by)
        .await
        .map_err(|err| match err {
            InsertError::EmailTaken => AppError::Invalid(format!("{email} already has an account")),
            InsertError::Database(err) => err.into(),
        })?;
    actions::record(
        &mut *tx,
        actor,
        "add_operator",
        "operator",
        Some(operator.id.to_string()),
        json!({ "email": operator.email, "role": role }),
    )
    .await?;
    tx.commit().await?;
    Ok((operator, generated.then_some(password)))
}

/// How long an invitation link works.
pub const INVITATION_HOURS: i64 = 24;

/// Adds an operator who sets their own password from a one-time invitation
/// link; answers the operator and the link's token, to be passed on once.
/// Until the link is used nobody can sign in as them.
pub async fn invite_operator(
    pool: &PgPool,
    actor: Actor,
    email: &Email,
    role: Role,
) -> Result<(OperatorRow, String), AppError> {
    let created_by = match actor {
        Actor::Operator { id, .. } => Some(id),
        _ => None,
    };
    let token = secrets::Secret::generate("inv_");
    let mut tx = pool.begin().await?;
    let operator = operators::insert(&mut *tx, email, role, UNUSABLE_PASSWORD, created_by)
        .await
        .map_err(|err| match err {
            InsertError::EmailTaken => AppError::Invalid(format!("{email} already has an account")),
            InsertError::Database(err) => err.into(),
        })?;
    let expires_at = Utc::now() + Duration::hours(INVITATION_HOURS);
    sqlx::query(
        "INSERT INTO operator_invitations (operator_id, token_hash, created_by, expires_at)
         VALUES ($1, $2, $3, $4)",
    )
    .bind(operator.id)
    .bind(&token.hash)
    .bind(created_by)
    .bind(expires_at)
    .execute(&mut *tx)
    .await?;
    actions::record(
        &mut *tx,
        actor,
        "add_operator",
        "operator",
        Some(operator.id.to_string()),
        json!({ "email": operator.email, "role": role, "invitation_expires_at": expires_at }),
    )
    .await?;
    tx.commit().await?;
    Ok((operator, token.plaintext))
}

/// A password hash no password matches (not a PHC string): an invited
/// operator's until they set their own.
const UNUSABLE_PASSWORD: &str = "!";

/// Sets an invited operator's password from their link, once, within its
/// 24 hours. A used, expired or unknown link changes nothing.
pub async fn accept_invitation(
    pool: &PgPool,
    token: &str,
    password: String,
    ip: Option<IpAddr>,
) -> Result<OperatorRow, AppError> {
    check_password_strength(&password)?;
    let hash = hash_in_background(password).await?;
    let mut tx = pool.begin().await?;
    #[derive(sqlx::FromRow)]
    struct Invitation {
        id: i64,
        operator_id: OperatorId,
        expires_at: chrono::DateTime<Utc>,
        used_at: Option<chrono::DateTime<Utc>>,
    }
    let invitation: Option<Invitation> = sqlx::query_as(
        "SELECT id, operator_id, expires_at, used_at FROM operator_invitations
         WHERE token_hash = $1 FOR UPDATE",
    )
    .bind(secrets::hash(token))
    .fetch_optional(&mut *tx)
    .await?;
    let Some(Invitation {
        id,
        operator_id,
        expires_at,
        used_at,
    }) = invitation
    else {
        return Err(AppError::Invalid(
            "this invitation link is not valid: check that it was copied whole, or ask an admin for a new one".into(),
        ));
    };
    if let Some(used_at) = used_at {
        return Err(AppError::Invalid(format!(
            "this invitation link was already used on {} UTC: sign in with the password set then, or ask an admin to reset it",
            used_at.format("%Y-%m-%d %H:%M")
        )));
    }
    if expires_at <= Utc::now() {
        return Err(AppError::Invalid(format!(
            "this invitation link expired on {} UTC: ask an admin for a new one",
            expires_at.format("%Y-%m-%d %H:%M")
        )));
    }
    sqlx::query("UPDATE operator_invitations SET used_at = now() WHERE id = $1")
        .bind(id)
        .execute(&mut *tx)
        .await?;
    sqlx::query("UPDATE operators SET password_hash = $2 WHERE id = $1 AND password_hash = $3")
        .bind(operator_id)
        .bind(&hash)
        .bind(UNUSABLE_PASSWORD)
        .execute(&mut *tx)
        .await?;
    let operator = operators::find_by_id(&mut *tx, operator_id)
        .await?
        .ok_or(AppError::NotFound)?;
    actions::record(
        &mut *tx,
        Actor::Operator {
            id: operator_id,
            ip,
        },
        "accept_invitation",
        "operator",
        Some(operator_id.to_string()),
        json!({ "email": operator.email }),
    )
    .await?;
    tx.commit().await?;
    Ok(operator)
}

async fn hash_in_background(password: String) -> Result<String, AppError> {
    tokio::task::spawn_blocking(move || hash_password(&password))
        .await
        .map_err(|err| {
            tracing::error!(error = %err, "password hashing task failed");
            AppError::Internal
        })
}

/// Creates the first admin when there are no operators at all, so a fresh
/// installation can be signed into. Returns the generated password (to be
/// printed once), or `None` when operators already exist.
pub async fn bootstrap_admin(pool: &PgPool, email: &Email) -> Result<Option<String>, AppError> {
    let mut tx = pool.begin().await?;
    // Two instances starting at once must not both create an admin.
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('vaultcap.bootstrap_admin'))")
        .execute(&mut *tx)
        .await?;
    if operators::count(&mut *tx).await? > 0 {
        return Ok(None);
    }
    let password = generate_password();
    let hash = hash_in_background(password.clone()).await?;
    let operator = operators::insert(&mut *tx, email, Role::Admin, &hash, None)
        .await
        .map_err(|err| match err {
            InsertError::EmailTaken => AppError::Internal,
            InsertError::Database(err) => err.into(),
        })?;
    actions::record(
        &mut *tx,
        Actor::System,
        "bootstrap_admin",
        "operator",
        Some(operator.id.to_string()),
        json!({ "email": operator.email }),
    )
    .await?;
    tx.commit().await?;
    Ok(Some(password))
}

/// Changes an operator's role. The last active admin cannot be demoted, so
/// the installation never loses the ability to manage operators.
pub async fn change_role(
    pool: &PgPool,
    actor: Actor,
    target: OperatorId,
    role: Role,
) -> Result<OperatorRow, AppError> {
    let mut tx = pool.begin().await?;
    lock_admin_changes(&mut tx).await?;
    let operator = operators::find_by_id(&mut *tx, target)
        .await?
        .ok_or(AppError::NotFound)?;
    if operator.role == role {
        return Ok(operator);
    }
    if operator.role == Role::Admin
        && operator.disabled_at.is_none()
        && operators::count_other_active_admins(&mut *tx, target).await? == 0
    {
        return Err(AppError::Invalid(format!(
            "{} is the only active admin; make someone else admin first",
            operator.email
        )));
    }
    operators::set_role(&mut *tx, target, role).await?;
    actions::record(
        &mut *tx,
        actor,
        "change_role",
        "operator",
        Some(target.to_string()),
        json!({ "email": operator.email, "from": operator.role, "to": role }),
    )
    .await?;
    tx.commit().await?;
    Ok(OperatorRow { role, ..operator })
}

/// Disables or re-enables an operator. Disabling ends their sessions on the
/// next request. Nobody can disable themselves or the last active admin.
pub async fn set_disabled(
    pool: &PgPool,
    actor: Actor,
    target: OperatorId,
    disabled: bool,
) -> Result<OperatorRow, AppError> {
    if let Actor::Operator { id, .. } = actor {
        if id == target && disabled {
            return Err(AppError::Invalid(
                "you cannot disable your own account".into(),
            ));
        }
    }
    let mut tx = pool.begin().await?;
    lock_admin_changes(&mut tx).await?;
    let operator = operators::find_by_id(&mut *tx, target)
        .await?
        .ok_or(AppError::NotFound)?;
    if disabled
        && operator.role == Role::Admin
        && operators::count_other_active_admins(&mut *tx, target).await? == 0
    {
        return Err(AppError::Invalid(format!(
            "{} is the only active admin and cannot be disabled",
            operator.email
        )));
    }
    operators::set_disabled(&mut *tx, target, disabled).await?;
    actions::record(
        &mut *tx,
        actor,
        if disabled {
            "disable_operator"
        } else {
            "enable_operator"
        },
        "operator",
        Some(target.to_string()),
        json!({ "email": operator.email }),
    )
    .await?;
    tx.commit().await?;
    Ok(OperatorRow {
        disabled_at: disabled.then(Utc::now),
        ..operator
    })
}

/// Serialises changes that could remove the last admin, so two admins
/// demoting each other at once cannot both succeed.
async fn lock_admin_changes(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('vaultcap.admin_changes'))")
        .execute(&mut **tx)
        .await?;
    Ok(())
}
