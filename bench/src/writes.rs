//! `writes`: single-document `append`s to a capped collection shaped like `events` (same
//! indexes), one at a time, for each durability level — the MongoDB 2.6 write-concern and
//! RethinkDB 2.0 durability experiment. The floor is the disk's `fdatasync` of a 512-byte
//! append, measured just before and just after on the data directory's disk.

use std::time::Instant;

use serde_json::{Value, json};
use store::{CappedSpec, Document, Durability};

use super::floors::{self, Floor};
use super::measure::{Samples, fmt_ratio};
use super::plot::{self, Line};
use super::report::{Report, Series, Table, Target, latency_cells};
use super::{Bench, Result, Scenario, new_report};
use ingest::source::synthetic::Generator;

/// Published single-write latencies.
pub const REFERENCES: [(&str, &str, f64, &str); 4] = [
    ("MongoDB 2.6", "unacknowledged write", 115.0, "µs"),
    ("MongoDB 2.6", "acknowledged write", 265.0, "µs"),
    ("MongoDB 2.6", "journaled write", 37_130.0, "µs"),
    ("RethinkDB 2.0", "hard durability write", 12_680.0, "µs"),
];

/// The spec of `events` as the pipeline opens it, large enough that nothing is evicted.
pub(crate) fn events_like(bench: &Bench, max_docs: u64) -> CappedSpec {
    let mut indexes = bench.config.store.events.indexes.clone();
    if !indexes.iter().any(|i| i == store::STAMP_SOURCE_PATH) {
        indexes.push(store::STAMP_SOURCE_PATH.into());
    }
    CappedSpec {
        max_docs,
        max_bytes: max_docs.saturating_mul(4096),
        indexes,
    }
}

/// A tweet-like event as the ingester would store it (with its stamp).
pub(crate) fn event(g: &mut Generator, seq: u64) -> Document {
    let mut v = g.event();
    v["_tailrace"] = json!({"source": "bench", "seq": seq, "received_us": 0, "ingested_us": 0});
    match v {
        Value::Object(d) => d,
        _ => Document::new(),
    }
}

/// Runs the scenario.
pub async fn run(bench: &Bench) -> Result<Report> {
    let n = bench.iterations(1000, 20);
    let mut report = new_report(
        bench,
        Scenario::Writes,
        &format!(
            "{n} single-document appends per durability level, one client, events-shaped collection"
        ),
    );
    report.params =
        json!({"iterations": n, "document": "synthetic tweet, ~350 bytes, 4 indexed fields"});
    let dir = bench.data_dir("writes");
    let store = bench.open_store("writes").await?;
    let coll = store
        .capped(
            "bench_writes",
            &events_like(bench, (n as u64 * 5).max(10_000)),
        )
        .await?;

    let before = floors::fdatasync(&dir, n).await?;
    let mut g = Generator::new(5);
    let mut seq = 0u64;
    // Warm-up: table pages, statements, the writer thread.
    for _ in 0..20 {
        seq += 1;
        coll.append(vec![event(&mut g, seq)], Durability::Acknowledged)
            .await?;
    }
    let mut runs: Vec<(Durability, Samples, f64)> = Vec::new();
    for d in Durability::ALL {
        let pb = bench.progress(n as u64, &format!("writes {d}"));
        let mut samples = Samples::with_capacity(n);
        let docs: Vec<Document> = (0..n)
            .map(|_| {
                seq += 1;
                event(&mut g, seq)
            })
            .collect();
        let started = Instant::now();
        for doc in docs {
            let t = Instant::now();
            coll.append(vec![doc], d).await?;
            samples.push(t.elapsed());
            pb.inc(1);
        }
        let elapsed = started.elapsed().as_secs_f64();
        pb.finish_and_clear();
        if !d.waits() {
            // Let the queued writes commit before the next level is timed.
            seq += 1;
            coll.append(vec![event(&mut g, seq)], Durability::Journaled)
                .await?;
        }
        runs.push((d, samples, elapsed));
    }
    let after = floors::fdatasync(&dir, n).await?;
    let mut floor_samples = before.clone();
    floor_samples.extend(&after);
    let floor = Floor::new(
        "fdatasync_512b",
        format!(
            "512-byte append + fdatasync on the data directory's disk; p50 before {} / after {}",
            super::measure::fmt_us(before.summary().p50),
            super::measure::fmt_us(after.summary().p50)
        ),
        &floor_samples,
    );
    let floor_p50 = floor.latency_us.p50;
    report.floors.push(floor);
    // The stricter floors: what a reused WAL pays for durability, and SQLite itself.
    let overwrite = floors::fdatasync_overwrite(&dir, n).await?;
    let overwrite = Floor::new(
        "fdatasync_overwrite_4k",
        "4 KiB overwrite of an allocated page + fdatasync on the data directory's disk (a reused WAL)",
        &overwrite,
    );
    let body = serde_json::to_string(&event(&mut g, seq + 1))?;
    let n_indexes = events_like(bench, 1).indexes.len();
    let mut sqlite = Vec::new();
    for (full, indexes, name) in [
        (true, 0, "sqlite_insert_full"),
        (false, 0, "sqlite_insert_normal"),
        (false, n_indexes, "sqlite_insert_normal_indexed"),
        (true, n_indexes, "sqlite_insert_full_indexed"),
    ] {
        let samples = floors::sqlite_insert(&dir, n, full, indexes, body.clone()).await?;
        sqlite.push(Floor::new(
            name,
            format!(
                "raw SQLite: one-row insert per transaction, WAL, synchronous={}, {}, same disk ({} byte body)",
                if full { "FULL" } else { "NORMAL" },
                match indexes {
                    0 => "no index".to_string(),
                    k => format!("{k} indexed columns (as events)"),
                },
                body.len()
            ),
            &samples,
        ));
    }
    let overwrite_p50 = overwrite.latency_us.p50;
    let sqlite_full_p50 = sqlite[0].latency_us.p50;
    let sqlite_normal_p50 = sqlite[1].latency_us.p50;
    let sqlite_indexed_p50 = sqlite[2].latency_us.p50;
    let sqlite_full_indexed_p50 = sqlite[3].latency_us.p50;
    report.floors.push(overwrite);
    report.floors.extend(sqlite);

    for (d, samples, elapsed) in &runs {
        let s = samples.summary();
        report.series.push(Series {
            name: d.as_str().into(),
            params: json!({"durability": d.as_str()}),
            latency_us: s,
            ops: samples.len() as u64,
            elapsed_secs: *elapsed,
            throughput_per_sec: samples.len() as f64 / elapsed.max(1e-9),
            floor: Some("fdatasync_512b".into()),
            ratio_to_floor: Some(s.p50 / floor_p50),
            ..Series::default()
        });
    }
    report.references(&REFERENCES);
    if let Some(j) = report.series.iter().find(|s| s.name == "journaled") {
        report.targets.push(Target::at_most(
            "journaled p50 ≤ 1.2× the fdatasync floor (512-byte append)",
            j.ratio_to_floor.unwrap_or(f64::NAN),
            1.2,
            "×floor",
        ));
        // Context, not targets: the stricter floors a journaled commit could be held to.
        report.notes.push(format!(
            "journaled p50 is {:.2}× the overwrite fdatasync floor (a reused WAL page), {:.2}× raw SQLite synchronous=FULL without an index and {:.2}× with the same {n_indexes} indexed columns: SQLite's own commit is the floor that counts, the rest is tailrace's",
            j.latency_us.p50 / overwrite_p50,
            j.latency_us.p50 / sqlite_full_p50,
            j.latency_us.p50 / sqlite_full_indexed_p50,
        ));
    }
    if let Some(a) = report.series.iter().find(|s| s.name == "acknowledged") {
        report.targets.push(Target::at_most(
            "acknowledged p50 ≤ 2× raw SQLite synchronous=NORMAL",
            a.latency_us.p50 / sqlite_normal_p50,
            2.0,
            "×SQLite",
        ));
        report.notes.push(format!(
            "acknowledged p50 is {:.2}× a raw SQLite insert with the same {n_indexes} indexed columns (synchronous=NORMAL): what remains is tailrace's hand-off to its writer thread and back, and the commit's publication",
            a.latency_us.p50 / sqlite_indexed_p50
        ));
    }
    if !bench.local_disk() {
        report.notes.push(
            "the fdatasync floor is this machine's disk; a remote MongoDB server syncs its own"
                .into(),
        );
    }
    report.notes.push(
        "unacknowledged returns once the write is queued to the engine's writer: its latency is the queueing, not the commit".into(),
    );

    let lines: Vec<Line<'_>> = runs
        .iter()
        .map(|(d, s, _)| Line {
            name: d.as_str().into(),
            values: s.as_slice(),
        })
        .collect();
    let mut with_floor = lines;
    with_floor.push(Line {
        name: "fdatasync floor (before)".into(),
        values: before.as_slice(),
    });
    report.plots.extend(plot::latency_pair(
        &bench.out,
        "writes",
        "writes: single-document appends",
        &with_floor,
    )?);

    report.print_header();
    let mut t = Table::new(&[
        "durability",
        "p50",
        "p99",
        "p99.9",
        "max",
        "mean",
        "writes/s",
        "p50 ×floor",
    ]);
    for s in &report.series {
        let mut row = vec![s.name.clone()];
        row.extend(latency_cells(&s.latency_us));
        row.push(super::measure::fmt_rate(s.throughput_per_sec));
        row.push(s.ratio_to_floor.map(fmt_ratio).unwrap_or_default());
        t.row(row);
    }
    t.print();
    report.print_footer();
    drop(coll);
    store.close().await?;
    drop(store);
    super::remove_dir(&dir);
    Ok(report)
}
