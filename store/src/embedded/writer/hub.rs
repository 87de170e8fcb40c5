//! The live broadcast of commits to tails and change streams, bounded by bytes as well as
//! by count.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::broadcast;

use super::ops::Docs;
use crate::{Change, ChangeOp, Document, ResumeToken};

/// Documents appended to one capped collection by one commit, from position `first` on.
pub(crate) struct LiveAppend {
    pub first: u64,
    pub docs: Docs,
}

/// What one commit made visible; sent to every live tail and change stream.
#[derive(Default)]
pub(crate) struct Commit {
    /// Appended documents per capped collection, in position order.
    pub appended: Vec<(String, LiveAppend)>,
    /// Published changes in sequence order.
    pub changes: Vec<LiveChange>,
    /// Set when the commit went out without its documents and changes, because live readers
    /// that had not taken earlier commits held [`Hub`]'s budget: a reader that wants any of
    /// them reads the journal.
    pub elided: Option<Elided>,
    /// Its share of [`Hub::held`], given back when the last holder drops it.
    pub(super) held: Option<Held>,
    /// When it was published: written (and synced, if asked), applied, visible. Feeds
    /// measure notification latency from it, which the store contract calls the
    /// acknowledgment (the MongoDB engine stamps its writes when the server acknowledged
    /// them). The record keeps the commit's start, written before the sync; a document read
    /// back from the journal carries that one.
    pub committed_at_us: i64,
}

/// What an elided [`Commit`] left out.
pub(crate) struct Elided {
    /// The capped collections it appended to.
    pub collections: Vec<String>,
    /// Whether it published changes.
    pub changes: bool,
}

/// The broadcast of commits to live readers, bounded by bytes as well as by count.
///
/// The broadcast keeps a commit until every receiver has taken it or [`HUB_CAPACITY`] later
/// commits have overwritten it, so one reader that stops taking them (an HTTP client that
/// stopped reading) holds the last `HUB_CAPACITY` commits, and a commit may carry up to
/// [`MAX_GROUP_BYTES`] of documents. So the hub counts the stored bytes of the commits it
/// holds, and once they reach its budget, sends the next ones elided. Readers behind then
/// read those from the journal, as they do when they fall [`HUB_CAPACITY`] behind.
///
/// [`HUB_CAPACITY`]: super::HUB_CAPACITY
#[derive(Clone)]
pub(crate) struct Hub {
    pub tx: broadcast::Sender<Arc<Commit>>,
    /// Stored bytes (JSON) of the documents and images of the commits not yet released.
    pub held: Arc<AtomicU64>,
    pub(super) budget: u64,
}

impl Hub {
    pub fn new(capacity: usize, budget: u64) -> Hub {
        Hub {
            tx: broadcast::channel(capacity).0,
            held: Arc::default(),
            budget,
        }
    }

    /// Sends `commit`, of `bytes` stored bytes, or its elided form when the commits held
    /// would pass the budget. A commit goes whole when nothing else is held, however large:
    /// readers keeping up then never read the journal for it.
    pub(super) fn send(&self, mut commit: Commit, bytes: u64) {
        let held = self.held.load(Ordering::Acquire);
        if held > 0 && held.saturating_add(bytes) > self.budget {
            commit = Commit {
                elided: Some(Elided {
                    collections: commit.appended.into_iter().map(|(c, _)| c).collect(),
                    changes: !commit.changes.is_empty(),
                }),
                committed_at_us: commit.committed_at_us,
                ..Commit::default()
            };
        } else {
            self.held.fetch_add(bytes, Ordering::AcqRel);
            commit.held = Some(Held {
                bytes,
                held: self.held.clone(),
            });
        }
        // No receiver: the commit is dropped here, and its bytes given back.
        let _ = self.tx.send(Arc::new(commit));
    }
}

/// A commit's bytes in [`Hub::held`].
pub(super) struct Held {
    pub(super) bytes: u64,
    pub(super) held: Arc<AtomicU64>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.held.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// A change as the writer publishes it, its images shared with every reader.
pub(crate) struct LiveChange {
    pub op: ChangeOp,
    pub collection: String,
    pub key: String,
    pub before: Option<Arc<Document>>,
    pub after: Option<Arc<Document>>,
    pub seq: u64,
}

impl LiveChange {
    /// Whether it passes `filter` (as [`crate::ChangeFilter::matches`] does for a [`Change`]).
    pub fn matches(&self, filter: &crate::ChangeFilter) -> bool {
        filter.admits(&self.collection, self.op, &self.key)
            && filter.document_filter().is_none_or(|f| {
                let image = match self.op {
                    ChangeOp::Delete => self.before.as_deref(),
                    _ => self.after.as_deref(),
                };
                image.is_some_and(|d| f.matches(d))
            })
    }

    /// The change as `filter` delivers it, the images it wants, stamped with its commit's
    /// [`Commit::committed_at_us`].
    pub fn to_change(&self, filter: &crate::ChangeFilter, committed_at_us: i64) -> Change {
        Change {
            op: self.op,
            collection: self.collection.clone(),
            key: self.key.clone(),
            before: if filter.wants_before(self.op) {
                self.before.clone()
            } else {
                None
            },
            after: self.after.clone(),
            token: ResumeToken(self.seq.to_string()),
            committed_at_us,
        }
    }
}
