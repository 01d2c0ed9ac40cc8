use leptos::prelude::*;

use crate::{
    domain::{ActionPage, ActionQuery, AuditCallDetail, AuditPage, AuditQuery, LogIntegrity},
    error::AppError,
};

/// One page of the audit log, filtered as the query asks.
#[server(endpoint = "list_audit")]
pub async fn list_audit(query: AuditQuery) -> Result<AuditPage, AppError> {
    use crate::{domain::Role, ssr};
    crate::operators::auth::require(Role::Viewer)?;
    let filter = query.parse()?;
    let pool = &expect_context::<ssr::AppState>().reads.pool;
    Ok(crate::audit::sql::page(pool, &query, &filter).await?)
}

/// One call with everything recorded about it.
#[server(endpoint = "get_audit_call")]
pub async fn get_audit_call(id: crate::domain::AuditId) -> Result<AuditCallDetail, AppError> {
    use crate::{domain::Role, ssr};
    crate::operators::auth::require(Role::Viewer)?;
    let pool = &expect_context::<ssr::AppState>().reads.pool;
    crate::audit::sql::find(pool, id)
        .await?
        .ok_or(AppError::NotFound)
}

/// One page of the operator action log.
#[server(endpoint = "list_actions")]
pub async fn list_actions(query: ActionQuery) -> Result<ActionPage, AppError> {
    use crate::{domain::Role, ssr};
    crate::operators::auth::require(Role::Viewer)?;
    let filter = query.parse()?;
    let pool = &expect_context::<ssr::AppState>().reads.pool;
    Ok(crate::actions::sql::page(pool, &query, &filter).await?)
}

/// The audit log's tamper evidence: its hash chain's last check and whether
/// the application's database role could rewrite it.
#[server(endpoint = "audit_integrity")]
pub async fn audit_integrity() -> Result<LogIntegrity, AppError> {
    use crate::{domain::Role, ssr};
    crate::operators::auth::require(Role::Viewer)?;
    let pool = &expect_context::<ssr::AppState>().pool;
    let protection = crate::audit::chain_sql::log_protection(pool).await?;
    Ok(LogIntegrity {
        chain: crate::audit::chain_sql::status(pool).await?,
        role: protection.role,
        role_can_rewrite: protection.can_rewrite,
    })
}
