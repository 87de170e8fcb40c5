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
