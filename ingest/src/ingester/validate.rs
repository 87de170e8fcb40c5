//! What the ingester accepts as an event, and what it keeps of what it refuses.
//!
//! **Keys are stored as the world sends them.** Real streams use keys MongoDB once refused:
//! Wikimedia's `$schema`, Bluesky's `$type` and `$link`, dotted names (`facets.count`), the
//! empty key. MongoDB 5.0+ stores `$`-prefixed and dotted field names at any depth on insert
//! (its manual, "Field Names with Periods and Dollar Signs"), and the embedded engine stores
//! JSON text as it is, so both engines keep such keys unchanged. What no engine can store is
//! refused as `invalid_key`, and only that:
//! - a NUL character in a key (BSON field names are NUL-terminated C strings);
//! - a key of [`MAX_KEY_PARTS`] or more period-separated parts (MongoDB returns an error from
//!   255 on);
//!
//! and nesting deeper than [`MAX_DEPTH`] is `too_deep` (MongoDB's limit).
//!
//! Such keys can be stored but not addressed: a dotted path (`user.id`: indexes, `latest`,
//! statistics, rollups) walks nested objects, so a key that itself contains a `.` or starts
//! with `$` cannot be named by one (configuration refuses `$`-prefixed segments; see the
//! README).
//!
//! **Two top-level names are tailrace's own**: `_id` (the MongoDB engine's position of each
//! event) and `_tailrace` (the ingest stamp). An event that carries either keeps it, moved
//! under `_tailrace.original` (`{"_tailrace": {"source": .., "seq": .., "original": {"_id":
//! .., "_tailrace": ..}}}`) by [`stamp`]: nothing is lost, nothing is overwritten, and both
//! engines store the same shape.

use serde_json::{Map, Value, json};
use store::{Document, STAMP_FIELD, Stamp};

use crate::source::{Raw, RejectReason};

/// Nesting deeper than this is rejected (MongoDB's limit is 100 levels).
pub const MAX_DEPTH: usize = 100;
/// A key with this many period-separated parts or more is rejected: MongoDB limits field
/// names to fewer than 255 of them.
pub const MAX_KEY_PARTS: usize = 255;
/// The field of the stamp that keeps an event's own values of the reserved names.
pub const ORIGINAL_FIELD: &str = "original";
/// Top-level names tailrace writes itself: the MongoDB engine's position and the stamp.
const RESERVED: [&str; 2] = ["_id", STAMP_FIELD];
/// How much deeper a reserved field's value ends up (`_tailrace.original.<name>`).
const MOVED_DEPTH: usize = 2;
/// Raw bytes kept in a dead letter (the rest is dropped, the length is kept).
pub const DEAD_LETTER_RAW_BYTES: usize = 4096;

/// A record the ingester refused, with why.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejection {
    /// Machine-readable reason (metric label).
    pub reason: RejectReason,
    /// Human-readable detail.
    pub detail: String,
}

fn reject(reason: RejectReason, detail: impl Into<String>) -> Rejection {
    Rejection {
        reason,
        detail: detail.into(),
    }
}

/// Checks that a record is a JSON object the stores can hold, within the size limit.
pub fn validate(raw: Raw, max_bytes: usize) -> Result<Document, (Rejection, Vec<u8>)> {
    let (value, bytes) = match raw {
        Raw::Invalid { bytes, reason } => {
            return Err((reject(reason, "rejected by the source"), bytes));
        }
        Raw::Bytes(bytes) => {
            if bytes.len() > max_bytes {
                let d = format!("{} bytes, limit {max_bytes}", bytes.len());
                return Err((reject(RejectReason::TooLarge, d), bytes));
            }
            match serde_json::from_slice::<Value>(&bytes) {
                Ok(v) => (v, Some(bytes)),
                Err(e) => {
                    let reason = if std::str::from_utf8(&bytes).is_err() {
                        RejectReason::InvalidUtf8
                    } else {
                        RejectReason::MalformedJson
                    };
                    return Err((reject(reason, e.to_string()), bytes));
                }
            }
        }
        Raw::Json(v) => (v, None),
    };
    let raw_bytes = |v: &Value, b: Option<Vec<u8>>| {
        b.unwrap_or_else(|| serde_json::to_vec(v).unwrap_or_default())
    };
    let Value::Object(doc) = value else {
        let d = format!(
            "a JSON {} is not an event; events are objects",
            kind_of(&value)
        );
        return Err((reject(RejectReason::NotObject, d), raw_bytes(&value, bytes)));
    };
    if bytes.is_none() {
        let size = serde_json::to_vec(&doc)
            .map(|b| b.len())
            .unwrap_or(usize::MAX);
        if size > max_bytes {
            let v = Value::Object(doc);
            return Err((
                reject(
                    RejectReason::TooLarge,
                    format!("{size} bytes, limit {max_bytes}"),
                ),
                raw_bytes(&v, None),
            ));
        }
    }
    if let Err(r) = check_keys(&doc, 1) {
        let v = Value::Object(doc);
        return Err((r, raw_bytes(&v, bytes)));
    }
    Ok(doc)
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Keys must be storable by every engine (see the module doc); nesting bounded. At the top
/// level (`depth` 1), the values of the reserved names are checked at the depth [`stamp`]
/// moves them to.
fn check_keys(doc: &Map<String, Value>, depth: usize) -> Result<(), Rejection> {
    if depth > MAX_DEPTH {
        return Err(reject(
            RejectReason::TooDeep,
            format!("nested deeper than {MAX_DEPTH} levels"),
        ));
    }
    for (k, v) in doc {
        if k.contains('\0') {
            return Err(reject(
                RejectReason::InvalidKey,
                format!("key {k:?}: a key may not contain NUL (BSON keys are C strings)"),
            ));
        }
        if k.split('.').nth(MAX_KEY_PARTS - 1).is_some() {
            return Err(reject(
                RejectReason::InvalidKey,
                format!(
                    "key {:?}…: {MAX_KEY_PARTS} or more period-separated parts (MongoDB refuses it)",
                    k.chars().take(40).collect::<String>()
                ),
            ));
        }
        let moved = depth == 1 && RESERVED.contains(&k.as_str());
        check_value(v, if moved { depth + MOVED_DEPTH } else { depth })?;
    }
    Ok(())
}

fn check_value(v: &Value, depth: usize) -> Result<(), Rejection> {
    match v {
        Value::Object(o) => check_keys(o, depth + 1),
        Value::Array(items) => {
            if depth + 1 > MAX_DEPTH {
                return Err(reject(
                    RejectReason::TooDeep,
                    format!("nested deeper than {MAX_DEPTH} levels"),
                ));
            }
            items.iter().try_for_each(|i| check_value(i, depth + 1))
        }
        _ => Ok(()),
    }
}

/// Stamps a validated event: writes `stamp` under `_tailrace`, first moving the event's own
/// `_id` and `_tailrace`, if any, under `_tailrace.original` (see the module doc).
pub fn stamp(doc: &mut Document, stamp: &Stamp) {
    let mut value = stamp.to_value();
    let mut original = Map::new();
    for name in RESERVED {
        if let Some(v) = doc.remove(name) {
            original.insert(name.to_owned(), v);
        }
    }
    if !original.is_empty()
        && let Value::Object(fields) = &mut value
    {
        fields.insert(ORIGINAL_FIELD.to_owned(), Value::Object(original));
    }
    doc.insert(STAMP_FIELD.to_owned(), value);
}

/// The dead-letter document of a rejected record.
pub fn dead_letter(
    source: &str,
    rejection: &Rejection,
    bytes: &[u8],
    received_us: i64,
) -> Document {
    let kept = &bytes[..bytes.len().min(DEAD_LETTER_RAW_BYTES)];
    let doc = json!({
        "source": source,
        "reason": rejection.reason.as_str(),
        "detail": rejection.detail,
        "raw": String::from_utf8_lossy(kept),
        "raw_len": bytes.len(),
        "truncated": bytes.len() > kept.len(),
        "received_us": received_us,
    });
    match doc {
        Value::Object(d) => d,
        _ => Document::new(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn reason(raw: Raw) -> &'static str {
        validate(raw, 1000).unwrap_err().0.reason.as_str()
    }

    #[test]
    fn classifies_bad_records() {
        assert_eq!(reason(Raw::Bytes(b"{\"a\":".to_vec())), "malformed_json");
        assert_eq!(
            reason(Raw::Bytes(vec![b'"', 0xff, 0xfe, b'"'])),
            "invalid_utf8"
        );
        assert_eq!(reason(Raw::Bytes(b"[1,2]".to_vec())), "not_object");
        assert_eq!(reason(Raw::Json(json!(3))), "not_object");
        assert_eq!(reason(Raw::Bytes(vec![b' '; 1001])), "too_large");
        assert_eq!(
            reason(Raw::Json(json!({"a": "x".repeat(1000)}))),
            "too_large"
        );
        assert_eq!(reason(Raw::Json(json!({"a\u{0}b": 1}))), "invalid_key");
        assert_eq!(
            reason(Raw::Bytes(br#"{"ok": [{"nul\u0000": 1}]}"#.to_vec())),
            "invalid_key",
            "a NUL escaped in JSON, inside an array, is still a NUL"
        );
        assert_eq!(
            reason(Raw::Invalid {
                bytes: vec![],
                reason: RejectReason::Truncated
            }),
            "truncated"
        );
        let mut deep = json!(1);
        for _ in 0..101 {
            deep = json!({"d": deep});
        }
        assert_eq!(
            validate(Raw::Json(deep), 1 << 20).unwrap_err().0.reason,
            RejectReason::TooDeep
        );
        assert!(validate(Raw::Bytes(b"{\"ok\": [1, {\"x\": 2}]}".to_vec()), 1000).is_ok());
    }

    #[test]
    fn keys_as_the_world_sends_them_are_accepted_unchanged() {
        // Wikimedia's `$schema`, Bluesky's `$type`/`$link`, operator names, DBRef-like keys,
        // dotted and empty keys, every script: all stored as given, at any depth.
        let event = json!({
            "$schema": "/mediawiki/recentchange/1.0.0",
            "meta": {"dt": "2024-05-01T12:00:00Z", "domain": "en.wikipedia.org"},
            "$where": 1, "$inc": {"$set": [{"$ref": "x", "$id": 7, "$db": "d"}]},
            "facets.count": 3, "a": {"b.c": {"": {"$link": "bafkrei"}}},
            "": "empty key", ".": "a lone dot", "..": 2, "$": "$",
            "名前.姓": "山田", "emoji🏳️‍🌈.key": "flag", "עברית": "rtl",
        });
        let raw = serde_json::to_vec(&event).unwrap();
        let doc = validate(Raw::Bytes(raw), 10_000).unwrap();
        assert_eq!(
            Value::Object(doc),
            event,
            "every key kept, unchanged (parsed from bytes)"
        );
        let doc = validate(Raw::Json(event.clone()), 10_000).unwrap();
        assert_eq!(
            Value::Object(doc),
            event,
            "every key kept (handed over parsed)"
        );
    }

    #[test]
    fn keys_with_255_period_separated_parts_are_refused() {
        let parts = |n: usize| vec!["p"; n].join(".");
        let mut ok = Map::new();
        ok.insert(parts(MAX_KEY_PARTS - 1), json!(1));
        assert!(
            validate(Raw::Json(Value::Object(ok)), 10_000).is_ok(),
            "254 parts are within MongoDB's limit"
        );
        let mut bad = Map::new();
        bad.insert("x".into(), json!({ parts(MAX_KEY_PARTS): 1 }));
        let (r, _) = validate(Raw::Json(Value::Object(bad)), 10_000).unwrap_err();
        assert_eq!(r.reason, RejectReason::InvalidKey, "{}", r.detail);
        assert!(
            r.detail.len() < 200,
            "the detail quotes a prefix of the key, not all of it: {}",
            r.detail
        );
    }

    fn stamp_of(source: &str, seq: u64) -> Stamp {
        Stamp {
            source: source.into(),
            seq,
            received_us: 10,
            ingested_us: 20,
            position: None,
        }
    }

    #[test]
    fn an_events_own_id_and_stamp_move_under_original_and_nothing_is_lost() {
        let event = json!({
            "_id": {"$oid": "65f1c0ffee"},
            "_tailrace": {"seq": "theirs", "source": 17},
            "_ids": 1, "x": {"_id": 2, "_tailrace": 3},
        });
        let mut doc = validate(Raw::Json(event), 10_000).unwrap();
        stamp(&mut doc, &stamp_of("s", 5));
        assert_eq!(
            Value::Object(doc.clone()),
            json!({
                "_tailrace": {
                    "source": "s", "seq": 5, "received_us": 10, "ingested_us": 20,
                    "received": {"$date": "1970-01-01T00:00:00.000Z"},
                    "original": {
                        "_id": {"$oid": "65f1c0ffee"},
                        "_tailrace": {"seq": "theirs", "source": 17},
                    },
                },
                "_ids": 1, "x": {"_id": 2, "_tailrace": 3},
            }),
            "top-level _id and _tailrace moved; nested ones and look-alikes untouched"
        );
        assert_eq!(
            Stamp::of(&doc),
            Some(stamp_of("s", 5)),
            "readers still find the stamp"
        );
        let mut plain = validate(Raw::Json(json!({"n": 1})), 100).unwrap();
        stamp(&mut plain, &stamp_of("s", 6));
        assert!(
            plain[STAMP_FIELD].get(ORIGINAL_FIELD).is_none(),
            "no `original` when nothing was moved: {plain:?}"
        );
    }

    #[test]
    fn moved_values_are_checked_at_the_depth_they_are_stored_at() {
        let nest = |levels: usize| {
            let mut v = json!(1);
            for _ in 0..levels {
                v = json!({ "d": v });
            }
            v
        };
        // `{"a": nest(99)}`: the innermost object is at depth 100, allowed.
        assert!(validate(Raw::Json(json!({"a": nest(99)})), 1 << 20).is_ok());
        // The same value under `_id` ends up two levels deeper (`_tailrace.original._id`).
        let (r, _) = validate(Raw::Json(json!({"_id": nest(99)})), 1 << 20).unwrap_err();
        assert_eq!(r.reason, RejectReason::TooDeep, "{}", r.detail);
        assert!(validate(Raw::Json(json!({"_id": nest(97)})), 1 << 20).is_ok());
    }

    #[test]
    fn accepted_numbers_read_back_equal() {
        // Found by the validate fuzz target: without serde_json's float_roundtrip, this
        // number parsed one ulp off, and the stored JSON read back as another document.
        let bytes = br#"{"f":1.7953862697246314e308,"e":1e-320,"x":0.30000000000000004}"#;
        let doc = validate(Raw::Bytes(bytes.to_vec()), 1000).unwrap();
        let text = serde_json::to_vec(&doc).unwrap();
        let back: Map<String, Value> = serde_json::from_slice(&text).unwrap();
        assert_eq!(back, doc, "stored as {}", String::from_utf8_lossy(&text));
        assert_eq!(doc["f"].as_f64(), Some(1.7953862697246314e308));
    }

    #[test]
    fn dead_letters_keep_a_truncated_copy_and_the_length() {
        let bytes = vec![b'x'; 10_000];
        let d = dead_letter("s", &reject(RejectReason::TooLarge, "big"), &bytes, 5);
        assert_eq!(d["raw"].as_str().unwrap().len(), DEAD_LETTER_RAW_BYTES);
        assert_eq!(d["raw_len"], json!(10_000));
        assert_eq!(d["truncated"], json!(true));
        assert_eq!(
            (d["source"].as_str(), d["reason"].as_str()),
            (Some("s"), Some("too_large"))
        );
    }
}
