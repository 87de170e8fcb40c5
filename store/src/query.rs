//! Queries in MongoDB's aggregation language, evaluated in-process over documents an engine
//! reads (the stored window of a capped collection, a keyed collection's snapshot).
//!
//! A client sends a pipeline such as
//! `[{"$match": {"lang": "ja"}}, {"$unwind": "$hashtags"}, {"$sortByCount": "$hashtags"}, {"$limit": 10}]`.
//! [`Pipeline::parse`] checks it and refuses anything outside the subset below with a
//! [`QueryError`] naming the stage and the operator; nothing is silently ignored. The same
//! JSON is what MongoDB's `aggregate` takes, so a pipeline answered here means the same on a
//! MongoDB server; [`aggregate`] sends a server the longest prefix it evaluates as tailrace
//! does (`server.rs`) and evaluates the rest here. A client's pipeline is parsed from its text
//! ([`Pipeline::parse_text`]), which keeps the order of a `$sort`'s keys.
//!
//! # The subset
//!
//! | stage | form |
//! |---|---|
//! | `$match` | a filter in MongoDB query syntax ([`crate::Filter`]) |
//! | `$sort` | `{"field": 1 \| -1, ...}` by the keys in order, MongoDB's order across types, missing as null |
//! | `$limit`, `$skip` | a non-negative integer (`$limit` positive) |
//! | `$project` | inclusion (`{"a": 1, "b.c": 1, "_id": 0}`, with computed fields `{"x": <expr>}`) or exclusion (`{"a": 0}`) |
//! | `$unwind` | `"$path"` or `{"path": "$path", "preserveNullAndEmptyArrays": bool}` |
//! | `$group` | `{"_id": <expr>, "name": {<acc>: <expr>}, ...}`; accumulators `$sum $avg $min $max $first $last $addToSet $push $count` |
//! | `$count` | `"name"` |
//! | `$sortByCount` | `<expr>`: groups, counts, and sorts by count (ties by `_id`) |
//!
//! Expressions are in [`expr`]: field paths, literals, objects, `$toDate`, `$dateTrunc` by
//! second, minute, hour or day, `$divide`.
//!
//! # Bounds
//!
//! A pipeline comes from an HTTP client. At most [`MAX_STAGES`] stages; expressions nest at
//! most 32 deep. What a query holds at once (the groups, a sort's buffer, a set's values) is
//! counted in approximate bytes, and a query past its bound ([`Limits::max_bytes`]) is refused
//! with an error saying so, as MongoDB refuses a stage past 100 MB without `allowDiskUse`.

mod cores;
mod eval;
mod expr;
mod indexed;
mod live;
mod page;
mod read;
mod server;
#[cfg(test)]
mod tests;
mod timed;

use std::fmt;

use serde::Serialize;
use serde_json::Value;

use crate::Filter;
use expr::Expr;

pub use cores::{as_query_thread, cores, threads, use_cores};
pub use eval::{Answer, StageRun};
pub use live::{GroupChange, Live};
pub use page::{Order, Page, PageRequest, page};
pub use read::{AggregateError, Input, aggregate, load_live};
pub use server::{Features, ServerQuery, probe, probe_docs};

/// The most stages a pipeline may have.
pub const MAX_STAGES: usize = 64;

/// Why a pipeline was refused or failed: where (`[2].$group.n.$median`) and what.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct QueryError {
    /// A path into the pipeline: the stage's index and name, then keys; empty for the whole.
    pub path: String,
    /// What is wrong and what is allowed there.
    pub message: String,
}

impl QueryError {
    pub(crate) fn at(path: &str, message: impl Into<String>) -> QueryError {
        QueryError {
            path: path.to_owned(),
            message: message.into(),
        }
    }
}

impl fmt::Display for QueryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

impl std::error::Error for QueryError {}

/// What a query may hold.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Bytes held at once: groups as their tables allocate them (a growth that would pass
    /// the bound, counting the old block while it is copied, is refused before it is made);
    /// sort buffers and sets by their documents' approximate sizes.
    pub max_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        // MongoDB refuses a stage past 100 MB without allowDiskUse, counting its values'
        // sizes. Counted here by what the tables allocate, with room for a doubling, the
        // $group of 588,560 names that MongoDB's count admits at about 60 MB needs more than
        // 100 MiB (`tailrace bench query`, "distinct user.screen_name").
        Limits {
            max_bytes: 256 << 20,
        }
    }
}

/// One `$group` accumulator.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Acc {
    Sum(Expr),
    Avg(Expr),
    Min(Expr),
    Max(Expr),
    First(Expr),
    Last(Expr),
    AddToSet(Expr),
    Push(Expr),
    Count,
}

/// A `$project`.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Projection {
    /// Keep these paths (and `_id` unless excluded), plus computed fields.
    Include {
        paths: Vec<Vec<String>>,
        computed: Vec<(String, Expr)>,
        id: bool,
    },
    /// Drop these paths.
    Exclude(Vec<Vec<String>>),
}

/// One parsed stage.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Stage {
    Match(Filter),
    Sort(Vec<(Vec<String>, bool)>),
    Limit(u64),
    Skip(u64),
    Project(Projection),
    Unwind { path: Vec<String>, keep_empty: bool },
    Group { id: Expr, accs: Vec<(String, Acc)> },
    Count(String),
    SortByCount(Expr),
}

impl Stage {
    /// The stage's name as written (`$match`).
    pub(super) fn name(&self) -> &'static str {
        match self {
            Stage::Match(_) => "$match",
            Stage::Sort(_) => "$sort",
            Stage::Limit(_) => "$limit",
            Stage::Skip(_) => "$skip",
            Stage::Project(_) => "$project",
            Stage::Unwind { .. } => "$unwind",
            Stage::Group { .. } => "$group",
            Stage::Count(_) => "$count",
            Stage::SortByCount(_) => "$sortByCount",
        }
    }
}

/// A validated pipeline: the client's JSON and its parsed stages.
#[derive(Clone, Debug, PartialEq)]
pub struct Pipeline {
    json: Value,
    stages: Vec<Stage>,
}

/// Every stage name supported, for errors.
const STAGES: &str =
    "$match, $sort, $limit, $skip, $project, $unwind, $group, $count, $sortByCount";

impl Pipeline {
    /// Parses and checks a pipeline given as JSON text, as a client sends it. The text keeps
    /// the order of a `$sort`'s keys, which is the order it sorts by and which a
    /// [`serde_json::Value`] here does not keep (its objects hold keys sorted).
    pub fn parse_text(text: &str) -> Result<Pipeline, QueryError> {
        let json: Value = serde_json::from_str(text)
            .map_err(|e| QueryError::at("", format!("the pipeline is not JSON: {e}")))?;
        // The JSON is valid, so only a shape other than an array of objects fails here, and
        // `parse` says what is wrong with that.
        let orders: Vec<SortOrder> = serde_json::from_str(text).unwrap_or_default();
        Self::parse_ordered(&json, &orders)
    }

    /// Parses and checks a pipeline (a JSON array of one-key stage objects). A `$sort` of
    /// several keys is refused here: the order of its keys is lost in a [`Value`]; give such
    /// a pipeline as text ([`Pipeline::parse_text`]).
    pub fn parse(json: &Value) -> Result<Pipeline, QueryError> {
        Self::parse_ordered(json, &[])
    }

    fn parse_ordered(json: &Value, orders: &[SortOrder]) -> Result<Pipeline, QueryError> {
        let Some(items) = json.as_array() else {
            return Err(QueryError::at(
                "",
                "a pipeline is an array of stages, e.g. [{\"$match\": {}}]",
            ));
        };
        if items.len() > MAX_STAGES {
            return Err(QueryError::at(
                "",
                format!("at most {MAX_STAGES} stages (got {})", items.len()),
            ));
        }
        let mut stages = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let at = format!("[{i}]");
            let Some((name, arg)) = item
                .as_object()
                .filter(|o| o.len() == 1)
                .and_then(|o| o.iter().next())
            else {
                return Err(QueryError::at(
                    &at,
                    "a stage is an object with one key, the stage's name",
                ));
            };
            let at = format!("[{i}].{name}");
            let order = orders.get(i).and_then(|o| o.0.as_deref());
            stages.push(parse_stage(name, arg, order, &at)?);
        }
        Ok(Pipeline {
            json: json.clone(),
            stages,
        })
    }

    /// The pipeline as the client sent it (what a MongoDB server is given).
    pub fn as_json(&self) -> &Value {
        &self.json
    }

    /// The stages' names, in order.
    pub fn stage_names(&self) -> Vec<&'static str> {
        self.stages.iter().map(Stage::name).collect()
    }

    /// The field paths the pipeline reads (dotted: `user.screen_name`), when a stage
    /// (`$group`, `$project`, `$count`, `$sortByCount`) replaces the documents before the end,
    /// so that nothing else of a document need be decoded or copied out of the store
    /// ([`only_paths`]); `None` when whole documents come out.
    pub fn fields_read(&self) -> Option<Vec<String>> {
        let mut fields = Vec::new();
        let add = |path: &[String], fields: &mut Vec<String>| {
            let dotted = path.join(".");
            if !dotted.is_empty() && !fields.contains(&dotted) {
                fields.push(dotted);
            }
        };
        for stage in &self.stages {
            match stage {
                Stage::Match(f) => filter_fields(f.as_json(), &mut fields),
                Stage::Sort(keys) => keys.iter().for_each(|(p, _)| add(p, &mut fields)),
                Stage::Unwind { path, .. } => add(path, &mut fields),
                Stage::Limit(_) | Stage::Skip(_) | Stage::Project(Projection::Exclude(_)) => {}
                Stage::Project(Projection::Include {
                    paths,
                    computed,
                    id,
                }) => {
                    paths.iter().for_each(|p| add(p, &mut fields));
                    computed.iter().for_each(|(_, e)| e.fields(&mut fields));
                    if *id {
                        add(&["_id".to_owned()], &mut fields);
                    }
                    return Some(fields);
                }
                Stage::Group { id, accs } => {
                    id.fields(&mut fields);
                    for (_, acc) in accs {
                        if let Some(e) = acc.expr() {
                            e.fields(&mut fields);
                        }
                    }
                    return Some(fields);
                }
                Stage::SortByCount(e) => {
                    e.fields(&mut fields);
                    return Some(fields);
                }
                Stage::Count(_) => return Some(fields),
            }
        }
        None
    }

    /// The received times (ms, inclusive; [`crate::RECEIVED_PATH`]) the documents must have to
    /// pass the first stage, when it is a `$match` on them: a capped collection then reads
    /// only where they lie ([`crate::Capped::time_span`]).
    pub fn received_range(&self) -> Option<(i64, i64)> {
        match self.stages.first()? {
            Stage::Match(f) => f.date_range(crate::RECEIVED_PATH),
            _ => None,
        }
    }

    /// Runs the pipeline over `docs`, in tailrace.
    pub fn run<I>(&self, docs: I, limits: Limits) -> Result<Answer, QueryError>
    where
        I: IntoIterator<Item = crate::Document>,
    {
        eval::run(&self.stages, docs, limits)
    }
}

/// The value at a field path (split) as aggregation reads it, as a `$group` by `"$a.b"`
/// does: through an array, the values reached in each element, as an array.
pub(crate) fn value_at<'a>(
    doc: &'a crate::Document,
    parts: &[String],
) -> Option<std::borrow::Cow<'a, Value>> {
    expr::lookup_ref(doc, parts)
}

/// `paths` (dotted) split into parts, without those another one covers (`user` covers
/// `user.id`): what a document cut down to them must hold.
pub fn only_paths(paths: &[String]) -> Vec<Vec<String>> {
    let split: Vec<Vec<String>> = paths
        .iter()
        .map(|p| p.split('.').map(str::to_owned).collect())
        .collect();
    let mut out: Vec<Vec<String>> = Vec::new();
    for p in &split {
        let covered = split.iter().any(|q| q.len() < p.len() && p.starts_with(q));
        if !covered && !out.contains(p) {
            out.push(p.clone());
        }
    }
    out
}

/// The field paths a filter reads (through `$and`, `$or`).
fn filter_fields(filter: &Value, out: &mut Vec<String>) {
    match filter {
        Value::Object(o) => {
            for (k, v) in o {
                if k.starts_with('$') {
                    filter_fields(v, out);
                } else if !out.iter().any(|f| f == k) {
                    out.push(k.clone());
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|i| filter_fields(i, out)),
        _ => {}
    }
}

impl Acc {
    fn expr(&self) -> Option<&Expr> {
        match self {
            Acc::Sum(e)
            | Acc::Avg(e)
            | Acc::Min(e)
            | Acc::Max(e)
            | Acc::First(e)
            | Acc::Last(e)
            | Acc::AddToSet(e)
            | Acc::Push(e) => Some(e),
            Acc::Count => None,
        }
    }
}

/// The keys of one stage's `$sort`, in the order the text gives them (`None` for any other
/// stage), read with serde straight from the text.
#[derive(Debug, Default)]
struct SortOrder(Option<Vec<String>>);

impl<'de> serde::Deserialize<'de> for SortOrder {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Stage;
        impl<'de> serde::de::Visitor<'de> for Stage {
            type Value = SortOrder;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a stage")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> Result<SortOrder, A::Error> {
                let mut order = None;
                while let Some(key) = m.next_key::<String>()? {
                    if key == "$sort" {
                        order = Some(m.next_value::<Keys>()?.0);
                    } else {
                        m.next_value::<serde::de::IgnoredAny>()?;
                    }
                }
                Ok(SortOrder(order))
            }
        }
        d.deserialize_map(Stage)
    }
}

/// An object's keys, in order.
struct Keys(Vec<String>);

impl<'de> serde::Deserialize<'de> for Keys {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Keys;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut m: A) -> Result<Keys, A::Error> {
                let mut keys = Vec::new();
                while let Some(key) = m.next_key::<String>()? {
                    m.next_value::<serde::de::IgnoredAny>()?;
                    keys.push(key);
                }
                Ok(Keys(keys))
            }
        }
        d.deserialize_map(Visit)
    }
}

fn parse_stage(
    name: &str,
    arg: &Value,
    order: Option<&[String]>,
    at: &str,
) -> Result<Stage, QueryError> {
    Ok(match name {
        "$match" => Stage::Match(Filter::parse(arg).map_err(|e| {
            let inner = if e.path.is_empty() {
                at.to_owned()
            } else {
                format!("{at}.{}", e.path)
            };
            QueryError::at(&inner, e.message)
        })?),
        "$sort" => {
            let Some(o) = arg.as_object().filter(|o| !o.is_empty()) else {
                return Err(QueryError::at(at, "takes {\"field\": 1 or -1, ...}"));
            };
            let order: Vec<&String> = match order {
                Some(keys) if keys.len() == o.len() => keys.iter().collect(),
                _ if o.len() == 1 => o.keys().collect(),
                _ => {
                    return Err(QueryError::at(
                        at,
                        "the order of several keys is lost in a parsed JSON value: give the pipeline as text (Pipeline::parse_text)",
                    ));
                }
            };
            let mut keys = Vec::with_capacity(o.len());
            for k in order {
                let Some(v) = o.get(k) else {
                    return Err(QueryError::at(&format!("{at}.{k}"), "a key given twice"));
                };
                let asc = match v.as_i64() {
                    Some(1) => true,
                    Some(-1) => false,
                    _ => return Err(QueryError::at(&format!("{at}.{k}"), "must be 1 or -1")),
                };
                keys.push((expr::field_path(k, &format!("{at}.{k}"))?, asc));
            }
            Stage::Sort(keys)
        }
        "$limit" => Stage::Limit(
            arg.as_u64()
                .filter(|n| *n > 0)
                .ok_or_else(|| QueryError::at(at, "must be a positive integer"))?,
        ),
        "$skip" => Stage::Skip(
            arg.as_u64()
                .ok_or_else(|| QueryError::at(at, "must be a non-negative integer"))?,
        ),
        "$project" => Stage::Project(parse_projection(arg, at)?),
        "$unwind" => {
            let (path, keep_empty) = match arg {
                Value::String(s) => (s.as_str(), false),
                Value::Object(o) => {
                    if let Some(k) = o
                        .keys()
                        .find(|k| !["path", "preserveNullAndEmptyArrays"].contains(&k.as_str()))
                    {
                        return Err(QueryError::at(
                            at,
                            format!(
                                "option {k} is not supported (supported: path, preserveNullAndEmptyArrays)"
                            ),
                        ));
                    }
                    let path = o
                        .get("path")
                        .and_then(Value::as_str)
                        .ok_or_else(|| QueryError::at(at, "path is required (\"$field\")"))?;
                    let keep = match o.get("preserveNullAndEmptyArrays") {
                        None => false,
                        Some(Value::Bool(b)) => *b,
                        Some(_) => {
                            return Err(QueryError::at(
                                &format!("{at}.preserveNullAndEmptyArrays"),
                                "must be true or false",
                            ));
                        }
                    };
                    (path, keep)
                }
                _ => {
                    return Err(QueryError::at(
                        at,
                        "takes \"$field\" or {\"path\": \"$field\"}",
                    ));
                }
            };
            let Some(rest) = path.strip_prefix('$') else {
                return Err(QueryError::at(
                    at,
                    format!("{path:?}: a field path starts with $"),
                ));
            };
            Stage::Unwind {
                path: expr::field_path(rest, at)?,
                keep_empty,
            }
        }
        "$group" => {
            let Some(o) = arg.as_object() else {
                return Err(QueryError::at(
                    at,
                    "takes {\"_id\": <expr>, \"name\": {<accumulator>: <expr>}, ...}",
                ));
            };
            let id = Expr::parse(
                o.get("_id").ok_or_else(|| {
                    QueryError::at(at, "_id is required (null for one group of all)")
                })?,
                &format!("{at}._id"),
            )?;
            let mut accs = Vec::new();
            for (k, v) in o.iter().filter(|(k, _)| *k != "_id") {
                let inner = format!("{at}.{k}");
                if k.contains('.') || k.starts_with('$') {
                    return Err(QueryError::at(
                        &inner,
                        "an output field's name cannot contain a dot or start with $",
                    ));
                }
                let Some((op, e)) = v
                    .as_object()
                    .filter(|o| o.len() == 1)
                    .and_then(|o| o.iter().next())
                else {
                    return Err(QueryError::at(&inner, "takes {<accumulator>: <expr>}"));
                };
                let ex = || Expr::parse(e, &format!("{inner}.{op}"));
                let acc = match op.as_str() {
                    "$sum" => Acc::Sum(ex()?),
                    "$avg" => Acc::Avg(ex()?),
                    "$min" => Acc::Min(ex()?),
                    "$max" => Acc::Max(ex()?),
                    "$first" => Acc::First(ex()?),
                    "$last" => Acc::Last(ex()?),
                    "$addToSet" => Acc::AddToSet(ex()?),
                    "$push" => Acc::Push(ex()?),
                    "$count" if e.as_object().is_some_and(|o| o.is_empty()) => Acc::Count,
                    "$count" => return Err(QueryError::at(&format!("{inner}.$count"), "takes {}")),
                    other => {
                        return Err(QueryError::at(
                            &inner,
                            format!(
                                "accumulator {other} is not supported (supported: $sum, $avg, $min, $max, $first, $last, $addToSet, $push, $count)"
                            ),
                        ));
                    }
                };
                accs.push((k.clone(), acc));
            }
            Stage::Group { id, accs }
        }
        "$count" => match arg.as_str() {
            Some(n) if !n.is_empty() && !n.starts_with('$') && !n.contains('.') => {
                Stage::Count(n.to_owned())
            }
            _ => {
                return Err(QueryError::at(
                    at,
                    "takes a field name (not empty, no $ or dot)",
                ));
            }
        },
        "$sortByCount" => Stage::SortByCount(Expr::parse(arg, at)?),
        other => {
            return Err(QueryError::at(
                at,
                format!("stage {other} is not supported (supported: {STAGES})"),
            ));
        }
    })
}

fn parse_projection(arg: &Value, at: &str) -> Result<Projection, QueryError> {
    let Some(o) = arg.as_object().filter(|o| !o.is_empty()) else {
        return Err(QueryError::at(
            at,
            "takes {\"field\": 1, ...} or {\"field\": 0, ...}",
        ));
    };
    let flag = |v: &Value| match v {
        Value::Bool(b) => Some(*b),
        Value::Number(n) if n.as_f64() == Some(0.0) => Some(false),
        Value::Number(n) if n.as_f64() == Some(1.0) => Some(true),
        _ => None,
    };
    let mut id = true;
    let (mut include, mut exclude, mut computed) = (Vec::new(), Vec::new(), Vec::new());
    for (k, v) in o {
        let inner = format!("{at}.{k}");
        let path = expr::field_path(k, &inner)?;
        match flag(v) {
            Some(keep) if k == "_id" => id = keep,
            Some(true) => include.push(path),
            Some(false) => exclude.push(path),
            None if k.contains('.') => {
                return Err(QueryError::at(
                    &inner,
                    "a computed field's name cannot contain a dot",
                ));
            }
            None => computed.push((k.clone(), Expr::parse(v, &inner)?)),
        }
    }
    if !exclude.is_empty() {
        if !include.is_empty() || !computed.is_empty() {
            return Err(QueryError::at(
                at,
                "cannot mix inclusion and exclusion (except for _id)",
            ));
        }
        if !id {
            exclude.push(vec!["_id".to_owned()]);
        }
        return Ok(Projection::Exclude(exclude));
    }
    if include.is_empty() && computed.is_empty() && !id {
        return Ok(Projection::Exclude(vec![vec!["_id".to_owned()]]));
    }
    Ok(Projection::Include {
        paths: include,
        computed,
        id,
    })
}
