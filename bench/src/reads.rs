//! `reads`: `get` by position (the capped collection's primary key), warm and cold — the
//! MongoDB / RethinkDB point-read experiment.
//!
//! - **warm**: the positions read were read once before (untimed), by the same engine;
//! - **cold**: the engine is closed and opened afresh (empty engine caches, new reader
//!   connections), the collection is opened (which may itself read the table: that is done
//!   first), then the OS page cache is dropped (`sync`, then `/proc/sys/vm/drop_caches`,
//!   where this process may write it; the report says when it may not), then positions not
//!   read before are read. The first cold read is reported on its own too.

use std::time::Instant;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde_json::json;
use store::{Durability, Position};

use super::measure::{Samples, fmt_us};
use super::plot::{self, Line};
use super::report::{Report, Series, Table, latency_cells};
use super::writes::{event, events_like};
use super::{Bench, BenchError, Result, Scenario, new_report};
use ingest::source::synthetic::Generator;

/// Published point-read latencies.
pub const REFERENCES: [(&str, &str, f64, &str); 4] = [
    ("MongoDB", "read by _id, warm", 270.0, "µs"),
    ("MongoDB", "read by _id, cold", 452.0, "µs"),
    ("RethinkDB", "read by primary key, warm", 558.0, "µs"),
    ("RethinkDB", "read by primary key, cold", 740.0, "µs"),
];

/// Writes dirty pages out and asks the kernel to drop clean page-cache pages.
/// Returns `Ok(())` when dropped, or why not.
pub fn drop_page_cache() -> Result<(), String> {
    let synced = std::process::Command::new("sync")
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !synced {
        return Err("`sync` failed; the page cache was not dropped".into());
    }
    std::fs::write("/proc/sys/vm/drop_caches", "1\n").map_err(|e| {
        format!("cannot write /proc/sys/vm/drop_caches ({e}): cold = a freshly opened engine, the OS page cache kept (run as root to drop it)")
    })
}

/// Runs the scenario.
pub async fn run(bench: &Bench) -> Result<Report> {
    let docs = bench.docs(100_000, 500);
    let n = bench.iterations(1000, 20).min(docs as usize);
    let mut report = new_report(
        bench,
        Scenario::Reads,
        &format!(
            "{n} reads by position among {} documents, warm and cold",
            super::measure::thousands(docs)
        ),
    );
    let spec = events_like(bench, docs.max(1000));
    let dir = bench.data_dir("reads");
    let store = bench.open_store("reads").await?;
    let coll = store.capped("bench_reads", &spec).await?;

    // Load.
    let pb = bench.progress(docs, "reads: loading");
    let mut g = Generator::new(11);
    let mut positions: Vec<Position> = Vec::with_capacity(docs as usize);
    let batch = 1000u64;
    let mut seq = 0;
    while seq < docs {
        let k = batch.min(docs - seq);
        let chunk = (0..k)
            .map(|i| event(&mut g, seq + i + 1))
            .collect::<Vec<_>>();
        positions.extend(coll.append(chunk, Durability::Acknowledged).await?);
        seq += k;
        pb.inc(k);
    }
    pb.finish_and_clear();
    if positions.len() as u64 != docs {
        return Err(BenchError::Scenario(format!(
            "loaded {} positions for {docs} documents",
            positions.len()
        )));
    }

    // Two disjoint random sets: one read warm, the other cold.
    let mut rng = StdRng::seed_from_u64(42);
    for i in (1..positions.len()).rev() {
        let j = rng.random_range(0..=i);
        positions.swap(i, j);
    }
    let warm_set: Vec<Position> = positions.iter().take(n).copied().collect();
    // Disjoint when there are at least 2n documents; otherwise it wraps into the warm set.
    let cold_set: Vec<Position> = positions.iter().cycle().skip(n).take(n).copied().collect();

    for p in &warm_set {
        coll.get(*p).await?;
    }
    let mut warm = Samples::with_capacity(n);
    let started = Instant::now();
    for p in &warm_set {
        let t = Instant::now();
        let r = coll.get(*p).await?;
        warm.push(t.elapsed());
        if r.is_none() {
            return Err(BenchError::Scenario(format!("position {p} not found")));
        }
    }
    let warm_elapsed = started.elapsed().as_secs_f64();

    // Cold: a fresh engine, the page cache dropped right before the first read.
    drop(coll);
    store.close().await?;
    drop(store);
    let store = bench.open_store("reads").await?;
    let coll = store.capped("bench_reads", &spec).await?;
    let dropped = if bench.args.quick {
        Err("--quick: the page cache is not dropped".to_string())
    } else {
        drop_page_cache()
    };
    let mut cold = Samples::with_capacity(n);
    let started = Instant::now();
    for p in &cold_set {
        let t = Instant::now();
        let r = coll.get(*p).await?;
        cold.push(t.elapsed());
        if r.is_none() {
            return Err(BenchError::Scenario(format!("position {p} not found")));
        }
    }
    let cold_elapsed = started.elapsed().as_secs_f64();
    let first_cold = cold.as_slice().first().copied().unwrap_or(f64::NAN);

    report.params = json!({
        "docs": docs, "iterations": n,
        "page_cache_dropped": dropped.is_ok(),
        "first_cold_read_us": first_cold,
    });
    match &dropped {
        Ok(()) => report.notes.push(
            "cold: engine reopened and the OS page cache dropped (sync; echo 1 > /proc/sys/vm/drop_caches) just before the first read".into(),
        ),
        Err(why) => report.notes.push(why.clone()),
    }
    report.notes.push(format!(
        "the first cold read took {} (it also opens a reader connection); later cold reads find some pages already cached",
        fmt_us(first_cold)
    ));
    if !bench.local_disk() {
        report.notes.push(
            "MongoDB: dropping this machine's page cache affects the server only if it runs here"
                .into(),
        );
    }
    for (name, s, elapsed) in [("warm", &warm, warm_elapsed), ("cold", &cold, cold_elapsed)] {
        report.series.push(Series {
            name: name.into(),
            params: json!({"cache": name}),
            latency_us: s.summary(),
            ops: s.len() as u64,
            elapsed_secs: elapsed,
            throughput_per_sec: s.len() as f64 / elapsed.max(1e-9),
            ..Series::default()
        });
    }
    report.references(&REFERENCES);
    let lines = [
        Line {
            name: "warm".into(),
            values: warm.as_slice(),
        },
        Line {
            name: "cold".into(),
            values: cold.as_slice(),
        },
    ];
    report.plots.extend(plot::latency_pair(
        &bench.out,
        "reads",
        "reads by position",
        &lines,
    )?);

    report.print_header();
    let mut t = Table::new(&["cache", "p50", "p99", "p99.9", "max", "mean", "reads/s"]);
    for s in &report.series {
        let mut row = vec![s.name.clone()];
        row.extend(latency_cells(&s.latency_us));
        row.push(super::measure::fmt_rate(s.throughput_per_sec));
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
