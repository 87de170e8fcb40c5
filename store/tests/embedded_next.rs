//! The store contract suite against the journal engine (while it is built beside SQLite).

#![allow(clippy::unwrap_used)]

#[macro_use]
mod contract;

use store::Store;
use store::embedded::EmbeddedOptions;
use store::embedded::next::{EmbeddedStore, Tuning};

/// Small op log so `history_lost` runs quickly.
const HISTORY: u64 = 1000;

fn open(dir: &tempfile::TempDir) -> EmbeddedStore {
    EmbeddedStore::open_tuned(
        dir.path(),
        EmbeddedOptions {
            oplog_max_entries: HISTORY,
            queue_capacity: 64,
        },
        Tuning {
            segment_bytes: 64 * 1024,
            memtable_bytes: 64 * 1024,
        },
    )
    .expect("open embedded store")
}

macro_rules! contract {
    ($($name:ident),* $(,)?) => {$(
        #[tokio::test]
        async fn $name() {
            let dir = tempfile::tempdir().unwrap();
            let store = open(&dir);
            contract::$name(&store).await;
            store.close().await.unwrap();
        }
    )*};
}

contract::every_check!(contract);

#[tokio::test]
async fn history_lost() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    contract::history_lost(&store, HISTORY).await;
}

use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};
use store::{
    CappedSpec, ChangeFilter, ChangeStart, Durability, Filter, KeyUpdate, Position, Start, Update,
};

fn spec(max_docs: u64, indexes: &[&str]) -> CappedSpec {
    CappedSpec {
        max_docs,
        max_bytes: 1 << 30,
        indexes: indexes.iter().map(|s| s.to_string()).collect(),
    }
}

fn event(i: u64) -> store::Document {
    contract::doc(json!({
        "i": i,
        "user": {"id": i % 7, "screen_name": format!("ü{}🦀", i % 5)},
        "text": format!("{} {}", "東京 مرحبا ".repeat((i % 13) as usize), i),
        "$odd.key": {"a.b": i},
    }))
}

/// Everything written — capped documents over many segments, keyed documents, checkpoints,
/// the change log — reads back the same after a reopen, and writing goes on from there.
#[tokio::test]
async fn a_reopened_store_reads_everything_back_and_continues() {
    let dir = tempfile::tempdir().unwrap();
    let (positions, token) = {
        let store = open(&dir);
        let c = store
            .capped("events", &spec(100_000, &["user.id"]))
            .await
            .unwrap();
        let k = store.keyed("rollups").await.unwrap();
        let mut positions = Vec::new();
        for b in 0..60u64 {
            let docs = (b * 20..b * 20 + 20).map(event).collect();
            positions.extend(c.append(docs, Durability::Acknowledged).await.unwrap());
            k.update(
                vec![
                    KeyUpdate::new("source:s", Update::inc("count", 20).and_set("last", b)),
                    KeyUpdate::new(format!("tag:{b}"), Update::inc("count", 1)),
                ],
                Durability::Journaled,
            )
            .await
            .unwrap();
        }
        store
            .save_checkpoint(
                "feed",
                json!({"pos": 7, "state": [1, "二"]}),
                Durability::Journaled,
            )
            .await
            .unwrap();
        assert!(
            store.segments() >= 2,
            "small segments: several were written"
        );
        let token = store.newest_change().await.unwrap().unwrap();
        store.close().await.unwrap();
        (positions, token)
    };
    let store = open(&dir);
    let c = store
        .capped("events", &spec(100_000, &["user.id"]))
        .await
        .unwrap();
    let k = store.keyed("rollups").await.unwrap();
    for (i, p) in positions.iter().enumerate().step_by(97) {
        let r = c.get(*p).await.unwrap().expect("retained");
        assert_eq!(
            Value::Object(r.doc),
            Value::Object(event(i as u64)),
            "at {p}"
        );
    }
    let latest = c.latest("user.id", &json!(3), 5).await.unwrap();
    let is: Vec<u64> = latest
        .iter()
        .map(|r| r.doc["i"].as_u64().unwrap())
        .collect();
    assert_eq!(
        is,
        vec![1193, 1186, 1179, 1172, 1165],
        "newest first, across segments"
    );
    assert_eq!(
        k.get("source:s").await.unwrap().unwrap()["count"],
        json!(1200)
    );
    assert_eq!(k.scan("tag:").await.unwrap().len(), 60);
    assert_eq!(
        store.load_checkpoint("feed").await.unwrap(),
        Some(json!({"pos": 7, "state": [1, "二"]}))
    );
    let mut changes = k.changes(ChangeFilter::default(), ChangeStart::After(token));
    let more = c
        .append(vec![event(9999)], Durability::Journaled)
        .await
        .unwrap();
    assert!(more[0] > *positions.last().unwrap(), "positions continue");
    k.update(
        vec![KeyUpdate::new("tag:new", Update::inc("count", 1))],
        Durability::Journaled,
    )
    .await
    .unwrap();
    let next = tokio::time::timeout(contract::WAIT, changes.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        next.key, "tag:new",
        "the change log continues after the reopen"
    );
    store.close().await.unwrap();
}

/// What a crash leaves at the journal's end — a record cut short, garbage — is ignored at
/// open (it was never acknowledged), and the journal continues over it.
#[tokio::test]
async fn a_torn_tail_is_ignored_and_written_over() {
    let dir = tempfile::tempdir().unwrap();
    let p = {
        let store = open(&dir);
        let c = store.capped("events", &spec(1000, &[])).await.unwrap();
        let p = c
            .append((0..5).map(event).collect(), Durability::Journaled)
            .await
            .unwrap();
        store.close().await.unwrap();
        p
    };
    let before = store::embedded::next::inspect(dir.path()).unwrap();
    assert!(!before.tail.torn, "a clean stop: {before:?}");
    // A half-written record after the last one: a header that promises more than is there.
    let journal = dir.path().join("journal");
    let mut segs: Vec<_> = std::fs::read_dir(&journal)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    segs.sort();
    let last = segs.last().unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(last).unwrap();
    let mut junk = b"TRJ1".to_vec();
    junk.extend_from_slice(&[0xff, 0x00, 0x01, 0x00]);
    junk.extend_from_slice(&[0x5a; 200]);
    std::os::unix::fs::FileExt::write_all_at(&f, &junk, before.tail.end).unwrap();
    drop(f);
    let torn = store::embedded::next::inspect(dir.path()).unwrap();
    assert!(torn.tail.torn, "the garbage is seen: {torn:?}");
    assert_eq!(torn.records, before.records);

    let store = open(&dir);
    let c = store.capped("events", &spec(1000, &[])).await.unwrap();
    assert_eq!(c.usage().await.unwrap().docs, 5);
    let q = c
        .append(vec![event(5)], Durability::Journaled)
        .await
        .unwrap();
    assert_eq!(q[0], Position(p[4].0 + 1));
    store.close().await.unwrap();
    let after = store::embedded::next::inspect(dir.path()).unwrap();
    assert!(!after.tail.torn, "written over: {after:?}");
    assert_eq!(after.records, before.records + 1);
    let store = open(&dir);
    let c = store.capped("events", &spec(1000, &[])).await.unwrap();
    let mut tail = c.tail(Start::Oldest);
    let mut seen = Vec::new();
    for _ in 0..6 {
        let r = tokio::time::timeout(contract::WAIT, tail.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        seen.push(r.doc["i"].as_u64().unwrap());
    }
    assert_eq!(seen, vec![0, 1, 2, 3, 4, 5]);
    store.close().await.unwrap();
}

/// Keyed writes not yet flushed to the tree's tables when the store went away (dropped, not
/// closed: what a kill leaves) are replayed from the journal at the next open.
#[tokio::test]
async fn keyed_state_is_replayed_from_the_journal_after_a_drop() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(&dir);
        let k = store.keyed("rollups").await.unwrap();
        for i in 0..300u64 {
            k.update(
                vec![
                    KeyUpdate::new("hot", Update::inc("n", 1)),
                    KeyUpdate::new(format!("cold:{i}"), Update::inc("n", 1)),
                ],
                Durability::Journaled,
            )
            .await
            .unwrap();
        }
        k.delete("cold:7", Durability::Journaled).await.unwrap();
        k.set(
            "set",
            contract::doc(json!({"a": "b"})),
            Durability::Journaled,
        )
        .await
        .unwrap();
        drop(k);
        drop(store);
    }
    // The threads let go of the directory once they have stopped.
    let store = loop {
        match EmbeddedStore::open_tuned(
            dir.path(),
            EmbeddedOptions {
                oplog_max_entries: HISTORY,
                queue_capacity: 64,
            },
            Tuning {
                segment_bytes: 64 * 1024,
                memtable_bytes: 64 * 1024,
            },
        ) {
            Ok(s) => break s,
            Err(store::StoreError::Locked(_)) => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Err(e) => panic!("{e}"),
        }
    };
    let k = store.keyed("rollups").await.unwrap();
    assert_eq!(k.get("hot").await.unwrap().unwrap()["n"], json!(300));
    assert_eq!(k.scan("cold:").await.unwrap().len(), 299);
    assert!(k.get("cold:7").await.unwrap().is_none());
    assert_eq!(k.get("set").await.unwrap().unwrap()["a"], json!("b"));
    // The write-time index came back too: every key can expire.
    let n = k
        .expire(
            "cold:",
            store::clock::now_us() + 1,
            10_000,
            Durability::Journaled,
        )
        .await
        .unwrap();
    assert_eq!(n, 299);
    store.close().await.unwrap();
}

/// Old segments go once nothing needs them; a few documents of a slowly evicted collection
/// in them (dead letters among events) move into the tree and stay readable, through a
/// reopen too.
#[tokio::test]
async fn finished_segments_are_released_and_few_survivors_move_into_the_tree() {
    let dir = tempfile::tempdir().unwrap();
    let letters_spec = spec(1000, &["reason"]);
    {
        let store = open(&dir);
        let events = store
            .capped("events", &spec(50, &["user.id"]))
            .await
            .unwrap();
        let letters = store.capped("dead", &letters_spec).await.unwrap();
        for b in 0..200u64 {
            events
                .append(
                    (b * 10..b * 10 + 10).map(event).collect(),
                    Durability::Acknowledged,
                )
                .await
                .unwrap();
            if b % 50 == 0 {
                letters
                    .append(
                        vec![contract::doc(json!({"reason": "bad", "b": b}))],
                        Durability::Acknowledged,
                    )
                    .await
                    .unwrap();
            }
        }
        let deadline = tokio::time::Instant::now() + contract::WAIT;
        loop {
            store.flush_keyed_state().await.unwrap();
            if store.segments() <= 4 {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "segments were not released: {} left",
                store.segments()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let got = letters.latest("reason", &json!("bad"), 10).await.unwrap();
        let bs: Vec<Value> = got.iter().map(|r| r.doc["b"].clone()).collect();
        assert_eq!(bs, vec![json!(150), json!(100), json!(50), json!(0)]);
        store.close().await.unwrap();
    }
    let store = open(&dir);
    let letters = store.capped("dead", &letters_spec).await.unwrap();
    let events = store
        .capped("events", &spec(50, &["user.id"]))
        .await
        .unwrap();
    assert_eq!(letters.usage().await.unwrap().docs, 4);
    let mut tail = letters.tail(Start::Oldest);
    for want in [0, 50, 100, 150] {
        let r = tokio::time::timeout(contract::WAIT, tail.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(r.doc["b"], json!(want));
    }
    let got = letters.latest("reason", &json!("bad"), 2).await.unwrap();
    assert_eq!(got.len(), 2);
    assert_eq!(events.usage().await.unwrap().docs, 50);
    let b = events.bounds().await.unwrap().unwrap();
    assert_eq!(b.newest.0 - b.oldest.0, 49);
    assert_eq!(
        events.get(b.oldest).await.unwrap().unwrap().doc["i"],
        json!(1950)
    );
    store.close().await.unwrap();
}

/// A validation rule refuses what does not match it, in capped and keyed collections, and
/// survives a reopen.
#[tokio::test]
async fn a_validation_rule_refuses_documents_and_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(&dir);
        let c = store.capped("events", &spec(100, &[])).await.unwrap();
        let k = store.keyed("rollups").await.unwrap();
        let rule = |v: Value| Some(Filter::parse(&v).unwrap());
        store
            .set_validator("events", rule(json!({"poison": {"$exists": false}})))
            .await
            .unwrap();
        store
            .set_validator("rollups", rule(json!({"_id": {"$ne": "lang:ja"}})))
            .await
            .unwrap();
        c.append(vec![contract::doc(json!({"ok": 1}))], Durability::Journaled)
            .await
            .unwrap();
        let e = c
            .append(
                vec![contract::doc(json!({"poison": true}))],
                Durability::Journaled,
            )
            .await
            .unwrap_err();
        assert!(
            !e.is_transient() && e.to_string().contains("validation"),
            "{e}"
        );
        k.update(
            vec![KeyUpdate::new("lang:en", Update::inc("count", 1))],
            Durability::Journaled,
        )
        .await
        .unwrap();
        let e = k
            .update(
                vec![KeyUpdate::new("lang:ja", Update::inc("count", 1))],
                Durability::Journaled,
            )
            .await
            .unwrap_err();
        assert!(e.to_string().contains("validation"), "{e}");
        store.close().await.unwrap();
    }
    let store = open(&dir);
    let c = store.capped("events", &spec(100, &[])).await.unwrap();
    assert!(
        c.append(
            vec![contract::doc(json!({"poison": 1}))],
            Durability::Journaled
        )
        .await
        .is_err()
    );
    assert_eq!(c.usage().await.unwrap().docs, 1);
    store.set_validator("events", None).await.unwrap();
    c.append(
        vec![contract::doc(json!({"poison": 1}))],
        Durability::Journaled,
    )
    .await
    .unwrap();
    store.close().await.unwrap();
}

/// A field indexed later finds the documents stored before, in every segment.
#[tokio::test]
async fn an_index_added_later_covers_the_documents_already_stored() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(&dir);
        let c = store.capped("events", &spec(10_000, &[])).await.unwrap();
        for b in 0..40u64 {
            c.append(
                (b * 10..b * 10 + 10).map(event).collect(),
                Durability::Acknowledged,
            )
            .await
            .unwrap();
        }
        store.close().await.unwrap();
    }
    let store = open(&dir);
    let c = store
        .capped("events", &spec(10_000, &["user.screen_name"]))
        .await
        .unwrap();
    c.append(vec![event(400)], Durability::Journaled)
        .await
        .unwrap();
    let got = c
        .latest("user.screen_name", &json!("ü0🦀"), 100)
        .await
        .unwrap();
    assert_eq!(got.len(), 81, "every fifth of 401 documents");
    assert_eq!(got[0].doc["i"], json!(400));
    assert_eq!(got[80].doc["i"], json!(0));
    store.close().await.unwrap();
}
