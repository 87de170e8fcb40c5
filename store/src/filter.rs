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
//!   booleans with booleans, null with null. `{"n": {"$gt": "5"}}` does not match
//!   `{"n": 7}`. Equality also compares arrays (element by element) and objects (key by key,
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
//! - `$gt`/`$gte`/`$lt`/`$lte` take a number, string, boolean or null (MongoDB also orders
//!   whole arrays and objects; that order is rarely what a client means).
//! - `$exists` takes only `true` or `false` (MongoDB also accepts numbers).
//! - A value inside a filter cannot be an object with a key starting with `$`: MongoDB would
//!   read it as an operator (`cannot nest $ under $in`) or a BSON type, not as data.
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

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Number, Value};

use crate::Document;

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
// Parsing
// ---------------------------------------------------------------------------------------------

/// Counts what a filter holds while it is parsed, to enforce the bounds.
#[derive(Default)]
struct Parser {
    values: usize,
    bytes: usize,
}

/// `at` extended by an object key.
fn key_path(at: &str, key: &str) -> String {
    if at.is_empty() {
        key.to_owned()
    } else {
        format!("{at}.{key}")
    }
}

/// `at` extended by an array index.
fn index_path(at: &str, index: usize) -> String {
    format!("{at}[{index}]")
}

/// A short name for a JSON value's type, for error messages.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl Parser {
    /// Counts one value at `depth` and checks every bound before anything looks inside it.
    fn enter(&mut self, v: &Value, at: &str, depth: usize) -> Result<(), FilterError> {
        if depth > MAX_DEPTH {
            return Err(error(
                at,
                format!("nested deeper than {MAX_DEPTH} levels; a filter must be shallower"),
            ));
        }
        self.values += 1;
        if self.values > MAX_VALUES {
            return Err(error(
                at,
                format!(
                    "the filter holds more than {MAX_VALUES} values; split it or shorten its lists"
                ),
            ));
        }
        self.bytes += match v {
            Value::String(s) => s.len(),
            Value::Object(m) => m.keys().map(String::len).sum(),
            _ => 0,
        };
        if self.bytes > MAX_BYTES {
            return Err(error(
                at,
                format!("the filter's keys and strings exceed {MAX_BYTES} bytes"),
            ));
        }
        Ok(())
    }

    /// A filter object: field conditions and `$and`/`$or`.
    fn filter(&mut self, v: &Value, at: &str, depth: usize) -> Result<Vec<Clause>, FilterError> {
        self.enter(v, at, depth)?;
        let Value::Object(obj) = v else {
            return Err(error(
                at,
                format!(
                    "a filter must be a JSON object such as {{\"lang\": \"ja\"}}, not {}",
                    kind(v)
                ),
            ));
        };
        let mut clauses = Vec::with_capacity(obj.len());
        for (key, value) in obj {
            let here = key_path(at, key);
            if key.starts_with('$') {
                let subs = match key.as_str() {
                    "$and" | "$or" => self.filter_list(key, value, &here, depth + 1)?,
                    _ => {
                        return Err(error(
                            &here,
                            format!(
                                "unknown operator {key}; a filter object holds field paths, \
                                 $and and $or (fields whose names start with '$' cannot be matched)"
                            ),
                        ));
                    }
                };
                clauses.push(if key == "$and" {
                    Clause::And(subs)
                } else {
                    Clause::Or(subs)
                });
            } else {
                let path = field_path(key, &here)?;
                let ops = self.field_value(value, &here, depth + 1)?;
                clauses.push(Clause::Field { path, ops });
            }
        }
        Ok(clauses)
    }

    /// The operand of `$and`/`$or`: a non-empty array of filter objects.
    fn filter_list(
        &mut self,
        op: &str,
        v: &Value,
        at: &str,
        depth: usize,
    ) -> Result<Vec<Vec<Clause>>, FilterError> {
        self.enter(v, at, depth)?;
        let items = match v {
            Value::Array(items) if !items.is_empty() => items,
            Value::Array(_) => {
                return Err(error(
                    at,
                    format!("{op} needs a non-empty array of filters, got []"),
                ));
            }
            other => {
                return Err(error(
                    at,
                    format!(
                        "{op} needs a non-empty array of filters such as [{{\"a\": 1}}, {{\"b\": 2}}], not {}",
                        kind(other)
                    ),
                ));
            }
        };
        items
            .iter()
            .enumerate()
            .map(|(i, item)| self.filter(item, &index_path(at, i), depth + 1))
            .collect()
    }

    /// What a field path maps to: an operator object, or a value for implicit equality.
    fn field_value(&mut self, v: &Value, at: &str, depth: usize) -> Result<Vec<Op>, FilterError> {
        match v {
            Value::Object(m) if m.keys().any(|k| k.starts_with('$')) => {
                self.enter(v, at, depth)?;
                self.operators(m, at, depth)
            }
            _ => {
                self.literal(v, at, depth)?;
                Ok(vec![Op::Eq(v.clone())])
            }
        }
    }

    /// An operator object (`{"$gt": 1, "$lt": 5}`) that has already been counted.
    fn operators(
        &mut self,
        m: &Map<String, Value>,
        at: &str,
        depth: usize,
    ) -> Result<Vec<Op>, FilterError> {
        if let Some(plain) = m.keys().find(|k| !k.starts_with('$')) {
            return Err(error(
                &key_path(at, plain),
                format!(
                    "an object with operators cannot also hold the field {plain:?}; \
                     use only operators ({FIELD_OPERATORS}), or compare with a whole object \
                     through {{\"$eq\": {{...}}}}"
                ),
            ));
        }
        let mut ops = Vec::with_capacity(m.len());
        for (name, operand) in m {
            let here = key_path(at, name);
            let depth = depth + 1;
            let op = match name.as_str() {
                "$eq" => {
                    self.literal(operand, &here, depth)?;
                    Op::Eq(operand.clone())
                }
                "$ne" => {
                    self.literal(operand, &here, depth)?;
                    Op::Ne(operand.clone())
                }
                "$gt" | "$gte" | "$lt" | "$lte" => {
                    let cmp = match name.as_str() {
                        "$gt" => CmpOp::Gt,
                        "$gte" => CmpOp::Gte,
                        "$lt" => CmpOp::Lt,
                        _ => CmpOp::Lte,
                    };
                    self.enter(operand, &here, depth)?;
                    if matches!(operand, Value::Array(_) | Value::Object(_)) {
                        return Err(error(
                            &here,
                            format!(
                                "{name} compares with a number, string, boolean or null, not {}",
                                kind(operand)
                            ),
                        ));
                    }
                    Op::Cmp(cmp, operand.clone())
                }
                "$in" | "$nin" => {
                    let list = self.value_list(name, operand, &here, depth)?;
                    if name == "$in" {
                        Op::In(list)
                    } else {
                        Op::Nin(list)
                    }
                }
                "$exists" => {
                    self.enter(operand, &here, depth)?;
                    let Value::Bool(b) = operand else {
                        return Err(error(
                            &here,
                            format!("$exists takes true or false, not {}", kind(operand)),
                        ));
                    };
                    Op::Exists(*b)
                }
                "$not" => {
                    self.enter(operand, &here, depth)?;
                    match operand {
                        Value::Object(inner) if inner.is_empty() => {
                            return Err(error(
                                &here,
                                "$not needs at least one operator, as in {\"$not\": {\"$gt\": 5}}",
                            ));
                        }
                        // Mixed operators and field names are reported by `operators`.
                        Value::Object(inner) if inner.keys().any(|k| k.starts_with('$')) => {
                            Op::Not(self.operators(inner, &here, depth)?)
                        }
                        other => {
                            return Err(error(
                                &here,
                                format!(
                                    "$not takes an object of operators such as {{\"$gt\": 5}}, \
                                     not {}; to exclude a value use $ne or $nin",
                                    if other.is_object() {
                                        "a plain object"
                                    } else {
                                        kind(other)
                                    }
                                ),
                            ));
                        }
                    }
                }
                "$and" | "$or" => {
                    return Err(error(
                        &here,
                        format!(
                            "{name} combines whole filters: put it at the top level, as in \
                             {{\"{name}\": [{{\"a\": 1}}, {{\"b\": 2}}]}}; on a field use {FIELD_OPERATORS}"
                        ),
                    ));
                }
                _ => {
                    return Err(error(
                        &here,
                        format!("unknown operator {name}; allowed on a field: {FIELD_OPERATORS}"),
                    ));
                }
            };
            ops.push(op);
        }
        Ok(ops)
    }

    /// The operand of `$in`/`$nin`: an array of values (possibly empty, as in MongoDB).
    fn value_list(
        &mut self,
        op: &str,
        v: &Value,
        at: &str,
        depth: usize,
    ) -> Result<Vec<Value>, FilterError> {
        self.enter(v, at, depth)?;
        let Value::Array(items) = v else {
            return Err(error(
                at,
                format!(
                    "{op} needs an array of values such as [\"a\", \"b\"], not {}",
                    kind(v)
                ),
            ));
        };
        for (i, item) in items.iter().enumerate() {
            self.literal(item, &index_path(at, i), depth + 1)?;
        }
        Ok(items.clone())
    }

    /// A value compared as data: any JSON, except objects with keys MongoDB would not read as
    /// plain field names.
    fn literal(&mut self, v: &Value, at: &str, depth: usize) -> Result<(), FilterError> {
        self.enter(v, at, depth)?;
        match v {
            Value::Object(m) => {
                for (k, x) in m {
                    let here = key_path(at, k);
                    if k.starts_with('$') {
                        return Err(error(
                            &here,
                            "a value in a filter cannot hold a key starting with '$': MongoDB \
                             would read it as an operator or a BSON type, not as data",
                        ));
                    }
                    if k.contains('\0') {
                        return Err(error(&here, "a key cannot contain the NUL character"));
                    }
                    self.literal(x, &here, depth + 1)?;
                }
            }
            Value::Array(items) => {
                for (i, x) in items.iter().enumerate() {
                    self.literal(x, &index_path(at, i), depth + 1)?;
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// Splits and checks a field path.
fn field_path(raw: &str, at: &str) -> Result<FieldPath, FilterError> {
    if raw.is_empty() {
        return Err(error(at, "a field path cannot be empty"));
    }
    if raw.contains('\0') {
        return Err(error(at, "a field path cannot contain the NUL character"));
    }
    let parts: Vec<String> = raw.split('.').map(str::to_owned).collect();
    if parts.iter().any(String::is_empty) {
        return Err(error(
            at,
            format!(
                "field path {raw:?} has an empty part; write parts separated by single dots, \
                 as in \"user.screen_name\""
            ),
        ));
    }
    if let Some(part) = parts.iter().find(|p| p.starts_with('$')) {
        return Err(error(
            at,
            format!(
                "field path part {part:?} starts with '$'; fields whose names start with '$' \
                 cannot be matched by a filter"
            ),
        ));
    }
    if parts.len() > MAX_DEPTH {
        return Err(error(
            at,
            format!("field path has more than {MAX_DEPTH} parts"),
        ));
    }
    Ok(FieldPath {
        raw: raw.to_owned(),
        parts,
    })
}

// ---------------------------------------------------------------------------------------------
// Matching
// ---------------------------------------------------------------------------------------------

fn all_trivial(clauses: &[Clause]) -> bool {
    clauses.iter().all(|c| match c {
        Clause::And(subs) => subs.iter().all(|s| all_trivial(s)),
        Clause::Or(subs) => subs.iter().any(|s| all_trivial(s)),
        Clause::Field { .. } => false,
    })
}

fn clauses_match(clauses: &[Clause], doc: &Document) -> bool {
    clauses.iter().all(|c| match c {
        Clause::And(subs) => subs.iter().all(|s| clauses_match(s, doc)),
        Clause::Or(subs) => subs.iter().any(|s| clauses_match(s, doc)),
        Clause::Field { path, ops } => ops.iter().all(|op| op_matches(op, &path.parts, doc)),
    })
}

/// Whether one operator holds for the values `parts` reaches in `doc`.
fn op_matches(op: &Op, parts: &[String], doc: &Document) -> bool {
    match op {
        Op::Eq(v) => any_reached(doc, parts, &mut |e| equals(e, v)),
        Op::Ne(v) => !any_reached(doc, parts, &mut |e| equals(e, v)),
        Op::Cmp(cmp, v) => any_reached(doc, parts, &mut |e| compares(e, *cmp, v)),
        Op::In(list) => any_reached(doc, parts, &mut |e| list.iter().any(|v| equals(e, v))),
        Op::Nin(list) => !any_reached(doc, parts, &mut |e| list.iter().any(|v| equals(e, v))),
        Op::Exists(want) => any_reached(doc, parts, &mut |e| e.is_some()) == *want,
        Op::Not(ops) => !ops.iter().all(|op| op_matches(op, parts, doc)),
    }
}

/// A callback over the values a path reaches; `None` stands for "missing here".
type Visit<'v> = dyn FnMut(Option<&Value>) -> bool + 'v;

/// Calls `f` with every value `parts` reaches in `doc` (MongoDB's element iterator: through
/// objects, through arrays of objects, by array index, expanding a final array one level),
/// stopping as soon as `f` returns true. Recursion happens only at arrays and consumes at
/// least one path part each time, so it is bounded by the path's length.
fn any_reached(doc: &Document, parts: &[String], f: &mut Visit<'_>) -> bool {
    walk_object(doc, parts, f)
}

/// `parts` (non-empty) looked up from the object `obj`.
fn walk_object(obj: &Document, parts: &[String], f: &mut Visit<'_>) -> bool {
    let mut cur = obj;
    for (i, part) in parts.iter().enumerate() {
        let Some(v) = cur.get(part) else {
            return f(None);
        };
        if i + 1 == parts.len() {
            return visit_leaf(v, f);
        }
        match v {
            Value::Object(m) => cur = m,
            Value::Array(items) => return walk_array(items, &parts[i + 1..], f),
            // A scalar in the middle of the path: the field is missing below it.
            _ => return f(None),
        }
    }
    // `parts` is never empty (field paths are validated), but an empty path reaches nothing.
    false
}

/// The value at the end of a path: an array is tried element by element, then as a whole.
fn visit_leaf(v: &Value, f: &mut Visit<'_>) -> bool {
    match v {
        Value::Array(items) => items.iter().any(|e| f(Some(e))) || f(Some(v)),
        _ => f(Some(v)),
    }
}

/// An array reached before the end of the path; `rest` (non-empty) continues into it: into
/// every element that is an object, and, when the next part is an index, into that element.
/// Scalars in the array reach nothing, so they are not "missing" either.
fn walk_array(items: &[Value], rest: &[String], f: &mut Visit<'_>) -> bool {
    let index = array_index(&rest[0]);
    for (k, e) in items.iter().enumerate() {
        let positional = index == Some(k);
        match e {
            Value::Object(m) => {
                if walk_object(m, rest, f) {
                    return true;
                }
                if positional {
                    let found = if rest.len() == 1 {
                        f(Some(e))
                    } else {
                        walk_object(m, &rest[1..], f)
                    };
                    if found {
                        return true;
                    }
                }
            }
            _ if positional => {
                // An element picked by index is not expanded even if it is an array; a path
                // that continues into an array element continues into that array's elements.
                let found = if rest.len() == 1 {
                    f(Some(e))
                } else if let Value::Array(inner) = e {
                    walk_array(inner, &rest[1..], f)
                } else {
                    false
                };
                if found {
                    return true;
                }
            }
            _ => {}
        }
    }
    false
}

/// A path part that names an array position: all ASCII digits, in canonical form (MongoDB
/// compares the part with the element's field name "0", "1", ..., so "01" names nothing).
fn array_index(part: &str) -> Option<usize> {
    if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if part.len() > 1 && part.starts_with('0') {
        return None;
    }
    part.parse().ok()
}

/// MongoDB's equality of one reached value with a filter value: a missing value equals null.
fn equals(reached: Option<&Value>, want: &Value) -> bool {
    match reached {
        None => want.is_null(),
        Some(v) => values_equal(v, want),
    }
}

/// An ordering operator on one reached value. Missing counts as null, which `$gte`/`$lte`
/// null accept and `$gt`/`$lt` null do not.
fn compares(reached: Option<&Value>, op: CmpOp, want: &Value) -> bool {
    match reached {
        None => want.is_null() && matches!(op, CmpOp::Gte | CmpOp::Lte),
        Some(v) => scalar_cmp(v, want).is_some_and(|ord| op.accepts(ord)),
    }
}

/// The order of two scalars of the same type bracket; `None` across brackets (and for arrays
/// and objects, which the ordering operators do not compare).
fn scalar_cmp(a: &Value, b: &Value) -> Option<Ordering> {
    match (a, b) {
        (Value::Null, Value::Null) => Some(Ordering::Equal),
        (Value::Bool(x), Value::Bool(y)) => Some(x.cmp(y)),
        (Value::Number(x), Value::Number(y)) => Some(number_cmp(x, y)),
        // Byte order of UTF-8 is code point order: MongoDB's binary string comparison.
        (Value::String(x), Value::String(y)) => Some(x.as_bytes().cmp(y.as_bytes())),
        _ => None,
    }
}

/// Deep equality with MongoDB's rules: numbers by value across integer and float, arrays
/// element by element, objects key by key in order.
fn values_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| values_equal(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .zip(y)
                    .all(|((kx, vx), (ky, vy))| kx == ky && values_equal(vx, vy))
        }
        _ => scalar_cmp(a, b) == Some(Ordering::Equal),
    }
}

/// A JSON number as the MongoDB engine stores it: an `i64` when it fits, otherwise a double.
#[derive(Clone, Copy)]
enum Num {
    Int(i64),
    Float(f64),
}

fn num(n: &Number) -> Num {
    match n.as_i64() {
        Some(i) => Num::Int(i),
        // Without serde_json's arbitrary_precision every number has an f64 form.
        None => Num::Float(n.as_f64().unwrap_or(f64::NAN)),
    }
}

/// Exact numeric order (an `i64` against an `f64` without rounding either), NaN below every
/// number and equal to itself, as in MongoDB. JSON cannot carry NaN; the rule keeps the order
/// total anyway.
fn number_cmp(a: &Number, b: &Number) -> Ordering {
    match (num(a), num(b)) {
        (Num::Int(x), Num::Int(y)) => x.cmp(&y),
        (Num::Int(x), Num::Float(y)) => int_float_cmp(x, y),
        (Num::Float(x), Num::Int(y)) => int_float_cmp(y, x).reverse(),
        (Num::Float(x), Num::Float(y)) => float_cmp(x, y),
    }
}

fn float_cmp(x: f64, y: f64) -> Ordering {
    match (x.is_nan(), y.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Less,
        (false, true) => Ordering::Greater,
        // Neither is NaN, so partial_cmp answers; -0.0 equals 0.0.
        (false, false) => x.partial_cmp(&y).unwrap_or(Ordering::Equal),
    }
}

/// `i` against `f` exactly: `f as i64` or `i as f64` would round values beyond 2^53.
fn int_float_cmp(i: i64, f: f64) -> Ordering {
    // 2^63 is exactly representable; every f64 in [-2^63, 2^63) truncates to an exact i64.
    const TWO_63: f64 = 9_223_372_036_854_775_808.0;
    if f.is_nan() {
        return Ordering::Greater;
    }
    if f >= TWO_63 {
        return Ordering::Less;
    }
    if f < -TWO_63 {
        return Ordering::Greater;
    }
    let t = f.trunc();
    // In range and integral, so the cast is exact.
    let ti = t as i64;
    match i.cmp(&ti) {
        Ordering::Equal => float_cmp(t, f),
        other => other,
    }
}

// ---------------------------------------------------------------------------------------------
// To MongoDB
// ---------------------------------------------------------------------------------------------

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
mod tests {
    use super::cases::{Case, cases};
    use super::*;
    use serde_json::json;

    fn doc(v: Value) -> Document {
        v.as_object().cloned().expect("test documents are objects")
    }

    /// The shared table, built once for the tests that read it (its big documents take tens
    /// of milliseconds to build in a debug build).
    static CASES: std::sync::LazyLock<Vec<Case>> = std::sync::LazyLock::new(cases);

    /// A value for an assertion message: whole when short, cut (on a char boundary) when big.
    fn show(v: &Value) -> String {
        let s = v.to_string();
        if s.len() <= 300 {
            return s;
        }
        let mut end = 300;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}… ({} bytes)", &s[..end], s.len())
    }

    #[test]
    fn every_case_of_the_table_matches_as_expected() {
        let cases = &*CASES;
        assert!(
            cases.len() > 200,
            "the table should be broad, has {} rows",
            cases.len()
        );
        let failures: Vec<String> = cases
            .iter()
            .filter_map(|c| {
                let filter = match Filter::parse(&c.filter) {
                    Ok(f) => f,
                    Err(e) => {
                        return Some(format!("{}: filter {} rejected: {e}", c.name, c.filter));
                    }
                };
                let got = filter.matches(&c.doc);
                (got != c.expected).then(|| {
                    format!(
                        "{}: filter {} on {} expected {} got {got}",
                        c.name,
                        c.filter,
                        show(&Value::Object(c.doc.clone())),
                        c.expected
                    )
                })
            })
            .collect();
        assert!(
            failures.is_empty(),
            "{} rows failed:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }

    #[test]
    fn every_case_gives_the_same_answer_through_to_mongo_and_under_a_prefix() {
        // The MongoDB engine sends `to_mongo`; the change stream prefixes `fullDocument.`.
        // Parsing the canonical form back, and matching it on the document nested under the
        // prefix, must agree with the original on every row.
        for c in CASES.iter() {
            let f = Filter::parse(&c.filter).unwrap();
            let canonical = f.to_mongo("");
            let back = Filter::parse(&canonical).unwrap_or_else(|e| {
                panic!("{}: to_mongo gave {canonical}, which fails: {e}", c.name)
            });
            assert_eq!(
                back.matches(&c.doc),
                c.expected,
                "{}: canonical form {canonical} of {} on {}",
                c.name,
                c.filter,
                show(&Value::Object(c.doc.clone()))
            );
            assert_eq!(
                back.to_mongo(""),
                canonical,
                "{}: to_mongo is not a fixed point",
                c.name
            );
            let prefixed = Filter::parse(&f.to_mongo("fullDocument.")).unwrap();
            let mut event = Document::new();
            event.insert("fullDocument".into(), Value::Object(c.doc.clone()));
            event.insert("operationType".into(), json!("insert"));
            assert_eq!(
                prefixed.matches(&event),
                c.expected,
                "{}: prefixed form {} on the change event",
                c.name,
                f.to_mongo("fullDocument.")
            );
        }
    }

    /// Collects operator names used anywhere in a filter's JSON.
    fn operators_in(v: &Value, out: &mut std::collections::BTreeSet<String>) {
        match v {
            Value::Object(m) => {
                for (k, x) in m {
                    if k.starts_with('$') {
                        out.insert(k.clone());
                    }
                    operators_in(x, out);
                }
            }
            Value::Array(items) => items.iter().for_each(|x| operators_in(x, out)),
            _ => {}
        }
    }

    #[test]
    fn the_table_uses_every_operator_with_both_outcomes() {
        let cases = &*CASES;
        let mut used = std::collections::BTreeSet::new();
        for c in cases {
            operators_in(&c.filter, &mut used);
        }
        for op in FIELD_OPERATORS.split(", ").chain(["$and", "$or"]) {
            assert!(used.contains(op), "no case uses {op}; used: {used:?}");
        }
        let hits = cases.iter().filter(|c| c.expected).count();
        assert!(
            hits > cases.len() / 4 && hits < cases.len() * 3 / 4,
            "the table should hold matches and non-matches alike: {hits} of {}",
            cases.len()
        );
    }

    #[test]
    fn invalid_filters_name_the_place_and_what_is_allowed() {
        // Each $and adds two levels (its array and the object in it), so the object nested k
        // times is at level 2k + 1: the first level past MAX_DEPTH is the object nested
        // MAX_DEPTH / 2 times.
        let deep_and = (0..20).fold(json!({"n": 1}), |inner, _| json!({"$and": [inner]}));
        let deep_and_path = vec!["$and[0]"; MAX_DEPTH / 2].join(".");
        // The root, the operator object and the array come first.
        let over_values_path = format!("n.$in[{}]", MAX_VALUES - 3);
        let long_path = vec!["p"; MAX_DEPTH + 1].join(".");
        let many_values: Vec<Value> = (0..MAX_VALUES).map(|i| json!(i)).collect();
        let table: Vec<(Value, &str, &str)> = vec![
            (json!([{"a": 1}]), "", "must be a JSON object"),
            (json!("lang=ja"), "", "must be a JSON object"),
            (json!(null), "", "must be a JSON object"),
            (
                json!({"$where": "sleep(100)"}),
                "$where",
                "unknown operator $where",
            ),
            (
                json!({"$nor": [{"a": 1}]}),
                "$nor",
                "holds field paths, $and and $or",
            ),
            (json!({"$schema": "/x"}), "$schema", "cannot be matched"),
            (
                json!({"n": {"$regex": "^a"}}),
                "n.$regex",
                "allowed on a field: $eq, $ne, $gt",
            ),
            (
                json!({"n": {"$elemMatch": {"a": 1}}}),
                "n.$elemMatch",
                "unknown operator",
            ),
            (json!({"n": {"$in": 5}}), "n.$in", "$in needs an array"),
            (
                json!({"n": {"$nin": {"a": 1}}}),
                "n.$nin",
                "$nin needs an array",
            ),
            (
                json!({"$and": {"a": 1}}),
                "$and",
                "non-empty array of filters",
            ),
            (json!({"$and": []}), "$and", "non-empty array"),
            (
                json!({"$or": [{"a": 1}, 3]}),
                "$or[1]",
                "must be a JSON object",
            ),
            (
                json!({"$or": [{"a": 1}, [{"b": 1}]]}),
                "$or[1]",
                "not an array",
            ),
            (
                json!({"$and": [{"lang": "ja"}, {"retweet_count": {"$gt": [10]}}]}),
                "$and[1].retweet_count.$gt",
                "compares with a number, string, boolean or null, not an array",
            ),
            (json!({"n": {"$lte": {"x": 1}}}), "n.$lte", "not an object"),
            (
                json!({"n": {"$gt": 1, "a": 2}}),
                "n.a",
                "cannot also hold the field",
            ),
            (
                json!({"n": {"$exists": 1}}),
                "n.$exists",
                "true or false, not a number",
            ),
            (
                json!({"n": {"$exists": "yes"}}),
                "n.$exists",
                "true or false",
            ),
            (json!({"n": {"$not": 5}}), "n.$not", "object of operators"),
            (
                json!({"n": {"$not": {}}}),
                "n.$not",
                "at least one operator",
            ),
            (
                json!({"n": {"$not": {"a": 1}}}),
                "n.$not",
                "use $ne or $nin",
            ),
            (
                json!({"n": {"$not": {"$gt": 1, "a": 1}}}),
                "n.$not.a",
                "cannot also hold",
            ),
            (
                json!({"n": {"$not": {"$regex": "x"}}}),
                "n.$not.$regex",
                "unknown operator",
            ),
            (
                json!({"n": {"$and": [{"a": 1}]}}),
                "n.$and",
                "put it at the top level",
            ),
            (
                json!({"n": {"$in": [1, {"$gt": 1}]}}),
                "n.$in[1].$gt",
                "key starting with '$'",
            ),
            (
                json!({"n": {"$eq": {"a": {"$oid": "x"}}}}),
                "n.$eq.a.$oid",
                "BSON type",
            ),
            (
                json!({"n": {"$ne": [{"$date": 1}]}}),
                "n.$ne[0].$date",
                "key starting with '$'",
            ),
            (json!({"a..b": 1}), "a..b", "empty part"),
            (json!({".a": 1}), ".a", "empty part"),
            (json!({"a.": 1}), "a.", "empty part"),
            (json!({"": 1}), "", "cannot be empty"),
            (json!({"a.$b": 1}), "a.$b", "starts with '$'"),
            (json!({"a\u{0}b": 1}), "a\u{0}b", "NUL"),
            (json!({"n": {"$eq": {"k\u{0}": 1}}}), "n.$eq.k\u{0}", "NUL"),
            (
                json!({"$and": [{}, {"$or": [{"a..b": 1}]}]}),
                "$and[1].$or[0].a..b",
                "empty part",
            ),
            (
                deep_and,
                deep_and_path.as_str(),
                "nested deeper than 32 levels",
            ),
            (
                json!({long_path.clone(): 1}),
                long_path.as_str(),
                "more than 32 parts",
            ),
            (
                json!({"n": {"$in": many_values}}),
                over_values_path.as_str(),
                "more than 2000 values",
            ),
            (
                json!({"s": "x".repeat(MAX_BYTES + 1)}),
                "s",
                "exceed 65536 bytes",
            ),
        ];
        for (filter, path, fragment) in table {
            let shown = show(&filter);
            let err = match Filter::parse(&filter) {
                Ok(f) => panic!("{shown} should be rejected, parsed as {f:?}"),
                Err(e) => e,
            };
            assert_eq!(
                err.path, path,
                "{shown}: wrong path; message {:?}",
                err.message
            );
            assert!(
                err.message.contains(fragment),
                "{shown}: message {:?} should contain {fragment:?}",
                err.message
            );
            let line = err.to_string();
            assert!(
                line.starts_with("filter at ") && !line.contains('\n'),
                "{shown}: Display should be one line 'filter at <path>: <message>', got {line:?}"
            );
        }
    }

    #[test]
    fn the_depth_bound_sits_exactly_at_max_depth() {
        // {"n": {"$eq": [[...[1]...]]}}: the filter object is level 1, the operator object
        // level 2, the operand level 3.
        let nested = |levels: usize| (0..levels).fold(json!(1), |v, _| json!([v]));
        let at_limit = json!({"n": {"$eq": nested(MAX_DEPTH - 3)}});
        assert!(
            Filter::parse(&at_limit).is_ok(),
            "{MAX_DEPTH} levels must be accepted"
        );
        let over = json!({"n": {"$eq": nested(MAX_DEPTH - 2)}});
        let err = Filter::parse(&over).unwrap_err();
        assert!(
            err.message.contains("deeper"),
            "{MAX_DEPTH}+1 levels must be refused, got {err}"
        );
    }

    #[test]
    fn display_is_one_line_with_the_path() {
        let err = Filter::parse(&json!({"$and": [{}, {"retweet_count": {"$gt": {"a": 1}}}]}))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("filter at $and[1].retweet_count.$gt: {}", err.message),
            "Display should be 'filter at <path>: <message>'"
        );
        let top = Filter::parse(&json!([])).unwrap_err();
        assert_eq!(top.path, "", "a top-level problem has an empty path");
        assert!(
            top.to_string().starts_with("filter at top level: "),
            "got {top}"
        );
    }

    #[test]
    fn to_mongo_prefixes_every_path_and_makes_equality_explicit() {
        let f = Filter::parse(&json!({
            "lang": "ja",
            "user": {"screen_name": "a"},
            "n": {"$not": {"$gt": 5}, "$in": [1, 2.5, "x", null]},
            "$or": [{"tags": {"$exists": true}}, {"$and": [{"m": {"$ne": [1]}}]}]
        }))
        .unwrap();
        assert_eq!(
            f.to_mongo("fullDocument."),
            json!({
                "fullDocument.lang": {"$eq": "ja"},
                "fullDocument.user": {"$eq": {"screen_name": "a"}},
                "fullDocument.n": {"$not": {"$gt": 5}, "$in": [1, 2.5, "x", null]},
                "$or": [
                    {"fullDocument.tags": {"$exists": true}},
                    {"$and": [{"fullDocument.m": {"$ne": [1]}}]}
                ]
            })
        );
        assert_eq!(
            Filter::parse(&json!({})).unwrap().to_mongo("fullDocument."),
            json!({})
        );
    }

    #[test]
    fn to_mongo_keeps_json_number_types() {
        let f = Filter::parse(&json!({"a": 1, "b": 1.0, "c": {"$gt": u64::MAX}})).unwrap();
        let m = f.to_mongo("");
        assert!(m["a"]["$eq"].is_i64(), "an integer stays an integer: {m}");
        assert!(m["b"]["$eq"].is_f64(), "a float stays a float: {m}");
        assert!(
            m["c"]["$gt"].is_u64(),
            "a u64 stays a u64 (the engine decides BSON): {m}"
        );
    }

    #[test]
    fn the_original_json_is_kept_and_compared() {
        let json = json!({"b": {"$in": [2, 1]}, "a": 1});
        let f = Filter::parse(&json).unwrap();
        assert_eq!(f.as_json(), &json, "as_json echoes the client's filter");
        assert_eq!(
            Filter::parse(f.as_json()).unwrap(),
            f,
            "reparsing gives an equal filter"
        );
        assert_ne!(
            Filter::parse(&json!({"a": 1.0, "b": {"$in": [2, 1]}})).unwrap(),
            f,
            "filters from different JSON are different values"
        );
        assert_eq!(format!("{f:?}"), format!("Filter({json})"));
        assert_eq!(
            serde_json::to_value(&f).unwrap(),
            json,
            "serializes as its JSON"
        );
    }

    #[test]
    fn is_match_all_only_for_structurally_empty_filters() {
        for (json, expected) in [
            (json!({}), true),
            (json!({"$and": [{}]}), true),
            (json!({"$or": [{"a": 1}, {}]}), true),
            (json!({"$and": [{}, {"a": 1}]}), false),
            (json!({"$or": [{"a": 1}]}), false),
            (json!({"a": {"$exists": true}}), false),
        ] {
            let f = Filter::parse(&json).unwrap();
            assert_eq!(f.is_match_all(), expected, "is_match_all of {json}");
            if expected {
                assert!(
                    f.matches(&Document::new()),
                    "{json} claims to match all, not the empty doc"
                );
            }
        }
        assert!(Filter::match_all().is_match_all() && Filter::default().is_match_all());
        assert_eq!(Filter::match_all().as_json(), &json!({}));
    }

    #[test]
    fn from_str_and_deserialize_validate() {
        let f: Filter = r#"{"lang":"ja","retweet_count":{"$gte":10}}"#.parse().unwrap();
        assert!(f.matches(&doc(json!({"lang": "ja", "retweet_count": 10}))));
        let bad_json = "{lang: ja}".parse::<Filter>().unwrap_err();
        assert_eq!(bad_json.path, "");
        assert!(
            bad_json.message.contains("not valid JSON"),
            "got {bad_json}"
        );
        let bad = serde_json::from_value::<Filter>(json!({"n": {"$in": 1}})).unwrap_err();
        assert!(
            bad.to_string().contains("filter at n.$in"),
            "deserializing must validate: {bad}"
        );
    }

    #[test]
    fn a_deep_document_costs_no_more_than_the_path() {
        // 500 levels of arrays, and 500 of objects (serde_json refuses to read more than 128): the walk follows the path (at most
        // MAX_DEPTH parts), never the document's depth, and equality stops at the filter's
        // shallower value.
        let mut arrays = json!("bottom");
        let mut objects = json!("bottom");
        for _ in 0..500 {
            arrays = json!([arrays]);
            objects = json!({"p": objects});
        }
        let d = doc(json!({"a": arrays, "p": objects}));
        let index_path = vec!["0"; MAX_DEPTH - 1].join(".");
        for (filter, expected) in [
            (json!({format!("a.{index_path}"): {"$exists": true}}), true),
            (json!({"a": {"$eq": [[["bottom"]]]}}), false),
            (json!({"a": {"$in": [[[[[]]]], "x"]}}), false),
            (
                json!({vec!["p"; MAX_DEPTH].join("."): {"$exists": true}}),
                true,
            ),
            (json!({"p": {"$ne": {"p": {"p": 1}}}}), true),
        ] {
            let f = Filter::parse(&filter).unwrap();
            assert_eq!(f.matches(&d), expected, "{filter} on a 500-level document");
        }
    }

    #[test]
    fn long_tail_population_matches_a_direct_count() {
        // 5000 tweets whose screen names follow a Zipf-like long tail (a few names very often,
        // most names once) in several scripts; the filter's count must equal a count computed
        // directly from the generated fields.
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let scripts = ["user", "ユーザー", "مستخدم", "משתמש", "🦀"];
        let langs = ["en", "ja", "ar", "he", "und"];
        let mut docs = Vec::new();
        for _ in 0..5000 {
            // rank = floor(1 / u): P(rank = k) ~ 1/k², a long tail.
            let u = (next() % 1_000_000 + 1) as f64 / 1_000_000.0;
            let rank = (1.0 / u) as u64;
            let script = scripts[(rank % 5) as usize];
            let lang = langs[(next() % 5) as usize];
            let retweets = (next() % 50) as i64;
            docs.push((format!("{script}{rank}"), lang, retweets));
        }
        let wanted = ["user5", "ユーザー1", "🦀4", "مستخدم7", "nobody"];
        let filter = Filter::parse(&json!({
            "user.screen_name": {"$in": wanted},
            "lang": {"$ne": "en"},
            "retweet_count": {"$gte": 10, "$lt": 40.5}
        }))
        .unwrap();
        let got = docs
            .iter()
            .filter(|(name, lang, rt)| filter.matches(&doc(tweet_like(name, lang, *rt))))
            .count();
        let direct = docs
            .iter()
            .filter(|(name, lang, rt)| {
                wanted.contains(&name.as_str()) && *lang != "en" && (10..=40).contains(rt)
            })
            .count();
        assert!(
            direct > 10,
            "the generated population should hit the filter often enough: {direct}"
        );
        assert_eq!(
            got, direct,
            "filter count against a direct count over 5000 long-tail tweets"
        );
    }

    fn tweet_like(name: &str, lang: &str, retweets: i64) -> Value {
        json!({
            "user": {"screen_name": name, "名前": name},
            "lang": lang,
            "retweet_count": retweets,
            "$schema": "/tweet/1",
            "meta.dt": "2024-01-01T00:00:00Z",
        })
    }

    mod properties {
        use super::super::*;
        use proptest::prelude::*;
        use serde_json::json;

        fn scalar() -> BoxedStrategy<Value> {
            prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::Bool),
                (-3i64..4).prop_map(Value::from),
                prop::sample::select(vec![-0.0, 0.5, 1.0, 2.0, 2.5, 1e300, -1e300])
                    .prop_map(Value::from),
                Just(json!(u64::MAX)),
                Just(json!(i64::MIN)),
                prop::sample::select(vec![
                    "",
                    "a",
                    "B",
                    "日本",
                    "😀",
                    "\u{FF61}",
                    "مرحبا",
                    "e\u{301}"
                ])
                .prop_map(Value::from),
            ]
            .boxed()
        }

        /// Keys a document may hold, including ones a filter cannot address.
        fn doc_key() -> BoxedStrategy<String> {
            prop::sample::select(vec![
                "a", "b", "0", "1", "tags", "名前", "$s", "a.b", "01", "",
            ])
            .prop_map(str::to_owned)
            .boxed()
        }

        /// Keys a filter value may hold (no `$`).
        fn literal_key() -> BoxedStrategy<String> {
            prop::sample::select(vec!["a", "b", "0", "名前", "a.b"])
                .prop_map(str::to_owned)
                .boxed()
        }

        fn json_with(key: BoxedStrategy<String>) -> BoxedStrategy<Value> {
            scalar()
                .prop_recursive(4, 40, 4, move |inner| {
                    prop_oneof![
                        prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                        prop::collection::btree_map(key.clone(), inner, 0..4)
                            .prop_map(|m| Value::Object(m.into_iter().collect())),
                    ]
                })
                .boxed()
        }

        fn document() -> impl Strategy<Value = Document> {
            prop::collection::btree_map(doc_key(), json_with(doc_key()), 0..5)
                .prop_map(|m| m.into_iter().collect())
        }

        fn literal() -> BoxedStrategy<Value> {
            json_with(literal_key())
        }

        fn path() -> impl Strategy<Value = String> {
            prop::collection::vec(
                prop::sample::select(vec!["a", "b", "0", "1", "tags", "名前"]),
                1..4,
            )
            .prop_map(|parts| parts.join("."))
        }

        /// A valid operator object, `$not` nested up to twice.
        fn operators() -> BoxedStrategy<Value> {
            let leaf = prop_oneof![
                literal().prop_map(|v| ("$eq".to_owned(), v)),
                literal().prop_map(|v| ("$ne".to_owned(), v)),
                (
                    prop::sample::select(vec!["$gt", "$gte", "$lt", "$lte"]),
                    scalar()
                )
                    .prop_map(|(op, v)| (op.to_owned(), v)),
                (
                    prop::sample::select(vec!["$in", "$nin"]),
                    prop::collection::vec(literal(), 0..4)
                )
                    .prop_map(|(op, v)| (op.to_owned(), Value::Array(v))),
                any::<bool>().prop_map(|b| ("$exists".to_owned(), Value::Bool(b))),
            ];
            // Duplicate names collapse, last wins: still at least one operator.
            let object = |entry: BoxedStrategy<(String, Value)>| {
                prop::collection::vec(entry, 1..3)
                    .prop_map(|entries| Value::Object(entries.into_iter().collect()))
            };
            let level0 = object(leaf.clone().boxed()).boxed();
            let level1 = object(
                prop_oneof![leaf.clone(), level0.prop_map(|o| ("$not".to_owned(), o))].boxed(),
            )
            .boxed();
            object(prop_oneof![leaf, level1.prop_map(|o| ("$not".to_owned(), o))].boxed()).boxed()
        }

        fn field_condition() -> impl Strategy<Value = Value> {
            prop_oneof![literal(), operators()]
        }

        fn filter_json() -> impl Strategy<Value = Value> {
            let fields = prop::collection::btree_map(path(), field_condition(), 0..3)
                .prop_map(|m| Value::Object(m.into_iter().collect()));
            fields.prop_recursive(3, 24, 3, |inner| {
                (
                    prop::collection::btree_map(path(), field_condition(), 0..3),
                    prop::sample::select(vec!["$and", "$or"]),
                    prop::collection::vec(inner, 1..3),
                )
                    .prop_map(|(fields, op, subs)| {
                        let mut m: Map<String, Value> = fields.into_iter().collect();
                        m.insert(op.to_owned(), Value::Array(subs));
                        Value::Object(m)
                    })
            })
        }

        proptest! {
            // 64 cases each keeps `cargo test -p store --lib filter` under a second in a debug
            // build; PROPTEST_CASES=10000 runs a deeper search.
            #![proptest_config(ProptestConfig {
                cases: std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(64),
                failure_persistence: None,
                ..ProptestConfig::default()
            })]

            #[test]
            fn parse_never_panics_and_round_trips(json in json_with(prop_oneof![
                doc_key(),
                prop::sample::select(vec!["$and", "$or", "$in", "$not", "$gt", "$exists", "$eq"]).prop_map(str::to_owned),
            ].boxed())) {
                if let Ok(f) = Filter::parse(&json) {
                    prop_assert_eq!(&Filter::parse(f.as_json()).unwrap(), &f);
                    let canonical = f.to_mongo("");
                    let back = Filter::parse(&canonical);
                    prop_assert!(back.is_ok(), "to_mongo {} of {} fails to parse: {:?}", canonical, json, back);
                }
            }

            #[test]
            fn generated_filters_parse_and_agree_with_their_canonical_and_prefixed_forms(
                json in filter_json(),
                d in document(),
            ) {
                let f = Filter::parse(&json);
                prop_assert!(f.is_ok(), "generated filter {} rejected: {:?}", json, f);
                let f = f.unwrap();
                prop_assert_eq!(&Filter::parse(f.as_json()).unwrap(), &f);
                let got = f.matches(&d);
                let canonical = Filter::parse(&f.to_mongo("")).unwrap();
                prop_assert_eq!(canonical.matches(&d), got, "canonical {} vs {} on {:?}", f.to_mongo(""), json, d);
                let prefixed = Filter::parse(&f.to_mongo("fullDocument.")).unwrap();
                let mut event = Document::new();
                event.insert("fullDocument".into(), Value::Object(d.clone()));
                prop_assert_eq!(prefixed.matches(&event), got, "prefixed form of {} on {:?}", json, d);
            }

            #[test]
            fn not_ne_and_nin_are_exact_negations(
                p in path(),
                ops in operators(),
                v in literal(),
                list in prop::collection::vec(literal(), 0..4),
                d in document(),
            ) {
                let positive = Filter::parse(&json!({p.clone(): ops.clone()})).unwrap();
                let negated = Filter::parse(&json!({p.clone(): {"$not": ops.clone()}})).unwrap();
                prop_assert_eq!(negated.matches(&d), !positive.matches(&d), "$not {} on {:?}", ops, d);
                let eq = Filter::parse(&json!({p.clone(): {"$eq": v.clone()}})).unwrap();
                let ne = Filter::parse(&json!({p.clone(): {"$ne": v.clone()}})).unwrap();
                prop_assert_eq!(ne.matches(&d), !eq.matches(&d), "$ne {} on {:?}", v, d);
                let implicit = Filter::parse(&json!({p.clone(): v.clone()})).unwrap();
                prop_assert_eq!(implicit.matches(&d), eq.matches(&d), "implicit vs $eq {} on {:?}", v, d);
                let inn = Filter::parse(&json!({p.clone(): {"$in": list.clone()}})).unwrap();
                let nin = Filter::parse(&json!({p.clone(): {"$nin": list.clone()}})).unwrap();
                prop_assert_eq!(nin.matches(&d), !inn.matches(&d), "$nin {:?} on {:?}", list, d);
                // MongoDB defines $in as an $or of equalities.
                let any_eq = list.iter().any(|x| {
                    Filter::parse(&json!({p.clone(): {"$eq": x}})).unwrap().matches(&d)
                });
                prop_assert_eq!(inn.matches(&d), any_eq, "$in {:?} vs $or of $eq on {:?}", list, d);
            }
        }
    }
}
