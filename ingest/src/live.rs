//! The `ingest` statistics document: what the live page (and any client of
//! `/api/changes?collection=stats`) shows about ingestion, written once a second into the
//! keyed `stats` collection beside the feeds' documents:
//!
//! ```json
//! {"rate": 70.2, "written": 12345, "rejected": 3, "queue_depth": 0,
//!  "write_us": {"journaled": {"p50": 740, "p99": 1400, "count": 71}}, "updated_us": 1733000000000000}
//! ```
//!
//! `write_us` holds the latency of the `events` appends of the last second, per durability
//! level, measured by [`TimedEvents`] around the collection the ingester writes to: a window of
//! its own (the status line resets the ingester's), and without a change to the ingester.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::{Map, Value, json};
use store::{
    Bounds, Capped, Document, Durability, Filter, KeyUpdate, Keyed, NewestMatching, Position,
    Record, RecordStream, Start, Usage,
};
use tokio_util::sync::CancellationToken;

use crate::ingester::IngestStats;

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

/// The `events` collection as the ingester sees it: every `append` is timed into
/// [`WriteTimes`]; everything else is the collection itself.
pub struct TimedEvents {
    inner: Arc<dyn Capped>,
    times: Arc<WriteTimes>,
}

impl TimedEvents {
    /// Wraps `inner`, recording into `times`.
    pub fn new(inner: Arc<dyn Capped>, times: Arc<WriteTimes>) -> Self {
        TimedEvents { inner, times }
    }
}

#[async_trait]
impl Capped for TimedEvents {
    fn name(&self) -> &str {
        self.inner.name()
    }
    async fn append(&self, docs: Vec<Document>, d: Durability) -> store::Result<Vec<Position>> {
        let t = Instant::now();
        let out = self.inner.append(docs, d).await;
        if out.is_ok() {
            self.times.record(d, t.elapsed().as_micros() as u64);
        }
        out
    }
    fn commits_with(&self, keyed: &dyn Keyed) -> bool {
        self.inner.commits_with(keyed)
    }
    async fn append_with_updates(
        &self,
        docs: Vec<Document>,
        keyed: &dyn Keyed,
        updates: Vec<KeyUpdate>,
        d: Durability,
    ) -> store::Result<Vec<Position>> {
        let t = Instant::now();
        let out = self
            .inner
            .append_with_updates(docs, keyed, updates, d)
            .await;
        if out.is_ok() {
            self.times.record(d, t.elapsed().as_micros() as u64);
        }
        out
    }
    fn tail(&self, start: Start) -> RecordStream {
        self.inner.tail(start)
    }
    fn tail_matching(&self, start: Start, filter: Filter) -> RecordStream {
        self.inner.tail_matching(start, filter)
    }
    async fn newest_matching(
        &self,
        filter: &Filter,
        limit: usize,
    ) -> store::Result<NewestMatching> {
        self.inner.newest_matching(filter, limit).await
    }
    async fn get(&self, p: Position) -> store::Result<Option<Record>> {
        self.inner.get(p).await
    }
    async fn latest(&self, f: &str, v: &Value, limit: usize) -> store::Result<Vec<Record>> {
        self.inner.latest(f, v, limit).await
    }
    async fn bounds(&self) -> store::Result<Option<Bounds>> {
        self.inner.bounds().await
    }
    async fn usage(&self) -> store::Result<Usage> {
        self.inner.usage().await
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
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(error = %e, "cannot write the ingest statistics document; retrying every second");
            }
            Err(_) => {}
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
