//! What callers ask the writer: the operations, their answers, and the queued job.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use tokio::sync::oneshot;

use crate::{CappedSpec, Document, Durability, Filter, KeyUpdate, Position, Result};

/// What a caller asks the writer to do.
pub(crate) enum Op {
    CreateCapped {
        name: String,
        spec: CappedSpec,
    },
    CreateKeyed {
        name: String,
    },
    /// Sets (or with `None` removes) a collection's validation rule.
    Validate {
        coll: String,
        rule: Option<Filter>,
    },
    Append {
        coll: String,
        docs: Docs,
        /// Each document's JSON text, encoded by the caller: the encoding then runs on the
        /// caller's thread, beside the writer's, not on it.
        bodies: Vec<Vec<u8>>,
        /// Each document's index hashes, computed by the caller for the fields `indexed` (the
        /// collection's indexes when it was opened): used when they are still the collection's
        /// indexes, computed again on the writer when not (another handle added an index).
        indexed: Arc<[String]>,
        hashes: Vec<Vec<u64>>,
    },
    Update {
        coll: String,
        updates: Vec<KeyUpdate>,
    },
    Set {
        coll: String,
        key: String,
        doc: Document,
    },
    Delete {
        coll: String,
        key: String,
    },
    Expire {
        coll: String,
        prefix: String,
        before: i64,
        limit: usize,
    },
    Checkpoint {
        feed: String,
        body: String,
    },
    /// Capped documents of a segment about to be released, still retained: kept in the tree.
    Spill {
        coll: String,
        docs: Vec<(u64, i64, Vec<u8>)>,
    },
    /// Commits everything queued before it; used by `close` to flush, and by the maintenance
    /// thread to have the writer thread seal the memtable.
    Barrier,
    /// Several operations as one job: all of them or none (an append and the updates derived
    /// from it). Answered with the first append's positions.
    Together(Vec<Op>),
}

impl Op {
    /// Bytes of JSON it carries, roughly.
    pub(super) fn bytes(&self) -> usize {
        match self {
            Op::Append { bodies, .. } => bodies.iter().map(Vec::len).sum(),
            Op::Checkpoint { body, .. } => body.len(),
            Op::Together(ops) => ops.iter().map(Op::bytes).sum(),
            _ => 64,
        }
    }
}

/// The writer's answer.
pub(crate) enum Reply {
    Positions(Vec<Position>),
    /// A capped collection's newest position, shared with its handles.
    /// A capped collection opened: its newest position and its indexes (every field any
    /// opening declared, in the catalog's order).
    Newest(Arc<AtomicU64>, Arc<[String]>),
    Deleted(bool),
    Expired(u64),
    Done,
}

/// One queued request.
pub(crate) struct Job {
    pub op: Op,
    pub durability: Durability,
    /// `None` for unacknowledged writes: nobody waits.
    pub reply: Option<oneshot::Sender<Result<Reply>>>,
}

/// An append's documents as their writers handed them over: shared, not copied. The writer
/// reads them (validation, index entries) and the commit hands them to every live tail,
/// which yields each document shared too; the caller keeps its own reference, to write them
/// again should the attempt fail, and a group joins several jobs' appends to one collection.
#[derive(Default)]
pub(crate) struct Docs {
    pub(super) chunks: Vec<Arc<[Arc<Document>]>>,
    pub(super) len: usize,
}

impl Docs {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Document>> {
        self.chunks.iter().flat_map(|c| c.iter())
    }

    pub(super) fn extend(&mut self, other: Docs) {
        self.len += other.len;
        self.chunks.extend(other.chunks);
    }
}

impl From<Arc<[Arc<Document>]>> for Docs {
    fn from(docs: Arc<[Arc<Document>]>) -> Self {
        Docs {
            len: docs.len(),
            chunks: vec![docs],
        }
    }
}
