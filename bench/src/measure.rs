//! Latency samples, kept in iteration order (the per-iteration plot needs the order), and
//! their summary. Every sample is kept: a run is at most a few hundred thousand operations,
//! and exact quantiles beat a histogram's buckets when the numbers are compared to a floor.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Latencies in microseconds, in the order they were measured.
#[derive(Clone, Debug, Default)]
pub struct Samples {
    us: Vec<f64>,
}

impl Samples {
    /// Room for `n` samples.
    pub fn with_capacity(n: usize) -> Samples {
        Samples {
            us: Vec::with_capacity(n),
        }
    }

    /// Adds one latency.
    pub fn push(&mut self, d: Duration) {
        self.us.push(d.as_nanos() as f64 / 1e3);
    }

    /// Adds one latency given in microseconds.
    pub fn push_us(&mut self, us: f64) {
        self.us.push(us);
    }

    /// Appends another run's samples after these.
    pub fn extend(&mut self, other: &Samples) {
        self.us.extend_from_slice(&other.us);
    }

    /// The samples, in order.
    pub fn as_slice(&self) -> &[f64] {
        &self.us
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.us.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.us.is_empty()
    }

    /// The samples sorted ascending (for quantiles and the CDF).
    pub fn sorted(&self) -> Vec<f64> {
        let mut v = self.us.clone();
        v.sort_by(f64::total_cmp);
        v
    }

    /// Count, mean, quantiles and extremes.
    pub fn summary(&self) -> Summary {
        let sorted = self.sorted();
        let n = sorted.len();
        if n == 0 {
            return Summary::default();
        }
        let mean = sorted.iter().sum::<f64>() / n as f64;
        let var = sorted.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        Summary {
            count: n as u64,
            mean,
            stddev: var.sqrt(),
            min: sorted[0],
            p50: quantile(&sorted, 0.50),
            p90: quantile(&sorted, 0.90),
            p99: quantile(&sorted, 0.99),
            p999: quantile(&sorted, 0.999),
            max: sorted[n - 1],
        }
    }
}

/// The nearest-rank quantile of sorted samples (`q` in 0..=1): the smallest sample such that
/// at least `q` of all samples are at or below it. With fewer than 1/(1-q) samples the high
/// quantiles are simply the maximum; [`Summary::count`] says how many there were.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// A latency distribution in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Number of samples.
    pub count: u64,
    /// Arithmetic mean.
    pub mean: f64,
    /// Population standard deviation.
    pub stddev: f64,
    /// Smallest.
    pub min: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest.
    pub max: f64,
}

/// A size for humans: `850 B`, `12.3 KB`, `4.56 MB` (powers of 1,000).
pub fn fmt_bytes(bytes: f64) -> String {
    if !bytes.is_finite() {
        return "—".into();
    }
    if bytes < 1e3 {
        format!("{bytes:.0} B")
    } else if bytes < 1e6 {
        format!("{:.1} KB", bytes / 1e3)
    } else if bytes < 1e9 {
        format!("{:.2} MB", bytes / 1e6)
    } else {
        format!("{:.2} GB", bytes / 1e9)
    }
}

/// A microsecond figure for humans: `850 ns`, `12.3 µs`, `1.24 ms`, `37.1 ms`, `1.20 s`.
pub fn fmt_us(us: f64) -> String {
    if !us.is_finite() {
        return "—".into();
    }
    let a = us.abs();
    if a < 1.0 {
        format!("{:.0} ns", us * 1e3)
    } else if a < 100.0 {
        format!("{us:.1} µs")
    } else if a < 1_000.0 {
        format!("{us:.0} µs")
    } else if a < 100_000.0 {
        format!("{:.2} ms", us / 1e3)
    } else if a < 1_000_000.0 {
        format!("{:.0} ms", us / 1e3)
    } else {
        format!("{:.2} s", us / 1e6)
    }
}

/// A rate for humans: `70.0/s`, `12,345/s`.
pub fn fmt_rate(per_sec: f64) -> String {
    if !per_sec.is_finite() {
        return "—".into();
    }
    if per_sec < 100.0 {
        format!("{per_sec:.1}/s")
    } else {
        format!("{}/s", thousands(per_sec.round() as u64))
    }
}

/// `1234567` → `1,234,567`.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A ratio for humans: `1.05×`.
pub fn fmt_ratio(r: f64) -> String {
    if !r.is_finite() {
        return "—".into();
    }
    if r < 10.0 {
        format!("{r:.2}×")
    } else {
        format!("{r:.0}×")
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_quantiles() {
        let s: Vec<f64> = (1..=1000).map(f64::from).collect();
        assert_eq!(quantile(&s, 0.5), 500.0);
        assert_eq!(quantile(&s, 0.99), 990.0);
        assert_eq!(quantile(&s, 0.999), 999.0);
        assert_eq!(quantile(&s, 1.0), 1000.0);
        assert_eq!(quantile(&s, 0.0), 1.0);
        assert_eq!(quantile(&[7.0], 0.999), 7.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
    }

    #[test]
    fn summary_of_samples() {
        let mut s = Samples::default();
        for us in [4.0, 1.0, 3.0, 2.0] {
            s.push_us(us);
        }
        let m = s.summary();
        assert_eq!((m.count, m.min, m.max, m.p50), (4, 1.0, 4.0, 2.0));
        assert!((m.mean - 2.5).abs() < 1e-12, "mean {}", m.mean);
        assert!(
            (m.stddev - 1.25f64.sqrt()).abs() < 1e-12,
            "stddev {}",
            m.stddev
        );
        assert_eq!(s.as_slice(), &[4.0, 1.0, 3.0, 2.0], "order is kept");
    }

    #[test]
    fn human_formats() {
        assert_eq!(fmt_us(0.85), "850 ns");
        assert_eq!(fmt_us(12.34), "12.3 µs");
        assert_eq!(fmt_us(265.0), "265 µs");
        assert_eq!(fmt_us(37_130.0), "37.13 ms");
        assert_eq!(fmt_us(1_200_000.0), "1.20 s");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(thousands(999), "999");
        assert_eq!(fmt_rate(9_623.4), "9,623/s");
        assert_eq!(fmt_ratio(1.049), "1.05×");
        assert_eq!(fmt_bytes(850.0), "850 B");
        assert_eq!(fmt_bytes(32_400.0), "32.4 KB");
        assert_eq!(fmt_bytes(1_265_258.0), "1.27 MB");
        assert_eq!(fmt_bytes(10_942_750_720.0), "10.94 GB");
    }
}
