//! A verified event, stored once and applied: the charge or payment intent
//! it describes refreshed (unless what is stored is newer), and a call of
//! unknown outcome that the charge explains settled. All in one
//! transaction, committed before Stripe hears 2xx.

use sqlx::PgPool;

use super::verify::{About, Received};
use app::{
    actions::sql::{self as actions, Actor},
    keys::spend,
    reconciliation::stripe_charges,
};

/// What storing an event did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stored {
    /// Stored now; `outcome` is what it changed.
    New { outcome: Outcome },
    /// Stored before (a redelivery): nothing changed.
    Again,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Applied,
    /// The stored object is as new or newer (events come out of order).
    Stale,
    Ignored,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Applied => "applied",
            Self::Stale => "stale",
            Self::Ignored => "ignored",
        }
    }
}

/// Stores and applies `event` (see the module).
#[tracing::instrument(skip_all, fields(event = %event.id, kind = %event.type_))]
pub async fn store(pool: &PgPool, event: &Received) -> Result<Stored, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let seen: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM stripe_events WHERE id = $1)")
            .bind(&event.id)
            .fetch_one(&mut *tx)
            .await?;
    if seen {
        return Ok(Stored::Again);
    }
    let mut settled = None;
    let outcome = match &event.about {
        About::Charge(charge) => {
            let fresh =
                stripe_charges::upsert(&mut tx, std::slice::from_ref(charge), event.created)
                    .await?;
            if fresh == 0 {
                Outcome::Stale
            } else {
                settled = spend::settle_unknown_by_charge(&mut tx, &charge.id).await?;
                Outcome::Applied
            }
        }
        About::PaymentIntent(intent) => {
            let fresh = stripe_charges::upsert_intents(
                &mut tx,
                std::slice::from_ref(intent),
                event.created,
            )
            .await?;
            if fresh == 0 {
                Outcome::Stale
            } else {
                Outcome::Applied
            }
        }
        About::Unused { .. } => Outcome::Ignored,
    };
    // Two deliveries of one event at once: the second waits here for the
    // first to commit, finds the id taken and rolls back what it applied.
    let inserted = sqlx::query(
        "INSERT INTO stripe_events (id, type, object_id, created_at, livemode, outcome, payload)
         VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (id) DO NOTHING",
    )
    .bind(&event.id)
    .bind(&event.type_)
    .bind(event.about.object_id())
    .bind(event.created)
    .bind(event.livemode)
    .bind(outcome.as_str())
    .bind(&event.payload)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if inserted == 0 {
        tx.rollback().await?;
        return Ok(Stored::Again);
    }
    actions::record(
        &mut *tx,
        Actor::System,
        "stripe_event.receive",
        "stripe_event",
        Some(event.id.clone()),
        serde_json::json!({
            "type": event.type_,
            "object": event.about.object_id(),
            "outcome": outcome.as_str(),
        }),
    )
    .await?;
    if let (Some(decided), Some(charge)) = (settled, event.about.object_id()) {
        record_decided(&mut tx, decided, charge, Some(&event.id)).await?;
    }
    tx.commit().await?;
    Ok(Stored::New { outcome })
}

/// Records in the action log a call of unknown outcome that Stripe's charge
/// decided (from the event `event`, or a later pass).
pub(super) async fn record_decided(
    tx: &mut sqlx::PgConnection,
    (reservation, state): (i64, &str),
    charge: &str,
    event: Option<&str>,
) -> Result<(), sqlx::Error> {
    actions::record(
        tx,
        Actor::System,
        if state == "settled" {
            "reservation.settle"
        } else {
            "reservation.release"
        },
        "reservation",
        Some(reservation.to_string()),
        serde_json::json!({ "stripe_charge_id": charge, "stripe_event": event }),
    )
    .await
}
