//! Cap increase requests. The four-eyes rule, one decision per request and
//! no decision after expiry are enforced by the table's constraints and
//! trigger (see the migration); the rules people see are in
//! `cap_increases::rules`.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgExecutor};

use crate::domain::{
    ApiTokenId, ApplyAs, CapIncrease, CapIncreaseId, Cents, OperatorId, VaultKeyId,
};

/// The SQL that derives a request's state from a `cap_increase_requests`
/// row aliased `r` and its key aliased `k`.
const STATE_SQL: &str = "CASE WHEN r.decision IS NOT NULL THEN r.decision
                              WHEN r.expires_at <= now() OR k.revoked_at IS NOT NULL THEN 'expired'
                              ELSE 'pending' END";

fn select_sql() -> String {
    format!(
        "SELECT r.id, r.vault_key_id, k.label AS key_label, k.currency, k.cap_cents AS key_cap_cents,
                k.spent_cents + k.reserved_cents AS key_committed_cents,
                r.from_cap_cents, r.to_cap_cents, r.apply_as, r.reason, r.origin, r.requested_at,
                (extract(epoch FROM now() - r.requested_at) / 60)::bigint AS age_minutes,
                COALESCE(requester.email, 'API token ' || tok.name) AS requested_by,
                COALESCE(r.requested_by, tok.created_by) AS requested_by_id, r.expires_at, {STATE_SQL} AS state,
                r.decided_at, decider.email AS decided_by, r.decision_note, r.follow_on_key_id
         FROM cap_increase_requests r
         JOIN vault_keys k ON k.id = r.vault_key_id
         LEFT JOIN operators requester ON requester.id = r.requested_by
         LEFT JOIN api_tokens tok ON tok.id = r.requested_by_token
         LEFT JOIN operators decider ON decider.id = r.decided_by"
    )
}

#[tracing::instrument(skip_all)]
pub async fn find(
    db: impl PgExecutor<'_>,
    id: CapIncreaseId,
) -> Result<Option<CapIncrease>, sqlx::Error> {
    sqlx::query_as(&format!("{} WHERE r.id = $1", select_sql()))
        .bind(id)
        .fetch_optional(db)
        .await
}

/// Which requests a list shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listing {
    /// Waiting for a decision, oldest first (the next to decide on top).
    Pending,
    /// Decided or expired, newest first.
    History,
    /// One key's requests, newest first.
    Key(VaultKeyId),
}

#[tracing::instrument(skip_all)]
pub async fn list(
    db: impl PgExecutor<'_>,
    listing: Listing,
    limit: i64,
) -> Result<Vec<CapIncrease>, sqlx::Error> {
    let (state, key, order) = match listing {
        Listing::Pending => (Some("pending"), None, "r.requested_at, r.id"),
        Listing::History => (
            None,
            None,
            "COALESCE(r.decided_at, r.expires_at) DESC, r.id DESC",
        ),
        Listing::Key(id) => (None, Some(id), "r.requested_at DESC, r.id DESC"),
    };
    let history = listing == Listing::History;
    sqlx::query_as(&format!(
        "{} WHERE ($2::text IS NULL OR {STATE_SQL} = $2)
              AND (NOT $3 OR {STATE_SQL} <> 'pending')
              AND ($4::bigint IS NULL OR r.vault_key_id = $4)
         ORDER BY {order} LIMIT $1",
        select_sql()
    ))
    .bind(limit)
    .bind(state)
    .bind(history)
    .bind(key)
    .fetch_all(db)
    .await
}

/// The request waiting for a decision on a key, if one is (there is at most
/// one: a second is refused while it waits).
#[tracing::instrument(skip_all)]
pub async fn pending_for_key(
    db: impl PgExecutor<'_>,
    key: VaultKeyId,
) -> Result<Option<CapIncrease>, sqlx::Error> {
    sqlx::query_as(&format!(
        "{} WHERE r.vault_key_id = $1 AND {STATE_SQL} = 'pending' ORDER BY r.id DESC LIMIT 1",
        select_sql()
    ))
    .bind(key)
    .fetch_optional(db)
    .await
}

/// How many requests wait for a decision, and how many are decided or
/// expired.
#[tracing::instrument(skip_all)]
pub async fn counts(db: impl PgExecutor<'_>) -> Result<(i64, i64), sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT count(*) FILTER (WHERE s = 'pending'), count(*) FILTER (WHERE s <> 'pending')
         FROM (SELECT {STATE_SQL} AS s FROM cap_increase_requests r
               JOIN vault_keys k ON k.id = r.vault_key_id) states"
    ))
    .fetch_one(db)
    .await
}

/// Requests waiting for a decision (cap increases and new keys beyond
/// policy), for the navigation badge.
#[tracing::instrument(skip_all)]
pub async fn pending_count(db: impl PgExecutor<'_>) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM cap_increase_requests r JOIN vault_keys k ON k.id = r.vault_key_id
                 WHERE r.decision IS NULL AND r.expires_at > now() AND k.revoked_at IS NULL)
              + (SELECT count(*) FROM key_requests WHERE decision IS NULL AND expires_at > now())",
    )
    .fetch_one(db)
    .await
}

/// What a key can move in all: its own cap plus the caps of its follow-on
/// keys that are not revoked.
#[tracing::instrument(skip_all)]
pub async fn granted_cents(db: impl PgExecutor<'_>, key: VaultKeyId) -> Result<Cents, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT k.cap_cents + COALESCE((SELECT sum(c.cap_cents) FROM vault_keys c
                                        WHERE c.parent_key_id = k.id AND c.revoked_at IS NULL), 0)::bigint
         FROM vault_keys k WHERE k.id = $1",
    )
    .bind(key)
    .fetch_one(db)
    .await
}

/// Locks a request's row: a second decision waits here for the first to
/// commit, then sees it.
#[tracing::instrument(skip_all)]
pub async fn lock(
    tx: &mut PgConnection,
    id: CapIncreaseId,
) -> Result<Option<CapIncrease>, sqlx::Error> {
    let exists = sqlx::query("SELECT 1 FROM cap_increase_requests WHERE id = $1 FOR UPDATE")
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?
        .is_some();
    if !exists {
        return Ok(None);
    }
    find(tx, id).await
}

/// A request to insert; the caller has checked it.
pub struct NewRequest<'a> {
    pub key: VaultKeyId,
    pub from_cap_cents: Cents,
    pub to_cap_cents: Cents,
    pub apply_as: ApplyAs,
    pub reason: &'a str,
    pub origin: &'a str,
    pub requested_by: Option<OperatorId>,
    pub requested_by_token: Option<ApiTokenId>,
    pub expires_at: DateTime<Utc>,
}

#[tracing::instrument(skip_all)]
pub async fn insert(
    tx: &mut PgConnection,
    request: &NewRequest<'_>,
) -> Result<CapIncreaseId, sqlx::Error> {
    sqlx::query_scalar(
        "INSERT INTO cap_increase_requests (vault_key_id, from_cap_cents, to_cap_cents, apply_as,
             reason, origin, requested_by, requested_by_token, expires_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING id",
    )
    .bind(request.key)
    .bind(request.from_cap_cents)
    .bind(request.to_cap_cents)
    .bind(request.apply_as)
    .bind(request.reason)
    .bind(request.origin)
    .bind(request.requested_by)
    .bind(request.requested_by_token)
    .bind(request.expires_at)
    .fetch_one(tx)
    .await
}

/// Records a decision on an undecided request; false if it was decided.
#[tracing::instrument(skip_all)]
pub async fn decide(
    tx: &mut PgConnection,
    id: CapIncreaseId,
    approved: bool,
    decided_by: OperatorId,
    note: Option<&str>,
    follow_on_key: Option<VaultKeyId>,
) -> Result<bool, sqlx::Error> {
    Ok(sqlx::query(
        "UPDATE cap_increase_requests
         SET decision = $2, decided_at = now(), decided_by = $3, decision_note = $4, follow_on_key_id = $5
         WHERE id = $1 AND decision IS NULL",
    )
    .bind(id)
    .bind(if approved { "approved" } else { "rejected" })
    .bind(decided_by)
    .bind(note)
    .bind(follow_on_key)
    .execute(tx)
    .await?
    .rows_affected()
        == 1)
}

/// Adds `additional` to a key's cap; the proxy's next reservation sees it.
#[tracing::instrument(skip_all)]
pub async fn raise_cap(
    tx: &mut PgConnection,
    key: VaultKeyId,
    additional: i64,
) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "UPDATE vault_keys SET cap_cents = cap_cents + $2 WHERE id = $1 RETURNING cap_cents",
    )
    .bind(key)
    .bind(additional)
    .fetch_one(tx)
    .await
}
