//! Events-per-second series with Bollinger bands over the per-second counts.
//!
//! Events are counted into whole-second buckets; each closed second becomes
//! one point of the series, including seconds in which nothing happened, so
//! a stalled feed shows up as a rate of 0 rather than as a missing point.

use serde::{Deserialize, Serialize};

use metrics::Gauge;
use serde_json::{Map, Value, json};

use super::bollinger::{BandGauges, Bands, Bollinger};
use super::{Event, Registration, StatChange, Statistic, StatsConfig, from_state, to_state};
use crate::telemetry as t;

/// Microseconds per second, the bucket width.
const US_PER_SEC: i64 = 1_000_000;

/// What the rate series looks like after one call, for a snapshot.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq)]
pub struct RateUpdate {
    /// Events counted in the most recently *closed* second; 0 before any
    /// second has closed. The open second is excluded because its count is
    /// still partial and would read as a drop.
    pub rate: f64,
    /// Events counted so far in the open second, for callers that want a
    /// live (partial) figure.
    pub current: u64,
    /// Bands over the last `period` closed seconds, `None` until `period`
    /// seconds have closed.
    pub bands: Option<Bands>,
}

/// Where the rate stands against its bands.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Trend {
    /// Within the bands, or back at the moving average after a breakout.
    #[default]
    Steady,
    /// Above the upper band for [`BREAKOUT_SECONDS`] closed seconds in a row, and not yet back
    /// down to the moving average.
    Up,
    /// Below the lower band likewise, and not yet back up to the moving average.
    Down,
}

/// Closed seconds in a row beyond a band before the rate is said to have broken out: one
/// second of a steady Poisson stream lands beyond 2σ about one time in forty, three in a row
/// about once in 18 hours.
pub const BREAKOUT_SECONDS: u32 = 3;

/// The breakout detector: hysteresis, so a rate hovering on a band does not flap. It breaks
/// out after [`BREAKOUT_SECONDS`] seconds beyond a band and is steady again only once a
/// second crosses the moving average.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrendState {
    /// Where the rate stands.
    pub trend: Trend,
    /// Closed seconds in a row above the upper band (positive) or below the lower (negative).
    run: i64,
    /// Breakouts so far: up, then down.
    pub changes: [u64; 2],
}

impl TrendState {
    /// Steady, and not partway into a breakout: a state with nothing to remember but its
    /// counts.
    pub fn is_quiet(&self) -> bool {
        self.trend == Trend::Steady && self.run == 0
    }

    /// Takes one closed second's count against the bands before it; the new trend if it broke
    /// out with this second.
    pub fn observe(&mut self, count: f64, bands: Option<Bands>) -> Option<Trend> {
        self.observe_for(count, bands, BREAKOUT_SECONDS)
    }

    /// [`TrendState::observe`], breaking out after `seconds` in a row beyond a band.
    pub fn observe_for(&mut self, count: f64, bands: Option<Bands>, seconds: u32) -> Option<Trend> {
        let b = bands?;
        match self.trend {
            Trend::Up if count <= b.middle => self.trend = Trend::Steady,
            Trend::Down if count >= b.middle => self.trend = Trend::Steady,
            _ => {}
        }
        self.run = if count > b.upper {
            self.run.max(0) + 1
        } else if count < b.lower {
            self.run.min(0) - 1
        } else {
            0
        };
        let breakout = if self.run >= i64::from(seconds) && self.trend != Trend::Up {
            Trend::Up
        } else if self.run <= -i64::from(seconds) && self.trend != Trend::Down {
            Trend::Down
        } else {
            return None;
        };
        self.trend = breakout;
        self.changes[usize::from(breakout == Trend::Down)] += 1;
        Some(breakout)
    }
}

/// Turns event timestamps into a per-second rate series.
///
/// State is one open bucket plus the inner [`Bollinger`] window, so it stays
/// O(period) however long the stream runs or however large a gap is.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct RateSeries {
    bollinger: Bollinger,
    /// Second (since the Unix epoch) of the open bucket; `None` until the
    /// first event, since before that there is no known start of the stream.
    current_sec: Option<i64>,
    /// Events counted in the open bucket.
    current: u64,
    /// Events counted in the most recently closed second.
    last_rate: u64,
    /// Breakouts of the closed seconds from their bands (absent from older checkpoints).
    #[serde(default)]
    trend: TrendState,
    /// Breakouts not yet taken ([`RateSeries::take_breakouts`]). Not checkpointed: a feed
    /// restarted from a checkpoint before one meets it again as it replays.
    #[serde(skip)]
    breakouts: Vec<Breakout>,
}

/// One breakout of the rate from its bands: the second that completed it.
#[derive(Clone, Debug, PartialEq)]
pub struct Breakout {
    /// The second (since the Unix epoch).
    pub second: i64,
    pub direction: Trend,
    /// That second's count.
    pub rate: f64,
    /// The bands it was measured against (those of the seconds before it).
    pub bands: Bands,
}

impl RateSeries {
    /// Creates a series whose bands span `period` seconds at `k` standard
    /// deviations (parameters as for [`Bollinger::new`]).
    pub fn new(period: usize, k: f64) -> Self {
        Self {
            bollinger: Bollinger::new(period, k),
            current_sec: None,
            current: 0,
            last_rate: 0,
            trend: TrendState::default(),
            breakouts: Vec::new(),
        }
    }

    /// The breakouts since the last call, oldest first.
    pub fn take_breakouts(&mut self) -> Vec<Breakout> {
        std::mem::take(&mut self.breakouts)
    }

    /// Takes one closed second into the breakout detector, then into the bands.
    fn close_second(&mut self, second: i64, count: f64) {
        let bands = self.bollinger.bands();
        if let (Some(direction), Some(bands)) = (self.trend.observe(count, bands), bands) {
            self.breakouts.push(Breakout {
                second,
                direction,
                rate: count,
                bands,
            });
        }
        self.bollinger.push(count);
    }

    /// Where the rate stands against its bands, and the breakouts so far.
    pub fn trend(&self) -> TrendState {
        self.trend
    }

    /// Counts one event at `t_us` (microseconds since the Unix epoch).
    ///
    /// An event in a later second closes the open second (and every empty
    /// second in between, as zeros) before being counted. An event whose
    /// second is earlier than the open one — clock skew, replay — is counted
    /// into the open second: closed seconds are never reopened, because
    /// their points are already in the bands and in earlier snapshots.
    pub fn record(&mut self, t_us: i64) -> RateUpdate {
        let sec = t_us.div_euclid(US_PER_SEC);
        match self.current_sec {
            Some(open) if sec > open => self.close_until(open, sec),
            Some(_) => {}
            None => self.current_sec = Some(sec),
        }
        self.current = self.current.saturating_add(1);
        self.last()
    }

    /// Moves the clock to `t_us` without an event, closing every second
    /// before it, so a quiet stream still drives the rate down to 0.
    ///
    /// Does nothing before the first event (there is no open second to
    /// close, and inventing a start would add zeros the stream never had)
    /// or when `t_us` is not past the open second.
    pub fn advance_to(&mut self, t_us: i64) -> RateUpdate {
        let sec = t_us.div_euclid(US_PER_SEC);
        match self.current_sec {
            Some(open) if sec > open => self.close_until(open, sec),
            _ => {}
        }
        self.last()
    }

    /// The current figures without changing anything, e.g. for a snapshot
    /// after a restore.
    pub fn last(&self) -> RateUpdate {
        RateUpdate {
            rate: self.last_rate as f64,
            current: self.current,
            bands: self.bollinger.bands(),
        }
    }

    /// Closes the open second `open` and the empty seconds up to (not
    /// including) `sec`, then opens `sec` with a count of 0.
    fn close_until(&mut self, open: i64, sec: i64) {
        // Counts far beyond 2^53 would lose precision as f64; irrelevant at
        // realistic rates, and it cannot panic.
        // Against the bands of the seconds before it, then into them.
        self.close_second(open, self.current as f64);
        self.last_rate = self.current;
        // Saturating: the difference of two far-apart seconds cannot
        // overflow the cap below anyway.
        let empty = sec.saturating_sub(open).saturating_sub(1);
        if empty > 0 {
            // More than `period` zeros cannot change the window (it is then
            // all zeros), so stop there to keep a long silence O(period).
            let zeros = usize::try_from(empty)
                .unwrap_or(usize::MAX)
                .min(self.bollinger.period());
            for k in 0..zeros {
                self.close_second(open + 1 + k as i64, 0.0);
            }
            // The most recent closed second is an empty one.
            self.last_rate = 0;
        }
        self.current_sec = Some(sec);
        self.current = 0;
    }
}

/// The rate statistic of a feed: events per closed second, with Bollinger bands over the
/// per-second series, and its breakouts from them. Snapshot fields `rate`, `rate_bands`,
/// `trend` and `trend_changes`; metrics `tailrace_rate_events_per_second`,
/// `tailrace_bollinger{series="rate"}` and `tailrace_trend_changes_total{direction}`.
pub struct Rate {
    series: RateSeries,
    /// The bands' window (seconds) and width (σ), said in each trend document.
    window_s: usize,
    k: f64,
    rate: Gauge,
    bands: BandGauges,
    /// Breakouts up and down counted into the metric so far.
    counted: [u64; 2],
    changes: [metrics::Counter; 2],
}

impl Rate {
    /// The rate of `feed`, with bands of `config.period` seconds at `config.k` σ.
    pub fn new(config: &StatsConfig, feed: &str) -> Self {
        Rate {
            series: RateSeries::new(config.period, config.k),
            window_s: config.period,
            k: config.k,
            rate: metrics::gauge!(t::RATE, "feed" => feed.to_string()),
            bands: BandGauges::new(feed, "rate"),
            counted: [0; 2],
            changes: ["up", "down"].map(|d| {
                metrics::counter!(t::TREND_CHANGES, "feed" => feed.to_string(), "direction" => d)
            }),
        }
    }
}

/// Built for every feed; reads the event time only (the stamp).
pub const REGISTRATION: Registration = Registration {
    build: |c, feed| Box::new(Rate::new(c, feed)),
    reads: super::reads_nothing,
};

impl Statistic for Rate {
    fn name(&self) -> &'static str {
        "rate"
    }

    fn on_event(&mut self, e: &Event<'_>) {
        self.series.record(e.t_us);
    }

    fn advance(&mut self, now_us: i64) {
        self.series.advance_to(now_us);
    }

    fn snapshot(&self, out: &mut Map<String, Value>) {
        let last = self.series.last();
        out.insert("rate".into(), json!(last.rate));
        out.insert("rate_bands".into(), json!(last.bands));
        let trend = self.series.trend();
        out.insert("trend".into(), json!(trend.trend));
        out.insert(
            "trend_changes".into(),
            json!({"up": trend.changes[0], "down": trend.changes[1]}),
        );
    }

    fn publish(&mut self, _figures: &Map<String, Value>) {
        let last = self.series.last();
        self.rate.set(last.rate);
        self.bands.set(last.bands);
        // Counted once each: a restored feed continues from its checkpoint's counts.
        let changes = self.series.trend().changes;
        for ((counter, now), before) in self.changes.iter().zip(changes).zip(self.counted) {
            counter.increment(now.saturating_sub(before));
        }
        self.counted = changes;
    }

    /// Each breakout as a trend document: `{"statistic": "rate", "direction": "up",
    /// "at": <date of the second>, "rate", "band": {"upper", "middle", "lower"}, "window_s",
    /// "k"}`, keyed `rate:<second>`.
    fn take_changes(&mut self) -> Vec<StatChange> {
        let (window_s, k) = (self.window_s, self.k);
        self.series
            .take_breakouts()
            .into_iter()
            .filter_map(|b| {
                let at = store::date::value(b.second.saturating_mul(1000))?;
                let doc = json!({
                    "statistic": "rate",
                    "direction": b.direction,
                    "at": at,
                    "rate": b.rate,
                    "band": {"upper": b.bands.upper, "middle": b.bands.middle, "lower": b.bands.lower},
                    "window_s": window_s,
                    "k": k,
                });
                Some(StatChange {
                    key: format!("rate:{}", b.second),
                    doc: doc.as_object()?.clone(),
                })
            })
            .collect()
    }

    fn save(&self) -> Value {
        to_state(&self.series)
    }

    fn restore(&mut self, state: &Value) -> Result<(), String> {
        self.series = from_state(state)?;
        // Breakouts before the restart were counted by the process that saw them.
        self.counted = self.series.trend().changes;
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const TOL: f64 = 1e-9;
    const S: i64 = 1_000_000;

    fn assert_close(what: &str, expected: f64, seen: f64) {
        assert!(
            (expected - seen).abs() <= TOL,
            "{what}: expected {expected}, seen {seen}"
        );
    }

    fn assert_update(what: &str, expected_rate: f64, expected_current: u64, seen: RateUpdate) {
        assert_close(&format!("{what} rate"), expected_rate, seen.rate);
        assert_eq!(
            seen.current, expected_current,
            "{what} current: expected {expected_current}, seen {}",
            seen.current
        );
    }

    #[test]
    fn counts_per_closed_second() {
        let mut r = RateSeries::new(3, 2.0);
        // (timestamp, expected rate, expected current), counted by hand:
        // second 0 gets 3 events, second 1 gets 2, second 2 gets 1.
        let table = [
            (100_000, 0.0, 1),
            (500_000, 0.0, 2),
            (999_999, 0.0, 3),
            (S + 200_000, 3.0, 1),
            (S + 300_000, 3.0, 2),
            (2 * S, 2.0, 1),
        ];
        for (i, (t, rate, current)) in table.into_iter().enumerate() {
            let u = r.record(t);
            assert_update(&format!("step {i}"), rate, current, u);
            assert_eq!(u.bands, None, "step {i}: fewer than 3 closed seconds");
            assert_eq!(r.last(), u, "step {i}: last() vs returned update");
        }
    }

    #[test]
    fn bands_over_closed_seconds() {
        let mut r = RateSeries::new(3, 2.0);
        // Seconds 0,1,2 get 3,1,2 events; an event in second 3 closes them.
        for t in [0, 1, 2, S, 2 * S, 2 * S + 1] {
            r.record(t);
        }
        let u = r.record(3 * S);
        // reference: python statistics.mean / statistics.pstdev([3, 1, 2]),
        // upper/lower = mean ± 2*pstdev
        let b = u.bands.unwrap();
        assert_close("upper", 3.632993161855452, b.upper);
        assert_close("middle", 2.0, b.middle);
        assert_close("lower", 0.36700683814454793, b.lower);
        assert_close("stddev", 0.816496580927726, b.stddev);
        assert_update("after second 2", 2.0, 1, u);
    }

    #[test]
    fn empty_seconds_become_zero_points() {
        let mut r = RateSeries::new(4, 2.0);
        for _ in 0..4 {
            r.record(10 * S);
        }
        for _ in 0..2 {
            r.record(11 * S + 5);
        }
        // Jump to second 13: closes 11 (2 events) and empty second 12.
        let u = r.record(13 * S);
        assert_update("after gap", 0.0, 1, u);
        assert_eq!(u.bands, None, "3 closed seconds of 4");
        // Second 14 closes 13 (1 event): window is [4, 2, 0, 1].
        let u = r.record(14 * S);
        assert_update("after second 13", 1.0, 1, u);
        // reference: python statistics.mean / statistics.pstdev([4, 2, 0, 1]),
        // upper/lower = mean ± 2*pstdev
        let b = u.bands.unwrap();
        assert_close("upper", 4.708039891549808, b.upper);
        assert_close("middle", 1.75, b.middle);
        assert_close("lower", -1.208039891549808, b.lower);
        assert_close("stddev", 1.479019945774904, b.stddev);
    }

    #[test]
    fn long_gap_is_capped_but_equivalent() {
        let mut r = RateSeries::new(3, 2.0);
        r.record(0);
        let u = r.record(1_000_000 * S);
        // Reference: the same points pushed without the cap.
        let mut reference = Bollinger::new(3, 2.0);
        reference.push(1.0);
        for _ in 0..999_999 {
            reference.push(0.0);
        }
        assert_eq!(u.bands, reference.bands(), "capped vs uncapped bands");
        assert_eq!(r.bollinger, reference, "capped vs uncapped window");
        assert_update("after long gap", 0.0, 1, u);
        // Extreme timestamps must not overflow.
        let mut r = RateSeries::new(3, 2.0);
        r.record(i64::MIN);
        let u = r.record(i64::MAX);
        assert_update("i64 extremes", 0.0, 1, u);
    }

    #[test]
    fn out_of_order_events_count_into_open_second() {
        let mut r = RateSeries::new(3, 2.0);
        r.record(5 * S);
        r.record(5 * S + 1);
        // Earlier second: counted into open second 5.
        let u = r.record(3 * S);
        assert_update("skewed event", 0.0, 3, u);
        let u = r.record(6 * S);
        assert_update("close 5", 3.0, 1, u);
        // Second 5 is closed now; a late event for it goes to second 6.
        let u = r.record(5 * S + 999_999);
        assert_update("late event after close", 3.0, 2, u);
        let u = r.record(7 * S);
        assert_update("close 6", 2.0, 1, u);
    }

    #[test]
    fn negative_timestamps_use_floor_seconds() {
        let mut r = RateSeries::new(3, 2.0);
        // -1 µs is in second -1 (floor), not second 0 (truncation).
        r.record(-1);
        let u = r.record(0);
        assert_update("-1us then 0us", 1.0, 1, u);
    }

    #[test]
    fn advance_to_on_quiet_stream() {
        let mut r = RateSeries::new(2, 2.0);
        let fresh = r.clone();
        let u = r.advance_to(50 * S);
        assert_update("before any event", 0.0, 0, u);
        assert_eq!(
            r, fresh,
            "advance_to before any event must not change state"
        );

        for _ in 0..3 {
            r.record(0);
        }
        let u = r.advance_to(S + 500_000);
        assert_update("close second 0", 3.0, 0, u);
        assert_eq!(u.bands, None, "1 of 2 closed seconds");
        let u = r.advance_to(2 * S);
        assert_update("close quiet second 1", 0.0, 0, u);
        // reference: python statistics.mean / statistics.pstdev([3, 0]) = 1.5, 1.5
        let b = u.bands.unwrap();
        assert_close("middle", 1.5, b.middle);
        assert_close("stddev", 1.5, b.stddev);
        let before = r.clone();
        let u = r.advance_to(S);
        assert_eq!(r, before, "advance_to into the past must not change state");
        assert_update("advance backwards", 0.0, 0, u);
        let u = r.advance_to(100 * S);
        let b = u.bands.unwrap();
        assert_eq!(
            (b.middle, b.stddev),
            (0.0, 0.0),
            "long quiet stream: expected flat zero bands, seen {b:?}"
        );
        // An event after the quiet period lands in the advanced second.
        let u = r.record(100 * S + 1);
        assert_update("event after advance", 0.0, 1, u);
    }

    #[test]
    fn checkpoint_round_trip_matches_uninterrupted_run() {
        // Irregular timestamps with bursts, skew and a 7-second silence
        // every 40 events.
        let times: Vec<i64> = (0..200_i64)
            .map(|i| i * 370_000 + (i % 7) * 900_000 - (i % 5) * 1_100_000 + (i / 40) * 7 * S)
            .collect();
        let mut straight = RateSeries::new(5, 2.0);
        let expected: Vec<RateUpdate> = times.iter().map(|&t| straight.record(t)).collect();
        let expected_tail = straight.advance_to(300 * S);

        let mut first = RateSeries::new(5, 2.0);
        let mut seen: Vec<RateUpdate> = times[..100].iter().map(|&t| first.record(t)).collect();
        let json = serde_json::to_string(&first).unwrap();
        let mut restored: RateSeries = serde_json::from_str(&json).unwrap();
        assert_eq!(restored, first, "restored state vs saved state");
        assert_eq!(restored.last(), first.last(), "last() after restore");
        seen.extend(times[100..].iter().map(|&t| restored.record(t)));
        assert_eq!(seen, expected, "restored run vs uninterrupted run");
        assert_eq!(restored.advance_to(300 * S), expected_tail, "advance_to");
        assert_eq!(restored, straight, "final state");
    }

    /// Feeds `counts`, one per second, and returns the breakouts (second, trend).
    fn breakouts(series: &mut RateSeries, from_sec: i64, counts: &[u64]) -> Vec<(i64, Trend)> {
        let mut out = Vec::new();
        for (i, n) in counts.iter().enumerate() {
            let sec = from_sec + i as i64;
            for j in 0..*n {
                series.record(sec * S + (j as i64 * S) / (*n as i64).max(1));
            }
            let before = series.trend().changes;
            series.advance_to((sec + 1) * S);
            let after = series.trend();
            if after.changes != before {
                out.push((sec, after.trend));
            }
        }
        out
    }

    /// Poisson counts at `mean` a second, from a seeded generator.
    fn poisson(seed: u64, mean: f64, seconds: usize) -> Vec<u64> {
        use rand::SeedableRng;
        use rand_distr::{Distribution, Poisson};
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let p = Poisson::new(mean).unwrap();
        (0..seconds).map(|_| p.sample(&mut rng) as u64).collect()
    }

    /// A scripted burst on a 70/s stream gives exactly one breakout up when it starts and one
    /// down after it ends, for every seed tried.
    #[test]
    fn a_burst_breaks_out_once_up_and_once_down() {
        for seed in 0..20 {
            let mut counts = poisson(seed, 70.0, 120);
            counts.extend(poisson(seed + 100, 350.0, 30));
            counts.extend(poisson(seed + 200, 70.0, 120));
            let mut series = RateSeries::new(20, 2.0);
            let b = breakouts(&mut series, 1_000, &counts);
            let trends: Vec<Trend> = b.iter().map(|(_, t)| *t).collect();
            assert_eq!(trends, [Trend::Up, Trend::Down], "seed {seed}: {b:?}");
            // Up within the burst's first seconds, down within seconds of its end.
            assert!((1_120..1_120 + 5).contains(&b[0].0), "seed {seed}: {b:?}");
            assert!((1_150..1_150 + 5).contains(&b[1].0), "seed {seed}: {b:?}");
            assert_eq!(series.trend().changes, [1, 1]);
        }
    }

    /// An hour of a steady 70/s Poisson stream: no breakout (each seed is its own hour).
    #[test]
    fn a_steady_stream_does_not_break_out() {
        let mut total = 0;
        for seed in 0..5 {
            let mut series = RateSeries::new(20, 2.0);
            total += breakouts(&mut series, 0, &poisson(seed, 70.0, 3_600)).len();
        }
        // Three seconds in a row beyond 2σ: about once in 18 hours of Poisson noise.
        assert!(
            total <= 1,
            "{total} breakouts in 5 hours of a steady stream"
        );
    }

    /// A rate sitting on the upper band, in and out of it, is one breakout, not one per
    /// crossing: it is steady again only back at the moving average.
    #[test]
    fn a_rate_hovering_on_the_band_does_not_flap() {
        let mut t = TrendState::default();
        let bands = Some(Bands {
            upper: 100.0,
            middle: 70.0,
            lower: 40.0,
            stddev: 15.0,
        });
        let seen: Vec<Option<Trend>> = [
            101.0, 102.0, 103.0, 99.0, 101.0, 102.0, 104.0, 95.0, 101.0, 101.0, 101.0,
        ]
        .iter()
        .map(|c| t.observe(*c, bands))
        .collect();
        assert_eq!(seen.iter().flatten().count(), 1, "{seen:?}");
        assert_eq!(t.trend, Trend::Up);
        assert_eq!(t.observe(70.0, bands), None);
        assert_eq!(t.trend, Trend::Steady);
        // A stream that stops breaks out down (empty seconds count as zeros).
        let mut series = RateSeries::new(20, 2.0);
        let mut counts = poisson(7, 70.0, 60);
        counts.extend([0; 10]);
        let b = breakouts(&mut series, 0, &counts);
        assert_eq!(b.last().map(|(_, t)| *t), Some(Trend::Down), "{b:?}");
    }

    /// A checkpoint written before breakouts were kept restores, steady with none counted.
    #[test]
    fn a_checkpoint_without_a_trend_restores() {
        let mut series = RateSeries::new(3, 2.0);
        series.record(5 * S);
        series.advance_to(9 * S);
        let mut state = serde_json::to_value(&series).unwrap();
        state.as_object_mut().unwrap().remove("trend");
        let restored: RateSeries = serde_json::from_value(state).unwrap();
        assert_eq!(restored.trend(), TrendState::default());
        assert_eq!(restored.last(), series.last());
    }
}
