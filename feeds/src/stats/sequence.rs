//! Per-source sequence-number tracking, to measure feed completeness.

use std::collections::BTreeMap;

use metrics::Counter;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::{Event, Registration, Statistic, from_state, to_state};
use crate::telemetry as t;

/// How one sequence number compared with what its source was expected to
/// send next.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeqOutcome {
    /// Exactly the expected number (or the first one seen for the source).
    InOrder,
    /// The number jumped ahead; `missing` numbers were skipped, and `refused` more the
    /// store refused (kept as dead letters).
    Gap {
        /// How many numbers never arrived (so far), those the store refused aside.
        missing: u64,
        /// How many of the skipped numbers the store refused.
        #[serde(default, skip_serializing_if = "is_zero")]
        refused: u64,
    },
    /// The number is below the expected one: a resend, a replay, or a late
    /// arrival of a number already counted as missing.
    Duplicate,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Next expected sequence number per source plus running totals of what
/// was skipped and what was seen again.
///
/// State is one entry per source, independent of stream length. A late
/// arrival of a number earlier counted as missing is counted as a
/// duplicate and does not reduce [`SequenceTracker::missing`]: telling it
/// apart from a true resend would require remembering every gap, which is
/// unbounded.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct SequenceTracker {
    /// Next expected sequence number per source.
    expected: BTreeMap<String, u64>,
    missing: u64,
    duplicates: u64,
    /// Numbers skipped because the store refused their events (absent from older
    /// checkpoints).
    #[serde(default)]
    refused: u64,
}

impl SequenceTracker {
    /// Creates a tracker that knows no sources yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Classifies `seq` for `source` and advances that source's expectation.
    ///
    /// The first number ever seen for a source is accepted as
    /// [`SeqOutcome::InOrder`] whatever its value, because a feed may be
    /// joined mid-stream and nothing before that point was ours to miss.
    /// A gap moves the expectation past `seq`; a duplicate leaves it alone.
    /// After `u64::MAX` the expectation saturates there rather than
    /// wrapping, so a wrapped-around source reads as duplicates, not as one
    /// enormous gap.
    pub fn observe(&mut self, source: &str, seq: u64) -> SeqOutcome {
        self.observe_refusing(source, seq, 0)
    }

    /// [`SequenceTracker::observe`], knowing that the store refused `refused` of the numbers
    /// a gap before `seq` would skip: those count as refused, not missing.
    pub fn observe_refusing(&mut self, source: &str, seq: u64, refused: u64) -> SeqOutcome {
        let next = seq.saturating_add(1);
        let Some(expected) = self.expected.get_mut(source) else {
            self.expected.insert(source.to_owned(), next);
            return SeqOutcome::InOrder;
        };
        if seq == *expected {
            *expected = next;
            SeqOutcome::InOrder
        } else if seq > *expected {
            let skipped = seq - *expected;
            let refused = refused.min(skipped);
            let missing = skipped - refused;
            *expected = next;
            self.missing = self.missing.saturating_add(missing);
            self.refused = self.refused.saturating_add(refused);
            SeqOutcome::Gap { missing, refused }
        } else {
            self.duplicates = self.duplicates.saturating_add(1);
            SeqOutcome::Duplicate
        }
    }

    /// Total sequence numbers skipped over all sources.
    pub fn missing(&self) -> u64 {
        self.missing
    }

    /// Total sequence numbers skipped because the store refused their events.
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// Total duplicate (or late) sequence numbers over all sources.
    pub fn duplicates(&self) -> u64 {
        self.duplicates
    }

    /// Next sequence number expected from `source`, `None` for a source not
    /// seen yet; useful for logging where a gap started.
    pub fn expected(&self, source: &str) -> Option<u64> {
        self.expected.get(source).copied()
    }
}

/// Completeness of a feed: per-source sequence numbers of the ingest stamps, counting the
/// ones never seen (`missing`) and the ones seen again (`duplicates`). Snapshot fields
/// `missing`, `duplicates` and `last_outcome`; metrics `tailrace_feed_missing_events_total`
/// and `tailrace_feed_duplicate_events_total` (what this process added).
pub struct Completeness {
    state: CompletenessState,
    missing: Counter,
    duplicates: Counter,
    refused: Counter,
    /// Totals already added to the counters (missing, duplicates, refused): the state's
    /// totals survive restarts, the process's counters do not.
    reported: (u64, u64, u64),
    /// Numbers the store refused in the gap before the next event ([`Statistic::refused_before_next`]).
    refused_next: u64,
}

/// What a checkpoint keeps of [`Completeness`].
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
struct CompletenessState {
    #[serde(flatten)]
    tracker: SequenceTracker,
    /// Outcome for the most recent stamped event; `None` until one was seen.
    #[serde(default)]
    last_outcome: Option<SeqOutcome>,
}

impl Completeness {
    /// The completeness of `feed`.
    pub fn new(feed: &str) -> Self {
        Completeness {
            state: CompletenessState::default(),
            missing: metrics::counter!(t::FEED_MISSING, "feed" => feed.to_string()),
            duplicates: metrics::counter!(t::FEED_DUPLICATES, "feed" => feed.to_string()),
            refused: metrics::counter!(t::FEED_REFUSED, "feed" => feed.to_string()),
            reported: (0, 0, 0),
            refused_next: 0,
        }
    }
}

impl Completeness {
    /// Missing, duplicates and refused so far.
    fn totals(&self) -> (u64, u64, u64) {
        let t = &self.state.tracker;
        (t.missing(), t.duplicates(), t.refused())
    }
}

/// Built for every feed; reads the stamp only.
pub const REGISTRATION: Registration = Registration {
    build: |_, feed| Box::new(Completeness::new(feed)),
    reads: super::reads_nothing,
};

impl Statistic for Completeness {
    fn name(&self) -> &'static str {
        "sequence"
    }

    fn on_event(&mut self, e: &Event<'_>) {
        let refused = std::mem::take(&mut self.refused_next);
        if let Some(stamp) = e.stamp {
            let outcome = self
                .state
                .tracker
                .observe_refusing(&stamp.source, stamp.seq, refused);
            self.state.last_outcome = Some(outcome);
        }
    }

    fn expected_seq(&self, source: &str) -> Option<u64> {
        self.state.tracker.expected(source)
    }

    fn refused_before_next(&mut self, refused: u64) {
        self.refused_next = refused;
    }

    fn advance(&mut self, _now_us: i64) {}

    fn snapshot(&self, out: &mut Map<String, Value>) {
        out.insert("missing".into(), json!(self.state.tracker.missing()));
        out.insert("duplicates".into(), json!(self.state.tracker.duplicates()));
        out.insert("refused".into(), json!(self.state.tracker.refused()));
        out.insert("last_outcome".into(), json!(self.state.last_outcome));
    }

    fn publish(&mut self, _figures: &Map<String, Value>) {
        let now = self.totals();
        self.missing
            .increment(now.0.saturating_sub(self.reported.0));
        self.duplicates
            .increment(now.1.saturating_sub(self.reported.1));
        self.refused
            .increment(now.2.saturating_sub(self.reported.2));
        self.reported = now;
    }

    fn save(&self) -> Value {
        to_state(&self.state)
    }

    fn restore(&mut self, state: &Value) -> Result<(), String> {
        self.state = from_state(state)?;
        self.reported = self.totals();
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use SeqOutcome::{Duplicate, Gap, InOrder};

    #[test]
    fn single_source_table() {
        let mut t = SequenceTracker::new();
        // (seq, expected outcome, missing total, duplicates total), by hand.
        let table = [
            (1000, InOrder, 0, 0), // first seen: accepted mid-stream
            (1001, InOrder, 0, 0),
            (1002, InOrder, 0, 0),
            (
                1007,
                Gap {
                    missing: 4,
                    refused: 0,
                },
                4,
                0,
            ), // 1003..=1006 skipped
            (1005, Duplicate, 4, 1), // late arrival of a missing one
            (1007, Duplicate, 4, 2), // resend
            (1008, InOrder, 4, 2),
            (
                1010,
                Gap {
                    missing: 1,
                    refused: 0,
                },
                5,
                2,
            ),
            (0, Duplicate, 5, 3),
            (1011, InOrder, 5, 3),
        ];
        for (i, (seq, outcome, missing, dups)) in table.into_iter().enumerate() {
            let seen = t.observe("a", seq);
            assert_eq!(
                seen, outcome,
                "step {i} seq {seq}: expected {outcome:?}, seen {seen:?}"
            );
            assert_eq!(t.missing(), missing, "step {i}: missing total");
            assert_eq!(t.duplicates(), dups, "step {i}: duplicates total");
        }
        assert_eq!(t.expected("a"), Some(1012), "next expected");
    }

    /// Numbers the store refused are refused, not missing; a gap holding both counts each.
    #[test]
    fn refused_numbers_are_not_missing() {
        let mut t = SequenceTracker::new();
        t.observe("a", 1);
        assert_eq!(
            t.observe_refusing("a", 4, 2),
            Gap {
                missing: 0,
                refused: 2
            }
        );
        assert_eq!(
            t.observe_refusing("a", 9, 1),
            Gap {
                missing: 3,
                refused: 1
            }
        );
        // More refusals than the gap holds (a miscount) never make missing negative.
        assert_eq!(
            t.observe_refusing("a", 11, 5),
            Gap {
                missing: 0,
                refused: 1
            }
        );
        // Refusals given with an event in order change nothing.
        assert_eq!(t.observe_refusing("a", 12, 3), InOrder);
        assert_eq!((t.missing(), t.refused()), (3, 4));
        // An older checkpoint has no `refused`.
        let old: SequenceTracker =
            serde_json::from_str(r#"{"expected": {"a": 3}, "missing": 1, "duplicates": 0}"#)
                .unwrap();
        assert_eq!(old.refused(), 0);
    }

    #[test]
    fn first_seq_of_any_value_is_in_order() {
        let mut t = SequenceTracker::new();
        assert_eq!(t.observe("x", 0), InOrder, "first seq 0");
        assert_eq!(t.observe("y", 987_654_321), InOrder, "first seq large");
        assert_eq!(t.missing(), 0, "no gap for a mid-stream start");
    }

    #[test]
    fn sources_are_independent() {
        let mut t = SequenceTracker::new();
        assert_eq!(t.observe("a", 1), InOrder, "a 1");
        assert_eq!(t.observe("b", 50), InOrder, "b 50");
        assert_eq!(t.observe("a", 2), InOrder, "a 2");
        assert_eq!(
            t.observe("b", 53),
            Gap {
                missing: 2,
                refused: 0
            },
            "b 53"
        );
        assert_eq!(
            t.observe("a", 5),
            Gap {
                missing: 2,
                refused: 0
            },
            "a 5"
        );
        assert_eq!(t.observe("b", 53), Duplicate, "b 53 again");
        assert_eq!(t.observe("a", 6), InOrder, "a 6");
        assert_eq!((t.missing(), t.duplicates()), (4, 1), "totals over sources");
        assert_eq!(t.expected("a"), Some(7), "a next");
        assert_eq!(t.expected("b"), Some(54), "b next");
        assert_eq!(t.expected("c"), None, "unknown source");
    }

    #[test]
    fn saturates_at_u64_max() {
        let mut t = SequenceTracker::new();
        assert_eq!(t.observe("a", 0), InOrder, "start");
        assert_eq!(
            t.observe("a", u64::MAX),
            Gap {
                missing: u64::MAX - 1,
                refused: 0
            },
            "jump to max"
        );
        assert_eq!(t.observe("a", u64::MAX), InOrder, "max again, saturated");
        assert_eq!(t.observe("b", u64::MAX), InOrder, "first seq at max");
        assert_eq!(t.observe("a", 5), Duplicate, "after max");
    }

    #[test]
    fn checkpoint_round_trip_matches_uninterrupted_run() {
        let events: Vec<(&str, u64)> = (0..200_u64)
            .map(|i| {
                let src = ["alpha", "beta", "gamma"][(i % 3) as usize];
                // Mostly increasing, with jumps and replays.
                let seq = i / 3 + (i % 11) * 2 - (i % 7).min(i / 3);
                (src, seq)
            })
            .collect();
        let mut straight = SequenceTracker::new();
        let expected: Vec<SeqOutcome> = events
            .iter()
            .map(|&(s, q)| straight.observe(s, q))
            .collect();
        assert!(
            expected.iter().any(|o| matches!(o, Gap { .. })) && expected.contains(&Duplicate),
            "test input must exercise gaps and duplicates"
        );

        let mut first = SequenceTracker::new();
        let mut seen: Vec<SeqOutcome> = events[..100]
            .iter()
            .map(|&(s, q)| first.observe(s, q))
            .collect();
        let json = serde_json::to_string(&first).unwrap();
        let mut restored: SequenceTracker = serde_json::from_str(&json).unwrap();
        assert_eq!(restored, first, "restored state vs saved state");
        seen.extend(events[100..].iter().map(|&(s, q)| restored.observe(s, q)));
        assert_eq!(seen, expected, "restored run vs uninterrupted run");
        assert_eq!(restored, straight, "final state");
    }
}
