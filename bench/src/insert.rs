//! `insert`: 100,000 events as fast as possible through the **real write path** — the
//! [`Ingester`] with validation, stamping, the capped `events` collection (capped at half the
//! run, so eviction runs through the second half), the change log and the `rollups`
//! counters, every write `journaled` — the MongoDB 1.0 / MySQL bulk-insert experiment.
//!
//! Four variants: random content (each event a different synthetic tweet) or static (one
//! event repeated: fewer distinct rollup keys, same bytes); single client (every event
//! written and acknowledged on its own, `batch_max_events = 1`, like one insert call per
//! document) or batched (the configured `ingest.batch_max_events`). The single-client
//! variants are time-boxed (`--duration`): one fsync-bound commit per event would take minutes.
//!
//! The content comes from `--dataset` ([`super::dataset`]): `realistic` (the default; long-tail
//! hashtags and users, every script) or `small` (the original synthetic tweets).
//!
//! **End to end**: the configured feeds (by default a tailable feed on `events` and a change
//! feed on the rollups) run during every variant, as in the pipeline ([`super::observe`]).
//! Beside the writer's rate each variant reports, per feed, its lag in events (the largest,
//! sampled every 10 ms, and the lag when the writer finished), its notification latency
//! (commit → the feed holds the event) over the run, and when it had caught up (held the
//! last event); the feeds' rate is the events over the time until both had.
//!
//! Each variant runs the library's [`Pipeline`] on a fresh store, with one source handing over
//! NDJSON bytes (what the http, file and command sources hand over), pre-encoded so the
//! producer costs nothing. The latency per iteration is the `events` write of each batch as
//! the ingester waited for it, told by the ingester ([`WriteObserver`]).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ingest::config::Config;
use ingest::ingester::WriteObserver;
use ingest::pipeline::Pipeline;
use serde_json::{Value, json};
use store::Durability;

use super::dataset::Docs;
use super::floors::{self, Floor};
use super::handed::{Records, SOURCE};
use super::machine::Usage;
use super::measure::{Samples, Summary, fmt_bytes, fmt_rate, fmt_ratio, fmt_us, thousands};
use super::observe::{self, Sampler, Timeline};
use super::plot::{self, Line};
use super::report::{Report, Series, Table, Target};
use super::writes::events_like;
use super::{Bench, BenchError, Result, Scenario, new_report};
use ingest::source::Raw;
use store::clock::now_us;

/// Published bulk-insert rates.
pub const REFERENCES: [(&str, &str, f64, &str); 3] = [
    (
        "MongoDB 1.0, Ruby driver",
        "100,000 inserts",
        5_990.0,
        "docs/s",
    ),
    (
        "MongoDB 1.0, mongo shell",
        "100,000 inserts",
        9_623.0,
        "docs/s",
    ),
    ("MySQL", "100,000 inserts", 4_044.0, "rows/s"),
];

/// The `events` write of each batch as the ingester waited for it: (µs, events).
#[derive(Default)]
struct Appends(Mutex<Vec<(f64, usize)>>);

impl WriteObserver for Appends {
    fn events_written(&self, events: usize, _: Durability, latency: Duration) {
        if let Ok(mut a) = self.0.lock() {
            a.push((latency.as_nanos() as f64 / 1e3, events));
        }
    }
}

/// How long the feeds may take to hold the last event after the writer finished.
const FEEDS_CATCH_UP: Duration = Duration::from_secs(120);
/// How often feed lag is sampled.
const LAG_EVERY: Duration = Duration::from_millis(10);

/// What one feed did during a variant.
struct FeedOutcome {
    name: String,
    kind: &'static str,
    /// Largest lag sampled (events).
    lag_max: u64,
    /// Lag when the writer finished (events).
    lag_at_writer_end: u64,
    /// Seconds from the start of the variant until the feed held the last event; `None`
    /// when it had not within [`FEEDS_CATCH_UP`].
    caught_up_secs: Option<f64>,
    /// Commit → the feed holds the event, for events committed while the feed ran.
    notify: Samples,
    /// Gaps the feed recorded (it was overtaken by eviction) and stream restarts.
    gaps: u64,
    restarts: u64,
}

/// One variant's outcome.
struct Outcome {
    name: String,
    random: bool,
    batched: bool,
    sent: u64,
    secs: f64,
    appends: Samples,
    docs_per_append: f64,
    time_boxed: bool,
    feeds: Vec<FeedOutcome>,
    timeline: Timeline,
    /// What the process used from the first event handed over until the feeds held the last.
    usage: Usage,
}

impl Outcome {
    /// Seconds until every feed held the last event (`None`: one never did).
    fn all_caught_up_secs(&self) -> Option<f64> {
        self.feeds
            .iter()
            .map(|f| f.caught_up_secs)
            .try_fold(self.secs, |a, b| b.map(|b| a.max(b)))
    }
}

/// The configuration of one variant: its own store, `events` capped at half the run, every
/// write journaled; a single client writes each event alone through a queue of one.
fn variant_config(bench: &Bench, dir_name: &str, docs: u64, batched: bool) -> Config {
    let mut c = bench.store_config(dir_name);
    let spec = events_like(bench, (docs / 2).max(1000));
    c.store.events.max_docs = spec.max_docs;
    c.store.events.max_bytes = spec.max_bytes;
    c.store.durability = Durability::Journaled;
    c.sources.clear();
    if !batched {
        c.ingest.batch_max_events = 1;
        c.ingest.queue_capacity = 1;
    }
    c
}

async fn variant(
    bench: &Bench,
    random: bool,
    batched: bool,
    docs: u64,
    time_box: Option<Duration>,
) -> Result<Outcome> {
    let content = if random { "random" } else { "static" };
    let client = if batched { "batched" } else { "single" };
    let name = format!("{content}, {client}");
    let dir_name = format!("insert-{content}-{client}");
    // Pre-encoded NDJSON lines (what the http, file and command sources hand over), so the
    // source only hands them over.
    let mut g = Docs::new(bench.args.dataset, if random { 21 } else { 22 });
    let payloads: Vec<Raw> = if random {
        (0..docs)
            .map(|_| Raw::Bytes(serde_json::to_vec(&g.event()).unwrap_or_default()))
            .collect()
    } else {
        let one = serde_json::to_vec(&g.event()).unwrap_or_default();
        (0..docs).map(|_| Raw::Bytes(one.clone())).collect()
    };
    let pb = bench.progress(docs, &format!("insert {name}"));
    let mut records = Records::new(payloads.into_iter(), time_box, pb.clone());
    if !bench.args.unplaced {
        // The synthetic stream's preset, as `tailrace run` places the realistic stream.
        records = records.placed(ingest::geo::GeoConfig {
            point: Some("coordinates".into()),
            language: Some("lang".into()),
            ..Default::default()
        });
    }
    let handed = records.handed();

    let config = variant_config(bench, &dir_name, docs, batched);
    let mut pipeline = Pipeline::build(config, vec![Box::new(records)]).await?;
    let appends = Arc::new(Appends::default());
    pipeline.observe_writes(appends.clone());
    let watching = observe::watch(&mut pipeline);
    let stats = pipeline.ingest_stats().clone();
    let rollups = pipeline.collections().rollups.clone();
    let sampler = {
        let stats = stats.clone();
        Sampler::spawn(
            watching.probes(),
            move || stats.written.load(Ordering::Relaxed).max(0) as u64,
            LAG_EVERY,
        )
    };
    let before = Usage::now();
    let started = Instant::now();
    let started_us = now_us();
    let mut running = pipeline.start().await?;
    running.finished().await;
    let secs = started.elapsed().as_secs_f64();
    pb.finish_and_clear();
    let sent = handed.load(Ordering::Relaxed);

    // The writer is done: how far behind is each feed, and when does it hold the last event?
    let lag_at_writer_end: Vec<u64> = watching
        .feeds
        .iter()
        .map(|f| sent.saturating_sub(f.probe.last_seq()))
        .collect();
    watching.watch_for(sent);
    let all_held = watching.wait_for(sent, FEEDS_CATCH_UP).await;
    let usage = Usage::since(before);
    let timeline = sampler.finish().await;
    if !all_held {
        // A bench run has no metrics endpoint; the report's notes say it too.
        tracing::warn!(
            variant = %name,
            "a feed had not caught up {} s after the writer finished",
            FEEDS_CATCH_UP.as_secs()
        );
    }
    // Every event went through: the source's rollup counted each one.
    let counted = rollups
        .get(&format!("source:{SOURCE}"))
        .await?
        .and_then(|d| d.get("count").and_then(Value::as_u64))
        .unwrap_or(0);
    drop(rollups);
    let report = running.stop().await;
    if !report.is_clean() {
        return Err(BenchError::Scenario(format!(
            "insert {name}: the pipeline did not stop cleanly: {}",
            report.problems.join("; ")
        )));
    }
    let written = stats.written.load(Ordering::Relaxed) as u64;
    if counted != sent || written != sent {
        return Err(BenchError::Scenario(format!(
            "insert {name}: sent {sent} events, the ingester wrote {written} and the rollup counted {counted}"
        )));
    }
    let feeds = watching
        .feeds
        .iter()
        .zip(lag_at_writer_end)
        .enumerate()
        .map(|(i, (w, at_end))| {
            let status = w.handle.status();
            FeedOutcome {
                name: w.name.clone(),
                kind: w.kind,
                lag_max: timeline.max_lag(i).max(at_end),
                lag_at_writer_end: at_end,
                caught_up_secs: w
                    .probe
                    .reached_at_us()
                    .map(|t| ((t - started_us) as f64 / 1e6).max(secs)),
                notify: w.probe.latency(),
                gaps: status.gaps,
                restarts: status.restarts,
            }
        })
        .collect();
    let recorded = appends.0.lock().map(|a| a.clone()).unwrap_or_default();
    let mut samples = Samples::with_capacity(recorded.len());
    for (us, _) in &recorded {
        samples.push_us(*us);
    }
    let docs_per_append =
        recorded.iter().map(|a| a.1).sum::<usize>() as f64 / recorded.len().max(1) as f64;
    super::remove_dir(&bench.data_dir(&dir_name));
    Ok(Outcome {
        name,
        random,
        batched,
        sent,
        secs,
        appends: samples,
        docs_per_append,
        time_boxed: time_box.is_some() && sent < docs,
        feeds,
        timeline,
        usage,
    })
}

/// A feed's figures for the JSON.
fn feed_json(f: &FeedOutcome) -> Value {
    json!({
        "feed": f.name, "kind": f.kind, "lag_max_events": f.lag_max,
        "lag_at_writer_end_events": f.lag_at_writer_end, "caught_up_secs": f.caught_up_secs,
        "notification_us": f.notify.summary(), "gaps": f.gaps, "restarts": f.restarts,
    })
}

/// Runs the scenario.
pub async fn run(bench: &Bench) -> Result<Report> {
    let docs = bench.docs(100_000, 300);
    let time_box = bench.duration(Duration::from_secs(10), Duration::from_millis(300));
    let n_floor = bench.iterations(1000, 20);
    let dataset = bench.args.dataset;
    let mut report = new_report(
        bench,
        Scenario::Insert,
        &format!(
            "{} {} events through the ingester (validate, stamp, capped events, change log, rollups), journaled, with the feeds running",
            thousands(docs),
            dataset.as_str()
        ),
    );
    let c = &bench.config;
    report.params = json!({
        "docs": docs, "durability": "journaled", "batch_max_events": c.ingest.batch_max_events,
        "batch_max_wait_ms": c.ingest.batch_max_wait_ms, "rollup_fields": c.ingest.rollup_fields,
        "events_max_docs": (docs / 2).max(1000), "single_client_time_box_secs": time_box.as_secs_f64(),
        "handed_over_as": "NDJSON bytes (parsed and validated by the ingester)",
        "dataset": dataset.describe(),
        "feeds": c.feeds.iter().map(|f| json!({"name": f.name, "kind": f.kind()})).collect::<Vec<_>>(),
        "stats": c.stats,
        "lag_sampled_every_ms": LAG_EVERY.as_millis() as u64,
    });
    let floor_dir = bench.data_dir("insert-floor");
    let floor = floors::fdatasync(&floor_dir, n_floor).await?;
    super::remove_dir(&floor_dir);
    report.floors.push(Floor::new(
        "fdatasync_512b",
        "512-byte append + fdatasync on the data directory's disk",
        &floor,
    ));
    let floor_p50 = floor.summary().p50;

    let mut outcomes = Vec::new();
    for batched in [true, false] {
        for random in [true, false] {
            let boxed = (!batched).then_some(time_box);
            outcomes.push(variant(bench, random, batched, docs, boxed).await?);
        }
    }
    for o in &outcomes {
        let s = o.appends.summary();
        let caught_up = o.all_caught_up_secs();
        report.series.push(Series {
            name: o.name.clone(),
            params: json!({"content": if o.random { "random" } else { "static" },
                           "client": if o.batched { "batched" } else { "single" },
                           "dataset": dataset.as_str()}),
            latency_us: s,
            ops: o.sent,
            elapsed_secs: o.secs,
            throughput_per_sec: o.sent as f64 / o.secs.max(1e-9),
            floor: Some("fdatasync_512b".into()),
            ratio_to_floor: Some(s.p50 / floor_p50),
            extra: json!({"latency_is": "one events append (a batch) as the ingester waits for it",
                          "docs_per_append": o.docs_per_append, "time_boxed": o.time_boxed,
                          "feeds": o.feeds.iter().map(feed_json).collect::<Vec<_>>(),
                          "all_feeds_caught_up_secs": caught_up,
                          "cpu_secs": o.usage.cpu_secs,
                          "cpu_us_per_event": o.usage.per_event(o.sent).0,
                          "server_cpu_secs": o.usage.server_cpu_secs,
                          "server_cpu_us_per_event": o.usage.server_per_event(o.sent),
                          "written_bytes": o.usage.write_bytes,
                          "written_bytes_per_event": o.usage.per_event(o.sent).1,
                          "end_to_end_per_sec": caught_up.map(|t| o.sent as f64 / t.max(1e-9))}),
            ..Series::default()
        });
    }
    report.references(&REFERENCES);
    if let Some((s, o)) = report
        .series
        .iter()
        .zip(&outcomes)
        .find(|(s, _)| s.name == "random, batched")
    {
        report.targets.push(Target::at_least(
            "random content, batched, journaled ≥ 100,000 docs/s through the ingester",
            s.throughput_per_sec,
            100_000.0,
            "docs/s",
        ));
        report.targets.push(Target::at_least(
            "random content, batched, journaled, both feeds caught up: ≥ 55,000 events/s end to end",
            o.all_caught_up_secs()
                .map_or(0.0, |t| o.sent as f64 / t.max(1e-9)),
            55_000.0,
            "docs/s",
        ));
    }
    if outcomes.iter().any(|o| o.time_boxed) {
        report.notes.push(format!(
            "single-client variants stopped after {} (--duration); their rate is over the documents written by then",
            humantime::format_duration(time_box)
        ));
    }
    for o in &outcomes {
        for f in o.feeds.iter().filter(|f| f.caught_up_secs.is_none()) {
            report.notes.push(format!(
                "{}: feed {} had not caught up {} s after the writer finished",
                o.name,
                f.name,
                FEEDS_CATCH_UP.as_secs()
            ));
        }
        for f in o.feeds.iter().filter(|f| f.gaps > 0) {
            report.notes.push(format!(
                "{}: feed {} was overtaken by eviction {} time(s) and skipped events (gaps)",
                o.name, f.name, f.gaps
            ));
        }
    }
    report.notes.push(
        "CPU and bytes written are the whole process's (ingester, writer, feeds and their checkpoints) from the first event handed over until both feeds held the last, per event".into(),
    );
    report.notes.push(
        "feed lag is in events: the newest acknowledged sequence number less the highest the feed holds, sampled every 10 ms, and taken exactly when the writer finished".into(),
    );

    // One pair of plots per client mode: a batched run has a few hundred appends, a single
    // client tens of thousands, and on one axis the first would be a sliver.
    for (batched, prefix, title) in [
        (
            true,
            "insert-batched",
            "insert, batched: events append per batch",
        ),
        (
            false,
            "insert-single",
            "insert, single client: events append per event",
        ),
    ] {
        let lines: Vec<Line<'_>> = outcomes
            .iter()
            .filter(|o| o.batched == batched && !o.appends.is_empty())
            .map(|o| Line {
                name: o.name.clone(),
                values: o.appends.as_slice(),
            })
            .collect();
        if !lines.is_empty() {
            report
                .plots
                .extend(plot::latency_pair(&bench.out, prefix, title, &lines)?);
        }
    }
    let lag_lines: Vec<(String, Vec<(f64, f64)>)> = outcomes
        .iter()
        .filter(|o| o.batched)
        .flat_map(|o| {
            o.feeds
                .iter()
                .enumerate()
                .map(|(i, f)| (format!("{}: {}", o.name, f.name), o.timeline.lag_points(i)))
        })
        // A line needs two points to be drawn.
        .filter(|(_, pts)| pts.len() >= 2)
        .collect();
    if !lag_lines.is_empty() {
        let file = "insert-feed-lag.svg";
        plot::timeline(
            &bench.out.join(file),
            "insert, batched: feed lag while writing and catching up",
            ("seconds since the writer started", "lag (events)"),
            &lag_lines,
        )?;
        report.plots.push(file.into());
    }
    let notify_lines: Vec<Line<'_>> = outcomes
        .iter()
        .filter(|o| o.batched)
        .flat_map(|o| {
            o.feeds.iter().map(|f| Line {
                name: format!("{}: {}", o.name, f.name),
                values: f.notify.as_slice(),
            })
        })
        .filter(|l| !l.values.is_empty())
        .collect();
    if !notify_lines.is_empty() {
        let file = "insert-notify-cdf.svg";
        plot::cdf(
            &bench.out.join(file),
            "insert, batched: notification latency (commit → feed holds it) CDF",
            &notify_lines,
        )?;
        report.plots.push(file.into());
    }

    report.print_header();
    let mut t = Table::new(&[
        "content, client",
        "events",
        "seconds",
        "docs/s",
        "docs/append",
        "append p50",
        "p99",
        "max",
        "p50 ×fsync",
        "feeds caught up",
        "end to end/s",
        "CPU µs/event",
        "server CPU µs/event",
        "written/event",
    ]);
    for (s, o) in report.series.iter().zip(&outcomes) {
        let caught_up = o.all_caught_up_secs();
        t.row(vec![
            s.name.clone(),
            thousands(s.ops),
            format!("{:.2}", s.elapsed_secs),
            fmt_rate(s.throughput_per_sec),
            format!("{:.0}", o.docs_per_append),
            fmt_us(s.latency_us.p50),
            fmt_us(s.latency_us.p99),
            fmt_us(s.latency_us.max),
            s.ratio_to_floor.map(fmt_ratio).unwrap_or_default(),
            caught_up.map_or_else(|| "never".into(), |t| format!("{t:.2} s")),
            caught_up.map_or_else(|| "—".into(), |t| fmt_rate(o.sent as f64 / t.max(1e-9))),
            o.usage
                .per_event(o.sent)
                .0
                .map_or_else(|| "—".into(), |c| format!("{c:.1}")),
            o.usage
                .server_per_event(o.sent)
                .map_or_else(|| "—".into(), |c| format!("{c:.1}")),
            o.usage
                .per_event(o.sent)
                .1
                .map_or_else(|| "—".into(), fmt_bytes),
        ]);
    }
    t.print();
    let mut f = Table::new(&[
        "content, client",
        "feed",
        "lag max",
        "lag at writer end",
        "caught up at",
        "notify p50",
        "p99",
        "max",
        "gaps",
    ]);
    for o in &outcomes {
        for feed in &o.feeds {
            let n: Summary = feed.notify.summary();
            f.row(vec![
                o.name.clone(),
                format!("{} ({})", feed.name, feed.kind),
                thousands(feed.lag_max),
                thousands(feed.lag_at_writer_end),
                feed.caught_up_secs
                    .map_or_else(|| "never".into(), |t| format!("{t:.2} s")),
                fmt_us(n.p50),
                fmt_us(n.p99),
                fmt_us(n.max),
                feed.gaps.to_string(),
            ]);
        }
    }
    f.print();
    report.print_footer();
    Ok(report)
}
