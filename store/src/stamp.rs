//! The ingest stamp: what the ingester writes into every event it stores, and what the feeds
//! read back to measure latency and completeness.
//!
//! One type for both sides, so the writer and the readers cannot drift apart. It is stored
//! under [`STAMP_FIELD`] in each event, and copied into the `source:<name>` rollup so change
//! feeds read the same stamp as tailable feeds.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::Document;

/// The field of a stored event that holds its [`Stamp`].
pub const STAMP_FIELD: &str = "_tailrace";

/// The path of an event's received time as a date (`{"$date": ...}`, a BSON date on
/// MongoDB): what a query's time range filters on (`{"_tailrace.received": {"$gte": ...}}`).
pub const RECEIVED_PATH: &str = "_tailrace.received";

/// The indexed path of the stamp's source (used to recover each source's sequence).
pub const STAMP_SOURCE_PATH: &str = "_tailrace.source";

/// The field of the stamp where the ingester writes where an event comes from, when it can
/// tell: `{"lon": .., "lat": .., "precision": "point" | "place" | "country" | "language",
/// "country": "JP" | null}` (`ingest::geo`). Absent when nothing placed the event; not part of
/// [`Stamp`], which the feeds read for every event and which has no use for it.
pub const GEO_FIELD: &str = "geo";

/// The path of an event's place ([`GEO_FIELD`] inside the stamp).
pub const GEO_PATH: &str = "_tailrace.geo";

/// Where and when an event entered tailrace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stamp {
    /// The source that handed the event over.
    pub source: String,
    /// Its per-source sequence number: 1, 2, 3, ... with no hole and no repeat, across
    /// restarts; feeds count the missing and duplicate ones.
    pub seq: u64,
    /// When the source handed it over (µs since the Unix epoch); never earlier than the event
    /// stored before it, so the stored order is receipt order. Also stored, to the
    /// millisecond, as a date under [`RECEIVED_PATH`], for queries by time.
    pub received_us: i64,
    /// When the ingester stamped it, right before the write (µs since the Unix epoch); 0 when
    /// unknown (documents written by hand or by other tools).
    #[serde(default)]
    pub ingested_us: i64,
    /// Where the source was right after this event (a file offset, an SSE event id, a stream
    /// cursor), for resumable sources: stored in the same document as the event, so it is
    /// committed with it, and a restarted source continues exactly after the newest stored
    /// event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<Value>,
}

impl Stamp {
    /// The stamp of a document, if it carries a well-formed one. Reads in place (no copy of
    /// the document), so it is cheap enough for every event a feed processes.
    pub fn of(doc: &Document) -> Option<Stamp> {
        Stamp::deserialize(doc.get(STAMP_FIELD)?).ok()
    }

    /// The stamp as the JSON value stored under [`STAMP_FIELD`].
    pub fn to_value(&self) -> Value {
        let mut v = serde_json::json!({
            "source": self.source,
            "seq": self.seq,
            "received_us": self.received_us,
            "ingested_us": self.ingested_us,
        });
        if let Some(at) = crate::date::value(self.received_us.div_euclid(1000)) {
            v["received"] = at;
        }
        if let Some(p) = &self.position {
            v["position"] = p.clone();
        }
        v
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn round_trips_through_a_document() {
        let s = Stamp {
            source: "wiki 🌍".into(),
            seq: 42,
            received_us: 1_700_000_000_000_000,
            ingested_us: 1_700_000_000_000_100,
            position: Some(serde_json::json!({"offset": 42})),
        };
        let mut doc = Document::new();
        doc.insert(STAMP_FIELD.into(), s.to_value());
        assert_eq!(
            doc[STAMP_FIELD]["received"],
            json!({"$date": "2023-11-14T22:13:20.000Z"})
        );
        assert_eq!(Stamp::of(&doc), Some(s));
    }

    #[test]
    fn absent_or_malformed_stamps_are_none() {
        let doc = |v: Value| v.as_object().cloned().unwrap();
        assert_eq!(Stamp::of(&doc(json!({"a": 1}))), None);
        assert_eq!(Stamp::of(&doc(json!({"_tailrace": "x"}))), None);
        assert_eq!(
            Stamp::of(&doc(json!({"_tailrace": {"source": "s", "seq": -1}}))),
            None,
            "a negative sequence is not a stamp"
        );
    }
}
