//! The one error type of the store boundary.
//!
//! Callers branch on meaning (`is_position_lost`, `is_history_lost`, `is_transient`), not on
//! engine details: both engines map their own failures onto these variants.

use crate::{Capability, Position, ResumeToken};

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
    /// The server does not support what the operation needs (change streams on a standalone
    /// MongoDB or on FerretDB, an oplog that was never created, transactions). Retrying will
    /// not help; `reply` quotes the server, and the message names the alternative.
    #[error("the server does not support {capability}: {reply}{}", alternative(*.capability))]
    Unsupported {
        /// What is missing.
        capability: Capability,
        /// The server's reply (code, name and message) or how the absence was detected.
        reply: String,
    },
    /// A write of several items failed part way, and the engine cannot undo the part that
    /// was written: the first `written` items are stored (once), the next one failed with
    /// `error`, and none after it was written. Engines that commit a request all or nothing
    /// (the embedded engine) never return it; MongoDB's ordered inserts into a capped
    /// collection, which no transaction can hold, can. Retrying the whole request would store
    /// the first `written` items twice: retry from the item that failed.
    #[error("{written} items written, then: {error}")]
    PartlyWritten {
        /// How many items, from the first, were written.
        written: usize,
        /// Why the next one was not.
        error: Box<StoreError>,
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
    /// The store cannot take writes right now, for a reason that passes (disk full, database
    /// busy, connection lost, no primary, write-concern timeout): retry the same write later,
    /// with backoff. The message is the engine's.
    #[error("{engine} engine unavailable: {message}")]
    Unavailable {
        /// `embedded` or `mongodb`.
        engine: &'static str,
        /// The engine's own description.
        message: String,
    },
    /// The underlying engine refused or failed the operation for a reason that retrying the
    /// same request will not change (a document or update it rejects, a broken invariant);
    /// the message is the engine's.
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

    /// The capability the server lacks, when that is why the operation failed.
    pub fn unsupported(&self) -> Option<Capability> {
        match self {
            StoreError::Unsupported { capability, .. } => Some(*capability),
            _ => None,
        }
    }

    /// True when the same request may succeed later (retry it with backoff); false when it
    /// will fail again as it is (isolate what it carries) or when the store is closed.
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Unavailable { .. } => true,
            StoreError::PartlyWritten { error, .. } => error.is_transient(),
            StoreError::Io { source, .. } => !matches!(
                source.kind(),
                std::io::ErrorKind::NotFound
                    | std::io::ErrorKind::PermissionDenied
                    | std::io::ErrorKind::InvalidInput
                    | std::io::ErrorKind::InvalidData
            ),
            StoreError::PositionLost { .. }
            | StoreError::HistoryLost { .. }
            | StoreError::NotIndexed { .. }
            | StoreError::Invalid(_)
            | StoreError::Unsupported { .. }
            | StoreError::Incompatible { .. }
            | StoreError::Locked(_)
            | StoreError::Closed
            | StoreError::Json(_)
            | StoreError::Engine { .. } => false,
        }
    }

    /// A copy to hand to several callers (a failed group commit fails every job in it), with
    /// the same meaning: an I/O error or a JSON error becomes its message in the variant that
    /// keeps `is_transient` the same.
    pub fn duplicate(&self, engine: &'static str) -> StoreError {
        let message = self.to_string();
        match self {
            StoreError::Closed => StoreError::Closed,
            StoreError::Invalid(m) => StoreError::Invalid(m.clone()),
            StoreError::Unsupported { capability, reply } => StoreError::Unsupported {
                capability: *capability,
                reply: reply.clone(),
            },
            StoreError::PartlyWritten { written, error } => StoreError::PartlyWritten {
                written: *written,
                error: Box::new(error.duplicate(engine)),
            },
            StoreError::Unavailable { engine, message } => StoreError::Unavailable {
                engine,
                message: message.clone(),
            },
            StoreError::Engine { engine, message } => StoreError::Engine {
                engine,
                message: message.clone(),
            },
            e if e.is_transient() => StoreError::Unavailable { engine, message },
            _ => StoreError::Engine { engine, message },
        }
    }
}

impl From<rusqlite::Error> for StoreError {
    /// SQLite's result codes say which failures pass: a full disk, a busy or locked database,
    /// an I/O error, no memory, a file that cannot be opened now. Constraint failures (a
    /// trigger that refuses a row, as a validation rule would), misuse and corruption do not.
    fn from(e: rusqlite::Error) -> Self {
        use rusqlite::ErrorCode as C;
        let message = e.to_string();
        match e.sqlite_error_code() {
            Some(
                C::DiskFull
                | C::DatabaseBusy
                | C::DatabaseLocked
                | C::SystemIoFailure
                | C::OutOfMemory
                | C::CannotOpen
                | C::FileLockingProtocolFailed,
            ) => StoreError::Unavailable {
                engine: "embedded",
                message,
            },
            _ => StoreError::Engine {
                engine: "embedded",
                message,
            },
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

/// What to do instead, after an [`StoreError::Unsupported`] message.
fn alternative(capability: Capability) -> &'static str {
    match capability {
        Capability::ChangeStreams => {
            " (change streams need a MongoDB replica set; on a server with an oplog, the \
             `oplog` feed kind reads the same changes from local.oplog.rs)"
        }
        Capability::Oplog => {
            " (the oplog is local.oplog.rs of a replica-set member; on FerretDB, start it \
             with --repl-set-name and create the capped collection local.oplog.rs, e.g. \
             `db.getSiblingDB(\"local\").createCollection(\"oplog.rs\", {capped: true, size: \
             268435456})`)"
        }
        Capability::Transactions => {
            " (multi-key updates are then written one key at a time: each key's write is \
             atomic, the batch is not)"
        }
        Capability::Majority => {
            " (a majority write concern needs a replica set with members to acknowledge it; \
             use durability = \"journaled\")"
        }
        Capability::BeforeImages => {
            " (before images need MongoDB 6.0+ with changeStreamPreAndPostImages on the \
             collection)"
        }
        Capability::SnapshotReads => {
            " (a keyed collection's initial documents followed by its changes need a \
             replica set's snapshot reads)"
        }
        Capability::DocumentsAsSent => {
            " (MongoDB 5.0+ stores them; this server refuses such documents, and the \
             ingester keeps each as a dead letter with the server's reason)"
        }
        Capability::CappedBounds => {
            " (this server evicts in the background: a capped collection may exceed its \
             limits for a while)"
        }
        Capability::ServerFilters => {
            " (tailrace evaluates document filters itself then, on every document it reads)"
        }
        Capability::AwaitingTails => {
            " (tails then ask the server again after each batch: a poll, up to a second \
             apart on a quiet collection)"
        }
        Capability::Other => "",
    }
}

/// Shorthand for store results.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;
