//! Closing a billing period: an operator prepares it, a different approver
//! signs it off, and the signed report is frozen with its hash. Every step
//! is checked here with a message a person can act on, enforced again by
//! the table's triggers whatever the caller, and recorded in the action log.

use chrono::Utc;
use serde_json::json;
use sha2::{Digest, Sha256};
use sqlx::PgPool;

use crate::{
    actions::sql::{self as actions, Actor},
    periods::sql as period_closes,
};
use crate::{
    domain::{BillingPeriod, Me, PeriodClose, PeriodCloseView, PeriodReport, Role},
    error::AppError,
};

/// The longest note on a prepared close.
pub const MAX_NOTE_CHARS: usize = 2000;

/// Why `revoked_at` is set on the keys a sign-off revokes (the trigger
/// `revoke_signed_period_keys` writes the same words).
fn revoke_reason(period: BillingPeriod) -> String {
    format!("billing period {period} signed off")
}

/// The close page's data: the frozen report once signed (its hash checked
/// against the stored one), else the live figures.
pub async fn view(pool: &PgPool, period: BillingPeriod) -> Result<PeriodCloseView, AppError> {
    let close = period_closes::live(pool, period).await?;
    let signed = match &close {
        Some(close) if close.signed_at.is_some() => period_closes::signed_report(pool, close.id)
            .await?
            .map(|(report, sha256)| frozen(&report, &sha256))
            .transpose()?,
        _ => None,
    };
    let open_after_sign_off = match signed {
        Some(_) => period_closes::open_findings(pool, period).await?,
        None => 0,
    };
    let (report, report_intact) = match signed {
        Some(frozen) => frozen,
        None => (live_report(pool, period).await?, true),
    };
    Ok(PeriodCloseView {
        open_after_sign_off,
        actions: actions::for_period(pool, period, &report).await?,
        ended: period < BillingPeriod::containing(Utc::now()),
        report,
        close,
        report_intact,
    })
}

/// The period's figures now, read in one snapshot.
pub async fn live_report(pool: &PgPool, period: BillingPeriod) -> Result<PeriodReport, AppError> {
    let mut tx = pool.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *tx)
        .await?;
    let report = period_closes::report(&mut tx, period, Utc::now()).await?;
    tx.commit().await?;
    Ok(report)
}

/// A signed report read back: the report, and whether its bytes still hash
/// to what was stored when it was signed.
pub fn frozen(report: &str, sha256: &str) -> Result<(PeriodReport, bool), AppError> {
    let parsed = serde_json::from_str(report).map_err(|err| {
        tracing::error!(error = %err, "a signed period report cannot be read");
        AppError::Internal
    })?;
    Ok((parsed, hash(report) == sha256))
}

pub fn hash(report: &str) -> String {
    hex::encode(Sha256::digest(report.as_bytes()))
}

/// Prepares the close of a period that has ended.
pub async fn prepare(
    pool: &PgPool,
    me: &Me,
    actor: Actor,
    period: BillingPeriod,
    note: &str,
) -> Result<PeriodClose, AppError> {
    if !me.role.allows(Role::Operator) {
        return Err(AppError::Forbidden(Role::Operator));
    }
    if period >= BillingPeriod::containing(Utc::now()) {
        return Err(AppError::Invalid(format!(
            "{period} has not ended yet: a period is closed once its last day is over (UTC)"
        )));
    }
    let note = note.trim();
    if note.chars().count() > MAX_NOTE_CHARS {
        return Err(AppError::Invalid(format!(
            "the note is longer than {MAX_NOTE_CHARS} characters"
        )));
    }
    let mut tx = pool.begin().await?;
    let note = (!note.is_empty()).then_some(note);
    let Some(id) = period_closes::prepare(&mut *tx, period, me.id, note)
        .await
        .map_err(refused)?
    else {
        return Err(already_closing(&mut tx, period).await);
    };
    actions::record(
        &mut *tx,
        actor,
        "period.prepare",
        "billing_period",
        Some(period.to_string()),
        json!({ "close_id": id, "note": note }),
    )
    .await?;
    tx.commit().await?;
    period_closes::live(pool, period)
        .await?
        .ok_or(AppError::NotFound)
}

/// Why a period cannot be prepared: it already is, or is signed off.
async fn already_closing(tx: &mut sqlx::PgConnection, period: BillingPeriod) -> AppError {
    match period_closes::live(&mut *tx, period).await {
        Ok(Some(close)) => AppError::Invalid(match close.signed_at {
            Some(at) => format!(
                "{period} was signed off by {} at {} UTC",
                close.signed_by.unwrap_or_default(),
                at.format("%Y-%m-%d %H:%M")
            ),
            None => format!(
                "{} already prepared the close of {period} at {} UTC",
                close.prepared_by,
                close.prepared_at.format("%Y-%m-%d %H:%M")
            ),
        }),
        Ok(None) => AppError::Invalid(format!(
            "the close of {period} changed meanwhile: try again"
        )),
        Err(err) => err.into(),
    }
}

/// Withdraws a prepared close: the period is open again.
pub async fn withdraw(
    pool: &PgPool,
    me: &Me,
    actor: Actor,
    period: BillingPeriod,
) -> Result<(), AppError> {
    if !me.role.allows(Role::Operator) {
        return Err(AppError::Forbidden(Role::Operator));
    }
    let mut tx = pool.begin().await?;
    let close = locked_close(&mut tx, period).await?;
    period_closes::withdraw(&mut tx, close.id, me.id)
        .await
        .map_err(refused)?;
    actions::record(
        &mut *tx,
        actor,
        "period.withdraw",
        "billing_period",
        Some(period.to_string()),
        json!({ "close_id": close.id, "prepared_by": close.prepared_by }),
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

/// What a sign-off did.
#[derive(Debug)]
pub struct SignedOff {
    pub keys_revoked: usize,
    pub report_sha256: String,
}

/// Signs the prepared close off: refuses while findings are open or calls
/// undecided, or when the signer prepared it; freezes the report (its
/// bytes and SHA-256) and revokes the period's live keys, all in one
/// transaction. Two sign-offs at once are one after the other (the close's
/// row is locked): the second is told the first signed it.
pub async fn sign_off(
    pool: &PgPool,
    me: &Me,
    actor: Actor,
    period: BillingPeriod,
) -> Result<SignedOff, AppError> {
    if !me.role.allows(Role::Approver) {
        return Err(AppError::Forbidden(Role::Approver));
    }
    let mut tx = pool.begin().await?;
    // The keys first (a call being reserved holds its key until it commits;
    // a follow-on key is made holding its parent's), then the close (a key
    // made from now on waits for it, and is refused once signed), then the
    // keys again, those made in between included: the report below then
    // counts every call, and the trigger revokes every key it lists.
    period_closes::lock_keys(&mut tx, period).await?;
    let close = locked_close(&mut tx, period).await?;
    period_closes::lock_keys(&mut tx, period).await?;
    if close.prepared_by_id == me.id {
        return Err(AppError::Invalid(format!(
            "you prepared the close of {period}, so another approver must sign it off (four-eyes rule)"
        )));
    }
    let at = Utc::now();
    let mut report = period_closes::report(&mut tx, period, at).await?;
    let blockers = report.blockers();
    if !blockers.is_empty() {
        return Err(AppError::Invalid(format!(
            "{period} cannot be signed off yet: {}",
            blockers.join("; ")
        )));
    }
    // The report says what the sign-off leaves behind: the keys it revokes
    // (in the trigger, with this time and reason) as revoked.
    let mut keys_revoked = 0;
    for key in report.keys.iter_mut().filter(|k| k.revoked_at.is_none()) {
        key.revoked_at = Some(at);
        key.revoke_reason = Some(revoke_reason(period));
        keys_revoked += 1;
    }
    let bytes = serde_json::to_string(&report).map_err(|err| {
        tracing::error!(error = %err, "a period report cannot be written");
        AppError::Internal
    })?;
    let report_sha256 = hash(&bytes);
    period_closes::sign(&mut tx, close.id, me.id, at, &bytes, &report_sha256)
        .await
        .map_err(refused)?;
    actions::record(
        &mut *tx,
        actor,
        "period.sign_off",
        "billing_period",
        Some(period.to_string()),
        json!({ "close_id": close.id, "prepared_by": close.prepared_by,
                "report_sha256": report_sha256, "keys_revoked": keys_revoked,
                "calls": report.calls, "findings": report.findings.len() }),
    )
    .await?;
    tx.commit().await?;
    Ok(SignedOff {
        keys_revoked,
        report_sha256,
    })
}

/// The period's prepared (not signed) close, locked.
async fn locked_close(
    tx: &mut sqlx::PgConnection,
    period: BillingPeriod,
) -> Result<PeriodClose, AppError> {
    let close = period_closes::lock_live(tx, period).await?.ok_or_else(|| {
        AppError::Invalid(format!(
            "nobody has prepared the close of {period}: an operator prepares it first"
        ))
    })?;
    if let Some(at) = close.signed_at {
        return Err(AppError::Invalid(format!(
            "{period} was already signed off by {} at {} UTC",
            close.signed_by.as_deref().unwrap_or("another approver"),
            at.format("%Y-%m-%d %H:%M:%S")
        )));
    }
    Ok(close)
}

/// The table's own refusals, said as the rule they enforce. These fire
/// only when the checks above were bypassed or raced.
fn refused(err: sqlx::Error) -> AppError {
    let constraint = err
        .as_database_error()
        .and_then(|db| db.constraint())
        .map(str::to_owned);
    let rule = match constraint.as_deref() {
        Some("period_close_four_eyes") => {
            "whoever prepared a close cannot sign it off (four-eyes rule)"
        }
        Some("period_close_signed_once") => "the period was already signed off",
        Some("period_close_withdrawn_once") => "the close was withdrawn",
        Some("period_close_findings_resolved") => "findings of the period are open",
        Some("period_close_calls_decided") => {
            "calls of the period are in flight or of unknown outcome"
        }
        Some("period_close_period_ended") => "the period has not ended yet",
        Some("period_close_signed_by_approver") => return AppError::Forbidden(Role::Approver),
        Some("period_close_prepared_by_operator") => return AppError::Forbidden(Role::Operator),
        Some("period_close_withdrawn_by_operator") => return AppError::Forbidden(Role::Operator),
        Some("period_close_preparer_active") => {
            "whoever prepared it is disabled or no longer an operator: withdraw it and prepare again"
        }
        _ => return err.into(),
    };
    AppError::Invalid(rule.into())
}
