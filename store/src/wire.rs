//! How a stored record or a change is written as JSON, wherever tailrace sends one: a feed's
//! event stream (`/api/feeds/<name>/events`) and `/api/changes`. Each adds fields of its own
//! (the feed's name and position; the event's type and id), but a field both carry is written
//! here, once, so a client reads `op`, `collection`, `key`, `doc`, `before` and
//! `committed_at_us` the same way from either.
//!
//! ```text
//! record: {"collection":"events","key":"42","doc":{...},"committed_at_us":1733...}
//! change: {"op":"update","collection":"rollups","key":"hashtag:rust","doc":{...},
//!          "before":{...},"committed_at_us":1733...}
//! ```
//!
//! A record's `key` is its position as text (what a client resumes after); `committed_at_us`
//! is absent when the engine does not know it. A change's `doc` is `null` for a delete, and
//! `before` is present only where the engine has the pre-image.

use std::sync::Arc;

use serde_json::{Map, Value};

use crate::{Change, Record};

impl Record {
    /// This record of `collection` as JSON (see the module doc). The document is moved, not
    /// copied, when this is its last holder.
    pub fn into_json(self, collection: &str) -> Map<String, Value> {
        let mut out = Map::new();
        out.insert("collection".into(), Value::from(collection));
        out.insert("key".into(), Value::from(self.position.0.to_string()));
        out.insert("doc".into(), Value::Object(Arc::unwrap_or_clone(self.doc)));
        if let Some(at) = self.committed_at_us {
            out.insert("committed_at_us".into(), Value::from(at));
        }
        out
    }
}

impl Change {
    /// This change as JSON (see the module doc); its images are moved, as a record's is.
    pub fn into_json(self) -> Map<String, Value> {
        let mut out = Map::new();
        out.insert("op".into(), Value::from(self.op.as_str()));
        out.insert("collection".into(), Value::from(self.collection));
        out.insert("key".into(), Value::from(self.key));
        out.insert(
            "doc".into(),
            self.after
                .map_or(Value::Null, |d| Value::Object(Arc::unwrap_or_clone(d))),
        );
        if let Some(before) = self.before {
            out.insert("before".into(), Value::Object(Arc::unwrap_or_clone(before)));
        }
        out.insert("committed_at_us".into(), Value::from(self.committed_at_us));
        out
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::{ChangeOp, Position, ResumeToken};
    use serde_json::json;

    fn doc(v: Value) -> Arc<Map<String, Value>> {
        Arc::new(v.as_object().unwrap().clone())
    }

    #[test]
    fn a_record_is_its_collection_its_position_as_text_and_its_document() {
        let r = Record {
            position: Position(42),
            doc: doc(json!({"text": "hi"})),
            committed_at_us: Some(7),
        };
        assert_eq!(
            Value::Object(r.clone().into_json("events")),
            json!({"collection": "events", "key": "42", "doc": {"text": "hi"}, "committed_at_us": 7})
        );
        let unknown = Record {
            committed_at_us: None,
            ..r
        };
        assert!(!unknown.into_json("events").contains_key("committed_at_us"));
    }

    #[test]
    fn a_delete_has_a_null_doc_and_its_before_image_when_known() {
        let c = Change {
            op: ChangeOp::Delete,
            collection: "rollups".into(),
            key: "hashtag:rust".into(),
            before: Some(doc(json!({"n": 3}))),
            after: None,
            token: ResumeToken("t".into()),
            committed_at_us: 9,
        };
        assert_eq!(
            Value::Object(c.into_json()),
            json!({"op": "delete", "collection": "rollups", "key": "hashtag:rust", "doc": null,
                   "before": {"n": 3}, "committed_at_us": 9})
        );
    }
}
