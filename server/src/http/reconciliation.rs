//! The Reconciliation page's forms (operator role): adopt an orphaned
//! charge, dismiss a finding with a reason. Back to the page with a notice.

use axum::{
    extract::{rejection::FormRejection, Path, State},
    response::{IntoResponse, Response},
    Extension, Form,
};
use serde::Deserialize;
use tower_sessions::Session;

use super::{
    auth::ClientIp,
    forms::{readable, require, Failure, Page},
};
use app::{
    domain::{BillingPeriod, Me, Notice, Role},
    error::AppError,
    ssr::{
        data::actions::{self, Actor},
        reconciliation, AppState,
    },
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
}

impl FindingForm {
    /// Back to the period the form was on (this month's if it is not one).
    fn back(&self) -> String {
        match self.period.parse::<app::domain::BillingPeriod>() {
            Ok(period) => format!("/reconciliation?period={period}"),
            Err(_) => "/reconciliation".into(),
        }
    }
}

/// The operator behind a form and the form, or the response refusing them
/// (not an operator; a form that cannot be read).
async fn operator_form(
    me: Option<Extension<Me>>,
    ip: Option<std::net::IpAddr>,
    session: &Session,
    form: Result<Form<FindingForm>, FormRejection>,
) -> Result<(Actor, FindingForm), Response> {
    let me = require(me, Role::Operator).map_err(IntoResponse::into_response)?;
    match readable(form) {
        Ok(form) => Ok((Actor::Operator { id: me.id, ip }, form)),
        Err(failure) => Err(PAGE.back_with(session, Err(failure)).await),
    }
}

pub async fn adopt(
    State(state): State<AppState>,
    me: Option<Extension<Me>>,
    ClientIp(ip): ClientIp,
    session: Session,
    Path(id): Path<i64>,
    form: Result<Form<FindingForm>, FormRejection>,
) -> Response {
    let (actor, form) = match operator_form(me, ip, &session, form).await {
        Ok(pair) => pair,
        Err(refused) => return refused,
    };
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
    me: Option<Extension<Me>>,
    ClientIp(ip): ClientIp,
    session: Session,
    Path(id): Path<i64>,
    form: Result<Form<FindingForm>, FormRejection>,
) -> Response {
    let (actor, form) = match operator_form(me, ip, &session, form).await {
        Ok(pair) => pair,
        Err(refused) => return refused,
    };
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

/// Starts a sync of the period from Stripe, then detection, in the
/// background; the page shows its progress from `stripe_syncs`.
pub async fn sync(
    State(state): State<AppState>,
    Extension(Stripe(client)): Extension<Stripe>,
    me: Option<Extension<Me>>,
    ClientIp(ip): ClientIp,
    session: Session,
    form: Result<Form<FindingForm>, FormRejection>,
) -> Response {
    let (actor, form) = match operator_form(me, ip, &session, form).await {
        Ok(pair) => pair,
        Err(refused) => return refused,
    };
    let outcome = async {
        let period: BillingPeriod = form.period.parse()?;
        let client = Stripe(client).or_refuse("sync")?;
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
            let options = sync::SyncOptions::default();
            match sync::sync_period(&pool, &client, period, &options, |_| {}).await {
                Ok(_) => {
                    if let Err(err) = reconcile::detect(&pool, period).await {
                        tracing::error!(error = %err, %period, "detection after a sync failed");
                    }
                }
                Err(err) => {
                    tracing::warn!(error = %err, %period, "a sync from the console stopped")
                }
            }
        });
        Ok::<_, Failure>(Notice::success(format!(
            "Syncing {period} from Stripe; findings are detected when it ends. Reload to follow it."
        )))
    }
    .await;
    PAGE.back_to(&form.back(), &session, outcome).await
}

/// Refunds a duplicate's extra charges in Stripe (after the confirmation).
pub async fn refund(
    State(state): State<AppState>,
    Extension(Stripe(client)): Extension<Stripe>,
    me: Option<Extension<Me>>,
    ClientIp(ip): ClientIp,
    session: Session,
    Path(id): Path<i64>,
    form: Result<Form<FindingForm>, FormRejection>,
) -> Response {
    let (actor, form) = match operator_form(me, ip, &session, form).await {
        Ok(pair) => pair,
        Err(refused) => return refused,
    };
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
            finding.at_risk().format(&finding.currency()),
            finding.currency()
        )))
    }
    .await
    .map_err(Failure::from);
    PAGE.back_to(&form.back(), &session, outcome).await
}
