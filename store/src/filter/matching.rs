//! Matching a document against parsed clauses, with MongoDB's semantics: paths through
//! arrays, type brackets, numbers compared across integer and float.

use std::cmp::Ordering;

use serde_json::{Number, Value};

use super::{Clause, CmpOp, Op};
use crate::{Document, date};

pub(super) fn all_trivial(clauses: &[Clause]) -> bool {
    clauses.iter().all(|c| match c {
        Clause::And(subs) => subs.iter().all(|s| all_trivial(s)),
        Clause::Or(subs) => subs.iter().any(|s| all_trivial(s)),
        Clause::Field { .. } => false,
    })
}

pub(super) fn clauses_match(clauses: &[Clause], doc: &Document) -> bool {
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
        // Dates by instant, however each is spelled.
        (Value::Object(_), Value::Object(_)) => Some(date::millis(a)?.cmp(&date::millis(b)?)),
        _ => None,
    }
}

/// Deep equality with MongoDB's rules: numbers by value across integer and float, arrays
/// element by element, objects key by key in order.
pub(crate) fn values_equal(a: &Value, b: &Value) -> bool {
    if let (Some(x), Some(y)) = (date::millis(a), date::millis(b)) {
        return x == y;
    }
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
pub(crate) fn number_cmp(a: &Number, b: &Number) -> Ordering {
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
