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

#[tokio::test]
async fn latest_uses_the_expression_index() {
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
        plan.contains("USING INDEX idx_events_user_id"),
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

#[tokio::test]
async fn a_failing_job_does_not_fail_its_group() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let k = store.keyed("k").await.unwrap();
    k.update(
        vec![store::KeyUpdate::new(
            "a",
            store::Update::default().and_set("s", "text"),
        )],
        Durability::Journaled,
    )
    .await
    .unwrap();
    let (bad, good) = tokio::join!(
        k.update(
            vec![store::KeyUpdate::new("a", store::Update::inc("s", 1))],
            Durability::Journaled
        ),
        k.update(
            vec![store::KeyUpdate::new("b", store::Update::inc("n", 1))],
            Durability::Journaled
        ),
    );
    assert!(bad.is_err(), "$inc of a string fails");
    good.unwrap();
    assert_eq!(k.get("b").await.unwrap().unwrap()["n"], json!(1));
    assert_eq!(
        k.get("a").await.unwrap().unwrap()["s"],
        json!("text"),
        "the failed job left no trace"
    );
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
