//! Feeds against the real embedded store: checkpoints resume with no gap and the same
//! statistics, and a feed overtaken by eviction records the gap and counts what it missed.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use feeds::kind::changes::ChangeReader;
use feeds::kind::tailable::Tail;
use feeds::stats::{Event, RollingStats, StatsConfig};
use feeds::{Feed, FeedHandle, FeedPosition, FeedSpec, FeedStatus};
use serde_json::json;
use store::embedded::{EmbeddedOptions, EmbeddedStore};
use store::{
    Capped, CappedSpec, ChangeFilter, Document, Durability, KeyUpdate, Keyed, KeyedDoc, Position,
    Stamp, Store, Update,
};
use tokio_util::sync::CancellationToken;

fn stats() -> StatsConfig {
    StatsConfig {
        period: 5,
        checkpoint_interval_ms: 50,
        ..StatsConfig::default()
    }
}

fn tail_spec(events: &Arc<dyn Capped>) -> FeedSpec {
    FeedSpec {
        name: "tail".into(),
        reader: Box::new(Tail::new(events.clone())),
        stats: stats(),
    }
}

fn changes_spec() -> FeedSpec {
    FeedSpec {
        name: "changes".into(),
        reader: Box::new(ChangeReader::changes(ChangeFilter {
            collections: vec!["rollups".into()],
            key_prefix: Some("source:".into()),
            ..ChangeFilter::default()
        })),
        stats: stats(),
    }
}

/// Event `seq` of source `s`: 5 events per second of stamp time, a varying value and tags.
fn event(seq: u64) -> Document {
    let doc = json!({
        "_tailrace": {"source": "s", "seq": seq, "received_us": 1_000_000_000 + seq as i64 * 200_000},
        "retweet_count": (seq * 7) % 11,
        "hashtags": [format!("t{}", seq % 3)],
    });
    doc.as_object().cloned().unwrap()
}

/// Folds event `seq` into `stats` as a feed would.
fn fold(stats: &mut RollingStats, seq: u64) {
    let doc = event(seq);
    let stamp = Stamp::of(&doc).unwrap();
    stats.on_event(&Event {
        t_us: stamp.received_us,
        stamp: Some(&stamp),
        doc: &doc,
    });
}

struct Running {
    handle: FeedHandle,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

async fn start(store: &Arc<dyn Store>, spec: FeedSpec) -> Running {
    let feed = Feed::new(spec, store.clone()).await.unwrap();
    let handle = feed.handle();
    let stop = CancellationToken::new();
    let task = tokio::spawn(feed.run(stop.clone()));
    Running { handle, stop, task }
}

impl Running {
    async fn wait(&self, what: &str, check: impl Fn(&FeedStatus) -> bool) -> FeedStatus {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let s = self.handle.status();
            if check(&s) {
                return s;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting until {what}; status {s:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn stop(self) {
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .unwrap()
            .unwrap();
    }
}

fn events_of(s: &FeedStatus) -> u64 {
    s.stats.as_ref().map_or(0, |x| x.events)
}

async fn open(
    dir: &tempfile::TempDir,
    oplog: u64,
) -> (Arc<dyn Store>, Arc<dyn Capped>, Arc<dyn Keyed>) {
    let store: Arc<dyn Store> = Arc::new(
        EmbeddedStore::open(
            dir.path(),
            EmbeddedOptions {
                oplog_max_entries: oplog,
                queue_capacity: 64,
            },
        )
        .unwrap(),
    );
    let events = store
        .capped(
            "events",
            &CappedSpec {
                max_docs: 20,
                max_bytes: 1 << 20,
                indexes: vec![],
            },
        )
        .await
        .unwrap();
    let rollups = store.keyed("rollups").await.unwrap();
    (store, events, rollups)
}

async fn append(events: &Arc<dyn Capped>, seqs: std::ops::RangeInclusive<u64>) {
    events
        .append(seqs.map(event).collect(), Durability::Journaled)
        .await
        .unwrap();
}

async fn update_rollup(rollups: &Arc<dyn Keyed>, seqs: std::ops::RangeInclusive<u64>) {
    let ups = seqs
        .map(|seq| {
            let e = event(seq);
            let u = Update::inc("count", 1)
                .and_set("_tailrace", e["_tailrace"].clone())
                .and_set("retweet_count", e["retweet_count"].clone())
                .and_set("hashtags", e["hashtags"].clone());
            KeyUpdate::new("source:s", u)
        })
        .collect();
    rollups.update(ups, Durability::Journaled).await.unwrap();
}

#[tokio::test]
async fn a_restart_resumes_after_the_checkpoint_with_the_same_statistics() {
    let dir = tempfile::tempdir().unwrap();
    let (store, events, _) = open(&dir, 10_000).await;
    append(&events, 1..=12).await;
    let feed = start(&store, tail_spec(&events)).await;
    feed.wait("12 events processed", |s| events_of(s) == 12)
        .await;
    feed.stop().await;

    append(&events, 13..=18).await;
    let feed = start(&store, tail_spec(&events)).await;
    let status = feed
        .wait("18 events processed", |s| events_of(s) == 18)
        .await;
    feed.stop().await;

    // The same 18 samples through one uninterrupted statistics object.
    let mut reference = RollingStats::new(&stats(), "reference");
    for seq in 1..=18 {
        fold(&mut reference, seq);
    }
    let (got, want) = (status.stats.unwrap(), reference.snapshot());
    assert_eq!(got.count("missing"), Some(0), "no gap across the restart");
    assert_eq!(got.count("duplicates"), Some(0), "no event processed twice");
    assert_eq!(
        got.get("rate_bands"),
        want.get("rate_bands"),
        "rate bands continue where they were"
    );
    assert_eq!(
        got.get("value_bands"),
        want.get("value_bands"),
        "value bands continue where they were"
    );
    assert_eq!(got.get("top"), want.get("top"));
    assert!(
        got.get("value_bands").is_some_and(|b| !b.is_null()),
        "18 values > period 5: bands exist"
    );
}

#[tokio::test]
async fn an_overtaken_tailable_feed_records_the_gap_and_counts_the_missing_events() {
    let dir = tempfile::tempdir().unwrap();
    let (store, events, _) = open(&dir, 10_000).await;
    append(&events, 1..=10).await;
    let feed = start(&store, tail_spec(&events)).await;
    feed.wait("10 events processed", |s| events_of(s) == 10)
        .await;
    feed.stop().await;

    // 50 more into a collection that keeps 20: events 11..=40 are evicted while it is stopped.
    append(&events, 11..=60).await;
    let feed = start(&store, tail_spec(&events)).await;
    let status = feed
        .wait("60 seen", |s| {
            s.position == Some(FeedPosition::Tail(Position(60)))
        })
        .await;
    feed.stop().await;
    let stats = status.stats.unwrap();
    assert_eq!(status.gaps, 1, "one gap recorded");
    assert_eq!(
        stats.count("missing"),
        Some(30),
        "missing equals the gap: events 11..=40"
    );
    assert_eq!(stats.events, 30, "10 before, 20 retained after");
    assert_eq!(stats.count("duplicates"), Some(0));

    let gaps = store
        .keyed("gaps")
        .await
        .unwrap()
        .scan("tail:")
        .await
        .unwrap();
    assert_eq!(gaps.len(), 1, "one gap document: {gaps:?}");
    let g = &gaps[0].doc;
    assert_eq!(
        (g["reason"].as_str(), g["from"].as_u64(), g["to"].as_u64()),
        (Some("position_lost"), Some(10), Some(41))
    );
    assert_eq!(
        g["missed"],
        json!(30),
        "the gap document says how many were missed"
    );
}

#[tokio::test]
async fn a_change_feed_past_the_history_records_the_gap_and_keeps_going() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _, rollups) = open(&dir, 50).await;
    update_rollup(&rollups, 1..=10).await;
    let feed = start(&store, changes_spec()).await;
    feed.wait("10 changes processed", |s| events_of(s) == 10)
        .await;
    feed.stop().await;

    // 100 more changes into an op log that keeps 50: at least changes 11..=60 are gone (the
    // gap document itself is a change too, and may push one more out).
    update_rollup(&rollups, 11..=110).await;
    let feed = start(&store, changes_spec()).await;
    let accounted = |s: &FeedStatus| {
        s.stats
            .as_ref()
            .map_or(0, |x| x.events + x.count("missing").unwrap_or(0))
    };
    let status = feed
        .wait("every change up to 110 seen or counted missing", |s| {
            accounted(s) == 110
        })
        .await;
    // And it keeps following live changes.
    update_rollup(&rollups, 111..=111).await;
    let status_after = feed.wait("a live change", |s| accounted(s) == 111).await;
    feed.stop().await;
    let stats = status.stats.unwrap();
    assert_eq!(status.gaps, 1);
    let missing = stats.count("missing").unwrap();
    assert!(
        (50..=52).contains(&missing),
        "missing covers the lost history 11..=60: {missing}"
    );
    assert_eq!(stats.count("duplicates"), Some(0));
    let after = status_after.stats.unwrap();
    assert_eq!(
        after.count("missing"),
        Some(missing),
        "no new loss afterwards"
    );
    assert_eq!(after.events, stats.events + 1);
    let gaps = store
        .keyed("gaps")
        .await
        .unwrap()
        .scan("changes:")
        .await
        .unwrap();
    assert_eq!(gaps.len(), 1);
    assert_eq!(gaps[0].doc["reason"], json!("history_lost"));
    let missed = gaps[0].doc["missed"].as_u64().unwrap();
    assert!(
        missed >= 50,
        "the gap document counts the lost op-log entries: {missed}"
    );
}

/// The `stats` document of a feed carries the notification latency of its own window
/// (`notify_us`: p50 ≤ p99, and the count of events since the previous document), which the
/// status line's window does not reset.
#[tokio::test]
async fn the_stats_document_carries_the_notification_latency_window() {
    let dir = tempfile::tempdir().unwrap();
    let (store, events, _) = open(&dir, 1000).await;
    let stats_docs = store.keyed("stats").await.unwrap();
    let feed = start(&store, tail_spec(&events)).await;
    // Written after the feed started: these get latency samples (earlier ones are replays).
    append(&events, 1..=5).await;
    feed.wait("5 events folded in", |s| events_of(s) == 5).await;
    // The status line takes its own window; the document's must not be emptied by it.
    let _ = feed.handle.take_latency_p50_us();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let notify = loop {
        let doc = stats_docs.get("tail").await.unwrap();
        let n = doc.as_ref().map(|d| d["notify_us"].clone());
        if let Some(n) = n.filter(|n| n["count"].as_u64().unwrap_or(0) > 0) {
            break n;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no stats document with notify_us samples; last saw {doc:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let (p50, p99, count) = (
        notify["p50"].as_u64().unwrap(),
        notify["p99"].as_u64().unwrap(),
        notify["count"].as_u64().unwrap(),
    );
    assert!(
        (1..=5).contains(&count),
        "the window counts this run's events, at most 5; saw {notify}"
    );
    assert!(
        p50 >= 1 && p50 <= p99 && p99 < 10_000_000,
        "plausible quantiles: 1 µs <= p50 <= p99 < 10 s; saw {notify}"
    );
    feed.stop().await;
}

/// A change feed whose newest op-log entries are all ones its filter skips (the hashtag
/// counters written after the last `source:` summary) stops at once: it used to wait for an
/// item that never came and held every such stop for its whole 2 s drain deadline.
#[tokio::test]
async fn a_change_feed_whose_newest_entries_are_filtered_out_stops_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _, rollups) = open(&dir, 10_000).await;
    update_rollup(&rollups, 1..=5).await;
    let feed = start(&store, changes_spec()).await;
    feed.wait("5 changes processed", |s| events_of(s) == 5)
        .await;
    // Written while the feed follows live, right before the stop.
    let counters = (0..200)
        .map(|i| KeyUpdate::new(format!("hashtags:tag{i}"), Update::inc("count", 1)))
        .collect();
    rollups
        .update(counters, Durability::Journaled)
        .await
        .unwrap();
    let started = std::time::Instant::now();
    feed.stop().await;
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(1500),
        "the stop waited {took:?} for entries the filter skips (the drain deadline is 2 s)"
    );
}

/// Statistics are published every `publish_interval_ms`; the checkpoint (the whole top-k
/// window, a journaled commit) only every `checkpoint_interval_ms` and when the feed stops.
/// A feed that dies between checkpoints replays from the last one: no gap, no duplicate.
#[tokio::test]
async fn statistics_are_published_often_and_checkpoints_saved_at_their_own_interval() {
    let dir = tempfile::tempdir().unwrap();
    let (store, events, _) = open(&dir, 1000).await;
    let stats_docs = store.keyed("stats").await.unwrap();
    let spec = |checkpoint_interval_ms| FeedSpec {
        name: "tail".into(),
        reader: Box::new(Tail::new(events.clone())),
        stats: StatsConfig {
            period: 5,
            publish_interval_ms: 20,
            checkpoint_interval_ms,
            ..StatsConfig::default()
        },
    };
    let saved_events = |store: Arc<dyn Store>| async move {
        let cp = store.load_checkpoint("tail").await.unwrap();
        cp.map(|c| c["position"].clone())
    };

    let feed = start(&store, spec(3_600_000)).await;
    append(&events, 1..=6).await;
    feed.wait("6 events processed", |s| events_of(s) == 6).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let doc = stats_docs.get("tail").await.unwrap();
        if doc
            .as_ref()
            .is_some_and(|d| d["stats"]["events"] == json!(6))
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the stats document shows the 6 events; last saw {doc:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Many publish ticks later, still no checkpoint: its interval is an hour.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        saved_events(store.clone()).await,
        None,
        "no checkpoint before its interval"
    );
    // Dies without stopping: nothing saved, so the next run replays from the start.
    feed.task.abort();
    let _ = feed.task.await;

    let feed = start(&store, spec(3_600_000)).await;
    feed.wait("6 events replayed", |s| events_of(s) == 6).await;
    append(&events, 7..=9).await;
    let status = feed.wait("9 events processed", |s| events_of(s) == 9).await;
    let stats = status.stats.unwrap();
    assert_eq!(stats.count("missing"), Some(0), "no gap after the replay");
    assert_eq!(stats.count("duplicates"), Some(0), "no event counted twice");
    // A clean stop saves the checkpoint whatever the interval.
    feed.stop().await;
    assert!(
        saved_events(store.clone()).await.is_some(),
        "a stopping feed saves its checkpoint"
    );

    // A short interval saves while running.
    let feed = start(&store, spec(50)).await;
    append(&events, 10..=12).await;
    feed.wait("12 events processed", |s| events_of(s) == 12)
        .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let cp = store.load_checkpoint("tail").await.unwrap().unwrap();
        if cp["position"] == json!(12) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "a checkpoint at position 12 while running; last saw {}",
            cp["position"]
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    feed.stop().await;
}

/// The embedded store, except that a checkpoint save waits at a gate: a checkpoint stuck
/// behind a large batch at the store's writer, made as long as the test needs.
struct GatedCheckpoints {
    inner: Arc<dyn Store>,
    gate: Arc<tokio::sync::Semaphore>,
    /// Saves that reached the gate.
    waiting: Arc<std::sync::atomic::AtomicUsize>,
}

#[async_trait::async_trait]
impl Store for GatedCheckpoints {
    fn engine(&self) -> &'static str {
        self.inner.engine()
    }
    async fn capped(&self, name: &str, spec: &CappedSpec) -> store::Result<Arc<dyn Capped>> {
        self.inner.capped(name, spec).await
    }
    async fn keyed(&self, name: &str) -> store::Result<Arc<dyn Keyed>> {
        self.inner.keyed(name).await
    }
    fn changes(&self, filter: ChangeFilter, start: store::ChangeStart) -> store::ChangeStream {
        self.inner.changes(filter, start)
    }
    async fn newest_change(&self) -> store::Result<Option<store::ResumeToken>> {
        self.inner.newest_change().await
    }
    async fn changes_after(&self, token: &store::ResumeToken) -> store::Result<Option<u64>> {
        self.inner.changes_after(token).await
    }
    async fn oldest_change_at(&self) -> store::Result<Option<i64>> {
        self.inner.oldest_change_at().await
    }
    async fn load_checkpoint(&self, feed: &str) -> store::Result<Option<serde_json::Value>> {
        self.inner.load_checkpoint(feed).await
    }
    async fn save_checkpoint(
        &self,
        feed: &str,
        checkpoint: serde_json::Value,
        durability: Durability,
    ) -> store::Result<()> {
        self.waiting
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let _pass = self.gate.acquire().await.unwrap();
        self.inner
            .save_checkpoint(feed, checkpoint, durability)
            .await
    }
    async fn close(&self) -> store::Result<()> {
        self.inner.close().await
    }
}

/// A feed goes on with its events while its checkpoint is being written: the checkpoint
/// (and the `stats` document) wait their turn at the store's writer, which may be committing
/// a large batch, and a feed that waited with them held back every event committed meanwhile.
/// Nothing is lost either way: a stop waits for the write under way and saves its own.
#[tokio::test]
async fn a_feed_goes_on_with_its_events_while_its_checkpoint_is_being_written() {
    let dir = tempfile::tempdir().unwrap();
    let (inner, events, _) = open(&dir, 1000).await;
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let waiting = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let store: Arc<dyn Store> = Arc::new(GatedCheckpoints {
        inner: inner.clone(),
        gate: gate.clone(),
        waiting: waiting.clone(),
    });
    let feed = start(&store, tail_spec(&events)).await;
    append(&events, 1..=3).await;
    feed.wait("3 events processed", |s| events_of(s) == 3).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while waiting.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the feed tries to save a checkpoint within its 50 ms interval"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    append(&events, 4..=9).await;
    let status = feed
        .wait("9 events processed while the checkpoint waits", |s| {
            events_of(s) == 9
        })
        .await;
    assert_eq!(status.stats.unwrap().count("missing"), Some(0));
    assert_eq!(
        waiting.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "one checkpoint write at a time"
    );
    assert_eq!(
        inner.load_checkpoint("tail").await.unwrap(),
        None,
        "the checkpoint is still waiting"
    );

    gate.add_permits(1_000);
    feed.stop().await;
    let saved = inner.load_checkpoint("tail").await.unwrap().unwrap();
    assert_eq!(
        saved["position"],
        json!(9),
        "the stop saved the position of the last event"
    );
}

/// The capped collection the scripted-trend tests replay their events from.
async fn scripted(store: &Arc<dyn Store>) -> Arc<dyn Capped> {
    store
        .capped(
            "scripted",
            &CappedSpec {
                max_docs: 100_000,
                max_bytes: 64 << 20,
                indexes: vec![],
            },
        )
        .await
        .unwrap()
}

/// The `trends` documents whose key starts with `prefix`, once there are at least `n` of them
/// (or 10 s have passed).
async fn trends_written(store: &Arc<dyn Store>, prefix: &str, n: usize) -> Vec<KeyedDoc> {
    let trends = store.keyed("trends").await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let docs = trends.scan(prefix).await.unwrap();
        if docs.len() >= n || tokio::time::Instant::now() > deadline {
            return docs;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A scripted burst and a dip of the rate, replayed through a tailable feed: exactly one `up`
/// and one `down` trend document in `trends`, at the seconds that completed them, and none
/// for the steady seconds around them.
#[tokio::test]
async fn a_burst_and_a_dip_write_one_trend_each() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _, _) = open(&dir, 10_000).await;
    let events = scripted(&store).await;
    // Events per second: a steady 4, 5, 6, 5, ... then a burst of 20 a second for 5 s, steady
    // again (long enough for the burst to leave the 20-second bands), 5 silent seconds, steady
    // again; ending 3 s before now, so that no silence up to
    // now breaks out.
    let steady = |n: usize| (0..n).map(|i| [4, 5, 6, 5][i % 4]).collect::<Vec<u64>>();
    let mut per_second = steady(30);
    let burst_at = per_second.len() as i64;
    per_second.extend([20; 5]);
    per_second.extend(steady(30));
    let dip_at = per_second.len() as i64;
    per_second.extend([0; 5]);
    per_second.extend(steady(20));
    let now_s = store::clock::now_us() / 1_000_000;
    let first_s = now_s - 3 - per_second.len() as i64;
    let mut seq = 0;
    let mut docs = Vec::new();
    for (s, n) in per_second.iter().enumerate() {
        for k in 0..*n {
            seq += 1;
            let at = (first_s + s as i64) * 1_000_000 + k as i64 * (1_000_000 / *n as i64);
            docs.push(
                json!({"_tailrace": {"source": "s", "seq": seq, "received_us": at}})
                    .as_object()
                    .cloned()
                    .unwrap(),
            );
        }
    }
    events.append(docs, Durability::Journaled).await.unwrap();
    let feed = start(
        &store,
        FeedSpec {
            name: "scripted".into(),
            reader: Box::new(Tail::new(events.clone())),
            stats: StatsConfig {
                period: 20,
                k: 2.0,
                checkpoint_interval_ms: 50,
                ..StatsConfig::default()
            },
        },
    )
    .await;
    feed.wait("every event", |s| events_of(s) == seq).await;
    let docs = trends_written(&store, "scripted:", 2).await;
    feed.stop().await;
    let seen: Vec<(String, String)> = docs
        .iter()
        .map(|d| {
            (
                d.key.clone(),
                d.doc["direction"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    // A breakout is completed by the third second beyond its band.
    let up = first_s + burst_at + 2;
    let down = first_s + dip_at + 2;
    assert_eq!(
        seen,
        vec![
            (format!("scripted:rate:{up}"), "up".to_owned()),
            (format!("scripted:rate:{down}"), "down".to_owned()),
        ]
    );
    let up_doc = &docs[0].doc;
    assert_eq!(up_doc["feed"], "scripted");
    assert_eq!(up_doc["rate"], 20.0);
    assert_eq!(up_doc["window_s"], 20);
    assert!(
        up_doc["band"]["upper"].as_f64().unwrap() < 20.0,
        "{up_doc:?}"
    );
    assert_eq!(
        store::date::millis(&up_doc["at"]),
        Some(up * 1000),
        "the second that completed it"
    );
}

/// A hashtag that appears from nothing in 30 % of the events, after five steady minutes
/// replayed through a tailable feed: exactly one `value` trend document in `trends`, up, for
/// that hashtag, at the second its count over the minute passed the band, and none for the
/// hashtags and languages that held their share.
#[tokio::test]
async fn a_new_hashtag_writes_one_value_trend() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _, _) = open(&dir, 100_000).await;
    let events = scripted(&store).await;
    // Ten events a second for 300 s, hashtags a..e in turn, languages en and ja in turn;
    // then 20 s in which three of every ten carry `New` instead; ending 3 s before now.
    let (steady_s, rising_s) = (300i64, 20i64);
    let now_s = store::clock::now_us() / 1_000_000;
    let first_s = now_s - 3 - steady_s - rising_s;
    let mut seq = 0;
    let mut docs = Vec::new();
    for s in 0..steady_s + rising_s {
        for k in 0..10i64 {
            seq += 1;
            let at = (first_s + s) * 1_000_000 + k * 100_000;
            let tag = if s >= steady_s && k % 10 < 3 {
                "New".to_owned()
            } else {
                ["a", "b", "c", "d", "e"][(k % 5) as usize].to_owned()
            };
            let lang = ["en", "ja"][(k % 2) as usize];
            docs.push(
                json!({"_tailrace": {"source": "s", "seq": seq, "received_us": at},
                       "hashtags": [tag], "lang": lang})
                .as_object()
                .cloned()
                .unwrap(),
            );
        }
    }
    events.append(docs, Durability::Journaled).await.unwrap();
    let feed = start(
        &store,
        FeedSpec {
            name: "scripted".into(),
            reader: Box::new(Tail::new(events.clone())),
            stats: StatsConfig {
                checkpoint_interval_ms: 50,
                ..StatsConfig::default()
            },
        },
    )
    .await;
    feed.wait("every event", |s| events_of(s) == seq).await;
    let docs = trends_written(&store, "scripted:value:", 1).await;
    let trends = store.keyed("trends").await.unwrap();
    // Another tick or two: no other value may follow. (The rate breaks out down in the
    // silence after the stream: not this test's business.)
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let all = trends.scan("scripted:value:").await.unwrap();
    feed.stop().await;
    // Its count over the minute goes 3, 6, 9, 12: a value never seen is expected once a
    // minute, and a Poisson count of mean 1 reaches 10 with less than 5σ's probability.
    let up = first_s + steady_s + 3;
    let keys: Vec<&str> = all.iter().map(|d| d.key.as_str()).collect();
    assert_eq!(
        keys,
        [format!("scripted:value:hashtags:{up}:new")],
        "{all:?}"
    );
    let doc = &docs[0].doc;
    assert_eq!(doc["statistic"], "value");
    assert_eq!(doc["field"], "hashtags");
    assert_eq!(doc["value"], "new");
    assert_eq!(doc["direction"], "up");
    assert_eq!(doc["rate"], 12.0);
    assert_eq!(doc["events"], 600);
    assert_eq!(doc["band"]["middle"], 0.0);
    assert_eq!(doc["band"]["upper"], 9.0);
    assert_eq!(doc["feed"], "scripted");
    assert_eq!(store::date::millis(&doc["at"]), Some(up * 1000));
}

/// A gap of sequence numbers the store refused (their events kept as dead letters with reason
/// `store_rejected`) is refused, not missing; a number no letter accounts for is missing, and
/// so is one whose letter says another reason or names another source.
#[tokio::test]
async fn refused_numbers_are_not_missing() {
    let dir = tempfile::tempdir().unwrap();
    let (store, events, _) = open(&dir, 10_000).await;
    let spec = CappedSpec {
        max_docs: 1_000,
        max_bytes: 1 << 20,
        indexes: vec![],
    };
    let letters = store.capped("dead_letters", &spec).await.unwrap();
    let letter = |source: &str, seq: u64, reason: &str| {
        json!({"source": source, "seq": seq, "reason": reason, "detail": "x", "raw": "{}"})
            .as_object()
            .cloned()
            .unwrap()
    };
    // Source s: 1 2 3 _ 5 6 _ _ 9 10 _ 12. Refused: 4 and 11; 7 refused for another source
    // only; 8 a dead letter for another reason (never stamped into `events` as 8 would be).
    letters
        .append(
            vec![
                letter("s", 4, "store_rejected"),
                letter("t", 7, "store_rejected"),
                letter("s", 8, "oversized"),
                letter("s", 11, "store_rejected"),
            ],
            Durability::Journaled,
        )
        .await
        .unwrap();
    let now = store::clock::now_us();
    let docs: Vec<Document> = [1u64, 2, 3, 5, 6, 9, 10, 12]
        .iter()
        .map(|seq| {
            json!({"_tailrace": {"source": "s", "seq": seq, "received_us": now}})
                .as_object()
                .cloned()
                .unwrap()
        })
        .collect();
    events.append(docs, Durability::Journaled).await.unwrap();
    let mut feed = Feed::new(
        FeedSpec {
            name: "audit".into(),
            reader: Box::new(Tail::new(events.clone())),
            stats: StatsConfig::default(),
        },
        store.clone(),
    )
    .await
    .unwrap();
    feed.refusals_from(letters);
    let handle = feed.handle();
    let stop = CancellationToken::new();
    let task = tokio::spawn(feed.run(stop.clone()));
    let running = Running { handle, stop, task };
    let s = running.wait("every event", |s| events_of(s) == 8).await;
    let stats = s.stats.unwrap();
    assert_eq!(
        (stats.count("missing"), stats.count("refused")),
        (Some(2), Some(2)),
        "7 and 8 missing, 4 and 11 refused: {stats:?}"
    );
    running.stop().await;
}
