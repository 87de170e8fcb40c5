//! Feeds against the real embedded store: checkpoints resume with no gap and the same
//! statistics, and a feed overtaken by eviction records the gap and counts what it missed.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use feeds::sample::Fields;
use feeds::stats::{EventSample, RollingStats, StatsConfig};
use feeds::{Feed, FeedHandle, FeedKind, FeedSpec, FeedStatus};
use serde_json::json;
use store::embedded::{EmbeddedOptions, EmbeddedStore};
use store::{Capped, CappedSpec, ChangeFilter, Document, Durability, Keyed, Store, Update};
use tokio_util::sync::CancellationToken;

fn spec(name: &str, kind: FeedKind) -> FeedSpec {
    FeedSpec {
        name: name.into(),
        kind,
        collection: "events".into(),
        filter: ChangeFilter {
            collections: vec!["rollups".into()],
            key_prefix: Some("source:".into()),
            ..ChangeFilter::default()
        },
        stats: StatsConfig {
            period: 5,
            ..StatsConfig::default()
        },
        fields: Fields {
            value: "retweet_count".into(),
            topk: "hashtags".into(),
        },
        checkpoint_interval: Duration::from_millis(50),
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

fn sample(seq: u64) -> EventSample {
    EventSample {
        t_us: 1_000_000_000 + seq as i64 * 200_000,
        source: Some("s".into()),
        seq: Some(seq),
        value: Some(((seq * 7) % 11) as f64),
        keys: vec![format!("t{}", seq % 3)],
    }
}

struct Running {
    handle: FeedHandle,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

async fn start(store: &Arc<dyn Store>, spec: FeedSpec, capped: Option<Arc<dyn Capped>>) -> Running {
    let feed = Feed::new(spec, store.clone(), capped).await.unwrap();
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
            ("source:s".to_string(), u)
        })
        .collect();
    rollups.update(ups, Durability::Journaled).await.unwrap();
}

#[tokio::test]
async fn a_restart_resumes_after_the_checkpoint_with_the_same_statistics() {
    let dir = tempfile::tempdir().unwrap();
    let (store, events, _) = open(&dir, 10_000).await;
    append(&events, 1..=12).await;
    let feed = start(
        &store,
        spec("tail", FeedKind::Tailable),
        Some(events.clone()),
    )
    .await;
    feed.wait("12 events processed", |s| events_of(s) == 12)
        .await;
    feed.stop().await;

    append(&events, 13..=18).await;
    let feed = start(
        &store,
        spec("tail", FeedKind::Tailable),
        Some(events.clone()),
    )
    .await;
    let status = feed
        .wait("18 events processed", |s| events_of(s) == 18)
        .await;
    feed.stop().await;

    // The same 18 samples through one uninterrupted statistics object.
    let mut reference = RollingStats::new(StatsConfig {
        period: 5,
        ..StatsConfig::default()
    });
    let mut last = None;
    for seq in 1..=18 {
        last = Some(reference.on_event(&sample(seq)));
    }
    let (got, want) = (status.stats.unwrap(), last.unwrap());
    assert_eq!(got.missing, 0, "no gap across the restart");
    assert_eq!(got.duplicates, 0, "no event processed twice");
    assert_eq!(
        got.rate_bands, want.rate_bands,
        "rate bands continue where they were"
    );
    assert_eq!(
        got.value_bands, want.value_bands,
        "value bands continue where they were"
    );
    assert_eq!(got.top, want.top);
    assert!(
        got.value_bands.is_some(),
        "18 values > period 5: bands exist"
    );
}

#[tokio::test]
async fn an_overtaken_tailable_feed_records_the_gap_and_counts_the_missing_events() {
    let dir = tempfile::tempdir().unwrap();
    let (store, events, _) = open(&dir, 10_000).await;
    append(&events, 1..=10).await;
    let feed = start(
        &store,
        spec("tail", FeedKind::Tailable),
        Some(events.clone()),
    )
    .await;
    feed.wait("10 events processed", |s| events_of(s) == 10)
        .await;
    feed.stop().await;

    // 50 more into a collection that keeps 20: events 11..=40 are evicted while it is stopped.
    append(&events, 11..=60).await;
    let feed = start(
        &store,
        spec("tail", FeedKind::Tailable),
        Some(events.clone()),
    )
    .await;
    let status = feed
        .wait("60 seen", |s| s.position == Some(json!(60)))
        .await;
    feed.stop().await;
    let stats = status.stats.unwrap();
    assert_eq!(status.gaps, 1, "one gap recorded");
    assert_eq!(stats.missing, 30, "missing equals the gap: events 11..=40");
    assert_eq!(stats.events, 30, "10 before, 20 retained after");
    assert_eq!(stats.duplicates, 0);

    let gaps = store
        .keyed("gaps")
        .await
        .unwrap()
        .scan("tail:")
        .await
        .unwrap();
    assert_eq!(gaps.len(), 1, "one gap document: {gaps:?}");
    let g = &gaps[0].1;
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
    let feed = start(&store, spec("changes", FeedKind::Changes), None).await;
    feed.wait("10 changes processed", |s| events_of(s) == 10)
        .await;
    feed.stop().await;

    // 100 more changes into an op log that keeps 50: at least changes 11..=60 are gone (the
    // gap document itself is a change too, and may push one more out).
    update_rollup(&rollups, 11..=110).await;
    let feed = start(&store, spec("changes", FeedKind::Changes), None).await;
    let accounted = |s: &FeedStatus| s.stats.as_ref().map_or(0, |x| x.events + x.missing);
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
    assert!(
        (50..=52).contains(&stats.missing),
        "missing covers the lost history 11..=60: {}",
        stats.missing
    );
    assert_eq!(stats.duplicates, 0);
    let after = status_after.stats.unwrap();
    assert_eq!(after.missing, stats.missing, "no new loss afterwards");
    assert_eq!(after.events, stats.events + 1);
    let gaps = store
        .keyed("gaps")
        .await
        .unwrap()
        .scan("changes:")
        .await
        .unwrap();
    assert_eq!(gaps.len(), 1);
    assert_eq!(gaps[0].1["reason"], json!("history_lost"));
    let missed = gaps[0].1["missed"].as_u64().unwrap();
    assert!(
        missed >= 50,
        "the gap document counts the lost op-log entries: {missed}"
    );
}
