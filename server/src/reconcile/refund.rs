//! Refunding a duplicate: every live charge of the finding but the keeper
//! is refunded in Stripe (reason `duplicate`), then re-read from Stripe so
//! `stripe_charges` shows the refund, and the finding is resolved.
//!
//! Each refund carries an idempotency key derived from the charge id, so a
//! retried click, a second operator or a crash between Stripe and the
//! database can never refund a charge twice. The finding stays locked for
//! the whole resolution: a second attempt waits, then is told it is done.

use serde_json::json;
use sqlx::PgPool;
use stripe::{Client, IdempotencyKey, RequestStrategy, StripeError, StripeRequest};
use stripe_core::{
    charge::RetrieveCharge,
    refund::{CreateRefund, CreateRefundReason},
};

use app::{
    actions::sql::{self as actions, Actor},
    domain::{Finding, FindingId, FindingKind},
    error::AppError,
    reconciliation::{findings, stripe_charges},
};

use super::sync;

/// The idempotency key of the refund of `charge` as a duplicate.
pub fn idempotency_key(charge: &str) -> String {
    format!("vaultcap-refund-duplicate-{charge}")
}

/// Refunds the duplicate charges of finding `id`; returns the finding and
/// the charges refunded (those Stripe had already refunded included).
#[tracing::instrument(skip_all)]
pub async fn refund_duplicate(
    pool: &PgPool,
    client: &Client,
    actor: Actor,
    id: FindingId,
) -> Result<(Finding, Vec<String>), AppError> {
    let Actor::Operator { id: operator, .. } = actor else {
        return Err(AppError::Invalid(
            "findings are resolved by a signed-in person".into(),
        ));
    };
    let mut tx = pool.begin().await?;
    let finding = findings::lock(&mut tx, id)
        .await?
        .ok_or(AppError::NotFound)?;
    if let Some(resolution) = &finding.resolution {
        return Err(AppError::Invalid(format!(
            "finding #{id} was already {resolution} by {}",
            finding.resolved_by.as_deref().unwrap_or("someone")
        )));
    }
    if finding.kind != FindingKind::Duplicate {
        return Err(AppError::Invalid(format!(
            "finding #{id} is a {} finding: only duplicate charges are refunded",
            finding.kind.as_str()
        )));
    }
    let extra: Vec<String> = finding
        .charge_ids
        .iter()
        .filter(|charge| Some(charge.as_str()) != finding.keeper_charge_id.as_deref())
        .cloned()
        .collect();
    let mut refreshed = Vec::with_capacity(extra.len());
    for charge in &extra {
        refund(client, charge).await?;
        let now = RetrieveCharge::new(charge.as_str())
            .send(client)
            .await
            .map_err(|err| stripe_failed(charge, &err))?;
        refreshed.push(sync::synced(&now));
    }
    stripe_charges::upsert(&mut tx, &refreshed, chrono::Utc::now()).await?;
    findings::resolve(&mut tx, id, "refunded", operator, None).await?;
    actions::record(
        &mut *tx,
        actor,
        "finding.refund",
        "finding",
        Some(id.to_string()),
        json!({ "customer_id": finding.customer_id, "billing_period": finding.billing_period,
                "refunded": extra, "kept": finding.keeper_charge_id,
                "amount_cents": finding.at_risk, "currency": finding.currency }),
    )
    .await?;
    tx.commit().await?;
    Ok((finding, extra))
}

/// Refunds what is left of `charge` as a duplicate; a charge Stripe says is
/// already refunded counts as done.
#[tracing::instrument(skip_all)]
async fn refund(client: &Client, charge: &str) -> Result<(), AppError> {
    let key = IdempotencyKey::new(idempotency_key(charge))
        .map_err(|err| AppError::Invalid(format!("no idempotency key for {charge}: {err}")))?;
    let refunded = CreateRefund::new()
        .charge(charge)
        .reason(CreateRefundReason::Duplicate)
        .customize()
        .request_strategy(RequestStrategy::Idempotent(key))
        .send(client)
        .await;
    match refunded {
        Ok(_) => Ok(()),
        Err(StripeError::Stripe(error, 400))
            if error
                .code
                .as_ref()
                .is_some_and(|code| code.as_str() == "charge_already_refunded") =>
        {
            Ok(())
        }
        Err(err) => Err(stripe_failed(charge, &err)),
    }
}

fn stripe_failed(charge: &str, err: &StripeError) -> AppError {
    AppError::Invalid(format!(
        "{charge} was not refunded: {}; nothing was marked resolved, and trying again cannot refund twice",
        sync::describe(err)
    ))
}
