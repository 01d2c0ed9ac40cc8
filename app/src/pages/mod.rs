//! One file per page.

mod action_log;
mod alerts;
mod api_tokens;
mod approvals;
mod audit_call;
mod audit_log;
mod bulk_resolve;
mod cap_increase;
mod finding;
mod invite;
mod key;
mod login;
mod new_key;
mod not_found;
mod operators;
mod overview;
mod reconciliation;
mod vault_keys;

pub use action_log::ActionLogPage;
pub use alerts::AlertsPage;
pub use api_tokens::ApiTokensPage;
pub use approvals::ApprovalsPage;
pub use audit_call::AuditCallPage;
pub use audit_log::AuditLogPage;
pub use bulk_resolve::BulkResolvePage;
pub use cap_increase::CapIncreasePage;
pub use finding::FindingPage;
pub use invite::InvitePage;
pub use key::KeyPage;
pub use login::LoginPage;
pub use new_key::NewKeyPage;
pub use not_found::NotFoundPage;
pub use operators::OperatorsPage;
pub use overview::OverviewPage;
pub use reconciliation::ReconciliationPage;
pub use vault_keys::VaultKeysPage;
