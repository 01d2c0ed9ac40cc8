//! Background work `vaultcap serve` runs beside the HTTP server.

pub mod notifier;
pub mod unknown_outcomes;
