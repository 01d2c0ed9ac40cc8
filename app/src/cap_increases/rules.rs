//! Cap increases with a four-eyes rule: the rules shared by the console and
//! the key API. One person (or a billing job's API token) asks with a
//! reason; a different approver decides, once; approval raises the cap or
//! issues a follow-on key in the same transaction.

use chrono::Utc;
use serde_json::json;
use sqlx::PgPool;

use crate::{
    actions::sql::{self as actions, Actor},
    cap_increases::sql::{self as cap_increases, NewRequest},
    keys::{
        rules::{self as vault_keys, NewVaultKey},
        sql::{self as key_rows, VaultKeyRow},
    },
    ssr::CapIncreaseRules,
};
use crate::{
    domain::{
        ApplyAs, CapIncrease, CapIncreaseId, Cents, KeyStatus, Me, OperatorId, RequestState, Role,
        VaultKeyId,
    },
    error::AppError,
};

/// The longest reason or decision note.
pub const MAX_NOTE_CHARS: usize = 2000;

/// What the requester asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The key's new cap in all.
    Cap(Cents),
    /// This much more than the key can move now.
    Additional(Cents),
}

/// A request, as read at the edge.
#[derive(Debug, Clone)]
pub struct Ask {
    pub target: Target,
    pub apply_as: ApplyAs,
    pub reason: String,
    /// `key_page`, `alert:ID`, `call:ID` or `api`.
    pub origin: String,
}

/// The most a key may be raised to: `ceiling_pct` of its expected total.
pub fn ceiling(key: &VaultKeyRow, rules: &CapIncreaseRules) -> Cents {
    Cents(
        (i128::from(key.expected_total_cents.0) * i128::from(rules.ceiling_pct) / 100)
            .min(i128::from(crate::domain::MAX_CENTS)) as i64,
    )
}

/// Files a request; refused (nothing written) for a revoked or expired key,
/// an empty reason, a cap not above the current one or above the ceiling,
/// or while another request for the key waits.
pub async fn request(
    pool: &PgPool,
    rules: &CapIncreaseRules,
    actor: Actor,
    key_id: VaultKeyId,
    ask: Ask,
) -> Result<CapIncrease, AppError> {
    let reason = ask.reason.trim();
    if reason.is_empty() {
        return Err(AppError::Invalid(
            "say why the run needs more (the approver decides on the reason)".into(),
        ));
    }
    if reason.chars().count() > MAX_NOTE_CHARS {
        return Err(AppError::Invalid(format!(
            "the reason is longer than {MAX_NOTE_CHARS} characters"
        )));
    }
    let (requested_by, requested_by_token) = match actor {
        Actor::Operator { id, .. } => (Some(id), None),
        Actor::ApiToken { id, .. } => (None, Some(id)),
        Actor::Visitor { .. } | Actor::Cli | Actor::System => {
            return Err(AppError::Invalid(
                "a cap increase is asked for by a person or an API token".into(),
            ))
        }
    };

    let mut tx = pool.begin().await?;
    let key = key_rows::lock(&mut tx, key_id)
        .await?
        .ok_or(AppError::NotFound)?;
    let now = Utc::now();
    let currency = &key.currency;
    let money = |cents: Cents| format!("{} {currency}", cents.format(currency));
    match key.status(now) {
        KeyStatus::Active => {}
        status => {
            return Err(AppError::Invalid(format!(
                "{} is {}: its cap cannot be raised; issue a new key instead",
                key.label,
                status.as_str()
            )))
        }
    }
    let granted = cap_increases::granted_cents(&mut *tx, key_id).await?;
    let to_cap = match ask.target {
        Target::Cap(cap) => cap,
        Target::Additional(more) => Cents(granted.0.saturating_add(more.0)),
    };
    if to_cap <= granted {
        return Err(AppError::Invalid(format!(
            "the new cap {} must be above the current cap {}",
            money(to_cap),
            money(granted)
        )));
    }
    let ceiling = ceiling(&key, rules);
    if to_cap > ceiling {
        return Err(AppError::Invalid(format!(
            "the new cap {} is above the ceiling of {} ({} % of the expected total {}); a run that much bigger needs a new key with a new expected total",
            money(to_cap),
            money(ceiling),
            rules.ceiling_pct,
            money(key.expected_total_cents)
        )));
    }
    if let Some(waiting) = cap_increases::pending_for_key(&mut *tx, key_id).await? {
        return Err(AppError::Invalid(format!(
            "request #{} ({}) is already waiting for a decision on this key",
            waiting.id,
            waiting.change()
        )));
    }
    let expires_at = (now + rules.request_ttl).min(key.expires_at);
    let id = cap_increases::insert(
        &mut tx,
        &NewRequest {
            key: key_id,
            from_cap_cents: granted,
            to_cap_cents: to_cap,
            apply_as: ask.apply_as,
            reason,
            origin: &ask.origin,
            requested_by,
            requested_by_token,
            expires_at,
        },
    )
    .await?;
    actions::record(
        &mut *tx,
        actor,
        "cap_increase.request",
        "vault_key",
        Some(key_id.to_string()),
        json!({ "request_id": id, "from_cap_cents": granted.0, "to_cap_cents": to_cap.0,
                "apply_as": ask.apply_as.as_str(), "reason": reason, "origin": ask.origin,
                "expires_at": expires_at }),
    )
    .await?;
    tx.commit().await?;
    cap_increases::find(pool, id)
        .await?
        .ok_or(AppError::NotFound)
}

/// An approver's decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Approve,
    Reject,
}

/// A decided request, and the secret of the follow-on key it issued (shown
/// once, to the approver who hands it to the billing job).
#[derive(Debug)]
pub struct Decided {
    pub request: CapIncrease,
    pub follow_on: Option<(String, VaultKeyRow)>,
}

/// Whether `approver` may decide `request` now: it is still pending, and
/// they did not ask for it (four-eyes rule). The confirmation page and the
/// decision both ask.
pub fn decidable(request: &CapIncrease, approver: &Me) -> Result<(), AppError> {
    let id = request.id;
    match request.state {
        RequestState::Pending => {}
        RequestState::Expired => {
            return Err(AppError::Invalid(format!(
                "request #{id} expired at {} UTC without a decision; ask again if the run still needs it",
                request.expires_at.format("%Y-%m-%d %H:%M")
            )))
        }
        decided => {
            return Err(AppError::Invalid(format!(
                "request #{id} was already {} by {} at {} UTC",
                decided.as_str(),
                request.decided_by.as_deref().unwrap_or("another approver"),
                request
                    .decided_at
                    .map(|at| at.format("%Y-%m-%d %H:%M:%S").to_string())
                    .unwrap_or_default()
            )))
        }
    }
    not_their_own(request.requested_by_id, approver, &format!("request #{id}"))
}

/// The four-eyes rule, said before the table's constraint refuses it: whoever
/// asked for `what` (or made the API token that did) never decides it.
pub(crate) fn not_their_own(
    requested_by: Option<OperatorId>,
    approver: &Me,
    what: &str,
) -> Result<(), AppError> {
    if requested_by == Some(approver.id) {
        return Err(AppError::Invalid(format!(
            "you asked for {what} (or made the API token that did), so another approver must decide it (four-eyes rule)"
        )));
    }
    Ok(())
}

/// Approves or rejects a pending request. Exactly one decision wins when
/// approvers act at once: the request row is locked, and the second sees
/// the first's decision. The requester can never decide their own request
/// (refused here with a message, and by the table's constraint whatever
/// the caller).
pub async fn decide(
    pool: &PgPool,
    approver: &Me,
    ip: Option<std::net::IpAddr>,
    id: CapIncreaseId,
    verdict: Verdict,
    note: &str,
) -> Result<Decided, AppError> {
    let note = decision_note(approver, verdict, note, "the increase")?;
    let mut tx = pool.begin().await?;
    let request = cap_increases::lock(&mut tx, id)
        .await?
        .ok_or(AppError::NotFound)?;
    decidable(&request, approver)?;
    let actor = Actor::Operator {
        id: approver.id,
        ip,
    };
    let follow_on = match verdict {
        Verdict::Reject => None,
        Verdict::Approve => apply(&mut tx, actor, &request).await?,
    };
    let note = (!note.is_empty()).then_some(note);
    let follow_on_id = follow_on.as_ref().map(|(_, key)| key.id);
    let decided = cap_increases::decide(
        &mut tx,
        id,
        verdict == Verdict::Approve,
        approver.id,
        note,
        follow_on_id,
    )
    .await
    .map_err(|err| decision_refused(err, "cap_increase"))?;
    if !decided {
        // The row was locked above, so only a bug gets here.
        return Err(AppError::Invalid(format!(
            "request #{id} was already decided"
        )));
    }
    let action = match verdict {
        Verdict::Approve => "cap_increase.approve",
        Verdict::Reject => "cap_increase.reject",
    };
    actions::record(
        &mut *tx,
        actor,
        action,
        "vault_key",
        Some(request.vault_key_id.to_string()),
        json!({ "request_id": id, "from_cap_cents": request.from_cap_cents,
                "to_cap_cents": request.to_cap_cents, "apply_as": request.apply_as,
                "note": note, "follow_on_key_id": follow_on_id }),
    )
    .await?;
    tx.commit().await?;
    let request = cap_increases::find(pool, id)
        .await?
        .ok_or(AppError::NotFound)?;
    Ok(Decided { request, follow_on })
}

/// Checks what every four-eyes decision needs before it is looked at: an
/// approver, a note of bounded length, and a reason to reject `what`.
pub(crate) fn decision_note<'a>(
    approver: &Me,
    verdict: Verdict,
    note: &'a str,
    what: &str,
) -> Result<&'a str, AppError> {
    if !approver.role.allows(Role::Approver) {
        return Err(AppError::Forbidden(Role::Approver));
    }
    let note = note.trim();
    if note.chars().count() > MAX_NOTE_CHARS {
        return Err(AppError::Invalid(format!(
            "the note is longer than {MAX_NOTE_CHARS} characters"
        )));
    }
    if verdict == Verdict::Reject && note.is_empty() {
        return Err(AppError::Invalid(format!(
            "say why {what} is rejected (the requester reads it)"
        )));
    }
    Ok(note)
}

/// Makes an approved increase real, inside the decision's transaction: the
/// key's cap rises by the difference, or a follow-on key for it is issued.
/// Refused if the key can no longer be used or its cap changed since the
/// request was made (the approver would be deciding on stale figures).
async fn apply(
    tx: &mut sqlx::PgConnection,
    actor: Actor,
    request: &CapIncrease,
) -> Result<Option<(String, VaultKeyRow)>, AppError> {
    let key_id = request.vault_key_id;
    let key = key_rows::lock(tx, key_id)
        .await?
        .ok_or(AppError::NotFound)?;
    if key.status(Utc::now()) != KeyStatus::Active {
        return Err(AppError::Invalid(format!(
            "{} is {} now: nothing to raise",
            key.label,
            key.status(Utc::now()).as_str()
        )));
    }
    let granted = cap_increases::granted_cents(&mut *tx, key_id).await?;
    if granted != request.from_cap_cents {
        let currency = request.currency.clone();
        return Err(AppError::Invalid(format!(
            "{}'s cap changed since the request (from {} to {} {currency}); reject this request and ask again",
            key.label,
            request.from_cap_cents.format(&currency),
            granted.format(&currency)
        )));
    }
    let additional = request.additional();
    match request.apply_as {
        ApplyAs::RaiseCap => {
            cap_increases::raise_cap(tx, key_id, additional.0).await?;
            Ok(None)
        }
        ApplyAs::FollowOnKey => {
            let suffix = format!(" (follow-on #{})", request.id);
            let label: String = key.label.chars().take(200 - suffix.len()).collect();
            let follow_on = NewVaultKey {
                label: format!("{label}{suffix}"),
                billing_period: key.billing_period,
                currency: key.currency.clone(),
                expected_total: additional,
                buffer_bps: 0,
                cap: additional,
                allowed_endpoints: key
                    .allowed_endpoints
                    .iter()
                    .map(|e| crate::domain::EndpointPattern::parse(e))
                    .collect::<Result<_, _>>()?,
                expires_at: key.expires_at,
                alert_thresholds_pct: key.alert_thresholds_pct.clone(),
                duplicate_policy: key.duplicate_policy,
                stripe_account: key.stripe_account.clone(),
            };
            vault_keys::issue_in(tx, actor, follow_on, Some(key_id))
                .await
                .map(Some)
        }
    }
}

/// The table's own refusals of a decision on a request (`table` is
/// `cap_increase` or `key_request`, its constraints' prefix), said as the
/// rule they enforce. These fire only when the checks above were bypassed
/// or raced.
pub fn decision_refused(err: sqlx::Error, table: &str) -> AppError {
    let constraint = err
        .as_database_error()
        .and_then(|db| db.constraint())
        .map(str::to_owned);
    let rule = constraint
        .as_deref()
        .and_then(|name| name.strip_prefix(table))
        .and_then(|name| name.strip_prefix('_'));
    match rule {
        Some("four_eyes") => AppError::Invalid(
            "the requester (or the maker of the API token that asked) cannot decide the request (four-eyes rule)".into(),
        ),
        Some("decided_once") => AppError::Invalid("the request was already decided".into()),
        Some("not_expired") => AppError::Invalid("the request has expired".into()),
        Some("decided_by_approver") => AppError::Forbidden(Role::Approver),
        _ => err.into(),
    }
}
