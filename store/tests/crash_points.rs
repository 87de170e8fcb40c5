//! The journal engine on a simulated disk, crashed before every file operation of scripted
//! workloads (`tests/crash/mod.rs` says what is checked after each crash).
//!
//! In `cargo test` each workload runs a bounded number of crash points, spread over its calls
//! (each with three fates for the unsynced writes: none kept, all kept, a seeded mix with torn
//! sectors), and a bounded number of failing calls. Every point, every call failing:
//!
//! ```text
//! TAILRACE_CRASH_POINTS=all cargo test --release -p store --test crash_points -- --nocapture
//! ```
//!
//! A failure prints the workload, the crash point, what survived and the calls before it;
//! `TAILRACE_CRASH_SEED=<seed>` replays the same points.

#![allow(clippy::unwrap_used)]

mod crash;
#[path = "common/dump.rs"]
mod dump;

use crash::{Point, Step, Tally, Workload};
use store::Durability::{Acknowledged as A, Journaled as J};
use store::embedded::fs::sim::{Fault, Geometry, Keep};

/// Crash points per workload in `cargo test` (each run three times).
const BUDGET: u64 = 60;
/// Failing calls per workload in `cargo test`.
const FAULT_BUDGET: u64 = 24;

fn all() -> bool {
    std::env::var("TAILRACE_CRASH_POINTS").is_ok_and(|v| v == "all")
}

fn seed() -> u64 {
    std::env::var("TAILRACE_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_secs())
        })
}

/// Runs `w`'s crash points and failing calls; panics with every failure.
fn prove(w: &Workload) {
    let seed = seed();
    let trace = crash::dry_run(w);
    let again = crash::dry_run(w);
    let shape = |t: &[store::embedded::fs::sim::Op]| -> Vec<(String, String)> {
        t.iter()
            .map(|o| {
                (
                    o.kind.to_string(),
                    o.path
                        .file_name()
                        .map(|f| f.to_string_lossy().into_owned())
                        .unwrap_or_default(),
                )
            })
            .collect()
    };
    // The writer syncs commits that did not ask for it on a timer too, so a loaded machine
    // can move a sync: the crash points are as good, but a seed may not replay the same one.
    if shape(&trace) != shape(&again) {
        println!(
            "{}: two runs of the workload made different calls (a sync moved by timing); a seed may not replay its points exactly",
            w.name
        );
    }
    if std::env::var_os("TAILRACE_CRASH_TRACE").is_some() {
        for op in &trace {
            println!("{}: {op}", w.name);
        }
    }
    let calls = trace.len() as u64;
    let mut tally = Tally {
        calls,
        ..Tally::default()
    };
    for at in crash::points(calls, BUDGET, all(), seed) {
        for keep in [Keep::Nothing, Keep::Everything, Keep::Random(seed ^ at)] {
            tally.points += 1;
            match crash::crash_at(
                w,
                Point {
                    at,
                    keep,
                    fault: None,
                },
            ) {
                Ok(n) => tally.checks += n,
                Err(e) => tally.failures.push(e),
            }
        }
    }
    // Failing calls: each sync, write, allocation, creation and rename that can fail.
    let failable: Vec<(u64, Fault)> = trace
        .iter()
        .filter_map(|o| match o.kind {
            "sync_data" | "sync_all" | "sync_dir" | "rename" => Some((o.n, Fault::Eio)),
            "write" => Some((
                o.n,
                if o.n % 2 == 0 {
                    Fault::Eio
                } else {
                    Fault::Enospc
                },
            )),
            "allocate" | "create" => Some((o.n, Fault::Enospc)),
            _ => None,
        })
        .collect();
    let picked = crash::points(failable.len() as u64, FAULT_BUDGET, all(), seed);
    for i in picked {
        let fault = failable[i as usize];
        for keep in [Keep::Nothing, Keep::Everything] {
            tally.faults += 1;
            match crash::crash_at(
                w,
                Point {
                    at: u64::MAX,
                    keep,
                    fault: Some(fault),
                },
            ) {
                Ok(n) => tally.checks += n,
                Err(e) => tally.failures.push(e),
            }
        }
    }
    println!(
        "{} ({}): {} calls; {} crash runs, {} failing-call runs, {} checks passed, {} failures (seed {seed})",
        w.name,
        geometry_name(w.geometry),
        tally.calls,
        tally.points,
        tally.faults,
        tally.checks,
        tally.failures.len()
    );
    if !tally.failures.is_empty() {
        // Every failure in full, beside the build.
        let file = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("crash-failures-{}.txt", w.name.replace(' ', "-")));
        let _ = std::fs::write(&file, tally.failures.join("\n\n"));
        println!("  every failure: {}", file.display());
        // One line per kind of failure (its first line, numbers taken out), with a count.
        let mut kinds: std::collections::BTreeMap<String, usize> = Default::default();
        for f in &tally.failures {
            let first = f.lines().next().unwrap_or_default();
            let kind: String = first
                .chars()
                .map(|c| if c.is_ascii_digit() { '#' } else { c })
                .collect();
            *kinds.entry(kind).or_default() += 1;
        }
        for (kind, n) in &kinds {
            println!("  {n:>4} × {kind}");
        }
        // `TAILRACE_CRASH_SHOW=<text>`: the failures whose text holds it, rather than the first.
        let wanted = std::env::var("TAILRACE_CRASH_SHOW").unwrap_or_default();
        let shown: Vec<&String> = tally
            .failures
            .iter()
            .filter(|f| f.contains(&wanted))
            .take(5)
            .collect();
        panic!(
            "{}: {} of {} runs failed (seed {seed}); the first:\n\n{}",
            w.name,
            tally.failures.len(),
            tally.points + tally.faults,
            shown
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("\n\n")
        );
    }
}

fn geometry_name(g: Geometry) -> &'static str {
    match g {
        Geometry::N512 => "512n",
        Geometry::E512 => "512e",
        Geometry::K4 => "4Kn",
        _ => "other disk",
    }
}

/// Capped appends with indexes and eviction, journaled and acknowledged, segment rolls and
/// releases, checkpoints, and a clean stop in the middle.
fn capped_appends(geometry: Geometry) -> Workload {
    let mut steps = Vec::new();
    for round in 0..6 {
        steps.push(Step::Events(7, J));
        steps.push(Step::Events(3, A));
        steps.push(Step::Checkpoint(J));
        steps.push(Step::Events(12, J));
        steps.push(Step::Maintain);
        if round == 2 {
            steps.push(Step::Reopen);
        }
    }
    Workload {
        name: "capped appends",
        steps,
        geometry,
        sqlite_conversion: false,
    }
}

/// Dead letters among many events: their segment is released while they are retained, so
/// they move into the tree (a spill).
fn dead_letters_spill(geometry: Geometry) -> Workload {
    let mut steps = vec![Step::Dead(2, J), Step::Dead(3, A)];
    for _ in 0..5 {
        steps.push(Step::Events(15, J));
        steps.push(Step::Events(5, A));
        steps.push(Step::Maintain);
    }
    steps.push(Step::Flush);
    steps.push(Step::Events(4, J));
    steps.push(Step::Maintain);
    steps.push(Step::Reopen);
    steps.push(Step::Events(20, J));
    steps.push(Step::Maintain);
    Workload {
        name: "dead letters that spill",
        steps,
        geometry,
        sqlite_conversion: false,
    }
}

/// Long-tail counters past the filter of stored keys' rebuilds, memtable flushes between.
fn rollups(geometry: Geometry) -> Workload {
    let mut steps = Vec::new();
    for round in 0..8 {
        steps.push(Step::Tags(12, A));
        steps.push(Step::Events(2, J));
        steps.push(Step::Tags(6, J));
        if round % 3 == 2 {
            steps.push(Step::Flush);
        }
    }
    steps.push(Step::Checkpoint(J));
    Workload {
        name: "rollups past the key filter's rebuild",
        steps,
        geometry,
        sqlite_conversion: false,
    }
}

/// A data directory of the SQLite layout converted at its first open, then written to.
fn sqlite_conversion(geometry: Geometry) -> Workload {
    Workload {
        name: "sqlite conversion",
        steps: Vec::new(),
        geometry,
        sqlite_conversion: true,
    }
}

#[test]
fn the_sqlite_conversion_survives_every_crash_point() {
    prove(&sqlite_conversion(Geometry::N512));
}

#[test]
fn capped_appends_survive_every_crash_point() {
    prove(&capped_appends(Geometry::N512));
}

#[test]
fn spilled_dead_letters_survive_every_crash_point() {
    prove(&dead_letters_spill(Geometry::N512));
}

#[test]
fn rollups_survive_every_crash_point() {
    prove(&rollups(Geometry::N512));
}

/// On a "512e" disk (4 KiB physical sectors addressed in 512-byte blocks) a write smaller
/// than a sector is a read-modify-write that a power cut can leave damaged, records synced
/// before included.
#[test]
fn capped_appends_survive_every_crash_point_on_512e() {
    prove(&capped_appends(Geometry::E512));
}

/// A disk whose direct-I/O writes must be 4 KiB-aligned (4Kn, dm-crypt).
#[test]
fn capped_appends_survive_every_crash_point_on_4kn() {
    prove(&capped_appends(Geometry::K4));
}

#[test]
fn spilled_dead_letters_survive_every_crash_point_on_512e() {
    prove(&dead_letters_spill(Geometry::E512));
}
