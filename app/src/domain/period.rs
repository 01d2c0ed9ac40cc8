use std::{fmt, str::FromStr};

use chrono::{DateTime, Datelike, NaiveDate, TimeZone, Utc};
use serde::{Deserialize, Serialize};

use super::ParseError;

/// A billing period: one calendar month in UTC, written `YYYY-MM` as the
/// billing jobs' `billing_records.billing_period` column holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct BillingPeriod {
    year: i32,
    month: u32,
}

impl BillingPeriod {
    pub fn new(year: i32, month: u32) -> Result<Self, ParseError> {
        if !(2000..=9999).contains(&year) || !(1..=12).contains(&month) {
            return Err(ParseError::new(format!(
                "{year:04}-{month:02} is not a billing period between 2000-01 and 9999-12"
            )));
        }
        Ok(Self { year, month })
    }

    pub fn containing(at: DateTime<Utc>) -> Self {
        Self {
            year: at.year(),
            month: at.month(),
        }
    }

    pub fn previous(self) -> Self {
        match self.month {
            1 => Self {
                year: self.year - 1,
                month: 12,
            },
            m => Self {
                year: self.year,
                month: m - 1,
            },
        }
    }

    pub fn next(self) -> Self {
        match self.month {
            12 => Self {
                year: self.year + 1,
                month: 1,
            },
            m => Self {
                year: self.year,
                month: m + 1,
            },
        }
    }

    /// First instant of the period, UTC.
    pub fn starts_at(self) -> DateTime<Utc> {
        let day = NaiveDate::from_ymd_opt(self.year, self.month, 1).expect("validated month");
        Utc.from_utc_datetime(&day.and_hms_opt(0, 0, 0).expect("midnight exists"))
    }

    /// First instant after the period, UTC (exclusive end).
    pub fn ends_at(self) -> DateTime<Utc> {
        self.next().starts_at()
    }
}

impl fmt::Display for BillingPeriod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04}-{:02}", self.year, self.month)
    }
}

impl FromStr for BillingPeriod {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let parsed = s
            .split_once('-')
            .filter(|(y, m)| y.len() == 4 && m.len() == 2)
            .and_then(|(y, m)| Some((y.parse().ok()?, m.parse().ok()?)));
        match parsed {
            Some((year, month)) => Self::new(year, month),
            None => Err(ParseError::new(format!(
                "{s:?} is not a billing period: use YYYY-MM"
            ))),
        }
    }
}

impl TryFrom<String> for BillingPeriod {
    type Error = ParseError;

    fn try_from(value: String) -> Result<Self, Self::Error> {
        value.parse()
    }
}

impl From<BillingPeriod> for String {
    fn from(period: BillingPeriod) -> Self {
        period.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_period_parses_from_and_prints_as_year_dash_month() {
        let p: BillingPeriod = "2026-07".parse().unwrap();
        assert_eq!(p.to_string(), "2026-07");
        assert_eq!(p.previous().to_string(), "2026-06");
        assert_eq!(
            "2026-01"
                .parse::<BillingPeriod>()
                .unwrap()
                .previous()
                .to_string(),
            "2025-12"
        );
        assert_eq!(
            "2026-12"
                .parse::<BillingPeriod>()
                .unwrap()
                .next()
                .to_string(),
            "2027-01"
        );
    }

    #[test]
    fn malformed_periods_are_refused() {
        for bad in [
            "", "2026", "2026-13", "2026-00", "26-07", "2026-7", "2026/07", "abcd-ef",
        ] {
            assert!(
                bad.parse::<BillingPeriod>().is_err(),
                "{bad:?} was accepted"
            );
        }
    }

    #[test]
    fn a_period_spans_its_calendar_month_in_utc() {
        let p: BillingPeriod = "2024-02".parse().unwrap();
        assert_eq!(p.starts_at().to_rfc3339(), "2024-02-01T00:00:00+00:00");
        assert_eq!(p.ends_at().to_rfc3339(), "2024-03-01T00:00:00+00:00");
    }
}
