//! A feed: a stream from the store, a consumer that recomputes rolling statistics on every
//! event, and a checkpoint (position and statistics saved together) so a restart resumes
//! where it stopped: no gap, and the bands continue.
//!
//! When the store says the feed was overtaken (position lost / history lost), the feed records
//! the gap (a document in `gaps`, counters, one log line) and continues from the oldest
//! retained entry: it neither crash-loops nor skips silently.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::stream::{BoxStream, StreamExt};
use metrics::{Counter, Gauge, Histogram, counter, gauge, histogram};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use store::{
    Capped, Change, ChangeFilter, ChangeStart, Document, Durability, Keyed, Position, Record,
    ResumeToken, Start, Store, StoreError,
};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::sample::{self, Fields};
use crate::stats::{Bands, RollingStats, Snapshot, StatsConfig};
use crate::telemetry as t;

/// The kind of stream a feed reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FeedKind {
    /// A tailable cursor on a capped collection.
    Tailable,
    /// A change stream on changefeed-backed collections.
    Changes,
    /// The op-log watcher (the same changes, read at the log level).
    Oplog,
}

impl FeedKind {
    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            FeedKind::Tailable => "tailable",
            FeedKind::Changes => "changes",
            FeedKind::Oplog => "oplog",
        }
    }
}

/// Everything a feed needs to know, built from configuration.
#[derive(Clone, Debug)]
pub struct FeedSpec {
    /// Unique feed name (metric label, checkpoint key).
    pub name: String,
    /// What it reads.
    pub kind: FeedKind,
    /// Tailable feeds: the capped collection.
    pub collection: String,
    /// Change and op-log feeds: which changes.
    pub filter: ChangeFilter,
    /// Rolling statistics parameters.
    pub stats: StatsConfig,
    /// Which document fields feed the statistics.
    pub fields: Fields,
    /// How often the position and state are saved (and gauges refreshed).
    pub checkpoint_interval: Duration,
}

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
    pub position: Option<Value>,
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
    /// Feed kind.
    pub kind: FeedKind,
    status: Arc<Mutex<FeedStatus>>,
    latency_us: Arc<Mutex<hdrhistogram::Histogram<u64>>>,
    events: broadcast::Sender<Arc<Value>>,
}

impl FeedHandle {
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

    /// Every event the feed holds from now on, as JSON (`{feed, position, op?, doc}`); a slow
    /// subscriber misses events (the receiver reports how many) but never slows the feed.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Value>> {
        self.events.subscribe()
    }
}

/// What a feed can fail with (only at startup; at run time it records and continues).
#[derive(Debug, thiserror::Error)]
pub enum FeedError {
    /// The store failed.
    #[error("feed {feed}: {source}")]
    Store {
        /// The feed.
        feed: String,
        /// Why.
        source: StoreError,
    },
}

/// The saved state of a feed.
#[derive(Serialize, Deserialize)]
struct Checkpoint {
    kind: FeedKind,
    /// Position (tailable) or resume token (changes), as JSON.
    position: Option<Value>,
    stats: RollingStats,
    saved_at_us: i64,
}

/// One entry of a feed's stream.
enum Item {
    Record(Record),
    Change(Change),
}

impl Item {
    fn position(&self) -> Value {
        match self {
            Item::Record(r) => json!(r.position.0),
            Item::Change(c) => json!(c.token.0),
        }
    }

    fn committed_at_us(&self) -> Option<i64> {
        match self {
            Item::Record(r) => r.committed_at_us,
            Item::Change(c) => Some(c.committed_at_us),
        }
    }

    fn doc(&self) -> Option<&Document> {
        match self {
            Item::Record(r) => Some(&r.doc),
            Item::Change(c) => c.after.as_ref().or(c.before.as_ref()),
        }
    }
}

/// Metric handles of one feed, registered once (recording through a handle is cheap).
struct Meters {
    notification: Histogram,
    end_to_end: Histogram,
    events: Counter,
    missing: Counter,
    duplicates: Counter,
    checkpoints: Counter,
    lag: Gauge,
    headroom: Gauge,
    rate: Gauge,
    bands: [[Gauge; 3]; 2],
}

impl Meters {
    fn new(engine: &'static str, feed: &str) -> Self {
        let f = feed.to_string();
        // Registered at zero so dashboards and alerts see a series before the first incident.
        for reason in ["position_lost", "history_lost", "cursor_died", "error"] {
            counter!(t::FEED_RESTARTS, "feed" => f.clone(), "reason" => reason).absolute(0);
        }
        counter!(t::FEED_GAPS, "feed" => f.clone()).absolute(0);
        counter!(t::FEED_GAP_EVENTS, "feed" => f.clone()).absolute(0);
        let band = |series: &'static str, band: &'static str| gauge!(t::BOLLINGER, "feed" => f.clone(), "series" => series, "band" => band);
        Meters {
            notification: histogram!(t::NOTIFICATION_LATENCY, "engine" => engine, "feed" => f.clone()),
            end_to_end: histogram!(t::END_TO_END_LATENCY, "engine" => engine, "feed" => f.clone()),
            events: counter!(t::FEED_EVENTS, "feed" => f.clone()),
            missing: counter!(t::FEED_MISSING, "feed" => f.clone()),
            duplicates: counter!(t::FEED_DUPLICATES, "feed" => f.clone()),
            checkpoints: counter!(t::FEED_CHECKPOINTS, "feed" => f.clone()),
            lag: gauge!(t::FEED_LAG, "feed" => f.clone()),
            headroom: gauge!(t::RESUME_HEADROOM, "feed" => f.clone()),
            rate: gauge!(t::RATE, "feed" => f.clone()),
            bands: [
                [
                    band("rate", "upper"),
                    band("rate", "middle"),
                    band("rate", "lower"),
                ],
                [
                    band("value", "upper"),
                    band("value", "middle"),
                    band("value", "lower"),
                ],
            ],
        }
    }

    fn set_bands(&self, series: usize, bands: Option<Bands>) {
        if let Some(b) = bands {
            self.bands[series][0].set(b.upper);
            self.bands[series][1].set(b.middle);
            self.bands[series][2].set(b.lower);
        }
    }
}

fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// A feed ready to run.
pub struct Feed {
    spec: FeedSpec,
    store: Arc<dyn Store>,
    capped: Option<Arc<dyn Capped>>,
    gaps: Arc<dyn Keyed>,
    stats_docs: Arc<dyn Keyed>,
    handle: FeedHandle,
    meters: Meters,
    /// Events committed before this moment are replays: they get no latency sample.
    started_us: i64,
    stats: RollingStats,
    position: Option<Value>,
    /// Totals already added to the Prometheus counters (the state's totals survive restarts,
    /// the process's counters do not).
    reported_missing: u64,
    reported_duplicates: u64,
    top_keys: Vec<String>,
    last_event_us: i64,
    /// Change feeds: how far the open stream has read, past filtered-out entries too.
    read_up_to: Option<Arc<Mutex<Option<ResumeToken>>>>,
}

impl Feed {
    /// Prepares a feed: opens what it reads and writes, and loads its checkpoint.
    pub async fn new(
        spec: FeedSpec,
        store: Arc<dyn Store>,
        capped: Option<Arc<dyn Capped>>,
    ) -> Result<Feed, FeedError> {
        let err = |source| FeedError::Store {
            feed: spec.name.clone(),
            source,
        };
        if spec.kind == FeedKind::Tailable && capped.is_none() {
            return Err(err(StoreError::Invalid(format!(
                "tailable feed needs the capped collection {}",
                spec.collection
            ))));
        }
        let gaps = store.keyed("gaps").await.map_err(err)?;
        let stats_docs = store.keyed("stats").await.map_err(err)?;
        let saved = store.load_checkpoint(&spec.name).await.map_err(err)?;
        let mut stats = RollingStats::new(spec.stats.clone());
        let mut position = None;
        match saved.map(serde_json::from_value::<Checkpoint>) {
            Some(Ok(cp)) if cp.kind == spec.kind => {
                stats = cp.stats;
                position = cp.position;
                tracing::info!(feed = %spec.name, position = ?position, events = stats.current().events, "feed resumes from its checkpoint");
            }
            Some(Ok(cp)) => tracing::warn!(
                feed = %spec.name,
                saved = cp.kind.as_str(),
                now = spec.kind.as_str(),
                "checkpoint is of another feed kind; starting from the oldest entry"
            ),
            Some(Err(e)) => {
                tracing::warn!(feed = %spec.name, error = %e, "unreadable checkpoint; starting from the oldest entry")
            }
            None => {}
        }
        let snapshot = stats.current();
        let (events, _) = broadcast::channel(1024);
        let handle = FeedHandle {
            name: spec.name.clone(),
            kind: spec.kind,
            status: Arc::new(Mutex::new(FeedStatus {
                name: spec.name.clone(),
                kind: spec.kind.as_str().into(),
                events: snapshot.events,
                stats: Some(snapshot.clone()),
                position: position.clone(),
                ..FeedStatus::default()
            })),
            latency_us: Arc::new(Mutex::new(
                hdrhistogram::Histogram::new_with_bounds(1, 60_000_000, 2)
                    .map_err(|e| err(StoreError::Invalid(e.to_string())))?,
            )),
            events,
        };
        let meters = Meters::new(store.engine(), &spec.name);
        Ok(Feed {
            reported_missing: snapshot.missing,
            reported_duplicates: snapshot.duplicates,
            spec,
            store,
            capped,
            gaps,
            stats_docs,
            handle,
            meters,
            started_us: now_us(),
            stats,
            position,
            top_keys: Vec::new(),
            last_event_us: 0,
            read_up_to: None,
        })
    }

    /// The handle to watch this feed from outside.
    pub fn handle(&self) -> FeedHandle {
        self.handle.clone()
    }

    fn open(&mut self, from_oldest: bool) -> BoxStream<'static, Result<Item, StoreError>> {
        let pos = if from_oldest {
            None
        } else {
            self.position.clone()
        };
        match self.spec.kind {
            FeedKind::Tailable => {
                let start = match pos.and_then(|v| v.as_u64()) {
                    Some(p) => Start::After(Position(p)),
                    None => Start::Oldest,
                };
                match &self.capped {
                    Some(c) => c.tail(start).map(|r| r.map(Item::Record)).boxed(),
                    None => futures::stream::once(async { Err(StoreError::Closed) }).boxed(),
                }
            }
            kind => {
                let start = match pos.and_then(|v| v.as_str().map(str::to_string)) {
                    Some(tok) => ChangeStart::After(ResumeToken(tok)),
                    None => ChangeStart::Oldest,
                };
                let filter = self.spec.filter.clone();
                let s = if kind == FeedKind::Oplog {
                    self.store.oplog(filter, start)
                } else {
                    self.store.changes(filter, start)
                };
                self.read_up_to = Some(s.resume_cell());
                s.map(|c| c.map(Item::Change)).boxed()
            }
        }
    }

    /// Runs until `cancel`; then drains what is already committed (bounded by a deadline),
    /// saves the checkpoint and returns.
    pub async fn run(mut self, cancel: CancellationToken) {
        let mut tick = tokio::time::interval(self.spec.checkpoint_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut backoff = Duration::from_millis(100);
        let mut dirty = false;
        let mut from_oldest = false;
        let mut restarts = 0u64;
        'outer: loop {
            let mut stream = self.open(from_oldest);
            from_oldest = false;
            loop {
                tokio::select! {
                    biased;
                    _ = cancel.cancelled() => {
                        self.drain(&mut stream).await;
                        break 'outer;
                    }
                    item = stream.next() => match item {
                        Some(Ok(item)) => {
                            self.process(item);
                            dirty = true;
                            backoff = Duration::from_millis(100);
                        }
                        Some(Err(e)) if e.is_position_lost() || e.is_history_lost() => {
                            self.record_gap(&e).await;
                            restarts += 1;
                            from_oldest = true;
                            continue 'outer;
                        }
                        other => {
                            let (reason, msg) = match other {
                                Some(Err(e)) => ("error", e.to_string()),
                                _ => ("cursor_died", "stream ended".to_string()),
                            };
                            if cancel.is_cancelled() {
                                break 'outer;
                            }
                            counter!(t::FEED_RESTARTS, "feed" => self.spec.name.clone(), "reason" => reason).increment(1);
                            restarts += 1;
                            tracing::warn!(feed = %self.spec.name, reason, error = %msg, retry_in = ?backoff, "feed stream stopped; reopening after its last position");
                            tokio::select! {
                                _ = cancel.cancelled() => break 'outer,
                                _ = tokio::time::sleep(backoff) => {}
                            }
                            backoff = (backoff * 2).min(Duration::from_secs(10));
                            continue 'outer;
                        }
                    },
                    _ = tick.tick() => {
                        self.on_tick(dirty, restarts).await;
                        dirty = false;
                    }
                }
            }
        }
        self.on_tick(true, restarts).await;
        tracing::info!(feed = %self.spec.name, events = self.stats.current().events, "feed stopped and checkpointed");
    }

    /// After cancellation: consume what is already committed, so the checkpoint covers every
    /// write the ingester flushed, but never wait long.
    async fn drain(&mut self, stream: &mut BoxStream<'static, Result<Item, StoreError>>) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        loop {
            self.advance_read_position();
            match self.lag().await {
                Some(0) | None => return,
                Some(_) => {}
            }
            match tokio::time::timeout_at(deadline, stream.next()).await {
                Ok(Some(Ok(item))) => self.process(item),
                _ => return,
            }
        }
    }

    fn process(&mut self, item: Item) {
        let now = now_us();
        let committed = item.committed_at_us();
        let fallback = committed.unwrap_or(now);
        let sample = match item.doc() {
            Some(doc) => sample::sample(doc, &self.spec.fields, fallback),
            None => crate::stats::EventSample {
                t_us: fallback,
                ..Default::default()
            },
        };
        let snap = self.stats.on_event(&sample);
        let m = &self.meters;
        m.events.increment(1);
        if snap.missing > self.reported_missing {
            m.missing.increment(snap.missing - self.reported_missing);
            self.reported_missing = snap.missing;
        }
        if snap.duplicates > self.reported_duplicates {
            m.duplicates
                .increment(snap.duplicates - self.reported_duplicates);
            self.reported_duplicates = snap.duplicates;
        }
        m.rate.set(snap.rate);
        m.set_bands(0, snap.rate_bands);
        m.set_bands(1, snap.value_bands);
        if let Some(c) = committed.filter(|c| *c >= self.started_us) {
            let us = (now - c).max(0) as u64;
            m.notification.record(us as f64 / 1e6);
            if let Ok(mut h) = self.handle.latency_us.lock() {
                let _ = h.record(us.max(1));
            }
            if let Some(r) = sample::stamp(item.doc().unwrap_or(&Document::new())).received_us {
                m.end_to_end.record((now - r).max(0) as f64 / 1e6);
            }
        }
        self.position = Some(item.position());
        self.last_event_us = now;
        if self.handle.events.receiver_count() > 0 {
            let mut out = json!({"feed": self.spec.name, "position": self.position});
            match &item {
                Item::Record(r) => out["doc"] = Value::Object(r.doc.clone()),
                Item::Change(c) => {
                    out["op"] = json!(c.op.as_str());
                    out["collection"] = json!(c.collection);
                    out["key"] = json!(c.key);
                    out["doc"] = json!(c.after);
                }
            }
            let _ = self.handle.events.send(Arc::new(out));
        }
    }

    async fn lag(&self) -> Option<u64> {
        match (&self.spec.kind, &self.capped) {
            (FeedKind::Tailable, Some(c)) => {
                let newest = c.bounds().await.ok()??.1.0;
                let at = self.position.as_ref().and_then(Value::as_u64).unwrap_or(0);
                Some(newest.saturating_sub(at))
            }
            _ => match self.position.as_ref().and_then(Value::as_str) {
                Some(tok) => self
                    .store
                    .changes_after(&ResumeToken(tok.into()))
                    .await
                    .ok()?,
                None => self
                    .store
                    .newest_change()
                    .await
                    .ok()?
                    .map(|_| u64::MAX)
                    .or(Some(0)),
            },
        }
    }

    /// Seconds between the oldest retained entry and now, less the feed's own lag in time.
    async fn headroom(&self, lag: Option<u64>) -> Option<f64> {
        let oldest_us = match (&self.spec.kind, &self.capped) {
            (FeedKind::Tailable, Some(c)) => {
                let (oldest, _) = c.bounds().await.ok()??;
                c.get(oldest).await.ok()??.committed_at_us?
            }
            _ => self.store.oldest_change_at().await.ok()??,
        };
        let now = now_us();
        let behind_us = if lag == Some(0) {
            0
        } else {
            now - self.last_event_us.max(oldest_us)
        };
        Some(((now - oldest_us) - behind_us) as f64 / 1e6)
    }

    /// Change feeds: moves the position to where the stream has read, so a feed whose filter
    /// skips most entries still checkpoints a fresh token (and shows no false lag).
    fn advance_read_position(&mut self) -> bool {
        let Some(token) = self
            .read_up_to
            .as_ref()
            .and_then(|c| c.lock().ok()?.clone())
        else {
            return false;
        };
        let moved = self.position.as_ref().and_then(Value::as_str) != Some(token.0.as_str());
        self.position = Some(json!(token.0));
        moved
    }

    async fn on_tick(&mut self, dirty: bool, restarts: u64) {
        // A moved read position needs a checkpoint, not a stats document: stats documents are
        // changes themselves, and a change feed reading past its own writes must not loop.
        let moved = self.advance_read_position();
        let now = now_us();
        let lag = self.lag().await;
        if lag == Some(0) && now - self.last_event_us > 1_000_000 {
            // A quiet, caught-up stream: let the rate fall to zero and old top-k keys expire.
            // Never while catching up, or replayed events would land in the wrong seconds.
            let snap = self.stats.tick(now);
            self.meters.rate.set(snap.rate);
            self.meters.set_bands(0, snap.rate_bands);
        }
        let snap = self.stats.current();
        if let Some(l) = lag.filter(|l| *l != u64::MAX) {
            self.meters.lag.set(l as f64);
        }
        let headroom = self.headroom(lag).await;
        if let Some(h) = headroom {
            self.meters.headroom.set(h);
        }
        self.publish_topk(&snap);
        if moved && !dirty {
            self.save_checkpoint(now).await;
        }
        if dirty {
            self.save_checkpoint(now).await;
            let doc = json!({
                "feed": self.spec.name,
                "kind": self.spec.kind.as_str(),
                "stats": snap,
                "lag": lag,
                "position": self.position,
                "updated_us": now,
            });
            if let Value::Object(doc) = doc
                && let Err(e) = self
                    .stats_docs
                    .set(&self.spec.name, doc, Durability::Acknowledged)
                    .await
            {
                tracing::warn!(feed = %self.spec.name, error = %e, "could not write the stats document");
            }
        }
        if let Ok(mut s) = self.handle.status.lock() {
            s.events = snap.events;
            s.stats = Some(snap);
            s.lag = lag.filter(|l| *l != u64::MAX);
            s.resume_headroom_secs = headroom;
            s.position = self.position.clone();
            s.restarts = restarts;
        }
    }

    fn publish_topk(&mut self, snap: &Snapshot) {
        let keys: Vec<String> = snap.top.iter().map(|(k, _)| k.clone()).collect();
        for gone in self.top_keys.iter().filter(|k| !keys.contains(k)) {
            gauge!(t::TOPK, "feed" => self.spec.name.clone(), "key" => gone.clone()).set(0.0);
        }
        for (k, n) in &snap.top {
            gauge!(t::TOPK, "feed" => self.spec.name.clone(), "key" => k.clone()).set(*n as f64);
        }
        self.top_keys = keys;
    }

    async fn save_checkpoint(&mut self, now: i64) {
        let cp = Checkpoint {
            kind: self.spec.kind,
            position: self.position.clone(),
            stats: self.stats.clone(),
            saved_at_us: now,
        };
        let value = match serde_json::to_value(&cp) {
            Ok(v) => v,
            Err(e) => {
                tracing::error!(feed = %self.spec.name, error = %e, "could not encode the checkpoint");
                return;
            }
        };
        match self
            .store
            .save_checkpoint(&self.spec.name, value, Durability::Journaled)
            .await
        {
            Ok(()) => self.meters.checkpoints.increment(1),
            Err(e) => {
                tracing::warn!(feed = %self.spec.name, error = %e, "could not save the checkpoint")
            }
        }
    }

    async fn record_gap(&mut self, e: &StoreError) {
        let (reason, from, to, missed) = match e {
            StoreError::PositionLost { after, oldest, .. } => (
                "position_lost",
                json!(after.0),
                json!(oldest.0),
                Some(oldest.0.saturating_sub(after.0 + 1)),
            ),
            StoreError::HistoryLost { token, oldest } => {
                let missed = token
                    .0
                    .parse::<u64>()
                    .ok()
                    .zip(oldest.0.parse::<u64>().ok())
                    .map(|(a, o)| o.saturating_sub(a + 1));
                ("history_lost", json!(token.0), json!(oldest.0), missed)
            }
            _ => return,
        };
        let feed = self.spec.name.clone();
        counter!(t::FEED_RESTARTS, "feed" => feed.clone(), "reason" => reason).increment(1);
        counter!(t::FEED_GAPS, "feed" => feed.clone()).increment(1);
        if let Some(n) = missed {
            counter!(t::FEED_GAP_EVENTS, "feed" => feed.clone()).increment(n);
        }
        tracing::warn!(feed = %feed, reason, from = %from, to = %to, missed = ?missed, "feed was overtaken; gap recorded, continuing from the oldest retained entry");
        let now = now_us();
        let doc = json!({"feed": feed, "kind": self.spec.kind.as_str(), "reason": reason,
                         "from": from, "to": to, "missed": missed, "at_us": now});
        if let Value::Object(doc) = doc
            && let Err(e) = self
                .gaps
                .set(&format!("{feed}:{now}"), doc, Durability::Journaled)
                .await
        {
            tracing::error!(feed = %feed, error = %e, "could not record the gap document");
        }
        if let Ok(mut s) = self.handle.status.lock() {
            s.gaps += 1;
        }
    }
}
