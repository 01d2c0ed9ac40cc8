use leptos::prelude::*;

use crate::{domain::AlertsView, error::AppError};

/// Alerts in one state (`open` when not given, `all` for every state),
/// newest first, with the counts per state and who can be assigned.
#[server(endpoint = "list_alerts")]
pub async fn list_alerts(state: Option<String>) -> Result<AlertsView, AppError> {
    use crate::{
        alerts::sql as alerts,
        domain::{AlertState, Role},
        ssr::{self},
    };
    crate::operators::auth::require(Role::Viewer)?;
    let filter = match state.as_deref().unwrap_or("open") {
        "all" => None,
        raw => Some(AlertState::parse(raw).ok_or_else(|| {
            AppError::Invalid(format!(
                "{raw:?} is not an alert state: use open, snoozed, acknowledged or all"
            ))
        })?),
    };
    let pool = &expect_context::<ssr::AppState>().pool;
    let (open, snoozed, acknowledged) = alerts::counts(pool).await?;
    let assignees = crate::operators::sql::list(pool)
        .await?
        .into_iter()
        .filter(|op| op.disabled_at.is_none() && op.role.allows(Role::Operator))
        .map(|op| (op.id, op.email))
        .collect();
    Ok(AlertsView {
        alerts: alerts::list(pool, None, filter, 200).await?,
        open,
        snoozed,
        acknowledged,
        assignees,
    })
}

/// How many alerts need someone, for the navigation badge.
#[server(endpoint = "open_alert_count")]
pub async fn open_alert_count() -> Result<i64, AppError> {
    use crate::{domain::Role, ssr};
    crate::operators::auth::require(Role::Viewer)?;
    let pool = &expect_context::<ssr::AppState>().pool;
    Ok(crate::alerts::sql::open_count(pool).await?)
}
