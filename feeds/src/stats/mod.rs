//! Rolling statistics recomputed on every event of a feed.
//!
//! Everything here is pure and synchronous so a consumer can update it
//! inline, and every state type is serde-serializable so it can be saved in
//! a checkpoint: restoring a checkpoint and continuing gives exactly the
//! same results as never stopping. State is bounded by the configured
//! windows, not by the length of the stream.

pub mod bollinger;
pub mod heavy_hitters;
pub mod rate;
pub mod sequence;
pub mod topk;

pub use bollinger::{Bands, Bollinger};
pub use rate::{RateSeries, RateUpdate};
pub use sequence::{SeqOutcome, SequenceTracker};
pub use topk::TopK;

use serde::{Deserialize, Serialize};

/// Default number of points in a Bollinger window, Bollinger's own choice.
fn default_period() -> usize {
    20
}

/// Default band width in standard deviations, Bollinger's own choice.
fn default_k() -> f64 {
    2.0
}

/// Default number of keys reported by the top-k.
fn default_topk() -> usize {
    10
}

/// Default top-k window: one minute of hashtags.
fn default_topk_window_secs() -> u64 {
    60
}

/// Parameters for one feed's [`RollingStats`], read from configuration.
///
/// Missing fields take their defaults and unknown fields are rejected, so a
/// misspelt key fails loudly instead of silently using a default.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct StatsConfig {
    /// Points per Bollinger window, for both the rate (seconds) and the
    /// value series (events). Default 20.
    pub period: usize,
    /// Band width in standard deviations. Default 2.0.
    pub k: f64,
    /// How many keys the top-k reports. Default 10.
    pub topk: usize,
    /// Seconds of history the top-k counts over. Default 60.
    pub topk_window_secs: u64,
}

impl Default for StatsConfig {
    fn default() -> Self {
        Self {
            period: default_period(),
            k: default_k(),
            topk: default_topk(),
            topk_window_secs: default_topk_window_secs(),
        }
    }
}

/// What the statistics need from one feed event, extracted by the consumer
/// so this module stays independent of event formats. Owns its data so a
/// sample can be built, kept or sent without lifetime ties to the event.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct EventSample {
    /// Event time in microseconds since the Unix epoch.
    pub t_us: i64,
    /// Producer of the sequence numbers; events with a `seq` but no source
    /// are tracked under the empty-string source (a single-source feed).
    pub source: Option<String>,
    /// Producer's sequence number, if the feed has one.
    pub seq: Option<u64>,
    /// The configured numeric field, if present; non-finite values are
    /// ignored by the value bands.
    pub value: Option<f64>,
    /// Keys (hashtags) for the top-k; case is folded there.
    pub keys: Vec<String>,
}

/// The statistics of one feed after an event or tick, ready to publish.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Snapshot {
    /// Total events seen (ticks are not events).
    pub events: u64,
    /// Events in the last closed second.
    pub rate: f64,
    /// Bands over the per-second rate, once `period` seconds have closed.
    pub rate_bands: Option<Bands>,
    /// Bands over the value field, once `period` values have been seen.
    pub value_bands: Option<Bands>,
    /// Most frequent keys in the top-k window.
    pub top: Vec<(String, u64)>,
    /// Sequence numbers skipped, over all sources.
    pub missing: u64,
    /// Duplicate or late sequence numbers, over all sources.
    pub duplicates: u64,
    /// Outcome for the most recent event that carried a sequence number;
    /// `None` until one has, since events without `seq` have no outcome.
    pub last_outcome: Option<SeqOutcome>,
}

/// All rolling statistics of one feed, updated together and checkpointed as
/// one value.
///
/// A restored checkpoint keeps the parameters it was saved with; a changed
/// [`StatsConfig`] takes effect only for a fresh `RollingStats`, since
/// windows built under one period cannot be reinterpreted under another.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct RollingStats {
    events: u64,
    rate: RateSeries,
    values: Bollinger,
    topk: TopK,
    sequence: SequenceTracker,
    last_outcome: Option<SeqOutcome>,
}

impl RollingStats {
    /// Creates empty statistics for one feed.
    pub fn new(config: StatsConfig) -> Self {
        Self {
            events: 0,
            rate: RateSeries::new(config.period, config.k),
            values: Bollinger::new(config.period, config.k),
            topk: TopK::new(config.topk, config.topk_window_secs),
            sequence: SequenceTracker::new(),
            last_outcome: None,
        }
    }

    /// Folds one event into every statistic and returns the new snapshot.
    pub fn on_event(&mut self, e: &EventSample) -> Snapshot {
        self.events = self.events.saturating_add(1);
        let rate = self.rate.record(e.t_us);
        if let Some(v) = e.value {
            self.values.push(v);
        }
        self.topk.record(e.t_us, e.keys.iter().map(String::as_str));
        self.topk.expire(e.t_us);
        if let Some(seq) = e.seq {
            let source = e.source.as_deref().unwrap_or("");
            self.last_outcome = Some(self.sequence.observe(source, seq));
        }
        self.snapshot(rate)
    }

    /// Advances time to `now_us` without an event, so a quiet feed's rate
    /// falls to 0 and its old keys leave the top-k.
    pub fn tick(&mut self, now_us: i64) -> Snapshot {
        let rate = self.rate.advance_to(now_us);
        self.topk.expire(now_us);
        self.snapshot(rate)
    }

    /// The current snapshot without changing anything, e.g. right after a
    /// restore.
    pub fn current(&self) -> Snapshot {
        self.snapshot(self.rate.last())
    }

    fn snapshot(&self, rate: RateUpdate) -> Snapshot {
        Snapshot {
            events: self.events,
            rate: rate.rate,
            rate_bands: rate.bands,
            value_bands: self.values.bands(),
            top: self.topk.top(),
            missing: self.sequence.missing(),
            duplicates: self.sequence.duplicates(),
            last_outcome: self.last_outcome,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000;
    const TOL: f64 = 1e-9;

    fn assert_close(what: &str, expected: f64, seen: f64) {
        assert!(
            (expected - seen).abs() <= TOL,
            "{what}: expected {expected}, seen {seen}"
        );
    }

    fn sample(t_us: i64, seq: Option<u64>, value: Option<f64>, keys: &[&str]) -> EventSample {
        EventSample {
            t_us,
            source: Some("src".to_string()),
            seq,
            value,
            keys: keys.iter().map(|k| k.to_string()).collect(),
        }
    }

    #[test]
    fn config_defaults_and_strictness() {
        let c: StatsConfig = serde_json::from_str("{}").unwrap();
        let expected = StatsConfig {
            period: 20,
            k: 2.0,
            topk: 10,
            topk_window_secs: 60,
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
    }

    #[test]
    fn on_event_updates_everything() {
        let mut s = RollingStats::new(StatsConfig {
            period: 3,
            k: 2.0,
            topk: 2,
            topk_window_secs: 60,
        });
        let events = [
            sample(0, Some(1), Some(2.0), &["Rust"]),
            sample(100, Some(2), Some(4.0), &["rust", "tokio"]),
            sample(S, Some(5), None, &["serde"]),
            sample(S + 1, Some(4), Some(9.0), &[]),
            sample(2 * S, None, Some(f64::NAN), &["TOKIO"]),
        ];
        let snaps: Vec<Snapshot> = events.iter().map(|e| s.on_event(e)).collect();

        // Counted by hand: second 0 had 2 events, second 1 had 2.
        let rates: Vec<f64> = snaps.iter().map(|x| x.rate).collect();
        assert_eq!(rates, [0.0, 0.0, 2.0, 2.0, 2.0], "rates");
        assert_eq!(snaps[4].events, 5, "events total");
        assert_eq!(snaps[4].rate_bands, None, "only 2 closed seconds");
        assert_eq!(snaps[1].value_bands, None, "2 values of 3");
        // reference: python statistics.mean / statistics.pstdev([2.0, 4.0, 9.0]),
        // upper/lower = mean ± 2*pstdev; the NaN value is ignored.
        let b = snaps[4].value_bands.unwrap();
        assert_close("value upper", 10.887840577551898, b.upper);
        assert_close("value middle", 5.0, b.middle);
        assert_close("value lower", -0.8878405775518976, b.lower);
        assert_close("value stddev", 2.943920288775949, b.stddev);
        assert_eq!(
            snaps[4].top,
            vec![("rust".to_string(), 2), ("tokio".to_string(), 2)],
            "top-2 with case folding and tie order"
        );
        let outcomes: Vec<Option<SeqOutcome>> = snaps.iter().map(|x| x.last_outcome).collect();
        assert_eq!(
            outcomes,
            [
                Some(SeqOutcome::InOrder),
                Some(SeqOutcome::InOrder),
                Some(SeqOutcome::Gap { missing: 2 }),
                Some(SeqOutcome::Duplicate),
                // No seq: the previous outcome is carried.
                Some(SeqOutcome::Duplicate),
            ],
            "sequence outcomes"
        );
        assert_eq!((snaps[4].missing, snaps[4].duplicates), (2, 1), "totals");
        assert_eq!(s.current(), snaps[4], "current() vs last snapshot");
    }

    #[test]
    fn seq_without_source_uses_empty_source() {
        let mut s = RollingStats::new(StatsConfig::default());
        let mut e = sample(0, Some(10), None, &[]);
        e.source = None;
        assert_eq!(
            s.on_event(&e).last_outcome,
            Some(SeqOutcome::InOrder),
            "first"
        );
        e.seq = Some(12);
        assert_eq!(
            s.on_event(&e).last_outcome,
            Some(SeqOutcome::Gap { missing: 1 }),
            "gap on the unnamed source"
        );
        let fresh = RollingStats::new(StatsConfig::default());
        assert_eq!(fresh.current().last_outcome, None, "no sequenced event yet");
    }

    #[test]
    fn tick_on_quiet_feed() {
        let mut s = RollingStats::new(StatsConfig {
            period: 2,
            k: 2.0,
            topk: 10,
            topk_window_secs: 10,
        });
        s.on_event(&sample(0, None, None, &["a"]));
        s.on_event(&sample(1, None, None, &["a"]));
        let snap = s.tick(S);
        assert_eq!(snap.rate, 2.0, "second 0 closed with 2 events");
        assert_eq!(snap.top, vec![("a".to_string(), 2)], "a still in window");
        let snap = s.tick(10 * S);
        assert_eq!(snap.rate, 0.0, "quiet seconds bring the rate to 0");
        assert_eq!(snap.top, Vec::<(String, u64)>::new(), "a expired at 10 s");
        let b = snap.rate_bands.unwrap();
        assert_eq!((b.middle, b.stddev), (0.0, 0.0), "window of zeros");
        assert_eq!(snap.events, 2, "ticks are not events");
    }

    #[test]
    fn checkpoint_round_trip_matches_uninterrupted_run() {
        let tags = ["Rust", "tokio", "SERDE", "async"];
        let events: Vec<EventSample> = (0..400_i64)
            .map(|i| EventSample {
                t_us: i * 280_000 - (i % 6) * 700_000 + (i / 100) * 9 * S,
                source: Some(["a", "b"][(i % 2) as usize].to_string()),
                seq: (i % 9 != 0).then_some((i / 2 + (i % 13) / 4) as u64),
                value: (i % 5 != 0).then_some(100.0 + (i as f64 * 0.37).sin() * 7.123456789),
                keys: tags
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| (i as usize + j).is_multiple_of(3))
                    .map(|(_, t)| t.to_string())
                    .collect(),
            })
            .collect();
        let config = StatsConfig {
            period: 7,
            k: 2.0,
            topk: 3,
            topk_window_secs: 15,
        };
        // Some events are followed by a tick, to checkpoint tick state too.
        let run = |s: &mut RollingStats, evs: &[EventSample]| -> Vec<Snapshot> {
            let mut out = Vec::new();
            for e in evs {
                out.push(s.on_event(e));
                if e.t_us.div_euclid(20_000) % 50 == 0 {
                    out.push(s.tick(e.t_us + 3 * S));
                }
            }
            out
        };
        let mut straight = RollingStats::new(config.clone());
        let expected = run(&mut straight, &events);

        let mut first = RollingStats::new(config);
        let mut seen = run(&mut first, &events[..200]);
        let json = serde_json::to_string(&first).unwrap();
        let mut restored: RollingStats = serde_json::from_str(&json).unwrap();
        assert_eq!(restored, first, "restored state vs saved state");
        assert_eq!(
            restored.current(),
            first.current(),
            "snapshot after restore"
        );
        seen.extend(run(&mut restored, &events[200..]));
        assert_eq!(seen.len(), expected.len(), "number of snapshots");
        for (i, (s, e)) in seen.iter().zip(&expected).enumerate() {
            assert_eq!(s, e, "snapshot {i}: restored run vs uninterrupted run");
        }
        assert_eq!(restored, straight, "final state");
        let last = expected.last().unwrap();
        assert!(
            last.value_bands.is_some() && last.rate_bands.is_some() && !last.top.is_empty(),
            "test input must exercise every statistic, seen {last:?}"
        );
    }
}
