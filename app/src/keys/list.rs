//! The keys list's filters and sorting, as the URL carries them, and what
//! the list and a key's page show.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::domain::{BillingPeriod, Cents, KeyStatus, KeySummary, ParseError};

/// Keys per page of the list.
pub const KEYS_PER_PAGE: i64 = 50;

/// The list's query string as typed: nothing is trusted until
/// [`KeyQuery::parse`] has read it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyQuery {
    pub period: Option<String>,
    pub status: Option<String>,
    /// `"1"`: only keys at or above one of their alert thresholds.
    pub at_threshold: Option<String>,
    pub q: Option<String>,
    pub sort: Option<String>,
    pub dir: Option<String>,
    pub page: Option<String>,
}

/// What the list shows, read from a [`KeyQuery`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyFilter {
    pub period: Option<BillingPeriod>,
    pub status: Option<KeyStatus>,
    pub at_threshold: bool,
    /// Part of a label, matched case-insensitively and literally.
    pub search: Option<String>,
    pub sort: KeySort,
    pub descending: bool,
    /// 1-based.
    pub page: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeySort {
    Created,
    Period,
    Label,
    Cap,
    Spent,
    Utilization,
    Expires,
}

impl KeySort {
    pub const ALL: [KeySort; 7] = [
        KeySort::Created,
        KeySort::Period,
        KeySort::Label,
        KeySort::Cap,
        KeySort::Spent,
        KeySort::Utilization,
        KeySort::Expires,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            KeySort::Created => "created",
            KeySort::Period => "period",
            KeySort::Label => "label",
            KeySort::Cap => "cap",
            KeySort::Spent => "spent",
            KeySort::Utilization => "utilization",
            KeySort::Expires => "expires",
        }
    }

    /// Text columns read best A→Z, amounts and times biggest or newest first.
    pub fn descending_by_default(self) -> bool {
        !matches!(self, KeySort::Label | KeySort::Expires)
    }
}

impl KeyQuery {
    pub fn parse(&self) -> Result<KeyFilter, ParseError> {
        let given = |value: &Option<String>| {
            value
                .as_deref()
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(str::to_owned)
        };
        let period = given(&self.period)
            .map(|raw| raw.parse::<BillingPeriod>())
            .transpose()?;
        let status = match given(&self.status).as_deref() {
            None | Some("all") => None,
            Some("active") => Some(KeyStatus::Active),
            Some("expired") => Some(KeyStatus::Expired),
            Some("revoked") => Some(KeyStatus::Revoked),
            Some(other) => {
                return Err(ParseError::new(format!(
                    "{other:?} is not a key status: use active, expired, revoked or all"
                )))
            }
        };
        let at_threshold = match given(&self.at_threshold).as_deref() {
            None | Some("0") => false,
            Some("1") => true,
            Some(other) => {
                return Err(ParseError::new(format!(
                    "{other:?} is not a threshold filter: use 1 or leave it out"
                )))
            }
        };
        let search = given(&self.q);
        if search.as_ref().is_some_and(|s| s.chars().count() > 200) {
            return Err(ParseError::new(
                "the label search is longer than any label (200 characters)",
            ));
        }
        let sort = match given(&self.sort) {
            None => KeySort::Created,
            Some(raw) => KeySort::ALL
                .into_iter()
                .find(|s| s.as_str() == raw)
                .ok_or_else(|| {
                    ParseError::new(format!(
                        "{raw:?} is not a column to sort by: use created, period, label, cap, spent, utilization or expires"
                    ))
                })?,
        };
        let descending = match given(&self.dir).as_deref() {
            None => sort.descending_by_default(),
            Some("desc") => true,
            Some("asc") => false,
            Some(other) => {
                return Err(ParseError::new(format!(
                    "{other:?} is not a sort direction: use asc or desc"
                )))
            }
        };
        let page = match given(&self.page) {
            None => 1,
            Some(raw) => raw
                .parse::<i64>()
                .ok()
                .filter(|p| (1..=100_000).contains(p))
                .ok_or_else(|| ParseError::new(format!("{raw:?} is not a page number")))?,
        };
        Ok(KeyFilter {
            period,
            status,
            at_threshold,
            search,
            sort,
            descending,
            page,
        })
    }

    /// This query with another sort column: the same column again flips the
    /// direction; paging starts over.
    pub fn sorted_by(&self, sort: KeySort) -> KeyQuery {
        let current = self.parse().ok();
        let dir = match current {
            Some(filter) if filter.sort == sort => {
                if filter.descending {
                    "asc"
                } else {
                    "desc"
                }
            }
            _ if sort.descending_by_default() => "desc",
            _ => "asc",
        };
        KeyQuery {
            sort: Some(sort.as_str().into()),
            dir: Some(dir.into()),
            page: None,
            ..self.clone()
        }
    }

    pub fn with_page(&self, page: i64) -> KeyQuery {
        KeyQuery {
            page: Some(page.to_string()),
            ..self.clone()
        }
    }

    /// `/keys?…` with only the parameters that are set.
    pub fn href(&self) -> String {
        let pairs = [
            ("period", &self.period),
            ("status", &self.status),
            ("at_threshold", &self.at_threshold),
            ("q", &self.q),
            ("sort", &self.sort),
            ("dir", &self.dir),
            ("page", &self.page),
        ];
        let query: Vec<String> = pairs
            .into_iter()
            .filter_map(|(name, value)| {
                let value = value.as_deref().filter(|v| !v.is_empty())?;
                Some(format!("{name}={}", encode(value)))
            })
            .collect();
        if query.is_empty() {
            "/keys".into()
        } else {
            format!("/keys?{}", query.join("&"))
        }
    }
}

/// Percent-encodes everything but unreserved characters (RFC 3986).
pub(crate) fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// One page of the keys list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyList {
    pub keys: Vec<KeySummary>,
    /// Keys matching the filters, over all pages.
    pub matching: i64,
    pub page: i64,
    pub pages: i64,
    /// Billing periods that have keys, newest first, for the period filter.
    pub periods: Vec<String>,
}

/// Calls under a key with one decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecisionCount {
    pub decision: crate::domain::Decision,
    pub calls: i64,
}

/// One audited call, as a key's page lists its latest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(sqlx::FromRow))]
pub struct CallSummary {
    pub id: crate::domain::AuditId,
    pub at: DateTime<Utc>,
    pub method: String,
    pub path: String,
    pub customer: Option<String>,
    #[cfg_attr(feature = "ssr", sqlx(rename = "amount_cents"))]
    pub amount: Option<Cents>,
    pub decision: crate::domain::Decision,
    pub upstream_status: Option<i16>,
    pub stripe_object_id: Option<String>,
}

/// Everything a key's page shows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyDetail {
    pub key: KeySummary,
    pub duplicate_policy: crate::domain::DuplicatePolicy,
    pub buffer_bps: i32,
    pub allowed_endpoints: Vec<String>,
    pub created_at: DateTime<Utc>,
    pub created_by: Option<String>,
    pub revoked_at: Option<DateTime<Utc>>,
    pub revoked_by: Option<String>,
    pub revoke_reason: Option<String>,
    pub calls: Vec<DecisionCount>,
    pub latest_calls: Vec<CallSummary>,
    /// The key's alerts, newest first.
    pub alerts: Vec<crate::domain::Alert>,
    /// Every cap increase asked for on this key, newest first.
    pub cap_history: Vec<crate::domain::CapIncrease>,
    /// The key this one is a follow-on of.
    pub parent_key_id: Option<crate::domain::VaultKeyId>,
    /// Cumulative spend against the cap and the expected total, rendered
    /// on the server (an SVG document).
    pub spend_chart_svg: String,
    /// The chart's figures: spent per day and to date.
    pub spend_by_day: Vec<crate::domain::DayFigures>,
}

impl KeySummary {
    /// How the utilization reads against the key's thresholds: `ok` below
    /// the lowest, `warn` from it, `high` from the highest (or at the cap).
    pub fn level(&self) -> &'static str {
        let pct = self.utilization_pct();
        let lowest = self.thresholds_pct.iter().min().copied().unwrap_or(90);
        let highest = self.thresholds_pct.iter().max().copied().unwrap_or(90);
        if pct >= i64::from(highest) || pct >= 100 {
            "high"
        } else if pct >= i64::from(lowest) {
            "warn"
        } else {
            "ok"
        }
    }

    /// Spent and reserved together: what the cap is measured against.
    pub fn committed(&self) -> Cents {
        Cents(self.spent.0 + self.reserved.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(pairs: &[(&str, &str)]) -> KeyQuery {
        let get = |name: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        };
        KeyQuery {
            period: get("period"),
            status: get("status"),
            at_threshold: get("at_threshold"),
            q: get("q"),
            sort: get("sort"),
            dir: get("dir"),
            page: get("page"),
        }
    }

    #[test]
    fn an_empty_query_lists_every_key_newest_first() {
        let filter = KeyQuery::default().parse().unwrap();
        assert_eq!(filter.sort, KeySort::Created);
        assert!(filter.descending);
        assert_eq!((filter.page, filter.status, filter.period), (1, None, None));
    }

    #[test]
    fn every_bad_value_is_named_in_its_message() {
        for (name, value) in [
            ("period", "2026-13"),
            ("status", "deleted"),
            ("at_threshold", "yes"),
            ("sort", "secret_hash"),
            ("dir", "sideways"),
            ("page", "0"),
            ("page", "-1"),
            ("page", "1e9"),
        ] {
            let err = query(&[(name, value)]).parse().unwrap_err();
            assert!(err.0.contains(value), "{name}={value}: {err}");
        }
    }

    #[test]
    fn sorting_by_the_current_column_flips_the_direction() {
        let by_spent = KeyQuery::default().sorted_by(KeySort::Spent);
        assert_eq!(by_spent.dir.as_deref(), Some("desc"));
        assert_eq!(
            by_spent.sorted_by(KeySort::Spent).dir.as_deref(),
            Some("asc")
        );
        assert_eq!(
            by_spent.sorted_by(KeySort::Label).dir.as_deref(),
            Some("asc")
        );
    }

    #[test]
    fn links_keep_the_filters_and_encode_the_search() {
        let q = query(&[("q", "a&b c"), ("status", "active"), ("page", "3")]);
        assert_eq!(
            q.sorted_by(KeySort::Cap).href(),
            "/keys?status=active&q=a%26b%20c&sort=cap&dir=desc"
        );
        assert_eq!(
            q.with_page(4).href(),
            "/keys?status=active&q=a%26b%20c&page=4"
        );
        assert_eq!(KeyQuery::default().href(), "/keys");
    }
}
