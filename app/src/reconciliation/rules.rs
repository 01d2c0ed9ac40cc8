//! Resolving reconciliation findings: the rules the console's forms share.
//! Every resolution is made once (the finding's row is locked, a second
//! attempt is told who resolved it) and recorded in the action log.

use serde_json::json;
use sqlx::PgPool;

use crate::{
    actions::sql::{self as actions, Actor},
    reconciliation::findings,
};
use crate::{
    domain::{Finding, FindingId, FindingKind, OperatorId, VaultKeyId},
    error::AppError,
};

/// The longest dismissal reason.
pub const MAX_REASON_CHARS: usize = 2000;

/// Adopts an orphaned charge: writes the billing record the job never did.
pub async fn adopt(pool: &PgPool, actor: Actor, id: FindingId) -> Result<Finding, AppError> {
    let operator = operator_of(actor)?;
    let mut tx = pool.begin().await?;
    let finding = open_finding(&mut tx, id).await?;
    if finding.kind != FindingKind::Orphaned {
        return Err(AppError::Invalid(format!(
            "finding #{id} is a {} finding: only orphaned charges are adopted",
            finding.kind.as_str()
        )));
    }
    let charge = finding
        .charge_ids
        .first()
        .ok_or_else(|| AppError::Invalid(format!("finding #{id} names no charge")))?;
    let written = findings::adopt_charge(
        &mut tx,
        finding.billing_period,
        &finding.customer_id,
        charge,
    )
    .await?;
    if !written {
        return Err(AppError::Invalid(format!(
            "{} already has a billing record for {}: run the reconciliation again to see where it stands",
            finding.customer_id, finding.billing_period
        )));
    }
    findings::resolve(&mut tx, id, "adopted", operator, None).await?;
    actions::record(
        &mut *tx,
        actor,
        "finding.adopt",
        "finding",
        Some(id.to_string()),
        json!({ "customer_id": finding.customer_id, "billing_period": finding.billing_period,
                "charge_id": charge }),
    )
    .await?;
    tx.commit().await?;
    Ok(finding)
}

/// Attributes an unmetered charge to the vault key it belongs to (of the
/// finding's period and currency), with the reason: someone made it with
/// the real Stripe key for that key's run.
pub async fn attribute(
    pool: &PgPool,
    actor: Actor,
    id: FindingId,
    key: VaultKeyId,
    reason: &str,
) -> Result<Finding, AppError> {
    let operator = operator_of(actor)?;
    let reason = reason_given(reason, "attributed")?;
    let mut tx = pool.begin().await?;
    let finding = open_finding(&mut tx, id).await?;
    if finding.kind != FindingKind::Unmetered {
        return Err(AppError::Invalid(format!(
            "finding #{id} is a {} finding: only unmetered charges are attributed to a key",
            finding.kind.as_str()
        )));
    }
    let keys = findings::attributable_keys(&mut *tx, &finding).await?;
    let Some(chosen) = keys.into_iter().find(|choice| choice.id == key) else {
        return Err(AppError::Invalid(format!(
            "vault key #{key} is not a {} key of {}: choose one of the period's keys in its currency",
            finding.currency, finding.billing_period
        )));
    };
    findings::attribute(&mut tx, id, key, operator, reason).await?;
    actions::record(
        &mut *tx,
        actor,
        "finding.attribute",
        "finding",
        Some(id.to_string()),
        json!({ "customer_id": finding.customer_id, "billing_period": finding.billing_period,
                "charge_ids": finding.charge_ids, "vault_key_id": key, "key_label": chosen.label,
                "reason": reason }),
    )
    .await?;
    tx.commit().await?;
    Ok(Finding {
        attributed_to: Some(chosen.label),
        ..finding
    })
}

/// Dismisses a finding with the reason (a legitimate second charge,
/// handled elsewhere).
pub async fn dismiss(
    pool: &PgPool,
    actor: Actor,
    id: FindingId,
    reason: &str,
) -> Result<Finding, AppError> {
    let operator = operator_of(actor)?;
    let reason = reason_given(reason, "dismissed")?;
    let mut tx = pool.begin().await?;
    let finding = open_finding(&mut tx, id).await?;
    findings::resolve(&mut tx, id, "dismissed", operator, Some(reason)).await?;
    actions::record(
        &mut *tx,
        actor,
        "finding.dismiss",
        "finding",
        Some(id.to_string()),
        json!({ "kind": finding.kind, "customer_id": finding.customer_id,
                "billing_period": finding.billing_period, "reason": reason }),
    )
    .await?;
    tx.commit().await?;
    Ok(finding)
}

/// The reason, trimmed, if one is given and not too long.
fn reason_given<'r>(reason: &'r str, done: &str) -> Result<&'r str, AppError> {
    let reason = reason.trim();
    if reason.is_empty() {
        return Err(AppError::Invalid(format!(
            "say why the finding is {done} (auditors read it)"
        )));
    }
    if reason.chars().count() > MAX_REASON_CHARS {
        return Err(AppError::Invalid(format!(
            "the reason is longer than {MAX_REASON_CHARS} characters"
        )));
    }
    Ok(reason)
}

fn operator_of(actor: Actor) -> Result<OperatorId, AppError> {
    match actor {
        Actor::Operator { id, .. } => Ok(id),
        _ => Err(AppError::Invalid(
            "findings are resolved by a signed-in person".into(),
        )),
    }
}

/// The finding, locked, if it is still open.
async fn open_finding(tx: &mut sqlx::PgConnection, id: FindingId) -> Result<Finding, AppError> {
    let finding = findings::lock(tx, id).await?.ok_or(AppError::NotFound)?;
    if let Some(resolution) = &finding.resolution {
        return Err(AppError::Invalid(format!(
            "finding #{id} was already {resolution} by {} at {} UTC",
            finding.resolved_by.as_deref().unwrap_or("someone"),
            finding
                .resolved_at
                .map(|at| at.format("%Y-%m-%d %H:%M:%S").to_string())
                .unwrap_or_default()
        )));
    }
    Ok(finding)
}
