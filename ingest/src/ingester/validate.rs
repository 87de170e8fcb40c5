//! What the ingester accepts as an event, and what it keeps of what it refuses.

use serde_json::{Map, Value, json};
use store::Document;

use crate::source::{Raw, RejectReason};

/// Nesting deeper than this is rejected (MongoDB's limit is 100 levels).
const MAX_DEPTH: usize = 100;
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

/// Keys must be storable by every engine: not `$`-prefixed, no `.`, no NUL; nesting bounded.
fn check_keys(doc: &Map<String, Value>, depth: usize) -> Result<(), Rejection> {
    if depth > MAX_DEPTH {
        return Err(reject(
            RejectReason::TooDeep,
            format!("nested deeper than {MAX_DEPTH} levels"),
        ));
    }
    for (k, v) in doc {
        if k.starts_with('$') || k.contains('.') || k.contains('\0') {
            return Err(reject(
                RejectReason::InvalidKey,
                format!("key {k:?}: keys may not start with $ or contain . or NUL"),
            ));
        }
        check_value(v, depth)?;
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
        assert_eq!(reason(Raw::Json(json!({"$where": 1}))), "invalid_key");
        assert_eq!(reason(Raw::Json(json!({"a": {"b.c": 1}}))), "invalid_key");
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
