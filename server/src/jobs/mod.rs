//! Background work `vaultcap serve` runs beside the HTTP server.

pub mod notifier;
