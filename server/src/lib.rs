//! The Vaultcap server: the console's HTTP host, the command line, and the
//! database plumbing (migrations, the private PostgreSQL cluster).

pub mod cli;
pub mod config;
pub mod db;
pub mod embedded_pg;
pub mod http;
