//! Restarts: a clean stop (SIGTERM) and a crash (SIGKILL) mid-stream, then a new run on the
//! same data. Every feed resumes right after its checkpoint, nothing acknowledged is missing,
//! and sequence completeness holds across the restart.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::Tailrace;
use futures::StreamExt;
use serde_json::Value;
use store::embedded::{EmbeddedOptions, EmbeddedStore};
use store::{CappedSpec, Start, Store};

/// A faster stream than the default, so a few seconds hold hundreds of events.
const SOURCES: &str =
    r#"[{ name = "sample", kind = "synthetic", rate_per_sec = 300.0, seed = 11 }]"#;

fn env() -> Vec<(&'static str, &'static str)> {
    vec![
        ("TAILRACE_SOURCES", SOURCES),
        ("TAILRACE_STATS__PERIOD", "3"),
        ("TAILRACE_STATS__CHECKPOINT_INTERVAL_MS", "200"),
    ]
}

/// What a stopped pipeline left in its data directory.
struct Stored {
    /// Sequence numbers of source `sample`, in position order.
    seqs: Vec<u64>,
    newest_position: u64,
    checkpoints: Vec<(String, Value)>,
    rollup_count: u64,
}

async fn inspect(dir: &Path) -> Stored {
    let store = EmbeddedStore::open(dir, EmbeddedOptions::default()).unwrap();
    // Same limits as the defaults, so opening does not evict anything.
    let spec = CappedSpec {
        max_docs: 100_000,
        max_bytes: 67_108_864,
        indexes: vec![],
    };
    let events = store.capped("events", &spec).await.unwrap();
    let newest = events
        .bounds()
        .await
        .unwrap()
        .expect("events were written")
        .newest;
    let mut tail = events.tail(Start::Oldest);
    let mut seqs = Vec::new();
    loop {
        let r = tokio::time::timeout(Duration::from_secs(10), tail.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        seqs.push(r.doc["_tailrace"]["seq"].as_u64().unwrap());
        if r.position == newest {
            break;
        }
    }
    let mut checkpoints = Vec::new();
    for feed in ["tail", "changes"] {
        checkpoints.push((
            feed.to_string(),
            store
                .load_checkpoint(feed)
                .await
                .unwrap()
                .expect("checkpoint saved"),
        ));
    }
    let rollups = store.keyed("rollups").await.unwrap();
    let rollup_count = rollups.get("source:sample").await.unwrap().unwrap()["count"]
        .as_u64()
        .unwrap();
    let store: Arc<dyn Store> = Arc::new(store);
    store.close().await.unwrap();
    Stored {
        seqs,
        newest_position: newest.0,
        checkpoints,
        rollup_count,
    }
}

fn assert_contiguous(seqs: &[u64], what: &str) {
    for (i, s) in seqs.iter().enumerate() {
        assert_eq!(
            *s,
            i as u64 + 1,
            "{what}: sequence numbers must be 1..=n in order, no gap, no duplicate (at index {i})"
        );
    }
}

fn checkpoint_events(cp: &Value) -> u64 {
    cp["stats"]["events"]
        .as_u64()
        .unwrap_or_else(|| panic!("checkpoint carries the statistics state: {cp}"))
}

async fn written(t: &Tailrace) -> f64 {
    t.metrics()
        .await
        .sum("tailrace_source_last_acked_seq", &[("source", "sample")])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_then_restart_resumes_every_feed_after_its_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let env = env();
    let mut t = Tailrace::start(dir.path(), &env).await;
    t.wait_until(
        "300 events acknowledged",
        Duration::from_secs(60),
        async |t| written(t).await >= 300.0,
    )
    .await;
    t.stop().await;

    let first = inspect(dir.path()).await;
    assert_contiguous(&first.seqs, "after the first run");
    let n1 = first.seqs.len() as u64;
    for (feed, cp) in &first.checkpoints {
        assert_eq!(
            checkpoint_events(cp),
            n1,
            "{feed}: a clean stop checkpoints after every written event"
        );
    }
    let (_, tail_cp) = &first.checkpoints[0];
    assert_eq!(
        tail_cp["position"].as_u64(),
        Some(first.newest_position),
        "tail checkpoint is at the newest event"
    );
    assert_eq!(first.rollup_count, n1, "one rollup update per event");

    let mut t = Tailrace::start(dir.path(), &env).await;
    let target = n1 as f64 + 300.0;
    t.wait_until("300 more events", Duration::from_secs(60), async |t| {
        written(t).await >= target
    })
    .await;
    let m = t.metrics().await;
    for feed in ["tail", "changes"] {
        assert_eq!(
            m.sum("tailrace_feed_missing_events_total", &[("feed", feed)]),
            0.0,
            "{feed}: nothing missing after a restart"
        );
        assert_eq!(
            m.sum("tailrace_feed_duplicate_events_total", &[("feed", feed)]),
            0.0,
            "{feed}: nothing replayed twice"
        );
        // The second run processes only the new events: the feed resumed after its checkpoint.
        let processed = m.sum("tailrace_feed_events_total", &[("feed", feed)]);
        assert!(
            processed < target - n1 as f64 + 600.0 && processed > 0.0,
            "{feed}: processed {processed} in the second run"
        );
    }
    t.stop().await;

    let second = inspect(dir.path()).await;
    assert_contiguous(&second.seqs, "after the restart (sequences continue)");
    let n2 = second.seqs.len() as u64;
    assert!(n2 >= n1 + 300);
    for (feed, cp) in &second.checkpoints {
        assert_eq!(
            checkpoint_events(cp),
            n2,
            "{feed}: every event processed exactly once across the restart"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_under_journaled_loses_no_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let env = env();
    let mut t = Tailrace::start(dir.path(), &env).await;
    t.wait_until(
        "300 events acknowledged",
        Duration::from_secs(60),
        async |t| written(t).await >= 300.0,
    )
    .await;
    let acked = written(&t).await as u64;
    t.signal("KILL");
    t.wait_exit(Duration::from_secs(10)).await;

    let crashed = inspect(dir.path()).await;
    assert_contiguous(&crashed.seqs, "after SIGKILL");
    let n1 = crashed.seqs.len() as u64;
    assert!(
        n1 >= acked,
        "every acknowledged event is stored: acknowledged {acked}, stored {n1}"
    );

    let mut t = Tailrace::start(dir.path(), &env).await;
    let target = n1 as f64 + 300.0;
    t.wait_until("300 more events", Duration::from_secs(60), async |t| {
        written(t).await >= target
    })
    .await;
    t.wait_until("both feeds caught up", Duration::from_secs(30), async |t| {
        let m = t.metrics().await;
        ["tail", "changes"]
            .iter()
            .all(|f| m.one("tailrace_feed_lag_events", &[("feed", f)]) == Some(0.0))
    })
    .await;
    let m = t.metrics().await;
    for feed in ["tail", "changes"] {
        assert_eq!(
            m.sum("tailrace_feed_missing_events_total", &[("feed", feed)]),
            0.0,
            "{feed}: nothing missing after a crash\n{}",
            t.report()
        );
        assert_eq!(
            m.sum("tailrace_feed_duplicate_events_total", &[("feed", feed)]),
            0.0,
            "{feed}: the checkpoint holds position and state together, so no replay is counted twice"
        );
    }
    t.stop().await;

    let after = inspect(dir.path()).await;
    assert_contiguous(&after.seqs, "after the crash and a restart");
    let n2 = after.seqs.len() as u64;
    for (feed, cp) in &after.checkpoints {
        assert_eq!(
            checkpoint_events(cp),
            n2,
            "{feed}: every event processed exactly once across the crash"
        );
    }
    assert_eq!(
        after.rollup_count, n2,
        "rollups caught up with the events written before the crash"
    );
}
