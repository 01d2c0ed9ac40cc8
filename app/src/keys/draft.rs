use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::domain::{BillingPeriod, Cents, Currency};

/// The endpoints a new key allows unless the operator changes them: what
/// billing jobs call to charge.
pub const DEFAULT_ENDPOINTS: [&str; 3] = [
    "POST /v1/charges",
    "POST /v1/payment_intents",
    "POST /v1/payment_intents/{id}/confirm",
];

/// The new-key form as the operator typed it, kept across a submission
/// that was refused so nothing has to be typed twice.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyDraft {
    /// `YYYY-MM`.
    pub period: String,
    pub currency: String,
    /// In the currency's major unit, as typed (`5,000.00`).
    pub expected_total: String,
    /// Percent, as typed.
    pub buffer_pct: String,
    /// Ticked endpoint patterns.
    pub endpoints: Vec<String>,
    /// More patterns, one per line.
    pub custom_endpoints: String,
    /// `YYYY-MM-DDTHH:MM`, UTC.
    pub expires_at: String,
    pub label: String,
    /// Percentages separated by commas.
    pub thresholds: String,
    /// `flag`, `block` or `off` (see [`crate::domain::DuplicatePolicy`]).
    pub duplicate_policy: String,
}

impl KeyDraft {
    /// A fresh form for the billing period containing `now`.
    pub fn for_period(period: BillingPeriod) -> Self {
        Self {
            period: period.to_string(),
            currency: "usd".into(),
            expected_total: String::new(),
            buffer_pct: "10".into(),
            endpoints: DEFAULT_ENDPOINTS.map(String::from).to_vec(),
            custom_endpoints: String::new(),
            // The period's last minute: ends_at is the first instant after it.
            expires_at: Self::expiry_text(period.ends_at() - chrono::Duration::minutes(1)),
            label: format!("billing-run-{period}"),
            thresholds: "90".into(),
            duplicate_policy: crate::domain::DuplicatePolicy::default().as_str().into(),
        }
    }

    pub fn expiry_text(at: DateTime<Utc>) -> String {
        at.format("%Y-%m-%dT%H:%M").to_string()
    }

    /// The form read from its fields, as a browser posts them.
    pub fn from_fields<'a>(fields: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        let mut draft = Self::default();
        for (name, value) in fields {
            let value = value.to_owned();
            match name {
                "period" => draft.period = value,
                "currency" => draft.currency = value,
                "expected_total" => draft.expected_total = value,
                "buffer_pct" => draft.buffer_pct = value,
                "endpoint" => draft.endpoints.push(value),
                "custom_endpoints" => draft.custom_endpoints = value,
                "expires_at" => draft.expires_at = value,
                "label" => draft.label = value,
                "thresholds" => draft.thresholds = value,
                "duplicate_policy" => draft.duplicate_policy = value,
                _ => {}
            }
        }
        draft
    }

    /// The buffer in basis points (`10` → 1000, `12.5` → 1250), 0 to 100 %.
    pub fn buffer_bps(&self) -> Result<u32, String> {
        let text = self.buffer_pct.trim().trim_end_matches('%').trim();
        let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
        let valid = !whole.is_empty()
            && whole.bytes().all(|b| b.is_ascii_digit())
            && fraction.len() <= 2
            && fraction.bytes().all(|b| b.is_ascii_digit());
        let bps = valid
            .then(|| format!("{whole}{fraction:0<2}").parse::<u32>().ok())
            .flatten();
        match bps {
            Some(bps) if bps <= 10_000 => Ok(bps),
            _ => Err(format!(
                "{:?} is not a buffer from 0 to 100 % (at most two decimals)",
                self.buffer_pct.trim()
            )),
        }
    }

    /// The currency, expected total and cap, or why there is no cap yet
    /// (the first field that is not right): what the live preview shows.
    pub fn preview(&self) -> Result<(Currency, Cents, Cents), String> {
        let currency =
            Currency::parse(&self.currency).map_err(|err| format!("currency: {}", err.0))?;
        let expected = Cents::parse_amount(&self.expected_total, &currency)
            .map_err(|err| format!("expected total: {}", err.0))?;
        let cap = expected
            .with_buffer(self.buffer_bps().map_err(|err| format!("buffer: {err}"))?)
            .map_err(|err| format!("cap: {}", err.0))?;
        Ok((currency, expected, cap))
    }
}

/// A field's message: (field name, message).
pub type FieldErrors = Vec<(String, String)>;

/// The message for `field` among `errors`, if it has one.
pub fn field_error(errors: &FieldErrors, field: &str) -> Option<String> {
    errors
        .iter()
        .find(|(name, _)| name == field)
        .map(|(_, message)| message.clone())
}

/// An expected total suggested from what was billed before.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Suggestion {
    pub expected: Cents,
    pub currency: Currency,
    /// Where it comes from, for the operator to judge.
    pub source: String,
}

/// What the new-key page shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyForm {
    pub draft: KeyDraft,
    pub errors: FieldErrors,
    pub suggestion: Option<Suggestion>,
    /// Live keys already carrying the draft's label: (id, billing period).
    pub label_in_use: Vec<(i64, String)>,
    /// The form came back from "Check" rather than a refused submission.
    pub checked: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_buffer_is_a_percentage_with_at_most_two_decimals() {
        let draft = |pct: &str| KeyDraft {
            buffer_pct: pct.into(),
            ..KeyDraft::default()
        };
        assert_eq!(draft("10").buffer_bps(), Ok(1000));
        assert_eq!(draft("12.5 %").buffer_bps(), Ok(1250));
        assert_eq!(draft("0").buffer_bps(), Ok(0));
        assert_eq!(draft("100").buffer_bps(), Ok(10_000));
        for bad in ["", "-1", "100.01", "abc", "1.234", "1e2"] {
            assert!(draft(bad).buffer_bps().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_preview_is_the_expected_total_plus_the_buffer_rounded_down() {
        let draft = KeyDraft {
            currency: "usd".into(),
            expected_total: "5,000.00".into(),
            buffer_pct: "10".into(),
            ..KeyDraft::default()
        };
        let (_, expected, cap) = draft.preview().unwrap();
        assert_eq!((expected, cap), (Cents(500_000), Cents(550_000)));
    }

    #[test]
    fn a_preview_without_a_cap_says_which_field_is_not_right() {
        let draft = |expected: &str, currency: &str| KeyDraft {
            currency: currency.into(),
            expected_total: expected.into(),
            buffer_pct: "10".into(),
            ..KeyDraft::default()
        };
        let why = draft("1.005", "usd").preview().unwrap_err();
        assert!(why.starts_with("expected total: "), "{why}");
        assert!(why.contains("decimal"), "{why}");
        let why = draft("100", "dollars").preview().unwrap_err();
        assert!(why.starts_with("currency: "), "{why}");
    }
}
