//! Shared value types: documents, positions, tokens, durability, changes, updates.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::Filter;

/// A schemaless JSON document (always a JSON object).
pub type Document = Map<String, Value>;

/// A document's place in a capped collection: strictly increasing in insertion order,
/// never reused (not even after eviction).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Position(pub u64);

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// An opaque point in a change stream; resuming after it yields exactly the later changes.
/// Engines encode their own token in it (the embedded engine: the op-log sequence number;
/// MongoDB: the resume token document as JSON).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ResumeToken(pub String);

impl fmt::Display for ResumeToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// How long a write waits before it is acknowledged (MongoDB's write concerns).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// Returns once queued to the writer; lost on a crash.
    Unacknowledged,
    /// Returns once committed and visible; survives a process crash, not a power loss.
    Acknowledged,
    /// Returns once the commit is on stable storage (fsync).
    Journaled,
    /// Returns once a majority of replicas hold it; on one node the same as `Journaled`.
    Majority,
}

impl Durability {
    /// All levels, weakest first.
    pub const ALL: [Durability; 4] = [
        Durability::Unacknowledged,
        Durability::Acknowledged,
        Durability::Journaled,
        Durability::Majority,
    ];

    /// The lowercase name used in config and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Durability::Unacknowledged => "unacknowledged",
            Durability::Acknowledged => "acknowledged",
            Durability::Journaled => "journaled",
            Durability::Majority => "majority",
        }
    }

    /// Whether the caller waits for the commit.
    pub fn waits(self) -> bool {
        self != Durability::Unacknowledged
    }

    /// Whether the commit must reach stable storage before the acknowledgment.
    pub fn syncs(self) -> bool {
        matches!(self, Durability::Journaled | Durability::Majority)
    }
}

impl fmt::Display for Durability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Durability {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Durability::ALL
            .into_iter()
            .find(|d| d.as_str() == s)
            .ok_or_else(|| {
                format!("{s:?} is not one of unacknowledged, acknowledged, journaled, majority")
            })
    }
}

/// Where a tail starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Start {
    /// The oldest retained document.
    Oldest,
    /// Only documents appended after the tail was opened.
    Now,
    /// Every document after this position.
    After(Position),
}

/// Where a change stream starts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChangeStart {
    /// The oldest retained change.
    Oldest,
    /// Only changes committed after the stream was opened.
    Now,
    /// Every change after this token.
    After(ResumeToken),
}

/// Limits and indexes of a capped collection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CappedSpec {
    /// At most this many documents are kept.
    pub max_docs: u64,
    /// At most this many bytes of documents are kept (encoded JSON size).
    pub max_bytes: u64,
    /// Fields (dotted paths) indexed for [`crate::Capped::latest`].
    pub indexes: Vec<String>,
}

/// The oldest and newest retained positions of a capped collection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// The oldest retained position (the next to be evicted).
    pub oldest: Position,
    /// The newest position (the last appended).
    pub newest: Position,
}

/// One value of a field and the documents holding it in a stretch of a capped collection
/// ([`crate::Capped::value_groups`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ValueGroup<'a> {
    /// The string value; `None` for null or missing.
    pub value: Option<&'a str>,
    /// The first position that holds it.
    pub first: Position,
    /// How many documents hold it.
    pub count: u64,
}

/// Where a range of received times lies in a capped collection ([`crate::Capped::time_span`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeSpan {
    /// No retained document was received in the range.
    Empty,
    /// Every retained document received in the range lies between these positions
    /// (inclusive); others may lie there too.
    Positions(Position, Position),
}

/// A stretch of a capped collection's positions whose documents arrived within one second
/// ([`crate::Capped::received_runs`]): each holds the date [`crate::RECEIVED_PATH`] in that
/// second, or no date there (not reached through an array: a stretch with one is never
/// given).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReceivedRun {
    /// The first position: a document received in `second`, unless `second` is `None`.
    pub first: Position,
    /// The last position.
    pub last: Position,
    /// The second (milliseconds since the epoch divided by 1000, rounded down) the timed
    /// documents were received in; `None` when the stretch has none.
    pub second: Option<i64>,
    /// Documents with a received time.
    pub timed: u64,
    /// Documents without one: no date at [`crate::RECEIVED_PATH`].
    pub untimed: u64,
}

/// How much a capped collection holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Retained documents.
    pub docs: u64,
    /// Their encoded size in bytes.
    pub bytes: u64,
}

/// A document of a keyed collection with its key.
#[derive(Clone, Debug, PartialEq)]
pub struct KeyedDoc {
    /// The key (`_id`).
    pub key: String,
    /// The document (its `_id` field holds the key too).
    pub doc: Document,
}

/// An upsert of one key of a keyed collection.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct KeyUpdate {
    /// The key (`_id`) updated, created when absent.
    pub key: String,
    /// What is applied to it.
    pub update: Update,
    /// Names this update so that sending it again applies it once (see [`WriteId`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub once: Option<WriteId>,
}

impl KeyUpdate {
    /// An upsert of `key`.
    pub fn new(key: impl Into<String>, update: Update) -> Self {
        KeyUpdate {
            key: key.into(),
            update,
            once: None,
        }
    }

    /// This update, named `id`: see [`WriteId`].
    pub fn once(mut self, id: WriteId) -> Self {
        self.once = Some(id);
        self
    }
}

/// The name of one [`KeyUpdate`] among a writer's updates, for a caller that sends updates
/// again after a failure whose outcome it could not know (a reply lost with its connection):
/// an update that landed the first time is not applied a second time, so a `$inc` counts
/// once.
///
/// A writer draws `writer` at random when it starts and numbers its updates with `seq`,
/// strictly increasing, in the order it sends them; it sends each key's updates in that order
/// and never sends an update again once a later update of the same key has been answered.
/// The MongoDB engine then keeps the newest name applied to each key beside its document and
/// skips an update whose name is not newer (the driver's own retry does this for a single
/// write, not for the commands that carry a batch of upserts). The embedded engine answers in
/// process, so its reply cannot be lost, and ignores the name. Two writers of one key: each
/// write of another writer replaces the name kept, so an update sent again by the first after
/// such a write applies again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteId {
    /// The writer, drawn at random when it starts.
    pub writer: u64,
    /// The update's place in the writer's order, from 1.
    pub seq: u64,
}

/// What [`crate::Capped::newest_matching`] read.
#[derive(Clone, Debug, PartialEq)]
pub struct NewestMatching {
    /// The newest matching documents, newest first.
    pub records: Vec<Record>,
    /// The newest position of the collection when it was read (whether it matched or not);
    /// `None` when the collection was empty.
    pub as_of: Option<Position>,
}

impl NewestMatching {
    /// Where a tail starts to continue exactly after this read.
    pub fn continue_from(&self) -> Start {
        self.as_of.map_or(Start::Oldest, Start::After)
    }
}

/// A consistent snapshot of a keyed collection ([`crate::Keyed::snapshot`]).
pub struct KeyedSnapshot {
    /// Changes after this token are exactly those committed after the snapshot.
    pub token: ResumeToken,
    /// The snapshot's documents, by key, read in bounded pages as the stream is polled.
    pub docs: futures::stream::BoxStream<'static, Result<KeyedDoc, crate::StoreError>>,
}

impl fmt::Debug for KeyedSnapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedSnapshot")
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

/// A document read from a capped collection.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    /// Its position.
    pub position: Position,
    /// The document, shared: an engine hands one document to every tail that reads it
    /// without copying it, and a consumer that only reads it never owns a copy.
    pub doc: Arc<Document>,
    /// When its write was committed, in microseconds since the Unix epoch, when known.
    pub committed_at_us: Option<i64>,
}

/// The kind of operation a change records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChangeOp {
    /// A new key.
    Insert,
    /// A partial update (`$inc`, `$set`) of an existing key.
    Update,
    /// A whole-document replacement of an existing key.
    Replace,
    /// A removed key.
    Delete,
}

impl ChangeOp {
    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeOp::Insert => "insert",
            ChangeOp::Update => "update",
            ChangeOp::Replace => "replace",
            ChangeOp::Delete => "delete",
        }
    }
}

impl FromStr for ChangeOp {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "insert" => Ok(ChangeOp::Insert),
            "update" => Ok(ChangeOp::Update),
            "replace" => Ok(ChangeOp::Replace),
            "delete" => Ok(ChangeOp::Delete),
            _ => Err(format!(
                "{s:?} is not one of insert, update, replace, delete"
            )),
        }
    }
}

/// One published change of a changefeed-backed collection.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Change {
    /// What happened.
    pub op: ChangeOp,
    /// The collection it happened in.
    pub collection: String,
    /// The document key (`_id`).
    pub key: String,
    /// The document before the change (absent for inserts, and where the engine has no
    /// pre-image). Shared, as [`Record::doc`] is.
    pub before: Option<Arc<Document>>,
    /// The document after the change (absent for deletes).
    pub after: Option<Arc<Document>>,
    /// Resume after this token to get the changes that follow this one.
    pub token: ResumeToken,
    /// When the change was committed, in microseconds since the Unix epoch.
    pub committed_at_us: i64,
}

/// Which changes a change stream yields (like RethinkDB's `filter().changes()`).
/// Empty lists mean "all".
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChangeFilter {
    /// Only these collections.
    pub collections: Vec<String>,
    /// Only these operations.
    pub ops: Vec<ChangeOp>,
    /// Only keys starting with this prefix.
    pub key_prefix: Option<String>,
    /// Only changes whose document matches this filter (MongoDB query syntax): the post-image,
    /// or for a delete the pre-image. A change without the image it needs (a delete on an
    /// engine that kept no pre-image) does not match, unless the filter matches everything.
    pub filter: Option<Filter>,
    /// Leave out the pre-image (`before`) of inserts, updates and replaces; a delete keeps its
    /// own, its only image. For a consumer that reads post-images only (the feeds' statistics):
    /// it then pays neither for decoding nor for copying an image it never reads.
    pub post_images_only: bool,
}

impl ChangeFilter {
    /// Watch just these collections, every operation.
    pub fn collections<I, S>(names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ChangeFilter {
            collections: names.into_iter().map(Into::into).collect(),
            ..ChangeFilter::default()
        }
    }

    /// The document filter, unless it matches every document by its structure (`{}`), so an
    /// engine can skip evaluating it.
    pub fn document_filter(&self) -> Option<&Filter> {
        self.filter.as_ref().filter(|f| !f.is_match_all())
    }

    /// Whether a change of this collection, operation and key can pass the filter: every
    /// part of it but the document filter, so an engine reading its history can skip an
    /// entry before decoding its images.
    pub fn admits(&self, collection: &str, op: ChangeOp, key: &str) -> bool {
        (self.collections.is_empty() || self.collections.iter().any(|c| c == collection))
            && (self.ops.is_empty() || self.ops.contains(&op))
            && self
                .key_prefix
                .as_deref()
                .is_none_or(|p| key.starts_with(p))
    }

    /// Whether a change of this operation comes with its pre-image ([`Self::post_images_only`]).
    pub fn wants_before(&self, op: ChangeOp) -> bool {
        !self.post_images_only || op == ChangeOp::Delete
    }

    /// `c` as this filter delivers it: without the pre-image it does not want.
    pub fn shape(&self, mut c: Change) -> Change {
        if !self.wants_before(c.op) {
            c.before = None;
        }
        c
    }

    /// A copy of `c` as this filter delivers it; a pre-image it does not want is not copied.
    pub fn shaped_copy(&self, c: &Change) -> Change {
        Change {
            op: c.op,
            collection: c.collection.clone(),
            key: c.key.clone(),
            before: if self.wants_before(c.op) {
                c.before.clone()
            } else {
                None
            },
            after: c.after.clone(),
            token: c.token.clone(),
            committed_at_us: c.committed_at_us,
        }
    }

    /// Whether a change passes the filter.
    pub fn matches(&self, c: &Change) -> bool {
        self.admits(&c.collection, c.op, &c.key)
            && self.document_filter().is_none_or(|f| {
                let image = match c.op {
                    ChangeOp::Delete => c.before.as_ref(),
                    _ => c.after.as_ref(),
                };
                image.is_some_and(|d| f.matches(d))
            })
    }
}

/// A partial update: `$inc` and `$set` by dotted path, applied as an upsert.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Update {
    /// Numeric increments (`$inc`); a missing field counts as 0.
    pub inc: Vec<(String, Value)>,
    /// Values to set (`$set`).
    pub set: Vec<(String, Value)>,
}

impl Update {
    /// An update that increments `field` by `delta`.
    pub fn inc(field: impl Into<String>, delta: i64) -> Self {
        Update::default().and_inc(field, delta)
    }

    /// Adds an increment.
    pub fn and_inc(mut self, field: impl Into<String>, delta: i64) -> Self {
        self.inc.push((field.into(), Value::from(delta)));
        self
    }

    /// Adds a `$set`.
    pub fn and_set(mut self, field: impl Into<String>, value: impl Into<Value>) -> Self {
        self.set.push((field.into(), value.into()));
        self
    }
}
