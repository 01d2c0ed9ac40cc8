//! The audit log: every proxied call, its filters (`query`, declared
//! once for the page, the export and the API), its hash chain, its SQL
//! and its CSV export.

pub mod chain;
#[cfg(feature = "ssr")]
pub mod chain_sql;
#[cfg(feature = "ssr")]
pub mod csv;
pub mod query;
#[cfg(feature = "ssr")]
pub mod sql;
