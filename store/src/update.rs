//! Applying `$inc` / `$set` updates to JSON documents, by dotted path.
//!
//! The embedded engine applies updates itself; the MongoDB engine sends them to the server.
//! Both must agree, so the semantics follow MongoDB's: a missing field counts as 0 for `$inc`,
//! integers stay integers unless a float is involved, and intermediate objects are created.

use serde_json::{Number, Value};

use crate::{Document, StoreError, Update};

/// The value at a dotted path (`user.screen_name`), if any.
pub fn get_path<'a>(doc: &'a Document, path: &str) -> Option<&'a Value> {
    let mut parts = path.split('.');
    let mut cur = doc.get(parts.next()?)?;
    for part in parts {
        cur = cur.as_object()?.get(part)?;
    }
    Some(cur)
}

/// Checks a dotted field path as configuration names one (`user.screen_name`): non-empty
/// segments, none starting with `$` (MongoDB reads those as operators, and cannot index them).
/// Events may still hold such fields (they are stored unchanged); they cannot be addressed.
pub fn check_path(path: &str) -> Result<(), String> {
    if path.is_empty() || path.split('.').any(str::is_empty) {
        return Err(format!(
            "{path:?} is not a field path (dot-separated names, e.g. \"user.id\")"
        ));
    }
    if let Some(segment) = path.split('.').find(|s| s.starts_with('$')) {
        return Err(format!(
            "{path:?}: {segment:?} starts with $, which MongoDB reads as an operator and cannot \
             index; events keep such fields, but no path can address them"
        ));
    }
    Ok(())
}

/// The object holding the last segment of `path`, created on the way when absent. A segment
/// that exists is followed without allocating (an update of a hot key's nested field runs
/// once per event in the writer).
fn parent_mut<'a>(
    doc: &'a mut Document,
    path: &'a str,
) -> Result<(&'a mut Document, &'a str), StoreError> {
    let (parents, last) = match path.rsplit_once('.') {
        Some((parents, last)) => (Some(parents), last),
        None => (None, path),
    };
    if last.is_empty() {
        return Err(StoreError::Invalid(format!("empty field path {path:?}")));
    }
    let mut cur = doc;
    for part in parents.into_iter().flat_map(|p| p.split('.')) {
        if !cur.contains_key(part) {
            cur.insert(part.to_string(), Value::Object(Document::new()));
        }
        cur = cur
            .get_mut(part)
            .and_then(Value::as_object_mut)
            .ok_or_else(|| {
                StoreError::Invalid(format!("cannot update {path:?}: {part:?} is not an object"))
            })?;
    }
    Ok((cur, last))
}

/// Stores `value` under `field`, reusing the key's allocation when it is already there.
fn put(parent: &mut Document, field: &str, value: Value) {
    match parent.get_mut(field) {
        Some(slot) => *slot = value,
        None => {
            parent.insert(field.to_string(), value);
        }
    }
}

/// Adds two JSON numbers the way MongoDB's `$inc` does.
fn add(a: &Number, b: &Number) -> Option<Number> {
    if let (Some(x), Some(y)) = (a.as_i64(), b.as_i64()) {
        return x.checked_add(y).map(Number::from);
    }
    Number::from_f64(a.as_f64()? + b.as_f64()?)
}

/// Applies `update` to `doc` in place.
pub fn apply(doc: &mut Document, update: &Update) -> Result<(), StoreError> {
    apply_owned(doc, update.clone())
}

/// [`apply`], moving the `$set` values into `doc` instead of copying them (the embedded
/// writer owns each update it applies, and a source's summary sets its stamp and fields on
/// every event).
pub fn apply_owned(doc: &mut Document, update: Update) -> Result<(), StoreError> {
    for (path, delta) in &update.inc {
        inc(doc, path, delta)?;
    }
    for (path, value) in update.set {
        let (parent, field) = parent_mut(doc, &path)?;
        put(parent, field, value);
    }
    Ok(())
}

/// What [`apply_owned`] makes of a copy of `doc`, without copying the fields the update
/// replaces whole: a top-level `$set` that no other path of the update reads through. The
/// embedded writer keeps the document before the update (the change carries it), so it updates
/// a copy; a source's summary sets its stamp and fields on every event, and copying them only
/// to drop them was most of that copy.
pub fn apply_to_copy(doc: &Document, update: Update) -> Result<Document, StoreError> {
    let replaced = |field: &str| {
        // A stored key may hold a dot (events keep such keys); no path can name it.
        !field.contains('.')
            && update.set.iter().any(|(p, _)| p == field)
            && update.inc.iter().all(|(p, _)| !reads(p, field))
            && update
                .set
                .iter()
                .all(|(p, _)| p == field || !reads(p, field))
    };
    let mut copy = if doc.keys().any(|k| replaced(k)) {
        doc.iter()
            .filter(|(k, _)| !replaced(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    } else {
        doc.clone()
    };
    apply_owned(&mut copy, update)?;
    Ok(copy)
}

/// `path` reads the current value of the top-level `field`: it is `field`, or goes through it.
fn reads(path: &str, field: &str) -> bool {
    path.split('.').next() == Some(field)
}

/// `$inc` of one path.
fn inc(doc: &mut Document, path: &str, delta: &Value) -> Result<(), StoreError> {
    let delta = delta
        .as_number()
        .ok_or_else(|| StoreError::Invalid(format!("$inc of {path:?} by a non-number {delta}")))?;
    let (parent, field) = parent_mut(doc, path)?;
    let next = match parent.get(field) {
        None | Some(Value::Null) => delta.clone(),
        Some(Value::Number(cur)) => add(cur, delta)
            .ok_or_else(|| StoreError::Invalid(format!("$inc of {path:?} overflows")))?,
        Some(other) => {
            return Err(StoreError::Invalid(format!(
                "cannot $inc {path:?}: it holds a non-number {other}"
            )));
        }
    };
    put(parent, field, Value::Number(next));
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn doc(v: Value) -> Document {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn inc_creates_missing_fields_and_nested_objects() {
        let mut d = Document::new();
        apply(&mut d, &Update::inc("a.b", 2).and_inc("c", 1)).unwrap();
        apply(&mut d, &Update::inc("a.b", 3)).unwrap();
        assert_eq!(Value::Object(d), json!({"a": {"b": 5}, "c": 1}));
    }

    #[test]
    fn inc_mixes_integers_and_floats_like_mongodb() {
        let mut d = doc(json!({"n": 1}));
        let u = Update {
            inc: vec![("n".into(), json!(0.5))],
            set: vec![],
        };
        apply(&mut d, &u).unwrap();
        assert_eq!(d["n"], json!(1.5));
    }

    #[test]
    fn inc_of_a_string_is_an_error_that_names_the_field() {
        let mut d = doc(json!({"n": "x"}));
        let err = apply(&mut d, &Update::inc("n", 1)).unwrap_err().to_string();
        assert!(
            err.contains("\"n\""),
            "error should name the field, got {err}"
        );
    }

    #[test]
    fn set_overwrites_and_get_path_reads_nested() {
        let mut d = doc(json!({"user": {"name": "a"}}));
        apply(&mut d, &Update::default().and_set("user.name", "b")).unwrap();
        assert_eq!(get_path(&d, "user.name"), Some(&json!("b")));
        assert_eq!(get_path(&d, "user.missing"), None);
        assert_eq!(get_path(&d, "user.name.deeper"), None);
    }

    /// Nested sets and increments, intermediate objects created, existing keys overwritten,
    /// values with `$`-prefixed and dotted keys and any script stored as given; a failing
    /// update names its path.
    #[test]
    fn apply_owned_sets_in_place_and_names_the_path_it_cannot_update() {
        let start = doc(json!({"count": 2, "s": {"a": 1, "b": [1]}, "n": "x", "z": 0}));
        let mut d = start.clone();
        apply_owned(
            &mut d,
            Update::inc("count", 3)
                .and_set("s.b", json!(["#🦀", "تاريخ"]))
                .and_set("s.c.d", json!({"$k": 1, "a.b": 2}))
                .and_inc("m.x", 1),
        )
        .unwrap();
        assert_eq!(
            Value::Object(d),
            json!({"count": 5, "s": {"a": 1, "b": ["#🦀", "تاريخ"], "c": {"d": {"$k": 1, "a.b": 2}}},
                   "n": "x", "z": 0, "m": {"x": 1}})
        );
        for (update, path) in [
            (Update::inc("n", 1), "\"n\""),
            (Update::default().and_set("n.deeper", 1), "\"n.deeper\""),
            (Update::default().and_set("", 1), "\"\""),
            (Update::default().and_set("a.", 1), "\"a.\""),
        ] {
            let mut d = start.clone();
            let err = apply_owned(&mut d, update).unwrap_err().to_string();
            assert!(err.contains(path), "{err} should name {path}");
        }
        let mut d = start.clone();
        apply_owned(&mut d, Update::default().and_set("a..b", 1)).unwrap();
        assert_eq!(d["a"], json!({"": {"b": 1}}));
    }

    /// `apply_to_copy` gives what updating a whole copy gives, error or document, whatever
    /// paths the update holds: the fields it leaves out of the copy are ones no operation reads.
    /// Stored keys with dots, `$`, empty and nested names; paths that set a field and then go
    /// through it, increment it, or set it twice.
    #[test]
    fn apply_to_copy_matches_updating_a_whole_copy() {
        use proptest::prelude::*;
        let key = prop::sample::select(vec!["a", "b", "a.b", "$x", "", "_id"]);
        let leaf = prop_oneof![
            any::<i32>().prop_map(Value::from),
            Just(json!("s 🦀 تاريخ")),
            Just(json!([1, "x"])),
            Just(Value::Null),
        ];
        let value = leaf.prop_recursive(2, 8, 3, move |inner| {
            prop::collection::btree_map(
                prop::sample::select(vec!["a", "b", "c.d", ""]).prop_map(String::from),
                inner,
                0..3,
            )
            .prop_map(|m| Value::Object(m.into_iter().collect()))
        });
        let docs = prop::collection::btree_map(key.prop_map(String::from), value.clone(), 0..5);
        let path = prop::sample::select(vec![
            "a", "b", "a.b", "a.c", "b.a", "$x", "", "a..b", "c", "a.", "_id",
        ]);
        let incs = prop::collection::vec((path.clone(), -3i64..3), 0..3);
        let sets = prop::collection::vec((path, value), 0..4);
        let same = |doc: Document, update: Update| {
            let mut whole = doc.clone();
            let expected = apply_owned(&mut whole, update.clone()).map(|()| whole);
            (
                format!("{:?}", apply_to_copy(&doc, update)),
                format!("{expected:?}"),
            )
        };
        // The cases a wrong rule gets wrong, each once: a dotted stored key beside a path that
        // goes through its first part; a path through a field, then the field set; a field
        // incremented, then set.
        for (d, update) in [
            (
                json!({"a.b": 1, "a": {"b": 2}}),
                Update::default().and_set("a.b", 3),
            ),
            (json!({"a.b": 1}), Update::default().and_set("a.b", 3)),
            (
                json!({"a": 5}),
                Update::default().and_set("a.b", 1).and_set("a", 2),
            ),
            (json!({"a": "x"}), Update::inc("a", 1).and_set("a", 2)),
            (
                json!({"a": 1, "b": [1]}),
                Update::inc("a", 1).and_set("b", json!(["x"])),
            ),
        ] {
            let (got, expected) = same(doc(d), update);
            assert_eq!(got, expected);
        }
        proptest!(ProptestConfig::with_cases(2000), |(d in docs, incs in incs, sets in sets)| {
            let doc: Document = d.into_iter().collect();
            let update = Update {
                inc: incs.into_iter().map(|(p, n)| (p.to_string(), Value::from(n))).collect(),
                set: sets.into_iter().map(|(p, v)| (p.to_string(), v)).collect(),
            };
            let mut whole = doc.clone();
            let expected = apply_owned(&mut whole, update.clone()).map(|()| whole);
            let got = apply_to_copy(&doc, update);
            prop_assert_eq!(format!("{got:?}"), format!("{expected:?}"));
        });
    }
}
