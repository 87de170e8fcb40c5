//! The one retry schedule of tailrace: exponential backoff with jitter.
//!
//! Used wherever something is retried after a failure — source reconnects, feed stream
//! reopenings, store write retries, MongoDB cursor reopenings — so every retry loop waits the
//! same way. Waits double from `min` up to `max`, with "equal jitter" (half of the wait is
//! fixed, half random): many sources or feeds failing together do not retry in step, and no
//! wait is shorter than half its step.

use std::time::Duration;

/// Waits between retries: doubling from `min` up to `max`, with jitter.
#[derive(Clone, Debug)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    attempt: u32,
}

impl Backoff {
    /// Starts at `min`; never waits longer than `max` (at least `min`).
    pub fn new(min: Duration, max: Duration) -> Self {
        Backoff {
            min,
            max: max.max(min),
            attempt: 0,
        }
    }

    /// After a success: the next wait is short again.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    /// How many waits were handed out since the last reset.
    pub fn attempts(&self) -> u32 {
        self.attempt
    }

    /// The next wait.
    pub fn next_wait(&mut self) -> Duration {
        let min = self.min;
        self.next_from(min)
    }

    /// The next wait, with `base` (e.g. a server's SSE `retry:`) as the first step instead of
    /// `min`.
    pub fn next_from(&mut self, base: Duration) -> Duration {
        let step = base
            .saturating_mul(1u32 << self.attempt.min(20))
            .min(self.max);
        self.attempt = self.attempt.saturating_add(1);
        let half = step / 2;
        half + half.mul_f64(rand::random::<f64>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn doubles_with_jitter_up_to_the_cap_and_resets() {
        let mut b = Backoff::new(100 * MS, 1000 * MS);
        let steps = [100, 200, 400, 800, 1000, 1000];
        for (i, step) in steps.iter().enumerate() {
            let w = b.next_wait();
            let (lo, hi) = (*step * MS / 2, *step * MS);
            assert!(
                w >= lo && w <= hi,
                "wait {i}: expected within [{lo:?}, {hi:?}], got {w:?}"
            );
        }
        assert_eq!(b.attempts(), 6);
        b.reset();
        let w = b.next_wait();
        assert!(w <= 100 * MS, "after reset the wait starts over, got {w:?}");
    }

    #[test]
    fn a_server_hint_is_the_first_step() {
        let mut b = Backoff::new(100 * MS, 10_000 * MS);
        let w = b.next_from(3000 * MS);
        assert!((1500 * MS..=3000 * MS).contains(&w), "got {w:?}");
    }

    #[test]
    fn jitter_spreads_the_waits() {
        let waits: std::collections::BTreeSet<Duration> = (0..50)
            .map(|_| Backoff::new(100 * MS, 100 * MS).next_wait())
            .collect();
        assert!(
            waits.len() > 10,
            "50 first waits should not be in step, got {} distinct",
            waits.len()
        );
    }
}
