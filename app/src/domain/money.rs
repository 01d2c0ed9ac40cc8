use std::fmt;

use serde::{Deserialize, Serialize};

use super::ParseError;

/// An amount of money in the currency's minor unit (cents for USD). Money is
/// never a float anywhere in Vaultcap.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub struct Cents(pub i64);

/// An ISO 4217 currency code, lower-case as Stripe writes it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Currency(String);

/// Stripe's zero-decimal currencies: their minor unit is the whole unit.
pub const ZERO_DECIMAL: [&str; 16] = [
    "bif", "clp", "djf", "gnf", "jpy", "kmf", "krw", "mga", "pyg", "rwf", "ugx", "vnd", "vuv",
    "xaf", "xof", "xpf",
];

impl Currency {
    pub fn parse(raw: &str) -> Result<Self, ParseError> {
        let code = raw.trim().to_ascii_lowercase();
        if code.len() == 3 && code.bytes().all(|b| b.is_ascii_lowercase()) {
            Ok(Self(code))
        } else {
            Err(ParseError::new(format!(
                "{:?} is not a currency code: use three letters such as usd or eur",
                raw.trim()
            )))
        }
    }

    /// A code as stored (lower-case, three letters), nothing trimmed or
    /// folded: what the database holds must already be one.
    pub fn parse_stored(raw: &str) -> Result<Self, ParseError> {
        match Self::parse(raw) {
            Ok(currency) if currency.0 == raw => Ok(currency),
            _ => Err(ParseError::new(format!(
                "{raw:?} is not a stored currency code (three lower-case letters)"
            ))),
        }
    }

    pub fn usd() -> Self {
        Self("usd".into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// How many digits follow the decimal point when the amount is shown.
    pub fn exponent(&self) -> u32 {
        if ZERO_DECIMAL.contains(&self.0.as_str()) {
            0
        } else {
            2
        }
    }
}

impl fmt::Display for Currency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.to_ascii_uppercase())
    }
}

impl Cents {
    /// `1234567` in USD → `"12,345.67"`: grouped thousands, the currency's
    /// decimals, no currency sign (the code is shown beside it).
    pub fn format(self, currency: &Currency) -> String {
        let exponent = currency.exponent();
        let divisor = 10u64.pow(exponent);
        let magnitude = self.0.unsigned_abs();
        let (whole, fraction) = (magnitude / divisor, magnitude % divisor);
        let grouped = group_thousands(whole);
        let sign = if self.0 < 0 { "-" } else { "" };
        if exponent == 0 {
            format!("{sign}{grouped}")
        } else {
            format!(
                "{sign}{grouped}.{fraction:0width$}",
                width = exponent as usize
            )
        }
    }

    /// `1234.50`: the amount in the currency's major unit without grouping,
    /// as files for machines want it.
    pub fn decimal(self, currency: &Currency) -> String {
        let exponent = currency.exponent();
        let divisor = 10u64.pow(exponent);
        let magnitude = self.0.unsigned_abs();
        let sign = if self.0 < 0 { "-" } else { "" };
        let whole = magnitude / divisor;
        match exponent {
            0 => format!("{sign}{whole}"),
            width => format!(
                "{sign}{whole}.{:0width$}",
                magnitude % divisor,
                width = width as usize
            ),
        }
    }

    /// Utilization of `self` against `cap` in whole percent, rounded down so
    /// that 89.99 % never shows as 90 %.
    pub fn percent_of(self, cap: Cents) -> i64 {
        if cap.0 <= 0 {
            return 0;
        }
        (i128::from(self.0) * 100 / i128::from(cap.0)) as i64
    }
}

/// `1234567` → `"1,234,567"`.
pub fn group_thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut grouped = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    grouped
}

/// The largest amount Vaultcap accepts anywhere: 10^12 major units (cents
/// here), far above any real billing run and far below `i64::MAX`.
pub const MAX_CENTS: i64 = 100_000_000_000_000;

impl Cents {
    /// A positive amount in minor units, as Stripe's `amount` parameter and
    /// the key API's `*_cents` fields carry it.
    pub fn parse_positive(raw: &str) -> Result<Self, ParseError> {
        match raw.trim().parse::<i64>() {
            Ok(cents) if cents > 0 && cents <= MAX_CENTS => Ok(Self(cents)),
            Ok(_) => Err(ParseError::new(format!(
                "amount {raw:?} must be a whole number of cents between 1 and {MAX_CENTS}"
            ))),
            Err(_) => Err(ParseError::new(format!(
                "amount {raw:?} is not a whole number of cents"
            ))),
        }
    }

    /// An amount as a person types it in the currency's major unit:
    /// `5000`, `5,000.00` or `5000.5` in USD; no more decimals than the
    /// currency has; positive; at most [`MAX_CENTS`] minor units.
    pub fn parse_amount(raw: &str, currency: &Currency) -> Result<Self, ParseError> {
        let text = raw.trim();
        if text.is_empty() {
            return Err(ParseError::new("enter an amount"));
        }
        if text.starts_with('-') {
            return Err(ParseError::new(format!(
                "{text} is negative: enter a positive amount"
            )));
        }
        let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
        let whole_digits: String = whole.chars().filter(|c| *c != ',').collect();
        let grouped_well =
            whole.split(',').skip(1).all(|group| group.len() == 3) && !whole.starts_with(',');
        if whole_digits.is_empty()
            || !whole_digits.bytes().all(|b| b.is_ascii_digit())
            || !fraction.bytes().all(|b| b.is_ascii_digit())
            || !grouped_well
        {
            return Err(ParseError::new(format!(
                "{text:?} is not an amount: write it like 5000 or 5,000.00"
            )));
        }
        let exponent = currency.exponent() as usize;
        if fraction.len() > exponent {
            return Err(ParseError::new(match exponent {
                0 => format!("{} has no decimals: enter a whole amount", currency),
                n => format!("{} has {n} decimals at most", currency),
            }));
        }
        let too_large = || {
            ParseError::new(format!(
                "{text} is more than the largest amount Vaultcap accepts ({} {currency})",
                Cents(MAX_CENTS).format(currency)
            ))
        };
        let scaled = format!("{whole_digits}{fraction:0<exponent$}");
        let cents: i64 = scaled.parse().map_err(|_| too_large())?;
        if cents > MAX_CENTS {
            return Err(too_large());
        }
        if cents == 0 {
            return Err(ParseError::new("the amount must be more than zero"));
        }
        Ok(Self(cents))
    }

    /// Dollars as a JSON number (the seed articles' `daily_usd_cap`) to
    /// cents, rounded to the nearest cent. The only place a float touches
    /// money, at the edge, refused unless finite, positive and at most 10^12.
    pub fn from_dollars(dollars: f64) -> Result<Self, ParseError> {
        if !dollars.is_finite() || dollars <= 0.0 || dollars > 1e12 {
            return Err(ParseError::new(format!(
                "{dollars} is not an amount of dollars between 0.01 and 1000000000000"
            )));
        }
        let cents = (dollars * 100.0).round() as i64;
        if cents < 1 {
            return Err(ParseError::new(format!(
                "{dollars} dollars is less than a cent"
            )));
        }
        Ok(Self(cents))
    }

    /// The cap for an expected total with a buffer in basis points (1000 =
    /// 10 %): `expected × (1 + buffer)`, rounded down to the cent.
    pub fn with_buffer(self, buffer_bps: u32) -> Result<Self, ParseError> {
        let cap = i128::from(self.0) * (10_000 + i128::from(buffer_bps)) / 10_000;
        match i64::try_from(cap) {
            Ok(cap) if cap <= MAX_CENTS => Ok(Self(cap)),
            _ => Err(ParseError::new(
                "the cap would exceed the largest amount Vaultcap accepts",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_amounts_are_read_in_the_currencys_major_unit() {
        let usd = Currency::usd();
        let jpy = Currency::parse("jpy").unwrap();
        assert_eq!(Cents::parse_amount("5,000.00", &usd), Ok(Cents(500_000)));
        assert_eq!(Cents::parse_amount(" 5000 ", &usd), Ok(Cents(500_000)));
        assert_eq!(Cents::parse_amount("5000.5", &usd), Ok(Cents(500_050)));
        assert_eq!(Cents::parse_amount("120000", &jpy), Ok(Cents(120_000)));
        for bad in [
            "",
            "0",
            "0.00",
            "-5",
            "abc",
            "5.001",
            "5,00",
            "1e3",
            "1,000,000,000,000.01",
        ] {
            assert!(Cents::parse_amount(bad, &usd).is_err(), "{bad:?}");
        }
        assert!(Cents::parse_amount("100.5", &jpy).is_err());
        assert_eq!(
            Cents::parse_amount("1,000,000,000,000", &usd),
            Ok(Cents(MAX_CENTS))
        );
    }

    #[test]
    fn amounts_are_grouped_and_show_the_currency_decimals() {
        let usd = Currency::usd();
        assert_eq!(Cents(0).format(&usd), "0.00");
        assert_eq!(Cents(5).format(&usd), "0.05");
        assert_eq!(Cents(123_456_789).format(&usd), "1,234,567.89");
        assert_eq!(Cents(-100_000).format(&usd), "-1,000.00");
        assert_eq!(
            Cents(1_234_567).format(&Currency::parse("JPY").unwrap()),
            "1,234,567"
        );
        assert_eq!(Cents(i64::MIN).format(&usd), "-92,233,720,368,547,758.08");
    }

    #[test]
    fn currency_codes_are_three_letters() {
        assert_eq!(Currency::parse(" EUR ").unwrap().as_str(), "eur");
        for bad in ["", "eu", "euro", "e1r", "€€€"] {
            assert!(Currency::parse(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn stripe_amounts_are_positive_whole_cents() {
        assert_eq!(Cents::parse_positive("5000").unwrap(), Cents(5000));
        for bad in [
            "0",
            "-1",
            "1.5",
            "1e3",
            "",
            "abc",
            "99999999999999999999",
            "100000000000001",
        ] {
            assert!(Cents::parse_positive(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn dollars_become_cents_and_nonsense_is_refused() {
        assert_eq!(Cents::from_dollars(5500.0).unwrap(), Cents(550_000));
        assert_eq!(Cents::from_dollars(0.1 + 0.2).unwrap(), Cents(30));
        for bad in [f64::NAN, f64::INFINITY, -1.0, 0.0, 0.001, 1e12 + 1.0] {
            assert!(Cents::from_dollars(bad).is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn the_cap_adds_the_buffer_and_rounds_down() {
        assert_eq!(Cents(500_000).with_buffer(1000).unwrap(), Cents(550_000));
        assert_eq!(
            Cents(999).with_buffer(1000).unwrap(),
            Cents(1098),
            "1098.9 rounds down"
        );
        assert_eq!(Cents(500_000).with_buffer(0).unwrap(), Cents(500_000));
        assert!(Cents(MAX_CENTS).with_buffer(1000).is_err());
    }

    #[test]
    fn utilization_rounds_down() {
        assert_eq!(Cents(8_999).percent_of(Cents(10_000)), 89);
        assert_eq!(Cents(9_000).percent_of(Cents(10_000)), 90);
        assert_eq!(Cents(1).percent_of(Cents(0)), 0);
        assert_eq!(Cents(i64::MAX).percent_of(Cents(i64::MAX)), 100);
    }
}
