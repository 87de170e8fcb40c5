//! The crash-point harness: runs a scripted workload against the journal engine on a
//! simulated disk, once to number its file operations, then again with the power cut before
//! each of them (or a chosen call failing), reopens what the crash left and checks what the
//! engine promises.
//!
//! Every run of a workload makes the same calls in the same order: the workload's steps run
//! one after the other, maintenance runs only at its own steps ([`Step::Maintain`]), and the
//! documents are made from the step's number. A failure names the workload, the crash point,
//! what survived of the unsynced writes (and its seed) and the calls before it; the seed
//! (`TAILRACE_CRASH_SEED`) runs the same points again.
//!
//! What is checked after every crash (see [`check`]):
//! - the directory opens, and its finished journal segments hold only whole records;
//! - the store is the effect of a prefix of the workload's operations, every operation that
//!   was answered `journaled` included (all answered ones, when every unsynced write
//!   survived: a killed process), none after that prefix; an operation that failed may be in
//!   it or not;
//! - every document is the one written at its position, capped collections keep their
//!   bounds, the collection that evicts nothing holds every position, and rollups equal a
//!   recount of the events the prefix holds (they commit together);
//! - no position or change number a reader could see before the crash is gone or holds
//!   other content after it;
//! - the checkpoint is the last one the prefix saved;
//! - the store takes new writes and stops cleanly.

#![allow(dead_code, clippy::unwrap_used)]

mod convert;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};
use store::embedded::fs::sim::{Fault, Geometry, Image, Keep, Plan, SimDisk};
use store::embedded::{EmbeddedOptions, EmbeddedStore, Io, Tuning};
use store::{CappedSpec, Document, Durability, KeyUpdate, Start, Store, Update};

/// One step of a workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// `n` events appended to `events` with their rollups (a `lang:<l>` counter each), in one
    /// commit.
    Events(usize, Durability),
    /// `n` dead letters appended to `dead_letters` (which never evicts).
    Dead(usize, Durability),
    /// `n` long-tail counters (`tag:<k>`, new keys mostly) and the step's marker key.
    Tags(usize, Durability),
    /// A feed's checkpoint: the step's number and the events the model holds.
    Checkpoint(Durability),
    /// Maintenance: memtable flushes, index files, releases.
    Maintain,
    /// The memtable sealed and flushed, then maintenance.
    Flush,
    /// A clean stop and a new open of the same disk.
    Reopen,
}

/// The sizes a workload runs with: small, so segments roll, release and spill within it.
pub fn tuning() -> Tuning {
    Tuning {
        segment_bytes: 12 << 10,
        memtable_bytes: 8 << 10,
        known_keys_min: 8,
        live_bytes: 64 << 10,
    }
}

pub fn options() -> EmbeddedOptions {
    EmbeddedOptions {
        oplog_max_entries: 30,
        queue_capacity: 64,
    }
}

pub const EVENTS: &str = "events";
pub const DEAD: &str = "dead_letters";
pub const ROLLUPS: &str = "rollups";
pub const FEED: &str = "tail";
const LANGS: [&str; 5] = ["en", "ja", "tr", "ar", "hi"];

pub fn events_spec() -> CappedSpec {
    CappedSpec {
        max_docs: 60,
        max_bytes: 16 << 10,
        indexes: vec!["lang".into(), "user.id".into()],
    }
}

pub fn dead_spec() -> CappedSpec {
    CappedSpec {
        max_docs: 1_000_000,
        max_bytes: 1 << 30,
        indexes: vec![],
    }
}

/// The `k`th event the workload writes (its content follows from `k`, so a document read back
/// says which it is, and whether it is whole).
pub fn event(k: u64) -> Value {
    let texts = ["東京 🦀", "İstanbul", "مرحبا", "हिन्दी", "plain"];
    json!({
        "k": k,
        "lang": lang(k),
        "user": {"id": k % 7},
        "$type": "app.post",
        "a.b": k % 3,
        "text": format!("{} {}", texts[(k % 5) as usize], noise(k, (k * 37 % 300) as usize)),
    })
}

/// `n` letters that follow from `seed` and do not compress: records of the size their
/// documents say, so that segments fill.
fn noise(seed: u64, n: usize) -> String {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b'a' + (x % 26) as u8)
        })
        .collect()
}

fn lang(k: u64) -> &'static str {
    LANGS[(k % 5) as usize]
}

/// The `k`th dead letter: one in three ~2 KB.
pub fn dead(k: u64) -> Value {
    let big = k % 3 == 1;
    json!({"k": k, "reason": "malformed_json", "raw": noise(k + (1 << 32), if big { 2000 } else { 40 })})
}

fn doc(v: Value) -> Document {
    v.as_object().cloned().unwrap()
}

/// What an operation of the workload did, as the model knows it.
#[derive(Clone, Debug)]
struct OpRecord {
    step: usize,
    kind: Step,
    /// The numbers of the events or dead letters it appended, `[first, end)`.
    numbers: Option<(u64, u64)>,
    /// Its answer: `Some(true)` answered, `Some(false)` failed, `None` not answered (the
    /// power went during it).
    answered: Option<bool>,
    /// Change numbers it made.
    changes: u64,
}

/// What readers could see before the crash.
#[derive(Clone, Copy, Debug, Default)]
struct Shown {
    events: u64,
    dead: u64,
    change: u64,
}

/// The model of one run.
#[derive(Default)]
struct Model {
    ops: Vec<OpRecord>,
    /// The next event's and dead letter's number: numbers are never given twice, whatever
    /// positions the store gives them.
    next_event: u64,
    next_dead: u64,
    shown: Shown,
    /// Whether a call failed (a planned fault) during the run.
    faulted: bool,
}

/// One open of the store on a disk.
struct Open {
    store: EmbeddedStore,
    events: Arc<dyn store::Capped>,
    dead: Arc<dyn store::Capped>,
    rollups: Arc<dyn store::Keyed>,
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn open(rt: &tokio::runtime::Runtime, dir: &Path, disk: &SimDisk) -> store::Result<Open> {
    let io = Io {
        fs: disk.shared(),
        manual_maintenance: true,
    };
    let store = EmbeddedStore::open_with(dir, options(), tuning(), io)?;
    rt.block_on(async {
        let events = store.capped(EVENTS, &events_spec()).await?;
        let dead = store.capped(DEAD, &dead_spec()).await?;
        let rollups = store.keyed(ROLLUPS).await?;
        Ok(Open {
            store,
            events,
            dead,
            rollups,
        })
    })
}

fn close(rt: &tokio::runtime::Runtime, o: Open) {
    let Open { store, .. } = o;
    let _ =
        rt.block_on(async { tokio::time::timeout(Duration::from_secs(10), store.close()).await });
}

/// Runs `steps` on `disk` (data directory `dir`) until the end or the first call that finds
/// the power gone; the model says what each operation did.
fn run(dir: &Path, disk: &SimDisk, steps: &[Step]) -> Model {
    let rt = rt();
    let mut model = Model {
        next_event: 1,
        next_dead: 1,
        ..Model::default()
    };
    let Ok(mut o) = open(&rt, dir, disk) else {
        return model;
    };
    for (i, step) in steps.iter().enumerate() {
        if disk.crashed().is_some() {
            break;
        }
        let mut rec = OpRecord {
            step: i,
            kind: *step,
            numbers: None,
            answered: None,
            changes: 0,
        };
        let result: store::Result<()> = match *step {
            Step::Events(n, d) => {
                let first = model.next_event;
                model.next_event += n as u64;
                rec.numbers = Some((first, model.next_event));
                let docs: Vec<Arc<Document>> = (first..model.next_event)
                    .map(|k| Arc::new(doc(event(k))))
                    .collect();
                let mut updates: Vec<KeyUpdate> = (first..model.next_event)
                    .map(|k| KeyUpdate::new(format!("lang:{}", lang(k)), Update::inc("count", 1)))
                    .collect();
                updates.push(marker(i));
                rec.changes = updates.len() as u64;
                rt.block_on(o.events.append_with_updates(
                    docs.into(),
                    o.rollups.as_ref(),
                    updates,
                    d,
                ))
                .map(|_| ())
            }
            Step::Dead(n, d) => {
                let first = model.next_dead;
                model.next_dead += n as u64;
                rec.numbers = Some((first, model.next_dead));
                let docs = (first..model.next_dead).map(|k| doc(dead(k))).collect();
                rt.block_on(o.dead.append(docs, d)).map(|_| ())
            }
            Step::Tags(n, d) => {
                let mut updates: Vec<KeyUpdate> = (0..n)
                    .map(|k| KeyUpdate::new(format!("tag:{}", tag(i, k)), Update::inc("count", 1)))
                    .collect();
                updates.push(marker(i));
                rec.changes = updates.len() as u64;
                rt.block_on(o.rollups.update(updates, d))
            }
            Step::Checkpoint(d) => {
                let body = json!({"step": i, "events": model.next_event - 1});
                rt.block_on(o.store.save_checkpoint(FEED, body, d))
            }
            Step::Maintain => o.store.maintain(),
            Step::Flush => rt
                .block_on(o.store.flush_keyed_state())
                .and_then(|()| o.store.maintain()),
            Step::Reopen => {
                close(&rt, o);
                match open(&rt, dir, disk) {
                    Ok(again) => {
                        o = again;
                        Ok(())
                    }
                    Err(_) => {
                        model.ops.push(rec);
                        return model;
                    }
                }
            }
        };
        rec.answered = if disk.crashed().is_some() && result.is_err() {
            None
        } else {
            Some(result.is_ok())
        };
        model.ops.push(rec);
        // What a reader could see now.
        if disk.crashed().is_none() {
            rt.block_on(async {
                if let Ok(Some(b)) = o.events.bounds().await {
                    model.shown.events = model.shown.events.max(b.newest.0);
                }
                if let Ok(Some(b)) = o.dead.bounds().await {
                    model.shown.dead = model.shown.dead.max(b.newest.0);
                }
                if let Ok(Some(t)) = o.store.newest_change().await {
                    model.shown.change = model.shown.change.max(t.0.parse().unwrap_or(0));
                }
            });
        }
    }
    close(&rt, o);
    model
}

/// The key step `i` sets in the same commit as its other writes: whether the store holds
/// the step.
fn marker(i: usize) -> KeyUpdate {
    KeyUpdate::new(format!("op:{i}"), Update::default().and_set("op", i as u64))
}

/// The `k`th tag of step `i`: mostly new keys, some seen before (a long tail with a head).
fn tag(i: usize, k: usize) -> String {
    if k.is_multiple_of(4) {
        format!("head{}", k % 3)
    } else {
        format!("s{i}k{k}")
    }
}

/// A copy of directory `from` into `to` (the keyed state's tree at the crash).
fn copy_dir(from: &Path, to: &Path) {
    if !from.exists() {
        return;
    }
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            // A file the tree removes while it is copied is no longer part of it.
            let _ = std::fs::copy(e.path(), dest);
        }
    }
}

/// How a crash point is run.
#[derive(Clone, Copy, Debug)]
pub struct Point {
    /// The call before which the power goes.
    pub at: u64,
    pub keep: Keep,
    /// A call that fails before it (the workload goes on after it; the power goes at its
    /// end, or at `at`).
    pub fault: Option<(u64, Fault)>,
}

/// A workload, its name and its disk.
pub struct Workload {
    pub name: &'static str,
    pub steps: Vec<Step>,
    pub geometry: Geometry,
    /// Instead of the steps: the SQLite layout's fixture converted at the first open
    /// (see `convert.rs`).
    pub sqlite_conversion: bool,
}

/// What a run of the harness found.
#[derive(Debug, Default)]
pub struct Tally {
    pub calls: u64,
    pub points: u64,
    pub faults: u64,
    pub checks: u64,
    pub failures: Vec<String>,
}

/// The calls of one run without a crash, as `kind path` lines.
pub fn dry_run(w: &Workload) -> Vec<store::embedded::fs::sim::Op> {
    if w.sqlite_conversion {
        return convert::dry_run(w.geometry);
    }
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("data");
    let disk = SimDisk::new(&dir, w.geometry);
    run(&dir, &disk, &w.steps);
    disk.trace()
}

/// Runs `w` with the power cut at `p`, reopens what it left and checks it; `Err` says what
/// failed.
pub fn crash_at(w: &Workload, p: Point) -> Result<u64, String> {
    if w.sqlite_conversion {
        return convert::crash_at(w.geometry, p);
    }
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("data");
    let disk = SimDisk::new(&dir, w.geometry);
    let tree_at_crash = base.path().join("tree-at-crash");
    {
        let (from, to) = (dir.join("keyed"), tree_at_crash.clone());
        disk.on_crash(move || copy_dir(&from, &to));
    }
    disk.set_plan(Plan {
        crash_at: Some(p.at),
        keep: Some(p.keep),
        faults: p.fault.into_iter().collect(),
    });
    let mut model = run(&dir, &disk, &w.steps);
    let image = disk.crash_now(p.keep);
    let trace = disk.trace();
    model.faulted = trace.iter().any(|op| op.failed.is_some());
    let context = || {
        let from = trace.len().saturating_sub(6);
        let calls: Vec<String> = trace[from..].iter().map(|o| format!("  {o}")).collect();
        format!(
            "workload {} on {:?}, crash point {} ({:?}{}), the calls before it:\n{}",
            w.name,
            w.geometry,
            p.at,
            p.keep,
            p.fault
                .map(|(n, f)| format!(", call {n} failing with {f:?}"))
                .unwrap_or_default(),
            calls.join("\n")
        )
    };
    check(
        &base.path().join("after"),
        &tree_at_crash,
        w.geometry,
        &image,
        &model,
    )
    .map_err(|e| format!("{e}\n{}", context()))
}

/// Reopens `image` in `dir` (with the tree as it was at the crash) and checks it against the
/// model. Returns how many checks passed.
fn check(
    dir: &Path,
    tree: &Path,
    geometry: Geometry,
    image: &Image,
    model: &Model,
) -> Result<u64, String> {
    let mut checks = 0u64;
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    copy_dir(tree, &data.join("keyed"));
    let disk = SimDisk::from_image(&data, geometry, image);
    if image.files.keys().any(|p| p.starts_with("journal")) {
        store::embedded::inspect_on(&disk, &data)
            .map_err(|e| format!("a finished journal segment is damaged: {e}"))?;
        checks += 1;
    }
    let rt = rt();
    let o = open(&rt, &data, &disk).map_err(|e| format!("the directory does not open: {e}"))?;
    checks += 1;
    let result = rt.block_on(verify(&o, model, &mut checks));
    let result = result.and_then(|()| {
        // It takes new writes, and stops cleanly.
        rt.block_on(async {
            o.events
                .append(vec![doc(json!({"after": "crash"}))], Durability::Journaled)
                .await
                .map_err(|e| format!("a write after the crash fails: {e}"))?;
            Ok::<(), String>(())
        })?;
        o.store
            .maintain()
            .map_err(|e| format!("maintenance after the crash fails: {e}"))?;
        checks += 1;
        Ok(())
    });
    let Open { store, .. } = o;
    let closed = rt.block_on(store.close());
    result?;
    closed.map_err(|e| format!("the store does not stop cleanly: {e}"))?;
    Ok(checks + 1)
}

/// Every document of `c` from its oldest to its newest position.
async fn all_docs(c: &dyn store::Capped) -> Result<Vec<(u64, Value)>, String> {
    let Some(b) = c.bounds().await.map_err(|e| e.to_string())? else {
        return Ok(Vec::new());
    };
    let mut tail = c.tail(Start::After(store::Position(b.oldest.0 - 1)));
    let mut out = Vec::new();
    while out.last().is_none_or(|(p, _)| *p < b.newest.0) {
        let r = tokio::time::timeout(Duration::from_secs(10), tail.next())
            .await
            .map_err(|_| format!("{}: the tail stopped before {}", c.name(), b.newest.0))?
            .ok_or("the tail ended")?
            .map_err(|e| format!("{}: reading back: {e}", c.name()))?;
        out.push((r.position.0, Value::Object((*r.doc).clone())));
    }
    Ok(out)
}

/// The numbers (`k`) of documents read back, checked to be whole documents the workload
/// wrote, in the order it wrote them.
fn numbers(what: &str, docs: &[(u64, Value)], make: fn(u64) -> Value) -> Result<Vec<u64>, String> {
    let mut out: Vec<u64> = Vec::with_capacity(docs.len());
    for (p, d) in docs {
        let k = d["k"]
            .as_u64()
            .ok_or(format!("{what} position {p} holds {d}"))?;
        if *d != make(k) {
            return Err(format!(
                "{what} position {p} holds {d}, not document {k} as written"
            ));
        }
        if out.last().is_some_and(|last| *last >= k) {
            return Err(format!(
                "{what} position {p} holds document {k} after document {}: out of order",
                out.last().copied().unwrap_or(0)
            ));
        }
        out.push(k);
    }
    Ok(out)
}

async fn verify(o: &Open, model: &Model, checks: &mut u64) -> Result<(), String> {
    let newest = |b: Option<store::Bounds>| b.map_or(0, |b| b.newest.0);
    let events_newest = newest(o.events.bounds().await.map_err(|e| e.to_string())?);
    let dead_newest = newest(o.dead.bounds().await.map_err(|e| e.to_string())?);
    let events = all_docs(o.events.as_ref()).await?;
    let dead_docs = all_docs(o.dead.as_ref()).await?;
    let event_ks = numbers("events", &events, event)?;
    let dead_ks = numbers("dead letters", &dead_docs, dead)?;
    // Which operations are in the store: events and counters by the marker their commit set,
    // dead letters (never evicted) by their numbers.
    let mut included = Vec::with_capacity(model.ops.len());
    for op in &model.ops {
        let inc = match (op.kind, op.numbers) {
            (Step::Events(..) | Step::Tags(..), _) => Some(
                o.rollups
                    .get(&format!("op:{}", op.step))
                    .await
                    .map_err(|e| e.to_string())?
                    .is_some(),
            ),
            (Step::Dead(..), Some((first, end))) => {
                let held = (first..end)
                    .filter(|k| dead_ks.binary_search(k).is_ok())
                    .count();
                if held != 0 && held != (end - first) as usize {
                    return Err(format!(
                        "step {}: dead letters {first}..{end} are in part ({held})",
                        op.step
                    ));
                }
                Some(held != 0)
            }
            // Not seen on their own.
            _ => None,
        };
        included.push(inc);
    }
    let last = included
        .iter()
        .rposition(|i| *i == Some(true))
        .map_or(-1, |i| i as i64);
    // A write answered `acknowledged` is lost when the sync after it fails: the engine stops
    // writing, and the next open starts after the last good sync. So after a failed sync,
    // such a write may be missing before a reopen that later steps follow.
    let journaled = |op: &OpRecord| matches!(op.kind, Step::Events(_, d) | Step::Dead(_, d) | Step::Tags(_, d) if d.syncs());
    let lost_to_a_failed_sync = |op: &OpRecord, before: i64| {
        model.faulted
            && !journaled(op)
            && model.ops.iter().any(|later| {
                later.kind == Step::Reopen && later.step > op.step && (later.step as i64) < before
            })
    };
    for (op, inc) in model.ops.iter().zip(&included) {
        let journaled = journaled(op);
        let lost_to_a_failed_sync = lost_to_a_failed_sync(op, last);
        if *inc == Some(false)
            && op.answered == Some(true)
            && (op.step as i64) < last
            && !lost_to_a_failed_sync
        {
            return Err(format!(
                "step {} ({:?}) was answered and a later one is in the store, but it is not: not a prefix",
                op.step, op.kind
            ));
        }
        if op.answered == Some(true) && journaled && *inc == Some(false) {
            return Err(format!(
                "step {} ({:?}) was answered journaled and is lost",
                op.step, op.kind
            ));
        }
    }
    *checks += 1;
    // Every document held belongs to a step the store holds; the collection that evicts
    // nothing holds all of theirs, at positions 1..=newest.
    let of_included = |k: u64, dead_letters: bool| {
        model.ops.iter().zip(&included).any(|(op, inc)| {
            *inc == Some(true)
                && matches!(op.kind, Step::Dead(..)) == dead_letters
                && op.numbers.is_some_and(|(a, b)| k >= a && k < b)
        })
    };
    if let Some(k) = event_ks.iter().find(|k| !of_included(**k, false)) {
        return Err(format!("event {k} is held, its step is not"));
    }
    let want_dead: Vec<u64> = model
        .ops
        .iter()
        .zip(&included)
        .filter(|(op, inc)| **inc == Some(true) && matches!(op.kind, Step::Dead(..)))
        .flat_map(|(op, _)| op.numbers.map_or(0..0, |(a, b)| a..b))
        .collect();
    if dead_ks != want_dead
        || dead_docs.len() as u64 != dead_newest
        || dead_docs.first().is_some_and(|d| d.0 != 1)
    {
        return Err(format!(
            "dead letters: {:?} at positions {:?}..={dead_newest}, the steps held wrote {want_dead:?}",
            dead_ks,
            dead_docs.first().map(|d| d.0)
        ));
    }
    *checks += 2;
    // A `$group` by an indexed field, answered from the finished segments' values files where
    // they are good, gives what the documents read back give.
    let pipeline = store::query::Pipeline::parse(
        &serde_json::json!([{"$group": {"_id": "$lang", "n": {"$sum": 1}}}]),
    )
    .map_err(|e| e.to_string())?;
    let read_back: Vec<Document> = events
        .iter()
        .map(|(p, d)| {
            let mut d = doc(d.clone());
            d.insert("_id".into(), Value::from(*p));
            d
        })
        .collect();
    let want = pipeline
        .run(read_back, store::query::Limits::default())
        .map_err(|e| e.to_string())?;
    let got = store::query::aggregate(
        store::query::Input::Capped(o.events.clone()),
        pipeline,
        store::query::Limits::default(),
    )
    .await
    .map_err(|e| e.to_string())?;
    if got.docs != want.docs {
        return Err(format!(
            "events grouped by lang ({}): {:?}, the documents read back give {:?}",
            got.stages[0].ran, got.docs, want.docs
        ));
    }
    *checks += 1;
    // Bounds.
    for (c, what, spec, n) in [
        (&o.events, "events", events_spec(), events.len()),
        (&o.dead, "dead letters", dead_spec(), dead_docs.len()),
    ] {
        let usage = c.usage().await.map_err(|e| e.to_string())?;
        if usage.docs > spec.max_docs || usage.bytes > spec.max_bytes {
            return Err(format!("{what}: {usage:?} past its bounds"));
        }
        if usage.docs != n as u64 {
            return Err(format!(
                "{what}: usage says {} documents, {n} read back",
                usage.docs
            ));
        }
        *checks += 2;
    }
    // Rollups: a recount of the events of the steps the store holds (they commit together).
    let mut counts: BTreeMap<&str, u64> = BTreeMap::new();
    for (op, inc) in model.ops.iter().zip(&included) {
        if let (Step::Events(..), Some(true), Some((a, b))) = (op.kind, inc, op.numbers) {
            for k in a..b {
                *counts.entry(lang(k)).or_default() += 1;
            }
        }
    }
    for l in LANGS {
        let got = o
            .rollups
            .get(&format!("lang:{l}"))
            .await
            .map_err(|e| e.to_string())?
            .and_then(|d| d.get("count").and_then(Value::as_u64))
            .unwrap_or(0);
        let want = counts.get(l).copied().unwrap_or(0);
        if got != want {
            return Err(format!(
                "rollup lang:{l} is {got}, a recount of the events the store holds says {want}"
            ));
        }
    }
    *checks += 1;
    // Tags: the sum over the steps held.
    let mut tags: BTreeMap<String, u64> = BTreeMap::new();
    for (op, inc) in model.ops.iter().zip(&included) {
        if let (Step::Tags(n, _), Some(true)) = (op.kind, inc) {
            for k in 0..n {
                *tags.entry(tag(op.step, k)).or_default() += 1;
            }
        }
    }
    let stored = o.rollups.scan("tag:").await.map_err(|e| e.to_string())?;
    let got: BTreeMap<String, u64> = stored
        .iter()
        .map(|d| {
            (
                d.key["tag:".len()..].to_string(),
                d.doc.get("count").and_then(Value::as_u64).unwrap_or(0),
            )
        })
        .collect();
    if got != tags {
        let diff: Vec<_> = tags
            .iter()
            .filter(|(k, v)| got.get(*k) != Some(v))
            .take(5)
            .collect();
        return Err(format!(
            "tag counters differ from the steps held ({} stored, {} expected; first differences {diff:?})",
            got.len(),
            tags.len()
        ));
    }
    *checks += 1;
    // The checkpoint: one a step saved, not after a step the store does not hold; the last
    // one answered journaled at least.
    let cp = o
        .store
        .load_checkpoint(FEED)
        .await
        .map_err(|e| e.to_string())?;
    if let Some(cp) = &cp {
        let step = cp["step"].as_u64().unwrap_or(u64::MAX) as usize;
        let saved = model.ops.iter().any(|op| {
            op.step == step && matches!(op.kind, Step::Checkpoint(_)) && op.answered != Some(false)
        });
        if !saved {
            return Err(format!("checkpoint {cp} was never saved"));
        }
        if let Some((op, _)) = model.ops.iter().zip(&included).find(|(op, inc)| {
            op.step < step
                && **inc == Some(false)
                && op.answered == Some(true)
                && !lost_to_a_failed_sync(op, step as i64)
        }) {
            return Err(format!(
                "checkpoint {cp} is in the store, step {} before it is not",
                op.step
            ));
        }
        let held_before = model
            .ops
            .iter()
            .zip(&included)
            .filter(|(op, inc)| op.step < step && **inc == Some(true))
            .filter_map(|(op, _)| match (op.kind, op.numbers) {
                (Step::Events(..), Some((_, b))) => Some(b - 1),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        if cp["events"].as_u64().unwrap_or(0) > held_before && !model.faulted {
            return Err(format!(
                "checkpoint {cp} counts events up to {}, the steps before it in the store wrote up to {held_before}",
                cp["events"]
            ));
        }
    }
    let answered = model
        .ops
        .iter()
        .filter(|op| {
            matches!(op.kind, Step::Checkpoint(d) if d.syncs()) && op.answered == Some(true)
        })
        .map(|op| op.step)
        .next_back();
    if let Some(want) = answered {
        let got = cp
            .as_ref()
            .and_then(|c| c["step"].as_u64())
            .map(|s| s as usize);
        if got.is_none_or(|g| g < want) {
            return Err(format!(
                "the checkpoint of step {want} was answered journaled; the store has {cp:?}"
            ));
        }
    }
    *checks += 1;
    // What readers could see is still there.
    let change = o
        .store
        .newest_change()
        .await
        .map_err(|e| e.to_string())?
        .map_or(0, |t| t.0.parse().unwrap_or(0));
    for (what, shown, now) in [
        ("events position", model.shown.events, events_newest),
        ("dead letters position", model.shown.dead, dead_newest),
        ("change number", model.shown.change, change),
    ] {
        if shown > now {
            return Err(format!(
                "a reader saw {what} {shown} before the crash; the store now ends at {now}, and will give the number to other content"
            ));
        }
    }
    *checks += 1;
    Ok(())
}

/// The crash points to run for a workload of `calls` calls: every one when `all`, else at
/// most `budget` spread over them (every `k`th, from an offset the seed picks).
pub fn points(calls: u64, budget: u64, all: bool, seed: u64) -> Vec<u64> {
    if all || calls <= budget {
        return (0..calls).collect();
    }
    let stride = calls.div_ceil(budget);
    let offset = seed % stride;
    (0..calls).filter(|n| n % stride == offset).collect()
}
