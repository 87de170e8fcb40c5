//! The `rollups` collection: per-value `$inc` counters of the configured fields, and one
//! `source:<name>` summary per source that change feeds read (its stamp and the fields the
//! statistics read are copied from each event, so a change feed computes the statistics a
//! tailable feed computes).

use std::collections::HashMap;
use std::hash::BuildHasher;

use serde_json::Value;
use store::update::get_path;
use store::{Document, KeyUpdate, STAMP_FIELD, Update};

use super::IngestOptions;

/// The rollup updates of one stamped event.
pub fn rollups(doc: &Document, source: &str, o: &IngestOptions, out: &mut Vec<KeyUpdate>) {
    let mut summary = Update::inc("count", 1);
    if let Some(stamp) = doc.get(STAMP_FIELD) {
        // The stamp, without what the event itself carried under `_id`/`_tailrace` (kept in
        // the event; a summary updated on every event has no use for it).
        let mut stamp = stamp.clone();
        if let Value::Object(fields) = &mut stamp {
            fields.remove(super::validate::ORIGINAL_FIELD);
        }
        summary = summary.and_set(STAMP_FIELD, stamp);
    }
    for field in &o.summary_fields {
        // When one field lies inside another (`a` and `a.b`), a null for the outer one would
        // make setting the inner one fail: such fields are only set when present.
        let nested = o
            .summary_fields
            .iter()
            .any(|other| is_inside(field, other) || is_inside(other, field));
        match get_path(doc, field) {
            Some(v) => summary = summary.and_set(field.clone(), v.clone()),
            // An event without the field sets it to null: left alone, the summary would keep
            // the previous event's value, and change feeds would count it again (real streams
            // often lack it: Wikimedia log events have no `length`, Bluesky deletes no `langs`).
            None if !nested => summary = summary.and_set(field.clone(), Value::Null),
            None => {}
        }
    }
    out.push(KeyUpdate::new(format!("source:{source}"), summary));
    for field in &o.rollup_fields {
        match get_path(doc, field) {
            Some(Value::Array(items)) => {
                for k in items.iter().filter_map(|v| counter_key(field, v)) {
                    out.push(KeyUpdate::new(k, Update::inc("count", 1)));
                }
            }
            Some(v) => {
                if let Some(k) = counter_key(field, v) {
                    out.push(KeyUpdate::new(k, Update::inc("count", 1)));
                }
            }
            None => {}
        }
    }
}

/// The longest counter key built from an event, in bytes. A longer value (a hashtag of
/// thousands of characters, which a public stream will send one day) keeps its first bytes
/// and a hash of the whole ([`store::names::bounded_key`]): it is still counted on its own,
/// and no key built from event data reaches the store's bound ([`store::MAX_KEY_BYTES`]).
pub const COUNTER_KEY_MAX_BYTES: usize = 512;

/// The key of `field`'s counter for `value` (`hashtags:rust`): a text lowercased, a number or
/// a boolean as JSON writes it; `None` for other values; at most [`COUNTER_KEY_MAX_BYTES`]
/// (lowercasing may lengthen a text: `İ` by half). Built in one string: a long-tail field
/// such as hashtags makes several keys per event.
fn counter_key(field: &str, value: &Value) -> Option<String> {
    use std::fmt::Write as _;
    let mut key = String::with_capacity(field.len() + 24);
    key.push_str(field);
    key.push(':');
    match value {
        Value::String(s) if s.is_ascii() => {
            key.extend(s.bytes().map(|b| char::from(b.to_ascii_lowercase())));
        }
        // Unicode's lowercasing depends on context (a final sigma): the whole text at once.
        Value::String(s) => key.push_str(&s.to_lowercase()),
        Value::Number(n) => write!(key, "{n}").ok()?,
        Value::Bool(b) => key.push_str(if *b { "true" } else { "false" }),
        _ => return None,
    }
    Some(store::names::bounded_key(key, COUNTER_KEY_MAX_BYTES))
}

/// `inner` is a path strictly inside `outer` (`a.b` inside `a`).
fn is_inside(inner: &str, outer: &str) -> bool {
    inner.len() > outer.len() && inner.starts_with(outer) && inner.as_bytes()[outer.len()] == b'.'
}

/// Merges the pure-`$inc` updates of one key within a batch into one update at the place of
/// the first, its increments added: the counters end exactly where one update per event would
/// leave them, with one write and one change-log entry per key and batch instead of one per
/// event (a batch of 256 tweets carries ~900 counter updates over ~40 keys). Updates that
/// also `$set` — the `source:<name>` summary, which change feeds read once per event — are
/// kept one per event, in order.
pub fn coalesce_counters(updates: &mut Vec<KeyUpdate>) {
    coalesce_hashed(updates, &std::collections::hash_map::RandomState::new());
}

/// [`coalesce_counters`], hashing keys with `hashes`.
fn coalesce_hashed(updates: &mut Vec<KeyUpdate>, hashes: &impl BuildHasher) {
    // Each key's first counter update in `out`, found by the key's hash: no key is copied. A
    // hash shared by two keys leaves the second one's updates separate, which counts the same.
    let mut first: HashMap<u64, usize> = HashMap::new();
    let mut out: Vec<KeyUpdate> = Vec::with_capacity(updates.len());
    for u in updates.drain(..) {
        if !u.update.set.is_empty() {
            out.push(u);
            continue;
        }
        let hash = hashes.hash_one(&u.key);
        if let Some(&i) = first.get(&hash)
            && out[i].key == u.key
            && add_increments(&mut out[i].update, &u.update)
        {
            continue;
        }
        first.entry(hash).or_insert(out.len());
        out.push(u);
    }
    *updates = out;
}

/// Adds `b`'s integer increments to `a`; `false`, with `a` as it was, when they cannot be
/// added exactly (a non-integer, an overflow): such updates stay separate.
fn add_increments(a: &mut Update, b: &Update) -> bool {
    if let [(field, delta)] = b.inc.as_slice() {
        // One increment, every counter's: added in place.
        let Some(delta) = delta.as_i64() else {
            return false;
        };
        return match a.inc.iter_mut().find(|(f, _)| f == field) {
            Some((_, v)) => match v.as_i64().and_then(|v| v.checked_add(delta)) {
                Some(sum) => {
                    *v = Value::from(sum);
                    true
                }
                None => false,
            },
            None => {
                a.inc.push((field.clone(), Value::from(delta)));
                true
            }
        };
    }
    match summed(a, b) {
        Some(sum) => {
            *a = sum;
            true
        }
        None => false,
    }
}

/// `a` with `b`'s integer increments added, or `None` when they cannot be added exactly.
fn summed(a: &Update, b: &Update) -> Option<Update> {
    let mut sum = a.clone();
    for (field, delta) in &b.inc {
        let delta = delta.as_i64()?;
        match sum.inc.iter_mut().find(|(f, _)| f == field) {
            Some((_, v)) => *v = Value::from(v.as_i64()?.checked_add(delta)?),
            None => sum.inc.push((field.clone(), Value::from(delta))),
        }
    }
    Some(sum)
}

/// Names a writer's rollup updates ([`store::WriteId`]): a writer drawn at random when the
/// ingester starts, and a sequence number per update, in the order they are sent. The third
/// stage sends batches one after another and each batch's updates in order, and writes a batch
/// again only before the next one: the order a `WriteId` asks for. A clone names the same
/// updates again with the same names.
#[derive(Clone)]
pub struct UpdateNames {
    writer: u64,
    next: u64,
}

impl UpdateNames {
    /// A new writer's names, from sequence number 1.
    pub fn new() -> Self {
        UpdateNames {
            writer: rand::random(),
            next: 1,
        }
    }

    /// Names `updates`, in order, after every update named before.
    pub fn name(&mut self, updates: &mut [KeyUpdate]) {
        for u in updates {
            u.once = Some(store::WriteId {
                writer: self.writer,
                seq: self.next,
            });
            self.next += 1;
        }
    }
}

impl Default for UpdateNames {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::Duration;

    use serde_json::json;
    use store::Durability;

    use super::*;

    /// A hashtag of 22,000 × `İ` (44,000 bytes, 66,000 once lowercased) gets a counter key of
    /// at most [`COUNTER_KEY_MAX_BYTES`], counted on its own; short values are unchanged.
    #[test]
    fn counter_keys_built_from_event_data_are_bounded() {
        let huge = "İ".repeat(22_000);
        let key = counter_key("hashtags", &json!(huge)).unwrap();
        assert!(key.len() <= COUNTER_KEY_MAX_BYTES, "{} bytes", key.len());
        assert!(key.starts_with("hashtags:i̇"), "lowercased: {}", &key[..20]);
        let other = counter_key("hashtags", &json!(format!("{huge}x"))).unwrap();
        assert_ne!(key, other, "two long values stay two counters");
        assert_eq!(
            counter_key("hashtags", &json!(huge)).unwrap(),
            key,
            "the same key every time"
        );
        assert_eq!(
            counter_key("hashtags", &json!("Rust")).as_deref(),
            Some("hashtags:rust")
        );
        assert_eq!(counter_key("n", &json!(42)).as_deref(), Some("n:42"));
    }

    #[test]
    fn updates_are_named_in_order_across_batches() {
        let mut names = UpdateNames::new();
        let other = UpdateNames::new();
        let mut first = vec![KeyUpdate::new("a", Update::inc("n", 1)); 2];
        let mut second = vec![KeyUpdate::new("a", Update::inc("n", 1))];
        names.name(&mut first);
        names.name(&mut second);
        let ids: Vec<store::WriteId> = first
            .iter()
            .chain(&second)
            .map(|u| u.once.unwrap())
            .collect();
        assert_eq!(
            ids.iter().map(|id| id.seq).collect::<Vec<_>>(),
            [1, 2, 3],
            "one sequence over the batches, in order"
        );
        assert!(ids.iter().all(|id| id.writer == names.writer));
        assert_ne!(
            names.writer, other.writer,
            "each writer its own (64 random bits)"
        );
    }

    #[test]
    fn counters_are_coalesced_per_batch_and_summaries_kept() {
        let summary = |seq: u64| Update::inc("count", 1).and_set("_tailrace.seq", seq);
        let ku = |k: &str, u: Update| KeyUpdate::new(k, u);
        let mut updates = vec![
            ku("source:s", summary(1)),
            ku("lang:en", Update::inc("count", 1)),
            ku("hashtags:rust", Update::inc("count", 1)),
            ku("source:s", summary(2)),
            ku("lang:en", Update::inc("count", 1)),
            ku("lang:ja", Update::inc("count", 1)),
            ku("lang:en", Update::inc("count", 2).and_inc("n", 1)),
        ];
        coalesce_counters(&mut updates);
        assert_eq!(
            updates,
            vec![
                ku("source:s", summary(1)),
                ku("lang:en", Update::inc("count", 4).and_inc("n", 1)),
                ku("hashtags:rust", Update::inc("count", 1)),
                ku("source:s", summary(2)),
                ku("lang:ja", Update::inc("count", 1)),
            ]
        );
        let mut big = vec![
            ku("k", Update::inc("count", i64::MAX)),
            ku("k", Update::inc("count", 1)),
        ];
        coalesce_counters(&mut big);
        assert_eq!(big.len(), 2, "an overflowing sum stays two updates");
    }

    /// Keys whose hashes collide (here every key's) are never merged into each other: the
    /// first key seen keeps its place, the others' updates stay separate, and every counter
    /// ends where one update per event would leave it.
    #[test]
    fn keys_sharing_a_hash_are_not_merged() {
        #[derive(Default)]
        struct Same;
        impl std::hash::Hasher for Same {
            fn finish(&self) -> u64 {
                7
            }
            fn write(&mut self, _: &[u8]) {}
        }
        let ku = |k: &str, n: i64| KeyUpdate::new(k, Update::inc("count", n));
        let mut updates = vec![ku("a", 1), ku("b", 1), ku("a", 2), ku("b", 3), ku("a", 4)];
        coalesce_hashed(
            &mut updates,
            &std::hash::BuildHasherDefault::<Same>::default(),
        );
        assert_eq!(
            updates,
            vec![ku("a", 7), ku("b", 1), ku("b", 3)],
            "a merged, b kept apart"
        );
    }

    #[test]
    fn rollups_count_each_value_and_summarise_the_source() {
        let o = IngestOptions {
            batch_max_events: 1,
            batch_max_wait: Duration::ZERO,
            max_event_bytes: 1000,
            rollup_fields: vec!["lang".into(), "hashtags".into()],
            summary_fields: vec!["retweet_count".into(), "hashtags".into()],
            durability: Durability::Acknowledged,
            geo: Default::default(),
        };
        let doc = json!({"lang": "EN", "hashtags": ["Rust", "db"], "retweet_count": 4,
                         "_tailrace": {"source": "s", "seq": 9, "original": {"_id": 1}}});
        let mut out = Vec::new();
        rollups(doc.as_object().unwrap(), "s", &o, &mut out);
        let keys: Vec<&str> = out.iter().map(|u| u.key.as_str()).collect();
        assert_eq!(
            keys,
            vec!["source:s", "lang:en", "hashtags:rust", "hashtags:db"]
        );
        let mut summary = Document::new();
        store::update::apply(&mut summary, &out[0].update).unwrap();
        assert_eq!(summary["_tailrace"]["seq"], json!(9));
        assert!(
            summary["_tailrace"].get("original").is_none(),
            "the event's own _id stays in the event"
        );
        assert_eq!(summary["retweet_count"], json!(4));
        assert_eq!(summary["hashtags"], json!(["Rust", "db"]));
        assert_eq!(summary["count"], json!(1));
    }

    #[test]
    fn counter_keys_are_the_field_and_the_lowercased_value() {
        // What the key always was: `format!("{field}:{}", value lowercased or as JSON)`.
        let expected = |field: &str, v: &Value| match v {
            Value::String(s) => Some(format!("{field}:{}", s.to_lowercase())),
            Value::Number(n) => Some(format!("{field}:{n}")),
            Value::Bool(b) => Some(format!("{field}:{b}")),
            _ => None,
        };
        let values = json!([
            "Rust", "ALL CAPS 123", "", "ΟΔΟΣ", "Straße", "İstanbul", "東京", "👩🏽‍💻Dev",
            "mixed ASCII then Ünïcödé", 0, -17, 18446744073709551615u64, 2.5, -1e300,
            true, false, null, {"a": 1}, ["x"]
        ]);
        for v in values.as_array().unwrap() {
            assert_eq!(counter_key("tags.name", v), expected("tags.name", v), "{v}");
        }
        assert_eq!(counter_key("h", &json!("ΟΔΟΣ")).as_deref(), Some("h:οδος"));
    }

    /// A change feed reads each event's value and top-k field from the summary: an event
    /// without them must not leave the previous event's there.
    #[test]
    fn an_event_without_the_statistics_fields_clears_them_in_the_summary() {
        let o = IngestOptions {
            batch_max_events: 1,
            batch_max_wait: Duration::ZERO,
            max_event_bytes: 1000,
            rollup_fields: vec![],
            summary_fields: vec!["length.new".into(), "tags".into()],
            durability: Durability::Acknowledged,
            geo: Default::default(),
        };
        let edit = json!({"length": {"old": 10, "new": 12}, "tags": [{"name": "rust"}]});
        let log = json!({"log_type": "block"});
        let mut summary = Document::new();
        for doc in [&edit, &log] {
            let mut out = Vec::new();
            rollups(doc.as_object().unwrap(), "s", &o, &mut out);
            store::update::apply(&mut summary, &out[0].update).unwrap();
        }
        assert_eq!(
            summary["length"],
            json!({"new": null}),
            "the value of the event before is gone: {summary:?}"
        );
        assert_eq!(summary["tags"], json!(null), "{summary:?}");
        assert_eq!(summary["count"], json!(2));

        // Nested fields (`a` and `a.b`): an absent one is left alone, so the update applies.
        let nested = IngestOptions {
            summary_fields: vec!["a.b".into(), "a".into()],
            ..o
        };
        let mut summary = Document::new();
        for doc in [json!({"a": {"b": 1}}), json!({"a": 5}), json!({"x": 1})] {
            let mut out = Vec::new();
            rollups(doc.as_object().unwrap(), "s", &nested, &mut out);
            store::update::apply(&mut summary, &out[0].update)
                .unwrap_or_else(|e| panic!("{doc}: {e}"));
        }
        assert_eq!(summary["a"], json!(5));
    }
}
