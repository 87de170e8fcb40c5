//! Running a parsed pipeline: documents are pushed through the stages one at a time; `$sort`,
//! `$group`, `$count` and `$sortByCount` hold what they need and pass it on when the input
//! ends. A `$limit` that is full stops the reading.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::time::Instant;

use hashbrown::HashSet;
use serde::Serialize;
use serde_json::{Map, Number, Value};

use super::expr::{date_millis, lookup};
use super::{Acc, Limits, Projection, QueryError, Stage};
use crate::Document;
use crate::filter::matching::number_cmp;

/// A query's answer, and how it was reached.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Answer {
    /// The documents out of the last stage.
    pub docs: Vec<Value>,
    /// Each stage: where it ran and how many documents came out of it.
    pub stages: Vec<StageRun>,
    /// Documents tailrace read: from the collection, or out of the stages a server ran; for
    /// a `$group` run on the `index`, the documents read plus the summaries' values; on the
    /// `timeline`, the documents read plus the runs added up.
    pub read: u64,
    /// Time spent evaluating, in microseconds.
    pub took_us: u64,
}

/// Where one stage ran, and what came out.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StageRun {
    /// `$match`, `$group`, ...
    pub stage: &'static str,
    /// `tailrace` (evaluated in-process), `server` (run by a database server), `index`
    /// (a `$group` by an indexed field, from the engine's summaries of its values where it
    /// keeps them and from the documents elsewhere: `query/indexed.rs`) or `timeline` (a
    /// `$match` of received times and a count by a time bucket of them, from the engine's
    /// counts of documents received each second where it keeps them: `query/timed.rs`).
    pub ran: &'static str,
    /// Documents out of it; `None` inside a server's part of the pipeline (the server says
    /// only what comes out of its last stage).
    pub out: Option<u64>,
}

/// Whether reading goes on.
#[derive(PartialEq)]
enum Flow {
    More,
    Done,
}

struct Run<'a> {
    stages: &'a [Stage],
    states: Vec<State>,
    out: Vec<u64>,
    results: Vec<Value>,
    held: usize,
    limits: Limits,
    /// A group key's canonical text, written here: a new `String` only for a new group.
    canon: String,
}

enum State {
    None,
    Skip(u64),
    Limit(u64),
    Buffer(Vec<Document>),
    Groups(Groups),
    Count(u64),
}

/// Group keys' canonical texts to their groups (numbered in the order met). A table of each
/// key's hash and group, 16 bytes an entry, with the texts kept apart in one buffer: a lookup
/// reads one entry and compares a text only on a full hash match, and a growing table moves
/// its entries without hashing a text again. Over a long tail (hundreds of thousands of
/// hashtags or names) the table outgrows every cache, and a `HashMap<String, _>`, whose
/// entries point at their texts, missed the cache twice as often per lookup.
#[derive(Default)]
pub(super) struct GroupIndex {
    table: hashbrown::HashTable<(u64, usize)>,
    hasher: hashbrown::DefaultHashBuilder,
    /// Each group's text: `spans[g]` in `texts`.
    texts: Vec<u8>,
    spans: Vec<(usize, usize)>,
}

/// Bytes of an entry of [`GroupIndex`]'s table: the entry and its control byte.
const ENTRY_BYTES: usize = std::mem::size_of::<(u64, usize)>() + 1;

impl GroupIndex {
    /// The hash of `canon`, and its group if it has one.
    pub(super) fn find(&self, canon: &str) -> (u64, Option<usize>) {
        use std::hash::BuildHasher;
        let hash = self.hasher.hash_one(canon);
        let (texts, spans) = (&self.texts, &self.spans);
        let found = self.table.find(hash, |&(h, g)| {
            h == hash && {
                let (at, len) = spans[g];
                &texts[at..at + len] == canon.as_bytes()
            }
        });
        (hash, found.map(|&(_, g)| g))
    }

    /// Makes room for a group of a text of `len` bytes, and says how many bytes that
    /// allocated; `None`, having allocated nothing more, when growing would hold more than
    /// `room` bytes at once ([`reserve`]).
    pub(super) fn make_room(&mut self, len: usize, room: usize) -> Option<usize> {
        let mut grown = 0;
        let cap = self.table.capacity();
        if self.table.len() == cap {
            // hashbrown doubles its entries (from 4) when full, and uses 7/8 of them.
            let entries = if cap == 0 { 0 } else { (cap * 8).div_ceil(7) };
            let next = (entries * 2).max(4);
            if next * ENTRY_BYTES > room {
                return None;
            }
            let before = self.table_bytes();
            self.table.reserve(1, |e| e.0);
            grown += self.table_bytes().saturating_sub(before);
        }
        grown += reserve(&mut self.texts, len, room.checked_sub(grown)?)?;
        grown += reserve(&mut self.spans, 1, room.checked_sub(grown)?)?;
        Some(grown)
    }

    /// Numbers `canon`, which [`GroupIndex::find`] gave `hash` and no group, as the next
    /// group.
    pub(super) fn insert(&mut self, hash: u64, canon: &str) -> usize {
        let g = self.spans.len();
        self.spans.push((self.texts.len(), canon.len()));
        self.texts.extend_from_slice(canon.as_bytes());
        self.table.insert_unique(hash, (hash, g), |e| e.0);
        g
    }

    fn table_bytes(&self) -> usize {
        (self.table.capacity() * 8).div_ceil(7) * ENTRY_BYTES
    }
}

/// Grows `v` to hold `extra` more, to twice its capacity at least, when it must, and says
/// how many bytes that allocated; `None`, with nothing allocated, when the growth would hold
/// more than `room` bytes at once: the new block, and the old one while it is copied.
/// Checking before growing, rather than counting after, keeps a doubling of a large table
/// from passing a query's bound by as much again before it is refused.
pub(super) fn reserve<T>(v: &mut Vec<T>, extra: usize, room: usize) -> Option<usize> {
    let (len, cap) = (v.len(), v.capacity());
    if cap - len >= extra {
        return Some(0);
    }
    let size = std::mem::size_of::<T>();
    let want = (cap * 2).max(len + extra).max(4);
    if want * size > room {
        return None;
    }
    v.reserve_exact(want - len);
    Some((v.capacity() - cap) * size)
}

#[derive(Default)]
struct Groups {
    index: GroupIndex,
    /// Each group's key, in the order the groups were met.
    keys: Vec<Value>,
    /// Each group's accumulators, one after the other (as many per group as the stage has):
    /// one array, not one per group, so adding to a group reaches its accumulators without
    /// following a pointer of their own.
    accs: Vec<AccState>,
}

impl Groups {
    /// Makes room for a new group (of a text of `len` bytes, `per` accumulators, and `heap`
    /// bytes its key and accumulators allocate of their own), and says how many bytes it will
    /// hold; `None`, having grown nothing more, when that would pass `room`. What a set or a
    /// list accumulator holds beyond its slot is counted as it grows.
    fn room_for(&mut self, len: usize, heap: usize, per: usize, room: usize) -> Option<usize> {
        let mut grown = heap;
        grown += self.index.make_room(len, room.checked_sub(grown)?)?;
        grown += reserve(&mut self.keys, 1, room.checked_sub(grown)?)?;
        grown += reserve(&mut self.accs, per, room.checked_sub(grown)?)?;
        Some(grown)
    }
}

pub(super) fn run<I>(stages: &[Stage], docs: I, limits: Limits) -> Result<Answer, QueryError>
where
    I: IntoIterator<Item = Document>,
{
    let started = Instant::now();
    let states = stages
        .iter()
        .map(|s| match s {
            Stage::Skip(n) => State::Skip(*n),
            Stage::Limit(n) => State::Limit(*n),
            Stage::Sort(_) => State::Buffer(Vec::new()),
            Stage::Group { .. } | Stage::SortByCount(_) => State::Groups(Groups::default()),
            Stage::Count(_) => State::Count(0),
            _ => State::None,
        })
        .collect();
    let mut run = Run {
        stages,
        states,
        out: vec![0; stages.len()],
        results: Vec::new(),
        held: 0,
        limits,
        canon: String::new(),
    };
    let mut read = 0;
    for doc in docs {
        read += 1;
        if run.push(0, doc)? == Flow::Done {
            break;
        }
    }
    run.finish(0)?;
    Ok(Answer {
        docs: run.results,
        stages: stages
            .iter()
            .zip(run.out)
            .map(|(s, out)| StageRun {
                stage: s.name(),
                ran: "tailrace",
                out: Some(out),
            })
            .collect(),
        read,
        took_us: u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
    })
}

impl Run<'_> {
    fn err(&self, i: usize, message: impl Into<String>) -> QueryError {
        QueryError::at(&format!("[{i}].{}", self.stages[i].name()), message)
    }

    fn hold(&mut self, i: usize, bytes: usize) -> Result<(), QueryError> {
        self.held = self.held.saturating_add(bytes);
        if self.held > self.limits.max_bytes {
            return Err(self.err(i, over_bound(self.limits)));
        }
        Ok(())
    }

    /// Passes `doc` out of stage `i - 1` into stage `i`.
    fn emit(&mut self, i: usize, doc: Document) -> Result<Flow, QueryError> {
        self.out[i - 1] += 1;
        self.push(i, doc)
    }

    /// Passes `doc` into stage `i`; past the last stage, into the answer.
    fn push(&mut self, i: usize, mut doc: Document) -> Result<Flow, QueryError> {
        if i == self.stages.len() {
            self.results.push(Value::Object(doc));
            return Ok(Flow::More);
        }
        let stages = self.stages;
        match &stages[i] {
            Stage::Match(f) => {
                if f.matches(&doc) {
                    return self.emit(i + 1, doc);
                }
                Ok(Flow::More)
            }
            Stage::Skip(_) => {
                if let State::Skip(n) = &mut self.states[i]
                    && *n > 0
                {
                    *n -= 1;
                    return Ok(Flow::More);
                }
                self.emit(i + 1, doc)
            }
            Stage::Limit(_) => {
                let State::Limit(n) = &mut self.states[i] else {
                    return Ok(Flow::Done);
                };
                if *n == 0 {
                    return Ok(Flow::Done);
                }
                *n -= 1;
                let last = *n == 0;
                let flow = self.emit(i + 1, doc)?;
                Ok(if last { Flow::Done } else { flow })
            }
            Stage::Project(p) => {
                let projected = project(p, &doc).map_err(|e| self.err(i, e))?;
                self.emit(i + 1, projected)
            }
            Stage::Unwind { path, keep_empty } => {
                let keep_empty = *keep_empty;
                match get_path(&doc, path) {
                    Some(Value::Array(items)) if !items.is_empty() => {
                        // The array taken out first: each copy is the rest of the document
                        // and one element, not the whole array again.
                        let Some(Value::Array(items)) = take_path(&mut doc, path) else {
                            return Ok(Flow::More);
                        };
                        if Self::only_reads(stages.get(i + 1)) {
                            // The next stage reads each document and keeps none: one document,
                            // its element replaced in turn, instead of a copy per element.
                            for item in items {
                                set_path(&mut doc, path, item);
                                self.out[i] += 1;
                                self.take_in(i + 1, &doc)?;
                            }
                            return Ok(Flow::More);
                        }
                        let last = items.len() - 1;
                        for (k, item) in items.into_iter().enumerate() {
                            let mut copy = if k == last {
                                std::mem::take(&mut doc)
                            } else {
                                doc.clone()
                            };
                            set_path(&mut copy, path, item);
                            if self.emit(i + 1, copy)? == Flow::Done {
                                return Ok(Flow::Done);
                            }
                        }
                        Ok(Flow::More)
                    }
                    Some(Value::Array(_)) => {
                        if keep_empty {
                            remove_path(&mut doc, path);
                            return self.emit(i + 1, doc);
                        }
                        Ok(Flow::More)
                    }
                    None | Some(Value::Null) if !keep_empty => Ok(Flow::More),
                    _ => self.emit(i + 1, doc),
                }
            }
            Stage::Sort(_) => {
                let bytes = size_of_doc(&doc);
                self.hold(i, bytes)?;
                if let State::Buffer(b) = &mut self.states[i] {
                    b.push(doc);
                }
                Ok(Flow::More)
            }
            Stage::Count(_) | Stage::Group { .. } | Stage::SortByCount(_) => {
                self.take_in(i, &doc)?;
                Ok(Flow::More)
            }
        }
    }

    /// Whether `stage` only reads the documents passed in, keeping none of them (and never
    /// ends the input): [`Run::take_in`] takes them.
    fn only_reads(stage: Option<&Stage>) -> bool {
        matches!(
            stage,
            Some(Stage::Count(_) | Stage::Group { .. } | Stage::SortByCount(_))
        )
    }

    /// Passes `doc` into stage `i`, one that [`Run::only_reads`].
    fn take_in(&mut self, i: usize, doc: &Document) -> Result<(), QueryError> {
        let stages = self.stages;
        match &stages[i] {
            Stage::Count(_) => {
                if let State::Count(n) = &mut self.states[i] {
                    *n += 1;
                }
            }
            Stage::Group { id, accs } => {
                let key = id.eval_ref(doc).map_err(|e| self.err(i, e))?;
                self.group(i, key, accs.iter().map(|(_, a)| a), doc)?;
            }
            Stage::SortByCount(e) => {
                let key = e.eval_ref(doc).map_err(|e| self.err(i, e))?;
                self.group(i, key, [&Acc::Count].into_iter(), doc)?;
            }
            _ => {}
        }
        Ok(())
    }

    /// Adds `doc` to the group of `key` (missing: null) at stage `i`; the key is copied only
    /// when it starts a group.
    fn group<'a>(
        &mut self,
        i: usize,
        key: Option<Cow<'_, Value>>,
        accs: impl ExactSizeIterator<Item = &'a Acc> + Clone,
        doc: &Document,
    ) -> Result<(), QueryError> {
        let key = key.unwrap_or(Cow::Owned(Value::Null));
        self.canon.clear();
        write_key(&key, &mut self.canon);
        let canon = self.canon.as_str();
        let room = self.limits.max_bytes.saturating_sub(self.held);
        let State::Groups(g) = &mut self.states[i] else {
            return Ok(());
        };
        let per = accs.len();
        let (slot, new_bytes) = match g.index.find(canon) {
            (_, Some(slot)) => (slot, 0),
            (hash, None) => {
                let heap = heap_of(&key) + accs.clone().map(AccState::heap_of_new).sum::<usize>();
                let Some(grown) = g.room_for(canon.len(), heap, per, room) else {
                    return Err(self.err(i, over_bound(self.limits)));
                };
                g.keys.push(key.into_owned());
                g.accs.extend(accs.clone().map(AccState::new));
                (g.index.insert(hash, canon), grown)
            }
        };
        let mut grown = new_bytes;
        for (state, acc) in g.accs[slot * per..(slot + 1) * per].iter_mut().zip(accs) {
            grown += state
                .add(acc, doc)
                .map_err(|e| QueryError::at(&format!("[{i}]"), e))?;
        }
        self.hold(i, grown)
    }

    /// How many documents out of stage `i` can matter: the count of a `$limit` right after.
    fn kept_after(&self, i: usize) -> Option<usize> {
        match self.stages.get(i + 1) {
            Some(Stage::Limit(n)) => Some(usize::try_from(*n).unwrap_or(usize::MAX)),
            _ => None,
        }
    }

    /// The input has ended at stage `i`: what it holds goes on, then the next stage ends.
    fn finish(&mut self, i: usize) -> Result<(), QueryError> {
        if i == self.stages.len() {
            return Ok(());
        }
        let state = std::mem::replace(&mut self.states[i], State::None);
        let stages = self.stages;
        let mut held: Vec<Document> = match (&stages[i], state) {
            (Stage::Sort(keys), State::Buffer(mut docs)) => {
                sort_docs(&mut docs, keys, self.kept_after(i));
                docs
            }
            (Stage::Count(name), State::Count(n)) if n > 0 => {
                let mut d = Map::new();
                d.insert(name.clone(), Value::from(n));
                vec![d]
            }
            (Stage::Group { accs, .. }, State::Groups(g)) => {
                // A document a group, made as the next stage takes it: all of them at once
                // would hold as much again as the groups, uncounted.
                let Groups {
                    keys, accs: states, ..
                } = g;
                let mut states = states.into_iter();
                for key in keys {
                    let mut d = Map::new();
                    d.insert("_id".into(), key);
                    for ((name, _), s) in accs.iter().zip(states.by_ref()) {
                        d.insert(name.clone(), s.finish());
                    }
                    if self.emit(i + 1, d)? == Flow::Done {
                        break;
                    }
                }
                return self.finish(i + 1);
            }
            (Stage::SortByCount(_), State::Groups(g)) => by_count(g, self.kept_after(i)),
            _ => Vec::new(),
        };
        for doc in held.drain(..) {
            if self.emit(i + 1, doc)? == Flow::Done {
                break;
            }
        }
        self.finish(i + 1)
    }
}

/// A `$sortByCount`'s documents: by count, most first; ties by `_id`, so that answers
/// repeat. In [`sort_docs`]'s order, but with a document made only for each group kept (the
/// top ten of a long tail of hashtags, not all of them), unless a key is an array (which
/// sorts by one of its elements: left to [`sort_docs`]).
fn by_count(g: Groups, keep: Option<usize>) -> Vec<Document> {
    let counts: Vec<Value> = g.accs.into_iter().map(AccState::finish).collect();
    let doc = |key: Value, count: Value| {
        let mut d = Map::new();
        d.insert("_id".into(), key);
        d.insert("count".into(), count);
        d
    };
    if g.keys.iter().any(Value::is_array) {
        let mut docs: Vec<Document> = g
            .keys
            .into_iter()
            .zip(counts)
            .map(|(k, c)| doc(k, c))
            .collect();
        sort_docs(
            &mut docs,
            &[(vec!["count".into()], false), (vec!["_id".into()], true)],
            keep,
        );
        return docs;
    }
    let keys = g.keys;
    let order = |a: &usize, b: &usize| {
        compare(&counts[*b], &counts[*a])
            .then_with(|| compare(&keys[*a], &keys[*b]))
            .then(a.cmp(b))
    };
    let mut kept: Vec<usize> = (0..keys.len()).collect();
    if let Some(n) = keep
        && n < kept.len()
    {
        if n == 0 {
            return Vec::new();
        }
        kept.select_nth_unstable_by(n - 1, order);
        kept.truncate(n);
    }
    kept.sort_unstable_by(order);
    let (mut keys, mut counts) = (keys, counts);
    kept.into_iter()
        .map(|g| doc(std::mem::take(&mut keys[g]), std::mem::take(&mut counts[g])))
        .collect()
}

/// Sorts by `keys`, each document's sort values taken once (not once per comparison: a
/// `$sortByCount` over a long tail sorts hundreds of thousands of groups). Stable, as
/// MongoDB's order of ties is not promised but repeating answers are.
///
/// With `keep`, only the first `keep` in that order are kept (a `$limit` right after): they
/// are selected in linear time and only they are sorted, as MongoDB's top-k sort does.
fn sort_docs(docs: &mut Vec<Document>, keys: &[(Vec<String>, bool)], keep: Option<usize>) {
    // Each with its place in the input: ties keep their order, so that an unstable
    // selection gives what a stable sort gives.
    let mut keyed: Vec<(Vec<Option<Value>>, usize, Document)> = std::mem::take(docs)
        .into_iter()
        .enumerate()
        .map(|(at, d)| {
            let values = keys
                .iter()
                .map(|(path, asc)| sort_value(&d, path, *asc))
                .collect();
            (values, at, d)
        })
        .collect();
    let order = |(a, i, _): &(Vec<Option<Value>>, usize, Document),
                 (b, j, _): &(Vec<Option<Value>>, usize, Document)| {
        for ((x, y), (_, asc)) in a.iter().zip(b).zip(keys) {
            let ord = compare_opt(x.as_ref(), y.as_ref());
            let ord = if *asc { ord } else { ord.reverse() };
            if ord != Ordering::Equal {
                return ord;
            }
        }
        i.cmp(j)
    };
    if let Some(n) = keep.filter(|n| *n < keyed.len()) {
        if n == 0 {
            return;
        }
        keyed.select_nth_unstable_by(n - 1, order);
        keyed.truncate(n);
    }
    keyed.sort_unstable_by(order);
    docs.extend(keyed.into_iter().map(|(_, _, d)| d));
}

/// The value a `$sort` key orders a document by: an array sorts by its smallest element
/// ascending and its largest descending, as in MongoDB; an empty array before null.
fn sort_value(doc: &Document, path: &[String], asc: bool) -> Option<Value> {
    match lookup(doc, path) {
        Some(Value::Array(items)) => {
            let pick = if asc {
                Ordering::Less
            } else {
                Ordering::Greater
            };
            let best = items
                .into_iter()
                .reduce(|best, v| if compare(&v, &best) == pick { v } else { best });
            Some(best.unwrap_or(Value::Array(Vec::new())))
        }
        other => other,
    }
}

/// MongoDB's order of values of any type (missing as null).
fn compare_opt(a: Option<&Value>, b: Option<&Value>) -> Ordering {
    compare(a.unwrap_or(&Value::Null), b.unwrap_or(&Value::Null))
}

fn rank(v: &Value) -> u8 {
    match v {
        Value::Array(a) if a.is_empty() => 0,
        Value::Null => 1,
        Value::Number(_) => 2,
        Value::String(_) => 3,
        Value::Object(_) if date_millis(v).is_some() => 8,
        Value::Object(_) => 4,
        Value::Array(_) => 5,
        Value::Bool(_) => 7,
    }
}

/// MongoDB's comparison order across types: null, numbers, strings, objects, arrays,
/// booleans, dates.
pub(super) fn compare(a: &Value, b: &Value) -> Ordering {
    let (ra, rb) = (rank(a), rank(b));
    if ra != rb {
        return ra.cmp(&rb);
    }
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => number_cmp(x, y),
        (Value::String(x), Value::String(y)) => x.as_bytes().cmp(y.as_bytes()),
        (Value::Bool(x), Value::Bool(y)) => x.cmp(y),
        (Value::Object(_), Value::Object(_)) if ra == 8 => date_millis(a).cmp(&date_millis(b)),
        (Value::Object(x), Value::Object(y)) => {
            for ((kx, vx), (ky, vy)) in x.iter().zip(y) {
                let ord = compare(vx, vy).then_with(|| kx.cmp(ky));
                if ord != Ordering::Equal {
                    return ord;
                }
            }
            x.len().cmp(&y.len())
        }
        (Value::Array(x), Value::Array(y)) => {
            for (p, q) in x.iter().zip(y) {
                let ord = compare(p, q);
                if ord != Ordering::Equal {
                    return ord;
                }
            }
            x.len().cmp(&y.len())
        }
        _ => Ordering::Equal,
    }
}

/// What a value holds beyond its own slot: a string's text, an array's or an object's
/// contents.
pub(super) fn heap_of(v: &Value) -> usize {
    match v {
        Value::String(s) => s.capacity(),
        Value::Array(_) | Value::Object(_) => size_of(v),
        _ => 0,
    }
}

/// Why a stage holding more than `limits` allow is refused.
pub(super) fn over_bound(limits: Limits) -> String {
    format!(
        "holds more than the query bound of {} bytes (groups, sort buffer, sets); narrow it with $match or a time range first",
        limits.max_bytes
    )
}

/// A group key as text: equal keys (1 and 1.0 alike, as MongoDB groups them) give equal text.
pub(super) fn canonical(v: &Value) -> String {
    let mut out = String::new();
    write_canonical(v, &mut out);
    out
}

/// A group key's text, as [`canonical`]'s but for a string at the top, which is written as
/// it is after a quote: nothing follows it to be told apart from (no other value's text
/// starts with a quote), so it needs none of the escaping that costs most in a string's
/// JSON text, and most group keys are strings.
pub(super) fn write_key(v: &Value, out: &mut String) {
    match v {
        Value::String(s) => {
            out.push('"');
            out.push_str(s);
        }
        other => write_canonical(other, out),
    }
}

fn write_canonical(v: &Value, out: &mut String) {
    use std::fmt::Write;
    // Written in place (`write!` to a String cannot fail): a group key costs no allocation
    // of its own unless its group is new.
    match v {
        Value::Number(n) => match n.as_f64() {
            Some(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => {
                let _ = write!(out, "n{}", f as i64);
            }
            _ => {
                let _ = write!(out, "n{n}");
            }
        },
        Value::Array(items) => {
            out.push('[');
            for i in items {
                write_canonical(i, out);
                out.push(',');
            }
            out.push(']');
        }
        Value::Object(o) => {
            out.push('{');
            for (k, v) in o {
                out.push_str(&serde_json::to_string(k).unwrap_or_default());
                out.push(':');
                write_canonical(v, out);
                out.push(',');
            }
            out.push('}');
        }
        other => {
            let _ = write!(out, "{other}");
        }
    }
}

/// Approximate bytes a value holds in memory.
fn size_of(v: &Value) -> usize {
    match v {
        Value::String(s) => 32 + s.len(),
        Value::Array(a) => 32 + a.iter().map(size_of).sum::<usize>(),
        Value::Object(o) => size_of_doc(o),
        _ => 16,
    }
}

pub(super) fn size_of_doc(o: &Document) -> usize {
    48 + o
        .iter()
        .map(|(k, v)| 32 + k.len() + size_of(v))
        .sum::<usize>()
}

enum AccState {
    Sum(Sum),
    Avg(f64, u64),
    Pick(Option<Value>),
    First(Option<Value>),
    Last(Value),
    /// Boxed: the largest state by far, it would make every group's accumulators as large.
    Set(Box<(HashSet<String>, Vec<Value>)>),
    Push(Vec<Value>),
    Count(u64),
}

#[derive(Clone, Copy)]
enum Sum {
    Int(i64),
    Float(f64),
}

impl AccState {
    fn new(acc: &Acc) -> AccState {
        match acc {
            Acc::Sum(_) => AccState::Sum(Sum::Int(0)),
            Acc::Avg(_) => AccState::Avg(0.0, 0),
            Acc::Min(_) | Acc::Max(_) => AccState::Pick(None),
            Acc::First(_) => AccState::First(None),
            Acc::Last(_) => AccState::Last(Value::Null),
            Acc::AddToSet(_) => AccState::Set(Box::default()),
            Acc::Push(_) => AccState::Push(Vec::new()),
            Acc::Count => AccState::Count(0),
        }
    }

    /// What a new state of `acc` allocates beyond its slot.
    fn heap_of_new(acc: &Acc) -> usize {
        match acc {
            Acc::AddToSet(_) => std::mem::size_of::<(HashSet<String>, Vec<Value>)>(),
            _ => 0,
        }
    }

    /// Adds one document; the bytes it grew by.
    fn add(&mut self, acc: &Acc, doc: &Document) -> Result<usize, String> {
        match (self, acc) {
            (AccState::Sum(s), Acc::Sum(e)) => {
                if let Some(Value::Number(n)) = e.eval_ref(doc)?.as_deref() {
                    *s = add(*s, n);
                }
            }
            (AccState::Avg(sum, n), Acc::Avg(e)) => {
                if let Some(Value::Number(x)) = e.eval_ref(doc)?.as_deref() {
                    *sum += x.as_f64().unwrap_or(0.0);
                    *n += 1;
                }
            }
            (AccState::Pick(best), Acc::Min(e) | Acc::Max(e)) => {
                let want = if matches!(acc, Acc::Min(_)) {
                    Ordering::Less
                } else {
                    Ordering::Greater
                };
                match e.eval_ref(doc)?.as_deref() {
                    None | Some(Value::Null) => {}
                    Some(v) => {
                        if best.as_ref().is_none_or(|b| compare(v, b) == want) {
                            *best = Some(v.clone());
                            return Ok(size_of(v));
                        }
                    }
                }
            }
            (AccState::First(first @ None), Acc::First(e)) => {
                let v = e.eval(doc)?.unwrap_or(Value::Null);
                let grow = size_of(&v);
                *first = Some(v);
                return Ok(grow);
            }
            (AccState::Last(last), Acc::Last(e)) => {
                *last = e.eval(doc)?.unwrap_or(Value::Null);
                return Ok(size_of(last));
            }
            (AccState::Set(set), Acc::AddToSet(e)) => {
                let (seen, values) = &mut **set;
                if let Some(v) = e.eval_ref(doc)? {
                    let key = canonical(&v);
                    let grow = key.len() + size_of(&v) + 32;
                    if seen.insert(key) {
                        values.push(v.into_owned());
                        return Ok(grow);
                    }
                }
            }
            (AccState::Push(values), Acc::Push(e)) => {
                if let Some(v) = e.eval(doc)? {
                    let grow = size_of(&v);
                    values.push(v);
                    return Ok(grow);
                }
            }
            (AccState::Count(n), Acc::Count) => *n += 1,
            _ => {}
        }
        Ok(0)
    }

    fn finish(self) -> Value {
        match self {
            AccState::Sum(Sum::Int(i)) => Value::from(i),
            AccState::Sum(Sum::Float(f)) => Number::from_f64(f).map_or(Value::Null, Value::Number),
            AccState::Avg(_, 0) => Value::Null,
            AccState::Avg(sum, n) => {
                Number::from_f64(sum / n as f64).map_or(Value::Null, Value::Number)
            }
            AccState::Pick(v) => v.unwrap_or(Value::Null),
            AccState::First(v) => v.unwrap_or(Value::Null),
            AccState::Last(v) => v,
            AccState::Set(set) => Value::Array(set.1),
            AccState::Push(values) => Value::Array(values),
            AccState::Count(n) => Value::from(n),
        }
    }
}

/// `$sum`'s addition: integers stay integers until one overflows or a float comes.
fn add(s: Sum, n: &Number) -> Sum {
    match (s, n.as_i64()) {
        (Sum::Int(a), Some(b)) => a
            .checked_add(b)
            .map_or(Sum::Float(a as f64 + b as f64), Sum::Int),
        (Sum::Int(a), None) => Sum::Float(a as f64 + n.as_f64().unwrap_or(0.0)),
        (Sum::Float(a), _) => Sum::Float(a + n.as_f64().unwrap_or(0.0)),
    }
}

/// A value by a path through objects only (what `$unwind` replaces).
fn get_path<'a>(doc: &'a Document, path: &[String]) -> Option<&'a Value> {
    let (first, rest) = path.split_first()?;
    let mut v = doc.get(first)?;
    for p in rest {
        v = v.as_object()?.get(p)?;
    }
    Some(v)
}

/// The object holding the last part of `path` (through objects only), and that part.
fn parent_mut<'a>(
    doc: &'a mut Document,
    path: &'a [String],
) -> Option<(&'a mut Document, &'a String)> {
    let (last, parents) = path.split_last()?;
    let mut o = doc;
    for p in parents {
        let Some(Value::Object(next)) = o.get_mut(p) else {
            return None;
        };
        o = next;
    }
    Some((o, last))
}

fn set_path(doc: &mut Document, path: &[String], value: Value) {
    if let Some((o, last)) = parent_mut(doc, path) {
        match o.get_mut(last) {
            Some(slot) => *slot = value,
            None => {
                o.insert(last.clone(), value);
            }
        }
    }
}

/// Takes the value at `path` out of `doc`, leaving its parent in place.
fn take_path(doc: &mut Document, path: &[String]) -> Option<Value> {
    let (o, last) = parent_mut(doc, path)?;
    o.remove(last)
}

fn remove_path(doc: &mut Document, path: &[String]) {
    if let Some((o, last)) = parent_mut(doc, path) {
        o.remove(last);
    }
}

fn project(p: &Projection, doc: &Document) -> Result<Document, String> {
    Ok(match p {
        Projection::Exclude(paths) => {
            let mut out = doc.clone();
            for path in paths {
                exclude(&mut out, path);
            }
            out
        }
        Projection::Include {
            paths,
            computed,
            id,
        } => {
            let mut out = Map::new();
            if *id && let Some(v) = doc.get("_id") {
                out.insert("_id".into(), v.clone());
            }
            for path in paths {
                include(doc, path, &mut out);
            }
            for (name, e) in computed {
                if let Some(v) = e.eval(doc)? {
                    out.insert(name.clone(), v);
                }
            }
            out
        }
    })
}

/// Copies what `path` reaches in `from` into `to`, keeping the shape (through arrays of
/// objects too, element by element).
fn include(from: &Document, path: &[String], to: &mut Document) {
    let Some((first, rest)) = path.split_first() else {
        return;
    };
    let Some(v) = from.get(first) else {
        return;
    };
    if rest.is_empty() {
        to.insert(first.clone(), v.clone());
        return;
    }
    match v {
        Value::Object(inner) => {
            let slot = to
                .entry(first.clone())
                .or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(target) = slot {
                include(inner, rest, target);
            }
        }
        Value::Array(items) => {
            let projected: Vec<Value> = items
                .iter()
                .filter_map(|i| i.as_object())
                .map(|o| {
                    let mut t = Map::new();
                    include(o, rest, &mut t);
                    Value::Object(t)
                })
                .collect();
            to.insert(first.clone(), Value::Array(projected));
        }
        _ => {}
    }
}

fn exclude(doc: &mut Document, path: &[String]) {
    let Some((first, rest)) = path.split_first() else {
        return;
    };
    if rest.is_empty() {
        doc.remove(first);
        return;
    }
    match doc.get_mut(first) {
        Some(Value::Object(inner)) => exclude(inner, rest),
        Some(Value::Array(items)) => {
            for i in items.iter_mut() {
                if let Value::Object(o) = i {
                    exclude(o, rest);
                }
            }
        }
        _ => {}
    }
}
