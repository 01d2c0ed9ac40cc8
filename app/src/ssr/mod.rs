//! Everything that only runs on the server.

pub mod charts;
pub mod flash;
pub mod keyset;
mod reads;
pub mod secrets;
mod state;

pub use reads::Reads;
pub use state::{AppState, AuthConfig, CapIncreaseRules};
