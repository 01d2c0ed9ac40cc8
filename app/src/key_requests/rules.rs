//! Keys beyond policy. A new key is issued at once only when its cap is at
//! most its expected total plus the policy's buffer and under the ceiling
//! of whoever asks (their API token's, or their role's); otherwise it waits
//! for a different approver, as a cap increase does. The four-eyes rule
//! holds in the database too (see the migration).

use chrono::{Duration, Utc};
use serde_json::json;
use sqlx::PgPool;

use crate::{
    actions::sql::{self as actions, Actor},
    cap_increases::rules::{decision_note, decision_refused, not_their_own, Verdict},
    key_requests::sql as key_requests,
    keys::{
        rules::{self as vault_keys, NewVaultKey},
        sql::VaultKeyRow,
    },
    operators::sql as operators,
    ssr::secrets::Secret,
};
use crate::{
    domain::{Cents, KeyRequest, KeyRequestId, Me, RequestState, Role},
    error::AppError,
};

/// How far a new key may go without a second person.
#[derive(Debug, Clone)]
pub struct KeyPolicy {
    /// The largest buffer over the expected total, in basis points
    /// (1000 = 10 %).
    pub buffer_bps: u32,
    /// The largest cap an operator with each role may issue alone, in minor
    /// units of the key's currency; a role not named has no ceiling.
    pub role_ceilings: Vec<(Role, Cents)>,
    /// How long a request waits for a decision.
    pub request_ttl: Duration,
}

impl Default for KeyPolicy {
    fn default() -> Self {
        Self {
            buffer_bps: 1000,
            role_ceilings: Vec::new(),
            request_ttl: Duration::hours(24),
        }
    }
}

impl KeyPolicy {
    /// The most a key expecting `expected` may be capped at alone.
    pub fn buffered(&self, expected: Cents) -> Cents {
        let cap = i128::from(expected.0) * (10_000 + i128::from(self.buffer_bps)) / 10_000;
        Cents(cap.min(i128::from(i64::MAX)) as i64)
    }
}

/// What asking for a key led to. Either way the secret is shown once, now;
/// a waiting key's secret opens nothing until it is approved.
pub enum Outcome {
    Issued { secret: String, key: VaultKeyRow },
    Waiting { secret: String, request: KeyRequest },
}

/// Issues `key` when it is within policy for `actor`, or files it for a
/// different approver.
pub async fn issue_or_request(
    pool: &PgPool,
    policy: &KeyPolicy,
    actor: Actor,
    key: NewVaultKey,
) -> Result<Outcome, AppError> {
    key.validate(Utc::now())?;
    let (ceiling, whose) = match actor {
        Actor::ApiToken { id, .. } => (key_requests::token_ceiling(pool, id).await?, "token's"),
        Actor::Operator { id, .. } => {
            let role = operators::find_by_id(pool, id)
                .await?
                .map(|operator| operator.role);
            let ceiling = policy
                .role_ceilings
                .iter()
                .find(|(r, _)| Some(*r) == role)
                .map(|(_, cents)| *cents);
            (ceiling, "role's")
        }
        Actor::Visitor { .. } | Actor::Cli | Actor::System => (None, ""),
    };
    let currency = key.currency.clone();
    let money = |cents: Cents| format!("{} {currency}", cents.format(&currency));
    let buffered = policy.buffered(key.expected_total);
    let mut beyond = Vec::new();
    if key.cap > buffered {
        beyond.push(format!(
            "the cap {} is above the expected total {} plus the {} % buffer policy ({})",
            money(key.cap),
            money(key.expected_total),
            policy.buffer_bps as f64 / 100.0,
            money(buffered)
        ));
    }
    if let Some(ceiling) = ceiling.filter(|ceiling| key.cap > *ceiling) {
        beyond.push(format!(
            "the cap {} is above this {whose} ceiling of {}",
            money(key.cap),
            money(ceiling)
        ));
    }
    if beyond.is_empty() {
        let (secret, key) = vault_keys::issue(pool, actor, key).await?;
        return Ok(Outcome::Issued { secret, key });
    }

    let over_policy = beyond.join("; ");
    let policy_cap = ceiling.map_or(buffered, |ceiling| buffered.min(ceiling));
    let secret = Secret::generate("vk_");
    let endpoints = key.endpoint_list();
    let expires_at = (Utc::now() + policy.request_ttl).min(key.expires_at);
    let row = key.row(&endpoints, &secret, actor, None);
    let mut tx = pool.begin().await?;
    // A retry (a redelivered message, a double click) files nothing new:
    // approving two would issue two keys.
    if let Some(waiting) = key_requests::waiting_twin(&mut *tx, &row).await? {
        return Err(AppError::Invalid(format!(
            "key request #{waiting} for {} in {} already waits for an approver",
            row.label, row.billing_period
        )));
    }
    let id = key_requests::insert(&mut *tx, &row, &over_policy, policy_cap, expires_at).await?;
    actions::record(
        &mut *tx,
        actor,
        "request_vault_key",
        "key_request",
        Some(id.to_string()),
        json!({ "label": key.label.trim(), "billing_period": key.billing_period.to_string(),
                "currency": key.currency.as_str(), "cap_cents": key.cap.0,
                "policy_cap_cents": policy_cap.0, "over_policy": over_policy,
                "prefix": secret.prefix, "expires_at": expires_at }),
    )
    .await?;
    tx.commit().await?;
    let request = key_requests::find(pool, id)
        .await?
        .ok_or(AppError::NotFound)?;
    Ok(Outcome::Waiting {
        secret: secret.plaintext,
        request,
    })
}

/// Whether `approver` may decide `request` now: it waits for a decision
/// and someone else asked for it.
pub fn decidable(request: &KeyRequest, approver: &Me) -> Result<(), AppError> {
    let id = request.id;
    match request.state {
        RequestState::Pending => {}
        RequestState::Expired => {
            return Err(AppError::Invalid(format!(
                "key request #{id} expired without a decision; ask for the key again if the run still needs it"
            )))
        }
        decided => {
            return Err(AppError::Invalid(format!(
                "key request #{id} was already {} by {}",
                decided.as_str(),
                request.decided_by.as_deref().unwrap_or("another approver"),
            )))
        }
    }
    not_their_own(
        request.requested_by_id,
        approver,
        &format!("key request #{id}"),
    )
}

/// Approves (issuing the key as asked) or rejects a waiting key. One
/// decision wins when approvers act at once (the row is locked); the
/// requester, or the maker of the token that asked, can never decide.
pub async fn decide(
    pool: &PgPool,
    approver: &Me,
    ip: Option<std::net::IpAddr>,
    id: KeyRequestId,
    verdict: Verdict,
    note: &str,
) -> Result<KeyRequest, AppError> {
    let note = decision_note(approver, verdict, note, "the key")?;
    let mut tx = pool.begin().await?;
    let request = key_requests::lock(&mut tx, id)
        .await?
        .ok_or(AppError::NotFound)?;
    decidable(&request, approver)?;
    let key = match verdict {
        Verdict::Approve => Some(key_requests::issue(&mut tx, id).await?),
        Verdict::Reject => None,
    };
    let note = (!note.is_empty()).then_some(note);
    let key_id = key.as_ref().map(|key| key.id);
    key_requests::decide(&mut tx, id, key.is_some(), approver.id, note, key_id)
        .await
        .map_err(|err| decision_refused(err, "key_request"))?;
    let action = match verdict {
        Verdict::Approve => "approve_vault_key",
        Verdict::Reject => "reject_vault_key",
    };
    actions::record(
        &mut *tx,
        Actor::Operator {
            id: approver.id,
            ip,
        },
        action,
        "key_request",
        Some(id.to_string()),
        json!({ "label": request.label, "cap_cents": request.cap_cents,
                "note": note, "vault_key_id": key_id }),
    )
    .await?;
    tx.commit().await?;
    key_requests::find(pool, id)
        .await?
        .ok_or(AppError::NotFound)
}
