//! Resolving reconciliation findings: the rules the console's forms share.
//! Every resolution is made once (the finding's row is locked, a second
//! attempt is told who resolved it) and recorded in the action log.

use serde_json::json;
use sqlx::PgPool;

use super::data::{
    actions::{self, Actor},
    findings,
};
use crate::{
    domain::{Finding, FindingId, FindingKind, OperatorId},
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

/// Dismisses a finding with the reason (a legitimate second charge,
/// handled elsewhere).
pub async fn dismiss(
    pool: &PgPool,
    actor: Actor,
    id: FindingId,
    reason: &str,
) -> Result<Finding, AppError> {
    let operator = operator_of(actor)?;
    let reason = reason.trim();
    if reason.is_empty() {
        return Err(AppError::Invalid(
            "say why the finding is dismissed (auditors read it)".into(),
        ));
    }
    if reason.chars().count() > MAX_REASON_CHARS {
        return Err(AppError::Invalid(format!(
            "the reason is longer than {MAX_REASON_CHARS} characters"
        )));
    }
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
