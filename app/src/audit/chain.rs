//! What the console says about the audit log's tamper evidence: the last
//! check of its hash chain, and whether the application could rewrite it.

use chrono::{DateTime, NaiveDate, Utc};
use serde::{Deserialize, Serialize};

/// The audit log's hash chain, as its checks last found it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChainStatus {
    /// No audit row was ever written.
    Empty,
    /// Rows exist, but no check has run yet.
    NotChecked,
    /// Every row written by the last check (`checked_at`) holds.
    Verified {
        checked_at: DateTime<Utc>,
        rows: i64,
        /// Rows written since the last check (checked within a minute).
        unchecked_rows: i64,
    },
    /// The earliest day whose chain does not hold, and why.
    Broken {
        day: NaiveDate,
        row_id: Option<i64>,
        problem: String,
        checked_at: DateTime<Utc>,
    },
}

/// The audit page's tamper-evidence line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogIntegrity {
    pub chain: ChainStatus,
    /// The database role the application runs as.
    pub role: String,
    /// Whether that role could change or delete audit rows (it owns the
    /// table or is a superuser): then only the chain would show it.
    pub role_can_rewrite: bool,
}
