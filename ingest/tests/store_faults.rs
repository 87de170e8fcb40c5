//! What the store refuses does not stop ingestion: the ingester isolates it and goes on.
//!
//! The refusals are real: a validation rule of the embedded engine
//! (`EmbeddedStore::set_validator`, MongoDB's query validators) refuses some documents.
//! Before, a permanent error was retried forever: the sources blocked and the stop could not
//! flush.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use ingest::ingester::{Handed, IngestOptions, IngestStats, Ingester, StoreHealth};
use ingest::source::Raw;
use serde_json::{Value, json};
use store::embedded::{EmbeddedOptions, EmbeddedStore};
use store::{CappedSpec, Durability, Stamp, Start, Store};
use tokio::sync::mpsc;

struct Rig {
    _dir: tempfile::TempDir,
    store: EmbeddedStore,
}

async fn rig() -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).unwrap();
    Rig { _dir: dir, store }
}

fn rule(v: Value) -> Option<store::Filter> {
    Some(store::Filter::parse(&v).unwrap())
}

/// Runs the ingester over `events` (every one from source `s`) and waits until it flushed.
async fn ingest(r: &Rig, events: Vec<Value>) -> Arc<StoreHealth> {
    ingest_in_bursts(r, vec![events], 64).await
}

/// Runs the ingester over `bursts` of events (every one from source `s`), handed over 10 ms
/// apart, in batches of at most `batch_max_events`, and waits until it flushed.
async fn ingest_in_bursts(
    r: &Rig,
    bursts: Vec<Vec<Value>>,
    batch_max_events: usize,
) -> Arc<StoreHealth> {
    let spec = CappedSpec {
        max_docs: 100_000,
        max_bytes: 1 << 26,
        indexes: vec!["_tailrace.source".into(), "source".into()],
    };
    let health = Arc::new(StoreHealth::new());
    let ingester = Ingester {
        events: r.store.capped("events", &spec).await.unwrap(),
        dead_letters: r.store.capped("dead_letters", &spec).await.unwrap(),
        rollups: r.store.keyed("rollups").await.unwrap(),
        options: IngestOptions {
            batch_max_events,
            batch_max_wait: Duration::from_millis(2),
            max_event_bytes: 1 << 16,
            rollup_fields: vec!["lang".into()],
            summary_fields: vec!["n".into(), "tags".into()],
            durability: Durability::Journaled,
            geo: Default::default(),
        },
        engine: "embedded",
        stats: Arc::new(IngestStats::default()),
        health: health.clone(),
        observer: None,
    };
    let (tx, rx) = mpsc::channel::<Handed>(1024);
    let task = tokio::spawn(ingester.run(rx));
    let mut i = 0;
    for events in bursts {
        for e in events {
            let h = Handed {
                source: Arc::from("s"),
                raw: Raw::Json(e),
                received_us: 1_700_000_000_000_000 + i,
                position: None,
            };
            i += 1;
            tx.send(h).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(tx);
    tokio::time::timeout(Duration::from_secs(60), task)
        .await
        .expect("the ingester flushed and stopped: nothing stalled")
        .unwrap();
    health
}

async fn all(r: &Rig, coll: &str) -> Vec<store::Record> {
    let spec = CappedSpec {
        max_docs: 100_000,
        max_bytes: 1 << 26,
        indexes: vec![],
    };
    let c = r.store.capped(coll, &spec).await.unwrap();
    let Some(b) = c.bounds().await.unwrap() else {
        return Vec::new();
    };
    let mut tail = c.tail(Start::Oldest);
    let mut out = Vec::new();
    use futures::StreamExt;
    while let Some(rec) = tokio::time::timeout(Duration::from_secs(10), tail.next())
        .await
        .unwrap()
    {
        let rec = rec.unwrap();
        let last = rec.position >= b.newest;
        out.push(rec);
        if last {
            break;
        }
    }
    out
}

fn event(i: u64, poison: bool) -> Value {
    let mut e = json!({"i": i, "n": i % 7, "lang": if i.is_multiple_of(3) { "ja" } else { "en" },
                       "tags": ["東京", "rust"], "text": format!("event {i} 🦀")});
    if poison {
        e["poison"] = json!(true);
    }
    e
}

#[tokio::test]
async fn events_the_store_refuses_become_dead_letters_and_the_rest_is_stored_in_order() {
    let r = rig().await;
    // Set on an existing collection: open it first through a run.
    ingest(&r, vec![event(0, false)]).await;
    r.store
        .set_validator("events", rule(json!({"poison": {"$exists": false}})))
        .await
        .unwrap();
    let poisoned = |i: u64| i % 37 == 5;
    let events: Vec<Value> = (1..=300).map(|i| event(i, poisoned(i))).collect();
    let n_poison = (1..=300).filter(|i| poisoned(*i)).count();
    let health = ingest(&r, events).await;

    let stored = all(&r, "events").await;
    let ids: Vec<u64> = stored
        .iter()
        .map(|r| r.doc["i"].as_u64().unwrap())
        .collect();
    let expected: Vec<u64> = (0..=300).filter(|i| !poisoned(*i)).collect();
    assert_eq!(ids, expected, "every event but the refused ones, in order");
    let letters: Vec<store::Record> = all(&r, "dead_letters").await;
    assert_eq!(letters.len(), n_poison, "one dead letter per refused event");
    for l in &letters {
        assert_eq!(l.doc["reason"], json!("store_rejected"), "{:?}", l.doc);
        let detail = l.doc["detail"].as_str().unwrap();
        assert!(
            detail.contains("failed validation") && detail.contains("poison"),
            "the dead letter keeps the store's reason: {detail}"
        );
        let raw: Value = serde_json::from_str(l.doc["raw"].as_str().unwrap()).unwrap();
        assert_eq!(raw["poison"], json!(true), "the raw event is kept whole");
        let stamp = raw.as_object().and_then(Stamp::of);
        assert!(
            stamp.is_some_and(|s| s.source == "s"),
            "the stamp is kept: {raw}"
        );
    }
    assert_eq!(
        health.unwritable_reason(),
        None,
        "a refusal is not an outage"
    );
}

#[tokio::test]
async fn a_rollup_update_the_store_refuses_is_dropped_and_ingestion_goes_on() {
    let r = rig().await;
    ingest(&r, vec![event(0, false)]).await;
    r.store
        .set_validator("rollups", rule(json!({"_id": {"$ne": "lang:ja"}})))
        .await
        .unwrap();
    let events: Vec<Value> = (1..=200).map(|i| event(i, false)).collect();
    ingest(&r, events).await;
    let stored = all(&r, "events").await;
    assert_eq!(stored.len(), 201, "every event is stored");
    let rollups = r.store.keyed("rollups").await.unwrap();
    let en = rollups.get("lang:en").await.unwrap().unwrap();
    let n_en = (0..=200).filter(|i| i % 3 != 0).count() as u64;
    assert_eq!(en["count"], json!(n_en), "the other counters are exact");
    let ja = rollups.get("lang:ja").await.unwrap().unwrap();
    assert_eq!(
        ja["count"],
        json!(1),
        "the counter kept only what was counted before the rule"
    );
    let summary = rollups.get("source:s").await.unwrap().unwrap();
    assert_eq!(
        summary["count"],
        json!(201),
        "the source summary saw every event"
    );
}

/// Events the store refuses and a rollup it refuses, in the same batches: the rollups,
/// written again to isolate the refused one, count the stored events only.
#[tokio::test]
async fn refused_events_stay_uncounted_when_a_refused_rollup_is_isolated() {
    let r = rig().await;
    ingest(&r, vec![event(0, false)]).await;
    r.store
        .set_validator("events", rule(json!({"poison": {"$exists": false}})))
        .await
        .unwrap();
    r.store
        .set_validator("rollups", rule(json!({"_id": {"$ne": "lang:ja"}})))
        .await
        .unwrap();
    let poisoned = |i: u64| i % 11 == 4;
    let events: Vec<Value> = (1..=200).map(|i| event(i, poisoned(i))).collect();
    ingest(&r, events).await;
    let kept = |i: &u64| !poisoned(*i);
    let stored = all(&r, "events").await;
    assert_eq!(stored.len(), (0..=200).filter(kept).count());
    let rollups = r.store.keyed("rollups").await.unwrap();
    let en = rollups.get("lang:en").await.unwrap().unwrap();
    let n_en = (0..=200).filter(kept).filter(|i| i % 3 != 0).count() as u64;
    assert_eq!(en["count"], json!(n_en), "stored events only, each once");
    let ja = rollups.get("lang:ja").await.unwrap().unwrap();
    assert_eq!(ja["count"], json!(1), "counted before the rule only");
    let summary = rollups.get("source:s").await.unwrap().unwrap();
    assert_eq!(summary["count"], json!(stored.len() as u64));
}

/// The usual batch (no dead letters) commits its events and their rollups together: every
/// rollup change carries the commit time of events, and every batch's events one of a rollup
/// change. (The refusals above prove the other way: a failed joint commit is written in turn.)
#[tokio::test]
async fn a_batch_commits_its_events_and_rollups_together() {
    use futures::StreamExt;
    let r = rig().await;
    let events: Vec<Value> = (1..=300).map(|i| event(i, false)).collect();
    ingest(&r, events).await;
    let stored = all(&r, "events").await;
    assert_eq!(stored.len(), 300);
    let event_commits: std::collections::BTreeSet<i64> = stored
        .iter()
        .map(|r| {
            r.committed_at_us
                .expect("a stored event has its commit time")
        })
        .collect();
    let rollups = r.store.keyed("rollups").await.unwrap();
    let mut changes = rollups.changes(store::ChangeFilter::default(), store::ChangeStart::Oldest);
    let mut rollup_commits = std::collections::BTreeSet::new();
    let mut summaries = 0;
    while summaries < 300 {
        let c = tokio::time::timeout(Duration::from_secs(10), changes.next())
            .await
            .expect("every rollup change is replayed")
            .unwrap()
            .unwrap();
        summaries += usize::from(c.key == "source:s");
        rollup_commits.insert(c.committed_at_us);
    }
    assert_eq!(
        rollup_commits, event_commits,
        "each batch is one commit of events and rollups"
    );
    assert!(
        event_commits.len() >= 300 / 64,
        "batches of at most 64 events: {} commits",
        event_commits.len()
    );
}

/// A large batch's rollups are written while the next batch's events already are (the
/// ingester's third stage); a small batch after it commits its events and rollups together
/// only once the large batch's rollups are in. So the `source:` summary's changes carry every
/// sequence number once and in order, and the counters count every event.
#[tokio::test]
async fn rollups_stay_in_order_when_a_small_batch_follows_a_large_one() {
    use futures::StreamExt;
    let r = rig().await;
    let mut next = 0;
    let mut burst = |n: u64| {
        let events: Vec<Value> = (next + 1..=next + n).map(|i| event(i, false)).collect();
        next += n;
        events
    };
    // 300 events make a batch of 256 (two commits) and one of 44 (one), then a batch of 3.
    let bursts: Vec<Vec<Value>> = (0..8).flat_map(|_| [burst(300), burst(3)]).collect();
    ingest_in_bursts(&r, bursts, 256).await;
    let total = next;
    assert_eq!(all(&r, "events").await.len() as u64, total);

    let rollups = r.store.keyed("rollups").await.unwrap();
    let mut changes = rollups.changes(
        store::ChangeFilter {
            key_prefix: Some("source:".into()),
            ..store::ChangeFilter::default()
        },
        store::ChangeStart::Oldest,
    );
    let mut seqs = Vec::new();
    while (seqs.len() as u64) < total {
        let c = tokio::time::timeout(Duration::from_secs(10), changes.next())
            .await
            .expect("a change of the summary per event")
            .unwrap()
            .unwrap();
        let after = c.after.expect("an update has its new document");
        seqs.push(
            Stamp::of(&after)
                .expect("the summary carries the stamp")
                .seq,
        );
    }
    let expected: Vec<u64> = (1..=total).collect();
    assert_eq!(seqs, expected, "every sequence number once, in order");
    let ja = rollups.get("lang:ja").await.unwrap().unwrap();
    let en = rollups.get("lang:en").await.unwrap().unwrap();
    assert_eq!(ja["count"], json!(total / 3), "{ja:?}");
    assert_eq!(en["count"], json!(total - total / 3), "{en:?}");
}
