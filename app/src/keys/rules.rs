//! Issuing and revoking vault keys: the rules shared by the key API and the
//! console.

use chrono::{DateTime, Utc};
use serde_json::json;
use sqlx::{PgConnection, PgPool};

use crate::{
    actions::sql::{self as actions, Actor},
    keys::sql::{self as vault_keys, NewKeyRow, VaultKeyRow},
    ssr::secrets::Secret,
};
use crate::{
    domain::{
        group_thousands, BillingPeriod, Cents, Currency, DuplicatePolicy, EndpointPattern,
        FieldErrors, KeyDraft, ParseError, Suggestion, VaultKeyId, MAX_CENTS,
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
        parent: Option<VaultKeyId>,
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
            billing_period: self.billing_period,
            currency: &self.currency,
            expected_total_cents: self.expected_total,
            buffer_bps: self.buffer_bps as i32,
            cap_cents: self.cap,
            allowed_endpoints: endpoints,
            expires_at: self.expires_at,
            alert_thresholds_pct: &self.alert_thresholds_pct,
            duplicate_policy: self.duplicate_policy,
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
    /// Holds the key to the rules, whoever built it: the first problem.
    pub fn validate(&self, now: DateTime<Utc>) -> Result<(), AppError> {
        let problem = [
            field::label(&self.label).err(),
            field::expiry(self.expires_at, now).err(),
            field::endpoints(&self.allowed_endpoints).err(),
            field::buffer(self.buffer_bps).err(),
            field::cap(self.cap).err(),
            field::thresholds(&self.alert_thresholds_pct).err(),
            field::stripe_account(self.stripe_account.as_deref()).err(),
        ]
        .into_iter()
        .flatten()
        .next();
        problem.map_or(Ok(()), |message| Err(AppError::Invalid(message)))
    }
}

/// A new key's fields as one way in (the key API's JSON, the console's
/// form) has read them: each decoded, or why not. [`KeyFields::check`]
/// applies the one set of rules to them, whichever way they came.
#[derive(Debug)]
pub struct KeyFields {
    pub label: String,
    pub billing_period: Result<BillingPeriod, String>,
    pub currency: Result<Currency, String>,
    pub expected_total: Result<Cents, String>,
    pub buffer_bps: Result<u32, String>,
    /// A cap given outright; none: the expected total plus the buffer.
    pub cap: Option<Cents>,
    /// Each endpoint given, read as a pattern or not.
    pub endpoints: Vec<Result<EndpointPattern, String>>,
    pub expires_at: Result<DateTime<Utc>, String>,
    pub thresholds: Result<Vec<i16>, String>,
    pub duplicate_policy: Result<DuplicatePolicy, String>,
    pub stripe_account: Option<String>,
}

impl KeyFields {
    /// The key, or every field's problem at once, named as the console's
    /// form names its fields.
    pub fn check(self, now: DateTime<Utc>) -> Result<NewVaultKey, FieldErrors> {
        let mut errors = FieldErrors::new();
        let mut take = |field: &str, result: Result<(), String>| {
            if let Err(message) = result {
                errors.push((field.to_owned(), message));
            }
        };
        take("period", fault(&self.billing_period));
        take("currency", fault(&self.currency));
        let buffer_bps = self
            .buffer_bps
            .and_then(|bps| field::buffer(bps).map(|()| bps));
        take("buffer_pct", fault(&buffer_bps));
        // An amount is read in its currency: without one, only the currency
        // is said to be wrong.
        let currency_known = self.currency.is_ok();
        let amounts = self.expected_total.and_then(|expected| {
            let cap = match self.cap {
                Some(cap) => cap,
                // A buffer that is not right is said on its own field.
                None => expected
                    .with_buffer(*buffer_bps.as_ref().unwrap_or(&0))
                    .map_err(|err| err.0)?,
            };
            field::cap(cap)?;
            Ok((expected, cap))
        });
        if currency_known {
            take("expected_total", fault(&amounts));
        }

        let mut endpoints = Vec::new();
        for endpoint in self.endpoints {
            match endpoint {
                Ok(pattern) => endpoints.push(pattern),
                Err(message) => take("custom_endpoints", Err(message)),
            }
        }
        take("endpoints", field::endpoints(&endpoints));
        let expires_at = self
            .expires_at
            .and_then(|at| field::expiry(at, now).map(|()| at));
        take("expires_at", fault(&expires_at));
        take("label", field::label(&self.label));
        let thresholds = self
            .thresholds
            .and_then(|pcts| field::thresholds(&pcts).map(|()| pcts));
        take("thresholds", fault(&thresholds));
        take("duplicate_policy", fault(&self.duplicate_policy));
        take(
            "stripe_account",
            field::stripe_account(self.stripe_account.as_deref()),
        );

        match (
            self.billing_period,
            self.currency,
            buffer_bps,
            amounts,
            expires_at,
            thresholds,
            self.duplicate_policy,
        ) {
            (
                Ok(billing_period),
                Ok(currency),
                Ok(buffer_bps),
                Ok((expected_total, cap)),
                Ok(expires_at),
                Ok(alert_thresholds_pct),
                Ok(duplicate_policy),
            ) if errors.is_empty() => Ok(NewVaultKey {
                label: self.label.trim().to_owned(),
                billing_period,
                currency,
                expected_total,
                buffer_bps,
                cap,
                allowed_endpoints: endpoints,
                expires_at,
                alert_thresholds_pct,
                duplicate_policy,
                stripe_account: self.stripe_account,
            }),
            _ => Err(errors),
        }
    }
}

/// A field's problem, if any, leaving the field's value where it is.
fn fault<T>(field: &Result<T, String>) -> Result<(), String> {
    field.as_ref().map(drop).map_err(Clone::clone)
}

/// The rules a new key is held to, each about one field.
mod field {
    use chrono::{DateTime, Duration, Utc};

    use crate::domain::{Cents, EndpointPattern, MAX_CENTS};

    pub fn label(label: &str) -> Result<(), String> {
        match label.trim().chars().count() {
            1..=200 => Ok(()),
            _ => Err("the label must have 1 to 200 characters".into()),
        }
    }

    /// In the future, and within a year: a key outliving its billing run
    /// by years is a key nobody remembers to revoke.
    pub fn expiry(at: DateTime<Utc>, now: DateTime<Utc>) -> Result<(), String> {
        if at <= now {
            Err(format!(
                "expires_at {} is not in the future: the expiry must be in the future",
                at.to_rfc3339()
            ))
        } else if at > now + Duration::days(366) {
            Err(format!(
                "expires_at {} is more than a year away: the expiry must be within a year",
                at.to_rfc3339()
            ))
        } else {
            Ok(())
        }
    }

    pub fn endpoints(endpoints: &[EndpointPattern]) -> Result<(), String> {
        if endpoints.is_empty() {
            return Err("choose at least one endpoint".into());
        }
        Ok(())
    }

    /// 0 to 100 % over the expected total.
    pub fn buffer(bps: u32) -> Result<(), String> {
        if bps > 10_000 {
            return Err(format!(
                "a buffer of {} % is not one from 0 to 100 %",
                f64::from(bps) / 100.0
            ));
        }
        Ok(())
    }

    pub fn cap(cap: Cents) -> Result<(), String> {
        if cap.0 <= 0 {
            return Err("the cap works out to zero: a key must be able to move some money".into());
        }
        if cap.0 > MAX_CENTS {
            return Err(format!("the cap of {} cents is out of range", cap.0));
        }
        Ok(())
    }

    pub fn thresholds(pcts: &[i16]) -> Result<(), String> {
        if pcts.is_empty() || pcts.iter().any(|pct| !(1..=100).contains(pct)) {
            return Err("alert thresholds must be percentages from 1 to 100".into());
        }
        Ok(())
    }

    /// `acct_` and 1 to 250 letters or digits, as Stripe's account ids are.
    pub fn stripe_account(account: Option<&str>) -> Result<(), String> {
        let Some(account) = account else {
            return Ok(());
        };
        let plain = account.strip_prefix("acct_").is_some_and(|rest| {
            (1..=250).contains(&rest.len()) && rest.bytes().all(|b| b.is_ascii_alphanumeric())
        });
        if !plain {
            return Err(format!(
                "stripe_account {account:?} is not a connected account id (acct_ and letters or digits)"
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
    parent: Option<VaultKeyId>,
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
    id: VaultKeyId,
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
    id: VaultKeyId,
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
    let currency = Currency::parse(&draft.currency).map_err(|e| e.0);
    let expected_total = match &currency {
        Ok(currency) => Cents::parse_amount(&draft.expected_total, currency).map_err(|e| e.0),
        Err(_) => Err("no currency to read it in".into()),
    };
    let expires_at =
        chrono::NaiveDateTime::parse_from_str(draft.expires_at.trim(), "%Y-%m-%dT%H:%M")
            .map(|at| at.and_utc())
            .map_err(|_| {
                format!(
                    "{:?} is not a date and time (YYYY-MM-DD HH:MM, UTC)",
                    draft.expires_at.trim()
                )
            });
    let endpoints = draft
        .endpoints
        .iter()
        .map(String::as_str)
        .chain(draft.custom_endpoints.lines())
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .map(|raw| EndpointPattern::parse(raw).map_err(|err| err.0))
        .collect();
    let fields = KeyFields {
        label: draft.label.clone(),
        billing_period: draft.period.trim().parse().map_err(|e: ParseError| e.0),
        currency,
        expected_total,
        buffer_bps: draft.buffer_bps(),
        cap: None,
        endpoints,
        expires_at,
        thresholds: parse_thresholds(&draft.thresholds),
        // An old form without the field gets the default.
        duplicate_policy: match draft.duplicate_policy.trim() {
            "" => Ok(DuplicatePolicy::default()),
            raw => DuplicatePolicy::parse(raw).map_err(|err| err.0),
        },
        stripe_account: None,
    };
    fields.check(now)
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
