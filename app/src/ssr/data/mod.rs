//! SQL, one module per entity. Functions take an executor (a pool, a
//! connection or a transaction) so callers choose the transaction boundary.

pub mod actions;
pub mod alerts;
pub mod api_tokens;
pub mod audit;
pub mod audit_chain;
pub mod billing_records;
pub mod call_stats;
pub mod cap_increases;
pub mod findings;
pub mod key_requests;
pub mod keyset;
pub mod login_failures;
pub mod operators;
pub mod period_closes;
pub mod spend;
pub mod stripe_charges;
pub mod vault_keys;
