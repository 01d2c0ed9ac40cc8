//! The Vaultcap console: pages, components and server functions (this crate
//! is compiled twice: with `ssr` into the server, with `hydrate` into the
//! browser bundle), plus the domain types both sides share.

// Leptos views nest deeply in their types; the key page passes the default limit.
#![recursion_limit = "256"]

pub mod actions;
pub mod alerts;
pub mod app;
pub mod audit;
pub mod cap_increases;
pub mod components;
pub mod domain;
pub mod error;
pub mod key_requests;
pub mod keys;
pub mod operators;
pub mod pages;
pub mod periods;
pub mod reconciliation;
pub mod server_fns;

/// Server-only code: database access, authentication, shared state.
#[cfg(feature = "ssr")]
pub mod ssr;

/// The browser bundle's entry point. The page stays as the server rendered
/// it; Leptos' loader hydrates each `#[island]` in it right after this
/// returns.
#[cfg(feature = "hydrate")]
#[wasm_bindgen::prelude::wasm_bindgen]
pub fn hydrate() {
    console_error_panic_hook::set_once();
    leptos::mount::hydrate_islands();
    // The loader hydrates the islands in microtasks that follow this call,
    // so a task queued now runs once every island is live.
    leptos::prelude::set_timeout(mark_hydrated, std::time::Duration::ZERO);
}

/// Sets `data-hydrated` on `<body>` once the islands are live, so browser
/// tests know when client-side behaviour is there.
#[cfg(feature = "hydrate")]
fn mark_hydrated() {
    if let Some(body) = leptos::prelude::document().body() {
        let _ = body.set_attribute("data-hydrated", "true");
    }
}
