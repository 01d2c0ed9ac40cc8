//! The Vaultcap console: pages, components and server functions (this crate
//! is compiled twice: with `ssr` into the server, with `hydrate` into the
//! browser bundle), plus the domain types both sides share.

// Leptos views nest deeply in their types; the key page passes the default limit.
#![recursion_limit = "256"]

pub mod app;
pub mod components;
pub mod domain;
pub mod error;
pub mod pages;
pub mod server_fns;

/// Server-only code: database access, authentication, shared state.
#[cfg(feature = "ssr")]
pub mod ssr;

/// The browser bundle's entry point: take over the server-rendered page.
#[cfg(feature = "hydrate")]
#[wasm_bindgen::prelude::wasm_bindgen]
pub fn hydrate() {
    console_error_panic_hook::set_once();
    leptos::mount::hydrate_body(app::App);
}
