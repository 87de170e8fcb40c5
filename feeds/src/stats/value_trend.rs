//! Values that break out: a hashtag or a language suddenly talked about.
//!
//! For each of `trend_fields` (default `hashtags` and `lang`), every closed second compares
//! each candidate value's count over the trailing minute with the band its own past predicts:
//!
//! - **its past** is its share of the stream in each of the last `period` closed minutes
//!   (at least [`MIN_BASELINE_MINUTES`] of them before anything is judged);
//! - **the band** is that share, weighted by the minutes' volumes, times the events of the
//!   trailing minute (the middle); its upper edge is the count a Poisson variable of that
//!   mean (at least 1: a value never seen is not expected never) reaches with the
//!   probability a normal one lies `trend_k` σ above its mean (2.9·10⁻⁷ at 5σ), or
//!   `trend_k` times the spread of the per-minute shares at today's volume, if the value
//!   varies more than Poisson noise; the lower edge is the middle less `trend_k` times that
//!   spread or √middle;
//! - **a breakout** is one closed second beyond the band, then [`TrendState`]'s hysteresis:
//!   steady again once the count crosses the middle, so a value hovering on its band does
//!   not flap. One second, where the rate wants
//!   [`BREAKOUT_SECONDS`](super::rate::BREAKOUT_SECONDS) in a row: consecutive trailing
//!   minutes share 59 of their seconds, so a run of them adds little against noise and costs
//!   seconds of delay; the Poisson tail is what keeps a steady stream quiet (small counts
//!   have far heavier tails than a normal σ says).
//!
//! Why shares and not raw rates: when the whole stream bursts, every popular value's rate
//! rises with it, and the rate statistic already says so once; a value that breaks out here
//! has gained on the rest of the stream (and a value that takes 30 % of it takes that from
//! the others, some of which may break out down). The document reports the value's count
//! over the minute (`rate`) beside the band, in the same unit.
//!
//! **Candidates** are the [`CANDIDATES_PER_TOPK`] × `topk` most frequent values of the
//! trailing minute, as many of the last closed minute (so a value that drops is seen
//! dropping), and any value partway into or out of a breakout. Long-tail values are never
//! judged one by one: a value becomes a candidate by being frequent, which a surge makes it.
//!
//! **Approximate counts never make a breakout.** The trailing minute is a [`HeavyHitters`]
//! ([`MAX_CAPACITY`] counters a second at most, keys cut at 256 bytes), whose counts may be over by a
//! stated error beyond its capacity; each closed minute keeps its [`KEEP_PER_MINUTE`] most
//! frequent values and the count the others lie below (its `floor`). A value breaks out up
//! only if the least its count can be beats the band of the most its past can have been,
//! and down only the other way round.
//!
//! **Bounded state**, whatever the stream's cardinality: the window and the `period`
//! minutes above, and per-value states only for candidates not yet quiet. Keys in `trends`
//! are `value:<field>:<second>:<value>`: the field's path and at most 256 bytes of value.

use std::collections::{BTreeMap, HashMap, VecDeque};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::bollinger::Bands;
use super::heavy_hitters::HeavyHitters;
use super::rate::{Trend, TrendState};
use super::topk::keys_of;
use super::{Event, Registration, StatChange, Statistic, StatsConfig, from_state, to_state};
use crate::telemetry as t;

/// Microseconds per second, the bucket width.
const US_PER_SEC: i64 = 1_000_000;

/// The trailing window a value's count is taken over: a minute.
pub const WINDOW_SECS: i64 = 60;

/// Closed minutes a value's past must span before it is judged: fewer say too little about
/// its share to call anything sudden.
pub const MIN_BASELINE_MINUTES: usize = 3;

/// Candidates taken from the trailing minute per value of `topk`: a rising value becomes one
/// while its count is still small, before it reaches the top list people read.
pub const CANDIDATES_PER_TOPK: usize = 4;

/// Counters a second the trailing minute keeps at most (`topk_capacity` if smaller): the
/// candidates are the few most frequent values, which Space-Saving counts exactly long before
/// its capacity is reached on any real stream; the rest only cost the checkpoint (a flat-out
/// long tail fills every counter of every second).
pub const MAX_CAPACITY: usize = 256;

/// Values kept per closed minute: enough that the others' floor is about one mention on a
/// 70/s stream, so a new value's past is nearly nothing, as it should be.
pub const KEEP_PER_MINUTE: usize = 256;

/// One closed minute of a field: its events, its most frequent values, and the most any
/// other value can have counted (0 when every value was kept).
///
/// Saved as objects and arrays of objects only, never a value as a field name or an array in
/// an array: a checkpoint must be storable by any MongoDB-compatible server, and a hashtag may
/// start with `$` or hold a dot.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
struct Minute {
    minute: i64,
    events: u64,
    /// Sorted by value.
    counts: Vec<Counted>,
    floor: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
struct Counted {
    value: String,
    count: u64,
}

/// Events of one second of the trailing minute.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq)]
struct Second {
    second: i64,
    events: u64,
}

impl Minute {
    /// Its count of `value`: for a value it did not keep, the most it can have been
    /// (`floor`), or the least (0).
    fn count(&self, value: &str, most: bool) -> u64 {
        let other = if most { self.floor } else { 0 };
        self.counts
            .binary_search_by(|c| c.value.as_str().cmp(value))
            .map_or(other, |i| self.counts[i].count)
    }
}

/// One breakout of a value from its band: the second that completed it.
#[derive(Clone, Debug, PartialEq)]
pub struct ValueBreakout {
    pub second: i64,
    pub value: String,
    pub direction: Trend,
    /// The value's count over the trailing minute.
    pub count: f64,
    /// Events in the trailing minute.
    pub events: u64,
    pub bands: Bands,
    /// Closed minutes its past spans.
    pub minutes: usize,
}

/// The least count a Poisson variable of mean `lambda` reaches with at most the probability
/// that a normal one lies `k` σ above its mean: exact by its recurrence while `e^-λ` is a
/// normal `f64`, then by the normal limit of its square root (Anscombe), within a count of
/// it there.
fn poisson_beyond(lambda: f64, k: f64) -> f64 {
    if lambda > 500.0 {
        return ((lambda + 0.375).sqrt() + k / 2.0).powi(2) - 0.375;
    }
    let tail = libm::erfc(k / std::f64::consts::SQRT_2) / 2.0;
    // Invariant: `below` = P(X < c), `p` = P(X = c).
    let (mut c, mut below, mut p) = (0.0, 0.0, (-lambda).exp());
    while 1.0 - below > tail && p > 0.0 {
        below += p;
        c += 1.0;
        p *= lambda / c;
    }
    c
}

/// The breakout detector of one field (the pure core; [`ValueTrends`] is the statistic).
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct FieldTrends {
    /// Candidates taken from each of the two top lists.
    candidates: usize,
    /// Closed minutes the past spans.
    period: usize,
    k: f64,
    /// The values over the trailing minute.
    window: HeavyHitters,
    /// Events per second over the trailing minute, the open second last.
    seconds: VecDeque<Second>,
    minutes: VecDeque<Minute>,
    /// Values partway into, in, or partway out of a breakout (saved as a list: values are
    /// no field names).
    #[serde(with = "states")]
    states: BTreeMap<String, TrendState>,
    /// Breakouts so far: up, then down.
    changes: [u64; 2],
    /// Breakouts not yet taken. Not checkpointed: a feed restarted from a checkpoint before
    /// one meets it again as it replays.
    #[serde(skip)]
    breakouts: Vec<ValueBreakout>,
}

impl FieldTrends {
    /// Judges the `candidates` most frequent values against `period` minutes of their past
    /// at `k` σ, counting the trailing minute with `capacity` counters a second.
    pub fn new(candidates: usize, period: usize, k: f64, capacity: usize) -> Self {
        FieldTrends {
            candidates,
            period: period.max(MIN_BASELINE_MINUTES),
            k,
            window: HeavyHitters::new(candidates, WINDOW_SECS as u64, capacity),
            seconds: VecDeque::new(),
            minutes: VecDeque::new(),
            states: BTreeMap::new(),
            changes: [0; 2],
            breakouts: Vec::new(),
        }
    }

    fn open(&self) -> Option<i64> {
        self.seconds.back().map(|s| s.second)
    }

    /// Counts one event at `t_us` with the values of its field (none is an event too: shares
    /// are of the whole stream). An event earlier than the open second counts into it, as
    /// for the rate.
    pub fn record<'a>(&mut self, t_us: i64, values: impl IntoIterator<Item = &'a str>) {
        let sec = t_us.div_euclid(US_PER_SEC);
        match self.open() {
            Some(open) if sec > open => {
                self.close_until(open, sec);
                self.seconds.push_back(Second {
                    second: sec,
                    events: 0,
                });
            }
            Some(_) => {}
            None => self.seconds.push_back(Second {
                second: sec,
                events: 0,
            }),
        }
        let Some(open) = self.seconds.back_mut() else {
            return; // unreachable: an open second was just ensured
        };
        open.events = open.events.saturating_add(1);
        let open = open.second;
        self.window.record(open.saturating_mul(US_PER_SEC), values);
    }

    /// Moves the clock to `t_us` without an event, closing every second before it.
    pub fn advance_to(&mut self, t_us: i64) {
        let sec = t_us.div_euclid(US_PER_SEC);
        if let Some(open) = self.open().filter(|open| sec > *open) {
            self.close_until(open, sec);
            self.seconds.push_back(Second {
                second: sec,
                events: 0,
            });
        }
    }

    /// The breakouts since the last call, oldest first.
    pub fn take_breakouts(&mut self) -> Vec<ValueBreakout> {
        std::mem::take(&mut self.breakouts)
    }

    /// Breakouts so far: up, then down.
    pub fn changes(&self) -> [u64; 2] {
        self.changes
    }

    /// The values broken out now, with their direction.
    pub fn broken_out(&self) -> impl Iterator<Item = (&str, Trend)> {
        self.states
            .iter()
            .filter(|(_, s)| s.trend != Trend::Steady)
            .map(|(v, s)| (v.as_str(), s.trend))
    }

    /// Closes second `open` and the empty ones up to `next`. Past a minute of silence the
    /// window is empty and nothing is judged, so the loop stops there.
    fn close_until(&mut self, open: i64, next: i64) {
        let last = next.saturating_sub(1).min(open.saturating_add(WINDOW_SECS));
        for s in open..=last {
            self.close_second(s);
        }
    }

    fn close_second(&mut self, s: i64) {
        self.window.expire(s.saturating_mul(US_PER_SEC));
        let cutoff = s.saturating_sub(WINDOW_SECS);
        while self.seconds.front().is_some_and(|f| f.second <= cutoff) {
            self.seconds.pop_front();
        }
        let events: u64 = self.seconds.iter().map(|s| s.events).sum();
        if events > 0 {
            self.judge(s, events);
        }
        if (s + 1).rem_euclid(WINDOW_SECS) == 0 && events > 0 {
            self.close_minute(s.div_euclid(WINDOW_SECS), events);
        }
    }

    /// The trailing window is exactly minute `minute` now.
    fn close_minute(&mut self, minute: i64, events: u64) {
        let mut top = self.window.estimates(KEEP_PER_MINUTE + 1);
        let floor = if top.len() > KEEP_PER_MINUTE {
            top.pop().map_or(0, |e| e.count)
        } else {
            0
        };
        self.minutes.push_back(Minute {
            minute,
            events,
            counts: {
                let mut counts: Vec<Counted> = top
                    .into_iter()
                    .map(|e| Counted {
                        value: e.key,
                        count: e.count,
                    })
                    .collect();
                counts.sort_unstable_by(|a, b| a.value.cmp(&b.value));
                counts
            },
            floor,
        });
        let oldest = minute.saturating_sub(self.period as i64);
        while self.minutes.front().is_some_and(|m| m.minute <= oldest) {
            self.minutes.pop_front();
        }
    }

    /// The band of `value` at `events` in the trailing minute, from the most its past can
    /// have been (`most`) or the least.
    fn band(&self, value: &str, events: u64, most: bool) -> Bands {
        let n = self.minutes.len() as f64;
        let (mut counted, mut total) = (0.0, 0.0);
        let shares: Vec<f64> = self
            .minutes
            .iter()
            .map(|m| {
                let c = m.count(value, most) as f64;
                counted += c;
                total += m.events as f64;
                c / m.events.max(1) as f64
            })
            .collect();
        let share = if total > 0.0 { counted / total } else { 0.0 };
        let mean = shares.iter().sum::<f64>() / n;
        let spread = if n > 1.0 {
            (shares.iter().map(|p| (p - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
        } else {
            0.0
        };
        let events = events as f64;
        let middle = share * events;
        let spread = spread * events;
        let noise = spread.max(middle.sqrt());
        Bands {
            upper: (poisson_beyond(middle.max(1.0), self.k) - 1.0).max(middle + self.k * spread),
            middle,
            lower: middle - self.k * noise,
            stddev: noise,
        }
    }

    fn judge(&mut self, s: i64, events: u64) {
        if self.minutes.len() < MIN_BASELINE_MINUTES {
            return;
        }
        // Every value with a counter in the window, most frequent first: the top of it are
        // candidates, and the rest say the counts of the other candidates.
        let all = self.window.estimates(usize::MAX);
        let mut candidates: Vec<String> = all
            .iter()
            .take(self.candidates)
            .map(|e| e.key.clone())
            .collect();
        let now: HashMap<String, (u64, u64)> = all
            .into_iter()
            .map(|e| (e.key, (e.count, e.error)))
            .collect();
        if let Some(last) = self.minutes.back() {
            let mut past: Vec<&Counted> = last.counts.iter().collect();
            past.sort_by(|a, b| b.count.cmp(&a.count).then(a.value.cmp(&b.value)));
            candidates.extend(
                past.into_iter()
                    .take(self.candidates)
                    .map(|c| c.value.clone()),
            );
        }
        candidates.extend(self.states.keys().cloned());
        candidates.sort_unstable();
        candidates.dedup();
        for value in candidates {
            // Judged so that neither the counters' overestimate nor the values a minute did
            // not keep can make a breakout: up by the least the count can be against the most
            // its past can have been, down by the most against the least.
            let (most, error) = now.get(&value).copied().unwrap_or((0, 0));
            let count = most.saturating_sub(error) as f64;
            let high = self.band(&value, events, true);
            let low = self.band(&value, events, false);
            let bands = Bands {
                lower: low.lower - error as f64,
                ..high
            };
            let mut state = self.states.get(&value).copied().unwrap_or_default();
            if let Some(direction) = state.observe_for(count, Some(bands), 1) {
                self.changes[usize::from(direction == Trend::Down)] += 1;
                self.breakouts.push(ValueBreakout {
                    second: s,
                    value: value.clone(),
                    direction,
                    count,
                    events,
                    bands,
                    minutes: self.minutes.len(),
                });
            }
            if state.is_quiet() {
                self.states.remove(&value);
            } else {
                self.states.insert(value, state);
            }
        }
    }
}

/// Per-value states as `[{"value", "state"}]`.
mod states {
    use super::{BTreeMap, TrendState};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    struct Entry {
        value: String,
        state: TrendState,
    }

    pub fn serialize<S: Serializer>(
        m: &BTreeMap<String, TrendState>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let entries: Vec<Entry> = m
            .iter()
            .map(|(value, state)| Entry {
                value: value.clone(),
                state: *state,
            })
            .collect();
        entries.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<String, TrendState>, D::Error> {
        let entries = Vec::<Entry>::deserialize(d)?;
        Ok(entries.into_iter().map(|e| (e.value, e.state)).collect())
    }
}

/// The value-trend statistic of a feed: a [`FieldTrends`] per `trend_fields` path. Snapshot
/// field `value_trends` (`[{"field", "value", "direction"}]`, the values broken out now);
/// metric `tailrace_value_trend_changes_total{field,direction}`.
pub struct ValueTrends {
    fields: Vec<(String, FieldTrends)>,
    /// Per field, up and down: registered when built, so the series exist at 0.
    meters: Vec<[metrics::Counter; 2]>,
    /// Breakouts per field counted into the metric so far.
    counted: Vec<[u64; 2]>,
}

impl ValueTrends {
    /// The trends of `config.trend_fields` for `feed`.
    pub fn new(config: &StatsConfig, feed: &str) -> Self {
        let fields: Vec<(String, FieldTrends)> = config
            .trend_fields
            .iter()
            .map(|f| {
                let trends = FieldTrends::new(
                    CANDIDATES_PER_TOPK * config.topk,
                    config.period,
                    config.trend_k,
                    config.topk_capacity.min(MAX_CAPACITY),
                );
                (f.clone(), trends)
            })
            .collect();
        let meters = fields
            .iter()
            .map(|(field, _)| {
                ["up", "down"].map(|d| {
                    metrics::counter!(t::VALUE_TREND_CHANGES, "feed" => feed.to_string(),
                        "field" => field.clone(), "direction" => d)
                })
            })
            .collect();
        ValueTrends {
            counted: vec![[0; 2]; fields.len()],
            meters,
            fields,
        }
    }
}

/// Built for every feed; reads each of `trend_fields`.
pub const REGISTRATION: Registration = Registration {
    build: |c, feed| Box::new(ValueTrends::new(c, feed)),
    reads: |c| {
        c.trend_fields
            .iter()
            .map(|f| ("trend_fields", f.clone()))
            .collect()
    },
};

impl Statistic for ValueTrends {
    fn name(&self) -> &'static str {
        "value_trend"
    }

    fn on_event(&mut self, e: &Event<'_>) {
        for (field, trends) in &mut self.fields {
            let values = keys_of(store::update::get_path(e.doc, field));
            trends.record(e.t_us, values.iter().map(|v| v.as_ref()));
        }
    }

    fn advance(&mut self, now_us: i64) {
        for (_, trends) in &mut self.fields {
            trends.advance_to(now_us);
        }
    }

    fn snapshot(&self, out: &mut Map<String, Value>) {
        let now: Vec<Value> = self
            .fields
            .iter()
            .flat_map(|(field, trends)| {
                trends
                    .broken_out()
                    .map(move |(value, direction)| json!({"field": field, "value": value, "direction": direction}))
            })
            .collect();
        out.insert("value_trends".into(), Value::Array(now));
    }

    fn publish(&mut self, _figures: &Map<String, Value>) {
        let meters = self.meters.iter().zip(&mut self.counted);
        for ((_, trends), (meter, counted)) in self.fields.iter().zip(meters) {
            // Counted once each: a restored feed continues from its checkpoint's counts.
            let changes = trends.changes();
            for ((counter, now), before) in meter.iter().zip(changes).zip(*counted) {
                counter.increment(now.saturating_sub(before));
            }
            *counted = changes;
        }
    }

    /// Each breakout as a trend document: `{"statistic": "value", "field", "value",
    /// "direction", "at", "rate" (its count over the trailing minute), "events" (the stream's),
    /// "share", "band": {"upper", "middle", "lower"}, "window_s": 60, "minutes", "k"}`, keyed
    /// `value:<field>:<second>:<value>`.
    fn take_changes(&mut self) -> Vec<StatChange> {
        let mut out = Vec::new();
        for (field, trends) in &mut self.fields {
            let k = trends.k;
            for b in trends.take_breakouts() {
                let Some(at) = store::date::value(b.second.saturating_mul(1000)) else {
                    continue;
                };
                let doc = json!({
                    "statistic": "value",
                    "field": field,
                    "value": b.value,
                    "direction": b.direction,
                    "at": at,
                    "rate": b.count,
                    "events": b.events,
                    "share": b.count / b.events.max(1) as f64,
                    "band": {"upper": b.bands.upper, "middle": b.bands.middle, "lower": b.bands.lower},
                    "window_s": WINDOW_SECS,
                    "minutes": b.minutes,
                    "k": k,
                });
                if let Value::Object(doc) = doc {
                    out.push(StatChange {
                        key: format!("value:{field}:{}:{}", b.second, b.value),
                        doc,
                    });
                }
            }
        }
        out
    }

    /// `[{"field", "state"}]` (a field's path may hold a dot, which a field name may not): a
    /// field no longer configured is dropped, a new one starts afresh.
    fn save(&self) -> Value {
        Value::Array(
            self.fields
                .iter()
                .map(|(field, trends)| json!({"field": field, "state": to_state(trends)}))
                .collect(),
        )
    }

    fn restore(&mut self, state: &Value) -> Result<(), String> {
        let Value::Array(saved) = state else {
            return Err("not a list of fields".to_owned());
        };
        let mut restored = Vec::with_capacity(self.fields.len());
        for (field, trends) in &self.fields {
            let found = saved
                .iter()
                .find(|s| s.get("field").and_then(Value::as_str) == Some(field.as_str()));
            match found.and_then(|s| s.get("state")) {
                Some(s) => restored.push(from_state::<FieldTrends>(s)?),
                None => restored.push(trends.clone()),
            }
        }
        for ((_, trends), r) in self.fields.iter_mut().zip(restored) {
            *trends = r;
        }
        for ((_, trends), counted) in self.fields.iter().zip(&mut self.counted) {
            *counted = trends.changes();
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;
    use rand_distr::{Distribution, Poisson, Zipf};

    const S: i64 = 1_000_000;

    /// Hashtags of a steady stream: each event has one with probability `p_tag`, drawn from
    /// a Zipf law over `n` values (`tag<rank>`), as a sample stream's long tail is.
    struct Steady {
        rng: StdRng,
        rate: Poisson<f64>,
        zipf: Zipf<f64>,
        p_tag: f64,
    }

    impl Steady {
        fn new(seed: u64, per_sec: f64) -> Self {
            Steady {
                rng: StdRng::seed_from_u64(seed),
                rate: Poisson::new(per_sec).unwrap(),
                zipf: Zipf::new(5_000.0, 1.1).unwrap(),
                p_tag: 0.6,
            }
        }

        /// One second of events: their hashtags (`None` for an event without one).
        fn second(&mut self) -> Vec<Option<String>> {
            let n = self.rate.sample(&mut self.rng) as usize;
            (0..n)
                .map(|_| {
                    use rand::RngExt;
                    (self.rng.random::<f64>() < self.p_tag)
                        .then(|| format!("tag{}", self.zipf.sample(&mut self.rng) as u64))
                })
                .collect()
        }
    }

    fn feed(t: &mut FieldTrends, sec: i64, events: &[Option<String>]) {
        for (i, tag) in events.iter().enumerate() {
            let t_us = sec * S + (i as i64 * S) / (events.len() as i64 + 1);
            t.record(t_us, tag.as_deref());
        }
    }

    /// As a feed builds it with the defaults.
    fn trends() -> FieldTrends {
        let c = StatsConfig::default();
        FieldTrends::new(
            CANDIDATES_PER_TOPK * c.topk,
            c.period,
            c.trend_k,
            c.topk_capacity.min(MAX_CAPACITY),
        )
    }

    /// The figures behind the defaults, by hand in release (`cargo test --release -p feeds
    /// --lib value_trend::tests::measure -- --ignored --nocapture`): false breakouts in ten
    /// steady hours, and how many seconds after a hashtag starts to rise from nothing to 30 %
    /// of the stream over a minute it breaks out, for 20 seeds each, at several `k`.
    #[test]
    #[ignore]
    fn measure() {
        for k in [4.5, 5.0, 5.5] {
            let mut false_breakouts = 0;
            for seed in 0..10 {
                let mut t = FieldTrends::new(40, 20, k, MAX_CAPACITY);
                let mut s = Steady::new(seed, 70.0);
                for sec in 0..3_600 {
                    feed(&mut t, sec, &s.second());
                }
                false_breakouts += t.take_breakouts().len();
            }
            let mut delays: Vec<i64> = (0..20)
                .filter_map(|seed| {
                    let mut t = FieldTrends::new(40, 20, k, MAX_CAPACITY);
                    let b = rise(&mut t, seed, 600, 700);
                    b.iter()
                        .find(|b| b.value == "surge")
                        .map(|b| b.second - 600)
                })
                .collect();
            delays.sort_unstable();
            eprintln!(
                "k {k}: {false_breakouts} false breakouts in 10 steady hours; up after {delays:?} s"
            );
        }
    }

    /// The Poisson threshold against known tails: P(X ≥ 10 | 1) = 1.1e-7 and P(X ≥ 9 | 1) =
    /// 1.1e-6 straddle 5σ's 2.9e-7; at 100, 5σ by the normal limit is about 152.
    #[test]
    fn the_poisson_threshold_has_the_normal_tail() {
        assert_eq!(poisson_beyond(1.0, 5.0), 10.0);
        assert_eq!(poisson_beyond(1.0, 2.0), 4.0); // P(X ≥ 4 | 1) = 0.019 ≤ 0.023 < P(X ≥ 3)
        let big = poisson_beyond(100.0, 5.0);
        assert!((150.0..=158.0).contains(&big), "{big}");
        let limit = poisson_beyond(501.0, 5.0);
        let exact = poisson_beyond(499.0, 5.0);
        assert!((limit - exact).abs() < 4.0, "{limit} vs {exact}");
    }

    /// Two hours of a steady 70/s stream with a long Zipf tail: no value breaks out (ten
    /// hours in `measure`).
    #[test]
    fn a_steady_stream_has_no_value_trend() {
        let mut all = Vec::new();
        for seed in 0..2 {
            let mut t = trends();
            let mut s = Steady::new(seed, 70.0);
            for sec in 0..3_600 {
                feed(&mut t, sec, &s.second());
            }
            t.advance_to(3_601 * S);
            all.extend(t.take_breakouts());
        }
        assert!(
            all.is_empty(),
            "{} breakouts in 2 steady hours: {:?}",
            all.len(),
            &all[..all.len().min(5)]
        );
    }

    /// A burst of the whole stream (five times its rate, every value alike) is the rate's
    /// trend, not any value's.
    #[test]
    fn a_burst_of_the_whole_stream_is_no_value_trend() {
        let mut t = trends();
        let mut calm = Steady::new(1, 70.0);
        let mut burst = Steady::new(2, 350.0);
        for sec in 0..600 {
            let events = if (300..330).contains(&sec) {
                burst.second()
            } else {
                calm.second()
            };
            feed(&mut t, sec, &events);
        }
        let b = t.take_breakouts();
        assert!(b.is_empty(), "{b:?}");
    }

    /// A 70/s steady stream in which, from second `start`, a new hashtag `surge` rises from
    /// nothing to 30 % of the events over a minute, holds two minutes, and stops; run to
    /// second `end`. Its breakouts.
    fn rise(t: &mut FieldTrends, seed: u64, start: i64, end: i64) -> Vec<ValueBreakout> {
        use rand::RngExt;
        let mut s = Steady::new(seed, 70.0);
        let mut rng = StdRng::seed_from_u64(seed + 1_000);
        for sec in 0..end {
            let mut events = s.second();
            let share = match sec - start {
                d if d < 0 => 0.0,
                d if d < 60 => 0.3 * d as f64 / 60.0,
                d if d < 180 => 0.3,
                _ => 0.0,
            };
            for e in &mut events {
                if rng.random::<f64>() < share {
                    *e = Some("Surge".to_owned());
                }
            }
            feed(t, sec, &events);
        }
        t.take_breakouts()
    }

    /// A new hashtag that grows from nothing to 30 % of the stream over a minute breaks out
    /// up within 10 s of the start of its rise, once, and no other value breaks out up. (Some
    /// break out down: a value at 30 % takes its share from the others.)
    #[test]
    fn a_rising_hashtag_breaks_out_within_ten_seconds() {
        for seed in 0..10 {
            let b = rise(&mut trends(), seed, 600, 900);
            let ups: Vec<_> = b.iter().filter(|b| b.direction == Trend::Up).collect();
            assert_eq!(
                ups.iter().map(|b| b.value.as_str()).collect::<Vec<_>>(),
                ["surge"],
                "seed {seed}: {b:?}"
            );
            let delay = ups[0].second - 600;
            assert!(delay <= 10, "seed {seed}: up at +{delay} s");
            assert!(
                b.iter()
                    .all(|b| b.value != "surge" || b.direction == Trend::Up),
                "seed {seed}: {b:?}"
            );
        }
    }

    /// A value that hovers on its band is one breakout, not one per crossing.
    #[test]
    fn a_value_on_its_band_does_not_flap() {
        let mut t = trends();
        let mut s = Steady::new(4, 70.0);
        let mut rng = StdRng::seed_from_u64(99);
        for sec in 0..1_200 {
            let mut events = s.second();
            // 20 % of the stream from minute 10 on, in alternating seconds of 30 % and 10 %.
            let share = match sec {
                ..600 => 0.0,
                s if s % 2 == 0 => 0.3,
                _ => 0.1,
            };
            for e in &mut events {
                use rand::RngExt;
                if rng.random::<f64>() < share {
                    *e = Some("hover".to_owned());
                }
            }
            feed(&mut t, sec, &events);
        }
        let ups = t
            .take_breakouts()
            .into_iter()
            .filter(|b| b.direction == Trend::Up)
            .count();
        assert_eq!(ups, 1);
    }

    /// Long-tail values never seen twice, each longer than a key may be, leave the state
    /// bounded: the past keeps `period` minutes of `KEEP_PER_MINUTE` values cut to 256 bytes,
    /// and states exist only for candidates.
    #[test]
    fn a_long_tail_keeps_the_state_bounded() {
        let mut t = FieldTrends::new(40, 5, 5.0, 64);
        for sec in 0..480i64 {
            let events: Vec<Option<String>> = (0..200)
                .map(|i| Some(format!("{sec}-{i}-{}", "x".repeat(300))))
                .collect();
            feed(&mut t, sec, &events);
        }
        assert_eq!(t.minutes.len(), 5);
        assert!(t.minutes.iter().all(|m| m.counts.len() <= KEEP_PER_MINUTE));
        assert!(
            t.minutes
                .iter()
                .all(|m| m.counts.iter().all(|c| c.value.len() <= 256))
        );
        assert!(t.states.len() <= 2 * 40);
        assert!(t.take_breakouts().is_empty());
    }

    /// Saved and restored mid-stream, it continues exactly as if never stopped.
    #[test]
    fn a_restored_state_continues_exactly() {
        let script = |t: &mut FieldTrends, from: i64, to: i64| {
            let mut s = Steady::new(7, 70.0);
            let mut rng = StdRng::seed_from_u64(8);
            let mut out = Vec::new();
            for sec in 0..to {
                let mut events = s.second();
                for e in &mut events {
                    use rand::RngExt;
                    if sec >= 400 && rng.random::<f64>() < 0.25 {
                        *e = Some("surge".to_owned());
                    }
                }
                if sec >= from {
                    feed(t, sec, &events);
                    out.extend(t.take_breakouts());
                }
            }
            out
        };
        let mut whole = trends();
        let expected = script(&mut whole, 0, 800);
        assert!(!expected.is_empty());
        let mut first = trends();
        let mut seen = script(&mut first, 0, 390);
        let saved = serde_json::to_value(&first).unwrap();
        let mut second: FieldTrends = serde_json::from_value(saved).unwrap();
        let rest = script(&mut second, 390, 800);
        seen.extend(rest);
        assert_eq!(seen, expected);
    }
}
