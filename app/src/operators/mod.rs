//! Operators and access: roles, sign-in, invitations, the second
//! factor, API tokens and their scopes, and the failed sign-ins that
//! slow an attacker down.

#[cfg(feature = "ssr")]
pub mod accounts;
pub mod api_scope;
#[cfg(feature = "ssr")]
pub mod auth;
pub mod email;
#[cfg(feature = "ssr")]
pub mod login_failures;
pub mod role;
#[cfg(feature = "ssr")]
pub mod second_factor;
#[cfg(feature = "ssr")]
pub mod sql;
#[cfg(feature = "ssr")]
pub mod tokens;
#[cfg(feature = "ssr")]
pub mod tokens_sql;
pub mod two_factor;

use serde::{Deserialize, Serialize};

use crate::domain::{OperatorId, Role};

/// An operator as the Operators page lists them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorSummary {
    pub id: OperatorId,
    pub email: String,
    pub role: Role,
    pub disabled: bool,
    pub created_at: chrono::DateTime<chrono::Utc>,
}
