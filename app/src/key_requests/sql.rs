//! Keys asked for beyond policy. The four-eyes rule, one decision per
//! request and no decision after expiry are enforced by the table's
//! constraints and trigger (see the migration); the rules people see are in
//! `key_requests::rules`.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgExecutor};

use crate::domain::{
    ApiTokenId, BillingPeriod, Cents, Currency, KeyRequest, KeyRequestId, OperatorId, VaultKeyId,
};
use crate::keys::sql::{NewKeyRow, VaultKeyRow, COLUMNS};

const SELECT: &str = "SELECT r.id, r.label, r.billing_period, r.currency, r.expected_total_cents,
        r.cap_cents, r.policy_cap_cents, r.over_policy, r.secret_prefix, r.requested_at,
        COALESCE(requester.email, 'API token ' || tok.name) AS requested_by,
        COALESCE(r.requested_by, tok.created_by) AS requested_by_id, r.expires_at,
        CASE WHEN r.decision IS NOT NULL THEN r.decision
             WHEN r.expires_at <= now() THEN 'expired' ELSE 'pending' END AS state,
        r.decided_at, decider.email AS decided_by, r.decision_note, r.vault_key_id
     FROM key_requests r
     LEFT JOIN operators requester ON requester.id = r.requested_by
     LEFT JOIN api_tokens tok ON tok.id = r.requested_by_token
     LEFT JOIN operators decider ON decider.id = r.decided_by";

/// Keeps the key as asked for (its `created_by` fields name the requester)
/// with why it is beyond policy; answers the request's id.
#[tracing::instrument(skip_all)]
pub async fn insert(
    db: impl PgExecutor<'_>,
    key: &NewKeyRow<'_>,
    over_policy: &str,
    policy_cap_cents: Cents,
    expires_at: DateTime<Utc>,
) -> Result<KeyRequestId, sqlx::Error> {
    sqlx::query_scalar(
        "INSERT INTO key_requests (secret_hash, secret_prefix, label, billing_period, currency,
             expected_total_cents, buffer_bps, cap_cents, allowed_endpoints, key_expires_at,
             requested_by, requested_by_token, alert_thresholds_pct, duplicate_policy,
             stripe_account, over_policy, policy_cap_cents, expires_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)
         RETURNING id",
    )
    .bind(key.secret_hash)
    .bind(key.secret_prefix)
    .bind(key.label)
    .bind(key.billing_period)
    .bind(key.currency)
    .bind(key.expected_total_cents)
    .bind(key.buffer_bps)
    .bind(key.cap_cents)
    .bind(key.allowed_endpoints)
    .bind(key.expires_at)
    .bind(key.created_by)
    .bind(key.created_by_token)
    .bind(key.alert_thresholds_pct)
    .bind(key.duplicate_policy)
    .bind(key.stripe_account)
    .bind(over_policy)
    .bind(policy_cap_cents)
    .bind(expires_at)
    .fetch_one(db)
    .await
}

#[tracing::instrument(skip_all)]
pub async fn find(
    db: impl PgExecutor<'_>,
    id: KeyRequestId,
) -> Result<Option<KeyRequest>, sqlx::Error> {
    sqlx::query_as(&format!("{SELECT} WHERE r.id = $1"))
        .bind(id)
        .fetch_optional(db)
        .await
}

/// The request, its row locked until the transaction ends.
#[tracing::instrument(skip_all)]
pub async fn lock(
    tx: &mut PgConnection,
    id: KeyRequestId,
) -> Result<Option<KeyRequest>, sqlx::Error> {
    sqlx::query_as(&format!("{SELECT} WHERE r.id = $1 FOR UPDATE OF r"))
        .bind(id)
        .fetch_optional(tx)
        .await
}

/// The request for the same key (label and period) by the same requester
/// that is still waiting, if any.
#[tracing::instrument(skip_all)]
pub async fn waiting_twin(
    db: impl PgExecutor<'_>,
    key: &NewKeyRow<'_>,
) -> Result<Option<KeyRequestId>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT id FROM key_requests
         WHERE label = $1 AND billing_period = $2 AND decision IS NULL AND expires_at > now()
           AND requested_by IS NOT DISTINCT FROM $3 AND requested_by_token IS NOT DISTINCT FROM $4
         LIMIT 1",
    )
    .bind(key.label)
    .bind(key.billing_period)
    .bind(key.created_by)
    .bind(key.created_by_token)
    .fetch_optional(db)
    .await
}

/// Requests waiting for a decision, oldest first.
#[tracing::instrument(skip_all)]
pub async fn pending(db: impl PgExecutor<'_>) -> Result<Vec<KeyRequest>, sqlx::Error> {
    sqlx::query_as(&format!(
        "{SELECT} WHERE r.decision IS NULL AND r.expires_at > now() ORDER BY r.requested_at, r.id"
    ))
    .fetch_all(db)
    .await
}

/// The caps of `period`'s live keys in `currency`: what billing jobs may
/// charge in it altogether now.
#[tracing::instrument(skip_all)]
pub async fn live_caps(
    db: impl PgExecutor<'_>,
    period: BillingPeriod,
    currency: &Currency,
) -> Result<Cents, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT coalesce(sum(cap_cents), 0)::bigint FROM vault_keys
         WHERE billing_period = $1 AND currency = $2 AND revoked_at IS NULL AND expires_at > now()",
    )
    .bind(period)
    .bind(currency)
    .fetch_one(db)
    .await
}

/// Issues the requested key as asked, with the secret shown to the
/// requester, created by the requester.
#[tracing::instrument(skip_all)]
pub async fn issue(tx: &mut PgConnection, id: KeyRequestId) -> Result<VaultKeyRow, sqlx::Error> {
    sqlx::query_as(&format!(
        "INSERT INTO vault_keys (secret_hash, secret_prefix, label, billing_period, currency,
             expected_total_cents, buffer_bps, cap_cents, allowed_endpoints, expires_at, created_by,
             created_by_token, alert_thresholds_pct, duplicate_policy, stripe_account)
         SELECT secret_hash, secret_prefix, label, billing_period, currency, expected_total_cents,
                buffer_bps, cap_cents, allowed_endpoints, key_expires_at, requested_by,
                requested_by_token, alert_thresholds_pct, duplicate_policy, stripe_account
         FROM key_requests WHERE id = $1
         RETURNING {COLUMNS}"
    ))
    .bind(id)
    .fetch_one(tx)
    .await
}

/// Records the decision on an undecided request; `false` when it was
/// already decided.
#[tracing::instrument(skip_all)]
pub async fn decide(
    tx: &mut PgConnection,
    id: KeyRequestId,
    approved: bool,
    by: OperatorId,
    note: Option<&str>,
    vault_key_id: Option<VaultKeyId>,
) -> Result<bool, sqlx::Error> {
    let updated = sqlx::query(
        "UPDATE key_requests
         SET decision = CASE WHEN $2 THEN 'approved' ELSE 'rejected' END,
             decided_at = now(), decided_by = $3, decision_note = $4, vault_key_id = $5
         WHERE id = $1 AND decision IS NULL",
    )
    .bind(id)
    .bind(approved)
    .bind(by)
    .bind(note)
    .bind(vault_key_id)
    .execute(tx)
    .await?;
    Ok(updated.rows_affected() == 1)
}

/// The largest cap a token may have issued without an approver, if it has
/// one.
#[tracing::instrument(skip_all)]
pub async fn token_ceiling(
    db: impl PgExecutor<'_>,
    token: ApiTokenId,
) -> Result<Option<Cents>, sqlx::Error> {
    sqlx::query_scalar("SELECT max_cap_cents FROM api_tokens WHERE id = $1")
        .bind(token)
        .fetch_optional(db)
        .await
        .map(Option::flatten)
}
