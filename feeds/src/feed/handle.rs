//! A running feed as seen from outside: its status, a window of notification latencies, and a
//! live stream of the events it holds.

use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde_json::Value;
use tokio::sync::broadcast;

use super::FeedPosition;
use crate::stats::Snapshot;

/// What a feed shows the API and the status line; refreshed every checkpoint interval.
#[derive(Clone, Debug, Default, Serialize)]
pub struct FeedStatus {
    /// Feed name.
    pub name: String,
    /// Feed kind.
    pub kind: String,
    /// Events processed since the feed was created (kept across restarts).
    pub events: u64,
    /// The latest statistics.
    pub stats: Option<Snapshot>,
    /// Entries behind the newest write, when known.
    pub lag: Option<u64>,
    /// Seconds the feed could stop before its resume point is evicted, when known.
    pub resume_headroom_secs: Option<f64>,
    /// The last position (tailable) or resume token (changes) processed.
    pub position: Option<FeedPosition>,
    /// Stream restarts in this process.
    pub restarts: u64,
    /// Gaps recorded in this process.
    pub gaps: u64,
}

/// A running feed, as seen from outside: status, a latency window, a live event stream.
#[derive(Clone)]
pub struct FeedHandle {
    /// Feed name.
    pub name: String,
    /// Feed kind (`tailable`, `changes`, ...).
    pub kind: &'static str,
    pub(super) status: Arc<Mutex<FeedStatus>>,
    /// Notification latencies (µs) since the status line last took them.
    pub(super) latency_us: Arc<Mutex<hdrhistogram::Histogram<u64>>>,
    pub(super) events: broadcast::Sender<Arc<Value>>,
}

impl FeedHandle {
    pub(super) fn new(
        name: &str,
        kind: &'static str,
        status: FeedStatus,
    ) -> Result<Self, hdrhistogram::CreationError> {
        let (events, _) = broadcast::channel(1024);
        Ok(FeedHandle {
            name: name.to_string(),
            kind,
            status: Arc::new(Mutex::new(status)),
            // 1 µs .. 60 s at 2 significant digits: a few KB, whatever the traffic.
            latency_us: Arc::new(Mutex::new(hdrhistogram::Histogram::new_with_bounds(
                1, 60_000_000, 2,
            )?)),
            events,
        })
    }

    /// The latest status.
    pub fn status(&self) -> FeedStatus {
        self.status.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// The median notification latency (µs) and sample count since the last call; resets the
    /// window (for the periodic status line).
    pub fn take_latency_p50_us(&self) -> Option<(u64, u64)> {
        let mut h = self.latency_us.lock().ok()?;
        let n = h.len();
        let out = (n > 0).then(|| (h.value_at_quantile(0.5), n));
        h.reset();
        out
    }

    /// Every event the feed holds from now on, as JSON: the record's or change's fields as
    /// `store` writes them (`collection`, `key`, `doc`, `op`, ...) with `feed` and `position`; a slow
    /// subscriber misses events (the receiver reports how many) but never slows the feed.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Value>> {
        self.events.subscribe()
    }

    pub(super) fn update(&self, f: impl FnOnce(&mut FeedStatus)) {
        if let Ok(mut s) = self.status.lock() {
            f(&mut s);
        }
    }
}
