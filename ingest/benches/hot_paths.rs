//! Micro-benchmarks of the per-event hot paths (criterion): `cargo bench -p ingest`.
//!
//! - `validate_and_stamp`: what the ingester does to one NDJSON event before it is written —
//!   parse and validate it, stamp it, derive its rollup updates;
//! - `rolling_stats_update`: what a feed does per event — read the stamp, fold the event into
//!   the rate, Bollinger bands, top-k and sequence tracker (snapshots are taken per tick, not
//!   per event);
//! - `encode_batch_256`: what the embedded engine does per batch — encode 256 stamped events
//!   as JSON text, with sonic-rs as `store`'s `format::write_doc` does;
//! - `coalesce_batch_1000`: what the rollups stage does per batch — merge the counter updates
//!   of 1,000 long-tail events (the realistic source's default shape: hashtags Zipf over
//!   2,000,000 values) into one update per key;
//! - `geo_stamp_1000`: what placing costs per batch of 1,000 realistic events — the
//!   synthetic preset's rules (their GeoJSON point, else their language's likely country)
//!   and the stamp's `geo` value; per event, a thousandth of it (issue's budget: 0.5 µs);
//! - `document_types_1000`: parse, read two fields of, encode and drop 1,000 realistic events,
//!   as the pipeline's documents (`serde_json`'s map) and as sonic-rs's `Value`: the share of
//!   an event's cost a cheaper document type could take away.
//!
//! Kept cheap to compile (criterion without rayon, plots or HTML reports): CI builds this file
//! on every `cargo clippy --all-targets`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use feeds::stats::{Event, RollingStats, StatsConfig};
use ingest::ingester::{IngestOptions, coalesce_counters, rollups, validate};
use ingest::source::Raw;
use ingest::source::realistic::{Realistic, Shape};
use ingest::source::synthetic::Generator;
use serde_json::json;
use store::{Document, Durability, STAMP_FIELD, Stamp};

fn options() -> IngestOptions {
    IngestOptions {
        batch_max_events: 256,
        batch_max_wait: Duration::from_millis(5),
        max_event_bytes: 64 * 1024,
        rollup_fields: vec!["lang".into(), "hashtags".into()],
        summary_fields: vec!["retweet_count".into(), "hashtags".into()],
        durability: Durability::Journaled,
        geo: Default::default(),
    }
}

fn stamped(g: &mut Generator, seq: u64) -> Document {
    let mut v = g.event();
    v[STAMP_FIELD] = json!({"source": "bench", "seq": seq, "received_us": 1_700_000_000_000_000i64 + seq as i64, "ingested_us": 0});
    v.as_object().cloned().unwrap_or_default()
}

fn validate_and_stamp(c: &mut Criterion) {
    let mut g = Generator::new(1);
    let line = serde_json::to_vec(&g.event()).unwrap_or_default();
    let o = options();
    let mut seq = 0u64;
    c.bench_function("validate_and_stamp", |b| {
        b.iter(|| {
            seq += 1;
            let mut doc = match validate(Raw::Bytes(black_box(line.clone())), o.max_event_bytes) {
                Ok(doc) => doc,
                Err(_) => return 0,
            };
            let stamp = Stamp {
                source: "bench".into(),
                seq,
                received_us: 1,
                ingested_us: 2,
                position: None,
            };
            doc.insert(STAMP_FIELD.into(), stamp.to_value());
            let mut updates = Vec::with_capacity(4);
            rollups(&doc, "bench", &o, &mut updates);
            black_box(&doc);
            updates.len()
        })
    });
}

fn rolling_stats_update(c: &mut Criterion) {
    let mut g = Generator::new(2);
    let docs: Vec<Document> = (1..=1024).map(|s| stamped(&mut g, s)).collect();
    let mut stats = RollingStats::new(&StatsConfig::default(), "bench");
    let mut i = 0usize;
    c.bench_function("rolling_stats_update", |b| {
        b.iter(|| {
            let doc = black_box(&docs[i % docs.len()]);
            i += 1;
            let stamp = Stamp::of(doc);
            let t_us = stamp.as_ref().map_or(0, |s| s.received_us);
            stats.on_event(&Event {
                t_us,
                stamp: stamp.as_ref(),
                doc,
            });
            black_box(stats.events())
        })
    });
}

fn encode_batch(c: &mut Criterion) {
    let mut g = Generator::new(3);
    let batch: Vec<Document> = (1..=256).map(|s| stamped(&mut g, s)).collect();
    c.bench_function("encode_batch_256", |b| {
        b.iter(|| {
            let mut bytes = 0usize;
            for doc in black_box(&batch) {
                bytes += sonic_rs::to_string(doc).map(|s| s.len()).unwrap_or(0);
            }
            bytes
        })
    });
}

fn coalesce_batch(c: &mut Criterion) {
    let mut g = Realistic::new(5, Shape::default());
    let o = options();
    // Past the first batches, as a running stream is: its counters' keys are a long tail.
    let batch: Vec<Document> = (1..=1000)
        .map(|seq| {
            let mut v = g.event("2026-12-04T00:00:00Z");
            v[STAMP_FIELD] = json!({"source": "bench", "seq": seq});
            v.as_object().cloned().unwrap_or_default()
        })
        .collect();
    let mut updates = Vec::new();
    for doc in &batch {
        rollups(doc, "bench", &o, &mut updates);
    }
    c.bench_function("coalesce_batch_1000", |b| {
        b.iter_batched(
            || updates.clone(),
            |mut u| {
                coalesce_counters(&mut u);
                u.len()
            },
            criterion::BatchSize::LargeInput,
        )
    });
}

/// Parses, reads, encodes and drops 1,000 realistic events with the document type the pipeline
/// uses (`serde_json`'s map) and with sonic-rs's own `Value`: what a cheaper document type
/// would save on the work every event pays (docs/results/insert-profile-2026-12-04.md).
fn document_types(c: &mut Criterion) {
    let mut g = Realistic::new(7, Shape::default());
    let lines: Vec<Vec<u8>> = (0..1000)
        .map(|_| serde_json::to_vec(&g.event("2026-12-04T00:00:00Z")).unwrap_or_default())
        .collect();
    let mut group = c.benchmark_group("document_types_1000");
    group.bench_function("serde_json_map", |b| {
        let mut out = Vec::with_capacity(1 << 10);
        b.iter(|| {
            let mut n = 0usize;
            for line in black_box(&lines) {
                let Ok(doc) = serde_json::from_slice::<Document>(line) else {
                    continue;
                };
                n += doc.get("lang").and_then(|v| v.as_str()).map_or(0, str::len);
                n += doc
                    .get("hashtags")
                    .and_then(|v| v.as_array())
                    .map_or(0, Vec::len);
                out.clear();
                let _ = sonic_rs::to_writer(&mut out, &doc);
                n += out.len();
            }
            n
        })
    });
    group.bench_function("sonic_rs_value", |b| {
        use sonic_rs::{JsonContainerTrait, JsonValueTrait};
        let mut out = Vec::with_capacity(1 << 10);
        b.iter(|| {
            let mut n = 0usize;
            for line in black_box(&lines) {
                let Ok(doc) = sonic_rs::from_slice::<sonic_rs::Value>(line) else {
                    continue;
                };
                n += doc.get("lang").and_then(|v| v.as_str()).map_or(0, str::len);
                n += doc
                    .get("hashtags")
                    .and_then(|v| v.as_array())
                    .map_or(0, |a| a.len());
                out.clear();
                let _ = sonic_rs::to_writer(&mut out, &doc);
                n += out.len();
            }
            n
        })
    });
    group.finish();
}

fn geo_stamp(c: &mut Criterion) {
    let mut g = Realistic::new(7, Shape::default());
    let events: Vec<Document> = (0..1000)
        .map(|_| {
            let v = g.event("2026-12-04T00:00:00Z");
            v.as_object().cloned().unwrap_or_default()
        })
        .collect();
    let rules = ingest::geo::GeoConfig {
        point: Some("coordinates".into()),
        language: Some("lang".into()),
        ..Default::default()
    };
    c.bench_function("geo_stamp_1000", |b| {
        b.iter(|| {
            let mut placed = 0;
            for doc in &events {
                if let Some(geo) = rules.locate(black_box(doc)) {
                    let mut stamp = serde_json::Map::new();
                    stamp.insert("geo".to_owned(), geo.to_value());
                    placed += stamp.len();
                }
            }
            placed
        })
    });
}

criterion_group! {
    name = hot_paths;
    // Short runs: these are regression signals, not publication figures.
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = validate_and_stamp, rolling_stats_update, encode_batch, coalesce_batch, geo_stamp, document_types
}
criterion_main!(hot_paths);
