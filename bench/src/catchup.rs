//! `catchup`: a feed that resumes far behind its checkpoint — after downtime, a deploy, a
//! crash — and how fast it catches up.
//!
//! 1. The configured feeds run while `warm` events are written, then stop and checkpoint, as
//!    the pipeline's shutdown does.
//! 2. With no feed running, `--docs` events (default 1,000,000, from `--dataset`) are loaded
//!    through the real ingester (acknowledged: the load is not what is measured).
//! 3. Each feed alone, then all of them together, resume from those checkpoints, `--docs`
//!    events behind. Measured: the time from starting the feed (checkpoint loaded, statistics
//!    restored) until it holds the last event (lag 0: nothing is written meanwhile), the
//!    catch-up rate (events per second), the cost per event in wall time and in the process's
//!    CPU time over that span (the feed plus the checkpoints it writes), and the progress over
//!    time. Before each run the checkpoints of step 1 are put back, so every run starts from
//!    the same place.
//!
//! The collections are sized so nothing the feeds need is evicted: `events` holds every
//! event, the op log every change (a realistic event makes ~2.4 op-log entries: its
//! `source:` summary, which the change feed reads, and its share of the counter upserts,
//! which the change feed's filter skips).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use store::clock::now_us;
use store::{Durability, Store};

use super::dataset::Docs;
use super::handed::Records;
use super::machine::Usage;
use super::measure::{Samples, fmt_bytes, fmt_rate, fmt_us, thousands};
use super::observe::{self, Sampler, Watching};
use super::plot::{self, Line};
use super::report::{Report, Series, Table, Target};
use super::writes::events_like;
use super::{Bench, BenchError, Result, Scenario, new_report};
use ingest::config::{Config, Engine};
use ingest::pipeline::{Pipeline, Running};
use ingest::source::{Raw, Source};

/// How often progress is sampled during a catch-up.
const SAMPLE_EVERY: Duration = Duration::from_millis(20);
/// Op-log entries kept per event loaded (a realistic event makes ~2.4 with the default
/// batch; room for smaller batches, where fewer counter upserts coalesce).
const OPLOG_PER_EVENT: u64 = 6;
/// The catch-up rate a feed needs to overtake ingestion at issue 10's first target.
const TARGET_RATE: f64 = 55_000.0;

/// One catch-up run: which feeds, how long, at what cost.
struct Outcome {
    name: String,
    feeds: Vec<FeedRun>,
    /// Seconds from starting the feeds until all of them held the last event (or the timeout).
    secs: f64,
    caught_up: bool,
    /// The process's CPU seconds and bytes written over the run.
    usage: Usage,
    /// µs per event over each sampling interval with progress (all feeds of the run).
    slices: Samples,
    lag_lines: Vec<(String, Vec<(f64, f64)>)>,
}

/// One feed within a run.
struct FeedRun {
    name: String,
    kind: &'static str,
    /// Seconds until it held the last event.
    secs: Option<f64>,
    /// Entries its stream yielded (events for these feeds).
    held: u64,
    gaps: u64,
    restarts: u64,
}

/// The configuration of one phase: the scenario's sizes, the writes acknowledged (the load is
/// not what is measured), the feeds named in `feeds`, no configured source.
fn phase_config(config: &Config, feeds: &[&str]) -> Config {
    let mut c = config.clone();
    c.store.durability = Durability::Acknowledged;
    c.sources.clear();
    c.feeds.retain(|f| feeds.contains(&f.name.as_str()));
    c
}

/// Writes `count` events of source `bench` through the library's pipeline on `store`, with
/// the feeds named in `feeds` running, as fast as it takes them; returns the seconds the
/// writes took, what the process used, and the watched feeds, still running.
async fn load(
    bench: &Bench,
    store: &Arc<dyn Store>,
    config: &Config,
    feeds: &[&str],
    (seed, count): (u64, u64),
    what: &str,
) -> Result<(f64, Usage, Running, Watching)> {
    let pb = bench.progress(count, what);
    let mut docs = Docs::new(bench.args.dataset, seed);
    // Handed over parsed: loading is not what this scenario measures.
    let events = (0..count).map(move |_| Raw::Json(docs.event()));
    let records = Records::new(events, None, pb.clone());
    let source: Box<dyn Source> = Box::new(records);
    let mut pipeline =
        Pipeline::build_on(store.clone(), phase_config(config, feeds), vec![source]).await?;
    let watching = observe::watch(&mut pipeline);
    let before = Usage::now();
    let started = Instant::now();
    let mut running = pipeline.start().await?;
    running.finished().await;
    let secs = started.elapsed().as_secs_f64();
    pb.finish_and_clear();
    let written = running
        .ingest_stats()
        .written
        .load(Ordering::Relaxed)
        .max(0) as u64;
    if written != count {
        return Err(BenchError::Scenario(format!(
            "catchup: loading {count} events wrote {written}"
        )));
    }
    Ok((secs, Usage::since(before), running, watching))
}

/// Stops a phase's pipeline; an unclean stop is an error of the scenario.
async fn stop(running: Running, what: &str) -> Result<()> {
    let report = running.stop().await;
    if report.is_clean() {
        Ok(())
    } else {
        Err(BenchError::Scenario(format!(
            "catchup: {what}: the pipeline did not stop cleanly: {}",
            report.problems.join("; ")
        )))
    }
}

/// Runs the feeds named in `names` from their checkpoints, `behind` events behind, until they
/// hold `last` (or `timeout`).
async fn catch_up(
    store: &Arc<dyn Store>,
    config: &Config,
    name: &str,
    names: &[&str],
    (last, behind): (u64, u64),
    timeout: Duration,
) -> Result<Outcome> {
    let mut pipeline =
        Pipeline::build_on(store.clone(), phase_config(config, names), vec![]).await?;
    let watching = observe::watch(&mut pipeline);
    let before = Usage::now();
    let started = Instant::now();
    let started_us = now_us();
    let running = pipeline.start().await?;
    watching.watch_for(last);
    let sampler = Sampler::spawn(watching.probes(), move || last, SAMPLE_EVERY);
    let caught_up = watching.wait_for(last, timeout).await;
    let secs = started.elapsed().as_secs_f64();
    let usage = Usage::since(before);
    let timeline = sampler.finish().await;
    stop(running, name).await?;
    let feeds: Vec<FeedRun> = watching
        .feeds
        .iter()
        .map(|w| {
            let status = w.handle.status();
            FeedRun {
                name: w.name.clone(),
                kind: w.kind,
                secs: w
                    .probe
                    .reached_at_us()
                    .map(|t| (t - started_us) as f64 / 1e6),
                held: w.probe.held(),
                gaps: status.gaps,
                restarts: status.restarts,
            }
        })
        .collect();
    // Cost per event along the way: the slowest feed's progress per sampling interval.
    let mut slices = Samples::default();
    let slowest: Vec<u64> = (0..feeds.len())
        .map(|i| timeline.lag(i).collect::<Vec<_>>())
        .fold(Vec::new(), |acc: Vec<u64>, lag| {
            if acc.is_empty() {
                lag
            } else {
                acc.iter().zip(lag).map(|(a, b)| (*a).max(b)).collect()
            }
        });
    for (w, t) in slowest.windows(2).zip(timeline.t.windows(2)) {
        let done = w[0].saturating_sub(w[1]);
        if done > 0 {
            slices.push_us((t[1] - t[0]) * 1e6 / done as f64);
        }
    }
    let end = feeds
        .iter()
        .filter_map(|f| f.secs)
        .fold(0f64, f64::max)
        .max(1e-6);
    if slices.is_empty() {
        // Caught up within one sampling interval (--quick): the whole run is the one slice.
        slices.push_us(end * 1e6 / behind.max(1) as f64);
    }
    let lag_lines = feeds
        .iter()
        .enumerate()
        .map(|(i, f)| (format!("{name}: {} behind", f.name), timeline.lag_points(i)))
        .collect();
    Ok(Outcome {
        name: name.to_string(),
        secs: if caught_up { end } else { secs },
        caught_up,
        feeds,
        usage,
        slices,
        lag_lines,
    })
}

/// Runs the scenario.
pub async fn run(bench: &Bench) -> Result<Report> {
    let n = bench.docs(1_000_000, 1_000);
    let warm = if bench.args.quick { 50 } else { 1_000 };
    let timeout = if bench.args.quick {
        Duration::from_secs(60)
    } else {
        Duration::from_secs(600)
    };
    let dataset = bench.args.dataset;
    let names: Vec<String> = bench.config.feeds.iter().map(|f| f.name.clone()).collect();
    let mut report = new_report(
        bench,
        Scenario::Catchup,
        &format!(
            "each feed resuming {} {} events behind its checkpoint: time to lag 0, events/s, cost per event",
            thousands(n),
            dataset.as_str()
        ),
    );
    let mut config = bench.store_config("catchup");
    // The embedded engine's change log must reach back past the feeds' checkpoints.
    let mut oplog_max_entries = None;
    if let Engine::Embedded(s) = &mut config.store.engine {
        s.oplog_max_entries = s
            .oplog_max_entries
            .max((n + warm) * OPLOG_PER_EVENT + 10_000);
        oplog_max_entries = Some(s.oplog_max_entries);
    }
    report.params = json!({
        "behind": n, "warm_up_events": warm, "dataset": dataset.describe(),
        "load_durability": "acknowledged", "batch_max_events": bench.config.ingest.batch_max_events,
        "events_max_docs": n + warm + 1000, "oplog_max_entries": oplog_max_entries,
        "feeds": bench.config.feeds.iter().map(|f| json!({"name": f.name, "kind": f.kind()})).collect::<Vec<_>>(),
        "stats": bench.config.stats, "sampled_every_ms": SAMPLE_EVERY.as_millis() as u64,
        "timeout_secs": timeout.as_secs(),
    });
    let dir = bench.data_dir("catchup");
    let spec = events_like(bench, n + warm + 1000);
    config.store.events.max_docs = spec.max_docs;
    config.store.events.max_bytes = spec.max_bytes;
    let store: Arc<dyn Store> = ingest::pipeline::open_store(&config).await?;
    let all: Vec<&str> = names.iter().map(String::as_str).collect();

    // 1. The feeds run over a first few events, then stop and checkpoint.
    let (_, _, running, watching) =
        load(bench, &store, &config, &all, (31, warm), "catchup: warm-up").await?;
    if !watching.wait_for(warm, Duration::from_secs(60)).await {
        return Err(BenchError::Scenario(
            "catchup: the feeds did not hold the warm-up events within 60 s".into(),
        ));
    }
    stop(running, "warm-up").await?;
    let mut saved: Vec<(String, Value)> = Vec::new();
    for name in &names {
        match store.load_checkpoint(name).await? {
            Some(cp) => saved.push((name.clone(), cp)),
            None => {
                return Err(BenchError::Scenario(format!(
                    "catchup: feed {name} stopped without a checkpoint"
                )));
            }
        }
    }

    // 2. With no feed running, the store fills.
    let what = format!("catchup: loading {} events", thousands(n));
    let (load_secs, load_usage, running, _) =
        load(bench, &store, &config, &[], (32, n), &what).await?;
    stop(running, "load").await?;
    let last = warm + n;

    // 3. Each feed alone, then all together, from the same checkpoints.
    let mut runs: Vec<(String, Vec<&str>)> = names
        .iter()
        .map(|f| (f.clone(), vec![f.as_str()]))
        .collect();
    if names.len() > 1 {
        runs.push((
            "all feeds together".into(),
            names.iter().map(String::as_str).collect(),
        ));
    }
    let mut outcomes = Vec::new();
    for (name, feeds) in &runs {
        for (feed, cp) in &saved {
            store
                .save_checkpoint(feed, cp.clone(), Durability::Journaled)
                .await?;
        }
        outcomes.push(catch_up(&store, &config, name, feeds, (last, n), timeout).await?);
    }

    for o in &outcomes {
        let s = o.slices.summary();
        let rate = n as f64 * o.feeds.len() as f64 / o.secs.max(1e-9);
        report.series.push(Series {
            name: o.name.clone(),
            params: json!({"feeds": o.feeds.iter().map(|f| json!({"name": f.name, "kind": f.kind})).collect::<Vec<_>>(),
                           "behind": n, "dataset": dataset.as_str()}),
            latency_us: s,
            ops: o.feeds.iter().map(|f| f.held).sum(),
            failures: u64::from(!o.caught_up),
            elapsed_secs: o.secs,
            throughput_per_sec: rate,
            extra: json!({
                "latency_is": "µs per event over each 20 ms sample with progress (the slowest feed of the run)",
                "caught_up": o.caught_up,
                "time_to_lag_0_secs": o.caught_up.then_some(o.secs),
                "events_per_sec_per_feed": n as f64 / o.secs.max(1e-9),
                "wall_us_per_event": o.secs * 1e6 / (n as f64 * o.feeds.len() as f64),
                "cpu_secs": o.usage.cpu_secs,
                "cpu_us_per_event": o.usage.per_event(n * o.feeds.len() as u64).0,
                "written_bytes": o.usage.write_bytes,
                "feeds": o.feeds.iter().map(|f| json!({
                    "feed": f.name, "kind": f.kind, "time_to_lag_0_secs": f.secs,
                    "events_per_sec": f.secs.map(|t| n as f64 / t.max(1e-9)),
                    "held": f.held, "gaps": f.gaps, "restarts": f.restarts,
                })).collect::<Vec<_>>(),
            }),
            ..Series::default()
        });
        for f in &o.feeds {
            if names.len() > 1 && o.feeds.len() > 1 {
                continue;
            }
            report.targets.push(Target::at_least(
                format!(
                    "{} ({}) catches up ≥ 55,000 events/s (faster than issue 10's first ingest target, or a feed behind never catches up)",
                    f.name, f.kind
                ),
                f.secs.map_or(0.0, |t| n as f64 / t.max(1e-9)),
                TARGET_RATE,
                "docs/s",
            ));
        }
    }
    let (load_cpu, load_bytes) = load_usage.per_event(n);
    report.notes.push(format!(
        "loading {} events with no feed running took {:.1} s ({}, acknowledged, through the ingester; per event {} µs of CPU and {} bytes written to storage)",
        thousands(n),
        load_secs,
        fmt_rate(n as f64 / load_secs.max(1e-9)),
        load_cpu.map_or_else(|| "?".into(), |c| format!("{c:.1}")),
        load_bytes.map_or_else(|| "?".into(), |b| thousands(b as u64)),
    ));
    report.params["load"] = json!({
        "secs": load_secs, "per_sec": n as f64 / load_secs.max(1e-9),
        "cpu_us_per_event": load_cpu, "written_bytes_per_event": load_bytes,
    });
    report.notes.push(
        "CPU time is the whole process's over the run: the feed(s), the checkpoints and stats documents they write (the writer thread), the sampler".into(),
    );
    for o in outcomes.iter().filter(|o| !o.caught_up) {
        report.notes.push(format!(
            "{}: not caught up after {} s",
            o.name,
            timeout.as_secs()
        ));
    }

    let lag_lines: Vec<(String, Vec<(f64, f64)>)> = outcomes
        .iter()
        .flat_map(|o| o.lag_lines.iter().cloned())
        // A line needs two points to be drawn.
        .filter(|(_, p)| p.len() >= 2)
        .collect();
    if !lag_lines.is_empty() {
        let file = "catchup-lag.svg";
        plot::timeline(
            &bench.out.join(file),
            "catchup: events still behind, from the feed's start",
            ("seconds since the feed started", "events behind"),
            &lag_lines,
        )?;
        report.plots.push(file.into());
    }
    let cost_lines: Vec<Line<'_>> = outcomes
        .iter()
        .map(|o| Line {
            name: o.name.clone(),
            values: o.slices.as_slice(),
        })
        .collect();
    report.plots.extend(plot::latency_pair(
        &bench.out,
        "catchup-cost",
        "catchup: µs per event along the catch-up",
        &cost_lines,
    )?);

    report.print_header();
    let mut t = Table::new(&[
        "feeds",
        "behind",
        "time to lag 0",
        "events/s per feed",
        "wall µs/event",
        "CPU µs/event",
        "written",
        "slice p50",
        "slice p99",
        "gaps",
    ]);
    for (s, o) in report.series.iter().zip(&outcomes) {
        t.row(vec![
            o.name.clone(),
            thousands(n),
            if o.caught_up {
                format!("{:.2} s", o.secs)
            } else {
                format!("> {:.0} s", o.secs)
            },
            fmt_rate(n as f64 / o.secs.max(1e-9)),
            format!(
                "{:.2}",
                s.extra["wall_us_per_event"].as_f64().unwrap_or(f64::NAN)
            ),
            s.extra["cpu_us_per_event"]
                .as_f64()
                .map_or_else(|| "—".into(), |v| format!("{v:.2}")),
            o.usage
                .write_bytes
                .map_or_else(|| "—".into(), |b| fmt_bytes(b as f64)),
            fmt_us(s.latency_us.p50),
            fmt_us(s.latency_us.p99),
            o.feeds.iter().map(|f| f.gaps).sum::<u64>().to_string(),
        ]);
    }
    t.print();
    report.print_footer();

    store.close().await?;
    drop(store);
    super::remove_dir(&dir);
    Ok(report)
}
