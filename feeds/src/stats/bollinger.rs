//! Bollinger bands over a fixed-size window of the most recent values.
//!
//! Follows John Bollinger's definition: the middle band is the simple moving
//! average of the last `period` values, σ is the *population* standard
//! deviation (divide by N) of those same values, and the outer bands sit at
//! `middle ± k·σ`.

use std::collections::VecDeque;
use std::fmt;

use metrics::Gauge;
use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value, json};

use super::{Event, Registration, Statistic, StatsConfig, from_state, to_state};
use crate::telemetry as t;

/// One evaluation of the bands; a plain value so callers can copy it into
/// snapshots and alerts freely.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq)]
pub struct Bands {
    /// `middle + k·σ`: values above it are unusually high for the window.
    pub upper: f64,
    /// Simple moving average of the window.
    pub middle: f64,
    /// `middle - k·σ`: values below it are unusually low for the window.
    pub lower: f64,
    /// Population standard deviation of the window, exposed so callers can
    /// tell a flat series (σ = 0) from a tight band chosen by a small `k`.
    pub stddev: f64,
}

/// Rolling Bollinger bands whose whole state is the last `period` values, so
/// a checkpoint of it restores to exactly the same future results.
///
/// Floats in the state (`k` and the window) are written to checkpoints as
/// strings holding Rust's shortest round-trip representation, because
/// serde_json's default float parser may be off by one ulp and a restored
/// window must be bit-identical. Plain JSON numbers are accepted on read so
/// hand-written states still load.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Bollinger {
    period: usize,
    #[serde(with = "exact_f64")]
    k: f64,
    #[serde(with = "exact_f64_deque")]
    window: VecDeque<f64>,
}

impl Bollinger {
    /// Creates empty bands over the last `period` values at `k` standard
    /// deviations.
    ///
    /// A `period` of 0 is treated as 1, because an empty window has no mean
    /// and the caller most likely meant "latest value only". A non-finite
    /// `k` is treated as 0 (bands collapse onto the moving average), because
    /// a NaN or infinite `k` would poison every band and could not be written
    /// to a JSON checkpoint. A negative `k` is kept as given and simply swaps
    /// the roles of `upper` and `lower`.
    pub fn new(period: usize, k: f64) -> Self {
        let period = period.max(1);
        let k = if k.is_finite() { k } else { 0.0 };
        Self {
            period,
            k,
            window: VecDeque::with_capacity(period),
        }
    }

    /// Number of values the bands are computed over.
    pub fn period(&self) -> usize {
        self.period
    }

    /// Width of the bands in standard deviations.
    pub fn k(&self) -> f64 {
        self.k
    }

    /// Number of values currently held (at most `period`), so callers can
    /// show warm-up progress.
    pub fn len(&self) -> usize {
        self.window.len()
    }

    /// True before any value has been pushed.
    pub fn is_empty(&self) -> bool {
        self.window.is_empty()
    }

    /// Adds `x` as the newest value, dropping the oldest once the window is
    /// full, and returns the bands afterwards.
    ///
    /// Non-finite values (NaN, ±inf) are ignored — not pushed — because one
    /// of them would make the bands NaN for the next `period` values; the
    /// current bands are returned unchanged in that case. Returns `None`
    /// until `period` values have been pushed (see [`Bollinger::bands`]).
    pub fn push(&mut self, x: f64) -> Option<Bands> {
        if x.is_finite() {
            self.window.push_back(x);
            // `while` rather than `if` so a checkpoint holding a longer
            // window (hand-edited state) is trimmed back to the invariant.
            while self.window.len() > self.period {
                self.window.pop_front();
            }
        }
        self.bands()
    }

    /// Bands over the current window.
    ///
    /// Returns `None` while fewer than `period` values have been seen: the
    /// bands are defined over exactly `period` values, and reporting bands
    /// over a partial window would make the first few values look wildly
    /// out of band (or falsely calm) while the window warms up.
    pub fn bands(&self) -> Option<Bands> {
        let n = self.period;
        if n == 0 || self.window.len() < n {
            return None;
        }
        // Only the newest `period` values count, even if a restored state
        // somehow carried more.
        let values = self.window.range(self.window.len() - n..);
        let (middle, stddev) = mean_pstdev(values)?;
        Some(Bands {
            upper: middle + self.k * stddev,
            middle,
            lower: middle - self.k * stddev,
            stddev,
        })
    }
}

/// Mean and population standard deviation of `values` (`None` if empty),
/// computed with two passes over data shifted by its first value.
///
/// The shift keeps the sums small when values share a large offset (prices
/// around 1e9 that move by units) and makes a constant series give exactly
/// that constant as the mean and exactly 0 as σ, which a plain `sum / n`
/// would not (0.1 summed 20 times and divided by 20 is not 0.1). The second
/// pass uses the corrected two-pass formula `(Σd² − (Σd)²/n) / n`, which
/// cancels the rounding error left in the mean and, unlike a running sum of
/// squares, cannot drift negative over time; the final clamp only guards
/// against the last ulp.
fn mean_pstdev<'a, I>(values: I) -> Option<(f64, f64)>
where
    I: ExactSizeIterator<Item = &'a f64> + Clone,
{
    let nf = values.len() as f64;
    let shift = *values.clone().next()?;
    let shifted_sum: f64 = values.clone().map(|&x| x - shift).sum();
    let mean = shift + shifted_sum / nf;
    let (sum_d, sum_d2) = values.fold((0.0_f64, 0.0_f64), |(s, s2), &x| {
        let d = x - mean;
        (s + d, s2 + d * d)
    });
    let variance = ((sum_d2 - sum_d * sum_d / nf) / nf).max(0.0);
    Some((mean, variance.sqrt()))
}

/// Parses a checkpointed float written either as a string (our own format)
/// or as a plain JSON number (hand-written or older state).
struct ExactF64Visitor;

impl Visitor<'_> for ExactF64Visitor {
    type Value = f64;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a finite float, as a string or a number")
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<f64, E> {
        finite(v)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<f64, E> {
        finite(v as f64)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<f64, E> {
        finite(v as f64)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<f64, E> {
        // std's parser rounds correctly, so the shortest representation
        // written by `{:?}` comes back bit-identical.
        let x: f64 = v.trim().parse().map_err(E::custom)?;
        finite(x)
    }
}

/// Rejects non-finite floats on restore: the live state never holds them,
/// so one in a checkpoint means the checkpoint is corrupt.
fn finite<E: de::Error>(x: f64) -> Result<f64, E> {
    if x.is_finite() {
        Ok(x)
    } else {
        Err(E::custom(format!("non-finite float {x} in checkpoint")))
    }
}

/// Newtype so one float can be (de)serialized exactly inside a sequence.
struct ExactF64(f64);

impl Serialize for ExactF64 {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // `{:?}` is the shortest string that parses back to the same bits
        // and uses exponent notation for very large or small magnitudes.
        s.collect_str(&format_args!("{:?}", self.0))
    }
}

impl<'de> Deserialize<'de> for ExactF64 {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ExactF64Visitor).map(ExactF64)
    }
}

/// `#[serde(with)]` helper for a single float stored exactly.
mod exact_f64 {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::ExactF64;

    /// Writes `x` as its shortest round-trip string.
    pub fn serialize<S: Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
        ExactF64(*x).serialize(s)
    }

    /// Reads a float written by `serialize` or as a plain number.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        ExactF64::deserialize(d).map(|x| x.0)
    }
}

/// `#[serde(with)]` helper for the window, stored exactly value by value.
mod exact_f64_deque {
    use std::collections::VecDeque;
    use std::fmt;

    use serde::de::{SeqAccess, Visitor};
    use serde::{Deserializer, Serializer};

    use super::ExactF64;

    /// Writes the window oldest first.
    pub fn serialize<S: Serializer>(w: &VecDeque<f64>, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(w.iter().map(|&x| ExactF64(x)))
    }

    /// Reads the window back in the same order.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<VecDeque<f64>, D::Error> {
        d.deserialize_seq(SeqVisitor)
    }

    struct SeqVisitor;

    impl<'de> Visitor<'de> for SeqVisitor {
        type Value = VecDeque<f64>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a sequence of finite floats")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            // Cap the pre-allocation: the size hint comes from the input.
            let mut out = VecDeque::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
            while let Some(ExactF64(x)) = seq.next_element()? {
                out.push_back(x);
            }
            Ok(out)
        }
    }
}

/// The three `tailrace_bollinger{feed, series, band}` gauges of one series.
pub(crate) struct BandGauges([Gauge; 3]);

impl BandGauges {
    /// The gauges of `series` (`rate`, `value`) of `feed`.
    pub(crate) fn new(feed: &str, series: &'static str) -> Self {
        let band = |band: &'static str| metrics::gauge!(t::BOLLINGER, "feed" => feed.to_string(), "series" => series, "band" => band);
        BandGauges([band("upper"), band("middle"), band("lower")])
    }

    /// Publishes the bands, once there are any.
    pub(crate) fn set(&self, bands: Option<Bands>) {
        if let Some(b) = bands {
            self.0[0].set(b.upper);
            self.0[1].set(b.middle);
            self.0[2].set(b.lower);
        }
    }
}

/// Bollinger bands over the numeric `value_field` of every event (events where it is absent
/// or not a number are skipped). Snapshot field `value_bands`; metric
/// `tailrace_bollinger{series="value"}`.
pub struct ValueBands {
    field: String,
    bands: Bollinger,
    gauges: BandGauges,
}

impl ValueBands {
    /// Bands of `config.period` values at `config.k` σ over `config.value_field`.
    pub fn new(config: &StatsConfig, feed: &str) -> Self {
        ValueBands {
            field: config.value_field.clone(),
            bands: Bollinger::new(config.period, config.k),
            gauges: BandGauges::new(feed, "value"),
        }
    }
}

/// Built for every feed; reads `value_field`.
pub const REGISTRATION: Registration = Registration {
    build: |c, feed| Box::new(ValueBands::new(c, feed)),
    reads: |c| vec![("value_field", c.value_field.clone())],
};

impl Statistic for ValueBands {
    fn name(&self) -> &'static str {
        "values"
    }

    fn on_event(&mut self, e: &Event<'_>) {
        if let Some(v) = store::update::get_path(e.doc, &self.field).and_then(Value::as_f64) {
            self.bands.push(v);
        }
    }

    fn advance(&mut self, _now_us: i64) {}

    fn snapshot(&self, out: &mut Map<String, Value>) {
        out.insert("value_bands".into(), json!(self.bands.bands()));
    }

    fn publish(&mut self, _figures: &Map<String, Value>) {
        self.gauges.set(self.bands.bands());
    }

    fn save(&self) -> Value {
        to_state(&self.bands)
    }

    fn restore(&mut self, state: &Value) -> Result<(), String> {
        self.bands = from_state(state)?;
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const TOL: f64 = 1e-9;

    fn assert_close(what: &str, expected: f64, seen: f64) {
        assert!(
            (expected - seen).abs() <= TOL,
            "{what}: expected {expected}, seen {seen} (diff {})",
            (expected - seen).abs()
        );
    }

    /// Expected `(upper, middle, lower, stddev)`.
    type Expected = (f64, f64, f64, f64);

    fn assert_bands(what: &str, expected: Expected, seen: Option<Bands>) {
        let Some(b) = seen else {
            panic!("{what}: expected bands {expected:?}, seen None");
        };
        assert_close(&format!("{what} upper"), expected.0, b.upper);
        assert_close(&format!("{what} middle"), expected.1, b.middle);
        assert_close(&format!("{what} lower"), expected.2, b.lower);
        assert_close(&format!("{what} stddev"), expected.3, b.stddev);
    }

    #[test]
    fn fewer_than_period_points_gives_none() {
        let mut b = Bollinger::new(3, 2.0);
        assert_eq!(b.bands(), None, "empty window");
        assert_eq!(b.push(1.0), None, "1 of 3 points");
        assert_eq!(b.push(2.0), None, "2 of 3 points");
        assert!(b.push(3.0).is_some(), "3 of 3 points must give bands");
    }

    #[test]
    fn exactly_period_points() {
        let mut b = Bollinger::new(4, 2.0);
        let mut last = None;
        for x in [1.0, 2.0, 3.0, 4.0] {
            last = b.push(x);
        }
        // reference: python statistics.mean / statistics.pstdev([1.0, 2.0, 3.0, 4.0]),
        // upper/lower = mean ± 2*pstdev
        assert_bands(
            "[1,2,3,4]",
            (4.73606797749979, 2.5, 0.2639320225002102, 1.118033988749895),
            last,
        );
        assert_eq!(last, b.bands(), "push result must equal bands()");
    }

    #[test]
    fn sliding_past_period() {
        // reference: python statistics.mean / statistics.pstdev over each
        // 3-wide window of [2,4,4,4,5,5,7,9], upper/lower = mean ± 2*pstdev
        let table: [(f64, Option<Expected>); 8] = [
            (2.0, None),
            (4.0, None),
            (
                4.0,
                Some((
                    5.21895141649746,
                    3.3333333333333335,
                    1.4477152501692068,
                    0.9428090415820634,
                )),
            ),
            (4.0, Some((4.0, 4.0, 4.0, 0.0))),
            (
                5.0,
                Some((
                    5.276142374915397,
                    4.333333333333333,
                    3.3905242917512695,
                    0.4714045207910317,
                )),
            ),
            (
                5.0,
                Some((
                    5.6094757082487305,
                    4.666666666666667,
                    3.7238576250846034,
                    0.4714045207910317,
                )),
            ),
            (
                7.0,
                Some((
                    7.552284749830793,
                    5.666666666666667,
                    3.7810485835025403,
                    0.9428090415820634,
                )),
            ),
            (
                9.0,
                Some((
                    10.265986323710905,
                    7.0,
                    3.734013676289096,
                    1.632993161855452,
                )),
            ),
        ];
        let mut b = Bollinger::new(3, 2.0);
        for (i, (x, expected)) in table.into_iter().enumerate() {
            let seen = b.push(x);
            match expected {
                None => assert_eq!(seen, None, "step {i}: expected None, seen {seen:?}"),
                Some(e) => assert_bands(&format!("step {i}"), e, seen),
            }
            assert!(b.len() <= 3, "window must stay bounded, seen {}", b.len());
        }
    }

    #[test]
    fn constant_series_has_zero_sigma_and_equal_bands() {
        // 0.1 is not exactly representable: a plain sum/n gives
        // 0.10000000000000002 here, so this checks the exact-mean path.
        let mut b = Bollinger::new(20, 2.0);
        let mut last = None;
        for _ in 0..25 {
            last = b.push(0.1);
        }
        let bands = last.unwrap();
        assert_eq!(bands.stddev, 0.0, "expected σ 0, seen {}", bands.stddev);
        assert_eq!(
            bands.middle, 0.1,
            "expected middle 0.1, seen {}",
            bands.middle
        );
        assert_eq!(bands.upper, bands.middle, "upper vs middle");
        assert_eq!(bands.lower, bands.middle, "lower vs middle");
    }

    #[test]
    fn closing_prices_period_20() {
        // StockCharts' Bollinger band example closes (period 20, k 2).
        let closes = [
            86.16, 89.09, 88.78, 90.32, 89.07, 91.15, 89.44, 89.18, 86.93, 87.68, 86.96, 89.43,
            89.32, 88.72, 87.45, 87.26, 89.50, 87.90, 89.13, 90.70, 92.90, 92.98, 91.80, 92.66,
            92.68,
        ];
        // reference: python statistics.mean / statistics.pstdev over
        // closes[i-20:i] for i = 20..=25, upper/lower = mean ± 2*pstdev
        let expected = [
            (
                91.29191073002339,
                88.7085,
                86.12508926997661,
                1.291705365011696,
            ),
            (
                91.94972089380268,
                89.0455,
                86.14127910619733,
                1.4521104469013368,
            ),
            (
                92.61325362224662,
                89.24,
                85.86674637775337,
                1.6866268111233145,
            ),
            (
                92.93444973154693,
                89.391,
                85.84755026845308,
                1.7717248657734643,
            ),
            (
                93.31141215226538,
                89.508,
                85.70458784773462,
                1.9017060761326918,
            ),
            (
                93.72701098797565,
                89.6885,
                85.64998901202436,
                2.0192554939878216,
            ),
        ];
        let mut b = Bollinger::new(20, 2.0);
        let mut seen = Vec::new();
        for (i, &c) in closes.iter().enumerate() {
            let r = b.push(c);
            if i < 19 {
                assert_eq!(r, None, "close {i}: expected None before 20 points");
            } else {
                seen.push(r);
            }
        }
        assert_eq!(seen.len(), expected.len(), "number of full windows");
        for (i, (e, s)) in expected.into_iter().zip(seen).enumerate() {
            assert_bands(&format!("window ending at close {}", i + 20), e, s);
        }
    }

    #[test]
    fn large_offset_is_numerically_stable() {
        // reference: python statistics.pstdev([1e9+4, 1e9+7, 1e9+13, 1e9+16])
        // = sqrt(22.5); a naive Σx²/n − mean² loses every digit here.
        let mut b = Bollinger::new(4, 2.0);
        let mut last = None;
        for d in [4.0, 7.0, 13.0, 16.0] {
            last = b.push(1e9 + d);
        }
        assert_bands(
            "offset 1e9",
            (
                1000000019.486833,
                1000000010.0,
                1000000000.513167,
                4.743416490252569,
            ),
            last,
        );
    }

    #[test]
    fn non_finite_inputs_are_ignored() {
        let mut with_junk = Bollinger::new(3, 2.0);
        let mut clean = Bollinger::new(3, 2.0);
        assert_eq!(with_junk.push(f64::NAN), None, "NaN on empty window");
        assert!(with_junk.is_empty(), "NaN must not be pushed");
        for x in [1.0, 2.0, 3.0] {
            with_junk.push(x);
            clean.push(x);
        }
        let before = with_junk.bands();
        for junk in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            assert_eq!(
                with_junk.push(junk),
                before,
                "{junk} must leave the bands unchanged"
            );
        }
        assert_eq!(with_junk, clean, "state after junk vs clean state");
        assert_eq!(with_junk.push(4.0), clean.push(4.0), "next bands");
        let b = with_junk.bands().unwrap();
        assert!(
            b.upper.is_finite() && b.lower.is_finite(),
            "bands must stay finite, seen {b:?}"
        );
    }

    #[test]
    fn degenerate_parameters_are_sanitized() {
        let mut p0 = Bollinger::new(0, 2.0);
        assert_eq!(p0.period(), 1, "period 0 is treated as 1");
        let b = p0.push(5.0).unwrap();
        assert_eq!((b.middle, b.stddev), (5.0, 0.0), "single-value window");

        let mut nan_k = Bollinger::new(2, f64::NAN);
        assert_eq!(nan_k.k(), 0.0, "non-finite k is treated as 0");
        nan_k.push(1.0);
        let b = nan_k.push(3.0).unwrap();
        assert_eq!((b.upper, b.lower), (2.0, 2.0), "k 0 collapses the bands");
        // The sanitized state must still make a readable checkpoint.
        let json = serde_json::to_string(&nan_k).unwrap();
        let back: Bollinger = serde_json::from_str(&json).unwrap();
        assert_eq!(back, nan_k, "checkpoint of sanitized state");
    }

    #[test]
    fn checkpoint_round_trip_matches_uninterrupted_run() {
        // Values with 16-17 significant digits; 985.6906946328695 is one that
        // serde_json's default float parser reads back one ulp off.
        let inputs: Vec<f64> = (0..60)
            .map(|i| {
                let i = f64::from(i);
                985.6906946328695 + (i * 0.7).sin() * 13.37 + i / 3.0
            })
            .collect();
        let mut straight = Bollinger::new(7, 2.5);
        let expected: Vec<Option<Bands>> = inputs.iter().map(|&x| straight.push(x)).collect();

        let mut first = Bollinger::new(7, 2.5);
        let mut seen: Vec<Option<Bands>> = inputs[..30].iter().map(|&x| first.push(x)).collect();
        let json = serde_json::to_string(&first).unwrap();
        let mut restored: Bollinger = serde_json::from_str(&json).unwrap();
        assert_eq!(restored, first, "restored state vs saved state");
        seen.extend(inputs[30..].iter().map(|&x| restored.push(x)));

        // Exact equality on purpose: restoring must not change a single bit.
        assert_eq!(seen, expected, "restored run vs uninterrupted run");
        assert_eq!(restored, straight, "final state");
    }

    #[test]
    fn checkpoint_accepts_plain_numbers() {
        let json = r#"{"period":3,"k":2,"window":[1,2.0,"3.0"]}"#;
        let b: Bollinger = serde_json::from_str(json).unwrap();
        // reference: python statistics.pstdev([1, 2, 3]) = 0.816496580927726
        assert_bands(
            "hand-written state",
            (
                3.632993161855452,
                2.0,
                0.36700683814454793,
                0.816496580927726,
            ),
            b.bands(),
        );
        let bad = r#"{"period":3,"k":2,"window":["NaN"]}"#;
        assert!(
            serde_json::from_str::<Bollinger>(bad).is_err(),
            "non-finite window value must be rejected"
        );
    }
}
