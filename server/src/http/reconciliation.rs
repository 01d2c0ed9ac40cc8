//! The Reconciliation page's forms (operator role): adopt an orphaned
//! charge, dismiss a finding with a reason. Back to the page with a notice.

use axum::{
    extract::{Path, State},
    response::Response,
    Extension,
};
use serde::Deserialize;
use tower_sessions::Session;

use super::guard::Operator;
use super::{
    busy::{Busy, HeavyWork},
    forms::{page_forms, ConsoleForm, Failure, Page},
};
use app::{
    actions::sql::{self as actions, Actor},
    domain::{
        at_risk_by_currency, counted, money_text, BillingPeriod, BulkAction, Finding,
        FindingFilter, FindingId, Notice, MAX_BULK,
    },
    error::AppError,
    reconciliation::rules as reconciliation,
    ssr::AppState,
};

use crate::reconcile::{self, sync};

/// The Stripe client the console's syncs use; `None` without a key.
#[derive(Clone)]
pub struct Stripe(pub Option<std::sync::Arc<stripe::Client>>);

impl Stripe {
    /// The client, or why Vaultcap cannot `what` without one.
    fn or_refuse(self, what: &str) -> Result<std::sync::Arc<stripe::Client>, AppError> {
        self.0.ok_or_else(|| {
            AppError::Invalid(format!(
                "Vaultcap has no Stripe key (STRIPE_SECRET_KEY), so it cannot {what}"
            ))
        })
    }
}

const PAGE: Page = Page {
    path: "/reconciliation",
    gone: "That finding no longer exists.",
};

page_forms!(PAGE: FindingForm, BulkForm);

/// The form's fields: the page's period (where to go back to) and, to
/// dismiss, the reason.
#[derive(Debug, Deserialize)]
pub struct FindingForm {
    #[serde(default)]
    period: String,
    #[serde(default)]
    reason: String,
    /// The confirmation box for a refund: present only when ticked.
    confirm: Option<String>,
    /// The page the form was on when it was not the period's list (a
    /// finding's own page).
    #[serde(default)]
    return_to: String,
    /// To attribute an unmetered charge: the vault key's id.
    #[serde(default)]
    vault_key_id: String,
}

impl FindingForm {
    /// Back to the finding's page or the period the form was on (this
    /// month's if it is not one). Only Vaultcap's own finding pages are
    /// returned to.
    fn back(&self) -> String {
        if let Some(id) = self.return_to.strip_prefix("/reconciliation/") {
            if !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()) {
                return self.return_to.clone();
            }
        }
        match self.period.parse::<app::domain::BillingPeriod>() {
            Ok(period) => format!("/reconciliation?period={period}"),
            Err(_) => "/reconciliation".into(),
        }
    }
}

pub async fn adopt(
    State(state): State<AppState>,
    Operator { actor, .. }: Operator,
    session: Session,
    Path(id): Path<FindingId>,
    ConsoleForm(form): ConsoleForm<FindingForm>,
) -> Response {
    let outcome = reconciliation::adopt(&state.pool, actor, id)
        .await
        .map(|finding| {
            Notice::success(format!(
                "Adopted {} for {}: its billing record now names it, so a redelivered message skips the customer.",
                finding.charge_ids.first().cloned().unwrap_or_default(),
                finding.customer_id
            ))
        })
        .map_err(Into::into);
    PAGE.back_to(&form.back(), &session, outcome).await
}

pub async fn dismiss(
    State(state): State<AppState>,
    Operator { actor, .. }: Operator,
    session: Session,
    Path(id): Path<FindingId>,
    ConsoleForm(form): ConsoleForm<FindingForm>,
) -> Response {
    let outcome = reconciliation::dismiss(&state.pool, actor, id, &form.reason)
        .await
        .map(|finding| {
            Notice::success(format!(
                "Dismissed finding #{id} for {}.",
                finding.customer_id
            ))
        })
        .map_err(Into::into);
    PAGE.back_to(&form.back(), &session, outcome).await
}

pub async fn attribute(
    State(state): State<AppState>,
    Operator { actor, .. }: Operator,
    session: Session,
    Path(id): Path<FindingId>,
    ConsoleForm(form): ConsoleForm<FindingForm>,
) -> Response {
    let outcome = match form.vault_key_id.trim().parse::<i64>() {
        Err(_) => Err(AppError::Invalid(
            "choose the vault key the charge belongs to".into(),
        )),
        Ok(key) => {
            reconciliation::attribute(
                &state.pool,
                actor,
                id,
                app::domain::VaultKeyId(key),
                &form.reason,
            )
            .await
        }
    }
    .map(|finding| {
        Notice::success(format!(
            "Attributed finding #{id} ({}) to {}.",
            finding.charge_ids.join(", "),
            finding.attributed_to.unwrap_or_default()
        ))
    })
    .map_err(Into::into);
    PAGE.back_to(&form.back(), &session, outcome).await
}

/// Starts a sync of the period from Stripe, then detection, in the
/// background; the page shows its progress from `stripe_syncs`.
pub async fn sync(
    State(state): State<AppState>,
    Extension(Stripe(client)): Extension<Stripe>,
    Extension(heavy): Extension<HeavyWork>,
    Operator { actor, .. }: Operator,
    session: Session,
    ConsoleForm(form): ConsoleForm<FindingForm>,
) -> Response {
    let outcome = async {
        let period: BillingPeriod = form.period.parse()?;
        let client = Stripe(client).or_refuse("sync")?;
        let slot = heavy
            .sync()
            .map_err(|Busy(message)| AppError::Invalid(message))?;
        actions::record(
            &state.pool,
            actor,
            "reconcile.sync",
            "billing_period",
            Some(period.to_string()),
            serde_json::json!({}),
        )
        .await?;
        let pool = state.pool.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let options = sync::SyncOptions::default();
            let failed = match sync::sync_period(&pool, &client, period, &options, |_| {}).await {
                Ok(_) => reconcile::detect(&pool, period)
                    .await
                    .err()
                    .map(|err| ("detection after the sync", err.to_string())),
                Err(err) => Some(("the sync from Stripe", err.to_string())),
            };
            // Whoever started it can see on the action log that it failed.
            if let Some((step, error)) = failed {
                tracing::warn!(%error, %period, "{step} started from the console failed");
                let logged = actions::record(
                    &pool,
                    actor,
                    "reconcile.sync_failed",
                    "billing_period",
                    Some(period.to_string()),
                    serde_json::json!({ "step": step, "error": error }),
                )
                .await;
                if let Err(err) = logged {
                    tracing::error!(error = %err, "could not log a failed sync");
                }
            }
        });
        Ok::<_, Failure>(Notice::success(format!(
            "Syncing {period} from Stripe; findings are detected when it ends, and this page follows it."
        )))
    }
    .await;
    PAGE.back_to(&form.back(), &session, outcome).await
}

/// Refunds a duplicate's extra charges in Stripe (after the confirmation).
pub async fn refund(
    State(state): State<AppState>,
    Extension(Stripe(client)): Extension<Stripe>,
    Operator { actor, .. }: Operator,
    session: Session,
    Path(id): Path<FindingId>,
    ConsoleForm(form): ConsoleForm<FindingForm>,
) -> Response {
    let outcome = async {
        if form.confirm.as_deref() != Some("yes") {
            return Err(AppError::Invalid(
                "tick the box to confirm the refund: it gives money back to the customer".into(),
            ));
        }
        let client = Stripe(client).or_refuse("refund")?;
        let (finding, refunded) =
            reconcile::refund::refund_duplicate(&state.pool, &client, actor, id).await?;
        Ok(Notice::success(format!(
            "Refunded {} as duplicate{} of {} for {}: {} {} back to the customer.",
            refunded.join(", "),
            if refunded.len() == 1 { "" } else { "s" },
            finding.keeper_charge_id.clone().unwrap_or_default(),
            finding.customer_id,
            finding.at_risk.format(&finding.currency),
            finding.currency.clone()
        )))
    }
    .await
    .map_err(Failure::from);
    PAGE.back_to(&form.back(), &session, outcome).await
}

/// The bulk confirmation: the action, the findings previewed, the reason
/// (to dismiss) and the ticked box.
#[derive(Debug, Deserialize)]
pub struct BulkForm {
    #[serde(default)]
    action: String,
    #[serde(default)]
    period: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    customer: String,
    #[serde(default)]
    ids: String,
    #[serde(default)]
    reason: String,
    confirm: Option<String>,
}

/// Resolves each previewed finding in turn, each on its own (a finding
/// resolved meanwhile is skipped and said so, never resolved twice), and
/// records the whole run in the action log.
pub async fn bulk(
    State(state): State<AppState>,
    Extension(Stripe(client)): Extension<Stripe>,
    Operator { actor, .. }: Operator,
    session: Session,
    ConsoleForm(form): ConsoleForm<BulkForm>,
) -> Response {
    // Back to the filtered list the preview came from.
    let back = FindingFilter::parse(
        Some(&form.period),
        Some(&form.kind),
        None,
        Some(&form.customer),
        chrono::Utc::now(),
    )
    .map(|filter| format!("/reconciliation?{}", filter.query()))
    .unwrap_or_else(|_| "/reconciliation".into());
    let outcome = bulk_resolve(&state, client, actor, &form)
        .await
        .map_err(Failure::from);
    PAGE.back_to(&back, &session, outcome).await
}

async fn bulk_resolve(
    state: &AppState,
    client: Option<std::sync::Arc<stripe::Client>>,
    actor: Actor,
    form: &BulkForm,
) -> Result<Notice, AppError> {
    let action = BulkAction::parse(&form.action)?;
    let ids: Vec<FindingId> = form
        .ids
        .split(',')
        .map(str::trim)
        .filter(|id| !id.is_empty())
        .map(|id| {
            id.parse()
                .map_err(|_| AppError::Invalid(format!("{id:?} is not a finding number")))
        })
        .collect::<Result<_, _>>()?;
    if ids.is_empty() {
        return Err(AppError::Invalid(
            "no finding to resolve: preview the bulk action again".into(),
        ));
    }
    if ids.len() > MAX_BULK {
        return Err(AppError::Invalid(format!(
            "{} findings at once is more than {MAX_BULK}: preview the bulk action again",
            ids.len()
        )));
    }
    if form.confirm.as_deref() != Some("yes") {
        return Err(AppError::Invalid(
            "tick the box to confirm the bulk action: nothing was done".into(),
        ));
    }
    let reason = form.reason.trim();
    if action == BulkAction::Dismiss && reason.is_empty() {
        return Err(AppError::Invalid(
            "say why the findings are dismissed (auditors read it): nothing was done".into(),
        ));
    }
    let mut done: Vec<Finding> = Vec::new();
    let mut skipped: Vec<String> = Vec::new();
    for &id in &ids {
        let resolved = match action {
            BulkAction::Adopt => reconciliation::adopt(&state.pool, actor, id).await,
            BulkAction::Dismiss => reconciliation::dismiss(&state.pool, actor, id, reason).await,
            BulkAction::Refund => {
                // Without a Stripe key the first refund stops the run,
                // before anything is done.
                let client = Stripe(client.clone()).or_refuse("refund")?;
                reconcile::refund::refund_duplicate(&state.pool, &client, actor, id)
                    .await
                    .map(|(finding, _)| finding)
            }
        };
        // Each finding stands alone: one resolved meanwhile, or a refund
        // Stripe refused, is reported and the rest go on.
        match resolved {
            Ok(finding) => done.push(finding),
            Err(AppError::NotFound) => skipped.push(format!("#{id} no longer exists")),
            Err(err) => skipped.push(format!("#{id}: {err}")),
        }
    }
    actions::record(
        &state.pool,
        actor,
        "finding.bulk",
        "billing_period",
        Some(form.period.clone()),
        serde_json::json!({ "action": action.as_str(), "asked": ids,
                            "done": done.iter().map(|f| f.id).collect::<Vec<_>>(),
                            "skipped": skipped, "reason": (!reason.is_empty()).then_some(reason) }),
    )
    .await?;
    let total = money_text(&at_risk_by_currency(&done));
    let mut message = format!(
        "{} {} of {}: {total}.",
        action.done(),
        done.len(),
        counted(ids.len(), "finding", "findings")
    );
    if !skipped.is_empty() {
        message.push_str(&format!(" Not done: {}.", skipped.join("; ")));
    }
    Ok(if skipped.is_empty() {
        Notice::success(message)
    } else {
        Notice::error(message)
    })
}
