//! The action log in words. Action names are stored as they were recorded
//! (the log is append-only, so old names stay); the console shows each as
//! one phrase, with the thing it touched linked, and its details as named
//! values instead of JSON.

use chrono::{DateTime, Utc};

use crate::domain::{ActionEntry, Cents, Currency};

/// Each recorded action name, what it did (a past-tense phrase read after
/// who did it), and whether the phrase names its subject.
const ACTIONS: &[(&str, &str, Subject)] = &[
    (
        "accept_invitation",
        "Accepted their invitation",
        Subject::Hidden,
    ),
    ("add_operator", "Added operator", Subject::Shown),
    ("alert.acknowledge", "Acknowledged alert", Subject::Shown),
    ("alert.assign", "Assigned alert", Subject::Shown),
    ("alert.snooze", "Snoozed alert", Subject::Shown),
    ("approve_vault_key", "Approved key request", Subject::Shown),
    (
        "bootstrap_admin",
        "Created the first admin",
        Subject::Hidden,
    ),
    (
        "cap_increase.approve",
        "Approved a cap increase for vault key",
        Subject::Shown,
    ),
    (
        "cap_increase.reject",
        "Rejected a cap increase for vault key",
        Subject::Shown,
    ),
    (
        "cap_increase.request",
        "Asked for a cap increase for vault key",
        Subject::Shown,
    ),
    (
        "change_role",
        "Changed the role of operator",
        Subject::Shown,
    ),
    ("create_api_token", "Created API token", Subject::Shown),
    ("create_vault_key", "Created vault key", Subject::Shown),
    ("disable_operator", "Disabled operator", Subject::Shown),
    ("enable_operator", "Enabled operator", Subject::Shown),
    (
        "export_audit_csv",
        "Exported the audit log as CSV",
        Subject::Hidden,
    ),
    (
        "export_findings_csv",
        "Exported the findings of billing period",
        Subject::Shown,
    ),
    (
        "finding.adopt",
        "Adopted into the ledger: finding",
        Subject::Shown,
    ),
    (
        "finding.bulk",
        "Resolved findings in bulk for billing period",
        Subject::Shown,
    ),
    (
        "finding.attribute",
        "Attributed to a vault key: finding",
        Subject::Shown,
    ),
    ("finding.dismiss", "Dismissed finding", Subject::Shown),
    (
        "finding.refund",
        "Refunded in Stripe: finding",
        Subject::Shown,
    ),
    ("load_demo_data", "Loaded the demo data", Subject::Hidden),
    ("reconcile", "Reconciled billing period", Subject::Shown),
    (
        "reconcile.sync",
        "Synced from Stripe: billing period",
        Subject::Shown,
    ),
    (
        "reconcile.sync_failed",
        "Failed to sync from Stripe: billing period",
        Subject::Shown,
    ),
    (
        "refused_api_call",
        "Was refused an API call",
        Subject::Hidden,
    ),
    (
        "refused_console_action",
        "Was refused a console action",
        Subject::Hidden,
    ),
    (
        "period.export_pack",
        "Downloaded the close pack of billing period",
        Subject::Shown,
    ),
    (
        "period.prepare",
        "Prepared the close of billing period",
        Subject::Shown,
    ),
    (
        "period.sign_off",
        "Signed off billing period",
        Subject::Shown,
    ),
    (
        "period.withdraw",
        "Withdrew the close of billing period",
        Subject::Shown,
    ),
    ("reject_vault_key", "Rejected key request", Subject::Shown),
    (
        "request_vault_key",
        "Asked for a key beyond policy: key request",
        Subject::Shown,
    ),
    (
        "reservation.release",
        "Released reservation",
        Subject::Shown,
    ),
    ("reservation.settle", "Settled reservation", Subject::Shown),
    (
        "reset_password",
        "Reset the password of operator",
        Subject::Shown,
    ),
    (
        "fleet_setting.replace",
        "Replaced the fleet's setting",
        Subject::Shown,
    ),
    ("revoke_api_token", "Revoked API token", Subject::Shown),
    ("revoke_vault_key", "Revoked vault key", Subject::Shown),
    (
        "second_factor.disabled",
        "Turned off two-factor sign-in for operator",
        Subject::Shown,
    ),
    (
        "second_factor.enabled",
        "Turned on two-factor sign-in for operator",
        Subject::Shown,
    ),
    ("sign_in", "Signed in", Subject::Hidden),
    (
        "stripe_event.receive",
        "Received from Stripe: event",
        Subject::Shown,
    ),
    (
        "stripe_event.refuse",
        "Refused a webhook call claiming to be Stripe's",
        Subject::Hidden,
    ),
    ("sign_in_failed", "Failed to sign in", Subject::Hidden),
    (
        "vault_key.duplicate_policy",
        "Changed the duplicate policy of vault key",
        Subject::Shown,
    ),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Subject {
    Shown,
    Hidden,
}

/// An action name as the console shows it: `revoke_vault_key` → "Revoked
/// vault key". A name recorded by a newer version reads as its words.
pub fn action_phrase(name: &str) -> String {
    ACTIONS
        .iter()
        .find(|(known, ..)| *known == name)
        .map(|(_, phrase, _)| (*phrase).to_owned())
        .unwrap_or_else(|| capitalised(&name.replace(['_', '.'], " ")))
}

/// What an entry touched, in words, and its page in the console if it has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActionSubject {
    pub words: String,
    pub href: Option<String>,
}

impl ActionEntry {
    /// The thing acted on, unless the phrase already says it.
    pub fn subject(&self) -> Option<ActionSubject> {
        let hidden = ACTIONS
            .iter()
            .any(|(name, _, subject)| *name == self.action && *subject == Subject::Hidden);
        if hidden {
            return None;
        }
        let Some(id) = self.subject_id.as_deref() else {
            return Some(ActionSubject {
                words: self.subject_type.replace('_', " "),
                href: None,
            });
        };
        let href = match self.subject_type.as_str() {
            "vault_key" => Some(format!("/keys/{id}")),
            "finding" => Some(format!("/reconciliation/{id}")),
            "alert" => Some("/alerts".to_owned()),
            "operator" => Some("/operators".to_owned()),
            "api_token" => Some("/tokens".to_owned()),
            // Issued: the key it became; waiting: the Approvals page.
            "key_request" => match self.detail("vault_key_id") {
                Some(key) => Some(format!("/keys/{key}")),
                None if self.action == "request_vault_key" => Some("/approvals".to_owned()),
                None => None,
            },
            "billing_period" if self.action.starts_with("period.") => {
                Some(format!("/periods/{id}"))
            }
            "billing_period" => Some(format!("/reconciliation?period={id}")),
            _ => None,
        };
        // A name beside the id where the entry recorded one.
        let named = |name: &str| self.detail(name).map(|value| format!("“{value}” #{id}"));
        let words = match self.subject_type.as_str() {
            "billing_period" | "fleet_setting" => id.to_owned(),
            "operator" => self
                .detail("email")
                .map_or_else(|| format!("#{id}"), str::to_owned),
            _ => named("label")
                .or_else(|| named("name"))
                .unwrap_or_else(|| format!("#{id}")),
        };
        Some(ActionSubject { words, href })
    }

    fn detail(&self, name: &str) -> Option<&str> {
        let at = self.detail_names.iter().position(|n| n == name)?;
        Some(self.detail_values[at].as_str())
    }

    /// The details as (name, value) in words: amounts in their currency
    /// (the entry's, or its vault key's), times in UTC, yes/no for flags.
    pub fn detail_pairs(&self) -> Vec<(String, String)> {
        let currency = self
            .currency
            .as_deref()
            .and_then(|code| Currency::parse(code).ok());
        self.detail_names
            .iter()
            .zip(&self.detail_values)
            .filter(|(name, _)| name.as_str() != "currency" || currency.is_none())
            .map(|(name, value)| detail(name, value, currency.as_ref()))
            .collect()
    }
}

fn detail(name: &str, value: &str, currency: Option<&Currency>) -> (String, String) {
    if let Some(amount) = name.strip_suffix("_cents") {
        if let (Some(currency), Ok(cents)) = (currency, value.parse::<i64>()) {
            return (
                words(amount),
                format!("{} {currency}", Cents(cents).format(currency)),
            );
        }
        return (format!("{} (minor units)", words(amount)), value.to_owned());
    }
    if let Ok(at) = value.parse::<DateTime<Utc>>() {
        return (words(name), at.format("%Y-%m-%d %H:%M UTC").to_string());
    }
    let value = match value {
        "true" => "yes".to_owned(),
        "false" => "no".to_owned(),
        other => other.to_owned(),
    };
    (words(name), value)
}

fn words(name: &str) -> String {
    capitalised(&name.replace('_', " "))
}

fn capitalised(text: &str) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(action: &str, subject: (&str, Option<&str>), details: &[(&str, &str)]) -> ActionEntry {
        ActionEntry {
            id: 1,
            at: Utc::now(),
            who: "ops@example.com".into(),
            via: "console".into(),
            ip: None,
            action: action.into(),
            subject_type: subject.0.into(),
            subject_id: subject.1.map(Into::into),
            currency: details
                .iter()
                .find(|(n, _)| *n == "currency")
                .map(|(_, v)| (*v).into()),
            detail_names: details.iter().map(|(n, _)| (*n).into()).collect(),
            detail_values: details.iter().map(|(_, v)| (*v).into()).collect(),
        }
    }

    #[test]
    fn every_action_reads_as_a_phrase_and_old_names_keep_reading() {
        assert_eq!(action_phrase("revoke_vault_key"), "Revoked vault key");
        assert_eq!(action_phrase("alert.acknowledge"), "Acknowledged alert");
        assert_eq!(action_phrase("someday.new_thing"), "Someday new thing");
        let names: std::collections::HashSet<_> = ACTIONS.iter().map(|(n, ..)| n).collect();
        assert_eq!(names.len(), ACTIONS.len(), "each name once");
    }

    #[test]
    fn a_subject_links_to_its_page_unless_the_phrase_says_it() {
        let revoked = entry("revoke_vault_key", ("vault_key", Some("12")), &[]);
        assert_eq!(
            revoked.subject(),
            Some(ActionSubject {
                words: "#12".into(),
                href: Some("/keys/12".into())
            })
        );
        let synced = entry("reconcile.sync", ("billing_period", Some("2026-11")), &[]);
        assert_eq!(
            synced.subject().and_then(|s| s.href).as_deref(),
            Some("/reconciliation?period=2026-11")
        );
        let named = entry(
            "create_vault_key",
            ("vault_key", Some("12")),
            &[("label", "November run")],
        );
        assert_eq!(named.subject().unwrap().words, "“November run” #12");
        let added = entry(
            "add_operator",
            ("operator", Some("3")),
            &[("email", "a@example.com")],
        );
        assert_eq!(added.subject().unwrap().words, "a@example.com");
        assert_eq!(
            entry("sign_in", ("operator", Some("3")), &[]).subject(),
            None
        );
        let issued = entry(
            "approve_vault_key",
            ("key_request", Some("4")),
            &[("vault_key_id", "9")],
        );
        assert_eq!(
            issued.subject().and_then(|s| s.href).as_deref(),
            Some("/keys/9")
        );
        let rejected = entry("reject_vault_key", ("key_request", Some("4")), &[]);
        assert_eq!(rejected.subject().and_then(|s| s.href), None);
    }

    #[test]
    fn details_read_as_amounts_times_and_words() {
        let created = entry(
            "create_vault_key",
            ("vault_key", Some("12")),
            &[
                ("cap_cents", "110000"),
                ("currency", "jpy"),
                ("label", "November run"),
                ("expires_at", "2026-12-31T23:59:59+00:00"),
                ("flagged", "true"),
            ],
        );
        assert_eq!(
            created.detail_pairs(),
            vec![
                ("Cap".into(), "110,000 JPY".into()),
                ("Label".into(), "November run".into()),
                ("Expires at".into(), "2026-12-31 23:59 UTC".into()),
                ("Flagged".into(), "yes".into()),
            ]
        );
        let unknown_currency = entry(
            "cap_increase.request",
            ("vault_key", Some("1")),
            &[("to_cap_cents", "500")],
        );
        assert_eq!(
            unknown_currency.detail_pairs(),
            vec![("To cap (minor units)".into(), "500".into())]
        );
    }
}
