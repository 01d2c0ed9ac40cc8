//! Vault keys: made from an expected total, capped, listed, followed
//! and revoked. `draft` and `list` are shared with the browser; `rules`
//! (the one check a new key passes, API and console alike), `sql`, and
//! `spend` and `call_stats` (what the ledger says a key spent) run on
//! the server.

#[cfg(feature = "ssr")]
pub mod call_stats;
pub mod draft;
pub mod list;
#[cfg(feature = "ssr")]
pub mod rules;
#[cfg(feature = "ssr")]
pub mod spend;
#[cfg(feature = "ssr")]
pub mod sql;
