//! The `vaultcap` subcommands.

pub mod audit;
pub mod audit_rows;
pub mod bench;
pub mod demo;
pub mod operator;
pub mod postgres;
pub mod reconcile;
pub mod serve;
pub mod token;

/// Registers the SIGINT and SIGTERM handlers now and resolves when either
/// arrives. Call it before announcing readiness: a handler installed only
/// when the future is first polled would let an early SIGTERM kill the
/// process outright, leaving the private cluster running.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
    let mut interrupt = signal(SignalKind::interrupt()).expect("installing the SIGINT handler");
    async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
    }
}
