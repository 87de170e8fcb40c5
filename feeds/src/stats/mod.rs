//! Rolling statistics recomputed on every event of a feed.
//!
//! A statistic is one file: a pure, synchronous core (table-tested against reference values),
//! an implementation of [`Statistic`] that reads its field from each event, adds its figures
//! to the feed's [`Snapshot`], publishes its metrics and saves its state in the feed's
//! checkpoint, and its [`Registration`]: how to build it, and which event fields it reads.
//! [`STATISTICS`] lists them; adding a statistic is one file plus one line there (and its
//! parameters in [`StatsConfig`], if it has any).
//!
//! Change feeds do not read the events: they read each source's `source:<name>` summary in
//! `rollups`, which the ingester updates once per event with the stamp and a copy of every
//! field a statistic declares ([`fields_read`]). So a statistic on a new field works on every
//! kind of feed without a change to the ingester.
//!
//! Every state is serde-serializable, so restoring a checkpoint and continuing gives exactly
//! the same results as never stopping, and bounded by the configured windows, not by the
//! length of the stream.
//!
//! | file | statistic | reads | snapshot fields | metrics |
//! |---|---|---|---|---|
//! | [`rate`] | events per closed second, Bollinger bands over it, breakouts from them | the stamp | `rate`, `rate_bands`, `trend`, `trend_changes` | `tailrace_rate_events_per_second`, `tailrace_bollinger{series="rate"}`, `tailrace_trend_changes_total{direction}` |
//! | [`bollinger`] | Bollinger bands over `value_field` | `value_field` | `value_bands` | `tailrace_bollinger{series="value"}` |
//! | [`topk`] (counted by [`heavy_hitters`]) | top-k values of `topk_field` over a sliding window | `topk_field` | `top` | `tailrace_topk_events` |
//! | [`value_trend`] (counted by [`heavy_hitters`]) | values of `trend_fields` whose count over the trailing minute breaks out of the band their share of the stream predicts | `trend_fields` | `value_trends` | `tailrace_value_trend_changes_total{field,direction}` |
//! | [`sequence`] | per-source sequence completeness | the stamp | `missing`, `duplicates`, `refused`, `last_outcome` | `tailrace_feed_missing_events_total`, `tailrace_feed_duplicate_events_total`, `tailrace_feed_refused_events_total` |

pub mod bollinger;
pub mod heavy_hitters;
pub mod rate;
pub mod sequence;
pub mod topk;
pub mod value_trend;

pub use bollinger::{Bands, Bollinger};
pub use rate::{RateSeries, RateUpdate};
pub use sequence::{SeqOutcome, SequenceTracker};
pub use topk::TopK;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use store::{Document, Stamp};

/// One event as the statistics see it.
#[derive(Clone, Copy, Debug)]
pub struct Event<'a> {
    /// Event time in microseconds since the Unix epoch: when the source handed it over (from
    /// its stamp), or else its commit time.
    pub t_us: i64,
    /// Its ingest stamp, if it has one (events written by tailrace do).
    pub stamp: Option<&'a Stamp>,
    /// The document (for a change feed: the change's post-image, or pre-image for a delete).
    pub doc: &'a Document,
}

/// A rolling statistic of a feed.
///
/// Calls: [`Statistic::on_event`] for every event in stream order; [`Statistic::advance`] when
/// time passes without events (a quiet, caught-up feed); [`Statistic::snapshot`] and
/// [`Statistic::publish`] about once per checkpoint interval (never per event, so they may cost
/// more than an event); [`Statistic::save`] with every checkpoint and [`Statistic::restore`]
/// once, when a feed resumes.
pub trait Statistic: Send + Sync + 'static {
    /// Its stable name: the key of its state in checkpoints.
    fn name(&self) -> &'static str;

    /// Folds one event in. Must not cost more with the number of distinct values seen.
    fn on_event(&mut self, e: &Event<'_>);

    /// Advances time to `now_us` without an event, so figures over time windows decay.
    fn advance(&mut self, now_us: i64);

    /// Adds its current figures to a snapshot, under the field names it documents.
    fn snapshot(&self, out: &mut Map<String, Value>);

    /// Publishes its current figures as metrics (handles registered when it was built).
    /// `figures` is the snapshot just taken, with what [`Statistic::snapshot`] added: a figure
    /// that costs a pass over the whole state (top-k's merge of its window) is computed once
    /// a tick, not once for the snapshot and again for the metrics.
    fn publish(&mut self, figures: &Map<String, Value>);

    /// What happened since the last call that deserves a document of its own (a breakout of
    /// the rate from its bands), oldest first; the feed writes each to the `trends`
    /// collection. None by default.
    fn take_changes(&mut self) -> Vec<StatChange> {
        Vec::new()
    }

    /// The sequence number expected next from `source`, for a statistic that tracks them
    /// (completeness); `None` by default. A feed asks before an event, to look up a gap.
    fn expected_seq(&self, _source: &str) -> Option<u64> {
        None
    }

    /// Of the numbers the next event skips, `refused` were refused by the store (kept as
    /// dead letters), not lost. Ignored by default.
    fn refused_before_next(&mut self, _refused: u64) {}

    /// Its whole state, for a checkpoint.
    fn save(&self) -> Value;

    /// Replaces its state with a saved one. On error the statistic is unchanged.
    fn restore(&mut self, state: &Value) -> Result<(), String>;
}

/// A change a statistic reports ([`Statistic::take_changes`]): a document and the key that
/// names it within its feed, the same when a replay after a restart meets the change again.
#[derive(Clone, Debug, PartialEq)]
pub struct StatChange {
    pub key: String,
    pub doc: Map<String, Value>,
}

/// A statistic as registered: how to build it for a feed, and which fields of an event it
/// reads.
pub struct Registration {
    /// Builds it for one feed (`feed` labels its metrics).
    pub build: fn(&StatsConfig, &str) -> Box<dyn Statistic>,
    /// The event fields it reads, as (its key in `[stats]`, the dotted path). The stamp
    /// (`_tailrace`) is always there and need not be named.
    pub reads: fn(&StatsConfig) -> Vec<(&'static str, String)>,
}

/// Every statistic: the one registration point.
pub const STATISTICS: [Registration; 5] = [
    rate::REGISTRATION,
    bollinger::REGISTRATION,
    topk::REGISTRATION,
    sequence::REGISTRATION,
    value_trend::REGISTRATION,
];

/// For a statistic that reads nothing but the stamp.
pub(crate) fn reads_nothing(_: &StatsConfig) -> Vec<(&'static str, String)> {
    Vec::new()
}

/// Every statistic of one feed, built from the configuration.
pub fn build(config: &StatsConfig, feed: &str) -> Vec<Box<dyn Statistic>> {
    STATISTICS.iter().map(|r| (r.build)(config, feed)).collect()
}

/// The event fields the statistics read, as (`[stats]` key, dotted path), each path once, in
/// registration order: what the ingester copies into every `source:<name>` summary.
pub fn fields_read(config: &StatsConfig) -> Vec<(&'static str, String)> {
    let mut out: Vec<(&'static str, String)> = Vec::new();
    for (key, path) in STATISTICS.iter().flat_map(|r| (r.reads)(config)) {
        if !out.iter().any(|(_, p)| *p == path) {
            out.push((key, path));
        }
    }
    out
}

fn default_period() -> usize {
    20
}
fn default_k() -> f64 {
    2.0
}
fn default_value_field() -> String {
    "retweet_count".to_owned()
}
fn default_topk() -> usize {
    10
}
fn default_topk_field() -> String {
    "hashtags".to_owned()
}
fn default_topk_window_secs() -> u64 {
    60
}
fn default_trend_fields() -> Vec<String> {
    vec!["hashtags".to_owned(), "lang".to_owned()]
}
fn default_trend_k() -> f64 {
    5.0
}
/// Fields whose values' trends are followed, at most: each costs a top-k window.
pub const MAX_TREND_FIELDS: usize = 8;
fn default_topk_capacity() -> usize {
    heavy_hitters::DEFAULT_CAPACITY
}
/// 10 s: a checkpoint carries the whole top-k window (tens of KB on a long-tail stream) and
/// is a journaled commit, so saving it every second cost a slow stream a good share of its
/// CPU. A restart replays what came after the checkpoint, which a feed reads far faster than
/// a source writes: ten seconds of a slow stream take milliseconds.
fn default_checkpoint_interval_ms() -> u64 {
    10_000
}
fn default_publish_interval_ms() -> u64 {
    1000
}

/// The statistics every feed computes (the `[stats]` table of the configuration).
///
/// Missing fields take their defaults and unknown fields are rejected, so a misspelt key
/// fails loudly instead of silently using a default.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct StatsConfig {
    /// Bollinger period N: the moving window, in points (seconds for the rate, events for the
    /// value field). At least 2. Default 20, Bollinger's own choice.
    #[serde(default = "default_period")]
    pub period: usize,
    /// Bollinger band width in standard deviations. Greater than 0. Default 2.0.
    #[serde(default = "default_k")]
    pub k: f64,
    /// Numeric field (dotted path) whose Bollinger bands are computed.
    #[serde(default = "default_value_field")]
    pub value_field: String,
    /// How many of the most frequent values of `topk_field` are reported. At least 1.
    #[serde(default = "default_topk")]
    pub topk: usize,
    /// Field (dotted path) whose most frequent values are counted; arrays count each element.
    #[serde(default = "default_topk_field")]
    pub topk_field: String,
    /// Sliding window of the top-k counts, in seconds. At least 1.
    #[serde(default = "default_topk_window_secs")]
    pub topk_window_secs: u64,
    /// Counters the top-k keeps per second of its window: the counts are exact while a
    /// second holds at most this many distinct values, and otherwise overestimate by at most
    /// (values counted in the window) / this. Bounds the saved state too. At least `topk`.
    #[serde(default = "default_topk_capacity")]
    pub topk_capacity: usize,
    /// Fields (dotted paths; arrays count each element) whose values break out on their own
    /// ([`value_trend`]): the `topk` most frequent values of each, judged against `period`
    /// minutes of their share of the stream. At most [`MAX_TREND_FIELDS`]; empty for none.
    #[serde(default = "default_trend_fields")]
    pub trend_fields: Vec<String>,
    /// Band width of the value trends in standard deviations, greater than 0. Wider than
    /// `k`: a feed judges its top values every second, and a value's minute overlaps the
    /// last, so 2σ would cry wolf.
    #[serde(default = "default_trend_k")]
    pub trend_k: f64,
    /// How often each feed saves its position and state, so a restart resumes there (and
    /// replays what came after). Also saved when the feed stops. At least 1.
    #[serde(default = "default_checkpoint_interval_ms")]
    pub checkpoint_interval_ms: u64,
    /// How often each feed publishes its statistics document and its lag and headroom
    /// gauges. At least 1.
    #[serde(default = "default_publish_interval_ms")]
    pub publish_interval_ms: u64,
}

impl Default for StatsConfig {
    fn default() -> Self {
        StatsConfig {
            period: default_period(),
            k: default_k(),
            value_field: default_value_field(),
            topk: default_topk(),
            topk_field: default_topk_field(),
            topk_window_secs: default_topk_window_secs(),
            topk_capacity: default_topk_capacity(),
            trend_fields: default_trend_fields(),
            trend_k: default_trend_k(),
            checkpoint_interval_ms: default_checkpoint_interval_ms(),
            publish_interval_ms: default_publish_interval_ms(),
        }
    }
}

impl StatsConfig {
    /// Every broken rule as (field, message); the caller adds its key prefix (`stats.`).
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut p = Vec::new();
        if self.period < 2 {
            p.push(("period", format!("must be >= 2 (got {})", self.period)));
        }
        if !(self.k.is_finite() && self.k > 0.0) {
            p.push(("k", format!("must be > 0 (got {})", self.k)));
        }
        if let Err(e) = store::update::check_path(&self.value_field) {
            p.push(("value_field", e));
        }
        if self.topk < 1 {
            p.push(("topk", format!("must be >= 1 (got {})", self.topk)));
        }
        if let Err(e) = store::update::check_path(&self.topk_field) {
            p.push(("topk_field", e));
        }
        if self.topk_capacity < self.topk.max(1) {
            p.push((
                "topk_capacity",
                format!(
                    "must be >= topk = {} (got {})",
                    self.topk, self.topk_capacity
                ),
            ));
        }
        if self.topk_window_secs < 1 {
            p.push((
                "topk_window_secs",
                format!("must be >= 1 (got {})", self.topk_window_secs),
            ));
        }
        if self.trend_fields.len() > MAX_TREND_FIELDS {
            p.push((
                "trend_fields",
                format!(
                    "at most {MAX_TREND_FIELDS} fields (got {})",
                    self.trend_fields.len()
                ),
            ));
        }
        for f in &self.trend_fields {
            if let Err(e) = store::update::check_path(f) {
                p.push(("trend_fields", format!("{f:?}: {e}")));
            }
        }
        if !(self.trend_k.is_finite() && self.trend_k > 0.0) {
            p.push(("trend_k", format!("must be > 0 (got {})", self.trend_k)));
        }
        if self.checkpoint_interval_ms < 1 {
            p.push((
                "checkpoint_interval_ms",
                format!("must be >= 1 (got {})", self.checkpoint_interval_ms),
            ));
        }
        if self.publish_interval_ms < 1 {
            p.push((
                "publish_interval_ms",
                format!("must be >= 1 (got {})", self.publish_interval_ms),
            ));
        }
        p
    }
}

/// The statistics of one feed at one moment, ready to publish: the number of events, and
/// every statistic's figures as JSON fields (`rate`, `rate_bands`, `trend`, `value_bands`, `top`,
/// `missing`, `duplicates`, `last_outcome`; see the table above).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// Total events seen (ticks are not events).
    pub events: u64,
    /// Every statistic's figures, by field name.
    #[serde(flatten)]
    pub figures: Map<String, Value>,
}

impl Snapshot {
    /// A figure by field name.
    pub fn get(&self, field: &str) -> Option<&Value> {
        self.figures.get(field)
    }

    /// A figure that is a non-negative integer (`missing`, `duplicates`).
    pub fn count(&self, field: &str) -> Option<u64> {
        self.get(field).and_then(Value::as_u64)
    }
}

/// All rolling statistics of one feed, updated together and checkpointed as one value.
///
/// A restored checkpoint keeps the parameters it was saved with; a changed [`StatsConfig`]
/// takes effect only for a fresh statistic, since windows built under one period cannot be
/// reinterpreted under another.
pub struct RollingStats {
    events: u64,
    stats: Vec<Box<dyn Statistic>>,
}

impl RollingStats {
    /// Creates empty statistics for one feed (`feed` labels their metrics).
    pub fn new(config: &StatsConfig, feed: &str) -> Self {
        RollingStats {
            events: 0,
            stats: build(config, feed),
        }
    }

    /// Folds one event into every statistic.
    pub fn on_event(&mut self, e: &Event<'_>) {
        self.events = self.events.saturating_add(1);
        for s in &mut self.stats {
            s.on_event(e);
        }
    }

    /// Advances time to `now_us` without an event, so a quiet feed's rate falls to 0 and its
    /// old keys leave the top-k.
    pub fn advance(&mut self, now_us: i64) {
        for s in &mut self.stats {
            s.advance(now_us);
        }
    }

    /// Events folded in so far (kept across restores).
    pub fn events(&self) -> u64 {
        self.events
    }

    /// The current figures of every statistic.
    pub fn snapshot(&self) -> Snapshot {
        let mut figures = Map::new();
        for s in &self.stats {
            s.snapshot(&mut figures);
        }
        Snapshot {
            events: self.events,
            figures,
        }
    }

    /// Publishes every statistic's metrics, from `snapshot` (taken just before, by
    /// [`RollingStats::snapshot`]).
    pub fn publish(&mut self, snapshot: &Snapshot) {
        for s in &mut self.stats {
            s.publish(&snapshot.figures);
        }
    }

    /// The sequence number expected next from `source` ([`Statistic::expected_seq`]).
    pub fn expected_seq(&self, source: &str) -> Option<u64> {
        self.stats.iter().find_map(|s| s.expected_seq(source))
    }

    /// Of the numbers the next event skips, `refused` were refused by the store
    /// ([`Statistic::refused_before_next`]).
    pub fn refused_before_next(&mut self, refused: u64) {
        for s in &mut self.stats {
            s.refused_before_next(refused);
        }
    }

    /// Every statistic's changes since the last call ([`Statistic::take_changes`]).
    pub fn take_changes(&mut self) -> Vec<StatChange> {
        self.stats
            .iter_mut()
            .flat_map(|s| s.take_changes())
            .collect()
    }

    /// The whole state: `{"events": n, "<statistic>": state, ...}`.
    pub fn save(&self) -> Value {
        let mut state = Map::new();
        state.insert("events".into(), Value::from(self.events));
        for s in &self.stats {
            state.insert(s.name().into(), s.save());
        }
        Value::Object(state)
    }

    /// Restores a saved state. A statistic whose state is absent or unreadable (saved by
    /// another version) keeps its fresh state and is returned with the reason, so the caller
    /// can say so; the others are restored.
    pub fn restore(&mut self, state: &Value) -> Vec<(&'static str, String)> {
        self.events = state.get("events").and_then(Value::as_u64).unwrap_or(0);
        let mut failed = Vec::new();
        for s in &mut self.stats {
            let result = match state.get(s.name()) {
                Some(saved) => s.restore(saved),
                None => Err("not in the checkpoint".to_owned()),
            };
            if let Err(e) = result {
                failed.push((s.name(), e));
            }
        }
        failed
    }
}

/// Serializes a statistic's state (a plain serde value; infallible for our types).
pub(crate) fn to_state<T: Serialize>(value: &T) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

/// Restores a statistic's state from a saved value.
pub(crate) fn from_state<T: serde::de::DeserializeOwned>(state: &Value) -> Result<T, String> {
    T::deserialize(state).map_err(|e| e.to_string())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    const S: i64 = 1_000_000;
    const TOL: f64 = 1e-9;

    fn assert_close(what: &str, expected: f64, seen: f64) {
        assert!(
            (expected - seen).abs() <= TOL,
            "{what}: expected {expected}, seen {seen}"
        );
    }

    /// An event at `t_us` of source `src` (stamped when it has a sequence number), with the
    /// default value field (`retweet_count`) and top-k field (`hashtags`).
    struct Ev {
        t_us: i64,
        stamp: Option<Stamp>,
        doc: Document,
    }

    fn ev(t_us: i64, seq: Option<u64>, value: Option<Value>, keys: &[&str]) -> Ev {
        let mut doc = Document::new();
        if let Some(v) = value {
            doc.insert("retweet_count".into(), v);
        }
        doc.insert("hashtags".into(), json!(keys));
        Ev {
            t_us,
            stamp: seq.map(|seq| Stamp {
                source: "src".into(),
                seq,
                received_us: t_us,
                ingested_us: t_us,
                position: None,
            }),
            doc,
        }
    }

    fn feed(s: &mut RollingStats, e: &Ev) -> Snapshot {
        s.on_event(&Event {
            t_us: e.t_us,
            stamp: e.stamp.as_ref(),
            doc: &e.doc,
        });
        s.snapshot()
    }

    fn bands(snap: &Snapshot, field: &str) -> Option<Bands> {
        serde_json::from_value(snap.get(field).cloned().unwrap_or(Value::Null)).unwrap()
    }

    fn top(snap: &Snapshot) -> Vec<(String, u64)> {
        snap.get("top")
            .and_then(Value::as_array)
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["key"].as_str().unwrap().to_string(),
                    e["count"].as_u64().unwrap(),
                )
            })
            .collect()
    }

    fn outcome(snap: &Snapshot) -> Option<SeqOutcome> {
        serde_json::from_value(snap.get("last_outcome").cloned().unwrap()).unwrap()
    }

    #[test]
    fn the_fields_read_are_declared_by_the_statistics_each_path_once() {
        let c = StatsConfig::default();
        assert_eq!(
            fields_read(&c),
            [
                ("value_field", "retweet_count".to_string()),
                ("topk_field", "hashtags".to_string()),
                ("trend_fields", "lang".to_string())
            ]
        );
        let same = StatsConfig {
            value_field: "n".into(),
            topk_field: "n".into(),
            trend_fields: vec!["n".into()],
            ..c
        };
        assert_eq!(fields_read(&same), [("value_field", "n".to_string())]);
    }

    #[test]
    fn config_defaults_and_strictness() {
        let c: StatsConfig = serde_json::from_str("{}").unwrap();
        let expected = StatsConfig {
            period: 20,
            k: 2.0,
            value_field: "retweet_count".into(),
            topk: 10,
            topk_field: "hashtags".into(),
            topk_window_secs: 60,
            topk_capacity: 1024,
            trend_fields: vec!["hashtags".into(), "lang".into()],
            trend_k: 5.0,
            checkpoint_interval_ms: 10_000,
            publish_interval_ms: 1000,
        };
        assert_eq!(c, expected, "empty config");
        assert_eq!(StatsConfig::default(), expected, "Default impl");
        let c: StatsConfig = serde_json::from_str(r#"{"period": 5, "k": 1.5}"#).unwrap();
        assert_eq!(
            (c.period, c.k, c.topk, c.topk_window_secs),
            (5, 1.5, 10, 60),
            "partial config"
        );
        let err = serde_json::from_str::<StatsConfig>(r#"{"perod": 5}"#);
        assert!(err.is_err(), "unknown field must be rejected, seen {err:?}");
        assert!(expected.problems().is_empty(), "defaults are valid");
        let bad = StatsConfig {
            period: 1,
            k: 0.0,
            value_field: "a..b".into(),
            topk: 0,
            topk_window_secs: 0,
            trend_fields: vec!["x".into(), "$bad".into()],
            trend_k: f64::NAN,
            checkpoint_interval_ms: 0,
            publish_interval_ms: 0,
            ..StatsConfig::default()
        };
        let fields: Vec<&str> = bad.problems().iter().map(|(f, _)| *f).collect();
        assert_eq!(
            fields,
            [
                "period",
                "k",
                "value_field",
                "topk",
                "topk_window_secs",
                "trend_fields",
                "trend_k",
                "checkpoint_interval_ms",
                "publish_interval_ms"
            ],
            "every broken rule is reported"
        );
    }

    #[test]
    fn on_event_updates_everything() {
        let config = StatsConfig {
            period: 3,
            topk: 2,
            ..StatsConfig::default()
        };
        let mut s = RollingStats::new(&config, "test");
        let events = [
            ev(0, Some(1), Some(json!(2.0)), &["Rust"]),
            ev(100, Some(2), Some(json!(4)), &["rust", "tokio"]),
            ev(S, Some(5), None, &["serde"]),
            ev(S + 1, Some(4), Some(json!(9.0)), &[]),
            ev(2 * S, None, Some(json!("not a number")), &["TOKIO"]),
        ];
        let snaps: Vec<Snapshot> = events.iter().map(|e| feed(&mut s, e)).collect();

        // Counted by hand: second 0 had 2 events, second 1 had 2.
        let rates: Vec<f64> = snaps
            .iter()
            .map(|x| x.get("rate").and_then(Value::as_f64).unwrap())
            .collect();
        assert_eq!(rates, [0.0, 0.0, 2.0, 2.0, 2.0], "rates");
        assert_eq!(snaps[4].events, 5, "events total");
        assert_eq!(
            bands(&snaps[4], "rate_bands"),
            None,
            "only 2 closed seconds"
        );
        assert_eq!(bands(&snaps[1], "value_bands"), None, "2 values of 3");
        // reference: python statistics.mean / statistics.pstdev([2.0, 4.0, 9.0]),
        // upper/lower = mean ± 2*pstdev; the non-numeric value is ignored.
        let b = bands(&snaps[4], "value_bands").unwrap();
        assert_close("value upper", 10.887840577551898, b.upper);
        assert_close("value middle", 5.0, b.middle);
        assert_close("value lower", -0.8878405775518976, b.lower);
        assert_close("value stddev", 2.943920288775949, b.stddev);
        assert_eq!(
            top(&snaps[4]),
            vec![("rust".to_string(), 2), ("tokio".to_string(), 2)],
            "top-2 with case folding and tie order"
        );
        let outcomes: Vec<Option<SeqOutcome>> = snaps.iter().map(outcome).collect();
        assert_eq!(
            outcomes,
            [
                Some(SeqOutcome::InOrder),
                Some(SeqOutcome::InOrder),
                Some(SeqOutcome::Gap {
                    missing: 2,
                    refused: 0
                }),
                Some(SeqOutcome::Duplicate),
                // No stamp: the previous outcome is carried.
                Some(SeqOutcome::Duplicate),
            ],
            "sequence outcomes"
        );
        assert_eq!(
            (snaps[4].count("missing"), snaps[4].count("duplicates")),
            (Some(2), Some(1)),
            "totals"
        );
        assert_eq!(s.snapshot(), snaps[4], "snapshot() is stable");
    }

    /// The top-k gauges follow the snapshot they are published from: its keys with their
    /// counts, and 0 for a key that has left the top since the last tick.
    #[test]
    fn the_published_top_keys_are_the_snapshot_s() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let config = StatsConfig {
            topk: 2,
            ..StatsConfig::default()
        };
        let gauge = |text: &str, key: &str| -> Option<f64> {
            let series = format!("{}{{feed=\"g\",key=\"{key}\"}} ", crate::telemetry::TOPK);
            text.lines()
                .find_map(|l| l.strip_prefix(series.as_str()))
                .and_then(|v| v.trim().parse().ok())
        };
        metrics::with_local_recorder(&recorder, || {
            let mut s = RollingStats::new(&config, "g");
            feed(&mut s, &ev(S, None, None, &["a", "a", "b"]));
            let snap = s.snapshot();
            s.publish(&snap);
            let text = handle.render();
            assert_eq!(
                (gauge(&text, "a"), gauge(&text, "b")),
                (Some(2.0), Some(1.0)),
                "{text}"
            );
            feed(
                &mut s,
                &ev(2 * S, None, None, &["c", "c", "c", "d", "d", "d"]),
            );
            let snap = s.snapshot();
            s.publish(&snap);
            let text = handle.render();
            assert_eq!(
                [
                    gauge(&text, "a"),
                    gauge(&text, "b"),
                    gauge(&text, "c"),
                    gauge(&text, "d")
                ],
                [Some(0.0), Some(0.0), Some(3.0), Some(3.0)],
                "{text}"
            );
        });
    }

    /// What a feed writes (its `stats` document, its checkpoint) must be storable by any
    /// MongoDB-compatible server, whatever the stream's keys: no array directly inside an
    /// array, and no value of the stream as a field name (a hashtag may start with `$` or hold
    /// a dot).
    #[test]
    fn snapshots_and_saved_states_hold_no_nested_array_and_no_stream_key_as_a_field() {
        fn check(v: &Value, path: &str) {
            match v {
                Value::Array(items) => {
                    for (i, item) in items.iter().enumerate() {
                        assert!(!item.is_array(), "{path}[{i}] is an array inside an array");
                        check(item, &format!("{path}[{i}]"));
                    }
                }
                Value::Object(m) => {
                    for (k, item) in m {
                        assert!(
                            !k.starts_with('$') && !k.contains('.'),
                            "{path}: field name {k:?}"
                        );
                        check(item, &format!("{path}.{k}"));
                    }
                }
                _ => {}
            }
        }
        let config = StatsConfig {
            period: 3,
            ..StatsConfig::default()
        };
        let mut s = RollingStats::new(&config, "test");
        for i in 0..50_i64 {
            let keys = ["$price", "user.name", "東京", "rust"];
            feed(
                &mut s,
                &ev(
                    i * S / 4,
                    Some(i as u64 + 1),
                    Some(json!(i % 7)),
                    &keys[..(i % 4) as usize + 1],
                ),
            );
        }
        check(&serde_json::to_value(s.snapshot()).unwrap(), "snapshot");
        check(&s.save(), "saved state");
    }

    #[test]
    fn a_source_with_an_empty_name_is_tracked_like_any_other() {
        let mut s = RollingStats::new(&StatsConfig::default(), "test");
        let mut e = ev(0, Some(10), None, &[]);
        if let Some(st) = e.stamp.as_mut() {
            st.source = String::new();
        }
        assert_eq!(
            outcome(&feed(&mut s, &e)),
            Some(SeqOutcome::InOrder),
            "first"
        );
        if let Some(st) = e.stamp.as_mut() {
            st.seq = 12;
        }
        assert_eq!(
            outcome(&feed(&mut s, &e)),
            Some(SeqOutcome::Gap {
                missing: 1,
                refused: 0
            }),
            "gap on the unnamed source"
        );
        let fresh = RollingStats::new(&StatsConfig::default(), "test");
        assert_eq!(outcome(&fresh.snapshot()), None, "no sequenced event yet");
    }

    #[test]
    fn advance_on_quiet_feed() {
        let config = StatsConfig {
            period: 2,
            topk_window_secs: 10,
            ..StatsConfig::default()
        };
        let mut s = RollingStats::new(&config, "test");
        feed(&mut s, &ev(0, None, None, &["a"]));
        feed(&mut s, &ev(1, None, None, &["a"]));
        s.advance(S);
        let snap = s.snapshot();
        assert_eq!(
            snap.get("rate"),
            Some(&json!(2.0)),
            "second 0 closed with 2 events"
        );
        assert_eq!(top(&snap), vec![("a".to_string(), 2)], "a still in window");
        s.advance(10 * S);
        let snap = s.snapshot();
        assert_eq!(
            snap.get("rate"),
            Some(&json!(0.0)),
            "quiet seconds bring the rate to 0"
        );
        assert_eq!(top(&snap), Vec::<(String, u64)>::new(), "a expired at 10 s");
        let b = bands(&snap, "rate_bands").unwrap();
        assert_eq!((b.middle, b.stddev), (0.0, 0.0), "window of zeros");
        assert_eq!(snap.events, 2, "ticks are not events");
    }

    #[test]
    fn checkpoint_round_trip_matches_uninterrupted_run() {
        let tags = ["Rust", "tokio", "SERDE", "async", "東京", "كورة", "🦀"];
        let events: Vec<Ev> = (0..400_i64)
            .map(|i| {
                let keys: Vec<&str> = tags
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| (i as usize + j).is_multiple_of(3))
                    .map(|(_, t)| *t)
                    .collect();
                let mut e = ev(
                    i * 280_000 - (i % 6) * 700_000 + (i / 100) * 9 * S,
                    (i % 9 != 0).then_some((i / 2 + (i % 13) / 4) as u64),
                    (i % 5 != 0).then(|| json!(100.0 + (i as f64 * 0.37).sin() * 7.123456789)),
                    &keys,
                );
                if let Some(st) = e.stamp.as_mut() {
                    st.source = ["a", "b"][(i % 2) as usize].to_string();
                }
                e
            })
            .collect();
        let config = StatsConfig {
            period: 7,
            topk: 3,
            topk_window_secs: 15,
            ..StatsConfig::default()
        };
        // Some events are followed by a quiet-time advance, to checkpoint that state too.
        let run = |s: &mut RollingStats, evs: &[Ev]| -> Vec<Snapshot> {
            let mut out = Vec::new();
            for e in evs {
                out.push(feed(s, e));
                if e.t_us.div_euclid(20_000) % 50 == 0 {
                    s.advance(e.t_us + 3 * S);
                    out.push(s.snapshot());
                }
            }
            out
        };
        let mut straight = RollingStats::new(&config, "test");
        let expected = run(&mut straight, &events);

        let mut first = RollingStats::new(&config, "test");
        let mut seen = run(&mut first, &events[..200]);
        let json = serde_json::to_string(&first.save()).unwrap();
        let mut restored = RollingStats::new(&config, "test");
        let failed = restored.restore(&serde_json::from_str(&json).unwrap());
        assert!(failed.is_empty(), "every statistic restores: {failed:?}");
        assert_eq!(
            restored.save(),
            first.save(),
            "restored state vs saved state"
        );
        assert_eq!(
            restored.snapshot(),
            first.snapshot(),
            "snapshot after restore"
        );
        seen.extend(run(&mut restored, &events[200..]));
        assert_eq!(seen.len(), expected.len(), "number of snapshots");
        for (i, (s, e)) in seen.iter().zip(&expected).enumerate() {
            assert_eq!(s, e, "snapshot {i}: restored run vs uninterrupted run");
        }
        assert_eq!(restored.save(), straight.save(), "final state");
        let last = expected.last().unwrap();
        assert!(
            bands(last, "value_bands").is_some()
                && bands(last, "rate_bands").is_some()
                && !top(last).is_empty(),
            "test input must exercise every statistic, seen {last:?}"
        );
    }

    #[test]
    fn an_unreadable_statistic_starts_afresh_and_the_others_restore() {
        let config = StatsConfig::default();
        let mut s = RollingStats::new(&config, "test");
        for i in 0..30 {
            feed(
                &mut s,
                &ev(i * S, Some(i as u64 + 1), Some(json!(i)), &["x"]),
            );
        }
        let mut state = s.save();
        state["topk"] = json!("saved by another version");
        let mut restored = RollingStats::new(&config, "test");
        let failed = restored.restore(&state);
        assert_eq!(
            failed.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            ["topk"],
            "only the unreadable one is reported"
        );
        let (a, b) = (s.snapshot(), restored.snapshot());
        assert_eq!(a.events, b.events);
        assert_eq!(a.get("rate_bands"), b.get("rate_bands"));
        assert_eq!(a.get("missing"), b.get("missing"));
        assert_eq!(top(&b), Vec::<(String, u64)>::new(), "top-k starts afresh");
    }
}
