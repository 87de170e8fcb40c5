//! Aggregation expressions: what `$group`'s `_id` and accumulators, `$project`'s computed
//! fields and `$sortByCount` evaluate on each document.
//!
//! The subset: a field path (`"$user.lang"`, through arrays as MongoDB does: the values of
//! every element), a literal (`{"$literal": ...}` or any value that is not a `$` string or an
//! operator object), an object of expressions (a compound group key), and the operators
//! `$toDate`, `$dateTrunc` (unit second, minute, hour or day) and `$divide`. Dates are written
//! as MongoDB's extended JSON writes them (`{"$date": "2026-12-06T14:00:00.000Z"}`), which is
//! also how the MongoDB engine reads a BSON date back, so an answer reads the same from
//! either engine.

use std::borrow::Cow;

use serde_json::{Map, Number, Value};

use super::QueryError;

/// The deepest nesting of expressions inside one another.
const MAX_DEPTH: usize = 32;

/// 2000-01-01T00:00:00Z, where `$dateTrunc`'s bins start for units up to a day (MongoDB's
/// reference date).
const REFERENCE_MS: i64 = 946_684_800_000;

/// A parsed expression.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Expr {
    /// `"$a.b"`.
    Field(Vec<String>),
    /// A constant.
    Literal(Value),
    /// `{"k": <expr>, ...}`.
    Object(Vec<(String, Expr)>),
    /// `{"$toDate": <expr>}`: a number is milliseconds since the epoch, a string RFC 3339.
    ToDate(Box<Expr>),
    /// `{"$dateTrunc": {"date": <expr>, "unit": ..., "binSize": n}}`.
    DateTrunc {
        date: Box<Expr>,
        unit_ms: u64,
        bin: u64,
    },
    /// `{"$divide": [<expr>, <expr>]}`.
    Divide(Box<Expr>, Box<Expr>),
}

impl Expr {
    /// Parses the expression at `at` (a path into the pipeline, for errors).
    pub(super) fn parse(json: &Value, at: &str) -> Result<Expr, QueryError> {
        Self::parse_at(json, at, 0)
    }

    fn parse_at(json: &Value, at: &str, depth: usize) -> Result<Expr, QueryError> {
        if depth > MAX_DEPTH {
            return Err(QueryError::at(
                at,
                format!("nested deeper than {MAX_DEPTH} levels"),
            ));
        }
        match json {
            Value::String(s) if s.starts_with("$$") => Err(QueryError::at(
                at,
                format!("variables such as {s:?} are not supported; use a field path (\"$field\")"),
            )),
            Value::String(s) if s.starts_with('$') => field_path(&s[1..], at).map(Expr::Field),
            Value::Object(o) if o.keys().next().is_some_and(|k| k.starts_with('$')) => {
                if o.len() != 1 {
                    return Err(QueryError::at(
                        at,
                        "an operator object has exactly one key (the operator)",
                    ));
                }
                let (op, arg) = o.iter().next().ok_or_else(|| QueryError::at(at, "empty"))?;
                let inner = format!("{at}.{op}");
                match op.as_str() {
                    "$literal" => Ok(Expr::Literal(arg.clone())),
                    "$toDate" => Ok(Expr::ToDate(Box::new(Self::parse_at(
                        arg,
                        &inner,
                        depth + 1,
                    )?))),
                    "$divide" => match arg.as_array().map(Vec::as_slice) {
                        Some([a, b]) => Ok(Expr::Divide(
                            Box::new(Self::parse_at(a, &format!("{inner}[0]"), depth + 1)?),
                            Box::new(Self::parse_at(b, &format!("{inner}[1]"), depth + 1)?),
                        )),
                        _ => Err(QueryError::at(&inner, "takes an array of two expressions")),
                    },
                    "$dateTrunc" => Self::date_trunc(arg, &inner, depth),
                    other => Err(QueryError::at(
                        at,
                        format!(
                            "expression operator {other} is not supported (supported: $literal, $toDate, $dateTrunc, $divide, field paths)"
                        ),
                    )),
                }
            }
            Value::Object(o) => {
                let mut fields = Vec::with_capacity(o.len());
                for (k, v) in o {
                    if k.contains('.') || k.is_empty() {
                        return Err(QueryError::at(
                            at,
                            format!("field name {k:?} cannot be empty or contain a dot"),
                        ));
                    }
                    fields.push((
                        k.clone(),
                        Self::parse_at(v, &format!("{at}.{k}"), depth + 1)?,
                    ));
                }
                Ok(Expr::Object(fields))
            }
            Value::Array(_) => Err(QueryError::at(at, "array expressions are not supported")),
            other => Ok(Expr::Literal(other.clone())),
        }
    }

    fn date_trunc(arg: &Value, at: &str, depth: usize) -> Result<Expr, QueryError> {
        let Some(o) = arg.as_object() else {
            return Err(QueryError::at(
                at,
                "takes {\"date\": <expr>, \"unit\": \"minute\", \"binSize\": 1}",
            ));
        };
        if let Some(k) = o
            .keys()
            .find(|k| !["date", "unit", "binSize"].contains(&k.as_str()))
        {
            return Err(QueryError::at(
                at,
                format!("option {k} is not supported (supported: date, unit, binSize)"),
            ));
        }
        let date = o
            .get("date")
            .ok_or_else(|| QueryError::at(at, "date is required"))?;
        let unit_ms = match o.get("unit").and_then(Value::as_str) {
            Some("second") => 1_000,
            Some("minute") => 60_000,
            Some("hour") => 3_600_000,
            Some("day") => 86_400_000,
            _ => {
                return Err(QueryError::at(
                    &format!("{at}.unit"),
                    "must be \"second\", \"minute\", \"hour\" or \"day\"",
                ));
            }
        };
        let bin = match o.get("binSize") {
            None => 1,
            Some(v) => v.as_u64().filter(|b| *b >= 1).ok_or_else(|| {
                QueryError::at(&format!("{at}.binSize"), "must be a positive integer")
            })?,
        };
        Ok(Expr::DateTrunc {
            date: Box::new(Self::parse_at(date, &format!("{at}.date"), depth + 1)?),
            unit_ms,
            bin,
        })
    }

    /// Adds the field paths the expression reads (dotted) to `out`.
    pub(crate) fn fields(&self, out: &mut Vec<String>) {
        match self {
            Expr::Field(parts) => {
                let dotted = parts.join(".");
                if !dotted.is_empty() && !out.contains(&dotted) {
                    out.push(dotted);
                }
            }
            Expr::Literal(_) => {}
            Expr::Object(fields) => fields.iter().for_each(|(_, e)| e.fields(out)),
            Expr::ToDate(e) | Expr::DateTrunc { date: e, .. } => e.fields(out),
            Expr::Divide(a, b) => {
                a.fields(out);
                b.fields(out);
            }
        }
    }

    /// Adds the operators the expression uses (`$toDate`, `$dateTrunc`, `$divide`) to `out`.
    pub(crate) fn operators(&self, out: &mut Vec<&'static str>) {
        let mut add = |op| {
            if !out.contains(&op) {
                out.push(op);
            }
        };
        match self {
            Expr::Field(_) | Expr::Literal(_) => {}
            Expr::Object(fields) => fields.iter().for_each(|(_, e)| e.operators(out)),
            Expr::ToDate(e) => {
                add("$toDate");
                e.operators(out);
            }
            Expr::DateTrunc { date, .. } => {
                add("$dateTrunc");
                date.operators(out);
            }
            Expr::Divide(a, b) => {
                add("$divide");
                a.operators(out);
                b.operators(out);
            }
        }
    }

    /// The value on `doc`; `None` when it is missing (a path that reaches nothing).
    pub(super) fn eval(&self, doc: &Map<String, Value>) -> Result<Option<Value>, String> {
        Ok(self.eval_ref(doc)?.map(Cow::into_owned))
    }

    /// [`Expr::eval`], borrowing what `doc` or the expression already holds: a group's key or
    /// a date to truncate is read where it lies, and copied only when kept.
    pub(super) fn eval_ref<'a>(
        &'a self,
        doc: &'a Map<String, Value>,
    ) -> Result<Option<Cow<'a, Value>>, String> {
        let computed = match self {
            Expr::Field(parts) => return Ok(lookup_ref(doc, parts)),
            Expr::Literal(v) => return Ok(Some(Cow::Borrowed(v))),
            Expr::Object(fields) => {
                let mut out = Map::new();
                for (k, e) in fields {
                    if let Some(v) = e.eval(doc)? {
                        out.insert(k.clone(), v);
                    }
                }
                Some(Value::Object(out))
            }
            Expr::ToDate(e) => match e.eval_ref(doc)?.as_deref() {
                None | Some(Value::Null) => Some(Value::Null),
                Some(v) => Some(date_value(to_millis(v)?)?),
            },
            Expr::DateTrunc { date, unit_ms, bin } => match date.eval_ref(doc)?.as_deref() {
                None | Some(Value::Null) => Some(Value::Null),
                Some(v) => {
                    let ms = date_millis(v)
                        .ok_or_else(|| format!("$dateTrunc needs a date, found {}", kind(v)))?;
                    let bin = truncate(ms, *unit_ms, *bin)
                        .ok_or_else(|| format!("date {ms} ms is outside the years 1970 to 9999"))?;
                    Some(date_value(bin)?)
                }
            },
            Expr::Divide(a, b) => {
                let (a, b) = (a.eval(doc)?, b.eval(doc)?);
                match (a, b) {
                    (None | Some(Value::Null), _) | (_, None | Some(Value::Null)) => {
                        Some(Value::Null)
                    }
                    (Some(Value::Number(a)), Some(Value::Number(b))) => {
                        let (a, b) = (
                            a.as_f64().unwrap_or(f64::NAN),
                            b.as_f64().unwrap_or(f64::NAN),
                        );
                        if b == 0.0 {
                            return Err("$divide by zero".to_owned());
                        }
                        Number::from_f64(a / b).map(Value::Number)
                    }
                    (Some(a), Some(b)) => {
                        return Err(format!(
                            "$divide takes numbers, found {} and {}",
                            kind(&a),
                            kind(&b)
                        ));
                    }
                }
            }
        };
        Ok(computed.map(Cow::Owned))
    }
}

/// A dotted path after its `$`: non-empty parts, none starting with `$`.
pub(super) fn field_path(path: &str, at: &str) -> Result<Vec<String>, QueryError> {
    let parts: Vec<String> = path.split('.').map(str::to_owned).collect();
    if parts.iter().any(|p| p.is_empty() || p.starts_with('$')) || parts.len() > MAX_DEPTH {
        return Err(QueryError::at(
            at,
            format!("\"${path}\" is not a field path (dot-separated names, e.g. \"$user.lang\")"),
        ));
    }
    Ok(parts)
}

/// The value a path reaches, the way aggregation reads it: through an array, the values
/// reached in each element (missing ones left out), as an array.
pub(super) fn lookup(doc: &Map<String, Value>, parts: &[String]) -> Option<Value> {
    lookup_ref(doc, parts).map(Cow::into_owned)
}

/// [`lookup`], borrowed where the path meets no array.
pub(super) fn lookup_ref<'a>(
    doc: &'a Map<String, Value>,
    parts: &[String],
) -> Option<Cow<'a, Value>> {
    let (first, mut rest) = parts.split_first()?;
    let mut v = doc.get(first)?;
    while let Some((next, tail)) = rest.split_first() {
        match v {
            Value::Object(o) => v = o.get(next)?,
            Value::Array(_) => return descend(v, rest).map(Cow::Owned),
            _ => return None,
        }
        rest = tail;
    }
    Some(Cow::Borrowed(v))
}

fn descend(v: &Value, rest: &[String]) -> Option<Value> {
    let Some((first, tail)) = rest.split_first() else {
        return Some(v.clone());
    };
    match v {
        Value::Object(o) => descend(o.get(first)?, tail),
        Value::Array(items) => Some(Value::Array(
            items
                .iter()
                .filter(|i| i.is_object())
                .filter_map(|i| descend(i, rest))
                .collect(),
        )),
        _ => None,
    }
}

/// A few words for a value's type, for errors.
pub(super) fn kind(v: &Value) -> &'static str {
    crate::filter::parse::kind(v)
}

/// Milliseconds since the epoch of a date value.
pub(super) fn date_millis(v: &Value) -> Option<i64> {
    crate::date::millis(v)
}

/// `$dateTrunc` of `ms` (since the epoch) to bins of `bin` units of `unit_ms`; `None` when
/// the bin starts before the earliest `i64` (no date tailrace writes).
pub(super) fn truncate(ms: i64, unit_ms: u64, bin: u64) -> Option<i64> {
    // Bins start at MongoDB's reference date for these units, 2000-01-01: the same as the
    // epoch for one unit, not for every bin size (7 days). In i128: a `$numberLong` date may
    // lie anywhere in i64.
    let step = i128::from(unit_ms.saturating_mul(bin).max(1));
    let ms = i128::from(ms);
    i64::try_from(ms - (ms - i128::from(REFERENCE_MS)).rem_euclid(step)).ok()
}

/// `$toDate`'s reading of a value.
fn to_millis(v: &Value) -> Result<i64, String> {
    match v {
        Value::Number(n) => n
            .as_i64()
            .or_else(|| n.as_f64().filter(|f| f.is_finite()).map(|f| f as i64))
            .ok_or_else(|| format!("$toDate cannot read {n}")),
        Value::String(s) => crate::date::parse_rfc3339(s)
            .ok_or_else(|| format!("$toDate cannot read {s:?} (RFC 3339 expected)")),
        other => date_millis(other).ok_or_else(|| format!("$toDate cannot read {}", kind(other))),
    }
}

/// A date as extended JSON, to the millisecond. Dates before 1970 are refused (none of the
/// stored times are).
pub(super) fn date_value(ms: i64) -> Result<Value, String> {
    crate::date::value(ms).ok_or_else(|| format!("date {ms} ms is outside the years 1970 to 9999"))
}
