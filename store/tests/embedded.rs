//! The store contract suite against the embedded engine, plus what only it can show.

#![allow(clippy::unwrap_used)]

#[macro_use]
mod contract;

use serde_json::json;
use store::embedded::{EmbeddedOptions, EmbeddedStore};
use store::{CappedSpec, Durability, Store};

/// Small op log so `history_lost` runs quickly.
const HISTORY: u64 = 1000;

fn open(dir: &tempfile::TempDir) -> EmbeddedStore {
    EmbeddedStore::open(
        dir.path(),
        EmbeddedOptions {
            oplog_max_entries: HISTORY,
            queue_capacity: 64,
        },
    )
    .expect("open embedded store")
}

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

#[tokio::test]
async fn latest_uses_the_index_column() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let spec = CappedSpec {
        max_docs: 100,
        max_bytes: 1 << 20,
        indexes: vec!["user.id".into()],
    };
    store.capped("events", &spec).await.unwrap();
    let plan = store.explain_latest("events", "user.id").await.unwrap();
    assert!(
        plan.contains("USING INDEX capped_events_ix_user_did"),
        "plan should use the index: {plan}"
    );
    assert!(
        !plan.contains("TEMP B-TREE"),
        "newest-first must come from the index, not a sort: {plan}"
    );
}

#[tokio::test]
async fn data_survives_reopen_and_positions_continue() {
    let dir = tempfile::tempdir().unwrap();
    let spec = CappedSpec {
        max_docs: 100,
        max_bytes: 1 << 20,
        indexes: vec![],
    };
    let first = {
        let store = open(&dir);
        let c = store.capped("events", &spec).await.unwrap();
        let p = c
            .append(vec![contract::doc(json!({"a": 1}))], Durability::Journaled)
            .await
            .unwrap();
        store.close().await.unwrap();
        p[0]
    };
    let store = open(&dir);
    let c = store.capped("events", &spec).await.unwrap();
    assert_eq!(c.get(first).await.unwrap().unwrap().doc["a"], json!(1));
    let p = c
        .append(vec![contract::doc(json!({"a": 2}))], Durability::Journaled)
        .await
        .unwrap();
    assert!(
        p[0] > first,
        "positions continue after a reopen: {} then {}",
        first,
        p[0]
    );
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
    let set = store::Update::default().and_set("s", "text");
    k.update(
        vec![
            store::KeyUpdate::new("a", store::Update::inc("n", 1)),
            store::KeyUpdate::new("b", set),
        ],
        Durability::Journaled,
    )
    .await
    .unwrap();
    let bad = k
        .update(
            vec![
                store::KeyUpdate::new("a", store::Update::inc("n", 10)),
                store::KeyUpdate::new("b", store::Update::inc("s", 1)),
            ],
            Durability::Journaled,
        )
        .await;
    assert!(bad.is_err(), "$inc of a string fails the whole job");
    k.update(
        vec![store::KeyUpdate::new("a", store::Update::inc("n", 1))],
        Durability::Journaled,
    )
    .await
    .unwrap();
    assert_eq!(k.get("a").await.unwrap().unwrap()["n"], json!(2));
}

/// A database written before `kv` had its write-time column opens, and its keys count as
/// written at the upgrade: none expires at once.
#[tokio::test]
async fn a_database_of_the_earlier_layout_is_upgraded_without_expiring_everything() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(&dir);
        let k = store.keyed("rollups").await.unwrap();
        k.update(
            vec![store::KeyUpdate::new(
                "tag:a",
                store::Update::inc("count", 3),
            )],
            Durability::Journaled,
        )
        .await
        .unwrap();
        store.close().await.unwrap();
    }
    // The earlier layout: no `ts` column, no index on it.
    let db = rusqlite::Connection::open(dir.path().join(store::embedded::schema::DB_FILE)).unwrap();
    db.execute_batch(
        "DROP INDEX kv_written;
         CREATE TABLE kv_old(coll TEXT NOT NULL, key TEXT NOT NULL, body TEXT NOT NULL,
                             PRIMARY KEY(coll, key)) WITHOUT ROWID;
         INSERT INTO kv_old SELECT coll, key, body FROM kv;
         DROP TABLE kv;
         ALTER TABLE kv_old RENAME TO kv;",
    )
    .unwrap();
    drop(db);
    let before_upgrade = store::clock::now_us();
    let store = open(&dir);
    let k = store.keyed("rollups").await.unwrap();
    assert_eq!(
        k.expire("tag:", before_upgrade, 100, Durability::Journaled)
            .await
            .unwrap(),
        0,
        "keys count as written at the upgrade"
    );
    assert_eq!(k.get("tag:a").await.unwrap().unwrap()["count"], json!(3));
    assert_eq!(
        k.expire("tag:", store::clock::now_us(), 100, Durability::Journaled)
            .await
            .unwrap(),
        1,
        "and expire from there"
    );
}

/// Index columns are filled by the writer from the document; a database of the earlier
/// layout (an expression index on the JSON text) gets the column backfilled by SQLite's own
/// `json_extract`. Both must find the same documents for every kind of scalar.
#[tokio::test]
async fn an_expression_index_of_the_earlier_layout_becomes_a_column_that_agrees() {
    let dir = tempfile::tempdir().unwrap();
    let values = [
        json!("ünï 🦀 text"),
        json!(42),
        json!(-7),
        json!(2.5),
        json!(u64::MAX),
        json!(true),
        json!(false),
    ];
    let docs = |tag: &str| -> Vec<serde_json::Value> {
        values
            .iter()
            .map(|v| json!({"k": v, "tag": tag}))
            .chain([json!({"tag": tag}), json!({"k": {"nested": 1}, "tag": tag})])
            .collect()
    };
    let spec = CappedSpec {
        max_docs: 1000,
        max_bytes: 1 << 20,
        indexes: vec!["k".into()],
    };
    {
        let store = open(&dir);
        let c = store
            .capped(
                "events",
                &CappedSpec {
                    indexes: vec![],
                    ..spec.clone()
                },
            )
            .await
            .unwrap();
        let docs = docs("old")
            .into_iter()
            .map(|d| d.as_object().unwrap().clone())
            .collect();
        c.append(docs, Durability::Journaled).await.unwrap();
        store.close().await.unwrap();
    }
    // The earlier layout's expression index.
    let db = rusqlite::Connection::open(dir.path().join(store::embedded::schema::DB_FILE)).unwrap();
    db.execute_batch("CREATE INDEX idx_events_k ON capped_events(json_extract(body, '$.k'))")
        .unwrap();
    drop(db);
    let store = open(&dir);
    let c = store.capped("events", &spec).await.unwrap();
    let docs = docs("new")
        .into_iter()
        .map(|d| d.as_object().unwrap().clone())
        .collect();
    c.append(docs, Durability::Journaled).await.unwrap();
    for v in &values {
        let found = c.latest("k", v, 10).await.unwrap();
        let tags: Vec<_> = found.iter().map(|r| r.doc["tag"].clone()).collect();
        assert_eq!(tags, [json!("new"), json!("old")], "latest(k = {v})");
    }
    let plan = store.explain_latest("events", "k").await.unwrap();
    assert!(plan.contains("USING INDEX capped_events_ix_k"), "{plan}");
    let db = rusqlite::Connection::open(dir.path().join(store::embedded::schema::DB_FILE)).unwrap();
    let old: i64 = db
        .query_row(
            "SELECT COUNT(*) FROM sqlite_master WHERE name = 'idx_events_k'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(old, 0, "the expression index is dropped");
    store.close().await.unwrap();
}
