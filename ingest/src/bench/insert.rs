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
//! Each variant gets a fresh store. Events are handed over as NDJSON bytes (what the http,
//! file and command sources hand over), pre-encoded so the producer costs nothing. The
//! latency per iteration is the `events` append of each batch, measured by wrapping the
//! collection (the ingester itself is unchanged).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::{Value, json};
use store::{Capped, CappedSpec, Document, Durability, Position, Record, RecordStream, Start};
use tokio::sync::mpsc;

use super::floors::{self, Floor};
use super::measure::{Samples, fmt_rate, fmt_ratio, fmt_us, thousands};
use super::plot::{self, Line};
use super::report::{Report, Series, Table, Target};
use super::writes::events_like;
use super::{Bench, BenchError, Result, Scenario, new_report};
use crate::ingester::{Handed, IngestOptions, IngestStats, Ingester};
use crate::source::Raw;
use crate::source::synthetic::Generator;
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

/// A capped collection that times each `append` (the ingester's batch write) and otherwise
/// is the collection it wraps.
struct TimedCapped {
    inner: Arc<dyn Capped>,
    /// (µs, documents) per successful append, in order.
    appends: Arc<Mutex<Vec<(f64, usize)>>>,
}

#[async_trait]
impl Capped for TimedCapped {
    fn name(&self) -> &str {
        self.inner.name()
    }
    async fn append(&self, docs: Vec<Document>, d: Durability) -> store::Result<Vec<Position>> {
        let n = docs.len();
        let t = Instant::now();
        let out = self.inner.append(docs, d).await;
        if out.is_ok()
            && let Ok(mut a) = self.appends.lock()
        {
            a.push((t.elapsed().as_nanos() as f64 / 1e3, n));
        }
        out
    }
    fn tail(&self, start: Start) -> RecordStream {
        self.inner.tail(start)
    }
    fn tail_matching(&self, start: Start, filter: store::Filter) -> RecordStream {
        self.inner.tail_matching(start, filter)
    }
    async fn newest_matching(
        &self,
        filter: &store::Filter,
        limit: usize,
    ) -> store::Result<store::NewestMatching> {
        self.inner.newest_matching(filter, limit).await
    }
    async fn get(&self, p: Position) -> store::Result<Option<Record>> {
        self.inner.get(p).await
    }
    async fn latest(&self, f: &str, v: &Value, limit: usize) -> store::Result<Vec<Record>> {
        self.inner.latest(f, v, limit).await
    }
    async fn bounds(&self) -> store::Result<Option<store::Bounds>> {
        self.inner.bounds().await
    }
    async fn usage(&self) -> store::Result<store::Usage> {
        self.inner.usage().await
    }
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
}

async fn variant(
    bench: &Bench,
    random: bool,
    batched: bool,
    docs: u64,
    time_box: Option<Duration>,
) -> Result<Outcome> {
    let name = format!(
        "{}, {}",
        if random { "random" } else { "static" },
        if batched { "batched" } else { "single" }
    );
    let dir_name = format!(
        "insert-{}-{}",
        if random { "random" } else { "static" },
        if batched { "batched" } else { "single" }
    );
    let c = &bench.config;
    let store = bench.open_store(&dir_name).await?;
    let events = store
        .capped(
            "bench_insert_events",
            &events_like(bench, (docs / 2).max(1000)),
        )
        .await?;
    let dead_spec = CappedSpec {
        max_docs: c.store.dead_letters.max_docs,
        max_bytes: c.store.dead_letters.max_bytes,
        indexes: vec!["source".into(), "reason".into()],
    };
    let dead_letters = store.capped("bench_insert_dead", &dead_spec).await?;
    let rollups = store.keyed("bench_insert_rollups").await?;
    let appends = Arc::new(Mutex::new(Vec::new()));
    let stats = Arc::new(IngestStats::default());
    let ingester = Ingester {
        events: Arc::new(TimedCapped {
            inner: events.clone(),
            appends: appends.clone(),
        }),
        dead_letters,
        rollups: rollups.clone(),
        // The pipeline's own options, so the bench cannot drift from production; only the
        // batch size (single client) and the durability (always journaled) are the bench's.
        options: IngestOptions {
            batch_max_events: if batched {
                c.ingest.batch_max_events
            } else {
                1
            },
            durability: Durability::Journaled,
            ..crate::pipeline::ingest_options(c)
        },
        engine: store.engine(),
        stats: stats.clone(),
    };

    // Pre-encoded NDJSON lines, so the producer only hands them over.
    let mut g = Generator::new(if random { 21 } else { 22 });
    let payloads: Vec<Vec<u8>> = if random {
        (0..docs)
            .map(|_| serde_json::to_vec(&g.event()).unwrap_or_default())
            .collect()
    } else {
        let one = serde_json::to_vec(&g.event()).unwrap_or_default();
        vec![one; docs as usize]
    };
    let source: Arc<str> = Arc::from("bench");
    // A single client waits for each event's acknowledgment before sending the next: a
    // queue of one. Batched clients may have the whole configured queue in flight.
    let capacity = if batched { c.ingest.queue_capacity } else { 1 };
    let (tx, rx) = mpsc::channel::<Handed>(capacity);
    let pb = bench.progress(docs, &format!("insert {name}"));
    let started = Instant::now();
    let run = tokio::spawn(ingester.run(rx));
    let mut sent = 0u64;
    let mut time_boxed = false;
    for p in payloads {
        if let Some(limit) = time_box
            && started.elapsed() >= limit
        {
            time_boxed = true;
            break;
        }
        stats.queue_depth.fetch_add(1, Ordering::Relaxed);
        let handed = Handed {
            source: source.clone(),
            raw: Raw::Bytes(p),
            received_us: now_us(),
        };
        if tx.send(handed).await.is_err() {
            return Err(BenchError::Scenario("the ingester stopped early".into()));
        }
        sent += 1;
        if sent.is_multiple_of(1024) {
            pb.set_position(sent);
        }
    }
    drop(tx);
    run.await
        .map_err(|e| BenchError::Scenario(format!("ingester task: {e}")))?;
    let secs = started.elapsed().as_secs_f64();
    pb.finish_and_clear();

    // Every event went through: the source's rollup counted each one.
    let counted = rollups
        .get("source:bench")
        .await?
        .and_then(|d| d.get("count").and_then(Value::as_u64))
        .unwrap_or(0);
    let written = stats.written.load(Ordering::Relaxed) as u64;
    if counted != sent || written != sent {
        return Err(BenchError::Scenario(format!(
            "insert {name}: sent {sent} events, the ingester wrote {written} and the rollup counted {counted}"
        )));
    }
    let recorded = appends.lock().map(|a| a.clone()).unwrap_or_default();
    let mut samples = Samples::with_capacity(recorded.len());
    for (us, _) in &recorded {
        samples.push_us(*us);
    }
    let docs_per_append =
        recorded.iter().map(|a| a.1).sum::<usize>() as f64 / recorded.len().max(1) as f64;
    drop(events);
    drop(rollups);
    store.close().await?;
    drop(store);
    super::remove_dir(&bench.data_dir(&dir_name));
    Ok(Outcome {
        name,
        random,
        batched,
        sent,
        secs,
        appends: samples,
        docs_per_append,
        time_boxed,
    })
}

/// Runs the scenario.
pub async fn run(bench: &Bench) -> Result<Report> {
    let docs = bench.docs(100_000, 300);
    let time_box = bench.duration(Duration::from_secs(10), Duration::from_millis(300));
    let n_floor = bench.iterations(1000, 20);
    let mut report = new_report(
        bench,
        Scenario::Insert,
        &format!(
            "{} events through the ingester (validate, stamp, capped events, change log, rollups), journaled",
            thousands(docs)
        ),
    );
    let c = &bench.config;
    report.params = json!({
        "docs": docs, "durability": "journaled", "batch_max_events": c.ingest.batch_max_events,
        "batch_max_wait_ms": c.ingest.batch_max_wait_ms, "rollup_fields": c.ingest.rollup_fields,
        "events_max_docs": (docs / 2).max(1000), "single_client_time_box_secs": time_box.as_secs_f64(),
        "handed_over_as": "NDJSON bytes (parsed and validated by the ingester)",
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
        report.series.push(Series {
            name: o.name.clone(),
            params: json!({"content": if o.random { "random" } else { "static" },
                           "client": if o.batched { "batched" } else { "single" }}),
            latency_us: s,
            ops: o.sent,
            elapsed_secs: o.secs,
            throughput_per_sec: o.sent as f64 / o.secs.max(1e-9),
            floor: Some("fdatasync_512b".into()),
            ratio_to_floor: Some(s.p50 / floor_p50),
            extra: json!({"latency_is": "one events append (a batch) as the ingester waits for it",
                          "docs_per_append": o.docs_per_append, "time_boxed": o.time_boxed}),
            ..Series::default()
        });
    }
    report.references(&REFERENCES);
    if let Some(s) = report.series.iter().find(|s| s.name == "random, batched") {
        report.targets.push(Target::at_least(
            "random content, batched, journaled ≥ 100,000 docs/s through the ingester",
            s.throughput_per_sec,
            100_000.0,
            "docs/s",
        ));
    }
    if outcomes.iter().any(|o| o.time_boxed) {
        report.notes.push(format!(
            "single-client variants stopped after {} (--duration); their rate is over the documents written by then",
            humantime::format_duration(time_box)
        ));
    }

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
    ]);
    for (s, o) in report.series.iter().zip(&outcomes) {
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
        ]);
    }
    t.print();
    report.print_footer();
    Ok(report)
}
