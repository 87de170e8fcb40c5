//! Document filters in MongoDB query syntax: parsed and validated once, then evaluated
//! in-process or handed to MongoDB.
//!
//! A client following a collection sends a predicate such as
//! `{"lang": "ja", "retweet_count": {"$gte": 10}}`. [`Filter::parse`] checks it and reports
//! the first problem as a [`FilterError`] that names *where* it is (a path into the filter,
//! `$and[1].retweet_count.$gt`) and *what* is allowed there. A parsed filter is then either
//! evaluated on each document ([`Filter::matches`], the embedded engine) or translated into a
//! MongoDB query document ([`Filter::to_mongo`], for a `find` filter or a change stream's
//! `$match`). Both paths start from the same parsed value, so a filter the embedded engine
//! accepts is one MongoDB accepts with the same meaning.
//!
//! # What is supported
//!
//! | form | meaning |
//! |---|---|
//! | `{}` | every document |
//! | `{"user.screen_name": "a"}` | implicit equality on a dotted field path |
//! | `$eq $ne $gt $gte $lt $lte` | comparisons: `{"n": {"$gt": 1, "$lt": 5}}` (all must hold) |
//! | `$in $nin` | membership in a list of values |
//! | `$exists` | `true` or `false` |
//! | `$not` | negates an operator expression: `{"n": {"$not": {"$gt": 5}}}` |
//! | `$and $or` | at the top level (or inside each other): non-empty arrays of filters |
//!
//! # Semantics (MongoDB's)
//!
//! - **Paths** are split on dots. They descend through objects and through arrays of
//!   objects: `entities.hashtags.text` reaches every `text` in
//!   `{"entities": {"hashtags": [{"text": "go"}, {"text": "rust"}]}}`. A numeric part also
//!   indexes an array (`tags.0`). Arrays of arrays are not flattened on the way.
//! - **Arrays at the end of a path**: a condition holds if it holds for the array itself or
//!   for any of its elements (one level), so `{"tags": "rust"}` matches
//!   `{"tags": ["db", "rust"]}` and `{"tags": ["db", "rust"]}` matches that array exactly.
//! - **Several operators on one field** are separate conditions that must all hold, each
//!   possibly by a different array element: `{"n": {"$gt": 1, "$lt": 5}}` matches
//!   `{"n": [0, 10]}` (10 > 1 and 0 < 5), as in MongoDB.
//! - **Comparisons** only hold between values of one type bracket: numbers with numbers
//!   (integers and floats compared exactly by value), strings with strings (UTF-8 byte
//!   order, MongoDB's default binary collation: no case folding, no Unicode normalisation),
//!   booleans with booleans, dates with dates (by instant: `{"$date": "<RFC 3339>"}`, see
//!   [`crate::date`]), null with null. `{"n": {"$gt": "5"}}` does not match `{"n": 7}`, and
//!   a date does not match a string that spells it. Equality also compares arrays (element by element) and objects (key by key,
//!   in the document's key order).
//! - **Missing fields**: `{"f": null}` matches a missing field and an explicit null;
//!   `$ne`, `$nin` and `$not` hold when the field is missing; `{"$exists": false}` holds only
//!   when the path reaches nothing. A path through a scalar (`a.b` on `{"a": 4}`) reaches a
//!   missing value; a path into an array of scalars (`a.b` on `{"a": [1, 2]}`) reaches
//!   nothing at all, so `{"a.b": null}` does not match it.
//!
//! # What it is not, and where it is stricter than MongoDB
//!
//! - No `$regex`, `$where`, `$expr`, `$elemMatch`, `$size`, `$type`, `$nor`, text or geo
//!   operators: they are rejected with the list of what is allowed.
//! - `$gt`/`$gte`/`$lt`/`$lte` take a number, string, boolean, date or null (MongoDB also orders
//!   whole arrays and objects; that order is rarely what a client means).
//! - `$exists` takes only `true` or `false` (MongoDB also accepts numbers).
//! - A value inside a filter cannot be an object with a key starting with `$`: MongoDB would
//!   read it as an operator (`cannot nest $ under $in`) or a BSON type, not as data. The one
//!   such object taken is a date, `{"$date": "2026-12-06T14:00:00Z"}`.
//! - **Keys that begin with `$` or contain a dot cannot be addressed.** Real documents have
//!   them (`{"$schema": ...}`, `{"meta.dt": ...}` from Wikimedia's streams), but a filter path
//!   splits on dots and a leading `$` names an operator; MongoDB itself needs `$getField` for
//!   such keys. They are simply never reached: `{"meta.dt": "x"}` looks at `meta` → `dt`,
//!   never at a key spelled `meta.dt`, and such documents never make matching fail.
//! - Integers beyond the `i64` range compare as floats, which is how the MongoDB engine
//!   stores them (BSON has no unsigned 64-bit integer).
//!
//! # Bounds
//!
//! A filter comes from an HTTP client, so its shape is bounded before anything recurses into
//! it: at most [`MAX_DEPTH`] levels of JSON nesting (and path parts), [`MAX_VALUES`] JSON
//! values, and [`MAX_BYTES`] bytes of keys and strings. Matching recurses only as deep as the
//! filter's own paths and values, whatever the document's depth.
//!
//! ```
//! use serde_json::json;
//! use store::Filter;
//!
//! let filter = Filter::parse(&json!({"lang": "ja", "retweet_count": {"$gte": 10}}))?;
//! let doc = json!({"lang": "ja", "retweet_count": 12}).as_object().cloned().unwrap_or_default();
//! assert!(filter.matches(&doc));
//! assert_eq!(
//!     filter.to_mongo("fullDocument."),
//!     json!({"fullDocument.lang": {"$eq": "ja"}, "fullDocument.retweet_count": {"$gte": 10}})
//! );
//!
//! let err = Filter::parse(&json!({"$and": [{}, {"n": {"$gt": [1]}}]})).unwrap_err();
//! assert_eq!(err.path, "$and[1].n.$gt");
//! # Ok::<(), store::filter::FilterError>(())
//! ```

// The table of cases lives in the test tree (`store/tests/contract/`), where the contract suite
// runs it against every engine; the unit tests below read the same file.
#[cfg(test)]
#[path = "../tests/contract/filter_cases.rs"]
mod cases;
pub(crate) mod matching;
pub(crate) mod parse;

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

use crate::Document;
use matching::{all_trivial, clauses_match};
use parse::Parser;

/// The deepest JSON nesting a filter may have (the filter object itself is level 1), and the
/// most parts a field path may have. Deep enough for any real query; shallow enough that
/// parsing and matching cannot exhaust the stack.
pub const MAX_DEPTH: usize = 32;

/// The most JSON values (objects, arrays, scalars, counted recursively) a filter may hold:
/// room for an `$in` list of several hundred names, not for a denial of service.
pub const MAX_VALUES: usize = 2_000;

/// The most bytes of object keys and strings a filter may hold.
pub const MAX_BYTES: usize = 64 * 1024;

/// The operators accepted on a field, for error messages.
const FIELD_OPERATORS: &str = "$eq, $ne, $gt, $gte, $lt, $lte, $in, $nin, $exists, $not";

/// Why a filter was rejected: where, and what is allowed there.
///
/// `path` points into the filter: object keys joined by dots, array indexes in brackets
/// (`$and[1].retweet_count.$gt`); it is empty for the filter as a whole. The HTTP layer turns
/// this into a 400 response.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("filter at {}: {message}", display_path(path))]
pub struct FilterError {
    /// Where in the filter the problem is; empty for the top level.
    pub path: String,
    /// What is wrong and what is allowed instead.
    pub message: String,
}

fn display_path(path: &str) -> &str {
    if path.is_empty() { "top level" } else { path }
}

fn error(path: &str, message: impl Into<String>) -> FilterError {
    FilterError {
        path: path.to_owned(),
        message: message.into(),
    }
}

/// A validated filter: the client's JSON plus its parsed form.
///
/// Two filters are equal when they were parsed from equal JSON.
#[derive(Clone, PartialEq)]
pub struct Filter {
    /// The JSON exactly as given, so the API can echo what it is filtering on.
    json: Value,
    /// The top-level conditions; all must hold. Empty for `{}`.
    root: Vec<Clause>,
}

/// One condition of a filter object.
#[derive(Clone, Debug, PartialEq)]
enum Clause {
    /// `$and`: every sub-filter holds (each sub-filter is itself a list of clauses).
    And(Vec<Vec<Clause>>),
    /// `$or`: at least one sub-filter holds.
    Or(Vec<Vec<Clause>>),
    /// Conditions on one field path; all must hold.
    Field { path: FieldPath, ops: Vec<Op> },
}

/// A dotted field path, as written and split.
#[derive(Clone, Debug, PartialEq)]
struct FieldPath {
    /// As the client wrote it: `to_mongo` keeps the user's spelling.
    raw: String,
    /// The parts between the dots; never empty, none empty.
    parts: Vec<String>,
}

/// An operator applied to the values a field path reaches.
#[derive(Clone, Debug, PartialEq)]
enum Op {
    /// `$eq` (or implicit equality).
    Eq(Value),
    /// `$ne`: no reached value equals it (so a missing field matches, unless it is null).
    Ne(Value),
    /// `$gt`, `$gte`, `$lt`, `$lte` with a scalar operand.
    Cmp(CmpOp, Value),
    /// `$in`: some reached value equals one of the list.
    In(Vec<Value>),
    /// `$nin`: no reached value equals any of the list.
    Nin(Vec<Value>),
    /// `$exists`: whether the path reaches any value.
    Exists(bool),
    /// `$not`: the operators (all together) do not hold.
    Not(Vec<Op>),
}

/// The four ordering operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CmpOp {
    Gt,
    Gte,
    Lt,
    Lte,
}

impl CmpOp {
    fn name(self) -> &'static str {
        match self {
            CmpOp::Gt => "$gt",
            CmpOp::Gte => "$gte",
            CmpOp::Lt => "$lt",
            CmpOp::Lte => "$lte",
        }
    }

    fn accepts(self, ord: Ordering) -> bool {
        match self {
            CmpOp::Gt => ord == Ordering::Greater,
            CmpOp::Gte => ord != Ordering::Less,
            CmpOp::Lt => ord == Ordering::Less,
            CmpOp::Lte => ord != Ordering::Greater,
        }
    }
}

impl Filter {
    /// Parses and validates a filter; the error names the first problem and where it is.
    pub fn parse(json: &Value) -> Result<Filter, FilterError> {
        let mut parser = Parser::default();
        let root = parser.filter(json, "", 1)?;
        Ok(Filter {
            json: json.clone(),
            root,
        })
    }

    /// The filter that matches every document (`{}`).
    pub fn match_all() -> Filter {
        Filter {
            json: Value::Object(Map::new()),
            root: Vec::new(),
        }
    }

    /// The JSON the filter was parsed from, unchanged.
    pub fn as_json(&self) -> &Value {
        &self.json
    }

    /// The range of instants (milliseconds since the epoch, inclusive) that a date at `path`
    /// must lie in for a document to match, from the comparisons with dates that every match
    /// needs (top-level and `$and` conditions on `path`); `None` when there are none. A
    /// document that matches holds a date at `path` inside the range, or reaches dates through
    /// an array there; what the filter leaves open (`$or`) does not widen it.
    pub fn date_range(&self, path: &str) -> Option<(i64, i64)> {
        let mut range: Option<(i64, i64)> = None;
        date_range_of(&self.root, path, &mut range);
        range
    }

    /// The range of dates (ms, inclusive) the filter keeps at `path` when that is all it asks:
    /// `$gt`, `$gte`, `$lt` and `$lte` with dates, on that path alone. A document whose path
    /// reaches one value (no array on the way) then passes exactly when the value is a date
    /// ([`crate::date::millis`]) within the range.
    pub fn only_date_range(&self, path: &str) -> Option<(i64, i64)> {
        match self.root.as_slice() {
            [Clause::Field { path: p, ops }]
                if p.raw == path
                    && !ops.is_empty()
                    && ops
                        .iter()
                        .all(|op| matches!(op, Op::Cmp(_, v) if crate::date::is_date(v))) =>
            {
                self.date_range(path)
            }
            _ => None,
        }
    }

    /// Whether the filter accepts every document by its structure alone: `{}`,
    /// `{"$and": [{}]}`, `{"$or": [{}, ...]}`. An engine can then skip evaluating it. A field
    /// condition that happens to hold everywhere is not detected.
    pub fn is_match_all(&self) -> bool {
        all_trivial(&self.root)
    }

    /// Whether `doc` satisfies the filter, with MongoDB's semantics (see the module doc).
    pub fn matches(&self, doc: &Document) -> bool {
        clauses_match(&self.root, doc)
    }

    /// The filter as a MongoDB query document, every field path prefixed with `prefix`
    /// (`"fullDocument."` for a change stream's `$match`, `""` for a `find`).
    ///
    /// The form is canonical: every equality is an explicit `$eq` (so an object value can
    /// never be read as operators), `$and`/`$or`/`$not` keep their structure, keys keep the
    /// client's paths and values keep their JSON types. Parsing the result with `prefix = ""`
    /// gives a filter that matches exactly the same documents.
    pub fn to_mongo(&self, prefix: &str) -> Value {
        Value::Object(clauses_to_mongo(&self.root, prefix))
    }
}

impl fmt::Debug for Filter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The JSON says everything the parsed form does, in the client's words.
        write!(f, "Filter({})", self.json)
    }
}

impl Default for Filter {
    fn default() -> Self {
        Filter::match_all()
    }
}

impl FromStr for Filter {
    type Err = FilterError;

    /// Parses a filter from JSON text (a query parameter, a config value). serde_json refuses
    /// nesting beyond 128 levels while reading, before [`MAX_DEPTH`] is checked.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let json: Value = serde_json::from_str(s).map_err(|e| {
            error(
                "",
                format!(
                    "not valid JSON ({e}); a filter is a JSON object such as {{\"lang\": \"ja\"}}"
                ),
            )
        })?;
        Filter::parse(&json)
    }
}

impl Serialize for Filter {
    /// Serializes as the client's JSON.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.json.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Filter {
    /// Deserializes from JSON and validates, so a bad filter in a config file fails to load.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let json = Value::deserialize(deserializer)?;
        Filter::parse(&json).map_err(serde::de::Error::custom)
    }
}

// ---------------------------------------------------------------------------------------------
// To MongoDB
// ---------------------------------------------------------------------------------------------

fn date_range_of(clauses: &[Clause], path: &str, range: &mut Option<(i64, i64)>) {
    fn narrow(range: &mut Option<(i64, i64)>, lo: i64, hi: i64) {
        let (a, b) = range.unwrap_or((i64::MIN, i64::MAX));
        *range = Some((a.max(lo), b.min(hi)));
    }
    for clause in clauses {
        match clause {
            Clause::And(subs) => subs.iter().for_each(|s| date_range_of(s, path, range)),
            Clause::Or(_) => {}
            Clause::Field { path: p, ops } if p.raw == path => {
                for op in ops {
                    match op {
                        Op::Eq(v) => {
                            if let Some(ms) = crate::date::millis(v) {
                                narrow(range, ms, ms);
                            }
                        }
                        Op::Cmp(cmp, v) => {
                            let Some(ms) = crate::date::millis(v) else {
                                continue;
                            };
                            match cmp {
                                CmpOp::Gt => narrow(range, ms.saturating_add(1), i64::MAX),
                                CmpOp::Gte => narrow(range, ms, i64::MAX),
                                CmpOp::Lt => narrow(range, i64::MIN, ms.saturating_sub(1)),
                                CmpOp::Lte => narrow(range, i64::MIN, ms),
                            }
                        }
                        _ => {}
                    }
                }
            }
            Clause::Field { .. } => {}
        }
    }
}

fn clauses_to_mongo(clauses: &[Clause], prefix: &str) -> Map<String, Value> {
    let mut out = Map::new();
    for clause in clauses {
        match clause {
            Clause::And(subs) => {
                out.insert("$and".into(), subs_to_mongo(subs, prefix));
            }
            Clause::Or(subs) => {
                out.insert("$or".into(), subs_to_mongo(subs, prefix));
            }
            Clause::Field { path, ops } => {
                // Keys of one JSON object are distinct, so prefixed paths are too.
                out.insert(
                    format!("{prefix}{}", path.raw),
                    Value::Object(ops_to_mongo(ops)),
                );
            }
        }
    }
    out
}

fn subs_to_mongo(subs: &[Vec<Clause>], prefix: &str) -> Value {
    Value::Array(
        subs.iter()
            .map(|s| Value::Object(clauses_to_mongo(s, prefix)))
            .collect(),
    )
}

fn ops_to_mongo(ops: &[Op]) -> Map<String, Value> {
    let mut out = Map::new();
    for op in ops {
        let (name, value) = match op {
            Op::Eq(v) => ("$eq", v.clone()),
            Op::Ne(v) => ("$ne", v.clone()),
            Op::Cmp(cmp, v) => (cmp.name(), v.clone()),
            Op::In(list) => ("$in", Value::Array(list.clone())),
            Op::Nin(list) => ("$nin", Value::Array(list.clone())),
            Op::Exists(b) => ("$exists", Value::Bool(*b)),
            Op::Not(inner) => ("$not", Value::Object(ops_to_mongo(inner))),
        };
        // An operator object's keys were distinct in the client's JSON; implicit equality is
        // the only operator of its field.
        out.insert(name.into(), value);
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
