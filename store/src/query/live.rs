//! Live aggregates: a `$match` and a `$group` over a capped collection's window, kept as
//! documents arrive and are evicted, so that a client can be told of each group that moves.
//!
//! Each group keeps the documents of the window it holds (cut down to the fields the
//! `$group` reads), in order. When one arrives or is evicted, the group's answer is computed
//! again from them by the same evaluation a query from scratch uses, in the same order: the
//! live answer is the query's, to the last bit of a float sum, which a running total that
//! subtracts evicted values could not promise. The cost is a group's size per change, and the
//! memory one cut-down document per matching event of the window, counted against
//! [`Limits::max_bytes`].

use std::collections::{HashMap, VecDeque};

use serde_json::Value;

use super::eval::{canonical, size_of_doc};
use super::expr::Expr;
use super::{Limits, Pipeline, QueryError, Stage, only_paths};
use crate::{Document, Filter, Position};

/// A group's new answer, or `None` when its last document left the window.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupChange {
    /// The group's `_id`.
    pub key: Value,
    /// Its document, as a query from scratch would answer it.
    pub doc: Option<Value>,
}

struct Group {
    key: Value,
    /// The group's documents of the window, by position.
    docs: VecDeque<(u64, Document)>,
}

/// The state of a live `$match` + `$group`.
pub struct Live {
    filter: Option<Filter>,
    key: Expr,
    /// The `$group` stage alone, run over one group's documents.
    group: Pipeline,
    paths: Vec<Vec<String>>,
    groups: HashMap<String, Group>,
    /// Which group each held document is in, by position: evictions go oldest first.
    order: VecDeque<(u64, String)>,
    held: usize,
    limits: Limits,
}

/// What a live answer can be.
const SHAPE: &str = "a live answer is a $group, after at most one $match";

impl Live {
    /// The live state of `pipeline`, which must be a `$group` after at most one `$match`
    /// (anything else is refused, naming the stage). Empty: [`Live::add`] fills it.
    pub fn new(pipeline: &Pipeline, limits: Limits) -> Result<Live, QueryError> {
        let (filter, at) = match pipeline.stages.first() {
            Some(Stage::Match(f)) => (Some(f.clone()), 1),
            _ => (None, 0),
        };
        let Some(Stage::Group { id, .. }) = pipeline.stages.get(at) else {
            let name = pipeline.stages.get(at).map_or("", Stage::name);
            return Err(QueryError::at(
                &format!("[{at}]{}{name}", if name.is_empty() { "" } else { "." }),
                format!("{SHAPE}: {name} cannot be kept live (sort and limit on the client)"),
            ));
        };
        if let Some(next) = pipeline.stages.get(at + 1) {
            return Err(QueryError::at(
                &format!("[{}].{}", at + 1, next.name()),
                format!(
                    "{SHAPE}: a stage after the $group cannot be kept live (sort and limit on the client)"
                ),
            ));
        }
        let group = pipeline.after(at);
        let paths = only_paths(&group.fields_read().unwrap_or_default());
        Ok(Live {
            filter,
            key: id.clone(),
            group,
            paths,
            groups: HashMap::new(),
            order: VecDeque::new(),
            held: 0,
            limits,
        })
    }

    /// Takes the document at `position` (newer than any before): the key of the group it
    /// moved, if it matched.
    pub fn add(
        &mut self,
        position: Position,
        doc: &Document,
    ) -> Result<Option<String>, QueryError> {
        if self.filter.as_ref().is_some_and(|f| !f.matches(doc)) {
            return Ok(None);
        }
        let key = self
            .key
            .eval(doc)
            .map_err(|e| QueryError::at("[group]._id", e))?
            .unwrap_or(Value::Null);
        let canon = canonical(&key);
        let cut = cut(doc, &self.paths);
        self.held += size_of_doc(&cut) + 2 * canon.len() + 32;
        if self.held > self.limits.max_bytes {
            return Err(QueryError::at(
                "",
                format!(
                    "the live answer would hold more than {} bytes of the window's documents; \
                     narrow its $match",
                    self.limits.max_bytes
                ),
            ));
        }
        self.groups
            .entry(canon.clone())
            .or_insert_with(|| Group {
                key,
                docs: VecDeque::new(),
            })
            .docs
            .push_back((position.0, cut));
        self.order.push_back((position.0, canon.clone()));
        Ok(Some(canon))
    }

    /// Lets go of every document before `oldest` (evicted from the window): the keys of the
    /// groups that moved.
    pub fn evict_before(&mut self, oldest: Position) -> Vec<String> {
        let mut moved: Vec<String> = Vec::new();
        while let Some((p, _)) = self.order.front()
            && *p < oldest.0
        {
            let Some((p, canon)) = self.order.pop_front() else {
                break;
            };
            if let Some(g) = self.groups.get_mut(&canon)
                && let Some((first, doc)) = g.docs.pop_front()
            {
                debug_assert_eq!(first, p, "groups hold their documents in order");
                self.held = self
                    .held
                    .saturating_sub(size_of_doc(&doc) + 2 * canon.len() + 32);
            }
            if !moved.contains(&canon) {
                moved.push(canon);
            }
        }
        moved
    }

    /// The group's answer now: `None` when it holds no document (it is not in the answer).
    pub fn change(&mut self, canon: &str) -> Result<GroupChange, QueryError> {
        let Some(g) = self.groups.get(canon) else {
            return Err(QueryError::at("", format!("no group {canon}")));
        };
        if g.docs.is_empty() {
            let key = g.key.clone();
            self.groups.remove(canon);
            return Ok(GroupChange { key, doc: None });
        }
        let docs = g.docs.iter().map(|(_, d)| d.clone());
        let mut answer = self.group.run(docs, self.limits)?;
        Ok(GroupChange {
            key: g.key.clone(),
            doc: answer.docs.pop(),
        })
    }

    /// Every group's answer, in the order a query from scratch gives them (by each group's
    /// oldest document).
    pub fn snapshot(&self) -> Result<Vec<Value>, QueryError> {
        let mut groups: Vec<&Group> = self
            .groups
            .values()
            .filter(|g| !g.docs.is_empty())
            .collect();
        groups.sort_by_key(|g| g.docs.front().map_or(0, |(p, _)| *p));
        let mut out = Vec::with_capacity(groups.len());
        for g in groups {
            let docs = g.docs.iter().map(|(_, d)| d.clone());
            out.extend(self.group.run(docs, self.limits)?.docs);
        }
        Ok(out)
    }

    /// The paths a document read for [`Live::add`] needs (dotted): `None` for all of it.
    pub fn fields_read(&self) -> Option<Vec<String>> {
        let mut fields: Vec<String> = self.paths.iter().map(|p| p.join(".")).collect();
        if let Some(f) = &self.filter {
            let mut from_filter = Vec::new();
            super::filter_fields(f.as_json(), &mut from_filter);
            for p in from_filter {
                if !fields.contains(&p) {
                    fields.push(p);
                }
            }
        }
        Some(fields)
    }
}

/// `doc` cut down to `paths` (arrays and scalars on the way taken whole).
fn cut(doc: &Document, paths: &[Vec<String>]) -> Document {
    let mut out = Document::new();
    for path in paths {
        copy(doc, path, &mut out);
    }
    out
}

fn copy(from: &Document, path: &[String], to: &mut Document) {
    let Some((first, rest)) = path.split_first() else {
        return;
    };
    let Some(v) = from.get(first) else {
        return;
    };
    match (v, rest.is_empty()) {
        (Value::Object(inner), false) => {
            let slot = to
                .entry(first.clone())
                .or_insert_with(|| Value::Object(Document::new()));
            if let Value::Object(slot) = slot {
                copy(inner, rest, slot);
            }
        }
        _ => {
            to.insert(first.clone(), v.clone());
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::*;

    fn doc(i: u64) -> Document {
        let langs = ["ja", "en", "ar", "🌍"];
        let mut d = json!({
            "_id": i,
            "lang": langs[(i * i % 4) as usize],
            "f": (i % 7) as f64 * 0.1,
            "n": i % 5,
            "user": {"id": i % 3, "bio": "long text no group reads"},
            "t": crate::date::value(1_796_565_600_000 + i as i64 * 13_000).unwrap(),
        });
        if i.is_multiple_of(6) {
            d.as_object_mut().unwrap().remove("f");
        }
        d.as_object().cloned().unwrap()
    }

    /// After every arrival and eviction, the groups that moved answer as a query from
    /// scratch over the window answers them, float sums to the last bit; so does the whole.
    #[test]
    fn every_move_answers_as_a_query_from_scratch() {
        let text = r#"[{"$match": {"n": {"$gte": 1}}}, {"$group": {"_id": {"l": "$lang", "m": {"$dateTrunc": {"date": "$t", "unit": "minute"}}}, "n": {"$sum": 1}, "f": {"$sum": "$f"}, "mean": {"$avg": "$f"}, "least": {"$min": "$user.id"}, "first": {"$first": "$_id"}, "c": {"$count": {}}}}]"#;
        let pipeline = Pipeline::parse_text(text).unwrap();
        let mut live = Live::new(&pipeline, Limits::default()).unwrap();
        let mut oldest = 0;
        let mut checked = 0;
        for i in 0..400_u64 {
            let mut moved: Vec<String> = live
                .add(Position(i), &doc(i))
                .unwrap()
                .into_iter()
                .collect();
            // A window of 50 to 120 documents, shrinking and growing.
            let keep = 50 + (i * 7 % 71);
            if i >= keep && i - keep > oldest {
                oldest = i - keep;
                moved.extend(live.evict_before(Position(oldest)));
            }
            let window: Vec<Document> = (oldest..=i).map(doc).collect();
            let want = pipeline.run(window, Limits::default()).unwrap().docs;
            for canon in moved {
                let change = live.change(&canon).unwrap();
                let from_scratch = want.iter().find(|d| d["_id"] == change.key).cloned();
                assert_eq!(change.doc, from_scratch, "after {i}, window from {oldest}");
                checked += 1;
            }
            if i % 37 == 0 {
                assert_eq!(live.snapshot().unwrap(), want, "after {i}");
            }
        }
        assert!(checked > 400, "{checked} moves checked");
    }

    #[test]
    fn only_a_group_after_a_match_is_kept_live() {
        let refused = |text: &str| {
            Live::new(&Pipeline::parse_text(text).unwrap(), Limits::default())
                .err()
                .unwrap()
                .to_string()
        };
        let sorted = refused(r#"[{"$group": {"_id": "$lang"}}, {"$sort": {"_id": 1}}]"#);
        assert!(sorted.starts_with("[1].$sort: "), "{sorted}");
        let projected = refused(r#"[{"$project": {"lang": 1}}, {"$group": {"_id": "$lang"}}]"#);
        assert!(projected.starts_with("[0].$project: "), "{projected}");
        assert!(refused(r#"[{"$match": {}}]"#).contains("a live answer is a $group"));
    }

    #[test]
    fn a_live_answer_past_its_memory_bound_is_refused() {
        let pipeline =
            Pipeline::parse_text(r#"[{"$group": {"_id": "$lang", "b": {"$push": "$user"}}}]"#)
                .unwrap();
        let mut live = Live::new(&pipeline, Limits { max_bytes: 4096 }).unwrap();
        let e = (0..100)
            .find_map(|i| live.add(Position(i), &doc(i)).err())
            .unwrap();
        assert!(e.message.contains("more than 4096 bytes"), "{e}");
    }
}
