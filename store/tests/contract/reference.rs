//! A reference evaluator for the random pipelines of `queries.rs`: naive, written apart from
//! `store::query` from MongoDB's manual, for exactly the stages and operators those pipelines
//! use. Where the two disagree, one of them misreads the manual.
//!
//! A `$sort` comes as `[[path, 1 | -1], ...]` (a `Value`'s object keeps no key order).

use std::cmp::Ordering;

use serde_json::{Map, Value, json};
use store::Document;

/// 2000-01-01T00:00:00Z: where `$dateTrunc`'s bins start.
const REFERENCE_MS: i64 = 946_684_800_000;

pub fn evaluate(docs: &[Document], stages: &[Value]) -> Vec<Value> {
    let mut docs: Vec<Value> = docs.iter().cloned().map(Value::Object).collect();
    for stage in stages {
        let (name, arg) = stage.as_object().unwrap().iter().next().unwrap();
        docs = match name.as_str() {
            "$match" => docs.into_iter().filter(|d| matches(d, arg)).collect(),
            "$group" => group(&docs, arg),
            "$sort" => {
                let keys: Vec<(String, i64)> = arg
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|p| (p[0].as_str().unwrap().to_owned(), p[1].as_i64().unwrap()))
                    .collect();
                // A stable sort: equal keys keep their order, as MongoDB's does not promise
                // but both evaluators here do.
                docs.sort_by(|a, b| {
                    for (path, dir) in &keys {
                        let o = compare(&get(a, path), &get(b, path));
                        if o != Ordering::Equal {
                            return if *dir < 0 { o.reverse() } else { o };
                        }
                    }
                    Ordering::Equal
                });
                docs
            }
            "$limit" => docs
                .into_iter()
                .take(arg.as_u64().unwrap() as usize)
                .collect(),
            "$skip" => docs
                .into_iter()
                .skip(arg.as_u64().unwrap() as usize)
                .collect(),
            "$unwind" => {
                let path = &arg.as_str().unwrap()[1..];
                let mut out = Vec::new();
                for d in docs {
                    match get(&d, path) {
                        Some(Value::Array(items)) => {
                            for item in items {
                                let mut copy = d.clone();
                                copy[path] = item;
                                out.push(copy);
                            }
                        }
                        Some(Value::Null) | None => {}
                        Some(_) => out.push(d),
                    }
                }
                out
            }
            "$sortByCount" => {
                let by = json!({"_id": arg, "count": {"$sum": 1}});
                let mut out = group(&docs, &by);
                out.sort_by(|a, b| {
                    b["count"]
                        .as_i64()
                        .cmp(&a["count"].as_i64())
                        .then_with(|| compare(&Some(a["_id"].clone()), &Some(b["_id"].clone())))
                });
                out
            }
            "$project" => docs
                .iter()
                .map(|d| {
                    let mut out = Map::new();
                    out.insert("_id".into(), d["_id"].clone());
                    for (path, _) in arg.as_object().unwrap() {
                        if let Some(v) = get(d, path) {
                            let (first, rest) = path.split_once('.').unwrap_or((path, ""));
                            if rest.is_empty() {
                                out.insert(first.into(), v);
                            } else {
                                out.entry(first.to_owned())
                                    .or_insert_with(|| json!({}))
                                    .as_object_mut()
                                    .unwrap()
                                    .insert(rest.into(), v);
                            }
                        }
                    }
                    Value::Object(out)
                })
                .collect(),
            "$count" => {
                if docs.is_empty() {
                    vec![]
                } else {
                    vec![json!({arg.as_str().unwrap(): docs.len()})]
                }
            }
            other => panic!("the reference has no {other}"),
        };
    }
    docs
}

/// The value at a dotted path through objects (the generated paths cross no array).
fn get(doc: &Value, path: &str) -> Option<Value> {
    let mut v = doc;
    for part in path.split('.') {
        v = v.as_object()?.get(part)?;
    }
    Some(v.clone())
}

fn date_ms(v: &Value) -> Option<i64> {
    store::date::millis(v)
}

/// MongoDB's order of the types these documents hold: missing and null, numbers, strings,
/// objects, arrays, booleans, dates.
fn rank(v: &Option<Value>) -> u8 {
    match v {
        None | Some(Value::Null) => 0,
        Some(Value::Number(_)) => 1,
        Some(Value::String(_)) => 2,
        Some(v) if date_ms(v).is_some() => 6,
        Some(Value::Object(_)) => 3,
        Some(Value::Array(_)) => 4,
        Some(Value::Bool(_)) => 5,
    }
}

fn compare(a: &Option<Value>, b: &Option<Value>) -> Ordering {
    let (ra, rb) = (rank(a), rank(b));
    if ra != rb {
        return ra.cmp(&rb);
    }
    match (a.as_ref(), b.as_ref()) {
        (Some(Value::Number(x)), Some(Value::Number(y))) => x
            .as_f64()
            .unwrap()
            .partial_cmp(&y.as_f64().unwrap())
            .unwrap(),
        (Some(Value::String(x)), Some(Value::String(y))) => x.as_bytes().cmp(y.as_bytes()),
        (Some(x), Some(y)) if rank(a) == 6 => date_ms(x).cmp(&date_ms(y)),
        // Field by field: the name, then the value (these keys sort as they were written).
        (Some(Value::Object(x)), Some(Value::Object(y))) => {
            for ((kx, vx), (ky, vy)) in x.iter().zip(y.iter()) {
                let o = kx
                    .cmp(ky)
                    .then_with(|| compare(&Some(vx.clone()), &Some(vy.clone())));
                if o != Ordering::Equal {
                    return o;
                }
            }
            x.len().cmp(&y.len())
        }
        _ => Ordering::Equal,
    }
}

fn matches(doc: &Value, filter: &Value) -> bool {
    filter.as_object().unwrap().iter().all(|(k, cond)| {
        if k == "$and" {
            return cond.as_array().unwrap().iter().all(|f| matches(doc, f));
        }
        let v = get(doc, k);
        match cond.as_object() {
            Some(ops) if ops.keys().all(|o| o.starts_with('$')) && date_ms(cond).is_none() => {
                ops.iter().all(|(op, operand)| match op.as_str() {
                    "$in" => operand.as_array().unwrap().iter().any(|x| equal(&v, x)),
                    "$gt" | "$gte" | "$lt" | "$lte" => {
                        let want = Some(operand.clone());
                        // Only values of the operand's type compare.
                        rank(&v) == rank(&want) && {
                            let o = compare(&v, &want);
                            match op.as_str() {
                                "$gt" => o == Ordering::Greater,
                                "$gte" => o != Ordering::Less,
                                "$lt" => o == Ordering::Less,
                                _ => o != Ordering::Greater,
                            }
                        }
                    }
                    other => panic!("the reference has no {other}"),
                })
            }
            _ => equal(&v, cond),
        }
    })
}

/// Equality as a filter means it: the value, or an element of an array value.
fn equal(v: &Option<Value>, want: &Value) -> bool {
    match v {
        Some(Value::Array(items)) => items.contains(want) || v.as_ref() == Some(want),
        Some(x) => x == want,
        None => want.is_null(),
    }
}

/// The value of a group key or accumulator expression on `doc`; `None` when missing.
fn expr(doc: &Value, e: &Value) -> Option<Value> {
    match e {
        Value::String(s) if s.starts_with('$') => get(doc, &s[1..]),
        Value::Object(o) if o.contains_key("$dateTrunc") => {
            let spec = &o["$dateTrunc"];
            let ms = date_ms(&expr(doc, &spec["date"])?)?;
            let unit = match spec["unit"].as_str().unwrap() {
                "second" => 1_000,
                "minute" => 60_000,
                "hour" => 3_600_000,
                _ => 86_400_000,
            };
            let step = unit * spec.get("binSize").and_then(Value::as_i64).unwrap_or(1);
            store::date::value(ms - (ms - REFERENCE_MS).rem_euclid(step))
        }
        Value::Object(o) => Some(Value::Object(
            o.iter()
                .map(|(k, v)| (k.clone(), expr(doc, v).unwrap_or(Value::Null)))
                .collect(),
        )),
        literal => Some(literal.clone()),
    }
}

fn group(docs: &[Value], spec: &Value) -> Vec<Value> {
    let spec = spec.as_object().unwrap();
    // Groups in the order their first document came: a list, searched (it is a reference).
    let mut groups: Vec<(Value, Vec<&Value>)> = Vec::new();
    for d in docs {
        let key = expr(d, &spec["_id"]).unwrap_or(Value::Null);
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, members)) => members.push(d),
            None => groups.push((key, vec![d])),
        }
    }
    groups
        .into_iter()
        .map(|(key, members)| {
            let mut out = Map::new();
            out.insert("_id".into(), key);
            for (name, acc) in spec.iter().filter(|(k, _)| *k != "_id") {
                let (op, e) = acc.as_object().unwrap().iter().next().unwrap();
                let values: Vec<Option<Value>> = members.iter().map(|d| expr(d, e)).collect();
                let present: Vec<&Value> =
                    values.iter().flatten().filter(|v| !v.is_null()).collect();
                let numbers: Vec<&serde_json::Number> = values
                    .iter()
                    .flatten()
                    .filter_map(|v| v.as_number())
                    .collect();
                out.insert(
                    name.clone(),
                    match op.as_str() {
                        "$sum" if numbers.iter().all(|n| n.is_i64()) => {
                            json!(numbers.iter().map(|n| n.as_i64().unwrap()).sum::<i64>())
                        }
                        "$sum" => json!(numbers.iter().map(|n| n.as_f64().unwrap()).sum::<f64>()),
                        "$avg" if numbers.is_empty() => Value::Null,
                        "$avg" => json!(
                            numbers.iter().map(|n| n.as_f64().unwrap()).sum::<f64>()
                                / numbers.len() as f64
                        ),
                        "$min" | "$max" => {
                            let pick = present.iter().copied().reduce(|best, v| {
                                let o = compare(&Some(v.clone()), &Some(best.clone()));
                                let better = if op == "$min" {
                                    o == Ordering::Less
                                } else {
                                    o == Ordering::Greater
                                };
                                if better { v } else { best }
                            });
                            pick.cloned().unwrap_or(Value::Null)
                        }
                        "$first" => values[0].clone().unwrap_or(Value::Null),
                        "$last" => values[values.len() - 1].clone().unwrap_or(Value::Null),
                        "$addToSet" => {
                            let mut set: Vec<Value> = Vec::new();
                            for v in values.iter().flatten() {
                                if !set.contains(v) {
                                    set.push(v.clone());
                                }
                            }
                            Value::Array(set)
                        }
                        "$count" => json!(members.len()),
                        other => panic!("the reference has no {other}"),
                    },
                );
            }
            Value::Object(out)
        })
        .collect()
}
