//! `update`: `$inc` of one field of a random document among N, acknowledged and
//! unacknowledged, with 1, 2, 4, 8, 16 and 32 concurrent clients — throughput and latency per
//! concurrency. The documents live in a changefeed-backed (keyed) collection, so every
//! update is also a change-log entry, as in the pipeline's `rollups`.
//!
//! N is the original 2,000,000 by default (loading them, each also a change-log entry, takes
//! seconds). Unacknowledged clients return once their update is queued; the run then waits
//! for the queue to drain and reports the committed rate too.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde_json::{Value, json};
use store::{Durability, KeyUpdate, Keyed, Update};

use super::measure::{Samples, fmt_rate, fmt_us, thousands};
use super::plot::{self, Line};
use super::report::{Report, Series, Table};
use super::{Bench, BenchError, Result, Scenario, new_report};

fn key(i: u64) -> String {
    format!("d{i:07}")
}

/// One (durability, clients) run.
struct Level {
    durability: Durability,
    clients: usize,
    samples: Samples,
    secs: f64,
    drain_secs: f64,
}

async fn level(
    keyed: &Arc<dyn Keyed>,
    docs: u64,
    durability: Durability,
    clients: usize,
    duration: Duration,
) -> Result<Level> {
    let started = Instant::now();
    let deadline = started + duration;
    let mut tasks = Vec::new();
    for c in 0..clients {
        let keyed = keyed.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(1000 + c as u64);
            // (start offset, latency) so the runs can be merged in time order.
            let mut out: Vec<(Duration, Duration)> = Vec::new();
            loop {
                let t = Instant::now();
                if t >= deadline {
                    break;
                }
                let k = key(rng.random_range(0..docs));
                keyed
                    .update(vec![KeyUpdate::new(k, Update::inc("n", 1))], durability)
                    .await?;
                out.push((t - started, t.elapsed()));
            }
            Ok::<_, BenchError>(out)
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(
            t.await
                .map_err(|e| BenchError::Scenario(format!("update client: {e}")))??,
        );
    }
    let secs = started.elapsed().as_secs_f64();
    // Unacknowledged: wait until everything queued is committed (an acknowledged no-op
    // queued behind it), so the next level starts from an idle writer.
    let drain = Instant::now();
    keyed
        .update(
            vec![KeyUpdate::new(key(0), Update::inc("n", 0))],
            Durability::Acknowledged,
        )
        .await?;
    let drain_secs = if durability.waits() {
        0.0
    } else {
        drain.elapsed().as_secs_f64()
    };
    all.sort_by_key(|a| a.0);
    let mut samples = Samples::with_capacity(all.len());
    for (_, l) in all {
        samples.push(l);
    }
    Ok(Level {
        durability,
        clients,
        samples,
        secs,
        drain_secs,
    })
}

/// Runs the scenario.
pub async fn run(bench: &Bench) -> Result<Report> {
    let docs = bench.docs(2_000_000, 1_000);
    let levels = bench.concurrency(&[1, 2, 4, 8, 16, 32], &[1, 4]);
    let duration = bench.duration(Duration::from_secs(2), Duration::from_millis(200));
    let mut report = new_report(
        bench,
        Scenario::Update,
        &format!(
            "$inc of a random document among {}, {} per level",
            thousands(docs),
            humantime::format_duration(duration)
        ),
    );
    report.params = json!({"docs": docs, "clients": levels, "duration_secs": duration.as_secs_f64(),
                           "durabilities": ["acknowledged", "unacknowledged"]});
    let dir = bench.data_dir("update");
    let store = bench.open_store("update").await?;
    let keyed = store.keyed("bench_update").await?;

    let pb = bench.progress(docs, "update: loading");
    let load_started = Instant::now();
    let mut i = 0u64;
    while i < docs {
        let k = 1000.min(docs - i);
        let batch = (i..i + k)
            .map(|j| KeyUpdate::new(key(j), Update::inc("n", 0)))
            .collect::<Vec<_>>();
        keyed.update(batch, Durability::Acknowledged).await?;
        i += k;
        pb.inc(k);
    }
    pb.finish_and_clear();
    report.params["load_secs"] = json!(load_started.elapsed().as_secs_f64());

    let mut runs = Vec::new();
    for d in [Durability::Acknowledged, Durability::Unacknowledged] {
        for &c in &levels {
            let pb = bench.progress(1, &format!("update {d}, {c} clients"));
            runs.push(level(&keyed, docs, d, c, duration).await?);
            pb.finish_and_clear();
        }
    }

    // Small runs: check that every acknowledged increment landed.
    if docs <= 20_000 {
        let total: u64 = keyed
            .scan("d")
            .await?
            .iter()
            .filter_map(|e| e.doc.get("n").and_then(Value::as_u64))
            .sum();
        let sent: u64 = runs.iter().map(|r| r.samples.len() as u64).sum();
        if total != sent {
            return Err(BenchError::Scenario(format!(
                "update: {sent} increments acknowledged or queued, the documents sum to {total}"
            )));
        }
        report.notes.push(format!(
            "checked: the {docs} documents' counters sum to the {sent} increments sent"
        ));
    }

    for r in &runs {
        let n = r.samples.len() as u64;
        let client_rate = n as f64 / r.secs.max(1e-9);
        let committed_rate = n as f64 / (r.secs + r.drain_secs).max(1e-9);
        report.series.push(Series {
            name: format!("{} × {}", r.durability, r.clients),
            params: json!({"durability": r.durability.as_str(), "clients": r.clients}),
            latency_us: r.samples.summary(),
            ops: n,
            elapsed_secs: r.secs,
            throughput_per_sec: committed_rate,
            extra: json!({"client_rate_per_sec": client_rate, "drain_secs": r.drain_secs}),
            ..Series::default()
        });
    }
    report.notes.push(
        "unacknowledged: latency is the time to queue; throughput counts until the queue has drained (committed), the client-side rate is in extra".into(),
    );

    for d in [Durability::Acknowledged, Durability::Unacknowledged] {
        let lines: Vec<Line<'_>> = runs
            .iter()
            .filter(|r| r.durability == d)
            .map(|r| Line {
                name: format!("{} clients", r.clients),
                values: r.samples.as_slice(),
            })
            .collect();
        report.plots.extend(plot::latency_pair(
            &bench.out,
            &format!("update-{d}"),
            &format!("update ($inc, {d})"),
            &lines,
        )?);
    }
    let curves: Vec<(String, Vec<(f64, f64)>)> =
        [Durability::Acknowledged, Durability::Unacknowledged]
            .iter()
            .map(|d| {
                (
                    format!("{d} (committed)"),
                    runs.iter()
                        .filter(|r| r.durability == *d)
                        .map(|r| {
                            let n = r.samples.len() as f64;
                            (r.clients as f64, n / (r.secs + r.drain_secs).max(1e-9))
                        })
                        .collect(),
                )
            })
            .collect();
    let throughput = "update-throughput.svg".to_string();
    plot::xy(
        &bench.out.join(&throughput),
        "update: $inc per second against concurrent clients",
        ("clients", "updates/s"),
        &curves,
    )?;
    report.plots.push(throughput);

    report.print_header();
    let mut t = Table::new(&[
        "durability × clients",
        "updates",
        "updates/s",
        "p50",
        "p99",
        "p99.9",
        "max",
        "mean",
    ]);
    for s in &report.series {
        t.row(vec![
            s.name.clone(),
            thousands(s.ops),
            fmt_rate(s.throughput_per_sec),
            fmt_us(s.latency_us.p50),
            fmt_us(s.latency_us.p99),
            fmt_us(s.latency_us.p999),
            fmt_us(s.latency_us.max),
            fmt_us(s.latency_us.mean),
        ]);
    }
    t.print();
    report.print_footer();
    drop(keyed);
    store.close().await?;
    drop(store);
    super::remove_dir(&dir);
    Ok(report)
}
