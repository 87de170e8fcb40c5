//! The SQLite conversion as a crash-point workload: a data directory of the earlier layout
//! (the fixture `fixtures/sqlite-layout`) opened on the simulated disk, so converted, then
//! written to once and stopped.
//!
//! The journal and the catalog go through the simulated disk; the SQLite file and the keyed
//! state's tree are real files (the first is read by SQLite, the second written by
//! `lsm-tree`), so the real directory is copied as it is at the crash point: for them the
//! crash is a killed process, applied exactly between two of the disk's calls.
//!
//! What is checked after every crash: the directory opens (converting again, or going on
//! from a finished conversion), holds exactly what the SQLite engine held (the fixture's
//! dump), takes a write at the next position, and stops cleanly; a second open converts
//! nothing.

use std::path::Path;

use serde_json::{Value, json};
use store::embedded::fs::sim::{Geometry, Plan, SimDisk};
use store::embedded::{EmbeddedOptions, EmbeddedStore, Io};
use store::{Durability, Store};

use super::{Point, copy_dir, doc, rt, tuning};
use crate::dump::{dump_store, events_spec};

fn fixture() -> &'static Path {
    static DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/sqlite-layout");
    Path::new(DIR)
}

fn expected() -> Value {
    serde_json::from_slice(&std::fs::read(fixture().join("expected.json")).unwrap()).unwrap()
}

fn open(dir: &Path, disk: &SimDisk) -> store::Result<EmbeddedStore> {
    let io = Io {
        fs: disk.shared(),
        manual_maintenance: true,
    };
    EmbeddedStore::open_with(dir, EmbeddedOptions::default(), tuning(), io)
}

/// The workload: open (converting), one journaled write, maintenance, a clean stop.
fn run(dir: &Path, disk: &SimDisk) {
    let Ok(store) = open(dir, disk) else {
        return;
    };
    let rt = rt();
    rt.block_on(async {
        if let Ok(events) = store.capped("events", &events_spec()).await {
            let _ = events
                .append(
                    vec![doc(json!({"after": "conversion"}))],
                    Durability::Journaled,
                )
                .await;
        }
    });
    let _ = store.maintain();
    let _ = rt.block_on(store.close());
}

fn setup(base: &Path, geometry: Geometry) -> (std::path::PathBuf, SimDisk) {
    let dir = base.join("data");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(fixture().join("tailrace.db"), dir.join("tailrace.db")).unwrap();
    let disk = SimDisk::new(&dir, geometry);
    (dir, disk)
}

pub fn dry_run(geometry: Geometry) -> Vec<store::embedded::fs::sim::Op> {
    let base = tempfile::tempdir().unwrap();
    let (dir, disk) = setup(base.path(), geometry);
    run(&dir, &disk);
    disk.trace()
}

pub fn crash_at(geometry: Geometry, p: Point) -> Result<u64, String> {
    let base = tempfile::tempdir().unwrap();
    let (dir, disk) = setup(base.path(), geometry);
    let real_at_crash = base.path().join("real-at-crash");
    {
        let (from, to) = (dir.clone(), real_at_crash.clone());
        disk.on_crash(move || copy_dir(&from, &to));
    }
    disk.set_plan(Plan {
        crash_at: Some(p.at),
        keep: Some(p.keep),
        faults: p.fault.into_iter().collect(),
    });
    run(&dir, &disk);
    let image = disk.crash_now(p.keep);
    let trace = disk.trace();
    let context = || {
        let from = trace.len().saturating_sub(6);
        let calls: Vec<String> = trace[from..].iter().map(|o| format!("  {o}")).collect();
        format!(
            "workload sqlite conversion on {geometry:?}, crash point {} ({:?}{}), the calls before it:\n{}",
            p.at,
            p.keep,
            p.fault
                .map(|(n, f)| format!(", call {n} failing with {f:?}"))
                .unwrap_or_default(),
            calls.join("\n")
        )
    };
    let after = base.path().join("after");
    copy_dir(&real_at_crash, &after);
    let _ = std::fs::remove_file(after.join("LOCK"));
    let disk = SimDisk::from_image(&after, geometry, &image);
    check(&after, &disk).map_err(|e| format!("{e}\n{}", context()))
}

fn check(dir: &Path, disk: &SimDisk) -> Result<u64, String> {
    let mut checks = 0;
    let rt = rt();
    let expected = expected();
    let last_pos = expected["events"].as_array().unwrap().last().unwrap()["position"]
        .as_u64()
        .unwrap();
    let store = open(dir, disk).map_err(|e| format!("the directory does not open: {e}"))?;
    checks += 1;
    let result = rt.block_on(async {
        let now = dump_store(&store).await;
        for part in ["dead_letters", "rollups", "stats", "changes", "checkpoints"] {
            if now[part] != expected[part] {
                return Err(format!("{part} differ from the SQLite engine's"));
            }
            checks += 1;
        }
        // The workload's one write may have landed (journaled before the crash) or not.
        let events = now["events"].as_array().unwrap();
        let converted = events
            .iter()
            .filter(|e| e["position"].as_u64().unwrap() <= last_pos)
            .cloned()
            .collect::<Vec<_>>();
        let wanted = expected["events"].as_array().unwrap();
        if converted.len() + 1 < wanted.len()
            || !wanted.ends_with(&converted)
            || events.len() > converted.len() + 1
        {
            return Err(format!(
                "events differ from the SQLite engine's: {} converted of {}",
                converted.len(),
                wanted.len()
            ));
        }
        checks += 1;
        let events_c = store
            .capped("events", &events_spec())
            .await
            .map_err(|e| e.to_string())?;
        let p = events_c
            .append(vec![doc(json!({"after": "check"}))], Durability::Journaled)
            .await
            .map_err(|e| format!("a write after the crash fails: {e}"))?;
        let newest = events.last().unwrap()["position"].as_u64().unwrap();
        if p[0].0 != newest + 1 {
            return Err(format!(
                "the write after the crash got position {} after {newest}",
                p[0].0
            ));
        }
        checks += 1;
        Ok(())
    });
    let closed = rt.block_on(store.close());
    result?;
    closed.map_err(|e| format!("the store does not stop cleanly: {e}"))?;
    if dir.join("tailrace.db").exists() {
        return Err("the SQLite file was not moved to the backup directory".into());
    }
    let store = open(dir, disk).map_err(|e| format!("the second open fails: {e}"))?;
    let holds = rt.block_on(async {
        let events = store.capped("events", &events_spec()).await?;
        events.bounds().await
    });
    let _ = rt.block_on(store.close());
    match holds {
        Ok(Some(b)) if b.newest.0 > last_pos => Ok(checks + 2),
        other => Err(format!("the second open lost the writes: {other:?}")),
    }
}
