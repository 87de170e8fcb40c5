//! The real feeds of a scenario's pipeline, watched from outside without changing them.
//!
//! [`watch`] gives each feed of a built [`Pipeline`] a [`Probe`], which the feed tells of
//! every entry it takes, as it starts processing it ([`feeds::FeedObserver`], where the feed's
//! own `tailrace_notification_latency_seconds` is measured): the highest event sequence
//! number the feed holds, and the notification latency (now − the engine's commit stamp)
//! under the feed's own rule (entries committed before the feed started are replays and get
//! no sample).
//!
//! Lag is counted in events: the newest acknowledged sequence number less the highest one the
//! feed holds. Every event is exactly one entry of each default feed (a record of `events`; a
//! change of its source's `source:<name>` rollup), so this is the feed's lag in the entries
//! its filter passes. A [`Sampler`] records it every 10 ms for the lag-over-time plot and the
//! maximum; a probe notes the exact moment its feed reached a target sequence number.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use feeds::{FeedHandle, FeedObserver};
use ingest::pipeline::Pipeline;
use serde_json::Value;
use store::clock::now_us;
use store::{Document, STAMP_FIELD};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::measure::Samples;

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

impl FeedObserver for Probe {
    fn entry(&self, doc: Option<&Document>, committed_at_us: Option<i64>) {
        self.saw(doc, committed_at_us);
    }
}

/// One feed of a pipeline and what watches it.
pub struct Watched {
    /// The feed's configured name.
    pub name: String,
    /// Its kind.
    pub kind: &'static str,
    /// What it took.
    pub probe: Arc<Probe>,
    /// The feed's own handle (status, restarts, gaps).
    pub handle: FeedHandle,
}

/// Every feed of `pipeline`, each with a probe, in configuration order.
pub fn watch(pipeline: &mut Pipeline) -> Watching {
    let handles: Vec<FeedHandle> = pipeline.feeds().iter().cloned().collect();
    let feeds = handles
        .into_iter()
        .map(|handle| {
            let probe = Arc::new(Probe::new());
            pipeline.observe_feed(&handle.name, probe.clone());
            Watched {
                name: handle.name.clone(),
                kind: handle.kind,
                probe,
                handle,
            }
        })
        .collect();
    Watching { feeds }
}

/// The watched feeds of one pipeline.
pub struct Watching {
    /// Each feed, in configuration order.
    pub feeds: Vec<Watched>,
}

impl Watching {
    /// Notes, for every feed, when it holds sequence number `seq`.
    pub fn watch_for(&self, seq: u64) {
        for f in &self.feeds {
            f.probe.watch_for(seq);
        }
    }

    /// Waits until every feed holds sequence number `seq`, or `timeout`; returns whether they
    /// all did.
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
