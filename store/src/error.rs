//! The one error type of the store boundary.
//!
//! Callers branch on meaning (`is_position_lost`, `is_history_lost`), not on engine details:
//! both engines map their own failures onto these variants.

use crate::{Position, ResumeToken};

/// Everything a store operation can fail with.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A tail reader was overtaken by eviction: the document after `after` is gone.
    /// The consumer should record a gap and restart from the oldest retained document.
    #[error(
        "position lost in capped collection {collection}: reader was after {after}, oldest retained is {oldest}"
    )]
    PositionLost {
        /// The capped collection.
        collection: String,
        /// The last position the reader held.
        after: Position,
        /// The oldest position still retained.
        oldest: Position,
    },
    /// A change stream was asked to resume from a token older than the retained history.
    /// The consumer should record a gap and restart from the oldest retained change.
    #[error("change history lost: token {token} is older than the oldest retained change {oldest}")]
    HistoryLost {
        /// The token the reader tried to resume after.
        token: ResumeToken,
        /// The oldest token still retained.
        oldest: ResumeToken,
    },
    /// `latest(field, ..)` was asked for a field that has no index.
    #[error(
        "field {field:?} of collection {collection} is not indexed; add it to store.events.indexes"
    )]
    NotIndexed {
        /// The collection queried.
        collection: String,
        /// The unindexed field.
        field: String,
    },
    /// A name or argument the store cannot accept; the message says which and why.
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// An existing collection does not match what the configuration asks for.
    #[error("collection {collection}: {problem}")]
    Incompatible {
        /// The collection.
        collection: String,
        /// What does not match, and how to fix it.
        problem: String,
    },
    /// The data directory is held by another process.
    #[error("{0}")]
    Locked(String),
    /// The store was closed (or its writer stopped) while the operation was in flight.
    #[error("store is closed")]
    Closed,
    /// A document could not be encoded or decoded.
    #[error("document encoding: {0}")]
    Json(#[from] serde_json::Error),
    /// The underlying engine failed; the message is the engine's.
    #[error("{engine} engine: {message}")]
    Engine {
        /// `embedded` or `mongodb`.
        engine: &'static str,
        /// The engine's own description.
        message: String,
    },
    /// A file-system operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        source: std::io::Error,
    },
}

impl StoreError {
    /// True when a tail reader was overtaken by eviction.
    pub fn is_position_lost(&self) -> bool {
        matches!(self, StoreError::PositionLost { .. })
    }

    /// True when a change stream's resume point fell out of the retained history.
    pub fn is_history_lost(&self) -> bool {
        matches!(self, StoreError::HistoryLost { .. })
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Engine {
            engine: "embedded",
            message: e.to_string(),
        }
    }
}

#[cfg(feature = "mongodb")]
impl From<mongodb::error::Error> for StoreError {
    /// Maps by meaning (see `mongo::convert`): `ChangeStreamHistoryLost` becomes
    /// `HistoryLost`, bad requests `Invalid`, a shut-down client `Closed`, the rest `Engine`.
    /// `CappedPositionLost` needs the reader's position, so the tail maps that one itself.
    fn from(e: mongodb::error::Error) -> Self {
        crate::mongo::map_error(e)
    }
}

/// Shorthand for store results.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;
