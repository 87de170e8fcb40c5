//! Where in a capped collection a range of received times lies, so that "the last ten
//! minutes" reads ten minutes of the journal, not the whole window.
//!
//! The ingester stores events in receipt order (`Stamp::received_us` never goes back), so the
//! received time ([`crate::RECEIVED_PATH`]) grows along the positions. Nothing here trusts
//! that: for each segment and collection a [`Zone`] records the smallest and largest received
//! time of its documents, whether they came in order, and a mark every [`MARK_EVERY`]
//! documents. A segment whose times miss the range is skipped; within the first and last
//! segments that meet it, marks narrow the span only where the times came in order. A
//! document whose time the zone cannot place (reached through an array) makes its segment read
//! whole. What the span holds is then filtered as before: the span only decides what is read.
//!
//! A zone also keeps runs: stretches of positions whose documents arrived within one second
//! ([`crate::ReceivedRun`]), so that a query counting documents by minute or by hour adds up
//! runs instead of reading documents (`query/timed.rs`). At ~70 events/s a run stands for 70
//! documents in 24 bytes; a zone whose runs stand for fewer than [`DOCS_PER_RUN`] documents
//! each (a slow stream, times out of order) drops them, and such queries read its documents.
//!
//! Zones are built on the first query that needs them, by reading only each document's
//! received time out of its stored JSON (`sonic_rs::get`, which skips the rest), and extended
//! from where they stopped as the active segment grows. They are memory only: a restart
//! builds them again. A released segment's zone is dropped; its documents moved into the tree
//! are few and read whole.

use std::collections::HashMap;
use std::sync::Mutex;

use super::Inner;
use super::format::{Entry, Header};
use super::journal::SegmentScan;
use crate::{Position, Result, TimeSpan, date};

/// Documents between two marks: a span is at most this many documents wider at each end
/// than the range, for 16 bytes of memory per this many documents.
const MARK_EVERY: u64 = 128;

/// The fewest documents a zone's runs stand for on average, past its first
/// [`RUNS_ALWAYS_KEPT`]: at most 24 bytes of memory per this many documents.
const DOCS_PER_RUN: u64 = 4;

/// Runs a zone keeps whatever they stand for.
const RUNS_ALWAYS_KEPT: usize = 64;

/// Documents of one zone received within one second, from `first` to the position before
/// the next run's first (or the zone's last).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Run {
    first: u64,
    /// [`NO_SECOND`] for a zone's leading documents without a received time.
    second: i64,
    timed: u32,
    untimed: u32,
}

/// A run's second when its documents have no received time: no time's second is this.
const NO_SECOND: i64 = i64::MIN;

/// The received times of one collection's documents in one segment, up to `scanned_to`.
#[derive(Clone, Debug, Default)]
struct Zone {
    /// The offset in the segment the zone has read up to.
    scanned_to: u64,
    /// The first and last positions of the collection in the segment.
    positions: Option<(u64, u64)>,
    /// The smallest and largest received time (ms) of a document that has one.
    times: Option<(i64, i64)>,
    /// The last received time seen, to tell whether they came in order.
    last: Option<i64>,
    /// Whether every received time was at least the one before it.
    ordered: bool,
    /// Whether a document held a received time the zone cannot place (an array on the way).
    unplaced: bool,
    /// `(position, ms)` of every `MARK_EVERY`-th document with a received time, in order.
    marks: Vec<(u64, i64)>,
    /// Documents with a received time since the last mark.
    since_mark: u64,
    /// Every document's run, in order; `None` once they stand for too few documents.
    runs: Option<Vec<Run>>,
}

impl Zone {
    fn new() -> Zone {
        Zone {
            ordered: true,
            since_mark: MARK_EVERY,
            runs: Some(Vec::new()),
            ..Zone::default()
        }
    }

    fn add(&mut self, pos: u64, time: Time) {
        self.positions = Some(match self.positions {
            Some((first, _)) => (first, pos),
            None => (pos, pos),
        });
        self.add_to_runs(pos, &time);
        let ms = match time {
            Time::None => return,
            Time::Unplaced => {
                self.unplaced = true;
                return;
            }
            Time::At(ms) => ms,
        };
        self.times = Some(match self.times {
            Some((lo, hi)) => (lo.min(ms), hi.max(ms)),
            None => (ms, ms),
        });
        if self.last.is_some_and(|last| ms < last) {
            self.ordered = false;
        }
        self.last = Some(ms);
        if self.since_mark >= MARK_EVERY {
            self.marks.push((pos, ms));
            self.since_mark = 0;
        }
        self.since_mark += 1;
    }

    /// Counts the document at `pos` in its run, or starts one.
    fn add_to_runs(&mut self, pos: u64, time: &Time) {
        let Some(runs) = &mut self.runs else {
            return;
        };
        let second = match time {
            // The zone is read whole from now on ([`Zone::unplaced`]): runs would not be used.
            Time::Unplaced => {
                self.runs = None;
                return;
            }
            Time::None => None,
            Time::At(ms) => Some(ms.div_euclid(1000)),
        };
        let counted = match (runs.last_mut(), second) {
            (Some(run), None) => run.untimed.checked_add(1).map(|n| run.untimed = n),
            (Some(run), Some(s)) if run.second == s => {
                run.timed.checked_add(1).map(|n| run.timed = n)
            }
            (_, second) => {
                runs.push(Run {
                    first: pos,
                    second: second.unwrap_or(NO_SECOND),
                    timed: u32::from(second.is_some()),
                    untimed: u32::from(second.is_none()),
                });
                Some(())
            }
        };
        // The zone's positions are its documents'.
        let docs = self.positions.map_or(0, |(first, last)| last - first + 1);
        let too_many = runs.len() > RUNS_ALWAYS_KEPT
            && runs.len() as u64 > docs / DOCS_PER_RUN + RUNS_ALWAYS_KEPT as u64;
        if counted.is_none() || too_many {
            self.runs = None;
        }
    }

    /// Calls `each` with the zone's runs lying within positions `[from, to]`, in order.
    fn each_run(&self, from: u64, to: u64, each: &mut dyn FnMut(crate::ReceivedRun)) {
        let (Some(runs), Some((_, last))) = (&self.runs, self.positions) else {
            return;
        };
        let start = runs.partition_point(|r| r.first < from);
        for (i, run) in runs.iter().enumerate().skip(start) {
            let end = runs.get(i + 1).map_or(last, |next| next.first - 1);
            if end > to {
                break;
            }
            each(crate::ReceivedRun {
                first: Position(run.first),
                last: Position(end),
                second: (run.second != NO_SECOND).then_some(run.second),
                timed: u64::from(run.timed),
                untimed: u64::from(run.untimed),
            });
        }
    }

    /// The positions of this segment that can hold a document received in `[from, to]`
    /// (ms), or `None` when none can.
    fn span(&self, from: i64, to: i64) -> Option<(u64, u64)> {
        let (first, last) = self.positions?;
        if self.unplaced {
            return Some((first, last));
        }
        let (lo, hi) = self.times?;
        if hi < from || lo > to {
            return None;
        }
        if !self.ordered {
            return Some((first, last));
        }
        // In order: every document before the last mark below `from` is below it too, and
        // every one from the first mark above `to` on is above it.
        let start = match self.marks.partition_point(|(_, ms)| *ms < from) {
            0 => first,
            i => self.marks[i - 1].0,
        };
        let end = match self.marks.partition_point(|(_, ms)| *ms <= to) {
            i if i == self.marks.len() => last,
            i => self.marks[i].0 - 1,
        };
        Some((start, end))
    }
}

/// A document's received time, as the zone sees it.
enum Time {
    /// None: no date there, so a date range cannot match it.
    None,
    /// Through an array: a range may match it in ways a zone does not follow.
    Unplaced,
    At(i64),
}

/// The received time of a stored document, read out of its JSON without parsing the rest.
fn received(json: &[u8]) -> Time {
    use sonic_rs::{JsonType, JsonValueTrait};
    let Ok(stamp) = sonic_rs::get(json, [crate::STAMP_FIELD]) else {
        return Time::None;
    };
    match stamp.get_type() {
        JsonType::Object => {}
        JsonType::Array => return Time::Unplaced,
        _ => return Time::None,
    }
    let Ok(at) = sonic_rs::get(stamp.as_raw_str(), ["received"]) else {
        return Time::None;
    };
    match at.get_type() {
        JsonType::Array => Time::Unplaced,
        JsonType::Object => serde_json::from_str(at.as_raw_str())
            .ok()
            .and_then(|v| date::millis(&v))
            .map_or(Time::None, Time::At),
        _ => Time::None,
    }
}

/// Zones by segment and collection.
#[derive(Debug, Default)]
pub(super) struct Timelines {
    zones: Mutex<HashMap<(u64, String), ZoneSlot>>,
}

/// A zone behind its own lock, so building one segment's does not hold up another query.
type ZoneSlot = std::sync::Arc<Mutex<Zone>>;

/// The positions of `coll` that can hold a document received in `[from, to]` (ms, inclusive).
pub(super) fn span(inner: &Inner, coll: &str, from: i64, to: i64) -> Result<TimeSpan> {
    let mut out: Option<(u64, u64)> = None;
    let Some((oldest, journal_from)) = each_zone(inner, coll, &mut |zone| {
        if let Some((lo, hi)) = zone.span(from, to) {
            out = Some(match out {
                Some((a, _)) => (a, hi),
                None => (lo, hi),
            });
        }
    })?
    else {
        return Ok(TimeSpan::Empty);
    };
    // Documents moved into the tree when their segment was released: read whole.
    if oldest < journal_from {
        out = Some((oldest, out.map_or(journal_from - 1, |(_, hi)| hi)));
    }
    Ok(match out {
        Some((lo, hi)) if hi >= lo.max(oldest) => {
            TimeSpan::Positions(Position(lo.max(oldest)), Position(hi))
        }
        _ => TimeSpan::Empty,
    })
}

/// Calls `each` with the runs of `coll` ([`crate::ReceivedRun`]) lying within positions
/// `[from, to]`, in order. Documents moved into the tree have none.
pub(super) fn runs(
    inner: &Inner,
    coll: &str,
    from: u64,
    to: u64,
    each: &mut dyn FnMut(crate::ReceivedRun),
) -> Result<()> {
    each_zone(inner, coll, &mut |zone| zone.each_run(from, to, each))?;
    Ok(())
}

/// Calls `each` with the zone of every segment holding `coll`, in order, each read up to its
/// segment's end; `None` when the collection holds nothing, else its oldest position and the
/// first one in the journal (those before are in the tree).
fn each_zone(inner: &Inner, coll: &str, each: &mut dyn FnMut(&Zone)) -> Result<Option<(u64, u64)>> {
    let (segments, oldest, journal_from) = {
        let shared = inner.shared.read().map_err(super::lock_err)?;
        let Some(v) = shared.capped.get(coll) else {
            return Ok(None);
        };
        if v.count == 0 {
            return Ok(None);
        }
        let segments: Vec<_> = shared
            .segments
            .iter()
            .filter(|(_, i)| i.colls.contains_key(coll))
            .map(|(seq, i)| (*seq, i.seg.clone(), i.end))
            .collect();
        (segments, v.oldest, v.journal_from)
    };
    let slots: Vec<ZoneSlot> = {
        let mut zones = inner.timelines.zones.lock().map_err(super::lock_err)?;
        zones.retain(|(seq, c), _| c != coll || segments.iter().any(|(s, ..)| s == seq));
        segments
            .iter()
            .map(|(seq, ..)| {
                zones
                    .entry((*seq, coll.to_owned()))
                    .or_insert_with(|| std::sync::Arc::new(Mutex::new(Zone::new())))
                    .clone()
            })
            .collect()
    };
    for ((_, seg, end), slot) in segments.iter().zip(slots) {
        let mut zone = slot.lock().map_err(super::lock_err)?;
        if zone.scanned_to < *end {
            extend(&mut zone, seg, *end, coll)?;
        }
        each(&zone);
    }
    Ok(Some((oldest, journal_from)))
}

/// Reads the records of `seg` from where `zone` stopped to `end`.
fn extend(zone: &mut Zone, seg: &super::journal::Segment, end: u64, coll: &str) -> Result<()> {
    let mut scan = SegmentScan::new(seg, zone.scanned_to, end);
    while let Some((_, bytes)) = scan.next_raw()? {
        let h = Header::parse(bytes)?;
        for (si, s) in h.sections.iter().enumerate() {
            if s.coll != coll {
                continue;
            }
            let base = h.section_entry(si);
            let stop = base + s.count;
            for (bi, _) in h.blocks_for(base, stop) {
                let data = h.block(bytes, bi)?;
                for e in h.entries(bi, &data) {
                    let (index, entry) = e?;
                    if index < base {
                        continue;
                    }
                    if index >= stop {
                        break;
                    }
                    if let Entry::Doc(json) = entry {
                        zone.add(s.first + u64::from(index - base), received(json));
                    }
                }
            }
        }
    }
    zone.scanned_to = scan.at;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn zone(times: &[Option<i64>]) -> Zone {
        let mut z = Zone::new();
        for (i, t) in times.iter().enumerate() {
            z.add(100 + i as u64, t.map_or(Time::None, Time::At));
        }
        z
    }

    #[test]
    fn an_ordered_zone_narrows_to_the_marks_around_the_range() {
        let times: Vec<Option<i64>> = (0..1000).map(|i| Some(i * 10)).collect();
        let z = zone(&times);
        let (lo, hi) = z.span(5000, 5999).unwrap();
        // Every document in the range is inside, and no more than a mark's worth either side.
        assert!(lo <= 100 + 500 && lo + MARK_EVERY > 100 + 500, "{lo}");
        assert!((100 + 599..100 + 599 + MARK_EVERY).contains(&hi), "{hi}");
        assert_eq!(z.span(20_000, 30_000), None);
        assert_eq!(z.span(-5, -1), None);
        assert_eq!(z.span(0, 0).map(|s| s.0), Some(100));
        assert_eq!(z.span(9990, 20_000).map(|s| s.1), Some(1099));
    }

    #[test]
    fn a_zone_out_of_order_or_unplaced_reads_whole() {
        let mut times: Vec<Option<i64>> = (0..1000).map(|i| Some(i * 10)).collect();
        times[700] = Some(5);
        assert_eq!(zone(&times).span(5000, 5999), Some((100, 1099)));
        let mut z = zone(&(0..1000).map(|i| Some(i * 10)).collect::<Vec<_>>());
        z.add(1100, Time::Unplaced);
        assert_eq!(z.span(50_000, 60_000), Some((100, 1100)));
    }

    #[test]
    fn documents_without_a_time_never_match_and_never_narrow_wrongly() {
        let times: Vec<Option<i64>> = (0..1000).map(|i| (i % 3 != 0).then_some(i * 10)).collect();
        let z = zone(&times);
        let (lo, hi) = z.span(5000, 5999).unwrap();
        assert!(lo <= 600 && hi >= 699, "{lo}..{hi}");
        assert_eq!(zone(&[None, None]).span(0, i64::MAX), None);
    }

    fn runs_of(z: &Zone, from: u64, to: u64) -> Vec<(u64, u64, Option<i64>, u64, u64)> {
        let mut out = Vec::new();
        z.each_run(from, to, &mut |r| {
            out.push((r.first.0, r.last.0, r.second, r.timed, r.untimed));
        });
        out
    }

    #[test]
    fn runs_hold_each_seconds_documents_and_what_lies_between() {
        // Positions 100..: none, 0.5 s, 0.9 s, none, 1.0 s, 0.2 s (back), 0.3 s.
        let z = zone(&[
            None,
            Some(500),
            Some(900),
            None,
            Some(1000),
            Some(200),
            Some(300),
        ]);
        assert_eq!(
            runs_of(&z, 0, u64::MAX),
            vec![
                (100, 100, None, 0, 1),
                (101, 103, Some(0), 2, 1),
                (104, 104, Some(1), 1, 0),
                (105, 106, Some(0), 2, 0),
            ]
        );
        // Only runs wholly within the positions asked.
        assert_eq!(runs_of(&z, 101, 105).len(), 2);
        let mut z = z;
        z.add(107, Time::Unplaced);
        assert_eq!(runs_of(&z, 0, u64::MAX), vec![], "a time through an array");
    }

    #[test]
    fn a_zone_keeps_no_runs_that_stand_for_a_document_each() {
        // Four documents a second: kept. One every 2 s: dropped past the first few.
        let busy: Vec<Option<i64>> = (0..4000).map(|i| Some(i * 250)).collect();
        assert_eq!(runs_of(&zone(&busy), 0, u64::MAX).len(), 1000);
        let slow: Vec<Option<i64>> = (0..4000).map(|i| Some(i * 2000)).collect();
        assert!(zone(&slow).runs.is_none());
        let few: Vec<Option<i64>> = (0..RUNS_ALWAYS_KEPT as i64)
            .map(|i| Some(i * 2000))
            .collect();
        assert_eq!(runs_of(&zone(&few), 0, u64::MAX).len(), RUNS_ALWAYS_KEPT);
    }

    #[test]
    fn the_received_time_is_read_out_of_the_json() {
        let at = |s: &str| match received(s.as_bytes()) {
            Time::At(ms) => Some(ms),
            Time::Unplaced => Some(-1),
            Time::None => None,
        };
        assert_eq!(
            at(
                r#"{"text":"x","_tailrace":{"seq":1,"received":{"$date":"1970-01-01T00:00:01.500Z"}}}"#
            ),
            Some(1500)
        );
        assert_eq!(
            at(r#"{"_tailrace":[{"received":{"$date":"1970-01-01T00:00:01Z"}}]}"#),
            Some(-1)
        );
        assert_eq!(at(r#"{"_tailrace":{"received":[1]}}"#), Some(-1));
        assert_eq!(
            at(r#"{"_tailrace":{"received":"1970-01-01T00:00:01Z"}}"#),
            None
        );
        assert_eq!(at(r#"{"_tailrace":{"received_us":5}}"#), None);
        assert_eq!(at(r#"{"a":1}"#), None);
    }
}
