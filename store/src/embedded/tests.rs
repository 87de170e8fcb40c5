//! The writer's two ways in: a caller that finds it idle commits in its own thread; otherwise
//! its job is queued and grouped with the others. What only the engine's insides can show.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use futures::StreamExt;
use serde_json::json;

use super::{EmbeddedOptions, EmbeddedStore};
use crate::{
    Capped, CappedSpec, Document, Durability, KeyUpdate, Start, Store, StoreError, Update,
};

fn open(dir: &tempfile::TempDir) -> EmbeddedStore {
    EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).unwrap()
}

fn spec() -> CappedSpec {
    CappedSpec {
        max_docs: 1_000_000,
        max_bytes: 1 << 30,
        indexes: vec![],
    }
}

fn doc(v: serde_json::Value) -> Document {
    match v {
        serde_json::Value::Object(d) => d,
        _ => unreachable!(),
    }
}

/// Waits until `n` jobs are queued (the writer held by the test meanwhile).
async fn until_queued(store: &EmbeddedStore, n: usize) {
    for _ in 0..2000 {
        if store.inner.cell.pending() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("{n} jobs never got queued");
}

/// The documents of `coll` in position order.
async fn stored(coll: &dyn Capped, n: usize) -> Vec<Document> {
    coll.tail(Start::Oldest)
        .take(n)
        .map(|r| r.unwrap().doc)
        .collect()
        .await
}

// The test holds the writer's lock across awaits on purpose: that is the busy writer.
#[allow(clippy::await_holding_lock)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_writer_commits_in_the_callers_thread_and_a_busy_one_groups_the_queue() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let coll = store.capped("c", &spec()).await.unwrap();
    let before = store.inner.cell.inline_commits();
    // Few enough pages that the WAL is not full (the writer thread is then woken to copy it,
    // and writes made meanwhile are queued).
    for i in 0..10 {
        coll.append(vec![doc(json!({"i": i}))], Durability::Acknowledged)
            .await
            .unwrap();
    }
    assert_eq!(
        store.inner.cell.inline_commits() - before,
        10,
        "one caller writing one at a time does not need the writer thread"
    );

    // While a commit holds the writer, concurrent writes are queued, and then committed by
    // the writer thread, not in their callers' threads.
    let held = store.inner.cell.hold();
    let before = store.inner.cell.inline_commits();
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let coll = coll.clone();
            tokio::spawn(async move {
                coll.append(vec![doc(json!({"t": t}))], Durability::Journaled)
                    .await
            })
        })
        .collect();
    until_queued(&store, 8).await;
    drop(held);
    for t in tasks {
        assert_eq!(t.await.unwrap().unwrap().len(), 1);
    }
    assert_eq!(store.inner.cell.inline_commits(), before);
    assert_eq!(store.inner.cell.pending(), 0);
    assert_eq!(coll.usage().await.unwrap().docs, 18);
    store.close().await.unwrap();
}

/// A large job goes to the writer thread even when it is idle (it would hold an async thread
/// for the whole commit); small ones around it still commit inline, in call order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_job_is_committed_by_the_writer_thread() {
    use super::writer::INLINE_MAX_ITEMS;
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let coll = store.capped("c", &spec()).await.unwrap();
    let docs = |from: usize, n: usize| (from..from + n).map(|i| doc(json!({"i": i}))).collect();
    let before = store.inner.cell.inline_commits();
    coll.append(docs(0, INLINE_MAX_ITEMS), Durability::Acknowledged)
        .await
        .unwrap();
    assert_eq!(
        store.inner.cell.inline_commits() - before,
        1,
        "a job of the limit's size is small"
    );
    let before = store.inner.cell.inline_commits();
    let big = INLINE_MAX_ITEMS + 1;
    coll.append(docs(INLINE_MAX_ITEMS, big), Durability::Acknowledged)
        .await
        .unwrap();
    assert_eq!(
        store.inner.cell.inline_commits(),
        before,
        "the large job was queued"
    );
    // Unacknowledged, so the small write after it is made while it may still be queued.
    let from = INLINE_MAX_ITEMS + big;
    coll.append(docs(from, big), Durability::Unacknowledged)
        .await
        .unwrap();
    coll.append(docs(from + big, 1), Durability::Acknowledged)
        .await
        .unwrap();
    let n = from + big + 1;
    let order: Vec<u64> = stored(&*coll, n)
        .await
        .iter()
        .map(|d| d["i"].as_u64().unwrap())
        .collect();
    assert_eq!(order, (0..n as u64).collect::<Vec<_>>());
    let before = store.inner.cell.inline_commits();
    coll.append(docs(n, 1), Durability::Acknowledged)
        .await
        .unwrap();
    assert_eq!(
        store.inner.cell.inline_commits() - before,
        1,
        "the writer is idle again"
    );
    store.close().await.unwrap();
}

/// An unacknowledged write returns before its commit; an acknowledged one right after it
/// must not commit first in its own thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_never_overtakes_its_own_queued_writes() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let coll = store.capped("c", &spec()).await.unwrap();
    let n = 3000;
    for i in 0..n {
        let d = match i % 4 {
            0 | 1 => Durability::Unacknowledged,
            2 => Durability::Acknowledged,
            _ => Durability::Journaled,
        };
        coll.append(vec![doc(json!({"i": i}))], d).await.unwrap();
    }
    let order: Vec<i64> = stored(&*coll, n)
        .await
        .iter()
        .map(|d| d["i"].as_i64().unwrap())
        .collect();
    let expected: Vec<i64> = (0..n as i64).collect();
    assert!(
        order == expected,
        "commit order differs from call order from index {:?}",
        order.iter().zip(&expected).position(|(a, b)| a != b)
    );
    store.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_each_keep_their_order_and_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let coll = store.capped("c", &spec()).await.unwrap();
    let (tasks, per_task) = (8, 300);
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let coll = coll.clone();
            tokio::spawn(async move {
                for i in 0..per_task {
                    let d = if i % 5 == 0 {
                        Durability::Unacknowledged
                    } else {
                        Durability::Acknowledged
                    };
                    coll.append(vec![doc(json!({"t": t, "i": i}))], d)
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.await.unwrap();
    }
    let docs = stored(&*coll, tasks * per_task).await;
    let mut next = vec![0i64; tasks];
    for d in &docs {
        let t = d["t"].as_u64().unwrap() as usize;
        assert_eq!(d["i"].as_i64().unwrap(), next[t], "task {t} out of order");
        next[t] += 1;
    }
    assert!(next.iter().all(|&n| n == per_task as i64));
    assert_eq!(store.inner.cell.pending(), 0);
    store.close().await.unwrap();
}

/// A job of a group that fails is undone alone; the others in its transaction commit.
#[allow(clippy::await_holding_lock)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_job_does_not_fail_its_group() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let k = store.keyed("k").await.unwrap();
    k.update(
        vec![KeyUpdate::new("a", Update::default().and_set("s", "text"))],
        Durability::Journaled,
    )
    .await
    .unwrap();
    // Held, so both jobs are queued and the writer thread commits them as one group.
    let held = store.inner.cell.hold();
    let bad = tokio::spawn({
        let k = k.clone();
        async move {
            k.update(
                vec![KeyUpdate::new("a", Update::inc("s", 1))],
                Durability::Journaled,
            )
            .await
        }
    });
    until_queued(&store, 1).await;
    let good = tokio::spawn({
        let k = k.clone();
        async move {
            k.update(
                vec![KeyUpdate::new("b", Update::inc("n", 1))],
                Durability::Journaled,
            )
            .await
        }
    });
    until_queued(&store, 2).await;
    let inline = store.inner.cell.inline_commits();
    drop(held);
    assert!(bad.await.unwrap().is_err(), "$inc of a string fails");
    good.await.unwrap().unwrap();
    assert_eq!(store.inner.cell.inline_commits(), inline);
    assert_eq!(k.get("b").await.unwrap().unwrap()["n"], json!(1));
    assert_eq!(
        k.get("a").await.unwrap().unwrap()["s"],
        json!("text"),
        "the failed job left no trace"
    );
    store.close().await.unwrap();
}

#[tokio::test]
async fn writes_after_close_fail_as_closed_on_either_way_in() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let coll = store.capped("c", &spec()).await.unwrap();
    coll.append(vec![doc(json!({"i": 0}))], Durability::Acknowledged)
        .await
        .unwrap();
    store.close().await.unwrap();
    for d in [Durability::Unacknowledged, Durability::Acknowledged] {
        let err = coll
            .append(vec![doc(json!({"i": 1}))], d)
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Closed), "{d}: {err}");
    }
}

/// Inline commits leave the WAL's copy into the database to the copy thread (and the writer
/// thread, which copies what was committed during a copy); the WAL stays bounded all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wal_is_copied_by_the_copy_thread_while_callers_commit_inline() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let coll = store.capped("c", &spec()).await.unwrap();
    let db = store.db_path().to_path_buf();
    let wal = db.with_extension("db-wal");
    let db_before = std::fs::metadata(&db).unwrap().len();
    let page = super::writer::WAL_CHECKPOINT_PAGES as u64 * 4096;
    let (n, body) = (400u64, "x".repeat(2000));
    let before = store.inner.cell.inline_commits();
    let mut wal_max = 0;
    for i in 0..n {
        coll.append(
            vec![doc(json!({"i": i, "body": body}))],
            Durability::Acknowledged,
        )
        .await
        .unwrap();
        wal_max = wal_max.max(std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0));
    }
    // Without a copy the WAL holds every page written: 5.0 MB here. With the copy thread it
    // grows while a copy is under way, and the writer then adds the rest: 420-680 KB in twelve
    // runs at once.
    assert!(
        wal_max < n * 3000,
        "WAL reached {wal_max} bytes; the limit is {page}"
    );
    let db_after = std::fs::metadata(&db).unwrap().len();
    assert!(
        db_after > db_before + n * 2000 / 4,
        "the database file grew from {db_before} to {db_after} bytes only: nothing was copied"
    );
    assert!(
        store.inner.cell.background_copies() > 0,
        "the copy thread copied nothing"
    );
    let inline = store.inner.cell.inline_commits() - before;
    assert!(
        inline >= n / 2,
        "{inline} of {n} appends were committed inline: only those made while the writer thread was busy are queued"
    );
    store.close().await.unwrap();
}

/// Documents and updates commit together only within one store: a keyed collection of another
/// store (another file, another writer) is written in turn, and both writes still land.
#[tokio::test]
async fn append_with_updates_commits_together_only_within_one_store() {
    let (dir, other_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (store, other) = (open(&dir), open(&other_dir));
    let events = store.capped("events", &spec()).await.unwrap();
    let mine = store.keyed("rollups").await.unwrap();
    let theirs = other.keyed("rollups").await.unwrap();
    assert!(events.commits_with(mine.as_ref()));
    assert!(!events.commits_with(theirs.as_ref()));

    let inc = || vec![KeyUpdate::new("k", Update::inc("n", 1))];
    for keyed in [&mine, &theirs] {
        events
            .append_with_updates(
                vec![doc(json!({"x": 1}))],
                keyed.as_ref(),
                inc(),
                Durability::Journaled,
            )
            .await
            .unwrap();
    }
    assert_eq!(stored(events.as_ref(), 2).await.len(), 2);
    for keyed in [&mine, &theirs] {
        assert_eq!(keyed.get("k").await.unwrap().unwrap()["n"], json!(1));
    }
}

/// The write connection's page cache grows while the writer commits large groups and, once
/// they have stopped for a while, is emptied and goes back to SQLite's default size, at the
/// next commit or, when none comes, by itself; small groups alone never grow it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_cache_grows_for_large_groups_and_is_emptied_after_them() {
    use super::writer::{BUSY_CACHE_KIB, BUSY_CACHE_LINGER, IDLE_CACHE_KIB};
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let coll = store.capped("c", &spec()).await.unwrap();
    // 4 KB each: a group of 300 fills about 300 pages.
    let docs = |n: usize| {
        (0..n)
            .map(|i| doc(json!({"i": i, "text": format!("{i:04}-東京-🦀-").repeat(250)})))
            .collect::<Vec<_>>()
    };
    let cache = || store.inner.cell.cache_size();
    for _ in 0..20 {
        coll.append(docs(100), Durability::Acknowledged)
            .await
            .unwrap();
    }
    assert_eq!(cache(), -IDLE_CACHE_KIB, "groups of 100 are small");
    let idle_bytes = IDLE_CACHE_KIB * 1024;
    let small_used = store.inner.cell.cache_used();
    assert!(
        small_used <= idle_bytes * 11 / 10,
        "8 MB written in groups of 100, and the cache holds {small_used} bytes"
    );

    coll.append(docs(300), Durability::Acknowledged)
        .await
        .unwrap();
    assert_eq!(cache(), -BUSY_CACHE_KIB, "a group of 300 is large");
    coll.append(docs(1), Durability::Acknowledged)
        .await
        .unwrap();
    assert_eq!(cache(), -BUSY_CACHE_KIB, "kept for a while after it");

    // Each large group extends the while.
    tokio::time::sleep(BUSY_CACHE_LINGER / 2).await;
    coll.append(docs(300), Durability::Acknowledged)
        .await
        .unwrap();
    tokio::time::sleep(BUSY_CACHE_LINGER / 2 + BUSY_CACHE_LINGER / 4).await;
    coll.append(docs(1), Durability::Acknowledged)
        .await
        .unwrap();
    assert_eq!(
        cache(),
        -BUSY_CACHE_KIB,
        "the second large group extended the while"
    );
    let busy_used = store.inner.cell.cache_used();
    assert!(
        busy_used > idle_bytes,
        "two groups of 300 pages and more: {busy_used} bytes cached"
    );

    tokio::time::sleep(BUSY_CACHE_LINGER).await;
    coll.append(docs(1), Durability::Acknowledged)
        .await
        .unwrap();
    assert_eq!(
        cache(),
        -IDLE_CACHE_KIB,
        "cut back at the first commit after the while"
    );
    let after = store.inner.cell.cache_used();
    assert!(
        after < idle_bytes / 4,
        "emptied, then one commit's pages: {after} bytes cached (was {busy_used})"
    );
    assert_eq!(
        coll.usage().await.unwrap().docs,
        2_000 + 300 + 1 + 300 + 1 + 1
    );

    // A burst and then nothing at all: no commit comes to cut the cache, and it is cut.
    coll.append(docs(300), Durability::Acknowledged)
        .await
        .unwrap();
    assert_eq!(cache(), -BUSY_CACHE_KIB);
    tokio::time::sleep(BUSY_CACHE_LINGER * 3).await;
    assert_eq!(
        cache(),
        -IDLE_CACHE_KIB,
        "cut with no write after the burst"
    );
    let idle = store.inner.cell.cache_used();
    assert!(idle < idle_bytes / 4, "and emptied: {idle} bytes cached");
    store.close().await.unwrap();
}

/// A change stream reading history decodes the images of the entries its filter admits
/// (collection, operation, key) and only those: entries of other keys are read past by their
/// key alone, its resume token still moves past them, and the admitted ones arrive whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_is_read_past_entries_the_filter_does_not_admit_without_decoding_them() {
    use crate::{ChangeFilter, ChangeStart};
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let rollups = store.keyed("rollups").await.unwrap();
    let mut updates = Vec::new();
    for i in 0..6_i64 {
        updates.push(KeyUpdate::new(
            format!("hashtags:t{i}"),
            Update::inc("count", 1),
        ));
        updates.push(KeyUpdate::new(
            "source:s",
            Update::inc("count", 1).and_set("i", json!(i)),
        ));
    }
    rollups
        .update(updates, Durability::Acknowledged)
        .await
        .unwrap();
    // What no engine writes: images that are not JSON, on every entry of the other keys. A
    // reader that decoded them would fail.
    let conn = rusqlite::Connection::open(store.db_path()).unwrap();
    let spoiled = conn
        .execute(
            "UPDATE oplog SET before = 'not json', after = 'not json' WHERE key LIKE 'hashtags:%'",
            [],
        )
        .unwrap();
    assert_eq!(spoiled, 6, "one op-log entry per hashtag key");
    drop(conn);

    let filter = ChangeFilter {
        key_prefix: Some("source:".into()),
        ..ChangeFilter::collections(["rollups"])
    };
    let mut stream = store.changes(filter, ChangeStart::Oldest);
    let mut seen = Vec::new();
    for _ in 0..6 {
        let change = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("a change within 10 s")
            .expect("the stream goes on")
            .expect("no entry of another key is decoded");
        assert_eq!(change.key, "source:s");
        seen.push(change.after.unwrap()["i"].clone());
    }
    assert_eq!(seen, (0..6).map(|i| json!(i)).collect::<Vec<_>>());
    // The last entry (seq 12) is the sixth summary; the token is past it.
    assert_eq!(stream.resume_token().map(|t| t.0), Some("12".to_string()));

    // Every entry is admitted without the prefix: the spoiled images are then decoded and
    // refused, which is what the filter spared the first reader.
    let mut all = store.changes(ChangeFilter::collections(["rollups"]), ChangeStart::Oldest);
    let first = tokio::time::timeout(Duration::from_secs(10), all.next())
        .await
        .expect("an answer within 10 s")
        .expect("the stream yields");
    assert!(
        first.is_err(),
        "a spoiled image is decoded and refused: {first:?}"
    );
    store.close().await.unwrap();
}
