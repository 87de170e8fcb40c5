//! A pipeline that starts with a `$group` by one field, counting (`$count`, `$sum` of an
//! integer), or with a `$sortByCount` of one field (a counting `$group`, then a `$sort`),
//! answered from the engine's summaries of the field's values where it keeps them
//! ([`crate::Capped::value_groups`]: the embedded engine's, for an indexed field, per finished
//! segment), and from the documents elsewhere. This is MongoDB's `DISTINCT_SCAN`: a distinct
//! of an indexed field reads its index, not the documents.
//!
//! The groups are the ones a read of every document makes, in the same order (by the
//! position of each group's first document) and with the same keys and counts; the rest of
//! the pipeline then runs over them as usual. A summary holds only string values and null or
//! missing, so no key from it can equal a key of another type read from the documents. The
//! answer says the `$group` (or `$sortByCount`) ran on the `index`.

use std::sync::Arc;
use std::time::Instant;

use serde_json::{Map, Value};
use tokio::sync::mpsc;

use super::eval::{GroupIndex, heap_of, over_bound, reserve, write_key};
use super::expr::Expr;
use super::read::{AggregateError, IN_FLIGHT, evaluate, off_runtime, read_range};
use super::{Acc, Answer, Limits, Pipeline, QueryError, Stage, StageRun};
use crate::{Capped, Document, Position, StoreError};

/// What such a `$group` is: the field, and each accumulator's name and what it adds per
/// document.
pub(super) struct Grouping {
    field: String,
    parts: Vec<String>,
    accs: Vec<(String, i64)>,
    /// A `$sortByCount`: its groups are then sorted by count, most first, and `_id`.
    by_count: bool,
}

impl Pipeline {
    /// The pipeline's first stage as a [`Grouping`], when it is one.
    pub(super) fn grouping(&self) -> Option<Grouping> {
        let (parts, accs, by_count) = match self.stages.first()? {
            Stage::Group {
                id: Expr::Field(parts),
                accs,
            } => (parts, counting(accs)?, false),
            Stage::SortByCount(Expr::Field(parts)) => (parts, vec![("count".to_owned(), 1)], true),
            _ => return None,
        };
        // A capped document's `_id` is its position, never summarized.
        if parts.first().is_none_or(|p| p == "_id") {
            return None;
        }
        Some(Grouping {
            field: parts.join("."),
            parts: parts.clone(),
            accs,
            by_count,
        })
    }

    /// The stages after stage `at`, behind the sort a `$sortByCount` ends with (as MongoDB
    /// describes it: a `$group` counting, then this `$sort`) when `by_count`.
    pub(super) fn after_grouping(&self, at: usize, by_count: bool) -> Pipeline {
        let mut rest = self.after(at + 1);
        if by_count {
            rest.stages.insert(
                0,
                Stage::Sort(vec![
                    (vec!["count".into()], false),
                    (vec!["_id".into()], true),
                ]),
            );
        }
        rest
    }
}

/// What each of a `$group`'s accumulators adds per document, when every one counts: `$count`,
/// or `$sum` of an integer.
pub(super) fn counting(accs: &[(String, Acc)]) -> Option<Vec<(String, i64)>> {
    accs.iter()
        .map(|(name, acc)| match acc {
            Acc::Count => Some((name.clone(), 1)),
            // Small enough that no count of documents makes the sum overflow.
            Acc::Sum(Expr::Literal(Value::Number(n))) => n
                .as_i64()
                .filter(|k| k.unsigned_abs() <= 1 << 31)
                .map(|k| (name.clone(), k)),
            _ => None,
        })
        .collect()
}

/// A group's key as met.
pub(super) enum Key<'a> {
    Str(&'a str),
    Null,
    Other(&'a Value),
}

impl<'a> Key<'a> {
    /// The key of a group by `value` (missing: null), as met in a document.
    pub(super) fn of(value: Option<&'a Value>) -> Key<'a> {
        match value {
            None | Some(Value::Null) => Key::Null,
            Some(Value::String(s)) => Key::Str(s),
            Some(v) => Key::Other(v),
        }
    }
}

/// The groups made so far from what the engine keeps, and what comes after them.
pub(super) struct Grouped {
    pub(super) table: Table,
    pub(super) accs: Vec<(String, i64)>,
    /// The stages after the group ([`Pipeline::after_grouping`]).
    pub(super) rest: Pipeline,
    pub(super) by_count: bool,
    pub(super) limits: Limits,
}

impl Grouped {
    /// Reads the documents of `gaps` (only `fields`, each with its position as `_id`) and
    /// hands each to `add`, which groups it into the table and says whether it passed the
    /// stages before the group; then runs the rest of the pipeline over the groups. Returns
    /// the answer, the documents read, those that passed, and the groups.
    pub(super) async fn read_gaps(
        self,
        c: Arc<dyn Capped>,
        gaps: Vec<(Position, Position)>,
        fields: Option<Vec<String>>,
        mut add: impl FnMut(&Document, &mut Table) -> Result<bool, QueryError> + Send + 'static,
    ) -> Result<(Answer, u64, u64, u64), AggregateError> {
        let (tx, mut rx) = mpsc::channel::<Vec<Document>>(IN_FLIGHT);
        let Grouped {
            mut table,
            accs,
            rest,
            by_count,
            limits,
        } = self;
        let eval = evaluate(move || {
            let (mut read, mut passed) = (0u64, 0u64);
            while let Some(batch) = rx.blocking_recv() {
                for doc in batch {
                    read += 1;
                    passed += u64::from(add(&doc, &mut table)?);
                }
            }
            let groups = table.len() as u64;
            // The stages after the `$group` hold what the groups leave of the bound.
            let left = Limits {
                max_bytes: limits.max_bytes.saturating_sub(table.held()),
            };
            let mut answer = rest.run(table.into_docs(&accs), left)?;
            if by_count {
                // The sort is the `$sortByCount`'s own, not a stage of the client's.
                answer.stages.remove(0);
            }
            Ok::<_, QueryError>((answer, read, passed, groups))
        })?;
        let reading = off_runtime(async move {
            for (first, last) in gaps {
                read_range(c.clone(), first, last, fields.as_deref(), true, tx.clone()).await?;
            }
            Ok::<_, StoreError>(())
        })?
        .await
        .map_err(|_| StoreError::Invalid("the query's reading stopped".into()))?;
        let evaluated = eval
            .await
            .map_err(|_| StoreError::Invalid("the query's evaluation stopped".into()))?;
        reading?;
        Ok(evaluated?)
    }
}

/// The groups met so far, as the `$group` stage holds them (and bounded as it is).
pub(super) struct Table {
    index: GroupIndex,
    /// Each group's first position, key and count, in the order met.
    groups: Vec<(u64, Value, u64)>,
    canon: String,
    held: usize,
    limits: Limits,
    /// The stage's path (`[0].$group`), for a refusal.
    at: String,
}

impl Table {
    pub(super) fn new(limits: Limits, at: String) -> Table {
        Table {
            index: GroupIndex::default(),
            groups: Vec::new(),
            canon: String::new(),
            held: 0,
            limits,
            at,
        }
    }

    pub(super) fn add(&mut self, key: Key<'_>, first: u64, count: u64) -> Result<(), QueryError> {
        self.canon.clear();
        match key {
            Key::Str(s) => {
                self.canon.push('"');
                self.canon.push_str(s);
            }
            Key::Null => write_key(&Value::Null, &mut self.canon),
            Key::Other(v) => write_key(v, &mut self.canon),
        }
        let hash = match self.index.find(&self.canon) {
            (_, Some(slot)) => {
                let g = &mut self.groups[slot];
                g.0 = g.0.min(first);
                g.2 += count;
                return Ok(());
            }
            (hash, None) => hash,
        };
        let value = match key {
            Key::Str(s) => Value::String(s.to_owned()),
            Key::Null => Value::Null,
            Key::Other(v) => v.clone(),
        };
        // What the `$group` stage counts for a new group: what the table allocates for it,
        // refused before it grows past the bound.
        let room = self.limits.max_bytes.saturating_sub(self.held);
        let grown = (|| {
            let mut grown = heap_of(&value);
            grown += self
                .index
                .make_room(self.canon.len(), room.checked_sub(grown)?)?;
            grown += reserve(&mut self.groups, 1, room.checked_sub(grown)?)?;
            Some(grown)
        })();
        let Some(grown) = grown else {
            return Err(QueryError::at(&self.at, over_bound(self.limits)));
        };
        self.held += grown;
        self.index.insert(hash, &self.canon);
        self.groups.push((first, value, count));
        Ok(())
    }

    /// The groups met.
    pub(super) fn len(&self) -> usize {
        self.groups.len()
    }

    /// What the table holds, as counted against the query's bound.
    pub(super) fn held(&self) -> usize {
        self.held
    }

    /// The `$group`'s output: a document per group, by first position, each made as it is
    /// taken (all of them at once would hold as much again as the groups, uncounted).
    pub(super) fn into_docs(mut self, accs: &[(String, i64)]) -> impl Iterator<Item = Document> {
        self.groups.sort_by_key(|g| g.0);
        self.groups.into_iter().map(move |(_, key, count)| {
            let mut d = Map::new();
            d.insert("_id".into(), key);
            for (name, k) in accs {
                d.insert(name.clone(), Value::from(*k * count as i64));
            }
            d
        })
    }
}

/// Runs `pipeline`, whose first stage is `g`, over `c`, from the summaries of `g`'s field
/// where `c` keeps them; `None` when it keeps none over the window (the caller reads every
/// document).
pub(super) async fn aggregate(
    c: Arc<dyn Capped>,
    pipeline: &Pipeline,
    g: Grouping,
    limits: Limits,
) -> Result<Option<Answer>, AggregateError> {
    let started = Instant::now();
    let Some(bounds) = c.bounds().await? else {
        return Ok(None);
    };
    let (oldest, newest) = (bounds.oldest, bounds.newest);
    let stage = if g.by_count { "$sortByCount" } else { "$group" };
    let summed = {
        let (c, field) = (c.clone(), g.field.clone());
        evaluate(move || {
            let mut table = Table::new(limits, format!("[0].{stage}"));
            let (mut entries, mut failed) = (0u64, None);
            let covered = c.value_groups(&field, oldest, newest, &mut |v| {
                entries += 1;
                if failed.is_none() {
                    let key = v.value.map_or(Key::Null, Key::Str);
                    if let Err(e) = table.add(key, v.first.0, v.count) {
                        failed = Some(e);
                    }
                }
            });
            (covered, table, entries, failed)
        })?
    };
    let (covered, table, entries, failed) = summed
        .await
        .map_err(|_| StoreError::Invalid("the query's summaries stopped".into()))?;
    let covered = covered?;
    if let Some(e) = failed {
        return Err(e.into());
    }
    if covered.is_empty() {
        return Ok(None);
    }

    // The documents no summary covers, read and grouped on a query's thread.
    let gaps = gaps(oldest, newest, &covered);
    let parts = g.parts;
    let grouped = Grouped {
        table,
        accs: g.accs,
        rest: pipeline.after_grouping(0, g.by_count),
        by_count: g.by_count,
        limits,
    };
    let (mut answer, read, _, groups) = grouped
        .read_gaps(c, gaps, Some(vec![g.field]), move |doc, table| {
            let position = doc.get("_id").and_then(Value::as_u64).unwrap_or(0);
            let value = super::value_at(doc, &parts);
            table.add(Key::of(value.as_deref()), position, 1)?;
            Ok(true)
        })
        .await?;
    let mut stages = vec![StageRun {
        stage,
        ran: "index",
        out: Some(groups),
    }];
    stages.append(&mut answer.stages);
    answer.stages = stages;
    answer.read = read + entries;
    answer.took_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
    Ok(Some(answer))
}

/// The stretches of `[oldest, newest]` outside `covered` (inclusive, in order, apart).
pub(super) fn gaps(
    oldest: Position,
    newest: Position,
    covered: &[(Position, Position)],
) -> Vec<(Position, Position)> {
    let mut out = Vec::new();
    let mut next = oldest.0;
    for (first, last) in covered {
        if first.0 > next {
            out.push((Position(next), Position(first.0 - 1)));
        }
        next = next.max(last.0.saturating_add(1));
    }
    if next <= newest.0 {
        out.push((Position(next), newest));
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn gaps_are_what_the_summaries_leave() {
        let p = Position;
        assert_eq!(gaps(p(1), p(10), &[]), vec![(p(1), p(10))]);
        assert_eq!(gaps(p(1), p(10), &[(p(1), p(10))]), vec![]);
        assert_eq!(
            gaps(p(1), p(10), &[(p(3), p(4)), (p(5), p(6))]),
            vec![(p(1), p(2)), (p(7), p(10))]
        );
        assert_eq!(
            gaps(p(1), p(10), &[(p(2), p(9))]),
            vec![(p(1), p(1)), (p(10), p(10))]
        );
    }

    #[test]
    fn only_a_leading_counting_group_by_a_field_is_answered_from_summaries() {
        let grouping = |j: Value| {
            Pipeline::parse(&j)
                .unwrap()
                .grouping()
                .map(|g| (g.field, g.accs))
        };
        assert_eq!(
            grouping(serde_json::json!([{"$group": {"_id": "$user.name"}}, {"$count": "n"}])),
            Some(("user.name".into(), vec![]))
        );
        assert_eq!(
            grouping(
                serde_json::json!([{"$group": {"_id": "$a", "n": {"$sum": 1}, "c": {"$count": {}}, "t": {"$sum": -3}}}])
            ),
            Some((
                "a".into(),
                vec![("c".into(), 1), ("n".into(), 1), ("t".into(), -3)]
            ))
        );
        assert_eq!(
            grouping(serde_json::json!([{"$sortByCount": "$a.b"}, {"$limit": 3}])),
            Some(("a.b".into(), vec![("count".into(), 1)]))
        );
        for other in [
            serde_json::json!([{"$match": {"a": 1}}, {"$group": {"_id": "$a"}}]),
            serde_json::json!([{"$group": {"_id": "$a", "n": {"$sum": "$b"}}}]),
            serde_json::json!([{"$group": {"_id": "$a", "n": {"$sum": 1.5}}}]),
            serde_json::json!([{"$group": {"_id": "$a", "n": {"$max": 1}}}]),
            serde_json::json!([{"$group": {"_id": {"a": "$a"}}}]),
            serde_json::json!([{"$group": {"_id": "$_id"}}]),
            serde_json::json!([{"$sortByCount": {"$toDate": "$a"}}]),
        ] {
            assert!(grouping(other.clone()).is_none(), "{other}");
        }
    }
}
