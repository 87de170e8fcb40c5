//! The store contract suite against the embedded engine, plus what only it can show:
//! recovery (a reopen, a torn journal tail, keyed state replayed), segment release,
//! validation rules, indexes added later, one process per directory.

#![allow(clippy::unwrap_used)]

#[macro_use]
mod contract;
#[path = "common/dump.rs"]
mod dump;

use dump::{dump_capped, dump_store};

use store::Store;
use store::embedded::{EmbeddedOptions, EmbeddedStore, Tuning};

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
            // Small, so the filter of stored keys is built again and again under the suite.
            known_keys_min: 16,
            // Small, so the suite's readers that lag meet commits sent without their
            // documents, and read them from the journal.
            live_bytes: LIVE_BYTES,
        },
    )
    .expect("open embedded store")
}

const LIVE_BYTES: u64 = 256 << 10;

macro_rules! contract {
    ($($name:ident: [$($need:ident),*]),* $(,)?) => {$(
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

use std::sync::Arc;
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

/// A document of ~20 KB: a tail catching up over such documents reads a few dozen at a time,
/// not 512.
fn large_event(i: u64) -> store::Document {
    let mut doc = event(i);
    doc.insert("body".into(), json!("東京の雨 🦀 مرحبا ".repeat(700)));
    doc
}

/// A tail catching up reads several batches at once ahead of its consumer; with appends
/// going on meanwhile (so some batches end short and reads started beyond them are dropped),
/// it still yields every position once, in order, with its own document, then follows live.
#[tokio::test]
async fn a_tail_catching_up_while_appends_go_on_yields_each_position_once() {
    catch_up_while_appending(event, 100, 100).await;
}

/// The same with documents large enough that a catch-up step reads fewer of them (its bytes
/// are bounded), so several steps, and reads started beyond a short one, fall in each append.
#[tokio::test]
async fn a_tail_catching_up_over_large_documents_yields_each_position_once() {
    catch_up_while_appending(large_event, 10, 60).await;
}

/// Appends `batches` batches of `per` documents, 40 % of them before a tail starts from the
/// oldest and the rest while it catches up; the tail must yield each position once, in order.
async fn catch_up_while_appending(doc: fn(u64) -> store::Document, per: u64, batches: u64) {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let c = store.capped("events", &spec(1_000_000, &[])).await.unwrap();
    let before = batches * 2 / 5;
    for b in 0..before {
        let docs = (b * per..b * per + per).map(doc).collect();
        c.append(docs, Durability::Acknowledged).await.unwrap();
    }
    let writer = {
        let c = c.clone();
        tokio::spawn(async move {
            for b in before..batches {
                let docs = (b * per..b * per + per).map(doc).collect();
                c.append(docs, Durability::Acknowledged).await.unwrap();
                tokio::task::yield_now().await;
            }
        })
    };
    let total = per * batches;
    let mut tail = c.tail(Start::Oldest);
    for want in 0..total {
        let r = tokio::time::timeout(Duration::from_secs(30), tail.next())
            .await
            .expect("the tail goes on")
            .unwrap()
            .unwrap();
        assert_eq!(
            r.position,
            Position(want + 1),
            "every position once, in order"
        );
        assert_eq!(
            *r.doc,
            doc(want),
            "position {} holds its own document",
            want + 1
        );
    }
    writer.await.unwrap();
    c.append(vec![doc(total)], Durability::Acknowledged)
        .await
        .unwrap();
    let r = tokio::time::timeout(Duration::from_secs(30), tail.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        r.position,
        Position(total + 1),
        "then it follows live appends"
    );
}

/// A tail and a change stream that stop reading (an HTTP client that stopped reading holds
/// its stream unpolled) hold at most the live broadcast's budget of commits, not the last
/// 1,024 commits whatever their size; when they read again they get every position and change
/// once, in order, from the journal. A reader keeping up meanwhile misses nothing.
#[tokio::test]
async fn readers_that_stop_reading_hold_at_most_the_live_budget() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let c = store.capped("events", &spec(1_000_000, &[])).await.unwrap();
    let k = store.keyed("rollups").await.unwrap();
    // Subscribed at once, never polled until the end.
    let mut stuck_tail = c.tail(Start::Now);
    let mut stuck_changes = k.changes(ChangeFilter::default(), ChangeStart::Now);
    let follower = {
        let mut tail = c.tail(Start::Now);
        tokio::spawn(async move {
            let mut seen = Vec::new();
            while let Some(r) = tail.next().await {
                let r = r.unwrap();
                seen.push(r.position.0);
                if r.position.0 == 600 {
                    break;
                }
            }
            seen
        })
    };
    // Each round commits ~200 KB of events and ~40 KB of images.
    let mut held_most = 0;
    for b in 0..60u64 {
        let docs = (b * 10..b * 10 + 10).map(large_event).collect();
        c.append(docs, Durability::Acknowledged).await.unwrap();
        k.update(
            vec![KeyUpdate::new(
                format!("k{}", b % 4),
                Update::default()
                    .and_set("body", large_event(b)["body"].clone())
                    .and_set("b", b),
            )],
            Durability::Acknowledged,
        )
        .await
        .unwrap();
        let held = store.live_bytes_held();
        held_most = held_most.max(held);
        assert!(
            held <= LIVE_BYTES + (300 << 10),
            "round {b}: the broadcast holds {held} bytes for readers behind"
        );
    }
    assert!(
        held_most > LIVE_BYTES / 2,
        "the stuck readers held commits ({held_most} bytes at most)"
    );
    assert_eq!(
        follower.await.unwrap(),
        (1..=600).collect::<Vec<_>>(),
        "a reader keeping up gets every position once"
    );
    for want in 0..600 {
        let r = tokio::time::timeout(contract::WAIT, stuck_tail.next())
            .await
            .expect("the stuck tail goes on")
            .unwrap()
            .unwrap();
        assert_eq!(
            r.position,
            Position(want + 1),
            "every position once, in order"
        );
        assert_eq!(*r.doc, large_event(want));
    }
    for b in 0..60u64 {
        let ch = tokio::time::timeout(contract::WAIT, stuck_changes.next())
            .await
            .expect("the stuck change stream goes on")
            .unwrap()
            .unwrap();
        assert_eq!(ch.key, format!("k{}", b % 4), "every change once, in order");
        assert_eq!(ch.after.unwrap()["b"], json!(b));
    }
    drop((stuck_tail, stuck_changes));
    assert_eq!(store.live_bytes_held(), 0, "nothing held once nobody lags");
    store.close().await.unwrap();
}

/// A live tail yields the documents an append handed over, shared: the very allocation the
/// writer of `append_shared` kept, not a copy (every feed would copy every event).
#[tokio::test]
async fn a_live_tail_shares_the_appended_documents() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let c = store.capped("events", &spec(1_000, &[])).await.unwrap();
    let mut tail = c.tail(Start::Now);
    // Caught up and waiting: what follows comes from the commit, not from the journal.
    assert!(
        tokio::time::timeout(Duration::from_millis(200), tail.next())
            .await
            .is_err()
    );
    let docs: std::sync::Arc<[std::sync::Arc<store::Document>]> =
        (0..3).map(|i| std::sync::Arc::new(event(i))).collect();
    c.append_shared(docs.clone(), Durability::Acknowledged)
        .await
        .unwrap();
    for d in docs.iter() {
        let r = tokio::time::timeout(Duration::from_secs(30), tail.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(
            std::sync::Arc::ptr_eq(&r.doc, d),
            "position {} is shared",
            r.position.0
        );
    }
}

/// A synced commit of a capped collection syncs every earlier commit of the same store's
/// keyed collections (one journal), which lets the ingester write rollups unsynced; a keyed
/// collection of another store (another journal) gets no such promise.
#[tokio::test]
async fn a_synced_commit_syncs_earlier_keyed_commits_of_its_own_store_only() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (store_a, store_b) = (open(&a), open(&b));
    let events = store_a.capped("events", &spec(1_000, &[])).await.unwrap();
    let own = store_a.keyed("rollups").await.unwrap();
    let other = store_b.keyed("rollups").await.unwrap();
    assert!(events.syncs_earlier_commits_of(own.as_ref()));
    assert!(!events.syncs_earlier_commits_of(other.as_ref()));
}

/// A live tail gets a commit stamped when it was published, after its record was written and
/// synced: later than the commit's start, which the journal keeps and a read back carries,
/// and no later than the writer's return. Feeds measure notification latency from it.
#[tokio::test]
async fn a_live_tail_gets_the_time_the_commit_was_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let c = store.capped("events", &spec(10_000, &[])).await.unwrap();
    let mut tail = c.tail(Start::Now);
    assert!(
        tokio::time::timeout(Duration::from_millis(200), tail.next())
            .await
            .is_err()
    );
    // ~2 MB in one record: staging, writing and syncing it take a while on any disk.
    let docs: Vec<store::Document> = (0..1_000)
        .map(|i| {
            let mut d = event(i);
            d.insert("pad".into(), json!("p".repeat(2_000)));
            d
        })
        .collect();
    let clock = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros() as i64
    };
    let before = clock();
    c.append(docs, Durability::Journaled).await.unwrap();
    let returned = clock();
    let live = tokio::time::timeout(Duration::from_secs(30), tail.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let stored = c.get(live.position).await.unwrap().unwrap();
    let (live_at, stored_at) = (
        live.committed_at_us.unwrap(),
        stored.committed_at_us.unwrap(),
    );
    assert!(
        before <= stored_at && stored_at < live_at && live_at <= returned,
        "before {before}, started {stored_at}, published {live_at}, returned {returned}"
    );
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
            Value::Object(std::sync::Arc::unwrap_or_clone(r.doc)),
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
    let before = store::embedded::inspect(dir.path()).unwrap();
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
    let torn = store::embedded::inspect(dir.path()).unwrap();
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
    let after = store::embedded::inspect(dir.path()).unwrap();
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

/// An event of ~3 KB that does not compress: records of their documents' size.
fn noisy_event(i: u64) -> store::Document {
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let body: String = (0..3000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b'a' + (x % 26) as u8)
        })
        .collect();
    let mut doc = event(i);
    doc.insert("body".into(), json!(body));
    doc
}

/// The journal's segments, oldest first.
fn segments(dir: &tempfile::TempDir) -> Vec<std::path::PathBuf> {
    let mut segs: Vec<_> = std::fs::read_dir(dir.path().join("journal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    segs.sort();
    segs
}

/// A crash right after a roll made the next segment (allocated, synced, all zeros) and
/// before its first record leaves it beside the last one. The next run writes into it; its
/// records must be numbered as every segment's are, or the start after the next roll fails
/// ("segment starts at record 0 where N was expected").
#[tokio::test]
async fn a_segment_a_crash_left_empty_is_written_into_and_opens_after_the_next_roll() {
    let dir = tempfile::tempdir().unwrap();
    let mut n = 0u64;
    {
        let store = open(&dir);
        let c = store.capped("events", &spec(100_000, &[])).await.unwrap();
        c.append((0..20).map(noisy_event).collect(), Durability::Journaled)
            .await
            .unwrap();
        n += 20;
        store.close().await.unwrap();
    }
    let last = segments(&dir).pop().unwrap();
    let seq = u64::from_str_radix(last.file_stem().unwrap().to_str().unwrap(), 16).unwrap();
    let next = last.with_file_name(format!("{:016x}.log", seq + 1));
    std::fs::write(&next, vec![0u8; 64 << 10]).unwrap();
    // Written into the empty segment, past its end into another, then reopened twice.
    for round in 0..2 {
        let store = open(&dir);
        let c = store.capped("events", &spec(100_000, &[])).await.unwrap();
        for _ in 0..6 {
            c.append(
                (n..n + 10).map(noisy_event).collect(),
                Durability::Journaled,
            )
            .await
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
            n += 10;
        }
        store.close().await.unwrap();
        assert!(segments(&dir).len() as u64 > seq + round, "a roll happened");
    }
    let store = open(&dir);
    let c = store.capped("events", &spec(100_000, &[])).await.unwrap();
    assert_eq!(c.usage().await.unwrap().docs, n, "every event read back");
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
                known_keys_min: 16,
                live_bytes: LIVE_BYTES,
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
        events_and_letters(&events, &letters, |b| b % 50 == 0).await;
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

/// Appends 200 batches of ten events and, after each batch `letter_after` picks, a letter
/// `{"reason": "bad", "b": <batch>}`: dead letters among events evicted much faster.
async fn events_and_letters(
    events: &Arc<dyn store::Capped>,
    letters: &Arc<dyn store::Capped>,
    letter_after: impl Fn(u64) -> bool,
) {
    for b in 0..200u64 {
        events
            .append(
                (b * 10..b * 10 + 10).map(event).collect(),
                Durability::Acknowledged,
            )
            .await
            .unwrap();
        if letter_after(b) {
            letters
                .append(
                    vec![contract::doc(json!({"reason": "bad", "b": b}))],
                    Durability::Acknowledged,
                )
                .await
                .unwrap();
        }
    }
}

/// The store of `dir` with maintenance run only by [`maintain`]: what it does, and when,
/// is the test's.
fn open_manual(dir: &tempfile::TempDir) -> EmbeddedStore {
    EmbeddedStore::open_with(
        dir.path(),
        EmbeddedOptions {
            oplog_max_entries: 50,
            queue_capacity: 64,
        },
        Tuning {
            segment_bytes: 64 * 1024,
            memtable_bytes: 64 * 1024,
            known_keys_min: 16,
            live_bytes: LIVE_BYTES,
        },
        store::embedded::Io {
            manual_maintenance: true,
            ..Default::default()
        },
    )
    .expect("open embedded store")
}

/// Runs the store's maintenance (off the async threads: it waits for the writer).
async fn maintain(store: &EmbeddedStore) {
    let s = store.clone();
    tokio::task::spawn_blocking(move || s.maintain())
        .await
        .unwrap()
        .unwrap();
}

/// Documents of a segment about to be released while they are still retained move into the
/// tree (a spill); the segment may go only once the tree's tables hold them. A spill that
/// took no sequence number of its own was taken as persisted by a flush that came before it,
/// its segment deleted while it sat in the memtable, and lost at a clean stop.
#[tokio::test]
async fn spilled_documents_survive_a_clean_stop_right_after_their_segment_goes() {
    let dir = tempfile::tempdir().unwrap();
    let letters_spec = spec(1000, &[]);
    {
        let store = open_manual(&dir);
        let letters = store.capped("dead", &letters_spec).await.unwrap();
        let events = store.capped("events", &spec(20, &[])).await.unwrap();
        letters
            .append(
                vec![contract::doc(json!({"reason": "bad", "n": 1}))],
                Durability::Journaled,
            )
            .await
            .unwrap();
        for b in 0..10 {
            events
                .append(
                    (b * 10..b * 10 + 10).map(noisy_event).collect(),
                    Durability::Journaled,
                )
                .await
                .unwrap();
        }
        assert!(store.segments() > 3, "segments rolled");
        // The tree's tables up to date, then the release: the letter moves into the tree.
        store.flush_keyed_state().await.unwrap();
        maintain(&store).await;
        maintain(&store).await;
        assert!(store.segments() <= 3, "{} segments left", store.segments());
        store.close().await.unwrap();
    }
    let store = open_manual(&dir);
    let letters = store.capped("dead", &letters_spec).await.unwrap();
    assert_eq!(letters.usage().await.unwrap().docs, 1);
    let b = letters.bounds().await.unwrap().unwrap();
    let doc = letters.get(b.oldest).await.unwrap();
    assert_eq!(
        doc.map(|r| r.doc["n"].clone()),
        Some(json!(1)),
        "the spilled letter reads back"
    );
    store.close().await.unwrap();
}

/// A burst of dead letters too large to move into the tree pins the segment that holds them.
/// Releases go oldest first, so every later segment stayed too, until the letters were
/// evicted: gigabytes a day at 70 events/s. Once the journal behind them is large against
/// what their collection retains, they move into the tree anyway.
#[tokio::test]
async fn a_burst_of_dead_letters_does_not_keep_the_journal_behind_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_manual(&dir);
    let letters = store.capped("dead", &spec(1000, &[])).await.unwrap();
    let events = store.capped("events", &spec(20, &[])).await.unwrap();
    // ~30 KB of letters: more than a quarter of their 64 KiB segment.
    letters
        .append((0..10).map(noisy_event).collect(), Durability::Journaled)
        .await
        .unwrap();
    let mut most = 0;
    for b in 0..100u64 {
        events
            .append(
                (b * 10..b * 10 + 10).map(noisy_event).collect(),
                Durability::Journaled,
            )
            .await
            .unwrap();
        if b % 10 == 9 {
            store.flush_keyed_state().await.unwrap();
            maintain(&store).await;
            maintain(&store).await;
            most = most.max(store.segments());
        }
    }
    // 3 MB of events went through; 20 of ~3 KB are retained, and the letters.
    assert!(
        store.segments() <= 8 && most <= 12,
        "{} segments left, {most} at most: the journal grew behind the letters",
        store.segments()
    );
    assert_eq!(letters.usage().await.unwrap().docs, 10, "every letter kept");
    let mut tail = letters.tail(Start::Oldest);
    for want in 0..10u64 {
        let r = tokio::time::timeout(contract::WAIT, tail.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(r.doc["i"], json!(want));
    }
    store.close().await.unwrap();
}

/// Commits and their syncs, segment rolls, an expiry of 10,000 keys and a new index's
/// backfill all run on the store's own threads: the runtime of the caller (here a
/// single-threaded one) keeps its timers going meanwhile. They once ran inline, on the
/// caller's thread, whenever the writer was idle.
#[test]
fn the_store_never_blocks_its_callers_runtime() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir);
        let k = store.keyed("rollups").await.unwrap();
        for b in 0..10u64 {
            let updates = (b * 1000..b * 1000 + 1000)
                .map(|i| store::KeyUpdate::new(format!("tag:{i}"), store::Update::inc("n", 1)))
                .collect();
            k.update(updates, Durability::Acknowledged).await.unwrap();
        }
        let c = store.capped("events", &spec(100_000, &[])).await.unwrap();
        c.append((0..200).map(event).collect(), Durability::Journaled)
            .await
            .unwrap();
        // Every tick of a 1 ms timer while the work goes on.
        let ticks = Arc::new(std::sync::Mutex::new(Vec::new()));
        let ticker = tokio::spawn({
            let ticks = ticks.clone();
            async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    ticks.lock().unwrap().push(std::time::Instant::now());
                }
            }
        });
        let segments = store.segments();
        let started = std::time::Instant::now();
        for b in 0..10u64 {
            c.append(
                (b * 10..b * 10 + 10).map(noisy_event).collect(),
                Durability::Journaled,
            )
            .await
            .unwrap();
        }
        assert!(store.segments() > segments, "segments rolled");
        let expired = k
            .expire(
                "tag:",
                store::clock::now_us() + 1,
                10_000,
                Durability::Journaled,
            )
            .await
            .unwrap();
        assert_eq!(expired, 10_000);
        store
            .capped("events", &spec(100_000, &["user.id"]))
            .await
            .unwrap();
        let took = started.elapsed();
        ticker.abort();
        // The longest stretch without a tick, from the start of the work to its end.
        let mut at: Vec<std::time::Instant> = ticks.lock().unwrap().clone();
        at.retain(|t| *t >= started);
        at.insert(0, started);
        at.push(started + took);
        let worst = at.windows(2).map(|w| w[1] - w[0]).max().unwrap_or_default();
        println!("the timer's worst gap: {worst:?} during {took:?} of work");
        assert!(
            worst < Duration::from_millis(200),
            "the runtime's timer stalled {worst:?} during {took:?} of work"
        );
        store.close().await.unwrap();
    });
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

/// A handle hashes its appends' index values for the indexes it was opened with; one opened
/// before another handle added an index still has its documents found by the new index.
#[tokio::test]
async fn a_handle_opened_before_an_index_was_added_appends_into_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let early = store
        .capped("events", &spec(10_000, &["lang"]))
        .await
        .unwrap();
    let late = store
        .capped("events", &spec(10_000, &["user.screen_name"]))
        .await
        .unwrap();
    early
        .append((0..10).map(event).collect(), Durability::Journaled)
        .await
        .unwrap();
    late.append(vec![event(10)], Durability::Journaled)
        .await
        .unwrap();
    let got = late
        .latest("user.screen_name", &json!("ü0🦀"), 100)
        .await
        .unwrap();
    let got: Vec<_> = got.iter().map(|r| r.doc["i"].clone()).collect();
    assert_eq!(got, vec![json!(10), json!(5), json!(0)]);
    store.close().await.unwrap();
}

/// A long tail of counters counts exactly while the writer's filter of stored keys is built,
/// outgrown and built again beside the updates, and after each reopen (when it is built anew
/// from the tree). In these (debug) builds the writer also checks every read the filter skips
/// against the tree.
#[tokio::test]
async fn a_long_tail_of_counters_counts_exactly_across_filter_rebuilds() {
    let dir = tempfile::tempdir().unwrap();
    let key = |i: u64| format!("hashtags:#東京{i}🦀");
    for round in 1..=3u64 {
        let store = open(&dir);
        let k = store.keyed("rollups").await.unwrap();
        // Each commit counts 50 keys: the 25 newest of the commit before and 25 new ones, so a
        // key new in the commit that asked for a build is counted again right after it.
        for batch in 0..40u64 {
            let updates = (batch * 25..batch * 25 + 50)
                .map(|i| KeyUpdate::new(key(i), Update::inc("count", 1)))
                .collect();
            k.update(updates, Durability::Acknowledged).await.unwrap();
        }
        for i in 0..1025u64 {
            let per_round = if (25..1000).contains(&i) { 2 } else { 1 };
            let doc = k.get(&key(i)).await.unwrap().expect("stored");
            assert_eq!(
                doc["count"],
                json!(round * per_round),
                "{} in round {round}",
                key(i)
            );
        }
        store.close().await.unwrap();
    }
}

#[tokio::test]
async fn a_second_process_cannot_open_the_same_directory() {
    let dir = tempfile::tempdir().unwrap();
    let _store = open(&dir);
    let err = EmbeddedStore::open(dir.path(), EmbeddedOptions::default())
        .err()
        .expect("locked");
    assert!(err.to_string().contains("in use"), "got {err}");
}

/// The writer keeps hot keys' documents in memory; a job undone halfway must not leave its
/// first, undone, update there for the next one to build on.
#[tokio::test]
async fn an_undone_job_leaves_nothing_for_the_next_update_to_build_on() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let k = store.keyed("k").await.unwrap();
    let set = Update::default().and_set("s", "text");
    k.update(
        vec![
            KeyUpdate::new("a", Update::inc("n", 1)),
            KeyUpdate::new("b", set),
        ],
        Durability::Journaled,
    )
    .await
    .unwrap();
    let bad = k
        .update(
            vec![
                KeyUpdate::new("a", Update::inc("n", 10)),
                KeyUpdate::new("b", Update::inc("s", 1)),
            ],
            Durability::Journaled,
        )
        .await;
    assert!(bad.is_err(), "$inc of a string fails the whole job");
    k.update(
        vec![KeyUpdate::new("a", Update::inc("n", 1))],
        Durability::Journaled,
    )
    .await
    .unwrap();
    assert_eq!(k.get("a").await.unwrap().unwrap()["n"], json!(2));
    store.close().await.unwrap();
}

/// Copies the SQLite-layout fixture (written by the SQLite engine; see its `make.rs.txt`)
/// into a fresh directory.
fn sqlite_fixture() -> (tempfile::TempDir, Value) {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sqlite-layout");
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(src.join("tailrace.db"), dir.path().join("tailrace.db")).unwrap();
    let expected: Value =
        serde_json::from_slice(&std::fs::read(src.join("expected.json")).unwrap()).unwrap();
    (dir, expected)
}

/// A data directory of the SQLite layout is converted at its first open: every capped
/// document at its position with its commit time, the change log with its tokens and images,
/// the keyed documents, the checkpoints — all read back as the SQLite engine read them — and
/// positions and tokens continue from where they were; the SQLite files are kept in
/// `sqlite-backup/`; the next open converts nothing.
#[tokio::test]
async fn a_sqlite_data_directory_is_converted_whole_at_its_first_open() {
    let (dir, expected) = sqlite_fixture();
    // What a conversion cut short leaves: thrown away, and done again.
    std::fs::create_dir_all(dir.path().join(".conversion/journal")).unwrap();
    std::fs::write(
        dir.path().join(".conversion/journal/0000000000000001.log"),
        b"half",
    )
    .unwrap();
    let events_spec = spec(
        60,
        &["user.screen_name", "user.id", "id", "_tailrace.source"],
    );
    let letters_spec = spec(10_000, &["source", "reason"]);
    for round in 0..2 {
        let store = EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).unwrap();
        assert!(!dir.path().join("tailrace.db").exists(), "round {round}");
        assert!(
            dir.path().join("sqlite-backup/tailrace.db").exists(),
            "round {round}"
        );
        assert!(!dir.path().join(".conversion").exists());
        let events = store.capped("events", &events_spec).await.unwrap();
        let letters = store.capped("dead_letters", &letters_spec).await.unwrap();
        let rollups = store.keyed("rollups").await.unwrap();
        let stats = store.keyed("stats").await.unwrap();
        if round == 0 {
            assert_eq!(
                Value::Array(dump_capped(&*events).await),
                expected["events"]
            );
            assert_eq!(
                Value::Array(dump_capped(&*letters).await),
                expected["dead_letters"]
            );
            for (name, k) in [("rollups", &rollups), ("stats", &stats)] {
                let all: Vec<Value> = k
                    .scan("")
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|d| json!({"key": d.key, "doc": d.doc}))
                    .collect();
                assert_eq!(Value::Array(all), expected[name], "{name}");
            }
            let mut changes = store.changes(ChangeFilter::default(), ChangeStart::Oldest);
            for want in expected["changes"].as_array().unwrap() {
                let c = tokio::time::timeout(contract::WAIT, changes.next())
                    .await
                    .unwrap()
                    .unwrap()
                    .unwrap();
                assert_eq!(&serde_json::to_value(&c).unwrap(), want);
            }
            for feed in ["tail", "changes"] {
                assert_eq!(
                    store.load_checkpoint(feed).await.unwrap().as_ref(),
                    Some(&expected["checkpoints"][feed]),
                    "{feed}"
                );
            }
            // The indexes came along.
            let by_user = events.latest("user.id", &json!(3), 2).await.unwrap();
            assert_eq!(
                by_user.iter().map(|r| r.position.0).collect::<Vec<_>>(),
                vec![190, 173]
            );
            // Positions and tokens continue.
            let last_pos = expected["events"].as_array().unwrap().last().unwrap()["position"]
                .as_u64()
                .unwrap();
            let p = events
                .append(
                    vec![contract::doc(json!({"new": 1}))],
                    Durability::Journaled,
                )
                .await
                .unwrap();
            assert_eq!(p[0].0, last_pos + 1);
            let token: u64 = expected["changes"].as_array().unwrap().last().unwrap()["token"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap();
            let mut s = rollups.changes(
                ChangeFilter::default(),
                ChangeStart::After(store::ResumeToken(token.to_string())),
            );
            rollups
                .update(
                    vec![KeyUpdate::new("lang:en", Update::inc("count", 1))],
                    Durability::Journaled,
                )
                .await
                .unwrap();
            let c = tokio::time::timeout(contract::WAIT, s.next())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            assert_eq!(c.token.0, (token + 1).to_string());
        } else {
            assert_eq!(
                events.usage().await.unwrap().docs,
                60,
                "the conversion is not redone"
            );
            assert_eq!(letters.usage().await.unwrap().docs, 5);
        }
        // Retention counts from the write times the SQLite engine kept (not the conversion's):
        // none of them is idle as of the fixture's oldest change, all four hashtags are a
        // second after its newest.
        if round == 0 {
            let changes = expected["changes"].as_array().unwrap();
            let at = |c: &Value| c["committed_at_us"].as_i64().unwrap();
            let (oldest, newest) = (at(&changes[0]), at(changes.last().unwrap()));
            let expire = |before: i64| {
                let rollups = rollups.clone();
                async move {
                    rollups
                        .expire("hashtags:", before, 100, Durability::Journaled)
                        .await
                        .unwrap()
                }
            };
            assert_eq!(expire(oldest - 1).await, 0);
            assert_eq!(expire(newest + 1_000_000).await, 4);
        }
        store.close().await.unwrap();
    }
}

/// Commits that did not ask for a sync are shown to readers once synced; a question asked
/// right after them (how far a feed is behind, as it drains at a stop) still counts them, or
/// the feed would stop short of the last writes.
#[tokio::test]
async fn the_lag_asked_right_after_unsynced_writes_counts_them() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let k = store.keyed("rollups").await.unwrap();
    k.update(
        vec![store::KeyUpdate::new("a", store::Update::inc("n", 1))],
        Durability::Journaled,
    )
    .await
    .unwrap();
    let token = store.newest_change().await.unwrap().unwrap();
    for i in 0..5 {
        k.update(
            vec![store::KeyUpdate::new(
                format!("k{i}"),
                store::Update::inc("n", 1),
            )],
            Durability::Acknowledged,
        )
        .await
        .unwrap();
    }
    assert_eq!(store.changes_after(&token).await.unwrap(), Some(5));
    store.close().await.unwrap();
}

/// Copies a directory tree.
fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// A data directory written by the journal engine of the previous release (records not
/// chained, 512-byte writes, a keyed tree of that lsm-tree), after a clean stop and after a
/// kill, opens in this one with everything in it, and takes writes that continue its
/// positions and tokens: in its last segment (whose tail is not on a 4 KiB block), in new
/// segments, past the release of its old ones, and across another stop and open.
#[tokio::test]
async fn a_journal_directory_of_the_previous_release_opens_whole() {
    let fixtures =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/journal-2f724b9");
    for case in ["clean", "killed"] {
        let dir = tempfile::tempdir().unwrap();
        copy_tree(&fixtures.join(case), dir.path());
        let expected: Value =
            serde_json::from_slice(&std::fs::read(fixtures.join(format!("{case}.json"))).unwrap())
                .unwrap();
        // The options it was written with (the fixture's change history is 150 long).
        let options = EmbeddedOptions {
            oplog_max_entries: 150,
            queue_capacity: 64,
        };
        let store = EmbeddedStore::open(dir.path(), options.clone()).unwrap();
        assert_eq!(dump_store(&store).await, expected, "{case}");

        let events = store
            .capped("events", &spec(60, &["user.id"]))
            .await
            .unwrap();
        let rollups = store.keyed("rollups").await.unwrap();
        let last = |name: &str| expected[name].as_array().unwrap().last().unwrap().clone();
        let last_pos = last("events")["position"].as_u64().unwrap();
        let last_token: u64 = last("changes")["token"].as_str().unwrap().parse().unwrap();
        // Enough writes of realistic size to fill the old 16 KiB segment and roll past it.
        let n = 300;
        for i in 0..n {
            let p = events
                .append_with_updates(
                    Arc::from(vec![Arc::new(contract::doc(
                        json!({"i": i, "user": {"id": i % 17}, "text": "x".repeat(200)}),
                    ))]),
                    &*rollups,
                    vec![KeyUpdate::new("lang:en", Update::inc("count", 1))],
                    Durability::Journaled,
                )
                .await
                .unwrap();
            assert_eq!(p[0].0, last_pos + 1 + i, "{case}");
        }
        let newest = store.newest_change().await.unwrap().unwrap();
        assert_eq!(newest.0, (last_token + n).to_string(), "{case}");
        let en = |expected: &Value| {
            expected["rollups"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["key"] == "lang:en")
                .unwrap()["doc"]["count"]
                .as_i64()
                .unwrap()
        };
        let before = en(&expected);
        store.close().await.unwrap();
        drop(store);

        let store = EmbeddedStore::open(dir.path(), options).unwrap();
        let now = dump_store(&store).await;
        let positions: Vec<u64> = now["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["position"].as_u64().unwrap())
            .collect();
        let newest_pos = last_pos + n;
        assert_eq!(
            positions,
            (newest_pos - 59..=newest_pos).collect::<Vec<_>>(),
            "{case}"
        );
        assert_eq!(en(&now), before + n as i64, "{case}");
        assert_eq!(now["checkpoints"], expected["checkpoints"], "{case}");
        assert_eq!(now["dead_letters"], expected["dead_letters"], "{case}");
        store.close().await.unwrap();
    }
}

/// Appends `docs`, and gives them back as a query reads them: each with its position as `_id`.
async fn append_as_read(
    c: &std::sync::Arc<dyn store::Capped>,
    docs: Vec<store::Document>,
) -> Vec<store::Document> {
    let positions = c
        .append(docs.clone(), Durability::Acknowledged)
        .await
        .unwrap();
    docs.into_iter()
        .zip(positions)
        .map(|(mut d, p)| {
            d.insert("_id".into(), json!(p.0));
            d
        })
        .collect()
}

/// A query whose first `$match` keeps a range of received times reads only the segments (and,
/// where the times came in order, the part of a segment) where they lie, and answers as a
/// query over everything does: with documents without a time, one out of order, and the
/// active segment growing between queries.
#[tokio::test]
async fn a_time_range_reads_only_where_its_documents_lie() {
    use store::query::{Input, Limits, Pipeline, aggregate};
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let events = store.capped("events", &spec(1_000_000, &[])).await.unwrap();
    let base = 1_796_565_600_000_i64;
    let doc = |i: i64| {
        let mut d = event(i as u64);
        if i % 10 != 3 {
            // One out of order, far back, in the middle of the stream.
            let ms = if i == 1500 { base } else { base + i * 1000 };
            d.insert(
                "_tailrace".into(),
                json!({"received": store::date::value(ms).unwrap(), "seq": i}),
            );
        }
        d.insert("lang".into(), json!(["en", "ja", "ar"][(i % 3) as usize]));
        d
    };
    let mut all = Vec::new();
    let append = async |from: i64, to: i64, all: &mut Vec<store::Document>| {
        for chunk in (from..to).collect::<Vec<_>>().chunks(50) {
            let docs: Vec<_> = chunk.iter().map(|i| doc(*i)).collect();
            all.extend(append_as_read(&events, docs).await);
        }
    };
    append(0, 3000, &mut all).await;
    let at = |i: i64| store::date::value(base + i * 1000).unwrap();
    let ask = async |from: i64, to: i64, all: &[store::Document]| {
        let pipeline = Pipeline::parse(&json!([
            {"$match": {"_tailrace.received": {"$gte": at(from), "$lt": at(to)}}},
            {"$group": {"_id": "$lang", "n": {"$count": {}}, "seqs": {"$addToSet": "$_tailrace.seq"}}},
            {"$sort": {"_id": 1}},
        ]))
        .unwrap();
        let want = pipeline.run(all.to_vec(), Limits::default()).unwrap();
        let got = aggregate(Input::Capped(events.clone()), pipeline, Limits::default())
            .await
            .unwrap();
        assert_eq!(got.docs, want.docs, "[{from}, {to})");
        got.read
    };
    // Ten minutes of fifty: the segments around them, not the whole window.
    let read = ask(2000, 2600, &all).await;
    assert!(read < 1500, "read {read} of 3000 for a fifth of the range");
    // The segment holding the document out of order is read whole, and the answer finds it.
    let read = ask(0, 2, &all).await;
    assert!(read >= 1, "read {read}");
    for (from, to) in [(0, 3000), (10, 11), (2990, 5000), (-100, 0), (1200, 1800)] {
        ask(from, to, &all).await;
    }
    assert_eq!(
        ask(4000, 5000, &all).await,
        0,
        "nothing there, nothing read"
    );
    // The active segment grows: the zone goes on from where it stopped.
    append(3000, 3600, &mut all).await;
    let read = ask(3400, 3700, &all).await;
    assert!(read < 1500, "read {read}");
    store.close().await.unwrap();
}

/// Pages newest first and oldest first, filtered and in a time range, followed cursor by
/// cursor, give every matching document once, in order, across many backward steps.
#[tokio::test]
async fn pages_follow_their_cursors_to_every_match() {
    use store::query::{Order, PageRequest, page};
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let events = store.capped("events", &spec(1_000_000, &[])).await.unwrap();
    let base = 1_796_565_600_000_i64;
    for chunk in (0..5000_i64).collect::<Vec<_>>().chunks(500) {
        let docs = chunk
            .iter()
            .map(|i| {
                contract::doc(json!({"i": i, "seven": i % 7 == 0,
                    "_tailrace": {"received": store::date::value(base + i * 1000).unwrap()}}))
            })
            .collect();
        events.append(docs, Durability::Acknowledged).await.unwrap();
    }
    let walk = async |order: Order, received: Option<(i64, i64)>| {
        let mut req = PageRequest {
            filter: Filter::parse(&json!({"seven": true})).unwrap(),
            received,
            order,
            limit: 60,
            after: None,
        };
        let mut seen = Vec::new();
        loop {
            let p = page(&events, &req).await.unwrap();
            seen.extend(p.records.iter().map(|r| r.doc["i"].as_i64().unwrap()));
            match p.next {
                Some(next) => req.after = Some(next),
                None => return seen,
            }
        }
    };
    // An HTTP handler awaits a page on a multi-threaded runtime: its future must be Send.
    fn sendable<F: std::future::Future + Send>(f: F) -> F {
        f
    }
    let req = PageRequest {
        filter: Filter::match_all(),
        received: None,
        order: Order::Newest,
        limit: 1,
        after: None,
    };
    assert_eq!(
        sendable(page(&events, &req)).await.unwrap().records.len(),
        1
    );
    let sevens: Vec<i64> = (0..5000).filter(|i| i % 7 == 0).collect();
    assert_eq!(walk(Order::Oldest, None).await, sevens);
    let newest: Vec<i64> = sevens.iter().rev().copied().collect();
    assert_eq!(walk(Order::Newest, None).await, newest);
    let range = Some((base + 1000 * 1000, base + 2000 * 1000 - 1));
    let within: Vec<i64> = (1000..2000).filter(|i| i % 7 == 0).collect();
    assert_eq!(walk(Order::Oldest, range).await, within);
    let within_newest: Vec<i64> = within.iter().rev().copied().collect();
    assert_eq!(walk(Order::Newest, range).await, within_newest);
    store.close().await.unwrap();
}

/// A query's readers are threads of their own at the lowest priority, on all cores but one,
/// so that a query gives way to the writer, the feeds and the ingester, and leaves them a core.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_querys_readers_run_at_the_lowest_priority_on_their_own_cores() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let events = store.capped("events", &spec(1_000_000, &[])).await.unwrap();
    for chunk in (0..20_000_u64).collect::<Vec<_>>().chunks(1000) {
        let docs = chunk.iter().map(|i| event(*i)).collect();
        events.append(docs, Durability::Acknowledged).await.unwrap();
    }
    let mut scan = events
        .scan(
            Position(1),
            Position(20_000),
            Some(Arc::from(vec!["i".to_owned()])),
        )
        .expect("the embedded engine scans");
    // The first batch taken, the readers wait on the ones after it: alive, and looked at.
    let first = scan.next().await.unwrap().unwrap();
    assert_eq!(
        first.first().map(|r| r.doc.len()),
        Some(1),
        "only the field asked"
    );
    // Each reader's nice value and how many CPUs it may run on.
    let readers: Vec<(i64, usize)> = std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| {
            let t = t.ok()?.path();
            let comm = std::fs::read_to_string(t.join("comm")).ok()?;
            (comm.trim() == "tailrace-query").then_some(())?;
            let stat = std::fs::read_to_string(t.join("stat")).ok()?;
            // Fields after the command's closing parenthesis: state is the 3rd, nice the 19th.
            let rest = stat.rsplit_once(')')?.1;
            let nice = rest.split_whitespace().nth(16)?.parse().ok()?;
            Some((nice, cpus(&std::fs::read_to_string(t.join("status")).ok()?)))
        })
        .collect();
    assert!(!readers.is_empty(), "the readers are named tailrace-query");
    assert!(
        readers.iter().all(|(n, _)| *n == 19),
        "nice values {readers:?}"
    );
    // This thread's CPUs are the process's: the readers have one fewer (the same one alone).
    let mine = cpus(&std::fs::read_to_string("/proc/thread-self/status").unwrap());
    let want = if mine > 1 { mine - 1 } else { 1 };
    assert!(
        readers.iter().all(|(_, c)| *c == want),
        "CPUs the readers may use, of {mine}: {readers:?}"
    );
    assert_eq!(
        store::query::threads(),
        want.min(4),
        "a reader per query core"
    );
    drop(scan);
    store.close().await.unwrap();
}

/// How many CPUs a `/proc/.../status` allows (`Cpus_allowed_list: 0-3,6`).
#[cfg(target_os = "linux")]
fn cpus(status: &str) -> usize {
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .expect("Cpus_allowed_list in status");
    list.trim()
        .split(',')
        .map(|r| match r.split_once('-') {
            Some((a, b)) => b.parse::<usize>().unwrap() - a.parse::<usize>().unwrap() + 1,
            None => 1,
        })
        .sum()
}

/// A `$group` by an indexed field over finished segments is answered from their values
/// files, and gives what a read of every document gives: the same groups in the same order,
/// with null and missing values, numbers and long strings in some segments (which then have
/// no summary of the field), the oldest segment cut by eviction, a damaged values file, the
/// store reopened, and the query bound.
#[tokio::test]
async fn a_group_by_an_indexed_field_reads_its_values_files_and_answers_as_a_read() {
    use store::query::{Input, Limits, Pipeline, aggregate};
    let dir = tempfile::tempdir().unwrap();
    let fields = ["user.screen_name", "lang", "n"];
    let doc = |i: u64| {
        let mut d = event(i);
        // A long tail of names in several scripts, with quotes, `$` and dots; now and then
        // none, a null, or one too long to summarize.
        let name = match i % 97 {
            0 => Value::Null,
            1 if i < 2600 => json!("n".repeat(2000)),
            _ => {
                let n = (i * i) % (200 + i / 10);
                let tail = ["", "🦀", "名前", "\"q\\", "$x.y", "مرحبا"][(n % 6) as usize];
                json!(format!("u{n}{tail}"))
            }
        };
        if i % 89 != 5 {
            d.insert("user".into(), json!({"screen_name": name}));
        } else {
            d.remove("user");
        }
        // A number among the languages of one document.
        let lang = if i == 5050 {
            json!(7)
        } else {
            json!(["en", "ja", "ar"][(i % 3) as usize])
        };
        d.insert("lang".into(), lang);
        d.insert("n".into(), json!(i % 11));
        d
    };
    let pipelines = [
        json!([{"$group": {"_id": "$user.screen_name"}}, {"$count": "n"}]),
        json!([{"$group": {"_id": "$user.screen_name", "n": {"$sum": 1}}}]),
        json!([
            {"$group": {"_id": "$user.screen_name", "c": {"$count": {}}, "t": {"$sum": -3}}},
            {"$match": {"c": {"$gt": 2}}},
            {"$sort": {"_id": 1}},
        ]),
        json!([{"$group": {"_id": "$lang", "n": {"$sum": 1}}}]),
        json!([{"$group": {"_id": "$n", "n": {"$sum": 1}}}]),
        json!([{"$sortByCount": "$user.screen_name"}, {"$limit": 7}]),
        json!([{"$sortByCount": "$user.screen_name"}, {"$skip": 3}]),
    ];
    let ask = async |store: &EmbeddedStore, all: &[store::Document], first_read: bool| {
        let events = store.capped("events", &spec(6000, &fields)).await.unwrap();
        let oldest = events.bounds().await.unwrap().unwrap().oldest.0;
        let window: Vec<store::Document> = all
            .iter()
            .filter(|d| d["_id"].as_u64().unwrap() >= oldest)
            .cloned()
            .collect();
        let mut ran = Vec::new();
        for p in &pipelines {
            let pipeline = Pipeline::parse(p).unwrap();
            let want = pipeline.run(window.clone(), Limits::default()).unwrap();
            let got = aggregate(Input::Capped(events.clone()), pipeline, Limits::default())
                .await
                .unwrap();
            assert_eq!(got.docs, want.docs, "{p}");
            ran.push((got.stages[0].ran, got.read));
        }
        // Names: from the summaries, reading fewer documents than the window holds.
        assert_eq!(ran[0].0, "index", "{ran:?}");
        if first_read {
            assert!(ran[0].1 < window.len() as u64, "{ran:?}");
        }
        // A number in one segment: that segment's documents are read, the rest summarized.
        assert_eq!(ran[3].0, "index", "{ran:?}");
        // Numbers everywhere: no summary at all, every document read.
        assert_eq!(ran[4], ("tailrace", window.len() as u64), "{ran:?}");
        // The most active names, from the summaries too.
        assert_eq!(ran[5].0, "index", "{ran:?}");
        // The bound on what a `$group` holds applies as it does to a read.
        let small = Limits { max_bytes: 10_000 };
        let err = aggregate(
            Input::Capped(events.clone()),
            Pipeline::parse(&pipelines[1]).unwrap(),
            small,
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("[0].$group: holds more than the query bound"),
            "{err}"
        );
        ran
    };

    // Small segments: many of them finished.
    let open = |dir: &tempfile::TempDir| small_segments(dir.path(), true);
    let store = open(&dir);
    let events = store.capped("events", &spec(6000, &fields)).await.unwrap();
    let mut all = Vec::new();
    for chunk in (0..8000).collect::<Vec<u64>>().chunks(40) {
        let docs: Vec<_> = chunk.iter().map(|i| doc(*i)).collect();
        all.extend(append_as_read(&events, docs).await);
        maintain(&store).await;
    }
    let jdir = dir.path().join("journal");
    let values_files = || values_files_in(&jdir);
    let logs = std::fs::read_dir(&jdir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|e| e == "log")
        })
        .count();
    assert!(
        values_files().len() >= 10,
        "{:?} of {logs} segments",
        values_files()
    );
    let before = ask(&store, &all, true).await;

    // A damaged values file is not used: its segment's documents are read instead.
    let damaged = values_files()[values_files().len() / 2].clone();
    let mut bytes = std::fs::read(&damaged).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x40;
    std::fs::write(&damaged, &bytes).unwrap();
    let after = ask(&store, &all, true).await;
    assert!(after[0].1 > before[0].1, "{before:?} {after:?}");
    store.close().await.unwrap();

    // Reopened: the files of finished segments are used again. One left for the segment
    // being written (what a failed sync, then a cut and the same end written again, would
    // leave) is removed at the open.
    let last = std::fs::read_dir(&jdir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .max()
        .unwrap()
        .with_extension("val");
    std::fs::copy(&values_files()[0], &last).unwrap();
    let store = open(&dir);
    assert!(!last.exists(), "{}", last.display());
    ask(&store, &all, true).await;
    store.close().await.unwrap();
}

/// A store whose journal segments hold 16 KiB, so that a few thousand events finish many;
/// with `manual` maintenance, only [`maintain`] does it.
fn small_segments(dir: &std::path::Path, manual: bool) -> EmbeddedStore {
    EmbeddedStore::open_with(
        dir,
        EmbeddedOptions::default(),
        Tuning {
            segment_bytes: 16 * 1024,
            ..Tuning::default()
        },
        store::embedded::Io {
            manual_maintenance: manual,
            ..Default::default()
        },
    )
    .unwrap()
}

/// The values files in the journal directory `jdir`, by name (segment number).
fn values_files_in(jdir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(jdir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "val"))
        .collect();
    v.sort();
    v
}

/// Finished segments without a values file get one: a store from before values files (every
/// file gone), a damaged file, and a field added to the indexes of a store that has them.
/// Until then a `$group` by the field reads those segments' documents; after, it reads their
/// files, and the answer is the read's either way. With maintenance on its own thread, the
/// files come while the store is idle.
#[tokio::test]
async fn values_files_a_store_lacks_are_written_while_it_is_idle() {
    use store::query::{Input, Limits, Pipeline, aggregate};
    let dir = tempfile::tempdir().unwrap();
    let jdir = dir.path().join("journal");
    let open = |manual: bool| small_segments(dir.path(), manual);
    let files = || values_files_in(&jdir);
    let doc = |i: u64| {
        let mut d = event(i);
        d.insert(
            "lang".into(),
            json!(["en", "ja", "ar", "🌍"][(i % 4) as usize]),
        );
        d
    };
    // Each pipeline's answer against the read of every document; where the `$group` ran and
    // how many documents were read.
    let ask = async |events: &std::sync::Arc<dyn store::Capped>, all: &[store::Document]| {
        let mut out = Vec::new();
        for field in ["lang", "user.screen_name"] {
            let p = json!([{"$group": {"_id": format!("${field}"), "n": {"$sum": 1}}}]);
            let pipeline = Pipeline::parse(&p).unwrap();
            let want = pipeline.run(all.to_vec(), Limits::default()).unwrap();
            let got = aggregate(Input::Capped(events.clone()), pipeline, Limits::default())
                .await
                .unwrap();
            assert_eq!(got.docs, want.docs, "{p}");
            out.push((got.stages[0].ran, got.read));
        }
        out
    };

    let store = open(true);
    let events = store
        .capped("events", &spec(100_000, &["lang"]))
        .await
        .unwrap();
    let mut all = Vec::new();
    for chunk in (0..8000).collect::<Vec<u64>>().chunks(80) {
        all.extend(append_as_read(&events, chunk.iter().map(|i| doc(*i)).collect()).await);
        maintain(&store).await;
    }
    let n = all.len() as u64;
    let segments = files().len();
    assert!(segments >= 10, "{segments} values files");
    let from_files = ask(&events, &all).await[0];
    assert_eq!(from_files.0, "index");
    assert!(from_files.1 < n / 4, "{from_files:?} of {n}");
    store.close().await.unwrap();

    // A store from before values files: none, but for one damaged.
    let kept = files()[segments / 2].clone();
    for f in files() {
        if f != kept {
            std::fs::remove_file(f).unwrap();
        }
    }
    let mut bytes = std::fs::read(&kept).unwrap();
    let at = bytes.len() - 9;
    bytes[at] ^= 0x01;
    std::fs::write(&kept, &bytes).unwrap();
    let store = open(true);
    let events = store
        .capped("events", &spec(100_000, &["lang"]))
        .await
        .unwrap();
    assert_eq!(ask(&events, &all).await[0].1, n, "every document read");
    maintain(&store).await;
    assert_eq!(files().len(), segments, "{:?}", files());
    assert_ne!(
        std::fs::read(&kept).unwrap(),
        bytes,
        "the damaged file written again"
    );
    assert_eq!(ask(&events, &all).await[0], from_files);
    store.close().await.unwrap();

    // A field added to the indexes: its files are written again, with it.
    let store = open(true);
    let fields = ["lang", "user.screen_name"];
    let events = store
        .capped("events", &spec(100_000, &fields))
        .await
        .unwrap();
    let before = ask(&events, &all).await;
    assert_eq!(
        before[1].1, n,
        "{before:?}: no summary of the new field yet"
    );
    maintain(&store).await;
    let after = ask(&events, &all).await;
    assert_eq!(after[0], from_files, "{after:?}");
    assert_eq!(after[1].0, "index", "{after:?}");
    assert!(after[1].1 < n / 4, "{after:?} of {n}");
    store.close().await.unwrap();

    // Maintenance on its own thread: the files come without being asked for.
    for f in files() {
        std::fs::remove_file(f).unwrap();
    }
    let store = open(false);
    let events = store
        .capped("events", &spec(100_000, &fields))
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while files().len() < segments && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(files().len(), segments, "{:?}", files());
    assert_eq!(ask(&events, &all).await, after);
    store.close().await.unwrap();
}

/// A count by time bucket of the received time adds up the runs of documents received within
/// one second, reads only what no run decides (a second the range cuts, documents without a
/// time, a time through an array, a slow stretch), and answers as a read of every document
/// does: with times out of order, missing, not dates, before 1970, evictions, and the active
/// segment growing between queries.
#[tokio::test]
async fn a_count_by_time_bucket_adds_up_runs_and_answers_as_a_read() {
    use store::query::{Input, Limits, Pipeline, aggregate};
    let dir = tempfile::tempdir().unwrap();
    let store = small_segments(dir.path(), true);
    let events = store.capped("events", &spec(5500, &[])).await.unwrap();
    let base = 1_796_565_600_000_i64;
    // Ten a second, each 100 ms apart; from 6000 on, one every 2 s (a slow stream).
    let ms = |i: i64| {
        if i < 6000 {
            base + i * 100
        } else {
            base + 600_000 + (i - 6000) * 2000
        }
    };
    let doc = |i: i64| {
        let mut d = event(i as u64);
        let received = match i {
            _ if i % 41 == 7 => None,
            1500 => Some(json!("2026-12-07T10:00:00Z")),
            5300 => Some(json!([store::date::value(ms(i)).unwrap()])),
            2500 => Some(json!({"$date": {"$numberLong": "-5000"}})),
            3300 => Some(store::date::value(base).unwrap()),
            _ => Some(store::date::value(ms(i)).unwrap()),
        };
        if let Some(r) = received {
            d.insert("_tailrace".into(), json!({"received": r, "seq": i}));
        }
        d
    };
    let mut all = Vec::new();
    let append = async |from: i64, to: i64, all: &mut Vec<store::Document>| {
        for chunk in (from..to).collect::<Vec<_>>().chunks(50) {
            let docs: Vec<_> = chunk.iter().map(|i| doc(*i)).collect();
            all.extend(append_as_read(&events, docs).await);
            maintain(&store).await;
        }
    };
    let at = |ms: i64| store::date::value(ms).unwrap();
    let minute = json!({"$dateTrunc": {"date": "$_tailrace.received", "unit": "minute"}});
    let pipelines = |from: i64, to: i64| {
        vec![
            json!([
                {"$match": {"_tailrace.received": {"$gte": at(from)}}},
                {"$group": {"_id": minute, "n": {"$sum": 1}}},
                {"$sort": {"_id": 1}},
            ]),
            json!([
                {"$match": {"_tailrace.received": {"$gt": at(from), "$lte": at(to)}}},
                {"$group": {"_id": {"$dateTrunc": {"date": "$_tailrace.received", "unit": "second", "binSize": 15}}, "c": {"$count": {}}, "t": {"$sum": -3}}},
            ]),
            json!([
                {"$match": {"_tailrace.received": {"$gte": at(from), "$lt": at(to)}}},
                {"$sortByCount": {"m": minute, "k": "x"}},
                {"$limit": 3},
            ]),
            json!([
                {"$match": {"_tailrace.received": {"$gte": at(from), "$lt": at(to)}}},
                {"$group": {"_id": null, "n": {"$sum": 1}}},
            ]),
            // Over everything: a time that is not a date fails the `$dateTrunc`, in both.
            json!([{"$group": {"_id": minute, "n": {"$sum": 1}}}]),
            // Documents without a time count too.
            json!([{"$group": {"_id": "all", "n": {"$count": {}}}}]),
        ]
    };
    // Each answer (or error) against the read of every retained document; where the first
    // stage ran and how much was read.
    let ask = async |from: i64, to: i64, all: &[store::Document]| {
        let oldest = events.bounds().await.unwrap().unwrap().oldest.0;
        let window: Vec<store::Document> = all
            .iter()
            .filter(|d| d["_id"].as_u64().unwrap() >= oldest)
            .cloned()
            .collect();
        let mut ran = Vec::new();
        for p in pipelines(from, to) {
            let pipeline = Pipeline::parse(&p).unwrap();
            let want = pipeline
                .run(window.clone(), Limits::default())
                .map(|a| a.docs)
                .map_err(|e| e.to_string());
            let got = aggregate(Input::Capped(events.clone()), pipeline, Limits::default()).await;
            let stage = got.as_ref().ok().map(|a| (a.stages[0].ran, a.read));
            let got = got.map(|a| a.docs).map_err(|e| e.to_string());
            assert_eq!(got, want, "{p}");
            ran.push(stage);
        }
        (ran, window.len() as u64)
    };

    append(0, 5000, &mut all).await;
    // A minute and a half, from a cut second: runs, and the few documents they leave.
    let (ran, window) = ask(base + 300_050, base + 390_050, &all).await;
    for r in &ran[..4] {
        let (where_, read) = r.unwrap();
        assert_eq!(where_, "timeline", "{ran:?}");
        assert!(read < window / 20, "{ran:?} of {window}");
    }
    assert_eq!(ran[4], None, "the string time fails the whole window");
    let (where_, read) = ran[5].unwrap();
    assert!(where_ == "timeline" && read < window, "{ran:?} of {window}");
    // The same over the times out of order, missing and not dates.
    let (ran, _) = ask(base, base + 500_000, &all).await;
    assert!(
        ran[..4].iter().all(|r| r.unwrap().0 == "timeline"),
        "{ran:?}"
    );
    for (from, to) in [
        (0, 253_402_300_799_999),
        (base + 10, base + 20),
        (base - 99_999, base),
    ] {
        ask(from, to, &all).await;
    }
    // The active segment grows, with a time through an array (its segment is read whole).
    append(5000, 5600, &mut all).await;
    ask(base + 480_000, base + 560_000, &all).await;
    // Over the time through an array: a `$dateTrunc` of an array fails, in both; the count
    // does not.
    let (ran, _) = ask(base, base + 10_000_000, &all).await;
    assert_eq!(ran[..3], [None, None, None], "{ran:?}");
    assert_eq!(ran[3].unwrap().0, "timeline", "{ran:?}");
    append(5600, 7000, &mut all).await;
    // Then the stream slows to a document every 2 s, and the oldest documents are evicted:
    // a zone whose runs would stand for a document each keeps none, and is read.
    let (ran, _) = ask(base + 590_000, base + 10_000_000, &all).await;
    assert!(ran[..4].iter().all(|r| r.is_some()), "{ran:?}");
    // The bound on what a `$group` holds applies as in a read.
    let small = Limits { max_bytes: 300 };
    let err = aggregate(
        Input::Capped(events.clone()),
        Pipeline::parse(&pipelines(base, base + 500_000)[1]).unwrap(),
        small,
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        err.starts_with("[1].$group: holds more than the query bound"),
        "{err}"
    );
    store.close().await.unwrap();
}

/// A file system that, once armed, holds the first read of a journal segment until told to
/// go on: a reader paused there while maintenance releases segments.
#[derive(Debug, Default)]
struct PausingFs {
    armed: std::sync::atomic::AtomicBool,
    /// Sends when a read is held; the read goes on when `go` receives.
    held: std::sync::Mutex<Option<std::sync::mpsc::Sender<()>>>,
    go: std::sync::Mutex<Option<std::sync::mpsc::Receiver<()>>>,
}

#[derive(Debug)]
struct PausingFile {
    fs: Arc<PausingFs>,
    inner: Arc<dyn store::embedded::fs::FsFile>,
    segment: bool,
}

impl store::embedded::fs::FsFile for PausingFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        use std::sync::atomic::Ordering;
        if self.segment && self.fs.armed.swap(false, Ordering::SeqCst) {
            if let Some(held) = self.fs.held.lock().unwrap().take() {
                held.send(()).unwrap();
            }
            if let Some(go) = self.fs.go.lock().unwrap().take() {
                go.recv().unwrap();
            }
        }
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.inner.sync_data()
    }
    fn sync_all(&self) -> std::io::Result<()> {
        self.inner.sync_all()
    }
    fn allocate(&self, from: u64, to: u64) -> std::io::Result<()> {
        self.inner.allocate(from, to)
    }
    fn size(&self) -> std::io::Result<u64> {
        self.inner.size()
    }
    fn direct(&self) -> bool {
        self.inner.direct()
    }
    fn write_align(&self) -> u64 {
        self.inner.write_align()
    }
}

/// The real file system, through [`PausingFile`]s.
#[derive(Debug)]
struct Pausing(Arc<PausingFs>);

impl store::embedded::fs::Fs for Pausing {
    fn create_dir_all(&self, dir: &std::path::Path) -> std::io::Result<()> {
        store::embedded::fs::RealFs.create_dir_all(dir)
    }
    fn list(&self, dir: &std::path::Path) -> std::io::Result<Vec<String>> {
        store::embedded::fs::RealFs.list(dir)
    }
    fn exists(&self, path: &std::path::Path) -> bool {
        store::embedded::fs::RealFs.exists(path)
    }
    fn open(
        &self,
        path: &std::path::Path,
        how: store::embedded::fs::Open,
    ) -> std::io::Result<Arc<dyn store::embedded::fs::FsFile>> {
        Ok(Arc::new(PausingFile {
            fs: self.0.clone(),
            inner: store::embedded::fs::RealFs.open(path, how)?,
            segment: path.extension().is_some_and(|e| e == "log"),
        }))
    }
    fn read(&self, path: &std::path::Path) -> std::io::Result<Vec<u8>> {
        store::embedded::fs::RealFs.read(path)
    }
    fn remove(&self, path: &std::path::Path) -> std::io::Result<()> {
        store::embedded::fs::RealFs.remove(path)
    }
    fn remove_dir(&self, dir: &std::path::Path) -> std::io::Result<()> {
        store::embedded::fs::RealFs.remove_dir(dir)
    }
    fn rename(&self, from: &std::path::Path, to: &std::path::Path) -> std::io::Result<()> {
        store::embedded::fs::RealFs.rename(from, to)
    }
    fn sync_dir(&self, dir: &std::path::Path) -> std::io::Result<()> {
        store::embedded::fs::RealFs.sync_dir(dir)
    }
}

/// The newest documents of an indexed value, asked while maintenance releases the segments
/// the read has listed but not reached yet (their documents move into the tree): every one
/// is found, once.
#[tokio::test]
async fn the_newest_of_a_value_are_found_while_their_segments_are_released() {
    let dir = tempfile::tempdir().unwrap();
    let fs = Arc::new(PausingFs::default());
    let store = EmbeddedStore::open_with(
        dir.path(),
        EmbeddedOptions::default(),
        Tuning {
            segment_bytes: 16 * 1024,
            ..Tuning::default()
        },
        store::embedded::Io {
            fs: Arc::new(Pausing(fs.clone())),
            manual_maintenance: true,
        },
    )
    .unwrap();
    let events = store
        .capped("events", &spec(50, &["user.id"]))
        .await
        .unwrap();
    let letters = store
        .capped("dead", &spec(1000, &["reason"]))
        .await
        .unwrap();
    events_and_letters(&events, &letters, |b| b % 50 == 0 || b == 199).await;
    let before = store.segments();
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel();
    *fs.held.lock().unwrap() = Some(held_tx);
    *fs.go.lock().unwrap() = Some(go_rx);
    fs.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    let asking = {
        let letters = letters.clone();
        tokio::spawn(async move { letters.latest("reason", &json!("bad"), 10).await })
    };
    // The read holds at its first document (the newest segment's); meanwhile the older
    // segments go.
    tokio::task::spawn_blocking(move || held_rx.recv().unwrap())
        .await
        .unwrap();
    maintain(&store).await;
    assert!(
        store.segments() < before,
        "{} of {before}",
        store.segments()
    );
    go_tx.send(()).unwrap();
    let got = asking.await.unwrap().unwrap();
    let bs: Vec<Value> = got.iter().map(|r| r.doc["b"].clone()).collect();
    assert_eq!(
        bs,
        vec![json!(199), json!(150), json!(100), json!(50), json!(0)]
    );
    store.close().await.unwrap();
}
