//! The operator action log: who did what, when. Append-only.

use std::net::IpAddr;

use sqlx::{PgExecutor, Postgres, QueryBuilder};

use crate::domain::{
    ActionEntry, ActionFilter, ActionPage, ActionQuery, ApiTokenId, OperatorId, Position,
};
use crate::ssr::keyset;

/// Who performed an action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Actor {
    /// A signed-in operator in the console.
    Operator { id: OperatorId, ip: Option<IpAddr> },
    /// A billing job or tool with an API token, from this address.
    ApiToken { id: ApiTokenId, ip: Option<IpAddr> },
    /// Someone not signed in, at the console (a failed sign-in).
    Visitor { ip: Option<IpAddr> },
    /// The `vaultcap` command line on the server host.
    Cli,
    /// Vaultcap itself (bootstrap, sweeps).
    System,
}

#[tracing::instrument(skip_all)]
pub async fn record(
    db: impl PgExecutor<'_>,
    actor: Actor,
    action: &str,
    subject_type: &str,
    subject_id: Option<String>,
    details: serde_json::Value,
) -> Result<(), sqlx::Error> {
    let (operator_id, api_token_id, via, ip) = match actor {
        Actor::Operator { id, ip } => (Some(id), None, "console", ip),
        Actor::ApiToken { id, ip } => (None, Some(id), "api", ip),
        Actor::Visitor { ip } => (None, None, "console", ip),
        Actor::Cli => (None, None, "cli", None),
        Actor::System => (None, None, "system", None),
    };
    sqlx::query(
        "INSERT INTO operator_actions (operator_id, api_token_id, via, ip, action, subject_type, subject_id, details)
         VALUES ($1, $2, $3, $4::inet, $5, $6, $7, $8)",
    )
    .bind(operator_id)
    .bind(api_token_id)
    .bind(via)
    .bind(ip.map(|ip| ip.to_string()))
    .bind(action)
    .bind(subject_type)
    .bind(subject_id)
    .bind(details)
    .execute(db)
    .await?;
    Ok(())
}

/// The actions on one subject (`finding` 12), oldest first.
#[tracing::instrument(skip_all)]
pub async fn for_subject(
    db: impl sqlx::PgExecutor<'_>,
    subject_type: &str,
    subject_id: &str,
) -> Result<Vec<ActionEntry>, sqlx::Error> {
    sqlx::query_as(&format!(
        "{SELECT_ENTRY} WHERE a.subject_type = $1 AND a.subject_id = $2 ORDER BY a.at, a.id LIMIT 200"
    ))
    .bind(subject_type)
    .bind(subject_id)
    .fetch_all(db)
    .await
}

/// The actions on a billing period, its keys and its findings (the ones
/// `report` lists), newest first, at most 200.
#[tracing::instrument(skip_all)]
pub async fn for_period(
    db: impl sqlx::PgExecutor<'_>,
    period: crate::domain::BillingPeriod,
    report: &crate::domain::PeriodReport,
) -> Result<Vec<ActionEntry>, sqlx::Error> {
    let keys: Vec<String> = report.keys.iter().map(|k| k.id.to_string()).collect();
    let findings: Vec<String> = report.findings.iter().map(|f| f.id.to_string()).collect();
    sqlx::query_as(&format!(
        "{SELECT_ENTRY} WHERE (a.subject_type = 'billing_period' AND a.subject_id = $1)
            OR (a.subject_type = 'vault_key' AND a.subject_id = ANY($2))
            OR (a.subject_type = 'finding' AND a.subject_id = ANY($3))
         ORDER BY a.at DESC, a.id DESC LIMIT 200"
    ))
    .bind(period.to_string())
    .bind(keys)
    .bind(findings)
    .fetch_all(db)
    .await
}

/// An action as the console lists it; `a` is operator_actions.
const SELECT_ENTRY: &str = "SELECT a.id, a.at, COALESCE(o.email, 'API token ' || t.name, CASE a.via WHEN 'cli' THEN 'command line' WHEN 'console' THEN 'not signed in' ELSE 'Vaultcap' END) AS who,
        a.via, host(a.ip) AS ip, a.action, a.subject_type, a.subject_id,
        COALESCE(a.details->>'currency', k.currency) AS currency,
        ARRAY(SELECT d.key FROM jsonb_each_text(a.details) d WHERE d.value IS NOT NULL ORDER BY d.key) AS detail_names,
        ARRAY(SELECT d.value FROM jsonb_each_text(a.details) d WHERE d.value IS NOT NULL ORDER BY d.key) AS detail_values
     FROM operator_actions a
     LEFT JOIN operators o ON o.id = a.operator_id
     LEFT JOIN api_tokens t ON t.id = a.api_token_id
     LEFT JOIN vault_keys k ON k.id = CASE WHEN a.subject_type = 'vault_key' THEN a.subject_id::bigint END";

/// One page of the action log matching `filter`, newest first, with the
/// links around it (keyset paging on `(at, id)`).
#[tracing::instrument(skip_all)]
pub async fn page(
    db: &sqlx::PgPool,
    query: &ActionQuery,
    filter: &ActionFilter,
) -> Result<ActionPage, sqlx::Error> {
    let mut sql = QueryBuilder::<Postgres>::new(format!("{SELECT_ENTRY} WHERE true"));
    if let Some(from) = filter.from {
        sql.push(" AND a.at >= ").push_bind(from);
    }
    if let Some(to) = filter.to {
        sql.push(" AND a.at < ").push_bind(to);
    }
    if let Some(email) = &filter.operator {
        sql.push(" AND a.operator_id = (SELECT id FROM operators WHERE lower(email) = ")
            .push_bind(email.clone())
            .push(")");
    }
    if let Some(action) = &filter.action {
        sql.push(" AND a.action = ").push_bind(action.clone());
    }
    if let Some(via) = filter.via {
        sql.push(" AND a.via = ").push_bind(via);
    }
    keyset::push_page(&mut sql, filter.cursor, filter.limit);
    let mut actions: Vec<ActionEntry> = sql.build_query_as().fetch_all(db).await?;
    let (newer, older) = keyset::settle(&mut actions, filter.cursor, filter.limit, |a| Position {
        at: a.at,
        id: a.id,
    });
    let (newer, older) = (
        newer.map(|c| query.at(Some(c))),
        older.map(|c| query.at(Some(c))),
    );
    let known_actions =
        sqlx::query_scalar("SELECT DISTINCT action FROM operator_actions ORDER BY 1")
            .fetch_all(db)
            .await?;
    Ok(ActionPage {
        actions,
        newer,
        older,
        known_actions,
    })
}
