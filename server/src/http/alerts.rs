//! The Alerts page's forms: acknowledge, assign, snooze (operator role).

use axum::{
    extract::{Path, State},
    response::Response,
};
use serde::Deserialize;
use tower_sessions::Session;

use super::forms::{page_forms, ConsoleForm, Failure, Page};
use super::guard::Operator;
use app::{
    alerts::sql::{self as alerts, AlertChangeError},
    domain::{AlertId, Notice, OperatorId, Role},
    error::AppError,
    operators::sql as operators,
    ssr::AppState,
};

const PAGE: Page = Page {
    path: "/alerts",
    gone: "That alert no longer exists.",
};

page_forms!(PAGE: AckForm, AssignForm, SnoozeForm);

#[derive(Debug, Deserialize)]
pub struct AckForm {
    #[serde(default)]
    note: String,
}

#[derive(Debug, Deserialize)]
pub struct AssignForm {
    operator: String,
}

#[derive(Debug, Deserialize)]
pub struct SnoozeForm {
    hours: String,
}

impl From<AlertChangeError> for Failure {
    fn from(err: AlertChangeError) -> Self {
        Failure::App(match err {
            AlertChangeError::NotFound(_) => AppError::NotFound,
            AlertChangeError::AlreadyAcknowledged(id) => {
                AppError::Invalid(format!("alert {id} was already acknowledged"))
            }
            AlertChangeError::Database(err) => err.into(),
        })
    }
}

pub async fn acknowledge(
    State(state): State<AppState>,
    Operator { actor, .. }: Operator,
    session: Session,
    Path(id): Path<AlertId>,
    ConsoleForm(form): ConsoleForm<AckForm>,
) -> Response {
    let outcome = async {
        let note = form.note.trim();
        if note.chars().count() > 2000 {
            return Err(
                AppError::Invalid("the note is longer than 2,000 characters".into()).into(),
            );
        }
        let note = (!note.is_empty()).then_some(note);
        let alert = alerts::acknowledge(&state.pool, actor, id, note).await?;
        Ok(Notice::success(format!(
            "Acknowledged the alert on {}.",
            alert.key_label
        )))
    }
    .await;
    PAGE.back_with(&session, outcome).await
}

pub async fn assign(
    State(state): State<AppState>,
    Operator { actor, .. }: Operator,
    session: Session,
    Path(id): Path<AlertId>,
    ConsoleForm(form): ConsoleForm<AssignForm>,
) -> Response {
    let outcome = async {
        let assignee = match form.operator.trim() {
            "" => None,
            raw => {
                let wanted: OperatorId = raw
                    .parse()
                    .map_err(|_| AppError::Invalid(format!("{raw:?} is not an operator")))?;
                let operator = operators::find_by_id(&state.pool, wanted)
                    .await?
                    .filter(|op| op.disabled_at.is_none() && op.role.allows(Role::Operator))
                    .ok_or_else(|| {
                        AppError::Invalid(
                            "alerts can be assigned only to active operators who may act on them"
                                .into(),
                        )
                    })?;
                Some(operator)
            }
        };
        let alert =
            alerts::assign(&state.pool, actor, id, assignee.as_ref().map(|op| op.id)).await?;
        Ok(Notice::success(match assignee {
            Some(op) => format!("Assigned the alert on {} to {}.", alert.key_label, op.email),
            None => format!("The alert on {} is assigned to nobody.", alert.key_label),
        }))
    }
    .await;
    PAGE.back_with(&session, outcome).await
}

pub async fn snooze(
    State(state): State<AppState>,
    Operator { actor, .. }: Operator,
    session: Session,
    Path(id): Path<AlertId>,
    ConsoleForm(form): ConsoleForm<SnoozeForm>,
) -> Response {
    let outcome = async {
        let hours: i64 = match form.hours.trim().parse() {
            Ok(hours) if (1..=168).contains(&hours) => hours,
            _ => {
                return Err(AppError::Invalid(format!(
                    "snooze for 1 to 168 hours, not {:?}",
                    form.hours
                ))
                .into())
            }
        };
        let until = chrono::Utc::now() + chrono::Duration::hours(hours);
        let alert = alerts::snooze(&state.pool, actor, id, until).await?;
        Ok(Notice::success(format!(
            "Snoozed the alert on {} until {} UTC.",
            alert.key_label,
            until.format("%Y-%m-%d %H:%M")
        )))
    }
    .await;
    PAGE.back_with(&session, outcome).await
}
