//! The Vaultcap server: the console's HTTP host, the spend-cap proxy and the
//! key API, the command line, and the database plumbing (migrations, the
//! private PostgreSQL cluster).

pub mod api;
pub mod audit_archive;
pub mod audit_chain;
pub mod cli;
pub mod config;
pub mod db;
pub mod embedded_pg;
pub mod fleet;
pub mod http;
pub mod jobs;
pub mod metrics;
pub mod proxy;
pub mod reconcile;
pub mod stripe_events;
