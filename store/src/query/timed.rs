//! A pipeline that counts documents by when they arrived ("events per minute over the last
//! hour"), answered from the engine's runs where it keeps them
//! ([`crate::Capped::received_runs`]: stretches of documents received within one second, the
//! embedded engine's, built beside its time zones) and from the documents elsewhere. An hour
//! at 70 events/s is 3,600 runs to add up instead of 252,000 documents to read.
//!
//! The pipeline starts with a `$match` that keeps a range of received times and asks nothing
//! else ([`crate::Filter::only_date_range`]), or with no `$match`; then a `$group` (or a
//! `$sortByCount`) that counts (`$count`, `$sum` of an integer) by a key reading the received
//! time only through `$dateTrunc` by the second or coarser, so that one second's documents
//! share a key. A run is counted without reading it when every document in it is decided
//! by what the run says: its second lies wholly inside the range or wholly outside it, and
//! documents without a time are kept out by the `$match` or absent. The documents of every
//! other run (a second the range cuts) and of every stretch without runs are read, and go
//! through the `$match` and the key as in a read.
//!
//! The groups are the ones a read of every document makes, in the same order (by the position
//! of each group's first document) and with the same keys and counts; the rest of the
//! pipeline then runs over them as usual. The answer says the `$match` and the `$group` ran on
//! the `timeline`.

use std::sync::Arc;
use std::time::Instant;

use serde_json::{Map, Value};

use super::expr::{Expr, truncate};
use super::indexed::{Grouped, Key, Table, counting, gaps};
use super::read::{AggregateError, evaluate};
use super::{Answer, Limits, Pipeline, QueryError, Stage, StageRun};
use crate::{Capped, Document, Filter, Position, ReceivedRun, StoreError, TimeSpan};

/// What such a pipeline's first stages are.
pub(super) struct TimeGrouping {
    /// The leading `$match`, and the received times (ms, inclusive) it keeps.
    filter: Option<(Filter, (i64, i64))>,
    /// The index of the `$group` (or `$sortByCount`).
    at: usize,
    key: Expr,
    accs: Vec<(String, i64)>,
    /// A `$sortByCount`: its groups are then sorted by count, most first, and `_id`.
    by_count: bool,
}

impl Pipeline {
    /// The pipeline's first stages as a [`TimeGrouping`], when they are one.
    pub(super) fn time_grouping(&self) -> Option<TimeGrouping> {
        let (filter, at) = match self.stages.first()? {
            Stage::Match(f) => {
                let range = f.only_date_range(crate::RECEIVED_PATH)?;
                if range.0 > range.1 {
                    return None;
                }
                (Some((f.clone(), range)), 1)
            }
            _ => (None, 0),
        };
        let (key, accs, by_count) = match self.stages.get(at)? {
            Stage::Group { id, accs } => (id.clone(), counting(accs)?, false),
            Stage::SortByCount(e) => (e.clone(), vec![("count".to_owned(), 1)], true),
            _ => return None,
        };
        by_second(&key).then_some(TimeGrouping {
            filter,
            at,
            key,
            accs,
            by_count,
        })
    }
}

/// Whether `e` has one value for all documents received within one second: it reads no field
/// but the received time, and that only through a `$dateTrunc` whose bins are whole seconds.
fn by_second(e: &Expr) -> bool {
    match e {
        Expr::Literal(_) => true,
        Expr::Field(_) => false,
        Expr::Object(fields) => fields.iter().all(|(_, e)| by_second(e)),
        Expr::DateTrunc { date, unit_ms, bin } => {
            unit_ms
                .checked_mul(*bin)
                .is_some_and(|step| step % 1000 == 0)
                && (is_received(date) || by_second(date))
        }
        Expr::ToDate(e) => by_second(e),
        Expr::Divide(a, b) => by_second(a) && by_second(b),
    }
}

fn is_received(e: &Expr) -> bool {
    matches!(e, Expr::Field(parts) if parts.iter().map(String::as_str).eq(crate::RECEIVED_PATH.split('.')))
}

/// What a run's documents do in the pipeline's first stages.
#[derive(Debug, PartialEq, Eq)]
enum Fate {
    /// None passes the `$match`.
    Out,
    /// Its timed documents, all of them, pass into the group of this second.
    Counted(i64),
    /// Read them.
    Read,
}

impl TimeGrouping {
    fn fate(&self, run: &ReceivedRun) -> Fate {
        let Some((_, (from, to))) = self.filter else {
            // Without a `$match`, a document without a time is grouped by what the key makes
            // of a missing date: read it.
            return match run.second {
                Some(s) if run.untimed == 0 => Fate::Counted(s),
                _ => Fate::Read,
            };
        };
        // A document without a date there never passes a range of dates.
        let Some(second) = run.second else {
            return Fate::Out;
        };
        let Some(start) = second.checked_mul(1000) else {
            return Fate::Read;
        };
        let end = start.saturating_add(999);
        if end < from || start > to {
            Fate::Out
        } else if start >= from && end <= to {
            Fate::Counted(second)
        } else {
            Fate::Read
        }
    }

    /// The group key of the documents received in `second`, as the key makes it of each;
    /// `None` when making it fails (the documents are then read, and fail as they would).
    fn key_of(&self, second: i64) -> Option<Value> {
        // The usual key, without writing and reading back a date per run.
        if let Some(bin) = self.bin_of(second) {
            return crate::date::value(bin);
        }
        let mut stamp = Map::new();
        stamp.insert(
            "received".to_owned(),
            crate::date::value(second.checked_mul(1000)?)?,
        );
        let mut doc = Document::new();
        doc.insert(crate::STAMP_FIELD.to_owned(), Value::Object(stamp));
        Some(self.key.eval(&doc).ok()?.unwrap_or(Value::Null))
    }

    /// When the key is a `$dateTrunc` of the received time itself: the start (ms) of the bin
    /// `second` falls in.
    fn bin_of(&self, second: i64) -> Option<i64> {
        match &self.key {
            Expr::DateTrunc { date, unit_ms, bin } if is_received(date) => {
                truncate(second.checked_mul(1000)?, *unit_ms, *bin)
            }
            _ => None,
        }
    }

    /// The `$group`'s (or `$sortByCount`'s) path in the pipeline, for errors.
    fn path(&self) -> String {
        let name = if self.by_count {
            "$sortByCount"
        } else {
            "$group"
        };
        format!("[{}].{name}", self.at)
    }
}

/// The runs counted so far, and what of the range they leave to read.
struct Counted {
    table: Table,
    /// The stretches whose documents are decided without reading them.
    covered: Vec<(Position, Position)>,
    runs: u64,
    /// Documents through the `$match`.
    passed: u64,
    failed: Option<QueryError>,
    /// The last key made, by the bin it stands for: runs come in order, most in the bin of
    /// the one before.
    last: Option<(i64, Value)>,
}

impl Counted {
    fn add(&mut self, g: &TimeGrouping, run: ReceivedRun) {
        if self.failed.is_some() {
            return;
        }
        let second = match g.fate(&run) {
            Fate::Out => {
                self.covered.push((run.first, run.last));
                return;
            }
            Fate::Read => return,
            Fate::Counted(second) => second,
        };
        let bin = g.bin_of(second);
        let key = match (&self.last, bin) {
            (Some((b, key)), Some(bin)) if *b == bin => key.clone(),
            _ => match g.key_of(second) {
                Some(key) => key,
                None => return,
            },
        };
        if let Err(e) = self.table.add(Key::of(Some(&key)), run.first.0, run.timed) {
            self.failed = Some(e);
            return;
        }
        if let Some(bin) = bin {
            self.last = Some((bin, key));
        }
        self.covered.push((run.first, run.last));
        self.runs += 1;
        self.passed += run.timed;
    }
}

/// Runs `pipeline`, whose first stages are `g`, over `c`, from its runs where it keeps them;
/// `None` when it keeps none over the range (the caller reads every document).
pub(super) async fn aggregate(
    c: Arc<dyn Capped>,
    pipeline: &Pipeline,
    g: TimeGrouping,
    limits: Limits,
) -> Result<Option<Answer>, AggregateError> {
    let started = Instant::now();
    let Some(bounds) = c.bounds().await? else {
        return Ok(None);
    };
    let (mut first, mut last) = (bounds.oldest, bounds.newest);
    if let Some((_, (from, to))) = g.filter {
        match c.time_span(from, to).await? {
            // The read answers that at once.
            Some(TimeSpan::Empty) => return Ok(None),
            Some(TimeSpan::Positions(a, b)) => (first, last) = (first.max(a), last.min(b)),
            None => {}
        }
    }
    if first > last {
        return Ok(None);
    }
    let g = Arc::new(g);
    let counting = {
        let (c, g) = (c.clone(), g.clone());
        evaluate(move || {
            let mut counted = Counted {
                table: Table::new(limits, g.path()),
                covered: Vec::new(),
                runs: 0,
                passed: 0,
                failed: None,
                last: None,
            };
            let r = c.received_runs(first, last, &mut |run| counted.add(&g, run));
            (r, counted)
        })?
    };
    let (r, counted) = counting
        .await
        .map_err(|_| StoreError::Invalid("the query's runs stopped".into()))?;
    r?;
    let Counted {
        table,
        covered,
        runs,
        passed,
        failed,
        ..
    } = counted;
    if let Some(e) = failed {
        return Err(e.into());
    }
    if covered.is_empty() {
        return Ok(None);
    }

    // The documents no run decides, read and grouped on a query's thread.
    let gaps = gaps(first, last, &covered);
    let grouped = Grouped {
        table,
        accs: g.accs.clone(),
        rest: pipeline.after_grouping(g.at, g.by_count),
        by_count: g.by_count,
        limits,
    };
    let (mut answer, read, passed_read, groups) = {
        let g = g.clone();
        grouped
            .read_gaps(c, gaps, pipeline.fields_read(), move |doc, table| {
                if let Some((f, _)) = &g.filter
                    && !f.matches(doc)
                {
                    return Ok(false);
                }
                let position = doc.get("_id").and_then(Value::as_u64).unwrap_or(0);
                let value = g
                    .key
                    .eval_ref(doc)
                    .map_err(|e| QueryError::at(&g.path(), e))?;
                table.add(Key::of(value.as_deref()), position, 1)?;
                Ok(true)
            })
            .await?
    };
    let passed = passed + passed_read;
    let mut stages = Vec::new();
    if g.filter.is_some() {
        stages.push(StageRun {
            stage: "$match",
            ran: "timeline",
            out: Some(passed),
        });
    }
    stages.push(StageRun {
        stage: if g.by_count { "$sortByCount" } else { "$group" },
        ran: "timeline",
        out: Some(groups),
    });
    stages.append(&mut answer.stages);
    answer.stages = stages;
    answer.read = read + runs;
    answer.took_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
    Ok(Some(answer))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn grouping(j: Value) -> Option<TimeGrouping> {
        Pipeline::parse(&j).unwrap().time_grouping()
    }

    fn run(second: Option<i64>, timed: u64, untimed: u64) -> ReceivedRun {
        ReceivedRun {
            first: Position(10),
            last: Position(10 + timed + untimed - 1),
            second,
            timed,
            untimed,
        }
    }

    #[test]
    fn only_counting_by_a_truncated_received_time_after_a_range_is_answered_from_runs() {
        let minute = json!({"$dateTrunc": {"date": "$_tailrace.received", "unit": "minute"}});
        let from = crate::date::value(1_000_000).unwrap();
        for yes in [
            json!([{"$group": {"_id": minute, "n": {"$sum": 1}}}]),
            json!([
                {"$match": {"_tailrace.received": {"$gte": from, "$lt": crate::date::value(9_000_000).unwrap()}}},
                {"$group": {"_id": {"m": minute, "k": "x"}, "n": {"$count": {}}, "t": {"$sum": 2}}},
                {"$sort": {"_id": 1}},
            ]),
            json!([{"$match": {"_tailrace.received": {"$gt": from}}}, {"$sortByCount": minute}]),
            json!([{"$match": {"_tailrace.received": {"$gt": from}}}, {"$group": {"_id": null, "n": {"$sum": 1}}}]),
            json!([{"$group": {"_id": {"$dateTrunc": {"date": "$_tailrace.received", "unit": "second", "binSize": 15}}}}]),
        ] {
            assert!(grouping(yes.clone()).is_some(), "{yes}");
        }
        for no in [
            // The key reads the time to the millisecond, or another field.
            json!([{"$group": {"_id": "$_tailrace.received", "n": {"$sum": 1}}}]),
            json!([{"$group": {"_id": {"m": minute, "l": "$lang"}, "n": {"$sum": 1}}}]),
            json!([{"$group": {"_id": {"$dateTrunc": {"date": "$other", "unit": "minute"}}}}]),
            // The `$match` asks more than a range, or of another field.
            json!([{"$match": {"_tailrace.received": {"$gt": from}, "lang": "ja"}}, {"$group": {"_id": minute}}]),
            json!([{"$match": {"_tailrace.received": {"$ne": from}}}, {"$group": {"_id": minute}}]),
            json!([{"$match": {"_tailrace.received": {"$gt": 5}}}, {"$group": {"_id": minute}}]),
            json!([{"$match": {"other": {"$gt": from}}}, {"$group": {"_id": minute}}]),
            json!([{"$match": {"$or": [{"_tailrace.received": {"$gt": from}}]}}, {"$group": {"_id": minute}}]),
            // The group does more than count.
            json!([{"$group": {"_id": minute, "n": {"$sum": "$x"}}}]),
            json!([{"$group": {"_id": minute, "n": {"$max": 1}}}]),
            json!([{"$unwind": "$a"}, {"$group": {"_id": minute}}]),
        ] {
            assert!(grouping(no.clone()).is_none(), "{no}");
        }
    }

    #[test]
    fn a_run_is_counted_only_where_every_document_of_it_is_decided() {
        let minute = json!({"$dateTrunc": {"date": "$_tailrace.received", "unit": "minute"}});
        let ranged = grouping(json!([
            {"$match": {"_tailrace.received": {"$gte": crate::date::value(10_500).unwrap(), "$lte": crate::date::value(20_999).unwrap()}}},
            {"$group": {"_id": minute}},
        ]))
        .unwrap();
        assert_eq!(ranged.fate(&run(Some(9), 5, 0)), Fate::Out);
        assert_eq!(
            ranged.fate(&run(Some(10), 5, 0)),
            Fate::Read,
            "cut by the range"
        );
        assert_eq!(ranged.fate(&run(Some(11), 5, 3)), Fate::Counted(11));
        assert_eq!(ranged.fate(&run(Some(20), 5, 0)), Fate::Counted(20));
        assert_eq!(ranged.fate(&run(Some(21), 5, 0)), Fate::Out);
        assert_eq!(ranged.fate(&run(None, 0, 4)), Fate::Out);
        assert_eq!(ranged.fate(&run(Some(i64::MIN / 999), 1, 0)), Fate::Read);
        let all = grouping(json!([{"$group": {"_id": minute}}])).unwrap();
        assert_eq!(all.fate(&run(Some(11), 5, 0)), Fate::Counted(11));
        assert_eq!(all.fate(&run(Some(11), 5, 1)), Fate::Read, "a missing date");
        assert_eq!(all.fate(&run(None, 0, 4)), Fate::Read);
    }

    #[test]
    fn a_runs_key_is_the_one_its_documents_make() {
        for key in [
            json!({"$dateTrunc": {"date": "$_tailrace.received", "unit": "minute"}}),
            json!({"$dateTrunc": {"date": "$_tailrace.received", "unit": "day", "binSize": 7}}),
            json!({"m": {"$dateTrunc": {"date": "$_tailrace.received", "unit": "hour"}}, "c": 1}),
            json!({"$divide": [4, 2]}),
        ] {
            let g = grouping(json!([{"$group": {"_id": key}}])).unwrap();
            for ms in [
                1_796_565_600_000_i64,
                1_796_565_659_999,
                0,
                999,
                253_402_300_799_999,
            ] {
                let doc: Document = serde_json::from_value(
                    json!({"_tailrace": {"received": crate::date::value(ms).unwrap()}}),
                )
                .unwrap();
                // A key that fails (a bin before 1970) leaves the documents to be read.
                let want = g.key.eval(&doc).ok().map(|k| k.unwrap_or(Value::Null));
                assert_eq!(g.key_of(ms.div_euclid(1000)), want, "{key} {ms}");
            }
            // Before 1970 no date is written: its documents are read, and fail or not as
            // they would.
            assert_eq!(g.key_of(-1), None, "{key}");
        }
    }
}
