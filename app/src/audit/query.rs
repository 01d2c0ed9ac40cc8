//! The audit log's filters, page size and position, as the URL carries them
//! (so a link reproduces the view), and what the audit pages show.

use chrono::{DateTime, Duration, NaiveDate, NaiveDateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::domain::{AuditId, BillingPeriod, Cents, Currency, Decision, ParseError, VaultKeyId};

/// Page sizes offered; anything else is refused.
pub const AUDIT_PAGE_SIZES: [i64; 4] = [25, 50, 100, 200];
pub const DEFAULT_AUDIT_PAGE_SIZE: i64 = 50;
/// The longest text any filter takes (ids, keys, paths are far shorter).
const MAX_TEXT: usize = 200;

/// The query string as typed; [`AuditQuery::parse`] reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditQuery {
    /// UTC, `2026-11-30` or `2026-11-30T14:00` (inclusive).
    pub from: Option<String>,
    /// UTC; a date alone includes that whole day.
    pub to: Option<String>,
    pub key: Option<String>,
    pub period: Option<String>,
    /// Stripe's customer id (`cus_…`).
    pub customer: Option<String>,
    /// The billing job's `metadata[customer_id]`.
    pub customer_id: Option<String>,
    /// A path such as `/v1/charges`.
    pub endpoint: Option<String>,
    /// A decision, or `refused` for every refusal.
    pub decision: Option<String>,
    /// Stripe's HTTP status.
    pub status: Option<String>,
    /// Calls in this currency (`usd`, `jpy`); the amounts below are in it.
    pub currency: Option<String>,
    /// In the currency's major unit, like `500` or `1,250.00`.
    pub min_amount: Option<String>,
    pub max_amount: Option<String>,
    pub idempotency_key: Option<String>,
    /// A Stripe object id (`ch_…`, `pi_…`).
    pub object: Option<String>,
    pub limit: Option<String>,
    /// Cursor: the page of calls older than this one.
    pub after: Option<String>,
    /// Cursor: the page of calls newer than this one.
    pub before: Option<String>,
}

/// What the decision filter matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecisionFilter {
    Exactly(Decision),
    AnyRefusal,
}

/// A position in the newest-first order: a call's time and id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    pub at: DateTime<Utc>,
    pub id: i64,
}

impl Position {
    /// `<microseconds since 1970>.<id>`: nothing secret, only where to go on.
    pub fn encode(self) -> String {
        format!("{}.{}", self.at.timestamp_micros(), self.id)
    }

    fn decode(raw: &str) -> Option<Self> {
        let (micros, id) = raw.split_once('.')?;
        let at = DateTime::from_timestamp_micros(micros.parse().ok()?)?;
        let id = id.parse().ok().filter(|id| *id > 0)?;
        Some(Self { at, id })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cursor {
    /// Older than the position (forward, the usual way).
    After(Position),
    /// Newer than the position (back).
    Before(Position),
}

/// The filters, checked: every value is the type it must be.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditFilter {
    pub from: Option<DateTime<Utc>>,
    pub to: Option<DateTime<Utc>>,
    pub key: Option<i64>,
    pub period: Option<BillingPeriod>,
    pub customer: Option<String>,
    pub customer_id: Option<String>,
    pub endpoint: Option<String>,
    pub decision: Option<DecisionFilter>,
    pub status: Option<i16>,
    pub currency: Option<Currency>,
    pub min_amount: Option<Cents>,
    pub max_amount: Option<Cents>,
    pub idempotency_key: Option<String>,
    pub object: Option<String>,
    pub limit: i64,
    pub cursor: Option<Cursor>,
}

impl AuditQuery {
    /// Reads every filter, naming the first bad one in the message.
    pub fn parse(&self) -> Result<AuditFilter, ParseError> {
        let (from, to) = time_range(&self.from, &self.to)?;
        let key = given(&self.key)
            .map(|raw| {
                raw.parse::<i64>()
                    .ok()
                    .filter(|id| *id > 0)
                    .ok_or_else(|| ParseError::new(format!("{raw:?} is not a vault key id")))
            })
            .transpose()?;
        let period = given(&self.period)
            .map(|raw| raw.parse::<BillingPeriod>())
            .transpose()?;
        let decision = given(&self.decision)
            .map(|raw| match raw.as_str() {
                "refused" => Ok(DecisionFilter::AnyRefusal),
                other => Decision::parse(other).map(DecisionFilter::Exactly).ok_or_else(|| {
                    ParseError::new(format!(
                        "{other:?} is not a decision: use allowed, replay, outcome_unknown, refused or one refusal reason"
                    ))
                }),
            })
            .transpose()?;
        let status = given(&self.status)
            .map(|raw| {
                raw.parse::<i16>()
                    .ok()
                    .filter(|s| (100..=599).contains(s))
                    .ok_or_else(|| {
                        ParseError::new(format!("{raw:?} is not an HTTP status (100 to 599)"))
                    })
            })
            .transpose()?;
        let currency = given(&self.currency)
            .map(|raw| Currency::parse(&raw))
            .transpose()?;
        // An amount is read in its currency's decimals (500 JPY is 500,
        // 500 USD 50,000 cents): never guessed.
        let amount = |raw: &Option<String>| {
            given(raw)
                .map(|raw| match &currency {
                    Some(currency) => Cents::parse_amount(&raw, currency),
                    None => Err(ParseError::new(
                        "choose the currency the amounts are in (usd, eur, jpy, …)",
                    )),
                })
                .transpose()
        };
        let (min_amount, max_amount) = (amount(&self.min_amount)?, amount(&self.max_amount)?);
        if let (Some(min), Some(max)) = (min_amount, max_amount) {
            if min > max {
                return Err(ParseError::new(
                    "the smallest amount is larger than the largest",
                ));
            }
        }
        let (limit, cursor) = paging(&self.limit, &self.after, &self.before)?;
        Ok(AuditFilter {
            from,
            to,
            key,
            period,
            customer: text("customer", &self.customer)?,
            customer_id: text("customer_id", &self.customer_id)?,
            endpoint: text("endpoint", &self.endpoint)?,
            decision,
            status,
            currency,
            min_amount,
            max_amount,
            idempotency_key: text("idempotency key", &self.idempotency_key)?,
            object: text("Stripe object", &self.object)?,
            limit,
            cursor,
        })
    }

    /// The same filters at another position (`None`: the first page).
    pub fn at(&self, cursor: Option<Cursor>) -> AuditQuery {
        let (after, before) = match cursor {
            None => (None, None),
            Some(Cursor::After(p)) => (Some(p.encode()), None),
            Some(Cursor::Before(p)) => (None, Some(p.encode())),
        };
        AuditQuery {
            after,
            before,
            ..self.clone()
        }
    }

    /// The query string with only the parameters that are set (no `?`).
    pub fn query_string(&self) -> String {
        self.pairs()
            .into_iter()
            .map(|(name, value)| format!("{name}={}", crate::keys::list::encode(value)))
            .collect::<Vec<_>>()
            .join("&")
    }

    /// `path?query`, or `path` when nothing is set.
    pub fn href(&self, path: &str) -> String {
        match self.query_string() {
            q if q.is_empty() => path.to_owned(),
            q => format!("{path}?{q}"),
        }
    }

    /// The query with only its filters: the export takes the whole
    /// filtered set, whatever page the link was on.
    pub fn filters_only(self) -> AuditQuery {
        AuditQuery {
            limit: None,
            ..self.at(None)
        }
    }

    /// A query string's pairs, as decoded: a name the log does not take is
    /// ignored, and one given twice keeps its last value.
    pub fn from_pairs<N, V>(pairs: impl IntoIterator<Item = (N, V)>) -> Self
    where
        N: AsRef<str>,
        V: Into<String>,
    {
        let mut query = Self::default();
        for (name, value) in pairs {
            query.set(name.as_ref(), value.into());
        }
        query
    }
}

/// Declares the query string's parameters once, each named as its field:
/// [`AuditQuery::pairs`] writes them and [`AuditQuery::set`] reads them,
/// for the page, the export and the API alike.
macro_rules! parameters {
    ($($name:ident),* $(,)?) => {
        impl AuditQuery {
            /// The set parameters, in the order declared.
            pub fn pairs(&self) -> Vec<(&'static str, &str)> {
                [$((stringify!($name), &self.$name)),*]
                    .into_iter()
                    .filter_map(|(name, value)| {
                        Some((name, value.as_deref().filter(|v| !v.trim().is_empty())?))
                    })
                    .collect()
            }

            /// Sets the parameter `name`; false for a name it does not take.
            pub fn set(&mut self, name: &str, value: String) -> bool {
                match name {
                    $(stringify!($name) => self.$name = Some(value),)*
                    _ => return false,
                }
                true
            }
        }
    };
}

parameters!(
    from,
    to,
    key,
    period,
    customer,
    customer_id,
    endpoint,
    decision,
    status,
    currency,
    min_amount,
    max_amount,
    idempotency_key,
    object,
    limit,
    after,
    before,
);

pub(crate) fn given(value: &Option<String>) -> Option<String> {
    value
        .as_deref()
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
}

/// A text filter: matched exactly, so only its length and characters are
/// checked (quotes, `%` and HTML are just characters here).
pub(crate) fn text(name: &str, value: &Option<String>) -> Result<Option<String>, ParseError> {
    let Some(value) = given(value) else {
        return Ok(None);
    };
    if value.chars().count() > MAX_TEXT {
        return Err(ParseError::new(format!(
            "the {name} filter is longer than {MAX_TEXT} characters"
        )));
    }
    if value.chars().any(char::is_control) {
        return Err(ParseError::new(format!(
            "the {name} filter contains control characters"
        )));
    }
    Ok(Some(value))
}

fn position(raw: &str) -> Result<Position, ParseError> {
    Position::decode(raw)
        .ok_or_else(|| ParseError::new("the page link is damaged: start again from the first page"))
}

/// A time range's start (inclusive) and end (exclusive), each optional.
pub(crate) type TimeRange = (Option<DateTime<Utc>>, Option<DateTime<Utc>>);

/// `from` and `to` read as UTC moments, `from` before `to`.
pub(crate) fn time_range(
    from: &Option<String>,
    to: &Option<String>,
) -> Result<TimeRange, ParseError> {
    let from = given(from).map(|raw| moment(&raw, false)).transpose()?;
    let to = given(to).map(|raw| moment(&raw, true)).transpose()?;
    if let (Some(from), Some(to)) = (from, to) {
        if from >= to {
            return Err(ParseError::new("the time range ends before it starts"));
        }
    }
    Ok((from, to))
}

/// The page size (one of [`AUDIT_PAGE_SIZES`]) and the position.
pub(crate) fn paging(
    limit: &Option<String>,
    after: &Option<String>,
    before: &Option<String>,
) -> Result<(i64, Option<Cursor>), ParseError> {
    let limit = match given(limit) {
        None => DEFAULT_AUDIT_PAGE_SIZE,
        Some(raw) => raw
            .parse::<i64>()
            .ok()
            .filter(|n| AUDIT_PAGE_SIZES.contains(n))
            .ok_or_else(|| {
                ParseError::new(format!(
                    "{raw:?} is not a page size: use 25, 50, 100 or 200"
                ))
            })?,
    };
    let cursor = match (given(after), given(before)) {
        (Some(_), Some(_)) => {
            return Err(ParseError::new(
                "a page link has both directions: start from the first page",
            ))
        }
        (Some(raw), None) => Some(Cursor::After(position(&raw)?)),
        (None, Some(raw)) => Some(Cursor::Before(position(&raw)?)),
        (None, None) => None,
    };
    Ok((limit, cursor))
}

/// A UTC moment from a date or a date and time; `end` makes a date alone
/// mean the end of that day.
fn moment(raw: &str, end: bool) -> Result<DateTime<Utc>, ParseError> {
    if let Ok(at) = DateTime::parse_from_rfc3339(raw) {
        return Ok(at.with_timezone(&Utc));
    }
    for format in ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M"] {
        if let Ok(at) = NaiveDateTime::parse_from_str(raw, format) {
            return Ok(at.and_utc());
        }
    }
    if let Ok(day) = NaiveDate::parse_from_str(raw, "%Y-%m-%d") {
        let start = day.and_hms_opt(0, 0, 0).expect("midnight exists").and_utc();
        return Ok(if end {
            start + Duration::days(1)
        } else {
            start
        });
    }
    Err(ParseError::new(format!(
        "{raw:?} is not a time: write 2026-11-30 or 2026-11-30T14:00 (UTC)"
    )))
}

/// A time filter as a native `datetime-local` input shows it
/// (`2026-11-30T14:00`); a date alone is the start of that day (`end`:
/// of the next, where a `to` date ends). What is not a time is shown as
/// given, so the error beside it and the field agree.
pub fn datetime_local(raw: &Option<String>, end: bool) -> String {
    match given(raw) {
        None => String::new(),
        Some(raw) => match moment(&raw, end) {
            Ok(at) if at.timestamp() % 60 == 0 => at.format("%Y-%m-%dT%H:%M").to_string(),
            Ok(at) => at.format("%Y-%m-%dT%H:%M:%S").to_string(),
            Err(_) => raw,
        },
    }
}

/// One call as the audit log lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditCall {
    pub id: AuditId,
    pub at: DateTime<Utc>,
    pub vault_key_id: Option<VaultKeyId>,
    pub key_label: Option<String>,
    pub key_prefix: Option<String>,
    pub method: String,
    pub path: String,
    pub stripe_customer: Option<String>,
    pub metadata_customer_id: Option<String>,
    pub billing_period: Option<BillingPeriod>,
    pub amount: Option<Cents>,
    pub currency: Option<Currency>,
    pub idempotency_key: Option<String>,
    pub decision: Decision,
    pub upstream_status: Option<i16>,
    pub stripe_object_id: Option<String>,
    pub error_code: Option<String>,
    pub latency_ms: Option<i32>,
}

/// Everything recorded about one call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditCallDetail {
    pub call: AuditCall,
    pub request_id: String,
    pub metadata_billing_period: Option<String>,
    /// Why the proxy refused it, or what went wrong upstream.
    pub message: Option<String>,
}

/// One page of the audit log and the links around it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditPage {
    pub calls: Vec<AuditCall>,
    /// The query of the newer page, when there is one.
    pub newer: Option<AuditQuery>,
    /// The query of the older page, when there is one.
    pub older: Option<AuditQuery>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_filters_show_as_native_inputs_read_them() {
        let shown = |raw: &str, end| datetime_local(&Some(raw.into()), end);
        assert_eq!(shown("2026-11-30", false), "2026-11-30T00:00");
        assert_eq!(shown("2026-11-30", true), "2026-12-01T00:00");
        assert_eq!(shown("2026-11-30T12:00:05", false), "2026-11-30T12:00:05");
        assert_eq!(shown("2026-11-30T14:00:00Z", true), "2026-11-30T14:00");
        assert_eq!(shown("yesterday", false), "yesterday");
        assert_eq!(datetime_local(&None, false), "");
    }

    fn query(pairs: &[(&str, &str)]) -> AuditQuery {
        AuditQuery::from_pairs(pairs.iter().copied())
    }

    #[test]
    fn every_parameter_written_is_read_back_and_others_are_ignored() {
        let mut every = AuditQuery::default();
        let names: Vec<&str> = [
            "from",
            "to",
            "key",
            "period",
            "customer",
            "customer_id",
            "endpoint",
            "decision",
            "status",
            "currency",
            "min_amount",
            "max_amount",
            "idempotency_key",
            "object",
            "limit",
            "after",
            "before",
        ]
        .into_iter()
        .filter(|name| every.set(name, format!("v-{name}")))
        .collect();
        assert_eq!(names.len(), 17);
        assert_eq!(every.pairs().len(), 17);
        assert_eq!(AuditQuery::from_pairs(every.pairs()), every);
        // Unknown names change nothing; a repeated name keeps its last value.
        let read = query(&[("page", "2"), ("key", "1"), ("key", "2")]);
        assert_eq!(read.pairs(), vec![("key", "2")]);
        assert!(!AuditQuery::default().set("page", "2".into()));
        // The export takes filters, never a position.
        let at = query(&[("key", "3"), ("limit", "25"), ("after", "1.2")]).filters_only();
        assert_eq!(at.pairs(), vec![("key", "3")]);
    }

    #[test]
    fn an_empty_query_is_the_newest_page_of_everything() {
        let filter = AuditQuery::default().parse().unwrap();
        assert_eq!(filter.limit, DEFAULT_AUDIT_PAGE_SIZE);
        assert_eq!(
            (filter.cursor, filter.decision, filter.from),
            (None, None, None)
        );
    }

    #[test]
    fn dates_alone_cover_whole_days() {
        let f = query(&[("from", "2026-11-30"), ("to", "2026-11-30")])
            .parse()
            .unwrap();
        assert_eq!(f.from.unwrap().to_rfc3339(), "2026-11-30T00:00:00+00:00");
        assert_eq!(f.to.unwrap().to_rfc3339(), "2026-12-01T00:00:00+00:00");
        let f = query(&[("from", "2026-11-30T14:05")]).parse().unwrap();
        assert_eq!(f.from.unwrap().to_rfc3339(), "2026-11-30T14:05:00+00:00");
    }

    #[test]
    fn every_bad_value_gets_a_message_naming_it() {
        for (pairs, message) in [
            (vec![("from", "30/11/2026")], "\"30/11/2026\" is not a time"),
            (
                vec![("from", "2026-12-02"), ("to", "2026-12-01")],
                "ends before it starts",
            ),
            (
                vec![("decision", "approved")],
                "\"approved\" is not a decision",
            ),
            (vec![("status", "2000")], "\"2000\" is not an HTTP status"),
            (vec![("currency", "usd"), ("min_amount", "-5")], "negative"),
            (
                vec![
                    ("currency", "usd"),
                    ("min_amount", "10"),
                    ("max_amount", "5"),
                ],
                "smallest amount is larger",
            ),
            (vec![("min_amount", "10")], "choose the currency"),
            (
                vec![("currency", "jpy"), ("min_amount", "10.50")],
                "JPY has no decimals",
            ),
            (vec![("currency", "dollars")], "not a currency code"),
            (vec![("limit", "100000")], "\"100000\" is not a page size"),
            (vec![("key", "1 OR 1=1")], "is not a vault key id"),
            (vec![("after", "abc")], "page link is damaged"),
            (vec![("after", "1.2"), ("before", "1.2")], "both directions"),
            (vec![("period", "2026-13")], "2026-13"),
        ] {
            let err = query(&pairs).parse().unwrap_err();
            assert!(err.0.contains(message), "{pairs:?}: {err}");
        }
        let long = "x".repeat(201);
        assert!(query(&[("customer_id", &long)])
            .parse()
            .unwrap_err()
            .0
            .contains("longer than 200"));
    }

    #[test]
    fn text_filters_keep_sql_and_html_as_plain_characters() {
        let f = query(&[("customer_id", "x' OR '1'='1"), ("object", "<b>ch_1</b>")])
            .parse()
            .unwrap();
        assert_eq!(f.customer_id.as_deref(), Some("x' OR '1'='1"));
        assert_eq!(f.object.as_deref(), Some("<b>ch_1</b>"));
    }

    #[test]
    fn page_links_keep_the_filters_and_carry_the_position() {
        let q = query(&[
            ("decision", "refused"),
            ("customer_id", "cust 7"),
            ("after", "5.5"),
        ]);
        let at = Position {
            at: DateTime::from_timestamp_micros(1_700_000_000_000_001).unwrap(),
            id: 42,
        };
        let older = q.at(Some(Cursor::After(at)));
        assert_eq!(
            older.href("/audit"),
            "/audit?customer_id=cust%207&decision=refused&after=1700000000000001.42"
        );
        assert_eq!(older.parse().unwrap().cursor, Some(Cursor::After(at)));
        assert_eq!(
            q.at(None).href("/audit"),
            "/audit?customer_id=cust%207&decision=refused"
        );
    }
}
