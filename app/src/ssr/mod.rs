//! Everything that only runs on the server.

pub mod accounts;
pub mod audit_csv;
pub mod auth;
pub mod cap_increases;
pub mod charts;
pub mod data;
pub mod flash;
pub mod key_requests;
pub mod period_close;
pub mod period_pack;
mod reads;
pub mod reconciliation;
pub mod second_factor;
pub mod secrets;
mod state;
pub mod tokens;
pub mod vault_keys;

pub use reads::Reads;
pub use state::{AppState, AuthConfig, CapIncreaseRules};
