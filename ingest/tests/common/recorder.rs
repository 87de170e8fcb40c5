//! The process's metrics recorder, read back through the exposition parser.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use super::Metrics;

/// The process's metrics recorder (installed before any source that counts starts).
pub fn recorder() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let h = PrometheusBuilder::new().install_recorder().unwrap();
        ingest::telemetry::describe();
        h
    })
}

/// The sum of the samples of `name` whose labels include every one of `labels` (0 when none).
pub fn metric(name: &str, labels: &[(&str, &str)]) -> f64 {
    Metrics::parse(&recorder().render()).sum(name, labels)
}
