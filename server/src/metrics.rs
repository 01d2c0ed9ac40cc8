//! Prometheus metrics at `/metrics`: what a dashboard of the proxy needs.
//!
//! * `vaultcap_proxy_calls_total{decision}`: calls by audit decision;
//! * `vaultcap_upstream_latency_seconds`: time Stripe took to answer;
//! * `vaultcap_ledger_failures_total{step}`: database failures while
//!   checking, reserving or settling (each one a refused or unsettled call).

use std::{sync::OnceLock, time::Duration};

use app::domain::Decision;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the process-wide recorder (once; later calls reuse it).
pub fn install() -> &'static PrometheusHandle {
    HANDLE.get_or_init(|| {
        PrometheusBuilder::new()
            .set_buckets_for_metric(
                Matcher::Full("vaultcap_upstream_latency_seconds".into()),
                &[
                    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                ],
            )
            .expect("valid buckets")
            .install_recorder()
            .expect("the metrics recorder is installed once per process")
    })
}

/// The text exposition, if the recorder is installed.
pub fn render() -> Option<String> {
    HANDLE.get().map(|handle| {
        // Histogram samples are buffered until upkeep folds them in.
        handle.run_upkeep();
        handle.render()
    })
}

pub fn call_decided(decision: Decision) {
    metrics::counter!("vaultcap_proxy_calls_total", "decision" => decision.as_str()).increment(1);
}

pub fn upstream_answered(latency: Duration) {
    metrics::histogram!("vaultcap_upstream_latency_seconds").record(latency.as_secs_f64());
}

pub fn ledger_failed(step: &'static str) {
    metrics::counter!("vaultcap_ledger_failures_total", "step" => step).increment(1);
}
