//! The event validator (`ingest::ingester::validate`) and the dead letter of what it refuses.
//!
//! Input: a byte for the size limit, then one record's bytes. Each input is validated twice:
//! as the bytes a byte-stream source hands over (`Raw::Bytes`), and, when they parse, as the
//! value a source that parses itself hands over (`Raw::Json`). Properties:
//! - an accepted document serializes to JSON that parses back to the same document, within the
//!   size limit, with no key any engine refuses (NUL, or 255 period-separated parts or more:
//!   `$`-prefixed and dotted keys are stored as sent) and no nesting past 100 levels, counted
//!   where the document is stored (a top-level `_id` or `_tailrace` moves two levels down,
//!   under `_tailrace.original`);
//! - a refusal keeps the record's bytes exactly (they become the dead letter), and its reason
//!   is true of them: `invalid_utf8` only for bytes that are not UTF-8, `malformed_json` only
//!   for UTF-8 that does not parse, `not_object` for JSON that is not an object, `too_large`
//!   only over the limit;
//! - bytes and their parsed value get the same verdict (the value's size is measured on its
//!   serialization, so only `too_large` may differ);
//! - the dead letter is a JSON object that serializes and parses, with `raw_len` the record's
//!   length and at most `DEAD_LETTER_RAW_BYTES` of it kept;
//! - an accepted document's place (`ingest::geo`, by a tweet's paths and by Wikimedia's preset)
//!   is bounded whatever the document holds: a position in range, a precision that placed it,
//!   a country among the ISO codes, four keys none starting with `$`, numbers as doubles.
#![no_main]

use ingest::geo::{GeoConfig, Precision, country};
use ingest::ingester::validate::{DEAD_LETTER_RAW_BYTES, MAX_KEY_PARTS, dead_letter, validate};
use ingest::source::{Raw, RejectReason};
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value};
use tailrace_fuzz::Knobs;

/// Whether some key is one an engine refuses, and how deep the value nests once stored (an
/// object or an array is one level, as the validator counts; the values of a top-level `_id`
/// and `_tailrace` are stored two levels deeper, under `_tailrace.original`).
fn survey(v: &Value, depth: usize) -> (bool, usize) {
    let refused = |k: &str| k.contains('\0') || k.split('.').count() >= MAX_KEY_PARTS;
    match v {
        Value::Object(o) => o.iter().fold((false, depth + 1), |(bad, d), (k, v)| {
            let moved = depth == 0 && (k == "_id" || k == "_tailrace");
            let (b, dv) = survey(v, depth + 1 + if moved { 2 } else { 0 });
            (bad || b || refused(k), d.max(dv))
        }),
        Value::Array(items) => items.iter().fold((false, depth + 1), |(bad, d), v| {
            let (b, dv) = survey(v, depth + 1);
            (bad || b, d.max(dv))
        }),
        _ => (false, depth),
    }
}

fn check_accepted(doc: &Map<String, Value>, max: usize, what: &str) {
    let text = serde_json::to_vec(doc).expect("an accepted document serializes");
    let back: Value = serde_json::from_slice(&text).expect("an accepted document's JSON parses");
    assert_eq!(
        back,
        Value::Object(doc.clone()),
        "{what}: the JSON parses to another document"
    );
    let (bad_key, depth) = survey(&back, 0);
    assert!(!bad_key, "{what}: accepted a key an engine refuses: {back}");
    assert!(depth <= 100, "{what}: accepted {depth} levels of nesting");
    if what == "value" {
        assert!(
            text.len() <= max,
            "{what}: accepted {} bytes over limit {max}",
            text.len()
        );
    }
}

/// Places `doc` by a tweet's paths and by Wikimedia's (the language of `meta.domain`), and
/// checks that what is stamped is bounded.
fn check_place(doc: &Map<String, Value>) {
    let tweet = GeoConfig {
        point: Some("coordinates".into()),
        place: Some("place.bounding_box".into()),
        country: Some("place.country_code".into()),
        language: Some("lang".into()),
    };
    let wiki = GeoConfig {
        language: Some("meta.domain".into()),
        ..GeoConfig::default()
    };
    for rules in [tweet, wiki] {
        let Some(geo) = rules.locate(doc) else {
            continue;
        };
        assert!(
            (-180.0..=180.0).contains(&geo.lon) && (-90.0..=90.0).contains(&geo.lat),
            "a place out of range: {geo:?}"
        );
        assert_ne!(geo.precision, Precision::None, "{geo:?}");
        if let Some(code) = geo.country {
            assert!(
                country(code).is_some(),
                "a country outside the ISO codes: {geo:?}"
            );
        }
        let v = geo.to_value();
        let o = v.as_object().expect("a place is an object");
        assert!(o.len() == 4 && o.keys().all(|k| !k.starts_with('$')), "{v}");
        assert!(v["lon"].is_f64() && v["lat"].is_f64(), "{v}");
    }
}

fuzz_target!(|input: &[u8]| {
    let mut knobs = Knobs::new(input);
    let max = knobs.limit(1 << 20) * 16;
    let bytes = knobs.rest();

    let parsed: Option<Value> = serde_json::from_slice(bytes).ok();
    let as_bytes = validate(Raw::Bytes(bytes.to_vec()), max);
    match &as_bytes {
        Ok(doc) => {
            assert!(
                bytes.len() <= max,
                "accepted {} bytes over limit {max}",
                bytes.len()
            );
            check_accepted(doc, max, "bytes");
            check_place(doc);
            assert_eq!(
                parsed.as_ref(),
                Some(&Value::Object(doc.clone())),
                "the document is not what the bytes parse to"
            );
        }
        Err((rejection, kept)) => {
            assert_eq!(
                kept.as_slice(),
                bytes,
                "the dead letter does not keep the record's bytes"
            );
            let utf8 = std::str::from_utf8(bytes).is_ok();
            match rejection.reason {
                RejectReason::TooLarge => assert!(bytes.len() > max, "too_large under the limit"),
                RejectReason::InvalidUtf8 => assert!(!utf8, "invalid_utf8 for UTF-8"),
                RejectReason::MalformedJson => {
                    assert!(utf8 && parsed.is_none(), "malformed_json for parsable JSON")
                }
                RejectReason::NotObject => {
                    assert!(
                        matches!(parsed, Some(ref v) if !v.is_object()),
                        "not_object for an object"
                    )
                }
                RejectReason::InvalidKey => assert!(
                    parsed.as_ref().is_some_and(|v| survey(v, 0).0),
                    "invalid_key without such a key"
                ),
                RejectReason::TooDeep => assert!(
                    parsed.as_ref().is_some_and(|v| survey(v, 0).1 > 100),
                    "too_deep for shallow JSON"
                ),
                other => panic!("a reason the validator does not give: {}", other.as_str()),
            }
            let letter = dead_letter("fuzz", rejection, kept, 1);
            let text = serde_json::to_vec(&letter).expect("a dead letter serializes");
            let back: Value = serde_json::from_slice(&text).expect("a dead letter's JSON parses");
            assert_eq!(
                back["raw_len"],
                Value::from(bytes.len()),
                "raw_len is not the length"
            );
            assert_eq!(
                back["truncated"],
                Value::Bool(bytes.len() > DEAD_LETTER_RAW_BYTES),
                "truncated flag wrong"
            );
            let raw = back["raw"].as_str().expect("raw is a string");
            let kept_bytes = bytes.len().min(DEAD_LETTER_RAW_BYTES);
            assert_eq!(
                raw,
                String::from_utf8_lossy(&bytes[..kept_bytes]),
                "raw is not the record's first bytes"
            );
        }
    }

    // The parsed value, as a source that parses itself hands it over.
    if let Some(value) = parsed {
        let as_value = validate(Raw::Json(value.clone()), max);
        match (&as_bytes, &as_value) {
            (_, Ok(doc)) => check_accepted(doc, max, "value"),
            (Ok(_), Err((r, _))) => assert_eq!(
                r.reason,
                RejectReason::TooLarge,
                "bytes accepted, their value refused as {}",
                r.reason.as_str()
            ),
            (Err((a, _)), Err((b, _))) => assert!(
                a.reason == b.reason
                    || a.reason == RejectReason::TooLarge
                    || b.reason == RejectReason::TooLarge,
                "bytes refused as {}, their value as {}",
                a.reason.as_str(),
                b.reason.as_str()
            ),
        }
        if let (Err((a, _)), Ok(_)) = (&as_bytes, &as_value) {
            assert_eq!(
                a.reason,
                RejectReason::TooLarge,
                "bytes refused as {}, their value accepted",
                a.reason.as_str()
            );
        }
    }
});
