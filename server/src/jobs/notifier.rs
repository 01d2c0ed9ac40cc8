//! Delivers alert and cap increase notifications to the configured webhooks.
//!
//! Alerts, cap increase requests (made, decided) and charges made around
//! the proxy (unmetered findings) are queued in `alert_notifications` in the same transaction that
//! raises them (the outbox); this job plans one delivery per webhook of the
//! fleet (`--alert-webhook` in `fleet_settings`, read on every pass, so every
//! instance delivers to the same list) and
//! posts each until it succeeds, with backoff. Nothing here runs inside the
//! proxy's path: a webhook that is down delays only its own deliveries.
//!
//! The body is Slack incoming-webhook compatible (`text`) and carries the
//! subject as JSON for any other receiver (`event`, and `alert` or
//! `cap_increase`).

use std::time::Duration;

use futures::future::join_all;
use serde_json::json;
use sqlx::{postgres::PgListener, PgPool};

use app::{
    alerts::sql::{self as alerts, Alert},
    cap_increases::sql as cap_increases,
    domain::{AlertId, CapIncrease, CapIncreaseId, Finding, FindingId, PeriodClose},
    periods::sql as period_closes,
    reconciliation::findings,
};

/// The longest a due retry waits for its pass.
const POLL: Duration = Duration::from_secs(5);
/// Deliveries attempted per pass.
const BATCH: i64 = 20;
/// After this many failed attempts a delivery is given up (state `failed`).
const MAX_ATTEMPTS: i32 = 8;
/// The wait before attempt n + 1 is `FIRST_RETRY × 2^(n-1)`, at most an hour.
const FIRST_RETRY: Duration = Duration::from_secs(5);
const MAX_RETRY: Duration = Duration::from_secs(3600);

#[derive(Clone)]
pub struct Notifier {
    pool: PgPool,
    client: reqwest::Client,
}

/// What one pass did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Pass {
    pub planned: u64,
    pub delivered: usize,
    pub failed_attempts: usize,
}

#[derive(sqlx::FromRow)]
struct Due {
    id: i64,
    url: String,
    attempts: i32,
    event: String,
    alert_id: Option<AlertId>,
    cap_increase_request_id: Option<CapIncreaseId>,
    finding_id: Option<FindingId>,
    period_close_id: Option<i64>,
}

impl Notifier {
    pub fn new(pool: PgPool) -> anyhow::Result<Self> {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .user_agent(concat!("vaultcap/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Self { pool, client })
    }

    /// Runs until aborted: a pass whenever an alert is raised (LISTEN) and
    /// at least every 5 seconds for retries. The listener holds one pool
    /// connection, so abort this task before closing the pool.
    pub async fn run(self) {
        let mut listener = match self.listen().await {
            Ok(listener) => Some(listener),
            Err(err) => {
                tracing::warn!(error = %err, "alert notifier: LISTEN failed; polling every 5 s instead");
                None
            }
        };
        loop {
            if let Err(err) = self.pass().await {
                tracing::error!(error = %err, "alert notifier pass failed");
            }
            let every_5s = tokio::time::sleep(POLL);
            match listener.as_mut() {
                Some(listener) => {
                    tokio::select! {
                        _ = every_5s => {}
                        heard = listener.recv() => {
                            if let Err(err) = heard {
                                // Never spin on a broken connection.
                                tracing::warn!(error = %err, "alert notifier: LISTEN connection failed");
                                tokio::time::sleep(POLL).await;
                            }
                        }
                    }
                }
                None => every_5s.await,
            }
        }
    }

    async fn listen(&self) -> Result<PgListener, sqlx::Error> {
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener.listen("vaultcap_alerts").await?;
        Ok(listener)
    }

    /// Plans deliveries for newly queued notifications, then attempts every
    /// delivery that is due.
    pub async fn pass(&self) -> Result<Pass, sqlx::Error> {
        let planned = sqlx::query(
            "WITH planned AS (
                 UPDATE alert_notifications SET planned_at = now()
                 WHERE id IN (SELECT id FROM alert_notifications WHERE planned_at IS NULL
                              ORDER BY id LIMIT 500 FOR UPDATE SKIP LOCKED)
                 RETURNING id
             )
             INSERT INTO alert_deliveries (notification_id, url)
             SELECT planned.id, url
             FROM planned, jsonb_array_elements_text(
                 (SELECT value FROM fleet_settings WHERE flag = '--alert-webhook')) AS url
             ON CONFLICT ON CONSTRAINT alert_deliveries_once DO NOTHING",
        )
        .execute(&self.pool)
        .await?
        .rows_affected();

        let mut tx = self.pool.begin().await?;
        // Locked for the attempt, so two servers never post the same one.
        let due: Vec<Due> = sqlx::query_as(
            "SELECT d.id, d.url, d.attempts, n.event, n.alert_id, n.cap_increase_request_id, n.finding_id,
                    n.period_close_id
             FROM alert_deliveries d JOIN alert_notifications n ON n.id = d.notification_id
             WHERE d.state = 'pending' AND d.next_attempt_at <= now()
             ORDER BY d.next_attempt_at LIMIT $1
             FOR UPDATE OF d SKIP LOCKED",
        )
        .bind(BATCH)
        .fetch_all(&mut *tx)
        .await?;
        let mut bodies = Vec::with_capacity(due.len());
        for delivery in &due {
            // Exactly one subject is set (alert_notifications_one_subject).
            let body = if let Some(id) = delivery.alert_id {
                alerts::find(&mut *tx, id)
                    .await?
                    .map(|alert| notification(&alert))
            } else if let Some(id) = delivery.cap_increase_request_id {
                cap_increases::find(&mut *tx, id)
                    .await?
                    .map(|request| cap_increase_notification(&delivery.event, &request))
            } else if let Some(id) = delivery.finding_id {
                findings::find(&mut *tx, id)
                    .await?
                    .map(|finding| unmetered_notification(&finding))
            } else if let Some(id) = delivery.period_close_id {
                period_closes::find(&mut *tx, id)
                    .await?
                    .map(|close| period_notification(&delivery.event, &close))
            } else {
                None
            };
            bodies.push(body);
        }
        let outcomes = join_all(
            due.iter()
                .zip(&bodies)
                .map(|(delivery, body)| self.post(&delivery.url, body.as_ref())),
        )
        .await;
        let mut pass = Pass {
            planned,
            ..Pass::default()
        };
        for (delivery, outcome) in due.iter().zip(outcomes) {
            match outcome {
                Ok(status) => {
                    pass.delivered += 1;
                    sqlx::query(
                        "UPDATE alert_deliveries SET state = 'delivered', delivered_at = now(),
                                attempts = attempts + 1, last_status = $2, last_error = NULL
                         WHERE id = $1",
                    )
                    .bind(delivery.id)
                    .bind(status as i16)
                    .execute(&mut *tx)
                    .await?;
                }
                Err((status, error)) => {
                    pass.failed_attempts += 1;
                    let attempts = delivery.attempts + 1;
                    let state = if attempts >= MAX_ATTEMPTS {
                        "failed"
                    } else {
                        "pending"
                    };
                    sqlx::query(
                        "UPDATE alert_deliveries SET state = $2, attempts = $3, last_status = $4,
                                last_error = $5, next_attempt_at = now() + make_interval(secs => $6)
                         WHERE id = $1",
                    )
                    .bind(delivery.id)
                    .bind(state)
                    .bind(attempts)
                    .bind(status.map(|s| s as i16))
                    .bind(&error)
                    .bind(retry_after(attempts).as_secs_f64())
                    .execute(&mut *tx)
                    .await?;
                    tracing::warn!(url = %delivery.url, attempts, error, "alert webhook delivery failed");
                }
            }
        }
        tx.commit().await?;
        Ok(pass)
    }

    /// Posts one notification: the status on 2xx, else the status (if any)
    /// and what went wrong.
    #[tracing::instrument(skip_all)]
    async fn post(
        &self,
        url: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<u16, (Option<u16>, String)> {
        let body = body.ok_or((None, "its subject no longer exists".to_owned()))?;
        let response = self
            .client
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_string())
            .send()
            .await
            .map_err(|err| (None, err.to_string()))?;
        let status = response.status();
        if status.is_success() {
            Ok(status.as_u16())
        } else {
            Err((
                Some(status.as_u16()),
                format!("the webhook answered {status}"),
            ))
        }
    }
}

/// The webhook body: Slack shows `text`; other receivers read `alert`.
fn notification(alert: &Alert) -> serde_json::Value {
    let text = alert.describe();
    json!({
        "text": format!("Vaultcap alert: {text}"),
        "event": "alert.raised",
        "alert": {
            "id": alert.id,
            "vault_key_id": alert.vault_key_id,
            "key_label": alert.key_label,
            "kind": alert.kind,
            "threshold_pct": alert.threshold_pct,
            "message": text,
            "currency": alert.currency,
            "committed_cents": alert.committed_cents,
            "cap_cents": alert.cap_cents,
            "amount_cents": alert.amount_cents,
            "raised_at": alert.raised_at,
        },
    })
}

/// A cap increase event's body: made (`cap_increase.requested`) or
/// decided (`cap_increase.decided`). Always the request as it is now, so a
/// late retry of the first event still tells the truth.
fn cap_increase_notification(event: &str, request: &CapIncrease) -> serde_json::Value {
    let text = if event == "cap_increase.requested" {
        request.describe_request()
    } else {
        request.describe_decision()
    };
    json!({
        "text": format!("Vaultcap approval: {text}"),
        "event": event,
        "cap_increase": {
            "id": request.id,
            "vault_key_id": request.vault_key_id,
            "key_label": request.key_label,
            "currency": request.currency,
            "from_cap_cents": request.from_cap_cents,
            "to_cap_cents": request.to_cap_cents,
            "apply_as": request.apply_as,
            "reason": request.reason,
            "state": request.state,
            "requested_by": request.requested_by,
            "decided_by": request.decided_by,
            "decision_note": request.decision_note,
            "message": text,
        },
    })
}

/// An unmetered finding's body: charges that no vault key's call made.
fn unmetered_notification(finding: &Finding) -> serde_json::Value {
    let amount = format!(
        "{} {}",
        finding.at_risk.format(&finding.currency),
        finding.currency
    );
    let text = format!(
        "Vaultcap: {amount} charged in Stripe without a vault key for {} in {} ({}): \
         someone used the real Stripe key directly.",
        finding.customer_id,
        finding.billing_period,
        finding.charge_ids.join(", "),
    );
    json!({
        "text": text,
        "event": "finding.unmetered",
        "finding": {
            "id": finding.id,
            "kind": finding.kind,
            "billing_period": finding.billing_period,
            "customer_id": finding.customer_id,
            "currency": finding.currency,
            "charge_ids": finding.charge_ids,
            "amount_cents": finding.at_risk,
            "message": finding.explanation,
        },
    })
}

/// A period close's body: prepared (`period.prepared`) or signed off
/// (`period.signed_off`), said as of that event.
fn period_notification(event: &str, close: &PeriodClose) -> serde_json::Value {
    let period = close.billing_period;
    let text = match (event, &close.signed_by) {
        ("period.signed_off", Some(signer)) => format!(
            "Vaultcap: billing period {period} was signed off by {signer} (prepared by {}); \
             its keys are revoked and its report is frozen (SHA-256 {}).",
            close.prepared_by,
            close.report_sha256.as_deref().unwrap_or_default()
        ),
        _ => format!(
            "Vaultcap: {} prepared the close of billing period {period}; \
             an approver other than them signs it off.",
            close.prepared_by
        ),
    };
    json!({
        "text": text,
        "event": event,
        "period_close": {
            "id": close.id,
            "billing_period": period,
            "prepared_by": close.prepared_by,
            "prepared_at": close.prepared_at,
            "signed_by": close.signed_by,
            "signed_at": close.signed_at,
            "report_sha256": close.report_sha256,
        },
    })
}

fn retry_after(attempts: i32) -> Duration {
    let factor = 2u32.saturating_pow(attempts.saturating_sub(1).max(0) as u32);
    FIRST_RETRY.saturating_mul(factor).min(MAX_RETRY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_exponentially_up_to_an_hour() {
        assert_eq!(retry_after(1), Duration::from_secs(5));
        assert_eq!(retry_after(2), Duration::from_secs(10));
        assert_eq!(retry_after(4), Duration::from_secs(40));
        assert_eq!(retry_after(20), MAX_RETRY);
    }
}
