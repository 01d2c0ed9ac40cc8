//! Server functions: each authenticates, makes one call into its feature's
//! `sql` or `rules` (e.g. `crate::alerts::sql`), and maps the result. Mutations are plain HTML forms
//! handled by the server crate, so every page works without JavaScript.

mod alerts;
mod audit;
mod cap_increases;
mod me;
mod operators;
mod overview;
mod periods;
mod reads;
mod reconciliation;
mod tokens;
mod two_factor;
mod vault_keys;

pub use alerts::{list_alerts, open_alert_count, ListAlerts, OpenAlertCount};
pub use audit::{
    audit_integrity, get_audit_call, list_actions, list_audit, AuditIntegrity, GetAuditCall,
    ListActions, ListAudit,
};
pub use cap_increases::{
    get_approval_preview, get_cap_increase_form, get_key_request_preview, list_approvals,
    pending_approval_count, GetApprovalPreview, GetCapIncreaseForm, GetKeyRequestPreview,
    ListApprovals, PendingApprovalCount,
};
pub use me::{get_me, take_notice, GetMe, TakeNotice};
pub use operators::{list_operators, ListOperators};
pub use overview::{get_overview, GetOverview};
pub use periods::{get_period_close, GetPeriodClose};
pub use reads::{get_replica_lag, GetReplicaLag};
pub use reconciliation::{
    get_finding, get_reconciliation, preview_bulk, GetFinding, GetReconciliation, PreviewBulk,
};
pub use tokens::{list_api_tokens, ListApiTokens};
pub use two_factor::{get_two_factor, GetTwoFactor};
pub use vault_keys::{
    get_vault_key, list_vault_keys, new_key_form, GetVaultKey, ListVaultKeys, NewKeyForm,
};
