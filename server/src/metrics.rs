//! Prometheus metrics at `/metrics`: what a dashboard of the proxy needs.
//!
//! * `vaultcap_proxy_calls_total{decision}`: calls by audit decision;
//! * `vaultcap_upstream_latency_seconds`: time Stripe took to answer;
//! * `vaultcap_ledger_failures_total{step}`: database failures while
//!   checking, reserving or settling (each one a refused or unsettled call);
//! * `vaultcap_ledger_batch_calls{kind}` and
//!   `vaultcap_ledger_batch_seconds{kind}`: how many calls each ledger write
//!   carried and how long it took, commit included (`kind` is `reserve` or
//!   `record`): where a call's time in the database goes;
//! * `vaultcap_ledger_write_seconds`: each turn of the ledger writer, both
//!   kinds together; the rate of its sum is how busy the one writer is
//!   (near 1, it is what bounds the proxy's throughput).

use std::{sync::OnceLock, time::Duration};

use app::domain::Decision;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Buckets for the ledger's write times: a lone call's write is under a
/// millisecond, a full batch's a few.
const LEDGER_SECONDS: &[f64] = &[
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

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
            .set_buckets_for_metric(
                Matcher::Full("vaultcap_ledger_batch_calls".into()),
                &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0],
            )
            .expect("valid buckets")
            .set_buckets_for_metric(
                Matcher::Full("vaultcap_ledger_batch_seconds".into()),
                LEDGER_SECONDS,
            )
            .expect("valid buckets")
            .set_buckets_for_metric(
                Matcher::Full("vaultcap_ledger_write_seconds".into()),
                LEDGER_SECONDS,
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

pub fn ledger_batch_written(kind: &'static str, calls: usize, took: Duration) {
    metrics::histogram!("vaultcap_ledger_batch_calls", "kind" => kind).record(calls as f64);
    metrics::histogram!("vaultcap_ledger_batch_seconds", "kind" => kind).record(took.as_secs_f64());
}

/// One turn of the ledger writer (`took`: from taking the waiting calls to
/// answering them).
pub fn ledger_written(took: Duration) {
    metrics::histogram!("vaultcap_ledger_write_seconds").record(took.as_secs_f64());
}
