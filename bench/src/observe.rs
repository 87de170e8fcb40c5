//! The real feeds, run by a scenario and watched from outside without changing them.
//!
//! [`start`] builds the configured `[[feeds]]` exactly as the pipeline does
//! ([`pipeline::feed_source`](ingest::pipeline::feed_source), [`Feed::new`], [`Feed::run`]), on
//! the scenario's collections. Each feed is handed the store (and, for a tailable feed, its
//! capped collection) through a thin wrapper that passes every call through and, as each entry
//! of the feed's stream is yielded — the moment the feed starts processing it, where the
//! feed's own `tailrace_notification_latency_seconds` is measured — tells the feed's
//! [`Probe`]: the highest event sequence number the feed holds, and the notification latency
//! (now − the engine's commit stamp) under the feed's own rule (entries committed before the
//! feed started are replays and get no sample).
//!
//! Lag is counted in events: the newest acknowledged sequence number less the highest one the
//! feed holds. Every event is exactly one entry of each default feed (a record of `events`; a
//! change of its source's `source:<name>` rollup), so this is the feed's lag in the entries
//! its filter passes. A [`Sampler`] records it every 10 ms for the lag-over-time plot and the
//! maximum; a probe notes the exact moment its feed reached a target sequence number.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use feeds::{Feed, FeedHandle, FeedKind, FeedSource, FeedSpec};
use futures::StreamExt;
use serde_json::Value;
use store::clock::now_us;
use store::{
    Capped, CappedSpec, ChangeFilter, ChangeStart, ChangeStream, Document, Durability, Keyed,
    Position, Record, RecordStream, ResumeToken, STAMP_FIELD, Start, Store,
};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::measure::Samples;
use super::{Bench, BenchError, Result};

/// How long a stopped feed may take to drain and checkpoint (the pipeline allows 5 s).
const STOP_DEADLINE: Duration = Duration::from_secs(10);

/// What one feed's stream has yielded so far.
pub struct Probe {
    /// Entries yielded.
    held: AtomicU64,
    /// The highest `_tailrace.seq` among them (0 before the first).
    last_seq: AtomicU64,
    /// The sequence number whose arrival [`Probe::reached_at`] times (`u64::MAX`: none yet).
    target: AtomicU64,
    /// When the feed first held `target` (µs since the epoch; 0: not yet).
    reached_us: AtomicI64,
    /// Entries committed before this are replays: no latency sample, as in the feed.
    since_us: i64,
    /// Notification latencies (µs), in arrival order.
    latency: Mutex<Samples>,
}

impl Probe {
    fn new() -> Probe {
        Probe {
            held: AtomicU64::new(0),
            last_seq: AtomicU64::new(0),
            target: AtomicU64::new(u64::MAX),
            reached_us: AtomicI64::new(0),
            since_us: now_us(),
            latency: Mutex::new(Samples::default()),
        }
    }

    /// Called as the feed's stream yields an entry.
    fn saw(&self, doc: Option<&Document>, committed_us: Option<i64>) {
        let now = now_us();
        self.held.fetch_add(1, Ordering::Relaxed);
        let seq = doc
            .and_then(|d| d.get(STAMP_FIELD))
            .and_then(|s| s.get("seq"))
            .and_then(Value::as_u64);
        if let Some(seq) = seq {
            let seen = self.last_seq.fetch_max(seq, Ordering::SeqCst).max(seq);
            if seen >= self.target.load(Ordering::SeqCst) {
                let _ =
                    self.reached_us
                        .compare_exchange(0, now, Ordering::SeqCst, Ordering::SeqCst);
            }
        }
        if let Some(c) = committed_us.filter(|c| *c >= self.since_us)
            && let Ok(mut l) = self.latency.lock()
        {
            l.push_us((now - c) as f64);
        }
    }

    /// Entries the feed's stream has yielded.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// The highest event sequence number the feed holds.
    pub fn last_seq(&self) -> u64 {
        self.last_seq.load(Ordering::SeqCst)
    }

    /// From now on, note when the feed holds sequence number `seq` (at once if it already does).
    pub fn watch_for(&self, seq: u64) {
        self.target.store(seq, Ordering::SeqCst);
        if self.last_seq() >= seq {
            let _ =
                self.reached_us
                    .compare_exchange(0, now_us(), Ordering::SeqCst, Ordering::SeqCst);
        }
    }

    /// When the feed first held the watched sequence number (µs since the epoch).
    pub fn reached_at_us(&self) -> Option<i64> {
        Some(self.reached_us.load(Ordering::SeqCst)).filter(|t| *t > 0)
    }

    /// The notification latencies measured so far.
    pub fn latency(&self) -> Samples {
        self.latency.lock().map(|l| l.clone()).unwrap_or_default()
    }
}

/// A store that tells a probe about every change its change streams yield; everything else
/// passes straight through.
struct ObservedStore {
    inner: Arc<dyn Store>,
    probe: Arc<Probe>,
}

impl ObservedStore {
    fn watch(&self, s: ChangeStream) -> ChangeStream {
        let cell = s.resume_cell();
        let probe = self.probe.clone();
        let inner = s
            .map(move |c| {
                if let Ok(c) = &c {
                    probe.saw(
                        c.after.as_ref().or(c.before.as_ref()),
                        Some(c.committed_at_us),
                    );
                }
                c
            })
            .boxed();
        ChangeStream::new(inner, cell)
    }
}

#[async_trait]
impl Store for ObservedStore {
    fn engine(&self) -> &'static str {
        self.inner.engine()
    }
    async fn capped(&self, name: &str, spec: &CappedSpec) -> store::Result<Arc<dyn Capped>> {
        self.inner.capped(name, spec).await
    }
    async fn keyed(&self, name: &str) -> store::Result<Arc<dyn Keyed>> {
        self.inner.keyed(name).await
    }
    fn changes(&self, filter: ChangeFilter, start: ChangeStart) -> ChangeStream {
        self.watch(self.inner.changes(filter, start))
    }
    fn oplog(&self, filter: ChangeFilter, start: ChangeStart) -> ChangeStream {
        self.watch(self.inner.oplog(filter, start))
    }
    async fn newest_change(&self) -> store::Result<Option<ResumeToken>> {
        self.inner.newest_change().await
    }
    async fn changes_after(&self, token: &ResumeToken) -> store::Result<Option<u64>> {
        self.inner.changes_after(token).await
    }
    async fn oldest_change_at(&self) -> store::Result<Option<i64>> {
        self.inner.oldest_change_at().await
    }
    async fn load_checkpoint(&self, feed: &str) -> store::Result<Option<Value>> {
        self.inner.load_checkpoint(feed).await
    }
    async fn save_checkpoint(&self, feed: &str, cp: Value, d: Durability) -> store::Result<()> {
        self.inner.save_checkpoint(feed, cp, d).await
    }
    async fn close(&self) -> store::Result<()> {
        // The scenario owns the store and closes it; a feed never does.
        Ok(())
    }
}

/// A capped collection that tells a probe about every record its tails yield.
struct ObservedCapped {
    inner: Arc<dyn Capped>,
    probe: Arc<Probe>,
}

#[async_trait]
impl Capped for ObservedCapped {
    fn name(&self) -> &str {
        self.inner.name()
    }
    async fn append(&self, docs: Vec<Document>, d: Durability) -> store::Result<Vec<Position>> {
        self.inner.append(docs, d).await
    }
    fn commits_with(&self, keyed: &dyn Keyed) -> bool {
        self.inner.commits_with(keyed)
    }
    async fn append_with_updates(
        &self,
        docs: Vec<Document>,
        keyed: &dyn Keyed,
        updates: Vec<store::KeyUpdate>,
        d: Durability,
    ) -> store::Result<Vec<Position>> {
        self.inner
            .append_with_updates(docs, keyed, updates, d)
            .await
    }
    fn tail(&self, start: Start) -> RecordStream {
        let probe = self.probe.clone();
        self.inner
            .tail(start)
            .map(move |r| {
                if let Ok(r) = &r {
                    probe.saw(Some(&r.doc), r.committed_at_us);
                }
                r
            })
            .boxed()
    }
    async fn newest_matching(
        &self,
        filter: &store::Filter,
        limit: usize,
    ) -> store::Result<store::NewestMatching> {
        self.inner.newest_matching(filter, limit).await
    }
    async fn get(&self, p: Position) -> store::Result<Option<Record>> {
        self.inner.get(p).await
    }
    async fn latest(&self, f: &str, v: &Value, limit: usize) -> store::Result<Vec<Record>> {
        self.inner.latest(f, v, limit).await
    }
    async fn bounds(&self) -> store::Result<Option<store::Bounds>> {
        self.inner.bounds().await
    }
    async fn usage(&self) -> store::Result<store::Usage> {
        self.inner.usage().await
    }
}

/// The collections a scenario's feeds read.
pub struct Collections {
    /// The scenario's store.
    pub store: Arc<dyn Store>,
    /// Its `events`.
    pub events: Arc<dyn Capped>,
    /// Its `dead_letters`.
    pub dead_letters: Arc<dyn Capped>,
    /// The name of its `rollups` (scenarios prefix their collections with `bench_`).
    pub rollups: String,
}

/// One running feed and what watches it.
pub struct Watched {
    /// The feed's configured name.
    pub name: String,
    /// Its kind.
    pub kind: FeedKind,
    /// What its stream yielded.
    pub probe: Arc<Probe>,
    /// The feed's own handle (status, restarts, gaps).
    pub handle: FeedHandle,
}

/// The configured feeds, running.
pub struct RunningFeeds {
    /// Each feed, in configuration order.
    pub feeds: Vec<Watched>,
    stop: CancellationToken,
    tasks: Vec<(String, JoinHandle<()>)>,
}

/// Starts the configured feeds (those named in `only`, or all) on `c`, each resuming from its
/// checkpoint in `c.store` as in the pipeline.
pub async fn start(bench: &Bench, c: &Collections, only: Option<&[&str]>) -> Result<RunningFeeds> {
    let stop = CancellationToken::new();
    let mut feeds = Vec::new();
    let mut tasks = Vec::new();
    for f in &bench.config.feeds {
        if only.is_some_and(|names| !names.contains(&f.name.as_str())) {
            continue;
        }
        let probe = Arc::new(Probe::new());
        let source = match ingest::pipeline::feed_source(f, &c.events, &c.dead_letters) {
            FeedSource::Tail(capped) => FeedSource::Tail(Arc::new(ObservedCapped {
                inner: capped,
                probe: probe.clone(),
            })),
            FeedSource::Changes(filter) => FeedSource::Changes(rename(filter, &c.rollups)),
            FeedSource::Oplog(filter) => FeedSource::Oplog(rename(filter, &c.rollups)),
        };
        let kind = f.kind();
        let spec = FeedSpec {
            name: f.name.clone(),
            source,
            stats: bench.config.stats.clone(),
        };
        let store: Arc<dyn Store> = Arc::new(ObservedStore {
            inner: c.store.clone(),
            probe: probe.clone(),
        });
        let feed = Feed::new(spec, store)
            .await
            .map_err(|e| BenchError::Scenario(e.to_string()))?;
        let handle = feed.handle();
        tasks.push((f.name.clone(), tokio::spawn(feed.run(stop.clone()))));
        feeds.push(Watched {
            name: f.name.clone(),
            kind,
            probe,
            handle,
        });
    }
    Ok(RunningFeeds { feeds, stop, tasks })
}

/// The scenario's rollups collection stands in for `rollups` in a change feed's filter.
fn rename(mut filter: ChangeFilter, rollups: &str) -> ChangeFilter {
    for c in &mut filter.collections {
        if c == "rollups" {
            *c = rollups.to_string();
        }
    }
    filter
}

impl RunningFeeds {
    /// Notes, for every feed, when it holds sequence number `seq`.
    pub fn watch_for(&self, seq: u64) {
        for f in &self.feeds {
            f.probe.watch_for(seq);
        }
    }

    /// Waits until every feed holds sequence number `seq` (what [`RunningFeeds::watch_for`]
    /// was given), or `timeout`; returns whether they all did.
    pub async fn wait_for(&self, seq: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut every = tokio::time::interval(Duration::from_millis(5));
        loop {
            if self.feeds.iter().all(|f| f.probe.last_seq() >= seq) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            every.tick().await;
        }
    }

    /// The probes, in configuration order.
    pub fn probes(&self) -> Vec<Arc<Probe>> {
        self.feeds.iter().map(|f| f.probe.clone()).collect()
    }

    /// Stops every feed as the pipeline does (drain what is committed, checkpoint) and waits
    /// for them; a feed that does not stop in time is an error.
    pub async fn stop(self) -> Result<Vec<Watched>> {
        self.stop.cancel();
        for (name, task) in self.tasks {
            match tokio::time::timeout(STOP_DEADLINE, task).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    return Err(BenchError::Scenario(format!("feed {name} failed: {e}")));
                }
                Err(_) => {
                    return Err(BenchError::Scenario(format!(
                        "feed {name} did not stop within {} s",
                        STOP_DEADLINE.as_secs()
                    )));
                }
            }
        }
        Ok(self.feeds)
    }
}

/// Lag of each watched feed, sampled at a fixed interval while a run lasts.
pub struct Sampler {
    stop: CancellationToken,
    task: JoinHandle<Timeline>,
}

/// What a [`Sampler`] recorded.
#[derive(Clone, Debug, Default)]
pub struct Timeline {
    /// Seconds since the sampler started, per sample.
    pub t: Vec<f64>,
    /// The newest acknowledged sequence number, per sample.
    pub newest: Vec<u64>,
    /// Per feed, the highest sequence number it held, per sample.
    pub held: Vec<Vec<u64>>,
}

impl Timeline {
    /// Lag of feed `i` at each sample.
    pub fn lag(&self, i: usize) -> impl Iterator<Item = u64> + '_ {
        self.newest
            .iter()
            .zip(self.held.get(i).into_iter().flatten())
            .map(|(n, h)| n.saturating_sub(*h))
    }

    /// The largest lag of feed `i`.
    pub fn max_lag(&self, i: usize) -> u64 {
        self.lag(i).max().unwrap_or(0)
    }

    /// `(seconds, lag)` points of feed `i`, at most ~600 (the largest lag of each bucket, so
    /// peaks survive).
    pub fn lag_points(&self, i: usize) -> Vec<(f64, f64)> {
        let lags: Vec<u64> = self.lag(i).collect();
        let k = lags.len().div_ceil(600).max(1);
        lags.chunks(k)
            .zip(self.t.chunks(k))
            .map(|(l, t)| {
                (
                    t.first().copied().unwrap_or(0.0),
                    l.iter().copied().max().unwrap_or(0) as f64,
                )
            })
            .collect()
    }
}

impl Sampler {
    /// Samples `newest()` and every probe every `every` until [`Sampler::finish`].
    pub fn spawn(
        probes: Vec<Arc<Probe>>,
        newest: impl Fn() -> u64 + Send + 'static,
        every: Duration,
    ) -> Sampler {
        let stop = CancellationToken::new();
        let task = {
            let stop = stop.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                let mut tl = Timeline {
                    held: vec![Vec::new(); probes.len()],
                    ..Timeline::default()
                };
                let mut tick = tokio::time::interval(every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        _ = tick.tick() => {}
                    }
                    // Probes first: a feed never appears ahead of the writer.
                    for (i, p) in probes.iter().enumerate() {
                        tl.held[i].push(p.last_seq());
                    }
                    tl.newest.push(newest());
                    tl.t.push(started.elapsed().as_secs_f64());
                }
                tl
            })
        };
        Sampler { stop, task }
    }

    /// Stops sampling and returns the timeline.
    pub async fn finish(self) -> Timeline {
        self.stop.cancel();
        self.task.await.unwrap_or_default()
    }
}
