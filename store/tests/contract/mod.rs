//! The store contract suite: written once, run against every engine.
//!
//! Each check takes a store and uses collection names of its own, so one store (for MongoDB,
//! one database) can serve the whole suite. Every await is under a timeout: a broken engine
//! fails a check, it never hangs the suite.

#![allow(dead_code, clippy::unwrap_used)]

pub mod filter_cases;
mod filters;
mod queries;
mod reference;

pub use filters::{filter_cases_on_capped, filter_cases_on_keyed};
pub use queries::{
    keyed_queries_answer_as_in_memory, queries_run_on_the_server_as_far_as_it_agrees,
    random_pipelines_answer_as_in_memory,
};

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};
use store::{
    Capped, CappedSpec, Change, ChangeFilter, ChangeOp, ChangeStart, ChangeStream, Document,
    Durability, Filter, KeyUpdate, Position, RecordStream, Start, Store, StoreError, Update,
};

/// Calls `$runner!(check: [needs], ...)` with every check that takes only a store, so each
/// engine's runner gets the same list and a new check cannot be forgotten in one of them.
/// `needs` names the [`store::Capability`]s a check uses beyond the basic contract (capped
/// collections, keyed collections, checkpoints): a runner for a server that lacks one reports
/// the check as ignored, with the server's reply. The embedded engine has every capability.
/// (`history_lost` needs the engine's history size, so runners call it themselves.)
macro_rules! every_check {
    ($runner:ident) => {
        $runner!(
            append_positions_increase: [],
            tail_orders_then_awaits: [],
            tail_start_now_and_after: [],
            tail_now_sees_positions_a_refused_group_frees: [],
            a_refused_document_stores_what_the_answer_says: [],
            eviction_by_count: [CappedBounds],
            eviction_by_bytes: [CappedBounds],
            position_lost: [CappedBounds],
            latest_by_indexed_field: [],
            change_ops_with_images: [ChangeStreams, BeforeImages],
            post_images_only: [ChangeStreams, BeforeImages],
            one_update_of_a_key_several_times: [ChangeStreams, BeforeImages],
            append_with_updates_all_or_nothing: [ChangeStreams, DocumentsAsSent],
            resume_from_token: [ChangeStreams],
            change_filters: [ChangeStreams],
            oplog_across_collections: [ChangeStreams],
            durability_levels: [],
            checkpoints_round_trip: [],
            resume_token_advances_past_filtered: [ChangeStreams],
            expire_removes_idle_keys: [ChangeStreams],
            newest_matching_walks_back: [],
            filtered_tail_keeps_order_and_detects_eviction: [CappedBounds],
            capped_initial_then_tail_exactly_once: [],
            keyed_snapshot_then_changes_exactly_once: [ChangeStreams, SnapshotReads],
            scan_pages_by_key: [],
            keys_past_the_bound_are_refused: [],
            filter_cases_on_capped: [],
            filter_cases_on_keyed: [ChangeStreams, SnapshotReads],
            random_pipelines_answer_as_in_memory: [],
            queries_run_on_the_server_as_far_as_it_agrees: [],
            keyed_queries_answer_as_in_memory: [],
        );
    };
}
pub(crate) use every_check;

/// Long enough for any healthy engine on a loaded machine, short enough to fail fast.
pub const WAIT: Duration = Duration::from_secs(10);
/// How long "nothing arrives" is watched for.
pub const QUIET: Duration = Duration::from_millis(200);

pub fn doc(v: Value) -> Document {
    v.as_object().cloned().expect("test documents are objects")
}

/// Documents as [`store::Capped::append_with_updates`] takes them: shared.
fn shared(docs: Vec<Document>) -> Arc<[Arc<Document>]> {
    docs.into_iter().map(Arc::new).collect()
}

fn spec(max_docs: u64, max_bytes: u64) -> CappedSpec {
    CappedSpec {
        max_docs,
        max_bytes,
        indexes: vec!["user.screen_name".into(), "n".into()],
    }
}

pub(crate) async fn capped(
    store: &dyn Store,
    name: &str,
    max_docs: u64,
    max_bytes: u64,
) -> Arc<dyn Capped> {
    store
        .capped(name, &spec(max_docs, max_bytes))
        .await
        .expect("open capped collection")
}

pub async fn next_record(tail: &mut RecordStream) -> store::Record {
    tokio::time::timeout(WAIT, tail.next())
        .await
        .expect("tail should yield within the timeout")
        .expect("tail should not end")
        .expect("tail should not fail")
}

async fn next_change(s: &mut ChangeStream) -> Change {
    tokio::time::timeout(WAIT, s.next())
        .await
        .expect("change stream should yield within the timeout")
        .expect("change stream should not end")
        .expect("change stream should not fail")
}

async fn append_n(c: &dyn Capped, from: u64, n: u64, d: Durability) -> Vec<Position> {
    let docs = (from..from + n)
        .map(|i| doc(json!({"n": i, "pad": "x".repeat(10)})))
        .collect();
    c.append(docs, d).await.expect("append")
}

/// Positions strictly increase across batches, and each one reads back its document.
pub async fn append_positions_increase(store: &dyn Store) {
    let c = capped(store, "c_positions", 1000, 1 << 20).await;
    let mut all = Vec::new();
    for b in 0..3 {
        all.extend(append_n(&*c, b * 4, 4, Durability::Acknowledged).await);
    }
    assert_eq!(all.len(), 12, "every appended document gets a position");
    assert!(
        all.windows(2).all(|w| w[0] < w[1]),
        "positions must strictly increase: {all:?}"
    );
    for (i, p) in all.iter().enumerate() {
        let r = c
            .get(*p)
            .await
            .unwrap()
            .expect("get(position) finds the document");
        assert_eq!(r.doc["n"], json!(i as u64), "document at {p}");
    }
}

/// A tail from the oldest yields everything in insertion order, then waits for new documents
/// (no item while quiet) and wakes on the next append.
pub async fn tail_orders_then_awaits(store: &dyn Store) {
    let c = capped(store, "c_tail", 1000, 1 << 20).await;
    append_n(&*c, 0, 5, Durability::Acknowledged).await;
    let mut tail = c.tail(Start::Oldest);
    for i in 0..5 {
        assert_eq!(
            next_record(&mut tail).await.doc["n"],
            json!(i),
            "tail order"
        );
    }
    assert!(
        tokio::time::timeout(QUIET, tail.next()).await.is_err(),
        "a caught-up tail must wait, not yield or end"
    );
    let c2 = c.clone();
    let writer = tokio::spawn(async move { append_n(&*c2, 5, 1, Durability::Journaled).await });
    let r = next_record(&mut tail).await;
    assert_eq!(r.doc["n"], json!(5), "tail wakes on a later append");
    writer.await.unwrap();
}

/// A tail opened at "now" while a group of appends is being refused still gets every document
/// appended after it opened. The refused group holds a document with a `$`-prefixed key (a
/// server that does not store documents as sent refuses it, after a round trip) and one over
/// MongoDB's 16 MiB limit (refused by every MongoDB-compatible server): the MongoDB engine
/// gives a failed group's positions to the next appends, and a tail that started after the
/// positions in flight never saw those documents. An engine that stores both documents passes
/// them to the tail too, which is as right.
pub async fn tail_now_sees_positions_a_refused_group_frees(store: &dyn Store) {
    let c = capped(store, "c_refused", 1000, 64 << 20).await;
    append_n(&*c, 0, 1, Durability::Acknowledged).await;
    for round in 0..3 {
        let group = vec![
            doc(json!({"$refused": round})),
            doc(json!({"pad": "x".repeat(17 << 20)})),
        ];
        let refuser = c.clone();
        let refused =
            tokio::spawn(async move { refuser.append(group, Durability::Acknowledged).await });
        // Let the append reach the engine's writer before the tail opens.
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
        let mut tail = c.tail(Start::Now);
        let _ = tokio::time::timeout(WAIT, refused)
            .await
            .expect("the refused append answers");
        let after = c
            .append(vec![doc(json!({"after": round}))], Durability::Acknowledged)
            .await
            .expect("the next append is taken")[0];
        loop {
            let r = next_record(&mut tail).await;
            if r.doc.get("after") == Some(&json!(round)) {
                assert_eq!(r.position, after, "round {round}: the tail's document");
                break;
            }
            assert!(
                r.doc.contains_key("$refused") || r.doc.contains_key("pad"),
                "round {round}: only the group's own documents may come first, got {:?}",
                r.doc.keys().collect::<Vec<_>>()
            );
        }
    }
}

/// An append whose middle document the store refuses (a `$`-prefixed key, refused by servers
/// that do not store documents as sent; 17 MiB, over every MongoDB-compatible server's limit)
/// stores exactly what its answer says: everything (an engine that takes both), nothing
/// (all or nothing), or, as [`StoreError::PartlyWritten`] says, the documents before the
/// refused one, once each. A caller that retries from there stores nothing twice.
pub async fn a_refused_document_stores_what_the_answer_says(store: &dyn Store) {
    let c = capped(store, "c_partial", 1000, 64 << 20).await;
    let sent = vec![
        doc(json!({"n": 1})),
        doc(json!({"n": 2, "$refused": true, "pad": "x".repeat(17 << 20)})),
        doc(json!({"n": 3})),
    ];
    let answer = c.append(sent, Durability::Acknowledged).await;
    let held: Vec<i64> = c
        .newest_matching(&Filter::match_all(), 100)
        .await
        .unwrap()
        .records
        .iter()
        .rev()
        .map(|r| r.doc["n"].as_i64().unwrap())
        .collect();
    let expected: Vec<i64> = match &answer {
        Ok(positions) => {
            assert_eq!(positions.len(), 3);
            vec![1, 2, 3]
        }
        Err(StoreError::PartlyWritten { written, error }) => {
            assert!(!error.is_transient(), "refused, not unavailable: {error}");
            (1..=*written as i64).collect()
        }
        Err(e) => {
            assert!(!e.is_transient(), "refused, not unavailable: {e}");
            vec![]
        }
    };
    assert_eq!(held, expected, "stored as the answer says: {answer:?}");
    let retried = c
        .append(vec![doc(json!({"n": 3}))], Durability::Acknowledged)
        .await
        .unwrap();
    assert_eq!(retried.len(), 1);
}

/// `Start::Now` skips existing documents; `Start::After(p)` yields exactly those after `p`.
pub async fn tail_start_now_and_after(store: &dyn Store) {
    let c = capped(store, "c_start", 1000, 1 << 20).await;
    let p = append_n(&*c, 0, 5, Durability::Acknowledged).await;
    let mut now = c.tail(Start::Now);
    let mut after = c.tail(Start::After(p[2]));
    assert_eq!(next_record(&mut after).await.position, p[3]);
    assert_eq!(next_record(&mut after).await.position, p[4]);
    append_n(&*c, 5, 1, Durability::Acknowledged).await;
    assert_eq!(
        next_record(&mut now).await.doc["n"],
        json!(5),
        "Now starts after the newest"
    );
    assert_eq!(next_record(&mut after).await.doc["n"], json!(5));
}

/// The count limit evicts the oldest documents first.
pub async fn eviction_by_count(store: &dyn Store) {
    let c = capped(store, "c_evict_count", 10, 1 << 20).await;
    let p = append_n(&*c, 0, 25, Durability::Acknowledged).await;
    let count = c.usage().await.unwrap().docs;
    assert_eq!(count, 10, "max_docs = 10 keeps 10 documents");
    let store::Bounds { oldest, newest } = c.bounds().await.unwrap().unwrap();
    assert_eq!(
        (oldest, newest),
        (p[15], p[24]),
        "the oldest are evicted first"
    );
    assert!(
        c.get(p[14]).await.unwrap().is_none(),
        "an evicted document is gone"
    );
}

/// The byte limit evicts the oldest documents first, keeping the total within the limit.
pub async fn eviction_by_bytes(store: &dyn Store) {
    let c = capped(store, "c_evict_bytes", 1_000_000, 4096).await;
    let docs: Vec<Document> = (0..100)
        .map(|i| doc(json!({"n": i, "pad": "y".repeat(200)})))
        .collect();
    let p = c.append(docs, Durability::Acknowledged).await.unwrap();
    let store::Usage { docs: count, bytes } = c.usage().await.unwrap();
    assert!(
        bytes <= 4096,
        "bytes kept ({bytes}) must be within max_bytes 4096"
    );
    assert!(
        (10..100).contains(&count),
        "some but not all documents kept, got {count}"
    );
    let store::Bounds { oldest, newest } = c.bounds().await.unwrap().unwrap();
    assert_eq!(newest, p[99], "the newest document is kept");
    assert_eq!(
        oldest,
        p[100 - count as usize],
        "the kept ones are the newest, contiguous"
    );
}

/// A reader whose next document was evicted ends with `PositionLost`, naming the oldest kept.
pub async fn position_lost(store: &dyn Store) {
    let c = capped(store, "c_lost", 5, 1 << 20).await;
    let p = append_n(&*c, 0, 20, Durability::Acknowledged).await;
    let mut tail = c.tail(Start::After(p[1]));
    let err = tokio::time::timeout(WAIT, tail.next())
        .await
        .expect("tail answers")
        .expect("tail yields an error, not an end")
        .expect_err("reading after an evicted position must fail");
    match err {
        StoreError::PositionLost { after, oldest, .. } => {
            assert_eq!(after, p[1]);
            assert_eq!(oldest, p[15], "oldest retained with max_docs = 5");
        }
        other => panic!("expected PositionLost, got {other}"),
    }
    // Restarting from the oldest works.
    let mut again = c.tail(Start::Oldest);
    assert_eq!(next_record(&mut again).await.position, p[15]);
}

/// `latest(field = value, limit)` returns the newest matches first; an unindexed field is refused.
pub async fn latest_by_indexed_field(store: &dyn Store) {
    let c = capped(store, "c_latest", 1000, 1 << 20).await;
    let docs = (0..30)
        .map(|i| doc(json!({"i": i, "user": {"screen_name": format!("u{}", i % 3)}})))
        .collect();
    c.append(docs, Durability::Acknowledged).await.unwrap();
    let got = c.latest("user.screen_name", &json!("u1"), 4).await.unwrap();
    let is: Vec<Value> = got.iter().map(|r| r.doc["i"].clone()).collect();
    assert_eq!(
        is,
        vec![json!(28), json!(25), json!(22), json!(19)],
        "newest first, limit 4"
    );
    let none = c
        .latest("user.screen_name", &json!("nobody"), 4)
        .await
        .unwrap();
    assert!(none.is_empty());
    let numeric = c.latest("n", &json!(7), 1).await.unwrap();
    assert!(numeric.is_empty(), "no document has n");
    let err = c
        .latest("i", &json!(1), 1)
        .await
        .expect_err("i is not indexed");
    assert!(matches!(err, StoreError::NotIndexed { .. }), "got {err}");
}

/// Insert, update, replace and delete are published in order with before/after images.
pub async fn change_ops_with_images(store: &dyn Store) {
    let k = store.keyed("k_ops").await.unwrap();
    let mut s = k.changes(ChangeFilter::default(), ChangeStart::Now);
    k.update(
        vec![store::KeyUpdate::new("a", Update::inc("count", 1))],
        Durability::Acknowledged,
    )
    .await
    .unwrap();
    k.update(
        vec![store::KeyUpdate::new(
            "a",
            Update::inc("count", 2).and_set("tag", "x"),
        )],
        Durability::Acknowledged,
    )
    .await
    .unwrap();
    k.set("a", doc(json!({"fresh": true})), Durability::Acknowledged)
        .await
        .unwrap();
    assert!(
        k.delete("a", Durability::Acknowledged).await.unwrap(),
        "a existed"
    );
    assert!(
        !k.delete("a", Durability::Acknowledged).await.unwrap(),
        "a is gone"
    );

    let c = next_change(&mut s).await;
    assert_eq!((c.op, c.key.as_str()), (ChangeOp::Insert, "a"));
    assert!(c.before.is_none());
    assert_eq!(c.after.as_ref().unwrap()["count"], json!(1));
    let c = next_change(&mut s).await;
    assert_eq!(c.op, ChangeOp::Update);
    assert_eq!(c.before.as_ref().unwrap()["count"], json!(1), "pre-image");
    assert_eq!(c.after.as_ref().unwrap()["count"], json!(3), "post-image");
    assert_eq!(c.after.as_ref().unwrap()["tag"], json!("x"));
    let c = next_change(&mut s).await;
    assert_eq!(c.op, ChangeOp::Replace);
    assert_eq!(c.after.as_ref().unwrap()["fresh"], json!(true));
    assert!(
        c.after.as_ref().unwrap().get("count").is_none(),
        "replace drops old fields"
    );
    let c = next_change(&mut s).await;
    assert_eq!(c.op, ChangeOp::Delete);
    assert!(c.after.is_none());
    assert!(
        tokio::time::timeout(QUIET, s.next()).await.is_err(),
        "deleting a missing key publishes nothing"
    );
    assert!(k.get("a").await.unwrap().is_none());
}

/// `post_images_only` leaves out the pre-image of inserts, updates and replaces, and only
/// that: a delete keeps the pre-image it has without the flag, and everything else is the
/// same, live and read back from the history.
pub async fn post_images_only(store: &dyn Store) {
    let k = store.keyed("k_post").await.unwrap();
    let only_post = ChangeFilter {
        post_images_only: true,
        ..ChangeFilter::default()
    };
    let mut live = k.changes(only_post.clone(), ChangeStart::Now);
    let mut full = k.changes(ChangeFilter::default(), ChangeStart::Now);
    k.update(
        vec![store::KeyUpdate::new("a", Update::inc("count", 1))],
        Durability::Acknowledged,
    )
    .await
    .unwrap();
    k.update(
        vec![store::KeyUpdate::new("a", Update::inc("count", 2))],
        Durability::Acknowledged,
    )
    .await
    .unwrap();
    k.set("a", doc(json!({"fresh": true})), Durability::Acknowledged)
        .await
        .unwrap();
    assert!(k.delete("a", Durability::Acknowledged).await.unwrap());
    let mut with_images = Vec::new();
    for _ in 0..4 {
        with_images.push(next_change(&mut full).await);
    }
    assert_eq!(
        with_images[1].before.as_ref().map(|d| d["count"].clone()),
        Some(json!(1)),
        "without the flag an update has its pre-image"
    );
    let same_but_before = |got: &Change, full: &Change| {
        assert_eq!(
            (got.op, &got.key, &got.after, &got.token),
            (full.op, &full.key, &full.after, &full.token),
            "the same change"
        );
        if got.op == ChangeOp::Delete {
            assert_eq!(got.before, full.before, "a delete keeps its pre-image");
        } else {
            assert!(got.before.is_none(), "no pre-image on a {:?}", got.op);
        }
    };
    for full in &with_images {
        same_but_before(&next_change(&mut live).await, full);
    }
    // Read back from the history: after the insert, the other three.
    let mut replay = k.changes(only_post, ChangeStart::After(with_images[0].token.clone()));
    for full in &with_images[1..] {
        same_but_before(&next_change(&mut replay).await, full);
    }
}

/// One `update` naming a key several times (a source's summary, once per event of a batch):
/// each update is a change of its own, with the images before and after it, and the document
/// ends in the last state, as read afterwards, as updated again and as the log replays it.
pub async fn one_update_of_a_key_several_times(store: &dyn Store) {
    let k = store.keyed("k_repeat").await.unwrap();
    let mut live = k.changes(ChangeFilter::default(), ChangeStart::Now);
    let ku = store::KeyUpdate::new;
    k.update(
        vec![
            ku("a", Update::inc("count", 1)),
            ku("b", Update::inc("count", 1)),
            ku("a", Update::inc("count", 2).and_set("tag", "x")),
            ku("a", Update::inc("count", 3).and_set("tag", "y")),
        ],
        Durability::Acknowledged,
    )
    .await
    .unwrap();
    let got = k.get("a").await.unwrap().expect("a exists");
    assert_eq!((&got["count"], &got["tag"]), (&json!(6), &json!("y")));
    k.update(
        vec![ku("a", Update::inc("count", 10))],
        Durability::Acknowledged,
    )
    .await
    .unwrap();
    assert_eq!(k.get("a").await.unwrap().unwrap()["count"], json!(16));

    let expected = [
        (ChangeOp::Insert, "a", None, Some(1)),
        (ChangeOp::Insert, "b", None, Some(1)),
        (ChangeOp::Update, "a", Some(1), Some(3)),
        (ChangeOp::Update, "a", Some(3), Some(6)),
        (ChangeOp::Update, "a", Some(6), Some(16)),
    ];
    let count =
        |d: &Option<std::sync::Arc<Document>>| d.as_ref().map(|d| d["count"].as_i64().unwrap());
    let mut replay = k.changes(ChangeFilter::default(), ChangeStart::Oldest);
    for (stream, name) in [(&mut live, "live"), (&mut replay, "replayed")] {
        for (i, (op, key, before, after)) in expected.iter().enumerate() {
            let c = next_change(stream).await;
            assert_eq!(
                (c.op, c.key.as_str(), count(&c.before), count(&c.after)),
                (*op, *key, *before, *after),
                "{name} change {i}"
            );
        }
    }
}

/// `append_with_updates` appends the documents and applies the updates, readers see both. An
/// engine that commits the two together ([`Capped::commits_with`]) writes neither when one
/// update is refused, and goes on afterwards; one that cannot says so, and writes in turn.
pub async fn append_with_updates_all_or_nothing(store: &dyn Store) {
    let c = capped(store, "c_together", 1000, 1 << 20).await;
    let k = store.keyed("k_together").await.unwrap();
    let mut changes = k.changes(ChangeFilter::default(), ChangeStart::Now);
    let mut tail = c.tail(Start::Now);
    let ku = store::KeyUpdate::new;
    let together = c.commits_with(k.as_ref());
    let positions = c
        .append_with_updates(
            shared(vec![
                doc(json!({"n": 1, "$kind": "a.b"})),
                doc(json!({"n": 2})),
            ]),
            k.as_ref(),
            vec![
                ku("a", Update::inc("count", 1)),
                ku("a", Update::inc("count", 1).and_set("tag", "x")),
            ],
            Durability::Journaled,
        )
        .await
        .unwrap();
    assert_eq!(positions.len(), 2);
    assert!(positions[0] < positions[1]);
    for n in [1, 2] {
        assert_eq!(next_record(&mut tail).await.doc["n"], json!(n));
    }
    let got = k.get("a").await.unwrap().expect("a was upserted");
    assert_eq!((&got["count"], &got["tag"]), (&json!(2), &json!("x")));
    for after in [1, 2] {
        let ch = next_change(&mut changes).await;
        assert_eq!(ch.key, "a");
        assert_eq!(ch.after.unwrap()["count"], json!(after));
    }
    if !together {
        eprintln!(
            "notice: the {} engine writes append_with_updates in turn, not in one commit; \
             its all-or-nothing check does not apply",
            store.engine()
        );
        return;
    }

    // `$inc` of a string is refused: the whole call is undone.
    k.set("s", doc(json!({"count": "many"})), Durability::Acknowledged)
        .await
        .unwrap();
    assert_eq!(next_change(&mut changes).await.key, "s");
    let newest = c.bounds().await.unwrap().unwrap().newest;
    let refused = c
        .append_with_updates(
            shared(vec![doc(json!({"n": 3}))]),
            k.as_ref(),
            vec![
                ku("a", Update::inc("count", 1)),
                ku("s", Update::inc("count", 1)),
            ],
            Durability::Journaled,
        )
        .await;
    assert!(
        refused.is_err(),
        "an update the engine refuses fails the call"
    );
    assert_eq!(
        c.bounds().await.unwrap().unwrap().newest,
        newest,
        "the documents were not appended"
    );
    assert_eq!(
        k.get("a").await.unwrap().unwrap()["count"],
        json!(2),
        "nor the updates applied"
    );
    assert!(
        tokio::time::timeout(QUIET, tail.next()).await.is_err(),
        "tails see nothing of it"
    );
    assert!(
        tokio::time::timeout(QUIET, changes.next()).await.is_err(),
        "change streams see nothing of it"
    );

    // And the collection goes on from where it was.
    let positions = c
        .append_with_updates(
            shared(vec![doc(json!({"n": 4}))]),
            k.as_ref(),
            vec![ku("a", Update::inc("count", 5))],
            Durability::Acknowledged,
        )
        .await
        .unwrap();
    assert!(positions[0] > newest);
    assert_eq!(next_record(&mut tail).await.doc["n"], json!(4));
    assert_eq!(
        next_change(&mut changes).await.after.unwrap()["count"],
        json!(7)
    );
}

/// Resuming from a token yields exactly the later changes: no gap, no duplicate.
pub async fn resume_from_token(store: &dyn Store) {
    let k = store.keyed("k_resume").await.unwrap();
    let mut s = k.changes(ChangeFilter::default(), ChangeStart::Now);
    for i in 0..10 {
        k.update(
            vec![store::KeyUpdate::new(
                format!("key{i}"),
                Update::inc("n", i),
            )],
            Durability::Acknowledged,
        )
        .await
        .unwrap();
    }
    let mut seen = Vec::new();
    for _ in 0..4 {
        seen.push(next_change(&mut s).await);
    }
    drop(s);
    let token = seen[3].token.clone();
    let mut resumed = k.changes(ChangeFilter::default(), ChangeStart::After(token));
    for i in 4..10 {
        let c = next_change(&mut resumed).await;
        assert_eq!(
            c.key,
            format!("key{i}"),
            "resume must continue exactly after the token"
        );
    }
    k.update(
        vec![store::KeyUpdate::new("late", Update::inc("n", 1))],
        Durability::Journaled,
    )
    .await
    .unwrap();
    assert_eq!(
        next_change(&mut resumed).await.key,
        "late",
        "then it follows live changes"
    );
    assert!(
        tokio::time::timeout(QUIET, resumed.next()).await.is_err(),
        "no duplicates after"
    );
}

pub(crate) fn filter(v: Value) -> Filter {
    Filter::parse(&v).expect("test filters are valid")
}

/// Filters by operation, key prefix and document (the post-image; a delete's pre-image).
pub async fn change_filters(store: &dyn Store) {
    let k = store.keyed("k_filter").await.unwrap();
    let f = ChangeFilter {
        collections: vec![],
        ops: vec![ChangeOp::Update],
        key_prefix: Some("source:".into()),
        filter: Some(filter(json!({"kind": "keep"}))),
        post_images_only: false,
    };
    let mut s = k.changes(f, ChangeStart::Now);
    let up = |key: &str, kind: &str| {
        store::KeyUpdate::new(key, Update::inc("n", 1).and_set("kind", kind.to_string()))
    };
    k.update(vec![up("source:a", "keep")], Durability::Acknowledged)
        .await
        .unwrap(); // insert: filtered out
    k.update(vec![up("other:a", "keep")], Durability::Acknowledged)
        .await
        .unwrap(); // prefix: out
    k.update(vec![up("other:a", "keep")], Durability::Acknowledged)
        .await
        .unwrap(); // prefix: out
    k.update(vec![up("source:a", "drop")], Durability::Acknowledged)
        .await
        .unwrap(); // field: out
    k.update(vec![up("source:a", "keep")], Durability::Acknowledged)
        .await
        .unwrap(); // in
    let c = next_change(&mut s).await;
    assert_eq!((c.op, c.key.as_str()), (ChangeOp::Update, "source:a"));
    assert_eq!(
        c.after.unwrap()["n"],
        json!(3),
        "only the third change of source:a passes"
    );
    assert!(tokio::time::timeout(QUIET, s.next()).await.is_err());

    // Deletes are judged on the document they removed.
    let deletes = ChangeFilter {
        filter: Some(filter(json!({"kind": "keep"}))),
        ..ChangeFilter::default()
    };
    let mut s = k.changes(deletes, ChangeStart::Now);
    k.set(
        "gone:keep",
        doc(json!({"kind": "keep"})),
        Durability::Acknowledged,
    )
    .await
    .unwrap();
    k.set(
        "gone:drop",
        doc(json!({"kind": "drop"})),
        Durability::Acknowledged,
    )
    .await
    .unwrap();
    k.delete("gone:drop", Durability::Acknowledged)
        .await
        .unwrap();
    k.delete("gone:keep", Durability::Acknowledged)
        .await
        .unwrap();
    let got: Vec<(ChangeOp, String)> = [next_change(&mut s).await, next_change(&mut s).await]
        .into_iter()
        .map(|c| (c.op, c.key))
        .collect();
    assert_eq!(
        got,
        vec![
            (ChangeOp::Insert, "gone:keep".to_string()),
            (ChangeOp::Delete, "gone:keep".to_string())
        ],
        "the insert and the delete of the matching document, nothing of the other"
    );
    assert!(tokio::time::timeout(QUIET, s.next()).await.is_err());
}

/// The op-log watcher sees changes of several collections in commit order.
pub async fn oplog_across_collections(store: &dyn Store) {
    let a = store.keyed("k_log_a").await.unwrap();
    let b = store.keyed("k_log_b").await.unwrap();
    let mut s = store.changes(
        ChangeFilter::collections(["k_log_a", "k_log_b"]),
        ChangeStart::Now,
    );
    a.update(
        vec![store::KeyUpdate::new("x", Update::inc("n", 1))],
        Durability::Acknowledged,
    )
    .await
    .unwrap();
    b.update(
        vec![store::KeyUpdate::new("y", Update::inc("n", 1))],
        Durability::Acknowledged,
    )
    .await
    .unwrap();
    a.update(
        vec![store::KeyUpdate::new("z", Update::inc("n", 1))],
        Durability::Acknowledged,
    )
    .await
    .unwrap();
    let got: Vec<(String, String)> = [
        next_change(&mut s).await,
        next_change(&mut s).await,
        next_change(&mut s).await,
    ]
    .into_iter()
    .map(|c| (c.collection, c.key))
    .collect();
    assert_eq!(
        got,
        vec![
            ("k_log_a".into(), "x".into()),
            ("k_log_b".into(), "y".into()),
            ("k_log_a".into(), "z".into())
        ]
    );
}

/// Every durability level stores the write; acknowledged levels return positions at once.
pub async fn durability_levels(store: &dyn Store) {
    let c = capped(store, "c_durability", 1000, 1 << 20).await;
    let k = store.keyed("k_durability").await.unwrap();
    let mut tail = c.tail(Start::Now);
    for (i, d) in Durability::ALL.into_iter().enumerate() {
        let p = c
            .append(vec![doc(json!({"n": i, "d": d.as_str()}))], d)
            .await
            .unwrap();
        k.update(
            vec![store::KeyUpdate::new(d.as_str(), Update::inc("n", 1))],
            d,
        )
        .await
        .unwrap();
        if d.waits() {
            assert_eq!(p.len(), 1, "{d} returns the position");
            let r = c.get(p[0]).await.unwrap();
            assert!(r.is_some(), "{d}: visible once acknowledged");
            assert!(
                k.get(d.as_str()).await.unwrap().is_some(),
                "{d}: keyed write visible"
            );
        } else {
            assert!(
                p.is_empty(),
                "unacknowledged returns before the commit: no positions"
            );
        }
    }
    // Even the unacknowledged write lands (the store stays up).
    for d in Durability::ALL {
        assert_eq!(next_record(&mut tail).await.doc["d"], json!(d.as_str()));
    }
}

/// Checkpoints read back as written, and the newest write wins.
pub async fn checkpoints_round_trip(store: &dyn Store) {
    assert!(store.load_checkpoint("cp_none").await.unwrap().is_none());
    store
        .save_checkpoint("cp_feed", json!({"pos": 1}), Durability::Journaled)
        .await
        .unwrap();
    store
        .save_checkpoint(
            "cp_feed",
            json!({"pos": 2, "state": {"a": [1, 2]}}),
            Durability::Journaled,
        )
        .await
        .unwrap();
    assert_eq!(
        store.load_checkpoint("cp_feed").await.unwrap(),
        Some(json!({"pos": 2, "state": {"a": [1, 2]}}))
    );
}

/// Resuming from a token older than the retained history ends with `HistoryLost`; a fresh
/// stream from the oldest still works. `history` is how many changes the engine retains.
pub async fn history_lost(store: &dyn Store, history: u64) {
    let k = store.keyed("k_history").await.unwrap();
    let mut s = k.changes(ChangeFilter::default(), ChangeStart::Now);
    k.update(
        vec![store::KeyUpdate::new("first", Update::inc("n", 1))],
        Durability::Acknowledged,
    )
    .await
    .unwrap();
    let first = next_change(&mut s).await.token;
    drop(s);
    for chunk in 0..(history / 100 + 2) {
        let ups = (0..100)
            .map(|i| store::KeyUpdate::new(format!("k{chunk}_{i}"), Update::inc("n", 1)))
            .collect();
        k.update(ups, Durability::Acknowledged).await.unwrap();
    }
    let mut resumed = k.changes(ChangeFilter::default(), ChangeStart::After(first));
    let err = tokio::time::timeout(WAIT, resumed.next())
        .await
        .expect("stream answers")
        .expect("an error, not an end")
        .expect_err("the token is older than the history");
    assert!(err.is_history_lost(), "expected HistoryLost, got {err}");
    let mut oldest = k.changes(ChangeFilter::default(), ChangeStart::Oldest);
    next_change(&mut oldest).await;
}

/// The stream's resume token advances past entries its filter skips, so a feed of rare
/// changes still checkpoints a fresh token; resuming from it yields only later changes.
pub async fn resume_token_advances_past_filtered(store: &dyn Store) {
    let k = store.keyed("k_token").await.unwrap();
    let filter = ChangeFilter {
        key_prefix: Some("yes:".into()),
        ..ChangeFilter::default()
    };
    let mut s = k.changes(filter.clone(), ChangeStart::Now);
    k.update(
        vec![store::KeyUpdate::new("yes:1", Update::inc("n", 1))],
        Durability::Acknowledged,
    )
    .await
    .unwrap();
    let first = next_change(&mut s).await;
    assert_eq!(first.key, "yes:1");
    let skipped: Vec<store::KeyUpdate> = (0..5)
        .map(|i| store::KeyUpdate::new(format!("no:{i}"), Update::inc("n", 1)))
        .collect();
    k.update(skipped, Durability::Acknowledged).await.unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Ok(Some(item)) = tokio::time::timeout(Duration::from_millis(50), s.next()).await {
            panic!("filtered-out changes must not be yielded: {item:?}");
        }
        if s.resume_token().is_some_and(|t| t != first.token) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "resume token never moved past skipped entries"
        );
    }
    let token = s.resume_token().unwrap();
    drop(s);
    k.update(
        vec![store::KeyUpdate::new("yes:2", Update::inc("n", 1))],
        Durability::Acknowledged,
    )
    .await
    .unwrap();
    let mut resumed = k.changes(filter, ChangeStart::After(token));
    assert_eq!(
        next_change(&mut resumed).await.key,
        "yes:2",
        "nothing before, nothing skipped"
    );
}

/// `expire` removes the keys of a prefix not written since a time, oldest first, up to a
/// limit, each published as a delete; keys written since, and other prefixes, stay; documents
/// read back do not show the engine's write time.
pub async fn expire_removes_idle_keys(store: &dyn Store) {
    let k = store.keyed("k_expire").await.unwrap();
    let d = Durability::Acknowledged;
    for key in ["tag:old1", "tag:old2", "tag:old3", "lang:old"] {
        k.update(vec![store::KeyUpdate::new(key, Update::inc("count", 1))], d)
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    let cutoff = store::clock::now_us();
    tokio::time::sleep(Duration::from_millis(20)).await;
    // Written again after the cutoff: not idle.
    k.update(
        vec![store::KeyUpdate::new("tag:old2", Update::inc("count", 1))],
        d,
    )
    .await
    .unwrap();
    k.set("tag:fresh", doc(json!({"count": 9})), d)
        .await
        .unwrap();
    let mut changes = k.changes(ChangeFilter::default(), ChangeStart::Now);
    assert_eq!(
        k.expire("tag:", cutoff, 1, d).await.unwrap(),
        1,
        "the limit holds"
    );
    assert_eq!(
        k.expire("tag:", cutoff, 100, d).await.unwrap(),
        1,
        "the other idle tag"
    );
    assert_eq!(
        k.expire("tag:", cutoff, 100, d).await.unwrap(),
        0,
        "none left"
    );
    let mut deleted = Vec::new();
    for _ in 0..2 {
        let c = next_change(&mut changes).await;
        assert_eq!(c.op, ChangeOp::Delete, "{c:?}");
        assert_eq!(c.after, None);
        deleted.push(c.key);
    }
    deleted.sort();
    assert_eq!(
        deleted,
        ["tag:old1", "tag:old3"],
        "the idle keys of the prefix"
    );
    let left: Vec<String> = k
        .scan("")
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.key)
        .collect();
    assert_eq!(left, ["lang:old", "tag:fresh", "tag:old2"]);
    let fresh = k.get("tag:fresh").await.unwrap().unwrap();
    assert_eq!(
        Value::Object(fresh),
        json!({"_id": "tag:fresh", "count": 9}),
        "no engine field in the document"
    );
    let paged = k.scan_page("tag:fresh", None, 10).await.unwrap();
    assert_eq!(
        Value::Object(paged[0].doc.clone()),
        json!({"_id": "tag:fresh", "count": 9}),
        "no engine field in a page"
    );
    let mut snapshot = k.snapshot(None).await.unwrap();
    while let Some(entry) = snapshot.docs.next().await {
        let entry = entry.unwrap();
        assert!(
            entry.doc.keys().all(|f| f == "_id" || f == "count"),
            "no engine field in a snapshot: {:?}",
            entry.doc
        );
    }
}

/// `newest_matching` walks back from the newest: the `limit` newest matches, newest first,
/// across chunk boundaries, and the newest position of the collection (matching or not).
pub async fn newest_matching_walks_back(store: &dyn Store) {
    let c = capped(store, "c_newest", 10_000, 16 << 20).await;
    let empty = c.newest_matching(&Filter::match_all(), 5).await.unwrap();
    assert!(
        empty.records.is_empty() && empty.as_of.is_none(),
        "an empty collection: nothing, and no position; saw {empty:?}"
    );
    assert_eq!(empty.continue_from(), Start::Oldest);
    let p = append_n(&*c, 0, 1000, Durability::Acknowledged).await;
    // Every 97th: matches lie hundreds of rows apart, beyond any one chunk.
    let rare = filter(json!({"n": {"$in": [0, 97, 194, 291, 388, 485, 582, 679, 776, 873, 970]}}));
    let got = c.newest_matching(&rare, 4).await.unwrap();
    let ns: Vec<Value> = got.records.iter().map(|r| r.doc["n"].clone()).collect();
    assert_eq!(
        ns,
        vec![json!(970), json!(873), json!(776), json!(679)],
        "the 4 newest matches, newest first"
    );
    assert_eq!(got.as_of, Some(p[999]), "as of the newest position");
    assert_eq!(got.continue_from(), Start::After(p[999]));
    let all = c.newest_matching(&rare, 100).await.unwrap();
    assert_eq!(
        all.records.len(),
        11,
        "every match when the limit is larger"
    );
    assert_eq!(all.records.last().unwrap().position, p[0]);
    let none = c.newest_matching(&rare, 0).await.unwrap();
    assert!(
        none.records.is_empty(),
        "limit 0 is nothing, not everything"
    );
    assert_eq!(none.as_of, Some(p[999]));
    let no_match = c
        .newest_matching(&filter(json!({"n": "not a number"})), 5)
        .await
        .unwrap();
    assert!(no_match.records.is_empty());
}

/// A filtered tail yields the matching documents in order, waits like a tail, and ends with
/// `PositionLost` when eviction overtook it, whether the evicted documents matched or not.
pub async fn filtered_tail_keeps_order_and_detects_eviction(store: &dyn Store) {
    let c = capped(store, "c_tail_filter", 20, 1 << 20).await;
    let p = append_n(&*c, 0, 10, Durability::Acknowledged).await;
    let even = filter(json!({"n": {"$in": [0, 2, 4, 6, 8, 10, 12, 14, 16, 18]}}));
    let mut tail = c.tail_matching(Start::Oldest, even.clone());
    for want in [0, 2, 4, 6, 8] {
        assert_eq!(next_record(&mut tail).await.doc["n"], json!(want));
    }
    assert!(
        tokio::time::timeout(QUIET, tail.next()).await.is_err(),
        "a caught-up filtered tail waits"
    );
    append_n(&*c, 10, 3, Durability::Acknowledged).await; // 10, 11, 12
    assert_eq!(next_record(&mut tail).await.doc["n"], json!(10));
    assert_eq!(next_record(&mut tail).await.doc["n"], json!(12));
    drop(tail);
    // From after position 1 (n = 1), with max_docs 20: 30 more evict n = 2 and beyond.
    append_n(&*c, 13, 30, Durability::Acknowledged).await;
    let mut late = c.tail_matching(Start::After(p[1]), even);
    let err = tokio::time::timeout(WAIT, late.next())
        .await
        .expect("the filtered tail answers")
        .expect("an error, not an end")
        .expect_err("reading after an evicted position must fail");
    assert!(err.is_position_lost(), "expected PositionLost, got {err}");
}

/// The newest N matching, then a tail from where they were read: every matching document
/// appended by a concurrent writer arrives exactly once (RethinkDB's `include_initial`).
pub async fn capped_initial_then_tail_exactly_once(store: &dyn Store) {
    let c = capped(store, "c_initial", 100_000, 64 << 20).await;
    const TOTAL: u64 = 600;
    let writer = {
        let c = c.clone();
        tokio::spawn(async move {
            for batch in 0..TOTAL / 3 {
                let docs = (batch * 3..batch * 3 + 3)
                    .map(|i| doc(json!({"n": i, "odd": !i.is_multiple_of(2)})))
                    .collect();
                c.append(docs, Durability::Acknowledged).await.unwrap();
                if batch.is_multiple_of(10) {
                    tokio::task::yield_now().await;
                }
            }
        })
    };
    // Start once the writer is under way, so the read falls between its appends.
    while c.bounds().await.unwrap().is_none_or(|b| b.newest.0 < 60) {
        tokio::task::yield_now().await;
    }
    let odd = filter(json!({"odd": true}));
    let initial = c.newest_matching(&odd, 100_000).await.unwrap();
    let mut seen: Vec<u64> = initial
        .records
        .iter()
        .rev()
        .map(|r| r.doc["n"].as_u64().unwrap())
        .collect();
    let from_initial = seen.len();
    let mut tail = c.tail_matching(initial.continue_from(), odd);
    while seen.last().is_none_or(|n| *n < TOTAL - 1) {
        seen.push(next_record(&mut tail).await.doc["n"].as_u64().unwrap());
    }
    tokio::time::timeout(WAIT, writer).await.unwrap().unwrap();
    let want: Vec<u64> = (0..TOTAL).filter(|n| !n.is_multiple_of(2)).collect();
    assert_eq!(
        seen, want,
        "every odd document exactly once, in order ({from_initial} from the initial read)"
    );
    // How the writes split between the read and the tail depends on scheduling; the order
    // above holds for every split.
    assert!(
        from_initial > 0,
        "the read came after the first writes: {from_initial} of {} initial",
        want.len()
    );
}

/// A snapshot and the changes after its token, while a writer updates the keys: every key's
/// counter continues exactly from its snapshot value (no change missed, none applied twice),
/// and the reader ends with the collection's final state.
pub async fn keyed_snapshot_then_changes_exactly_once(store: &dyn Store) {
    let k = store.keyed("k_snapshot").await.unwrap();
    const KEYS: usize = 20;
    const ROUNDS: usize = 30;
    // Group "a" is watched, "b" is not: the filter applies to both halves.
    let key = |i: usize| format!("key:{:02}", i);
    let group = |i: usize| if i.is_multiple_of(2) { "a" } else { "b" };
    for i in 0..KEYS {
        k.update(
            vec![KeyUpdate::new(
                key(i),
                Update::inc("n", 1).and_set("group", group(i)),
            )],
            Durability::Acknowledged,
        )
        .await
        .unwrap();
    }
    // The writer's rounds: a third before the snapshot, a half while it is taken (however the
    // two interleave), and the rest after it returned, so changes after it surely exist.
    let (go_during, during) = tokio::sync::oneshot::channel::<()>();
    let (go_after, after) = tokio::sync::oneshot::channel::<()>();
    let writer = {
        let k = k.clone();
        tokio::spawn(async move {
            let (mut during, mut after) = (Some(during), Some(after));
            for round in 0..ROUNDS {
                if round == ROUNDS / 3
                    && let Some(rx) = during.take()
                {
                    let _ = rx.await;
                }
                if round == ROUNDS * 5 / 6
                    && let Some(rx) = after.take()
                {
                    let _ = rx.await;
                }
                let ups = (0..KEYS)
                    .filter(|i| !(i + round).is_multiple_of(3))
                    .map(|i| KeyUpdate::new(key(i), Update::inc("n", 1)))
                    .collect();
                k.update(ups, Durability::Acknowledged).await.unwrap();
            }
        })
    };
    let watched = filter(json!({"group": "a"}));
    let _ = go_during.send(());
    let snapshot = k.snapshot(Some(watched.clone())).await.unwrap();
    let _ = go_after.send(());
    let token = snapshot.token.clone();
    let docs: Vec<store::KeyedDoc> = tokio::time::timeout(WAIT, snapshot.docs.collect::<Vec<_>>())
        .await
        .expect("the snapshot is read within the timeout")
        .into_iter()
        .collect::<Result<_, _>>()
        .unwrap();
    let mut state: std::collections::BTreeMap<String, i64> = docs
        .iter()
        .map(|d| (d.key.clone(), d.doc["n"].as_i64().unwrap()))
        .collect();
    assert_eq!(
        state.keys().cloned().collect::<Vec<_>>(),
        (0..KEYS)
            .filter(|i| i.is_multiple_of(2))
            .map(key)
            .collect::<Vec<_>>(),
        "the snapshot holds exactly the matching keys, by key"
    );
    tokio::time::timeout(WAIT, writer).await.unwrap().unwrap();
    let finals: std::collections::BTreeMap<String, i64> = k
        .scan("key:")
        .await
        .unwrap()
        .into_iter()
        .filter(|d| d.doc["group"] == json!("a"))
        .map(|d| (d.key, d.doc["n"].as_i64().unwrap()))
        .collect();
    let f = ChangeFilter {
        filter: Some(watched),
        ..ChangeFilter::default()
    };
    let mut changes = k.changes(f, ChangeStart::After(token));
    let mut applied = 0;
    while state != finals {
        let c = next_change(&mut changes).await;
        let n = c.after.as_ref().unwrap()["n"].as_i64().unwrap();
        let had = state.get(&c.key).copied().unwrap_or(0);
        assert_eq!(
            n,
            had + 1,
            "{}: the change after the snapshot's value {had} must be {}, got {n} (a duplicate \
             or a gap between snapshot and changes)",
            c.key,
            had + 1
        );
        state.insert(c.key, n);
        applied += 1;
    }
    assert!(
        tokio::time::timeout(QUIET, changes.next()).await.is_err(),
        "nothing after the final state"
    );
    assert!(applied > 0, "the writer ran after the snapshot");
}

/// `scan_page` pages through a prefix by key, continuing after the last key of a page.
pub async fn scan_pages_by_key(store: &dyn Store) {
    let k = store.keyed("k_pages").await.unwrap();
    let mut keys: Vec<String> = (0..7).map(|i| format!("tags:{i}")).collect();
    keys.push("tags:東京".into());
    keys.push("tags:🦀".into());
    let ups = keys
        .iter()
        .chain(["other:1".to_string(), "tag".to_string()].iter())
        .map(|k| KeyUpdate::new(k.clone(), Update::inc("n", 1)))
        .collect();
    k.update(ups, Durability::Acknowledged).await.unwrap();
    let mut got = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..10 {
        let page = k.scan_page("tags:", after.as_deref(), 3).await.unwrap();
        assert!(page.len() <= 3, "a page holds at most the limit");
        let Some(last) = page.last() else { break };
        after = Some(last.key.clone());
        got.extend(page.into_iter().map(|d| d.key));
    }
    assert_eq!(got, keys, "every key of the prefix once, in byte order");
    assert!(
        k.scan_page("tags:", Some("tags:🦀"), 3)
            .await
            .unwrap()
            .is_empty(),
        "nothing after the last key"
    );
    let from_start = k.scan_page("tags:", Some("a"), 2).await.unwrap();
    assert_eq!(
        from_start
            .iter()
            .map(|d| d.key.as_str())
            .collect::<Vec<_>>(),
        vec!["tags:0", "tags:1"],
        "a cursor before the prefix starts at the prefix"
    );
    assert!(
        k.scan_page("", None, 0).await.unwrap().is_empty(),
        "limit 0"
    );
}

/// A key longer than [`store::MAX_KEY_BYTES`] is refused with an error that says so, by every
/// write, alone: the other updates of its batch, and the store, go on (a key built from event
/// data must never reach an engine's structure that asserts on it).
pub async fn keys_past_the_bound_are_refused(store: &dyn Store) {
    let k = store.keyed("k_long").await.unwrap();
    let long = format!("hashtags:{}", "i̇".repeat(22_000));
    let at_bound = "k".repeat(store::MAX_KEY_BYTES);
    let refused = |e: StoreError| {
        assert!(
            e.to_string().contains("keys hold at most"),
            "the error names the bound: {e}"
        );
    };
    refused(
        k.update(
            vec![
                KeyUpdate::new("short", Update::inc("n", 1)),
                KeyUpdate::new(long.clone(), Update::inc("n", 1)),
            ],
            Durability::Acknowledged,
        )
        .await
        .expect_err("a batch with a key past the bound"),
    );
    refused(
        k.set(&long, doc(json!({"a": 1})), Durability::Acknowledged)
            .await
            .expect_err("set"),
    );
    refused(
        k.delete(&long, Durability::Acknowledged)
            .await
            .expect_err("delete"),
    );
    refused(
        store
            .save_checkpoint(&long, json!({"p": 1}), Durability::Acknowledged)
            .await
            .expect_err("a checkpoint's name"),
    );
    // Nothing of the refused batch was written; a key at the bound is a key like any other.
    assert!(k.get("short").await.unwrap().is_none(), "all or nothing");
    k.update(
        vec![KeyUpdate::new(at_bound.clone(), Update::inc("n", 1))],
        Durability::Acknowledged,
    )
    .await
    .unwrap();
    assert_eq!(k.get(&at_bound).await.unwrap().unwrap()["n"], json!(1));
    assert!(k.get(&long).await.unwrap().is_none());
}
