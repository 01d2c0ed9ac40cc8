//! The proxy's audit log: one row per call that reached the proxy.

use serde::Serialize;
use uuid::Uuid;

use sqlx::{PgExecutor, Postgres, QueryBuilder};

use crate::ssr::keyset;

use crate::domain::{
    AuditCall, AuditCallDetail, AuditFilter, AuditId, AuditPage, AuditQuery, BillingPeriod,
    CallSummary, Cents, Currency, Decision, DecisionFilter, Position, RefusedCharges, VaultKeyId,
};

/// Everything recorded about one call.
/// Its fields are the audit_log columns of the same names.
#[derive(Debug, Clone, Serialize)]
pub struct AuditEntry {
    pub request_id: Uuid,
    pub vault_key_id: Option<VaultKeyId>,
    pub key_prefix: Option<String>,
    pub method: String,
    pub path: String,
    pub stripe_customer: Option<String>,
    pub metadata_customer_id: Option<String>,
    pub metadata_billing_period: Option<String>,
    pub billing_period: Option<BillingPeriod>,
    pub amount_cents: Option<Cents>,
    /// As the call named it (lower-cased): a refused call's may be no currency.
    pub currency: Option<String>,
    pub idempotency_key: Option<String>,
    pub decision: Decision,
    pub upstream_status: Option<i16>,
    pub stripe_object_id: Option<String>,
    pub error_code: Option<String>,
    pub message: Option<String>,
    pub latency_ms: i32,
}

impl AuditEntry {
    /// A call as it arrived, nothing known about it yet: a fresh request
    /// id, and allowed until something refuses it.
    pub fn received(method: impl Into<String>, path: impl Into<String>) -> Self {
        Self {
            request_id: Uuid::new_v4(),
            vault_key_id: None,
            key_prefix: None,
            method: method.into(),
            path: path.into(),
            stripe_customer: None,
            metadata_customer_id: None,
            metadata_billing_period: None,
            billing_period: None,
            amount_cents: None,
            currency: None,
            idempotency_key: None,
            decision: Decision::Allowed,
            upstream_status: None,
            stripe_object_id: None,
            error_code: None,
            message: None,
            latency_ms: 0,
        }
    }
}

/// A key's latest calls, newest first (the audit log's key index).
#[tracing::instrument(skip_all)]
pub async fn latest_for_key(
    db: impl PgExecutor<'_>,
    key: VaultKeyId,
    limit: i64,
) -> Result<Vec<CallSummary>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, at, method, path, COALESCE(metadata_customer_id, stripe_customer) AS customer,
                amount_cents, decision, upstream_status, stripe_object_id
         FROM audit_log WHERE vault_key_id = $1 ORDER BY at DESC, id DESC LIMIT $2",
    )
    .bind(key)
    .bind(limit)
    .fetch_all(db)
    .await
}

/// The columns of an [`AuditCall`], from `audit_log a` left-joined to
/// `vault_keys k`.
const CALL_COLUMNS: &str = "a.id, a.at, a.vault_key_id, k.label AS key_label, a.key_prefix, a.method, a.path,
    a.stripe_customer, a.metadata_customer_id, a.billing_period, a.amount_cents, a.currency,
    a.idempotency_key, a.decision, a.upstream_status, a.stripe_object_id, a.error_code, a.latency_ms";

/// A filter's value: bound as a parameter in queries, written as a literal
/// in the export's `COPY` (which takes no parameters).
enum Value {
    Time(chrono::DateTime<chrono::Utc>),
    Int(i64),
    Text(String),
}

impl Value {
    /// The value as an SQL literal. Text is quoted the standard way (quotes
    /// doubled; the export's connection has `standard_conforming_strings`
    /// on, so a backslash is only a backslash). Text PostgreSQL cannot hold
    /// (a NUL) matches no row: `NULL`, which no comparison is true for.
    fn literal(&self) -> String {
        match self {
            Self::Time(at) => format!(
                "'{}'::timestamptz",
                at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
            ),
            Self::Int(n) => n.to_string(),
            Self::Text(text) if text.contains('\0') => "NULL".into(),
            Self::Text(text) => format!("'{}'", text.replace('\'', "''")),
        }
    }
}

/// The conditions of `filter` (never its position), for `audit_log a`:
/// each an SQL fragment ending where its value goes, if it has one. Each
/// is an equality or range on an indexed column, so bad input has been
/// refused before it could ask for a scan.
fn conditions(filter: &AuditFilter) -> Vec<(String, Option<Value>)> {
    let mut all = Vec::new();
    let mut with = |sql: &str, value| all.push((sql.to_owned(), Some(value)));
    if let Some(from) = filter.from {
        with(" AND a.at >= ", Value::Time(from));
    }
    if let Some(to) = filter.to {
        with(" AND a.at < ", Value::Time(to));
    }
    if let Some(key) = filter.key {
        with(" AND a.vault_key_id = ", Value::Int(key));
    }
    if let Some(period) = filter.period {
        with(" AND a.billing_period = ", Value::Text(period.to_string()));
    }
    let exact = [
        ("a.stripe_customer", &filter.customer),
        ("a.metadata_customer_id", &filter.customer_id),
        ("a.path", &filter.endpoint),
        ("a.idempotency_key", &filter.idempotency_key),
        ("a.stripe_object_id", &filter.object),
    ];
    for (column, value) in exact {
        if let Some(value) = value {
            with(&format!(" AND {column} = "), Value::Text(value.clone()));
        }
    }
    if let Some(currency) = &filter.currency {
        with(
            " AND a.currency = ",
            Value::Text(currency.as_str().to_owned()),
        );
    }
    match filter.decision {
        None => {}
        Some(DecisionFilter::Exactly(decision)) => {
            with(" AND a.decision = ", Value::Text(decision.as_str().into()));
        }
        // Also states the refusals index's predicate, so it is used.
        Some(DecisionFilter::AnyRefusal) => all.push((
            " AND a.decision <> 'allowed' AND a.decision LIKE 'refused%'".into(),
            None,
        )),
    }
    if let Some(status) = filter.status {
        all.push((
            " AND a.upstream_status = ".into(),
            Some(Value::Int(status.into())),
        ));
    }
    if let Some(min) = filter.min_amount {
        all.push((" AND a.amount_cents >= ".into(), Some(Value::Int(min.0))));
    }
    if let Some(max) = filter.max_amount {
        all.push((" AND a.amount_cents <= ".into(), Some(Value::Int(max.0))));
    }
    all
}

/// The `WHERE` clause of `filter` (never its position), for `audit_log a`,
/// with its values bound.
pub fn push_filter(query: &mut QueryBuilder<'_, Postgres>, filter: &AuditFilter) {
    query.push(" WHERE true");
    for (sql, value) in conditions(filter) {
        query.push(sql);
        match value {
            None => {}
            Some(Value::Time(at)) => {
                query.push_bind(at);
            }
            Some(Value::Int(n)) => {
                query.push_bind(n);
            }
            Some(Value::Text(text)) => {
                query.push_bind(text);
            }
        }
    }
}

/// The same `WHERE` clause with its values written in as literals.
fn inline_filter(filter: &AuditFilter) -> String {
    let mut sql = String::from(" WHERE true");
    for (fragment, value) in conditions(filter) {
        sql.push_str(&fragment);
        if let Some(value) = value {
            sql.push_str(&value.literal());
        }
    }
    sql
}

/// The rows of the audit CSV export matching `filter`, newest first, as
/// one `COPY … TO STDOUT` whose rows PostgreSQL writes as CSV itself: the
/// cells are [`crate::audit::csv::COPY_COLUMNS`], formulas neutralised
/// in the query. Only calls of a decision this build knows are exported,
/// as on the page.
pub fn export_copy(filter: &AuditFilter) -> String {
    let known: Vec<String> = Decision::ALL
        .iter()
        .map(|d| format!("'{}'", d.as_str()))
        .collect();
    format!(
        "COPY (SELECT {} FROM audit_log a LEFT JOIN vault_keys k ON k.id = a.vault_key_id{} \
         AND a.decision IN ({}) ORDER BY a.at DESC, a.id DESC) TO STDOUT (FORMAT csv)",
        crate::audit::csv::copy_columns(),
        inline_filter(filter),
        known.join(", ")
    )
}

/// One page of calls matching `query`, newest first, and the links to the
/// pages around it (keyset paging: never OFFSET).
#[tracing::instrument(skip_all)]
pub async fn page(
    db: impl PgExecutor<'_>,
    query: &AuditQuery,
    filter: &AuditFilter,
) -> Result<AuditPage, sqlx::Error> {
    let mut sql = QueryBuilder::new(format!(
        "SELECT {CALL_COLUMNS} FROM audit_log a LEFT JOIN vault_keys k ON k.id = a.vault_key_id"
    ));
    push_filter(&mut sql, filter);
    keyset::push_page(&mut sql, filter.cursor, filter.limit);
    let rows: Vec<CallListRow> = sql.build_query_as().fetch_all(db).await?;
    let mut calls: Vec<AuditCall> = rows.into_iter().map(CallListRow::call).collect();
    let (newer, older) = keyset::settle(&mut calls, filter.cursor, filter.limit, |c| Position {
        at: c.at,
        id: c.id.0,
    });
    let (newer, older) = (
        newer.map(|c| query.at(Some(c))),
        older.map(|c| query.at(Some(c))),
    );
    Ok(AuditPage {
        calls,
        newer,
        older,
    })
}

/// An audit row as [`page`] selects it.
#[derive(sqlx::FromRow)]
pub struct CallListRow {
    id: AuditId,
    at: chrono::DateTime<chrono::Utc>,
    vault_key_id: Option<VaultKeyId>,
    key_label: Option<String>,
    key_prefix: Option<String>,
    method: String,
    path: String,
    stripe_customer: Option<String>,
    metadata_customer_id: Option<String>,
    billing_period: Option<BillingPeriod>,
    amount_cents: Option<Cents>,
    /// As the call named it: a refused call's may be no currency at all.
    currency: Option<String>,
    idempotency_key: Option<String>,
    decision: Decision,
    upstream_status: Option<i16>,
    stripe_object_id: Option<String>,
    error_code: Option<String>,
    latency_ms: Option<i32>,
}

impl CallListRow {
    /// The call; a currency that is not one (a refused call's junk) shows
    /// as none, as the amount then has no currency to be read in.
    pub fn call(self) -> AuditCall {
        AuditCall {
            decision: self.decision,
            id: self.id,
            at: self.at,
            vault_key_id: self.vault_key_id,
            key_label: self.key_label,
            key_prefix: self.key_prefix,
            method: self.method,
            path: self.path,
            stripe_customer: self.stripe_customer,
            metadata_customer_id: self.metadata_customer_id,
            billing_period: self.billing_period,
            amount: self.amount_cents,
            currency: self.currency.and_then(|c| Currency::parse(&c).ok()),
            idempotency_key: self.idempotency_key,
            upstream_status: self.upstream_status,
            stripe_object_id: self.stripe_object_id,
            error_code: self.error_code,
            latency_ms: self.latency_ms,
        }
    }
}

/// The charges the cap refused on `key` that no later allowed call with
/// the same Idempotency-Key got through. A refusal retried under one
/// Idempotency-Key is one charge; the latest 1,000 refusals are counted.
#[tracing::instrument(skip_all)]
pub async fn refused_waiting(
    db: impl PgExecutor<'_>,
    key: VaultKeyId,
) -> Result<RefusedCharges, sqlx::Error> {
    let (charges, total): (i64, i64) = sqlx::query_as(
        "WITH refused AS (
             SELECT id, idempotency_key, amount_cents FROM audit_log
             WHERE vault_key_id = $1 AND decision = 'refused_cap' AND amount_cents IS NOT NULL
             ORDER BY at DESC, id DESC LIMIT 1000
         ), charges AS (
             SELECT DISTINCT ON (COALESCE(idempotency_key, 'call ' || id)) idempotency_key, amount_cents
             FROM refused ORDER BY COALESCE(idempotency_key, 'call ' || id), id DESC
         )
         SELECT count(*), COALESCE(sum(amount_cents), 0)::bigint FROM charges c
         WHERE c.idempotency_key IS NULL OR NOT EXISTS (
             SELECT 1 FROM audit_log a
             WHERE a.idempotency_key = c.idempotency_key AND a.vault_key_id = $1 AND a.decision = 'allowed')",
    )
    .bind(key)
    .fetch_one(db)
    .await?;
    Ok(RefusedCharges {
        charges,
        total: Cents(total),
    })
}

/// One call with everything recorded about it.
#[tracing::instrument(skip_all)]
pub async fn find(
    db: impl PgExecutor<'_>,
    id: AuditId,
) -> Result<Option<AuditCallDetail>, sqlx::Error> {
    let row: Option<DetailRow> = sqlx::query_as(&format!(
        "SELECT {CALL_COLUMNS}, a.request_id::text AS request_id, a.metadata_billing_period, a.message
         FROM audit_log a LEFT JOIN vault_keys k ON k.id = a.vault_key_id WHERE a.id = $1"
    ))
    .bind(id)
    .fetch_optional(db)
    .await?;
    Ok(row.map(|row| AuditCallDetail {
        call: row.call.call(),
        request_id: row.request_id,
        metadata_billing_period: row.metadata_billing_period,
        message: row.message,
    }))
}

#[derive(sqlx::FromRow)]
struct DetailRow {
    #[sqlx(flatten)]
    call: CallListRow,
    request_id: String,
    metadata_billing_period: Option<String>,
    message: Option<String>,
}
