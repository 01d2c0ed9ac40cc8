//! Calls whose outcome is unknown are decided by asking Stripe, never by
//! guessing. Each minute `vaultcap serve` takes the calls unknown for five
//! minutes or more (the billing job's own retry comes first) and:
//!
//! * sends again, with its Idempotency-Key, every unknown call Stripe still
//!   remembers (made under 23 hours ago): Stripe answers with the original
//!   result if the call ran, or runs it now, which its reservation covers;
//!   the answer settles the reservation as the proxy would have;
//! * asks Stripe about every declined payment intent it could not cancel:
//!   succeeded is spent, cancelled is released, anything else is cancelled
//!   now and released once Stripe agrees.
//!
//! Everything else (no Idempotency-Key, or too old to re-send) stays
//! reserved: a sync settles it when Stripe's charge names it, and the
//! reconciliation page shows it to a person. Each question asked is a call
//! to Stripe with the real key, so it is written to the audit log.

use axum::http::{header, HeaderMap, HeaderValue, Method};
use bytes::Bytes;
use std::time::Instant;

use sqlx::PgPool;

use crate::proxy::{
    settle_answer,
    upstream::{Upstream, UpstreamError},
};
use app::{
    audit::sql::AuditEntry,
    domain::{moves_money, BillingPeriod, Cents, Decision, VaultKeyId},
    keys::spend::{self, CallRecord, Settlement},
};

/// Calls asked about per round, at most.
const PER_ROUND: i64 = 100;

/// One unknown call, as stored with its reservation.
#[derive(Debug, sqlx::FromRow)]
struct Unknown {
    id: i64,
    vault_key_id: VaultKeyId,
    key_prefix: String,
    method: String,
    path: String,
    idempotency_key: Option<String>,
    request_body: Option<String>,
    stripe_version: Option<String>,
    payment_intent: Option<String>,
    /// A declined payment intent's creation that Vaultcap could not cancel.
    declined_intent: bool,
    amount_cents: Cents,
    currency: Option<String>,
    billing_period: Option<BillingPeriod>,
    stripe_customer: Option<String>,
    metadata_customer_id: Option<String>,
}

/// What one round decided.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Resolved {
    pub settled: u64,
    pub released: u64,
    pub still_unknown: u64,
}

/// Asks Stripe about the unknown calls it can answer for; see the module.
#[tracing::instrument(skip_all)]
pub async fn resolve(pool: &PgPool, upstream: &Upstream) -> Result<Resolved, sqlx::Error> {
    let mut resolved = Resolved::default();
    if !upstream.is_configured() {
        return Ok(resolved);
    }
    let candidates: Vec<Unknown> = sqlx::query_as(
        "SELECT r.id, r.vault_key_id, k.secret_prefix AS key_prefix, r.method, r.path, r.idempotency_key,
                r.request_body, r.stripe_version, r.payment_intent,
                coalesce(r.payment_intent = r.stripe_charge_id, false) AS declined_intent,
                r.amount_cents, r.currency,
                r.billing_period, r.stripe_customer, r.metadata_customer_id
         FROM reservations r JOIN vault_keys k ON k.id = r.vault_key_id
         WHERE r.state = 'outcome_unknown' AND NOT r.superseded
           -- Never a new charge under a key nobody may use any more.
           AND k.revoked_at IS NULL AND k.expires_at > now()
           AND coalesce(r.settled_at, r.claimed_until) < now() - interval '5 minutes'
           AND ((r.payment_intent IS NOT NULL AND r.stripe_charge_id = r.payment_intent)
                OR (r.idempotency_key IS NOT NULL AND r.request_body IS NOT NULL
                    AND r.created_at > now() - interval '23 hours'
                    -- If the job charged the customer again since (another
                    -- key), sending this again could charge them twice:
                    -- a person decides.
                    AND NOT EXISTS (
                        SELECT 1 FROM reservations o
                        WHERE o.id <> r.id AND o.metadata_customer_id = r.metadata_customer_id
                          AND o.billing_period = r.billing_period
                          AND o.state IN ('pending', 'settled', 'outcome_unknown'))))
         ORDER BY r.id
         LIMIT $1",
    )
    .bind(PER_ROUND)
    .fetch_all(pool)
    .await?;
    for call in candidates {
        // Claimed as in flight, as the proxy claims a retry: nobody else
        // asks about it meanwhile, and the sweep takes it back if we die.
        let claimed = sqlx::query(
            "UPDATE reservations SET state = 'pending', claimed_until = now() + make_interval(secs => $2)
             WHERE id = $1 AND state = 'outcome_unknown'",
        )
        .bind(call.id)
        .bind(upstream.lease().as_secs() as f64)
        .execute(pool)
        .await?
        .rows_affected();
        if claimed == 0 {
            continue;
        }
        // Sending a declined intent's creation again would only replay
        // the decline: the intent itself says what became of it.
        let record = match (&call.payment_intent, call.declined_intent) {
            (Some(intent), true) => ask_about_intent(upstream, &call, intent).await,
            _ => resend(upstream, &call).await,
        };
        match record.settlement {
            Some(Settlement::Spent) => resolved.settled += 1,
            Some(Settlement::Released) => resolved.released += 1,
            _ => resolved.still_unknown += 1,
        }
        // One call that cannot be written stops only itself: it stays
        // pending, and the sweep records it as unknown again.
        if let Err(err) = spend::record_many(pool, &[record]).await {
            tracing::error!(error = %err, reservation = call.id, "could not record what Stripe said");
        }
    }
    Ok(resolved)
}

/// The audit row of a question Vaultcap asked Stripe about `call`.
fn question(call: &Unknown, method: &str, path: &str) -> CallRecord {
    CallRecord {
        entry: AuditEntry {
            vault_key_id: Some(call.vault_key_id),
            key_prefix: Some(call.key_prefix.clone()),
            stripe_customer: call.stripe_customer.clone(),
            metadata_customer_id: call.metadata_customer_id.clone(),
            billing_period: call.billing_period,
            amount_cents: Some(call.amount_cents),
            currency: call.currency.clone(),
            idempotency_key: call.idempotency_key.clone(),
            decision: Decision::Replay,
            stripe_object_id: call.payment_intent.clone(),
            ..AuditEntry::received(method, path)
        },
        reservation_id: Some(call.id),
        settlement: Some(Settlement::Unknown),
        duplicate_of: None,
        release: None,
    }
}

/// Sends the original request again with its Idempotency-Key.
#[tracing::instrument(skip_all)]
async fn resend(upstream: &Upstream, call: &Unknown) -> CallRecord {
    let mut record = question(call, &call.method, &call.path);
    let mut headers = form_headers();
    if let Some(key) = call.idempotency_key.as_deref().and_then(header_value) {
        headers.insert("idempotency-key", key);
    }
    if let Some(version) = call.stripe_version.as_deref().and_then(header_value) {
        headers.insert("stripe-version", version);
    }
    let method = Method::from_bytes(call.method.as_bytes()).unwrap_or(Method::POST);
    let body = Bytes::from(call.request_body.clone().unwrap_or_default());
    let started = Instant::now();
    let answer = upstream.forward(&method, &call.path, &headers, body).await;
    record.entry.latency_ms = i32::try_from(started.elapsed().as_millis()).unwrap_or(i32::MAX);
    match answer {
        Ok(answer) => {
            record.entry.upstream_status = Some(answer.status.as_u16() as i16);
            let creates = moves_money(&call.method, &call.path);
            let outcome = settle_answer(upstream, answer.status, &answer.body, creates, true).await;
            record.settlement = Some(outcome.settlement);
            record.entry.stripe_object_id = outcome.object.or(record.entry.stripe_object_id.take());
            record.entry.message = Some(format!(
                "Vaultcap sent the call of unknown outcome again with its Idempotency-Key; Stripe answered {}{}",
                answer.status,
                outcome.note.map(|note| format!(": {note}")).unwrap_or_default()
            ));
        }
        Err(err) => {
            record.entry.message = Some(format!(
                "Vaultcap sent the call of unknown outcome again; no answer ({})",
                reason(&err)
            ));
        }
    }
    if record.settlement == Some(Settlement::Unknown) {
        record.entry.decision = Decision::OutcomeUnknown;
    }
    record
}

/// A declined payment intent Vaultcap could not cancel: what is it now?
#[tracing::instrument(skip_all)]
async fn ask_about_intent(upstream: &Upstream, call: &Unknown, intent: &str) -> CallRecord {
    let path = format!("/v1/payment_intents/{intent}");
    let mut record = question(call, "GET", &path);
    let status = match upstream
        .forward(&Method::GET, &path, &HeaderMap::new(), Bytes::new())
        .await
    {
        Ok(answer) if answer.status.is_success() => {
            record.entry.upstream_status = Some(answer.status.as_u16() as i16);
            serde_json::from_slice::<serde_json::Value>(&answer.body)
                .ok()
                .and_then(|v| v["status"].as_str().map(str::to_owned))
        }
        Ok(answer) => {
            record.entry.upstream_status = Some(answer.status.as_u16() as i16);
            None
        }
        Err(_) => None,
    };
    record.settlement = Some(match status.as_deref() {
        Some("succeeded") => Settlement::Spent,
        Some("canceled") => Settlement::Released,
        Some(_) => {
            let cancel = format!("{path}/cancel");
            record.entry.method = "POST".into();
            record.entry.path = cancel.clone();
            match upstream
                .forward(&Method::POST, &cancel, &form_headers(), Bytes::new())
                .await
            {
                Ok(answer) if answer.status.is_success() => Settlement::Released,
                _ => Settlement::Unknown,
            }
        }
        None => Settlement::Unknown,
    });
    record.entry.message = Some(format!(
        "Vaultcap asked Stripe about declined payment intent {intent} ({}): {}",
        status.as_deref().unwrap_or("no answer"),
        match record.settlement {
            Some(Settlement::Spent) => "it succeeded, so its amount is spent",
            Some(Settlement::Released) => "it is cancelled, so its amount is released",
            _ => "it stays reserved",
        }
    ));
    if record.settlement == Some(Settlement::Unknown) {
        record.entry.decision = Decision::OutcomeUnknown;
    }
    record
}

fn form_headers() -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-www-form-urlencoded"),
    );
    headers
}

fn header_value(text: &str) -> Option<HeaderValue> {
    HeaderValue::from_str(text).ok()
}

fn reason(err: &UpstreamError) -> String {
    match err {
        UpstreamError::NotSent(reason) | UpstreamError::Unknown(reason) => reason.clone(),
    }
}
