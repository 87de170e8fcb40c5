//! A feed: a stream from the store, a consumer that recomputes rolling statistics on every
//! event, and a checkpoint (position and statistics saved together) so a restart resumes
//! where it stopped: no gap, and the bands continue.
//!
//! A checkpoint is **one** record, `{position or token, statistics state}`: after a restart
//! the statistics continue exactly where they were and the stream resumes right after the
//! position. Each statistic saves its state under its name; one whose saved state cannot be
//! read (saved by another version) starts afresh with a warning while the others and the
//! position are restored. A feed that dies between checkpoints replays what came after the last
//! one: no gap and no duplicate, as the sequence check sees the same events in the same order.
//!
//! Statistics are folded in on every event; their snapshot (the `stats` document, the API, the
//! gauges) is taken every `stats.publish_interval_ms` and the checkpoint saved every
//! `stats.checkpoint_interval_ms` and when the feed stops. The two are apart because a
//! checkpoint carries the whole top-k window as a durable commit. Both writes run in a task of
//! their own, one tick's at a time, while the feed goes on with its events: a feed that waited
//! for them would hold back every event committed meanwhile. A stop waits for the write under
//! way, then saves its own.
//!
//! Completeness: the ingester stamps every event with a per-source sequence number, continued
//! at startup from the newest stored event of that source or its `source:<name>` rollup, and the
//! feeds count missing and duplicate numbers. A change feed computes the statistics a tailable
//! feed does because the ingester copies each event's stamp, and every field a statistic reads,
//! into the source's `source:<name>` rollup ([`crate::stats`]).
//!
//! When the store says the feed was overtaken (position lost / history lost), the feed records
//! the gap (a document in `gaps`, counters, one log line) and continues from the oldest
//! retained entry: it neither crash-loops nor skips silently.
//!
//! Layout: this file runs the loop; `reader` is what every kind of feed implements to open
//! its stream and measure its lag (the kinds: [`crate::kind`]); `checkpoint` is what is
//! saved; `handle` is what the outside sees.

mod checkpoint;
mod handle;
mod reader;
mod refused;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::stream::{BoxStream, StreamExt};
use serde_json::{Value, json};
use store::backoff::Backoff;
use store::clock::now_us;
use store::{Capability, Document, Durability, Keyed, ResumeToken, Stamp, Store, StoreError};
use tokio_util::sync::CancellationToken;

pub use checkpoint::FeedPosition;
pub use handle::{FeedHandle, FeedStatus};
pub use reader::{Item, Lag, Opened, Reader};

use crate::stats::{Event, RollingStats, StatsConfig};
use crate::telemetry::{self as t, FeedMeters, RestartReason};
use checkpoint::Checkpoint;

/// While draining at a stop, how long to wait for the next item before looking at the lag
/// again (see `drain`).
const DRAIN_SLICE: Duration = Duration::from_millis(20);

/// Told of every entry a feed takes from its stream, as the feed starts processing it (the
/// moment its notification latency is measured): the document its statistics read and the
/// entry's commit time. For watching a feed from outside (`tailrace bench`) without wrapping
/// the store it reads.
pub trait FeedObserver: Send + Sync + 'static {
    /// An entry: its document (a record, or a change's post-image; a delete's pre-image) and
    /// when it was committed, where the engine says.
    fn entry(&self, doc: Option<&Document>, committed_at_us: Option<i64>);
}

/// Everything a feed needs to know, built from configuration.
pub struct FeedSpec {
    /// Unique feed name (metric label, checkpoint key).
    pub name: String,
    /// What it reads (a kind's reader: [`crate::kind`]).
    pub reader: Box<dyn Reader>,
    /// Its statistics, how often it checkpoints (`checkpoint_interval_ms`) and how often it
    /// publishes them (`publish_interval_ms`).
    pub stats: StatsConfig,
}

/// A latency histogram: 1 µs .. 60 s at 2 significant digits, a few KB whatever the traffic.
fn latency_histogram() -> Result<hdrhistogram::Histogram<u64>, hdrhistogram::CreationError> {
    hdrhistogram::Histogram::new_with_bounds(1, 60_000_000, 2)
}

/// `{p50, p99, count}` of a window, then resets it; `null` for an empty window (no sample is
/// not a latency of zero).
pub fn take_quantiles(h: &mut hdrhistogram::Histogram<u64>) -> Value {
    if h.is_empty() {
        return Value::Null;
    }
    let out = json!({
        "p50": h.value_at_quantile(0.5),
        "p99": h.value_at_quantile(0.99),
        "count": h.len(),
    });
    h.reset();
    out
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
    /// The store's server cannot serve this kind of feed (found by its capability probe).
    #[error(
        "feed {feed} (kind = \"{kind}\") needs {capability}, which the store's server does not \
         support: {reason}; {instead}"
    )]
    Unsupported {
        /// The feed.
        feed: String,
        /// Its kind.
        kind: &'static str,
        /// What it needs.
        capability: Capability,
        /// Why the server is thought to lack it (its reply).
        reason: String,
        /// What to do instead ([`Reader::instead`]).
        instead: &'static str,
    },
    /// The feed's latency histogram could not be created.
    #[error("feed {feed}: latency histogram: {source}")]
    Histogram {
        /// The feed.
        feed: String,
        /// Why.
        source: hdrhistogram::CreationError,
    },
}

/// A feed ready to run.
pub struct Feed {
    name: String,
    reader: Box<dyn Reader>,
    checkpoint_interval: Duration,
    publish_interval: Duration,
    /// When the checkpoint was last saved (or the feed started).
    checkpointed_at: tokio::time::Instant,
    /// Events processed or read position moved since the last checkpoint.
    unsaved: bool,
    /// Events processed since the last `stats` document.
    unpublished: bool,
    /// The writes of an earlier tick (checkpoint, `stats` document) while they are under way
    /// (see `on_tick`); the task answers whether the checkpoint was saved (or none was due).
    writing: Option<tokio::task::JoinHandle<bool>>,
    store: Arc<dyn Store>,
    gaps: Arc<dyn Keyed>,
    stats_docs: Arc<dyn Keyed>,
    /// Where the statistics' changes go (`trends`: the rate's breakouts), and those not yet
    /// written (a tick whose writes are under way leaves them to the next).
    trends: Arc<dyn Keyed>,
    unwritten_trends: Vec<(String, Document)>,
    /// The dead letters, when the feed was given them ([`Feed::refusals_from`]): a gap of
    /// the numbers refused there is refused, not missing.
    refused: Option<Arc<dyn store::Capped>>,
    handle: FeedHandle,
    meters: FeedMeters,
    /// Events committed before this moment are replays: they get no latency sample.
    started_us: i64,
    stats: RollingStats,
    position: Option<FeedPosition>,
    last_event_us: i64,
    /// Change feeds: how far the open stream has read, past filtered-out entries too.
    read_up_to: Option<Arc<Mutex<Option<ResumeToken>>>>,
    /// Stream restarts in this process.
    restarts: u64,
    /// Notification latencies (µs) since the last `stats` document, which publishes their
    /// p50/p99 (`notify_us`): a window of its own, as the status line resets the handle's.
    notify_window: hdrhistogram::Histogram<u64>,
    /// Told of every entry, if any.
    observer: Option<Arc<dyn FeedObserver>>,
}

/// What one tick writes, and where: run as a task of its own (see `Feed::on_tick`).
struct TickWrites {
    feed: String,
    store: Arc<dyn Store>,
    stats_docs: Arc<dyn Keyed>,
    trends: Arc<dyn Keyed>,
    checkpoints: metrics::Counter,
}

impl TickWrites {
    /// Writes the trend documents, saves the checkpoint (position and state together), then
    /// the `stats` document; false (and the failure reported) when a checkpoint was due and not
    /// saved. Trends first: a checkpoint saved before them would, after a crash, resume past
    /// the breakouts they record, which a replay then never meets again; written first, a
    /// crash before the checkpoint only writes the same keys again.
    async fn run(
        self,
        trends: Vec<(String, Document)>,
        checkpoint: Option<Checkpoint>,
        stats_doc: Option<Value>,
    ) -> bool {
        for (key, doc) in trends {
            if let Err(e) = self.trends.set(&key, doc, Durability::Journaled).await {
                t::FeedWriteFailed {
                    feed: &self.feed,
                    what: "trend document",
                    error: e.to_string(),
                }
                .emit();
                return false;
            }
        }
        let mut saved = true;
        if let Some(cp) = checkpoint {
            let result = match cp.into_value() {
                Ok(value) => {
                    self.store
                        .save_checkpoint(&self.feed, value, Durability::Journaled)
                        .await
                }
                Err(e) => Err(StoreError::Json(e)),
            };
            match result {
                Ok(()) => self.checkpoints.increment(1),
                Err(e) => {
                    saved = false;
                    t::FeedWriteFailed {
                        feed: &self.feed,
                        what: "checkpoint",
                        error: e.to_string(),
                    }
                    .emit();
                }
            }
        }
        if let Some(Value::Object(doc)) = stats_doc
            && let Err(e) = self
                .stats_docs
                .set(&self.feed, doc, Durability::Acknowledged)
                .await
        {
            t::FeedWriteFailed {
                feed: &self.feed,
                what: "stats document",
                error: e.to_string(),
            }
            .emit();
        }
        saved
    }
}

impl Feed {
    /// Prepares a feed: opens what it writes (`gaps`, `stats`) and loads its checkpoint.
    pub async fn new(spec: FeedSpec, store: Arc<dyn Store>) -> Result<Feed, FeedError> {
        let FeedSpec {
            name,
            reader,
            stats: config,
        } = spec;
        let err = |source| FeedError::Store {
            feed: name.clone(),
            source,
        };
        let kind = reader.kind();
        let caps = store.capabilities();
        if let Some(capability) = reader.needs()
            && let Some(reason) = caps.get(capability).reason()
        {
            return Err(FeedError::Unsupported {
                feed: name,
                kind,
                capability,
                reason: reason.to_string(),
                instead: reader.instead(&caps),
            });
        }
        let gaps = store.keyed("gaps").await.map_err(err)?;
        let stats_docs = store.keyed("stats").await.map_err(err)?;
        let trends = store.keyed("trends").await.map_err(err)?;
        let saved = store.load_checkpoint(&name).await.map_err(err)?;
        let mut stats = RollingStats::new(&config, &name);
        let mut position = None;
        match saved.map(serde_json::from_value::<Checkpoint>) {
            Some(Ok(cp)) if cp.kind == kind => {
                for (statistic, error) in stats.restore(&cp.stats) {
                    t::StatisticReset {
                        feed: &name,
                        statistic,
                        error,
                    }
                    .emit();
                }
                position = cp.position;
                t::FeedResumed {
                    feed: &name,
                    position: position
                        .as_ref()
                        .map_or_else(|| "the start".into(), ToString::to_string),
                    events: stats.events(),
                }
                .emit();
            }
            Some(Ok(cp)) => t::CheckpointIgnored {
                feed: &name,
                why: format!(
                    "it was saved by a {} feed and this one is {}",
                    cp.kind, kind
                ),
            }
            .emit(),
            Some(Err(e)) => t::CheckpointIgnored {
                feed: &name,
                why: format!("unreadable: {e}"),
            }
            .emit(),
            None => {}
        }
        let snapshot = stats.snapshot();
        let status = FeedStatus {
            name: name.clone(),
            kind: kind.into(),
            events: snapshot.events,
            stats: Some(snapshot),
            position: position.clone(),
            ..FeedStatus::default()
        };
        let handle =
            FeedHandle::new(&name, kind, status).map_err(|source| FeedError::Histogram {
                feed: name.clone(),
                source,
            })?;
        let meters = FeedMeters::new(store.engine(), &name);
        let notify_window = latency_histogram().map_err(|source| FeedError::Histogram {
            feed: name.clone(),
            source,
        })?;
        Ok(Feed {
            name,
            reader,
            checkpoint_interval: Duration::from_millis(config.checkpoint_interval_ms.max(1)),
            publish_interval: Duration::from_millis(config.publish_interval_ms.max(1)),
            checkpointed_at: tokio::time::Instant::now(),
            unsaved: false,
            unpublished: false,
            writing: None,
            store,
            gaps,
            stats_docs,
            trends,
            unwritten_trends: Vec::new(),
            handle,
            meters,
            started_us: now_us(),
            stats,
            position,
            last_event_us: 0,
            read_up_to: None,
            restarts: 0,
            notify_window,
            observer: None,
            refused: None,
        })
    }

    /// Tells gaps of refused events from lost ones by the dead letters in `dead_letters`: the
    /// ingester keeps an event the store refused there with its sequence number
    /// (`refused::STORE_REJECTED`). Without it every gap counts as missing.
    pub fn refusals_from(&mut self, dead_letters: Arc<dyn store::Capped>) {
        self.refused = Some(dead_letters);
    }

    /// The handle to watch this feed from outside.
    pub fn handle(&self) -> FeedHandle {
        self.handle.clone()
    }

    /// Tells `observer` of every entry this feed takes, from now on.
    pub fn observe(&mut self, observer: Arc<dyn FeedObserver>) {
        self.observer = Some(observer);
    }

    fn open(&mut self, from_oldest: bool) -> BoxStream<'static, Result<Item, StoreError>> {
        let after = if from_oldest {
            None
        } else {
            self.position.as_ref()
        };
        let opened = self.reader.open(&*self.store, after);
        self.read_up_to = opened.read_up_to;
        opened.stream
    }

    /// Runs until `cancel`; then drains what is already committed (bounded by a deadline),
    /// saves the checkpoint and returns.
    pub async fn run(mut self, cancel: CancellationToken) {
        let mut tick = tokio::time::interval(self.publish_interval.min(self.checkpoint_interval));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(10));
        let mut dirty = false;
        let mut from_oldest = false;
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
                            self.process(item).await;
                            dirty = true;
                            backoff.reset();
                        }
                        Some(Err(e)) if e.is_position_lost() || e.is_history_lost() => {
                            self.record_gap(&e).await;
                            self.restarts += 1;
                            from_oldest = true;
                            continue 'outer;
                        }
                        // The server stopped supporting what this feed reads (it was checked
                        // at start): retrying would only repeat the refusal, so the feed stops
                        // and says why; the rest of the pipeline goes on.
                        Some(Err(e)) if e.unsupported().is_some() => {
                            t::FeedUnsupported { feed: &self.name, error: e.to_string() }.emit();
                            break 'outer;
                        }
                        other => {
                            if cancel.is_cancelled() {
                                break 'outer;
                            }
                            let (reason, error) = match other {
                                Some(Err(e)) => (RestartReason::Error, e.to_string()),
                                _ => (RestartReason::CursorDied, "stream ended".to_string()),
                            };
                            let wait = backoff.next_wait();
                            t::FeedRestarted { feed: &self.name, reason, error, retry_in: wait }.emit();
                            self.restarts += 1;
                            tokio::select! {
                                _ = cancel.cancelled() => break 'outer,
                                _ = tokio::time::sleep(wait) => {}
                            }
                            continue 'outer;
                        }
                    },
                    _ = tick.tick() => {
                        self.on_tick(dirty, false).await;
                        dirty = false;
                    }
                }
            }
        }
        self.on_tick(true, true).await;
        t::FeedStopped {
            feed: &self.name,
            events: self.stats.events(),
        }
        .emit();
    }

    /// After cancellation: consume what is already committed, so the checkpoint covers every
    /// write the ingester flushed, but never wait long.
    async fn drain(&mut self, stream: &mut BoxStream<'static, Result<Item, StoreError>>) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        loop {
            self.advance_read_position();
            match self.reader.lag(&*self.store, self.position.as_ref()).await {
                Lag::Entries(0) | Lag::Unknown => return,
                Lag::Entries(_) | Lag::Behind => {}
            }
            // The newest entries may all be ones this feed's filter skips: the stream reads past
            // them (its read position moves) without yielding anything. So wait for an item a
            // short while only, then look at the lag again; waiting for an item that never
            // comes held every such stop for the whole deadline.
            let slice = (tokio::time::Instant::now() + DRAIN_SLICE).min(deadline);
            match tokio::time::timeout_at(slice, stream.next()).await {
                Ok(Some(Ok(item))) => self.process(item).await,
                Ok(_) => return,
                Err(_) if slice >= deadline => return,
                Err(_) => {}
            }
        }
    }

    async fn process(&mut self, item: Item) {
        let now = now_us();
        let committed = item.committed_at_us();
        if let Some(o) = &self.observer {
            o.entry(item.doc(), committed);
        }
        let empty = Document::new();
        let doc = item.doc().unwrap_or(&empty);
        let stamp = Stamp::of(doc);
        let t_us = stamp
            .as_ref()
            .map(|s| s.received_us)
            .or(committed)
            .unwrap_or(now);
        if let (Some(s), Some(letters)) = (&stamp, &self.refused)
            && let Some(expected) = self.stats.expected_seq(&s.source)
            && s.seq > expected
        {
            match refused::in_gap(&**letters, &s.source, expected, s.seq).await {
                Ok(n) => self.stats.refused_before_next(n),
                Err(e) => t::RefusalsUnread {
                    feed: &self.name,
                    error: e.to_string(),
                }
                .emit(),
            }
        }
        self.stats.on_event(&Event {
            t_us,
            stamp: stamp.as_ref(),
            doc,
        });
        self.meters.events.increment(1);
        if let Some(c) = committed.filter(|c| *c >= self.started_us) {
            let us = (now - c).max(0) as u64;
            self.meters.notification.record(us as f64 / 1e6);
            if let Ok(mut h) = self.handle.latency_us.lock() {
                let _ = h.record(us.max(1));
            }
            let _ = self.notify_window.record(us.max(1));
            if let Some(s) = &stamp {
                self.meters
                    .end_to_end
                    .record((now - s.received_us).max(0) as f64 / 1e6);
            }
        }
        let position = item.position();
        self.last_event_us = now;
        if self.handle.events.receiver_count() > 0 {
            // The record's or change's own fields as `/api/changes` writes them, then the
            // feed's.
            let mut out = match &item {
                Item::Record(r) => r.clone().into_json(self.reader.collection().unwrap_or("")),
                Item::Change(c) => c.clone().into_json(),
            };
            out.insert("feed".into(), json!(self.name));
            out.insert("position".into(), json!(position));
            let _ = self.handle.events.send(Arc::new(Value::Object(out)));
        }
        self.position = Some(position);
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
        let read = FeedPosition::Token(token);
        let moved = self.position.as_ref() != Some(&read);
        self.position = Some(read);
        moved
    }

    /// Publishes the statistics (`dirty`: events came since the last tick) and, once per
    /// checkpoint interval or when `stopping`, saves the checkpoint if anything moved.
    async fn on_tick(&mut self, dirty: bool, stopping: bool) {
        // A moved read position needs a checkpoint, not a stats document: stats documents are
        // changes themselves, and a change feed reading past its own writes must not loop.
        let moved = self.advance_read_position();
        let now = now_us();
        let lag = self.reader.lag(&*self.store, self.position.as_ref()).await;
        if lag == Lag::Entries(0) && now - self.last_event_us > 1_000_000 {
            // A quiet, caught-up stream: let the rate fall to zero and old top-k keys expire.
            // Never while catching up, or replayed events would land in the wrong seconds.
            self.stats.advance(now);
        }
        let snap = self.stats.snapshot();
        self.stats.publish(&snap);
        for change in self.stats.take_changes() {
            let mut doc = change.doc;
            doc.insert("feed".into(), Value::from(self.name.clone()));
            doc.insert("position".into(), json!(self.position));
            self.unwritten_trends
                .push((format!("{}:{}", self.name, change.key), doc));
        }
        if let Some(l) = lag.entries() {
            self.meters.lag.set(l as f64);
        }
        let headroom = self.headroom(lag, now).await;
        if let Some(h) = headroom {
            self.meters.headroom.set(h);
        }
        self.unsaved |= moved || dirty;
        self.unpublished |= dirty;
        // The checkpoint and the `stats` document are written by a task of their own, one
        // tick's at a time, while the feed goes on with its events: each waits its turn at the
        // store's writer, which may be committing a large batch, and a feed that waited with
        // it held back every event committed meanwhile (its notification latency's tail). A
        // tick that finds the last one's writes still under way leaves its own to the next
        // tick; a stop waits for them and writes its own.
        if let Some(writing) = self.writing.take() {
            if stopping || writing.is_finished() {
                self.written(writing).await;
            } else {
                self.writing = Some(writing);
            }
        }
        if self.writing.is_none() {
            let checkpoint = (self.unsaved
                && (stopping || self.checkpointed_at.elapsed() >= self.checkpoint_interval))
                .then(|| Checkpoint {
                    kind: self.reader.kind().into(),
                    position: self.position.clone(),
                    stats: self.stats.save(),
                    saved_at_us: now,
                });
            let stats_doc = self.unpublished.then(|| {
                json!({
                    "feed": self.name,
                    "kind": self.reader.kind(),
                    "stats": snap,
                    "lag": lag.entries(),
                    "position": self.position,
                    "notify_us": take_quantiles(&mut self.notify_window),
                    "updated_us": now,
                })
            });
            if checkpoint.is_some() || stats_doc.is_some() || !self.unwritten_trends.is_empty() {
                if checkpoint.is_some() {
                    self.unsaved = false;
                    self.checkpointed_at = tokio::time::Instant::now();
                }
                self.unpublished = false;
                let writes = TickWrites {
                    feed: self.name.clone(),
                    store: self.store.clone(),
                    stats_docs: self.stats_docs.clone(),
                    trends: self.trends.clone(),
                    checkpoints: self.meters.checkpoints.clone(),
                };
                let trends = std::mem::take(&mut self.unwritten_trends);
                let writing = tokio::spawn(writes.run(trends, checkpoint, stats_doc));
                if stopping {
                    self.written(writing).await;
                } else {
                    self.writing = Some(writing);
                }
            }
        }
        let restarts = self.restarts;
        let position = self.position.clone();
        self.handle.update(|s| {
            s.events = snap.events;
            s.stats = Some(snap);
            s.lag = lag.entries();
            s.resume_headroom_secs = headroom;
            s.position = position;
            s.restarts = restarts;
        });
    }

    /// Seconds between the oldest retained entry and now, less the feed's own lag in time.
    async fn headroom(&self, lag: Lag, now: i64) -> Option<f64> {
        let oldest_us = self.reader.oldest_entry_us(&*self.store).await?;
        let behind_us = if lag == Lag::Entries(0) {
            0
        } else {
            now - self.last_event_us.max(oldest_us)
        };
        Some(((now - oldest_us) - behind_us) as f64 / 1e6)
    }

    /// Waits for a tick's writes: a checkpoint that was not saved is due again at the next tick.
    async fn written(&mut self, writing: tokio::task::JoinHandle<bool>) {
        if !writing.await.unwrap_or(false) {
            self.unsaved = true;
            self.checkpointed_at = tokio::time::Instant::now()
                .checked_sub(self.checkpoint_interval)
                .unwrap_or_else(tokio::time::Instant::now);
        }
    }

    async fn record_gap(&mut self, e: &StoreError) {
        let (reason, from, to, missed) = match e {
            StoreError::PositionLost { after, oldest, .. } => (
                RestartReason::PositionLost,
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
                (
                    RestartReason::HistoryLost,
                    json!(token.0),
                    json!(oldest.0),
                    missed,
                )
            }
            _ => return,
        };
        t::GapRecorded {
            feed: &self.name,
            reason,
            from: &from,
            to: &to,
            missed,
        }
        .emit();
        let now = now_us();
        let doc = json!({"feed": self.name, "kind": self.reader.kind(), "reason": reason.as_str(),
                         "from": from, "to": to, "missed": missed, "at_us": now});
        if let Value::Object(doc) = doc
            && let Err(e) = self
                .gaps
                .set(&format!("{}:{now}", self.name), doc, Durability::Journaled)
                .await
        {
            t::FeedWriteFailed {
                feed: &self.name,
                what: "gap document",
                error: e.to_string(),
            }
            .emit();
        }
        self.handle.update(|s| s.gaps += 1);
    }
}
