//! Everything that only runs on the server.

pub mod accounts;
pub mod auth;
pub mod data;
pub mod flash;
mod state;

pub use state::{AppState, AuthConfig};
