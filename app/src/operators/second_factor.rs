//! The optional second factor for approvers and admins: a TOTP authenticator
//! (RFC 6238: SHA-1, 6 digits, 30-second steps, one step of clock skew either
//! way) and ten single-use recovery codes.
//!
//! Setting up makes a pending secret, shown as a QR code until a first code
//! from the authenticator confirms it; only then does sign-in ask for codes.
//! A code is accepted once: the newest accepted step is stored and an older
//! or equal one is refused, so a code seen over someone's shoulder is
//! worthless once used. Wrong codes count as failed sign-ins (the same
//! throttle as passwords), so codes cannot be guessed faster than passwords.

use chrono::Utc;
use rand::{distributions::Slice, Rng, RngCore};
use serde_json::json;
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use totp_rs::{Algorithm, TOTP};

use crate::{
    actions::sql::{self as actions, Actor},
    operators::{
        login_failures::{self, Attempt, Limits},
        sql::OperatorRow,
    },
};
use crate::{
    domain::{Enrollment, Me, OperatorId, Role, TwoFactorView},
    error::AppError,
};

const ISSUER: &str = "Vaultcap";
const STEP_SECONDS: i64 = 30;
const RECOVERY_CODES: usize = 10;

/// Whether `role` may use (and so set up) a second factor.
pub fn offered_to(role: Role) -> bool {
    role.allows(Role::Approver)
}

fn totp(secret: &[u8], email: &str) -> Result<TOTP, AppError> {
    TOTP::new(
        Algorithm::SHA1,
        6,
        1,
        STEP_SECONDS as u64,
        secret.to_vec(),
        Some(ISSUER.into()),
        email.into(),
    )
    .map_err(|err| {
        tracing::error!(error = %err, "a stored TOTP secret is unusable");
        AppError::Internal
    })
}

/// The time step `code` is valid for at `now` (Unix seconds), if any.
fn matching_step(totp: &TOTP, code: &str, now: i64) -> Option<i64> {
    if code.len() != 6 || !code.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let current = now / STEP_SECONDS;
    (current - 1..=current + 1).find(|step| {
        let expected = totp.generate((step * STEP_SECONDS) as u64);
        // Compared without an early exit.
        expected
            .bytes()
            .zip(code.bytes())
            .fold(0u8, |diff, (a, b)| diff | (a ^ b))
            == 0
    })
}

/// A code as typed: spaces and dashes dropped, lower case.
fn normalise(code: &str) -> String {
    code.chars()
        .filter(|c| !c.is_whitespace() && *c != '-')
        .flat_map(char::to_lowercase)
        .collect()
}

fn recovery_hash(code: &str) -> Vec<u8> {
    Sha256::digest(normalise(code).as_bytes()).to_vec()
}

/// Ten codes of ten characters without look-alikes (about 50 bits each),
/// written `xxxxx-xxxxx`.
fn new_recovery_codes() -> Vec<String> {
    const ALPHABET: &[char] = &[
        'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'j', 'k', 'm', 'n', 'p', 'q', 'r', 's', 't', 'u',
        'v', 'w', 'x', 'y', 'z', '2', '3', '4', '5', '6', '7', '8', '9',
    ];
    let dist = Slice::new(ALPHABET).expect("non-empty alphabet");
    (0..RECOVERY_CODES)
        .map(|_| {
            let chars: String = rand::thread_rng().sample_iter(dist).take(10).collect();
            format!("{}-{}", &chars[..5], &chars[5..])
        })
        .collect()
}

/// What the two-factor page shows `me`.
pub async fn view(pool: &PgPool, me: &Me) -> Result<TwoFactorView, AppError> {
    let (pending, enabled_at, left): (Option<Vec<u8>>, Option<chrono::DateTime<Utc>>, i64) =
        sqlx::query_as(
            "SELECT totp_pending_secret, totp_enabled_at,
                    (SELECT count(*) FROM recovery_codes c WHERE c.operator_id = o.id AND c.used_at IS NULL)
             FROM operators o WHERE id = $1",
        )
        .bind(me.id)
        .fetch_one(pool)
        .await?;
    let enrollment = match (&pending, enabled_at) {
        (Some(secret), None) => Some(enrollment(secret, &me.email)?),
        _ => None,
    };
    Ok(TwoFactorView {
        offered: offered_to(me.role),
        enabled_at,
        recovery_codes_left: left,
        enrollment,
    })
}

fn enrollment(secret: &[u8], email: &str) -> Result<Enrollment, AppError> {
    let totp = totp(secret, email)?;
    let uri = totp.get_url();
    let qr_svg = qrcode::QrCode::new(uri.as_bytes())
        .map_err(|_| AppError::Internal)?
        .render::<qrcode::render::svg::Color>()
        .min_dimensions(200, 200)
        .quiet_zone(true)
        .build();
    let base32 = totp.get_secret_base32();
    Ok(Enrollment {
        // Groups of four, as authenticator apps show them.
        secret: base32
            .as_bytes()
            .chunks(4)
            .map(|c| String::from_utf8_lossy(c).into_owned())
            .collect::<Vec<_>>()
            .join(" "),
        uri,
        qr_svg,
    })
}

fn refuse_unless_offered(me: &Me) -> Result<(), AppError> {
    if offered_to(me.role) {
        Ok(())
    } else {
        Err(AppError::Forbidden(Role::Approver))
    }
}

/// Makes a new pending secret (replacing an earlier unconfirmed one).
pub async fn begin(pool: &PgPool, me: &Me) -> Result<(), AppError> {
    refuse_unless_offered(me)?;
    let mut secret = [0u8; 20];
    rand::thread_rng().fill_bytes(&mut secret);
    let updated = sqlx::query(
        "UPDATE operators SET totp_pending_secret = $2 WHERE id = $1 AND totp_secret IS NULL",
    )
    .bind(me.id)
    .bind(&secret[..])
    .execute(pool)
    .await?;
    if updated.rows_affected() == 0 {
        return Err(AppError::Invalid(
            "two-factor sign-in is already on; turn it off first to set up another authenticator"
                .into(),
        ));
    }
    Ok(())
}

/// Confirms the pending secret with a code from the authenticator: sign-in
/// asks for codes from now on. Returns the recovery codes, to be shown once.
pub async fn confirm(
    pool: &PgPool,
    me: &Me,
    code: &str,
    ip: Option<std::net::IpAddr>,
) -> Result<Vec<String>, AppError> {
    refuse_unless_offered(me)?;
    let mut tx = pool.begin().await?;
    let pending: Option<Vec<u8>> = sqlx::query_scalar(
        "SELECT totp_pending_secret FROM operators WHERE id = $1 AND totp_secret IS NULL FOR UPDATE",
    )
    .bind(me.id)
    .fetch_optional(&mut *tx)
    .await?
    .flatten();
    let Some(secret) = pending else {
        return Err(AppError::Invalid(
            "there is no authenticator waiting to be confirmed: start the set-up again".into(),
        ));
    };
    let step = matching_step(
        &totp(&secret, &me.email)?,
        code.trim(),
        Utc::now().timestamp(),
    )
    .ok_or_else(|| {
        AppError::Invalid(
            "that code does not match: enter the 6 digits your authenticator shows now".into(),
        )
    })?;
    sqlx::query(
        "UPDATE operators SET totp_secret = totp_pending_secret, totp_pending_secret = NULL,
             totp_enabled_at = now(), totp_last_step = $2
         WHERE id = $1",
    )
    .bind(me.id)
    .bind(step)
    .execute(&mut *tx)
    .await?;
    let codes = new_recovery_codes();
    replace_recovery_codes(&mut tx, me.id, &codes).await?;
    actions::record(
        &mut *tx,
        Actor::Operator { id: me.id, ip },
        "second_factor.enabled",
        "operator",
        Some(me.id.to_string()),
        json!({ "recovery_codes": RECOVERY_CODES }),
    )
    .await?;
    tx.commit().await?;
    Ok(codes)
}

async fn replace_recovery_codes(
    tx: &mut sqlx::PgConnection,
    operator_id: OperatorId,
    codes: &[String],
) -> Result<(), sqlx::Error> {
    sqlx::query("DELETE FROM recovery_codes WHERE operator_id = $1")
        .bind(operator_id)
        .execute(&mut *tx)
        .await?;
    let hashes: Vec<Vec<u8>> = codes.iter().map(|c| recovery_hash(c)).collect();
    sqlx::query(
        "INSERT INTO recovery_codes (operator_id, code_hash) SELECT $1, unnest($2::bytea[])",
    )
    .bind(operator_id)
    .bind(&hashes)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// Turns the second factor off; it takes a current code (or a recovery
/// code), so a session left open is not enough.
pub async fn disable(
    pool: &PgPool,
    throttle: Limits,
    me: &Me,
    code: &str,
    ip: Option<std::net::IpAddr>,
) -> Result<(), AppError> {
    // Guessing here is throttled as at sign-in: an open session must not
    // be a way to try a million codes.
    let attempt = match login_failures::claim(pool, &me.email, ip, throttle).await? {
        Attempt::Claimed { id } => id,
        Attempt::Refused { retry_after } => {
            return Err(AppError::Invalid(format!(
                "too many wrong codes; try again in {} seconds",
                retry_after.num_seconds().max(1)
            )))
        }
    };
    match check(pool, me.id, &me.email, code).await? {
        Ok(_) => login_failures::forget(pool, attempt).await?,
        Err(refusal) => return Err(AppError::Invalid(refusal.to_string())),
    }
    reset(
        pool,
        Actor::Operator { id: me.id, ip },
        me.id,
        "second_factor.disabled",
    )
    .await
}

/// Removes an operator's second factor and recovery codes: they turned it
/// off, or (`vaultcap operator reset-two-factor`) lost their authenticator.
pub async fn reset(
    pool: &PgPool,
    actor: Actor,
    operator_id: OperatorId,
    action: &str,
) -> Result<(), AppError> {
    let mut tx = pool.begin().await?;
    sqlx::query(
        "UPDATE operators SET totp_secret = NULL, totp_enabled_at = NULL, totp_pending_secret = NULL,
             totp_last_step = NULL
         WHERE id = $1",
    )
    .bind(operator_id)
    .execute(&mut *tx)
    .await?;
    replace_recovery_codes(&mut tx, operator_id, &[]).await?;
    actions::record(
        &mut *tx,
        actor,
        action,
        "operator",
        Some(operator_id.to_string()),
        json!({}),
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

/// How a second factor was shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Factor {
    Authenticator,
    RecoveryCode,
}

impl Factor {
    pub fn as_str(self) -> &'static str {
        match self {
            Factor::Authenticator => "authenticator",
            Factor::RecoveryCode => "recovery_code",
        }
    }
}

/// Why a code was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CodeRefused {
    #[error("that code is not right: enter the 6 digits your authenticator shows now, or a recovery code")]
    Wrong,
    #[error("that code was already used: wait for the next one your authenticator shows")]
    Replayed,
}

/// Checks a code for `operator`: a current authenticator code not used
/// before, or an unused recovery code (used up by this call).
pub async fn check(
    pool: &PgPool,
    operator_id: OperatorId,
    email: &str,
    code: &str,
) -> Result<Result<Factor, CodeRefused>, AppError> {
    let secret: Option<Vec<u8>> =
        sqlx::query_scalar("SELECT totp_secret FROM operators WHERE id = $1")
            .bind(operator_id)
            .fetch_optional(pool)
            .await?
            .flatten();
    let Some(secret) = secret else {
        return Ok(Err(CodeRefused::Wrong));
    };
    let code = code.trim();
    if let Some(step) = matching_step(&totp(&secret, email)?, code, Utc::now().timestamp()) {
        // Accepted once: a step no newer than the last accepted one is a replay.
        let accepted = sqlx::query(
            "UPDATE operators SET totp_last_step = $2
             WHERE id = $1 AND (totp_last_step IS NULL OR totp_last_step < $2)",
        )
        .bind(operator_id)
        .bind(step)
        .execute(pool)
        .await?;
        return Ok(if accepted.rows_affected() == 1 {
            Ok(Factor::Authenticator)
        } else {
            Err(CodeRefused::Replayed)
        });
    }
    let used = sqlx::query(
        "UPDATE recovery_codes SET used_at = now()
         WHERE operator_id = $1 AND code_hash = $2 AND used_at IS NULL",
    )
    .bind(operator_id)
    .bind(recovery_hash(code))
    .execute(pool)
    .await?;
    Ok(if used.rows_affected() == 1 {
        Ok(Factor::RecoveryCode)
    } else {
        Err(CodeRefused::Wrong)
    })
}

/// Whether sign-in must ask `operator` for a code.
pub fn required_for(operator: &OperatorRow) -> bool {
    operator.totp_enabled_at.is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_code_is_good_for_its_step_and_one_either_side() {
        let totp = totp(&[7; 20], "ana@example.com").unwrap();
        let now = 1_700_000_000;
        let step = now / STEP_SECONDS;
        let code = totp.generate((step * STEP_SECONDS) as u64);
        assert_eq!(matching_step(&totp, &code, now), Some(step));
        assert_eq!(matching_step(&totp, &code, now + STEP_SECONDS), Some(step));
        assert_eq!(matching_step(&totp, &code, now - STEP_SECONDS), Some(step));
        assert_eq!(matching_step(&totp, &code, now + 2 * STEP_SECONDS), None);
        assert_eq!(matching_step(&totp, "12345", now), None);
        assert_eq!(matching_step(&totp, "abcdef", now), None);
    }

    #[test]
    fn recovery_codes_are_read_as_typed_however_spaced() {
        let codes = new_recovery_codes();
        assert_eq!(codes.len(), 10);
        assert_eq!(codes[0].len(), 11);
        assert_ne!(codes[0], codes[1]);
        let typed = format!(" {} ", codes[0].to_uppercase().replace('-', " "));
        assert_eq!(recovery_hash(&typed), recovery_hash(&codes[0]));
    }
}
