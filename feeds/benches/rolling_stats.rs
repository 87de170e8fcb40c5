//! Per-event cost of a feed's whole statistics path — [`Stamp::of`] and
//! [`RollingStats::on_event`]: rate, Bollinger bands, top-k, sequence tracking, as a feed
//! runs them on every event — as the number of distinct top-k values grows from 10^2 to
//! 10^7: `cargo bench -p feeds --bench rolling_stats`.
//!
//! The stream is the flat-out case: 50,000 events/s, each a stamped tweet-like document
//! whose `hashtags` (the default top-k field) holds one value drawn uniformly from `n`
//! (uniform is the worst case: every value is as likely to be new), with the default
//! statistics settings (window 60 s, k 10, 1,024 counters per second). The statistics are
//! first fed a whole window (61 s of events) so the measurement is the steady state.
//!
//! - `on_event/<n>`: one event — its document rewritten as the next event would bring it (a
//!   new hashtag, sequence number and time), its stamp read, and folded into every statistic;
//! - `docgen/<n>`: the rewrite alone, to subtract from `on_event`;
//! - `tick/<n>`: what a feed does once per checkpoint interval, not per event: the snapshot,
//!   the saved state and its JSON encoding (the checkpoint written). The size of that JSON
//!   is printed after filling.
//!
//! Kept cheap to compile (criterion without rayon, plots or HTML reports), as
//! `clippy --all-targets` builds it.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use feeds::stats::{Event, RollingStats, StatsConfig};
use serde_json::{Value, json};
use store::{Document, STAMP_FIELD, Stamp};

/// Events per second of the flat-out case.
const RATE: i64 = 50_000;
/// Microseconds between two events at [`RATE`].
const STEP_US: i64 = 1_000_000 / RATE;
/// Distinct values the hashtags are drawn from.
const CARDINALITIES: [u64; 6] = [100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000];

/// A seeded stream of stamped tweets whose one hashtag is `tag<i>`, `i` uniform in `0..n`,
/// rewritten in place in one document.
struct Stream {
    state: u64,
    n: u64,
    seq: u64,
    t_us: i64,
    doc: Document,
}

impl Stream {
    fn new(n: u64) -> Self {
        let doc = json!({
            "id": 1_700_000_000_000_000_001u64,
            "created_at": "2026-11-29T12:00:00.000Z",
            "user": {"id": 42, "screen_name": "user42", "followers_count": 1234},
            "lang": "en",
            "text": "what a day for data #tag0",
            "hashtags": ["tag0"],
            "retweet_count": 3,
            STAMP_FIELD: {"source": "bench", "seq": 0, "received_us": 0, "ingested_us": 0},
        });
        Self {
            state: 0x5EED ^ n,
            n,
            seq: 0,
            t_us: 1_700_000_000_000_000,
            doc: doc.as_object().cloned().unwrap_or_default(),
        }
    }

    /// Rewrites the document into the next event: a new hashtag, sequence number and time.
    fn next_event(&mut self) {
        // splitmix64, then a multiply-shift into 0..n.
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let i = ((u128::from(z) * u128::from(self.n)) >> 64) as u64;
        self.seq += 1;
        self.t_us += STEP_US;
        self.doc
            .insert("hashtags".into(), json!([format!("tag{i}")]));
        if let Some(Value::Object(stamp)) = self.doc.get_mut(STAMP_FIELD) {
            stamp.insert("seq".into(), self.seq.into());
            stamp.insert("received_us".into(), self.t_us.into());
        }
    }
}

/// The statistics of one feed and the stream feeding them.
struct Fed {
    stats: RollingStats,
    stream: Stream,
}

impl Fed {
    fn filled(n: u64) -> Self {
        let config = StatsConfig::default();
        let mut f = Self {
            stats: RollingStats::new(&config, "bench"),
            stream: Stream::new(n),
        };
        for _ in 0..(config.topk_window_secs as i64 + 1) * RATE {
            f.event();
        }
        eprintln!(
            "n={n}: checkpoint state {} bytes after a full window",
            serde_json::to_vec(&f.stats.save()).map_or(0, |v| v.len())
        );
        f
    }

    /// One event as a feed processes it.
    fn event(&mut self) {
        self.stream.next_event();
        let doc = black_box(&self.stream.doc);
        let stamp = Stamp::of(doc);
        let t_us = stamp.as_ref().map_or(0, |s| s.received_us);
        self.stats.on_event(&Event {
            t_us,
            stamp: stamp.as_ref(),
            doc,
        });
    }

    /// What a feed does once per tick and checkpoint interval: the snapshot, the metrics
    /// published from it, and the checkpoint's state encoded.
    fn tick(&mut self) -> usize {
        let snapshot = self.stats.snapshot();
        self.stats.publish(&snapshot);
        let state = self.stats.save();
        black_box(&snapshot);
        serde_json::to_vec(&state).map_or(0, |v| v.len())
    }
}

fn rolling_stats(c: &mut Criterion) {
    let mut docgen = c.benchmark_group("docgen");
    docgen
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for n in CARDINALITIES {
        let mut stream = Stream::new(n);
        docgen.bench_function(BenchmarkId::from_parameter(n), |b| {
            b.iter(|| {
                stream.next_event();
                black_box(stream.doc.len())
            })
        });
    }
    docgen.finish();
    for n in CARDINALITIES {
        // Filled once per cardinality, inside the first benchmark that needs it, so a filtered
        // run (`-- tick/`) fills only what it measures.
        let mut fed: Option<Fed> = None;
        let mut on_event = c.benchmark_group("on_event");
        on_event
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(3));
        on_event.bench_function(BenchmarkId::from_parameter(n), |b| {
            let f = fed.get_or_insert_with(|| Fed::filled(n));
            b.iter(|| f.event())
        });
        on_event.finish();
        let mut tick = c.benchmark_group("tick");
        tick.sample_size(20)
            .warm_up_time(Duration::from_millis(300))
            .measurement_time(Duration::from_secs(2));
        tick.bench_function(BenchmarkId::from_parameter(n), |b| {
            let f = fed.get_or_insert_with(|| Fed::filled(n));
            b.iter(|| f.tick())
        });
        tick.finish();
    }
}

criterion_group!(benches, rolling_stats);
criterion_main!(benches);
