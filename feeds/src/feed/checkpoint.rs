//! What a feed saves so that a restart resumes exactly after the last event it processed.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use store::{Position, ResumeToken};

/// Where a feed is in its stream: the last entry it processed.
///
/// Stored untagged (a tail position is a JSON number, a resume token a string), so the
/// checkpoints and the API show the engine's own values.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum FeedPosition {
    /// A tailable feed: the position in the capped collection.
    Tail(Position),
    /// A change or op-log feed: the resume token.
    Token(ResumeToken),
}

impl std::fmt::Display for FeedPosition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FeedPosition::Tail(p) => p.fmt(f),
            FeedPosition::Token(t) => t.fmt(f),
        }
    }
}

/// The saved state of a feed: one row, written atomically, so the position and the
/// statistics always agree.
#[derive(Serialize, Deserialize)]
pub(crate) struct Checkpoint {
    /// The kind of feed that saved it (`tailable`, `changes`, ...).
    pub kind: String,
    /// `None` before the first event.
    pub position: Option<FeedPosition>,
    /// [`crate::stats::RollingStats::save`].
    pub stats: Value,
    pub saved_at_us: i64,
}

impl Checkpoint {
    /// The checkpoint as the store takes it, its statistics moved in, not copied: they are
    /// most of it (a long tail's top-k window), and `serde_json::to_value` of a borrowed
    /// checkpoint would copy every key once more at every save. The same document as the
    /// derived `Serialize` writes (the test below).
    pub fn into_value(self) -> serde_json::Result<Value> {
        let mut doc = serde_json::Map::new();
        doc.insert("kind".into(), Value::String(self.kind));
        doc.insert("position".into(), serde_json::to_value(&self.position)?);
        doc.insert("stats".into(), self.stats);
        doc.insert("saved_at_us".into(), Value::from(self.saved_at_us));
        Ok(Value::Object(doc))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn positions_are_stored_as_the_engine_gives_them() {
        let tail = FeedPosition::Tail(Position(42));
        let token = FeedPosition::Token(ResumeToken("{\"_data\":\"8263\"}".into()));
        assert_eq!(serde_json::to_value(&tail).unwrap(), json!(42));
        assert_eq!(
            serde_json::to_value(&token).unwrap(),
            json!("{\"_data\":\"8263\"}")
        );
        for p in [tail, token] {
            let back: FeedPosition =
                serde_json::from_value(serde_json::to_value(&p).unwrap()).unwrap();
            assert_eq!(back, p);
        }
    }

    #[test]
    fn into_value_writes_what_serialize_writes() {
        let stats = json!({"events": 3, "topk": {"closed": [{"keys": ["$x", "a.b", "東京 🦀"]}]}});
        for position in [
            None,
            Some(FeedPosition::Tail(Position(7))),
            Some(FeedPosition::Token(ResumeToken("t".into()))),
        ] {
            let cp = || Checkpoint {
                kind: "changes".into(),
                position: position.clone(),
                stats: stats.clone(),
                saved_at_us: -5,
            };
            let derived = serde_json::to_value(cp()).unwrap();
            assert_eq!(cp().into_value().unwrap(), derived);
            let back: Checkpoint = serde_json::from_value(derived).unwrap();
            assert_eq!(back.position, position);
        }
    }
}
