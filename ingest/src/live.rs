//! The `ingest` statistics document: what the live page (and any client of
//! `/api/changes?collection=stats`) shows about ingestion, written once a second into the
//! keyed `stats` collection beside the feeds' documents:
//!
//! ```json
//! {"rate": 70.2, "written": 12345, "rejected": 3, "queue_depth": 0,
//!  "write_us": {"journaled": {"p50": 740, "p99": 1400, "count": 71}}, "updated_us": 1733000000000000}
//! ```
//!
//! `write_us` holds the latency of the ingester's `events` writes of the last second, per
//! durability level, told by the ingester ([`WriteObserver`]): a window of its own (the status
//! line resets the ingester's).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};
use store::{Durability, Keyed};
use tokio_util::sync::CancellationToken;

use crate::ingester::{IngestStats, WriteObserver};

/// The key of the document in `stats`.
pub const INGEST_KEY: &str = "ingest";
/// How often it is written.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// Append latencies (µs) per durability level since the last document.
#[derive(Default)]
pub struct WriteTimes(Mutex<BTreeMap<Durability, hdrhistogram::Histogram<u64>>>);

impl WriteTimes {
    fn record(&self, d: Durability, us: u64) {
        let Ok(mut by_level) = self.0.lock() else {
            return;
        };
        let h = match by_level.entry(d) {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(v) => {
                // 1 µs .. 60 s at 2 significant digits: a few KB per level.
                match hdrhistogram::Histogram::new_with_bounds(1, 60_000_000, 2) {
                    Ok(h) => v.insert(h),
                    Err(_) => return,
                }
            }
        };
        let _ = h.record(us.max(1));
    }

    /// `{level: {p50, p99, count}}` of the window, then a new window. A level that wrote
    /// nothing in it is left out (no sample is not a latency of zero).
    fn take(&self) -> Map<String, Value> {
        let mut out = Map::new();
        if let Ok(mut by_level) = self.0.lock() {
            for (d, h) in by_level.iter_mut() {
                let q = feeds::feed::take_quantiles(h);
                if !q.is_null() {
                    out.insert(d.as_str().into(), q);
                }
            }
        }
        out
    }
}

impl WriteObserver for WriteTimes {
    fn events_written(&self, _events: usize, durability: Durability, latency: Duration) {
        self.record(durability, latency.as_micros() as u64);
    }
}

/// Writes the `ingest` document every [`INTERVAL`] until `stop`. A failed write is logged
/// and the next second tries again (the page shows the numbers as stale meanwhile).
pub async fn publish(
    stats: Arc<dyn Keyed>,
    ingest: Arc<IngestStats>,
    times: Arc<WriteTimes>,
    durability: Durability,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let mut last = (Instant::now(), ingest.written.load(Ordering::Relaxed));
    let mut failing = false;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let written = ingest.written.load(Ordering::Relaxed);
        let secs = last.0.elapsed().as_secs_f64().max(1e-3);
        let rate = (written - last.1).max(0) as f64 / secs;
        last = (Instant::now(), written);
        let doc = json!({
            "rate": (rate * 10.0).round() / 10.0,
            "written": written,
            "rejected": ingest.rejected.load(Ordering::Relaxed),
            "queue_depth": ingest.queue_depth.load(Ordering::Relaxed).max(0),
            "durability": durability.as_str(),
            "write_us": times.take(),
            "updated_us": store::clock::now_us(),
        });
        let Value::Object(doc) = doc else { continue };
        match stats.set(INGEST_KEY, doc, Durability::Acknowledged).await {
            Ok(()) if failing => {
                failing = false;
                tracing::info!("the ingest statistics document is written again");
            }
            Ok(()) => {}
            Err(e) => {
                let problem = crate::telemetry::Problem {
                    component: "ingest_document",
                    error_type: "store_write",
                    detail: &format!(
                        "cannot write the ingest statistics document ({e}); retrying every second"
                    ),
                };
                // Logged once until it is written again; counted every time.
                if failing {
                    problem.count();
                } else {
                    failing = true;
                    problem.warn();
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn write_times_are_windows_per_level() {
        let t = WriteTimes::default();
        for us in [100, 200, 300, 400, 10_000] {
            t.record(Durability::Journaled, us);
        }
        t.record(Durability::Acknowledged, 50);
        let w = Value::Object(t.take());
        assert_eq!(w["journaled"]["count"], json!(5));
        let (p50, p99) = (
            w["journaled"]["p50"].as_u64().unwrap(),
            w["journaled"]["p99"].as_u64().unwrap(),
        );
        assert!(
            (295..=305).contains(&p50) && (9_900..=10_100).contains(&p99),
            "p50 ~300 µs and p99 ~10 ms at 2 significant digits; saw {w}"
        );
        assert_eq!(w["acknowledged"]["count"], json!(1));
        assert!(
            t.take().is_empty(),
            "a new window; a level without writes is left out, not reported as 0"
        );
    }
}
