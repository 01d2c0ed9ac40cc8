//! Issuing and revoking vault keys: the rules shared by the key API and the
//! console.

use chrono::{DateTime, Utc};
use serde_json::json;
use sqlx::{PgConnection, PgPool};

use super::{
    data::{
        actions::{self, Actor},
        vault_keys::{self, NewKeyRow, VaultKeyRow},
    },
    secrets::Secret,
};
use crate::{
    domain::{
        group_thousands, BillingPeriod, Cents, Currency, DuplicatePolicy, EndpointPattern,
        FieldErrors, KeyDraft, Suggestion, MAX_CENTS,
    },
    error::AppError,
};

/// A key to issue, validated.
#[derive(Debug, Clone)]
pub struct NewVaultKey {
    pub label: String,
    pub billing_period: BillingPeriod,
    pub currency: Currency,
    pub expected_total: Cents,
    pub buffer_bps: u32,
    pub cap: Cents,
    pub allowed_endpoints: Vec<EndpointPattern>,
    pub expires_at: DateTime<Utc>,
    /// Utilization percentages that raise an alert, each 1 to 100.
    pub alert_thresholds_pct: Vec<i16>,
    pub duplicate_policy: DuplicatePolicy,
    /// The connected account the key is for (`acct_…`), if any.
    pub stripe_account: Option<String>,
}

impl NewVaultKey {
    /// The allowed endpoints as stored: sorted, without repeats.
    pub fn endpoint_list(&self) -> Vec<String> {
        let mut endpoints: Vec<String> = self
            .allowed_endpoints
            .iter()
            .map(ToString::to_string)
            .collect();
        endpoints.sort();
        endpoints.dedup();
        endpoints
    }

    /// The row that stores this key with `secret`, made by `actor`.
    pub fn row<'a>(
        &'a self,
        endpoints: &'a [String],
        secret: &'a Secret,
        actor: Actor,
        parent: Option<i64>,
    ) -> NewKeyRow<'a> {
        let (created_by, created_by_token) = match actor {
            Actor::Operator { id, .. } => (Some(id), None),
            Actor::ApiToken { id, .. } => (None, Some(id)),
            Actor::Visitor { .. } | Actor::Cli | Actor::System => (None, None),
        };
        NewKeyRow {
            secret_hash: &secret.hash,
            secret_prefix: &secret.prefix,
            label: self.label.trim(),
            billing_period: self.billing_period.to_string(),
            currency: self.currency.as_str(),
            expected_total_cents: self.expected_total.0,
            buffer_bps: self.buffer_bps as i32,
            cap_cents: self.cap.0,
            allowed_endpoints: endpoints,
            expires_at: self.expires_at,
            alert_thresholds_pct: &self.alert_thresholds_pct,
            duplicate_policy: self.duplicate_policy.as_str(),
            stripe_account: self.stripe_account.as_deref(),
            created_by,
            created_by_token,
            parent_key_id: parent,
        }
    }
}

/// The alert threshold a key gets unless told otherwise.
pub const DEFAULT_THRESHOLDS_PCT: [i16; 1] = [90];

impl NewVaultKey {
    /// Checks what the parts cannot check alone.
    pub fn validate(&self, now: DateTime<Utc>) -> Result<(), AppError> {
        let label_len = self.label.trim().chars().count();
        if label_len == 0 || label_len > 200 {
            return Err(AppError::Invalid(
                "label must have between 1 and 200 characters".into(),
            ));
        }
        if self.expires_at <= now {
            return Err(AppError::Invalid(format!(
                "expires_at {} is not in the future",
                self.expires_at.to_rfc3339()
            )));
        }
        if self.allowed_endpoints.is_empty() {
            return Err(AppError::Invalid(
                "allowed_endpoints must name at least one endpoint".into(),
            ));
        }
        if self.cap.0 <= 0 {
            return Err(AppError::Invalid("the cap must be positive".into()));
        }
        if self.alert_thresholds_pct.is_empty()
            || self
                .alert_thresholds_pct
                .iter()
                .any(|t| !(1..=100).contains(t))
        {
            return Err(AppError::Invalid(
                "alert thresholds must be percentages from 1 to 100".into(),
            ));
        }
        Ok(())
    }
}

/// Issues a key; returns the secret (to show once) and the stored row.
pub async fn issue(
    pool: &PgPool,
    actor: Actor,
    key: NewVaultKey,
) -> Result<(String, VaultKeyRow), AppError> {
    let mut tx = pool.begin().await?;
    let issued = issue_in(&mut tx, actor, key, None).await?;
    tx.commit().await?;
    Ok(issued)
}

/// [`issue`] inside the caller's transaction; `parent` is the key a
/// follow-on key extends.
pub async fn issue_in(
    tx: &mut PgConnection,
    actor: Actor,
    key: NewVaultKey,
    parent: Option<i64>,
) -> Result<(String, VaultKeyRow), AppError> {
    key.validate(Utc::now())?;
    let secret = Secret::generate("vk_");
    let endpoints = key.endpoint_list();
    let row = vault_keys::insert(&mut *tx, &key.row(&endpoints, &secret, actor, parent)).await?;
    actions::record(
        &mut *tx,
        actor,
        "create_vault_key",
        "vault_key",
        Some(row.id.to_string()),
        json!({ "label": row.label, "billing_period": row.billing_period, "cap_cents": row.cap_cents,
                "currency": row.currency, "prefix": row.secret_prefix, "parent_key_id": parent }),
    )
    .await?;
    Ok((secret.plaintext, row))
}

/// Revokes a key at once: the proxy refuses it from the next call.
pub async fn revoke(
    pool: &PgPool,
    actor: Actor,
    id: i64,
    reason: &str,
) -> Result<VaultKeyRow, AppError> {
    let reason = reason.trim();
    if reason.is_empty() {
        return Err(AppError::Invalid("say why the key is revoked".into()));
    }
    let revoked_by = match actor {
        Actor::Operator { id, .. } => Some(id),
        _ => None,
    };
    let mut tx = pool.begin().await?;
    let Some(row) = vault_keys::revoke(&mut *tx, id, reason, revoked_by).await? else {
        return match vault_keys::find(&mut *tx, id).await? {
            Some(_) => Err(AppError::Invalid(format!("key {id} is already revoked"))),
            None => Err(AppError::NotFound),
        };
    };
    actions::record(
        &mut *tx,
        actor,
        "revoke_vault_key",
        "vault_key",
        Some(id.to_string()),
        json!({ "label": row.label, "reason": reason }),
    )
    .await?;
    tx.commit().await?;
    Ok(row)
}

/// Sets what the proxy does with a key's duplicate charges, from its next
/// call on (the proxy reads the policy where it reserves, never cached).
pub async fn set_duplicate_policy(
    pool: &PgPool,
    actor: Actor,
    id: i64,
    policy: DuplicatePolicy,
) -> Result<VaultKeyRow, AppError> {
    let mut tx = pool.begin().await?;
    let before = vault_keys::find(&mut *tx, id)
        .await?
        .ok_or(AppError::NotFound)?;
    if before.revoked_at.is_some() {
        return Err(AppError::Invalid(format!(
            "key {id} is revoked: its duplicate guard no longer matters"
        )));
    }
    let row = vault_keys::set_duplicate_policy(&mut *tx, id, policy.as_str())
        .await?
        .ok_or(AppError::NotFound)?;
    actions::record(
        &mut *tx,
        actor,
        "vault_key.duplicate_policy",
        "vault_key",
        Some(id.to_string()),
        json!({ "label": row.label, "from": before.duplicate_policy, "to": policy.as_str() }),
    )
    .await?;
    tx.commit().await?;
    Ok(row)
}

/// Reads the console's new-key form, reporting every field's problem at
/// once (field name, message).
pub fn parse_draft(draft: &KeyDraft, now: DateTime<Utc>) -> Result<NewVaultKey, FieldErrors> {
    let mut errors = FieldErrors::new();
    let mut check = |field: &str, result: Result<(), String>| {
        if let Err(message) = result {
            errors.push((field.to_owned(), message));
        }
    };

    let period = draft
        .period
        .trim()
        .parse::<BillingPeriod>()
        .map_err(|e| e.0);
    check("period", period.clone().map(drop));
    let currency = Currency::parse(&draft.currency).map_err(|e| e.0);
    check("currency", currency.clone().map(drop));
    let buffer_bps = draft.buffer_bps();
    check("buffer_pct", buffer_bps.clone().map(drop));
    let amounts = currency.as_ref().ok().map(|currency| {
        let expected = Cents::parse_amount(&draft.expected_total, currency).map_err(|e| e.0)?;
        let cap = expected
            .with_buffer(*buffer_bps.as_ref().unwrap_or(&0))
            .map_err(|e| e.0)?;
        Ok::<_, String>((expected, cap))
    });
    if let Some(amounts) = &amounts {
        check("expected_total", amounts.clone().map(drop));
    }

    let mut endpoints = Vec::new();
    for raw in draft
        .endpoints
        .iter()
        .map(String::as_str)
        .chain(draft.custom_endpoints.lines())
        .map(str::trim)
        .filter(|line| !line.is_empty())
    {
        match EndpointPattern::parse(raw) {
            Ok(pattern) => endpoints.push(pattern),
            Err(err) => check("custom_endpoints", Err(err.0)),
        }
    }
    if endpoints.is_empty() {
        check("endpoints", Err("choose at least one endpoint".into()));
    }

    let expires_at =
        chrono::NaiveDateTime::parse_from_str(draft.expires_at.trim(), "%Y-%m-%dT%H:%M")
            .map(|at| at.and_utc())
            .map_err(|_| {
                format!(
                    "{:?} is not a date and time (YYYY-MM-DD HH:MM, UTC)",
                    draft.expires_at.trim()
                )
            })
            .and_then(|at| {
                if at <= now {
                    Err("the expiry must be in the future".into())
                } else if at > now + chrono::Duration::days(366) {
                    Err("the expiry must be within a year".into())
                } else {
                    Ok(at)
                }
            });
    check("expires_at", expires_at.clone().map(drop));

    let label = draft.label.trim().to_owned();
    let label_len = label.chars().count();
    check(
        "label",
        if label_len == 0 || label_len > 200 {
            Err("the label needs 1 to 200 characters".into())
        } else {
            Ok(())
        },
    );

    let thresholds = parse_thresholds(&draft.thresholds);
    check("thresholds", thresholds.clone().map(drop));

    // An old form without the field gets the default.
    let duplicate_policy = match draft.duplicate_policy.trim() {
        "" => Ok(DuplicatePolicy::default()),
        raw => DuplicatePolicy::parse(raw).map_err(|err| err.0),
    };
    check("duplicate_policy", duplicate_policy.clone().map(drop));

    match (
        period,
        currency,
        buffer_bps,
        amounts,
        expires_at,
        thresholds,
        duplicate_policy,
    ) {
        (
            Ok(billing_period),
            Ok(currency),
            Ok(buffer_bps),
            Some(Ok((expected_total, cap))),
            Ok(expires_at),
            Ok(alert_thresholds_pct),
            Ok(duplicate_policy),
        ) if errors.is_empty() => Ok(NewVaultKey {
            label,
            billing_period,
            currency,
            expected_total,
            buffer_bps,
            cap,
            allowed_endpoints: endpoints,
            expires_at,
            alert_thresholds_pct,
            duplicate_policy,
            stripe_account: None,
        }),
        _ => Err(errors),
    }
}

/// `75, 90` → [75, 90]: percentages from 1 to 100, each once.
fn parse_thresholds(raw: &str) -> Result<Vec<i16>, String> {
    let mut thresholds = Vec::new();
    for part in raw.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let pct: i16 = part
            .trim_end_matches('%')
            .trim()
            .parse()
            .ok()
            .filter(|pct| (1..=100).contains(pct))
            .ok_or_else(|| format!("{part:?} is not a percentage from 1 to 100"))?;
        if thresholds.contains(&pct) {
            return Err(format!("{pct} % is given twice"));
        }
        thresholds.push(pct);
    }
    if thresholds.is_empty() {
        return Err("give at least one threshold, such as 90".into());
    }
    thresholds.sort_unstable();
    Ok(thresholds)
}

/// The expected total of an uploaded CSV of `customer,amount` rows (a header
/// row is allowed): every customer once, every amount positive and in the
/// currency's decimals. The message names the first bad line.
pub fn suggestion_from_csv(
    file_name: &str,
    bytes: &[u8],
    currency: &Currency,
) -> Result<Suggestion, String> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .trim(csv::Trim::All)
        .from_reader(bytes);
    let mut customers = std::collections::HashSet::new();
    let mut total = 0i64;
    for (index, record) in reader.records().enumerate() {
        let line = index + 1;
        let record = record.map_err(|err| format!("line {line} cannot be read: {err}"))?;
        if record.iter().all(str::is_empty) {
            continue;
        }
        let [customer, amount] = [record.get(0), record.get(1)];
        let (Some(customer), Some(amount), 2) = (customer, amount, record.len()) else {
            return Err(format!(
                "line {line} has {} columns; each row is customer, amount",
                record.len()
            ));
        };
        let cents = match Cents::parse_amount(amount, currency) {
            Ok(cents) => cents,
            // A header row: its amount column is a name, not a number.
            Err(_) if line == 1 && !amount.bytes().any(|b| b.is_ascii_digit()) => continue,
            Err(err) => return Err(format!("line {line}: {err}")),
        };
        if customer.is_empty() {
            return Err(format!("line {line} names no customer"));
        }
        if !customers.insert(customer.to_owned()) {
            return Err(format!(
                "line {line}: customer {customer:?} is listed twice"
            ));
        }
        total = total
            .checked_add(cents.0)
            .filter(|total| *total <= MAX_CENTS)
            .ok_or_else(|| format!("the total passes the largest expected total at line {line}"))?;
    }
    if customers.is_empty() {
        return Err("the file has no customer rows".into());
    }
    let count = group_thousands(customers.len() as u64);
    Ok(Suggestion {
        expected: Cents(total),
        currency: currency.clone(),
        source: format!("uploaded file {file_name}: {count} customers"),
    })
}

#[cfg(test)]
mod csv_tests {
    use super::*;

    fn suggest(text: &str) -> Result<Suggestion, String> {
        suggestion_from_csv("run.csv", text.as_bytes(), &Currency::usd())
    }

    #[test]
    fn a_csv_of_customers_and_amounts_sums_to_the_expected_total() {
        let s =
            suggest("customer,amount\ncust_1,49.00\n\"cust,2\", 1250.5\ncust_3,0.99\n").unwrap();
        assert_eq!(s.expected, Cents(130_049));
        assert_eq!(s.source, "uploaded file run.csv: 3 customers");
        // Without a header too.
        assert_eq!(suggest("cust_1,10").unwrap().expected, Cents(1_000));
    }

    #[test]
    fn a_bad_csv_names_the_line_to_fix() {
        for (text, message) in [
            ("", "no customer rows"),
            ("customer,amount\n", "no customer rows"),
            ("cust_1,10\ncust_2,ten", "line 2"),
            ("cust_1,10\ncust_1,20", "listed twice"),
            ("cust_1,10.001", "line 1"),
            ("cust_1,10\ncust_2,-5", "line 2"),
            ("cust_1,10,extra", "3 columns"),
            ("cust_1", "1 columns"),
            (",10\n", "names no customer"),
            ("a,999999999999\nb,999999999999", "passes the largest"),
        ] {
            let err = suggest(text).unwrap_err();
            assert!(err.contains(message), "{text:?}: {err}");
        }
    }
}
