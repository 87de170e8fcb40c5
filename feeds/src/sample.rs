//! Turning stored documents and changes into what the statistics need.
//!
//! The ingester stamps every event with `_tailrace: {source, seq, received_us}`. A tailable
//! feed reads that stamp from the event; a change feed reads it from the post-image of the
//! change (the ingester copies the stamp, the value field and the top-k field into the
//! `source:<name>` rollup), so both feeds compute the same statistics from the same events.

use serde_json::Value;
use store::Document;
use store::update::get_path;

use crate::stats::EventSample;

/// The field holding the ingest stamp.
pub const STAMP: &str = "_tailrace";

/// Which fields of a document feed the statistics.
#[derive(Clone, Debug)]
pub struct Fields {
    /// The numeric field (dotted path) whose Bollinger bands are computed.
    pub value: String,
    /// The field (dotted path) whose values are counted by the top-k (a string or an array).
    pub topk: String,
}

/// The ingest stamp of a document.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stamp {
    /// The source that produced the event.
    pub source: Option<String>,
    /// Its per-source sequence number.
    pub seq: Option<u64>,
    /// When the source handed it over (µs since the epoch).
    pub received_us: Option<i64>,
}

/// Reads the ingest stamp.
pub fn stamp(doc: &Document) -> Stamp {
    let s = doc.get(STAMP).and_then(Value::as_object);
    Stamp {
        source: s
            .and_then(|s| s.get("source"))
            .and_then(Value::as_str)
            .map(str::to_string),
        seq: s.and_then(|s| s.get("seq")).and_then(Value::as_u64),
        received_us: s.and_then(|s| s.get("received_us")).and_then(Value::as_i64),
    }
}

/// Builds the statistics sample of a document; `fallback_us` is the time used when the
/// document has no ingest stamp (for a change: its commit time).
pub fn sample(doc: &Document, fields: &Fields, fallback_us: i64) -> EventSample {
    let st = stamp(doc);
    let value = get_path(doc, &fields.value).and_then(Value::as_f64);
    let keys = match get_path(doc, &fields.topk) {
        Some(Value::Array(items)) => items.iter().filter_map(key_of).collect(),
        Some(v) => key_of(v).into_iter().collect(),
        None => Vec::new(),
    };
    EventSample {
        t_us: st.received_us.unwrap_or(fallback_us),
        source: st.source,
        seq: st.seq,
        value,
        keys,
    }
}

/// A top-k key: a string, or the `text` of an object (tweet entities look like that).
fn key_of(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("text").and_then(Value::as_str).map(str::to_string),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_stamp_value_and_keys() {
        let doc = json!({
            "_tailrace": {"source": "s", "seq": 7, "received_us": 1_000_000},
            "retweet_count": 3,
            "hashtags": ["a", {"text": "b"}, 5, null]
        });
        let fields = Fields {
            value: "retweet_count".into(),
            topk: "hashtags".into(),
        };
        let s = sample(doc.as_object().unwrap(), &fields, 42);
        assert_eq!(s.t_us, 1_000_000);
        assert_eq!(s.source.as_deref(), Some("s"));
        assert_eq!(s.seq, Some(7));
        assert_eq!(s.value, Some(3.0));
        assert_eq!(s.keys, vec!["a", "b", "5"]);
    }

    #[test]
    fn unstamped_documents_use_the_fallback_time() {
        let doc = json!({"user": {"followers": 10.5}, "tag": "x"});
        let fields = Fields {
            value: "user.followers".into(),
            topk: "tag".into(),
        };
        let s = sample(doc.as_object().unwrap(), &fields, 42);
        assert_eq!((s.t_us, s.seq, s.value), (42, None, Some(10.5)));
        assert_eq!(s.keys, vec!["x"]);
    }
}
