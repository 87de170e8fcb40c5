//! The Prometheus exporter of the `tailrace` application: installing the process-wide
//! recorder with real histograms (`_bucket{le=..}`, not the exporter's default summaries,
//! which cannot be aggregated across labels or instances), and the process's own metrics.

use metrics::gauge;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use ingest::telemetry::{BUILD_INFO, PROCESS_CPU, START_TIME};

/// Latency buckets: 10 µs to 10 s, about three per decade.
pub const LATENCY_BUCKETS: [f64; 19] = [
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Installs the process-wide recorder (once) and describes every metric.
pub fn install(engine: &str) -> Result<PrometheusHandle, String> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_latency_seconds".into()), &LATENCY_BUCKETS)
        .map_err(|e| e.to_string())?
        .install_recorder()
        .map_err(|e| format!("installing the metrics recorder: {e}"))?;
    ingest::telemetry::describe();
    feeds::telemetry::describe();
    metrics_process::Collector::default().describe();
    gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION"), "engine" => engine.to_string())
        .set(1.0);
    gauge!(START_TIME).set(store::clock::now_us() as f64 / 1e6);
    Ok(handle)
}

/// The process's own resources: the standard `process_*` metrics (resident and virtual memory,
/// CPU seconds, open and maximum file descriptors, threads, start time) from `metrics-process`,
/// plus [`PROCESS_CPU`].
///
/// Why the extra gauge: `metrics` counters are integers, so `process_cpu_seconds_total` moves in
/// whole seconds, and `rate()` of it over a short window shows a process at 5% CPU as 0% with
/// a spike every 20 s. The crate reads CPU time in clock ticks (10 ms), so the usage between two
/// collections is exact to that; it is published as a gauge.
pub struct Process {
    collector: metrics_process::Collector,
    cpu: metrics::Gauge,
    /// When the last collection ran and the CPU seconds it read.
    last: Option<(std::time::Instant, f64)>,
}

impl Process {
    /// Registers the metrics (after [`install`]).
    pub fn new() -> Self {
        Process {
            collector: metrics_process::Collector::default(),
            cpu: gauge!(PROCESS_CPU),
            last: None,
        }
    }

    /// Reads /proc once more and updates every process metric (call every few seconds).
    pub fn collect(&mut self) {
        self.collector.collect();
        let Some(cpu) = metrics_process::collector::collect().cpu_seconds_total else {
            return;
        };
        let now = std::time::Instant::now();
        if let Some((at, before)) = self.last {
            let wall = now.duration_since(at).as_secs_f64();
            if wall > 0.0 {
                self.cpu.set(((cpu - before) / wall).max(0.0));
            }
        }
        self.last = Some((now, cpu));
    }
}

impl Default for Process {
    fn default() -> Self {
        Self::new()
    }
}
