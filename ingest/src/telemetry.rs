//! Metrics of the ingest side, and installing the Prometheus recorder for the process.
//!
//! Histograms are real Prometheus histograms (`_bucket{le=..}`), not the exporter's default
//! summaries: summaries cannot be aggregated across labels or instances.

use metrics::{Unit, describe_counter, describe_gauge, describe_histogram, gauge};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Events read, by source.
pub const SOURCE_EVENTS: &str = "tailrace_source_events_total";
/// Bad records kept as dead letters, by source and reason.
pub const REJECTED: &str = "tailrace_events_rejected_total";
/// Reconnects of http sources and restarts of command sources, by source and reason.
pub const SOURCE_RECONNECTS: &str = "tailrace_source_reconnects_total";
/// 1 while a source holds a live connection (http) or a running program (command).
pub const SOURCE_CONNECTED: &str = "tailrace_source_connected";
/// Records waiting for the writer.
pub const QUEUE_DEPTH: &str = "tailrace_ingest_queue_depth";
/// From handing a batch to the store to its acknowledgment.
pub const WRITE_LATENCY: &str = "tailrace_write_latency_seconds";
/// Failed write attempts (each is retried).
pub const WRITE_ERRORS: &str = "tailrace_write_errors_total";
/// The newest acknowledged sequence number per source.
pub const LAST_SEQ: &str = "tailrace_source_last_acked_seq";
/// Build information (always 1).
pub const BUILD_INFO: &str = "tailrace_build_info";
/// Process start time.
pub const START_TIME: &str = "tailrace_start_time_seconds";
/// CPU time used per second over the last collection interval (1.0 = one core busy).
pub const PROCESS_CPU: &str = "tailrace_process_cpu_usage_ratio";

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
    describe();
    feeds::telemetry::describe();
    gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION"), "engine" => engine.to_string())
        .set(1.0);
    let start = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    gauge!(START_TIME).set(start);
    Ok(handle)
}

/// Describes the ingest metrics.
pub fn describe() {
    describe_counter!(
        SOURCE_EVENTS,
        "Records read from each source (valid or not)."
    );
    describe_counter!(
        REJECTED,
        "Records rejected and kept as dead letters, by source and reason."
    );
    describe_counter!(
        SOURCE_RECONNECTS,
        "Reconnects of http sources and restarts of command sources, by source and reason (connect_error, http_status, idle_timeout, read_error, closed, exited)."
    );
    describe_gauge!(
        SOURCE_CONNECTED,
        "1 while a source holds a live connection (http) or a running program (command), else 0."
    );
    describe_gauge!(
        QUEUE_DEPTH,
        "Records waiting between the sources and the writer."
    );
    describe_histogram!(
        WRITE_LATENCY,
        Unit::Seconds,
        "Time from handing a batch to the store to its acknowledgment, by engine, collection and durability."
    );
    describe_counter!(
        WRITE_ERRORS,
        "Failed write attempts by collection; each is retried."
    );
    describe_gauge!(
        LAST_SEQ,
        "The newest acknowledged per-source sequence number."
    );
    describe_gauge!(
        BUILD_INFO,
        "Build information: version and engine; always 1."
    );
    describe_gauge!(
        START_TIME,
        Unit::Seconds,
        "Process start time, seconds since the Unix epoch."
    );
    metrics_process::Collector::default().describe();
    describe_gauge!(
        PROCESS_CPU,
        "CPU seconds used per second of wall time over the last collection interval (1.0 = one core busy)."
    );
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
