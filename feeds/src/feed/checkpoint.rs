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
}
