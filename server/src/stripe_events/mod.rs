//! Live from Stripe: `POST /stripe/webhooks` takes Stripe's signed events
//! (charges and payment intents), stores each once and keeps the synced
//! charges current between syncs, so that a call of unknown outcome is
//! settled when its charge arrives and duplicates, orphans and charges made
//! around the proxy (`unmetered`) show without a sync (`live`).
//!
//! Stripe hears 2xx only once the event is stored: an error is a 5xx, and
//! Stripe delivers again. A refused delivery (no or a bad signature, outside
//! the 5-minute tolerance, not an event) is a 400, recorded in the action
//! log, with nothing else changed.

pub mod apply;
pub mod live;
pub mod verify;

use axum::{
    body::Bytes,
    extract::State,
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    routing::post,
    Json, Router,
};
use serde_json::json;
use sqlx::PgPool;

use crate::http::ClientIp;
use app::actions::sql::{self as actions, Actor};
pub use verify::WebhookSecrets;

/// Stripe's events are small; a body beyond this is not one.
const MAX_EVENT_BODY: usize = 512 * 1024;

#[derive(Clone)]
struct Receiver {
    pool: PgPool,
    secrets: WebhookSecrets,
}

/// The webhook route, answering with `pool` and verifying with `secrets`.
pub fn router<S: Clone + Send + Sync + 'static>(
    pool: PgPool,
    secrets: WebhookSecrets,
) -> Router<S> {
    Router::new()
        .route("/stripe/webhooks", post(receive))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_EVENT_BODY))
        .with_state(Receiver { pool, secrets })
}

async fn receive(
    State(receiver): State<Receiver>,
    ClientIp(ip): ClientIp,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if receiver.secrets.is_empty() {
        return answer(
            StatusCode::SERVICE_UNAVAILABLE,
            "Stripe webhooks are not enabled here: set STRIPE_WEBHOOK_SECRET (Stripe delivers again later)",
        );
    }
    let signature = headers
        .get("stripe-signature")
        .and_then(|value| value.to_str().ok());
    let checked = std::str::from_utf8(&body)
        .map_err(|_| verify::Refused::Malformed("the body is not UTF-8".into()))
        .and_then(|body| verify::verify(&receiver.secrets, body, signature));
    let event = match checked {
        Ok(event) => event,
        Err(refused) => {
            let reason = refused.to_string();
            tracing::warn!(%reason, "refused a Stripe webhook delivery");
            let recorded = actions::record(
                &receiver.pool,
                Actor::System,
                "stripe_event.refuse",
                "stripe_event",
                None,
                json!({ "reason": reason, "ip": ip.map(|ip| ip.to_string()), "bytes": body.len() }),
            )
            .await;
            if let Err(err) = recorded {
                tracing::error!(error = %err, "recording a refused Stripe webhook delivery");
            }
            return answer(StatusCode::BAD_REQUEST, &reason);
        }
    };
    match apply::store(&receiver.pool, &event).await {
        Ok(stored) => {
            let (received, outcome) = match stored {
                apply::Stored::New { outcome } => (true, outcome.as_str()),
                apply::Stored::Again => (false, "already received"),
            };
            (
                StatusCode::OK,
                Json(json!({ "id": event.id, "stored": received, "outcome": outcome })),
            )
                .into_response()
        }
        Err(err) => {
            tracing::error!(error = %err, event = %event.id, "storing a Stripe event");
            answer(
                StatusCode::SERVICE_UNAVAILABLE,
                "the event could not be stored; Stripe delivers it again",
            )
        }
    }
}

fn answer(status: StatusCode, message: &str) -> Response {
    (status, Json(json!({ "error": { "message": message } }))).into_response()
}
