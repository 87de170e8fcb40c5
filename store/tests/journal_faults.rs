//! What the journal engine does when its disk fails a sync, and what a crash leaves past the
//! journal's end: one test per behaviour, on the simulated disk or on real files.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::sync::Arc;

use serde_json::json;
use store::embedded::fs::sim::{Fault, Geometry, Keep, Plan, SimDisk};
use store::embedded::{EmbeddedOptions, EmbeddedStore, Io, Tuning};
use store::{CappedSpec, Document, Durability, Start, Store};

fn doc(i: u64, pad: usize) -> Document {
    json!({"i": i, "pad": "p".repeat(pad)})
        .as_object()
        .cloned()
        .unwrap()
}

fn spec() -> CappedSpec {
    CappedSpec {
        max_docs: 10_000,
        max_bytes: 1 << 30,
        indexes: vec![],
    }
}

fn open_on(dir: &Path, fs: Arc<dyn store::embedded::fs::Fs>) -> EmbeddedStore {
    EmbeddedStore::open_with(
        dir,
        EmbeddedOptions::default(),
        Tuning::default(),
        Io {
            fs,
            manual_maintenance: true,
        },
    )
    .unwrap()
}

/// The `i` of every document of `events`, oldest first.
async fn all(store: &EmbeddedStore) -> Vec<u64> {
    let c = store.capped("events", &spec()).await.unwrap();
    let Some(b) = c.bounds().await.unwrap() else {
        return Vec::new();
    };
    let mut tail = c.tail(Start::Oldest);
    let mut out = Vec::new();
    while out.len() as u64 <= b.newest.0 - b.oldest.0 {
        let r = futures::StreamExt::next(&mut tail).await.unwrap().unwrap();
        out.push(r.doc["i"].as_u64().unwrap());
    }
    out
}

/// A sync that fails loses what was written since the last good one (Linux drops those
/// pages, and a later `fsync` reports nothing), yet reads still see it. The engine stops
/// writing at once, records where the last good sync ended, and the next open cuts the
/// journal there: it never writes after data the disk does not hold, so a journaled write
/// after the restart is not stranded past a hole a power cut would open.
#[tokio::test]
async fn a_failed_sync_stops_writes_and_the_next_open_cuts_what_it_lost() {
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("data");
    let disk = SimDisk::new(&dir, Geometry::N512);
    let store = open_on(&dir, disk.shared());
    let c = store.capped("events", &spec()).await.unwrap();
    c.append(vec![doc(1, 10)], Durability::Journaled)
        .await
        .unwrap();
    // The next sync fails.
    let next = disk.ops() + 1;
    disk.set_plan(Plan {
        faults: vec![(next, Fault::Eio)],
        ..Plan::default()
    });
    let failed = c.append(vec![doc(2, 10)], Durability::Journaled).await;
    assert!(failed.is_err(), "the failed sync is reported");
    let after = c.append(vec![doc(3, 10)], Durability::Journaled).await;
    assert!(
        after
            .unwrap_err()
            .to_string()
            .contains("until tailrace restarts"),
        "nothing more is written"
    );
    let _ = store.close().await;
    // The same disk, the lost write still readable: the next open cuts it off.
    let store = open_on(&dir, disk.shared());
    assert_eq!(all(&store).await, vec![1], "only what was synced");
    let c = store.capped("events", &spec()).await.unwrap();
    c.append(vec![doc(4, 10)], Durability::Journaled)
        .await
        .unwrap();
    store.close().await.unwrap();
    // A power cut: what was answered journaled is there.
    let image = disk.crash_now(Keep::Nothing);
    let again = base.path().join("after");
    std::fs::create_dir_all(&again).unwrap();
    let store = open_on(
        &again,
        SimDisk::from_image(&again, Geometry::N512, &image).shared(),
    );
    assert_eq!(all(&store).await, vec![1, 4]);
    store.close().await.unwrap();
}

/// Offsets of the records of a segment file (they start on 512-byte boundaries with `TRJ1`).
fn record_offsets(segment: &Path) -> Vec<usize> {
    let bytes = std::fs::read(segment).unwrap();
    (0..bytes.len())
        .step_by(512)
        .filter(|o| bytes[*o..].starts_with(b"TRJ1"))
        .collect()
}

/// A crash can drop one unsynced write and keep the next: the journal then ends at the hole,
/// with a whole, checksummed record past it. Written over, a record of the same size puts
/// that stale record right where the next one is expected, with the number expected: it must
/// not be read as part of the journal (records name their predecessor, and what lies past the
/// end is cleared at open).
#[tokio::test]
async fn a_stale_record_past_a_hole_is_never_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path();
    let store = EmbeddedStore::open(path, EmbeddedOptions::default()).unwrap();
    let c = store.capped("events", &spec()).await.unwrap();
    for i in 1..=4 {
        c.append(vec![doc(i, 100)], Durability::Journaled)
            .await
            .unwrap();
    }
    store.close().await.unwrap();
    let segment = path.join("journal").join(format!("{:016x}.log", 1));
    let offsets = record_offsets(&segment);
    let n = offsets.len();
    assert!(n >= 4, "{offsets:?}");
    // Drop the second-to-last record (zeros), keep the last one.
    let (hole, stale) = (offsets[n - 2], offsets[n - 1]);
    let mut bytes = std::fs::read(&segment).unwrap();
    bytes[hole..stale].fill(0);
    std::fs::write(&segment, &bytes).unwrap();

    let store = EmbeddedStore::open(path, EmbeddedOptions::default()).unwrap();
    assert_eq!(
        all(&store).await,
        vec![1, 2],
        "the journal ends at the hole"
    );
    let c = store.capped("events", &spec()).await.unwrap();
    // The same size as the dropped record: the next one is expected where the stale one is.
    c.append(vec![doc(7, 100)], Durability::Journaled)
        .await
        .unwrap();
    store.close().await.unwrap();
    let store = EmbeddedStore::open(path, EmbeddedOptions::default()).unwrap();
    assert_eq!(
        all(&store).await,
        vec![1, 2, 7],
        "the stale record (4) is not read back after the new one"
    );
    store.close().await.unwrap();
}

/// On a disk whose `O_DIRECT` writes must be 4 KiB-aligned (4Kn disks, dm-crypt) every
/// 512-byte journal write failed with `EINVAL`, after an open that succeeded.
#[tokio::test]
async fn the_journal_writes_on_a_disk_of_4_kib_direct_io() {
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("data");
    let disk = SimDisk::new(&dir, Geometry::K4);
    let store = open_on(&dir, disk.shared());
    let c = store.capped("events", &spec()).await.unwrap();
    for i in 1..=20 {
        c.append(vec![doc(i, 300)], Durability::Journaled)
            .await
            .unwrap();
    }
    store.close().await.unwrap();
    let store = open_on(&dir, disk.shared());
    assert_eq!(all(&store).await, (1..=20).collect::<Vec<_>>());
    store.close().await.unwrap();
    assert!(
        disk.trace()
            .iter()
            .filter(|o| o.kind == "write" && o.path.extension().is_some_and(|e| e == "log"))
            .all(|o| o.at % 4096 == 0 && o.len % 4096 == 0),
        "every journal write is of whole 4 KiB blocks"
    );
}
