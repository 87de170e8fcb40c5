//! Parsing a filter: MongoDB's query syntax read into clauses, every bound checked, every
//! error naming where it is.

use serde_json::{Map, Value};

use crate::date;

use super::{
    Clause, CmpOp, FIELD_OPERATORS, FieldPath, FilterError, MAX_BYTES, MAX_DEPTH, MAX_VALUES, Op,
    error,
};

/// Counts what a filter holds while it is parsed, to enforce the bounds.
#[derive(Default)]
pub(super) struct Parser {
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
pub(crate) fn kind(v: &Value) -> &'static str {
    if date::is_date(v) {
        return "a date";
    }
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
    pub(super) fn filter(
        &mut self,
        v: &Value,
        at: &str,
        depth: usize,
    ) -> Result<Vec<Clause>, FilterError> {
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
            // A date (`{"$date": "..."}`) is a value, not an operator.
            Value::Object(m) if m.keys().any(|k| k.starts_with('$')) && !date::is_date(v) => {
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
                    if matches!(operand, Value::Array(_) | Value::Object(_))
                        && !date::is_date(operand)
                    {
                        return Err(error(
                            &here,
                            format!(
                                "{name} compares with a number, string, boolean, date \
                                 ({{\"$date\": \"2026-12-06T14:00:00Z\"}}) or null, not {}",
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
            Value::Object(_) if date::is_date(v) => {}
            Value::Object(m) if m.contains_key("$date") && m.len() == 1 => {
                return Err(error(
                    &key_path(at, "$date"),
                    "a date is {\"$date\": \"<RFC 3339>\"}, as in \
                     {\"$date\": \"2026-12-06T14:00:00Z\"}",
                ));
            }
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
