//! Vaultcap over HTTP (console, key API, proxy), driven through the real router against a
//! real PostgreSQL database (one fresh database per test, from
//! `DATABASE_URL`).

mod fake_stripe;
mod helpers;
mod key_policy;

mod access;
mod alerts;
mod audit;
mod audit_partitions;
mod auth;
mod cap_increases;
mod demo;
mod duplicate_guard;
mod fleet;
mod hostile;
mod key_api;
mod key_pages;
mod ledger;
mod new_key;
mod operators;
mod pages;
mod payment_intents;
mod period_close;
mod properties;
mod proxy;
mod reconciliation;
mod schema;
mod stripe_sync;
mod stripe_webhooks;
mod tamper_evidence;
mod two_factor;
mod unknown_outcomes;
