//! Everything a data directory holds, read back through the store contract, in the shape of
//! the upgrade fixtures' dumps (`fixtures/*/make.rs.txt`): the tests that open an earlier
//! layout compare with it.

use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};
use store::{CappedSpec, ChangeFilter, ChangeStart, Start, Store};

const WAIT: Duration = Duration::from_secs(10);

fn spec(max_docs: u64, indexes: &[&str]) -> CappedSpec {
    CappedSpec {
        max_docs,
        max_bytes: 1 << 30,
        indexes: indexes.iter().map(|s| s.to_string()).collect(),
    }
}

/// The fixtures' `events` collection.
pub fn events_spec() -> CappedSpec {
    spec(
        60,
        &["user.screen_name", "user.id", "id", "_tailrace.source"],
    )
}

/// The fixtures' `dead_letters` collection.
pub fn letters_spec() -> CappedSpec {
    spec(10_000, &["source", "reason"])
}

/// Everything a capped collection holds, from its oldest position to its newest.
pub async fn dump_capped(c: &dyn store::Capped) -> Vec<Value> {
    let Some(b) = c.bounds().await.unwrap() else {
        return Vec::new();
    };
    let mut tail = c.tail(Start::Oldest);
    let mut out = Vec::new();
    loop {
        let r = tokio::time::timeout(WAIT, tail.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let done = r.position >= b.newest;
        out.push(
            json!({"position": r.position.0, "doc": r.doc, "committed_at_us": r.committed_at_us}),
        );
        if done {
            return out;
        }
    }
}

/// Everything a store holds, in the shape of the fixtures' dumps (see their `make.rs.txt`).
pub async fn dump_store(store: &impl Store) -> Value {
    let events = store.capped("events", &events_spec()).await.unwrap();
    let letters = store.capped("dead_letters", &letters_spec()).await.unwrap();
    let mut dump = serde_json::Map::new();
    dump.insert("events".into(), Value::Array(dump_capped(&*events).await));
    dump.insert(
        "dead_letters".into(),
        Value::Array(dump_capped(&*letters).await),
    );
    for name in ["rollups", "stats"] {
        let all = store.keyed(name).await.unwrap().scan("").await.unwrap();
        let all = all
            .into_iter()
            .map(|d| json!({"key": d.key, "doc": d.doc}))
            .collect();
        dump.insert(name.into(), Value::Array(all));
    }
    let newest = store.newest_change().await.unwrap().unwrap();
    let mut s = store.changes(ChangeFilter::default(), ChangeStart::Oldest);
    let mut changes = vec![];
    loop {
        let c = tokio::time::timeout(WAIT, s.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let done = c.token == newest;
        changes.push(serde_json::to_value(&c).unwrap());
        if done {
            break;
        }
    }
    dump.insert("changes".into(), Value::Array(changes));
    let mut checkpoints = serde_json::Map::new();
    for feed in ["tail", "changes"] {
        let c = store.load_checkpoint(feed).await.unwrap();
        checkpoints.insert(feed.into(), c.unwrap_or(Value::Null));
    }
    dump.insert("checkpoints".into(), Value::Object(checkpoints));
    Value::Object(dump)
}
