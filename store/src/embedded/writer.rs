//! The single writer: stages whatever is queued, writes it as one journal record (group
//! commit), syncs it when any write of the group asked for `journaled`, then applies it (the
//! capped collections' positions and indexes, the keyed state in the tree), publishes it to
//! the live readers and answers every caller.
//!
//! Every job is queued, and the writer thread ([`run`]) commits everything queued together,
//! in the order it was queued: the writes, syncs, segment rolls and expiries of a commit never
//! run on a caller's thread (an async runtime's, which must not block). The [`Writer`] sits
//! behind a lock ([`WriterCell`]) that the maintenance thread and setup take too.
//!
//! Each job is staged on its own ([`JobOut`]) against what the group staged before it, and
//! joins the group only if it succeeds: one bad job (a refused document, an `$inc` of a
//! string) fails alone. A failed write fails the whole group, and nothing of it is applied.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::{broadcast, mpsc, oneshot};

use super::catalog::{self, Catalog};
use super::format::{self, Builder};
use super::fs::Fs;
use super::journal::{self, Segment};
use super::known::KnownKeys;
use super::maint::Task;
use super::state::{self, MemIndex, SEEK_EVERY, Seek, SegColl, SegIndex, SegInfo, Shared};

use super::tree::{self, Tree};
use crate::clock::now_us;
use crate::{
    CappedSpec, Change, ChangeOp, Document, Durability, Filter, KeyUpdate, Position, Result,
    ResumeToken, StoreError, update,
};

/// At most this many jobs share one record, so one commit's latency stays bounded.
const MAX_GROUP: usize = 1024;
/// A group stops taking jobs once its entries pass this many bytes (one job may pass it alone).
const MAX_GROUP_BYTES: usize = 8 << 20;

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
    fn bytes(&self) -> usize {
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
    chunks: Vec<Arc<[Arc<Document>]>>,
    len: usize,
}

impl Docs {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Document>> {
        self.chunks.iter().flat_map(|c| c.iter())
    }

    fn extend(&mut self, other: Docs) {
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
    held: Option<Held>,
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
    budget: u64,
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
    fn send(&self, mut commit: Commit, bytes: u64) {
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
struct Held {
    bytes: u64,
    held: Arc<AtomicU64>,
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

/// A keyed document as the writer last knows it: the document, its JSON and its write time.
#[derive(Clone)]
pub(crate) struct Kv {
    /// Shared with the changes that carry it and the cache: a hot key's document is copied
    /// once per update (to change it), not once per place it goes.
    pub doc: Arc<Document>,
    pub json: Arc<str>,
    pub ts: i64,
}

/// Documents of keyed collections as last written: an update of a hot key (a source's
/// summary, updated on every event; a common hashtag's counter) then needs no read and no
/// parse. The writer is the only writer, so the cache is exact.
///
/// On a long tail most keys are written once or a few times and would push the hot ones out
/// of a cache that keeps whatever was written last. `quick_cache`'s CLOCK-Pro admits a new key
/// into a small cold section; only a key written again while there, or again after it left
/// (remembered by its hash), takes a place among the hot ones.
struct KvCache {
    docs: quick_cache::unsync::Cache<KvKey, Kv, KvWeight, hashbrown::DefaultHashBuilder>,
}

impl KvCache {
    /// Bytes the cached entries may take, as [`KvWeight`] counts them: several hundred
    /// counters of a long-tail field beside the summaries. At 70 events/s the cache fills
    /// and stays full, so its bytes count against the memory target there
    /// (docs/BENCHMARKS.md, "Targets").
    const BYTES: u64 = 512 * 1024;

    fn new() -> Self {
        let docs = quick_cache::unsync::Cache::with(
            usize::try_from(Self::BYTES / 900).unwrap_or(1024),
            Self::BYTES,
            KvWeight,
            hashbrown::DefaultHashBuilder::default(),
            quick_cache::unsync::DefaultLifecycle::default(),
        );
        Self { docs }
    }

    fn get(&self, coll: &str, key: &str) -> Option<&Kv> {
        self.docs.get(&KvRef(coll, key))
    }

    fn put(&mut self, coll: &str, key: &str, kv: Kv) {
        match self.docs.get_mut(&KvRef(coll, key)) {
            // The weight may change with the document; `RefMut` accounts for it when dropped.
            Some(mut cached) => *cached = kv,
            None => self.docs.insert((coll.to_owned(), key.to_owned()), kv),
        }
    }

    fn remove(&mut self, coll: &str, key: &str) {
        self.docs.remove(&KvRef(coll, key));
    }
}

/// A cached keyed document's weight: about the bytes it holds. Its decoded form takes a few
/// times its JSON, and at least a node of a `BTreeMap` (~640 bytes, allocated even for a
/// counter's one field); then its key and its JSON.
#[derive(Clone)]
struct KvWeight;

impl quick_cache::Weighter<KvKey, Kv> for KvWeight {
    fn weight(&self, key: &KvKey, kv: &Kv) -> u64 {
        (key.0.len() + key.1.len() + 4 * kv.json.len() + 768) as u64
    }
}

/// The writer's own view of a capped collection.
struct WCapped {
    max_docs: u64,
    max_bytes: u64,
    indexes: Vec<String>,
    validator: Option<Filter>,
    oldest: u64,
    next: u64,
    /// Sizes of positions `[oldest, next)`; `u32::MAX` where there is no document.
    sizes: VecDeque<u32>,
    count: u64,
    bytes: u64,
    newest: Arc<AtomicU64>,
    /// The last seek point added: (segment, offset).
    last_seek: Option<(u64, u64)>,
}

/// A capped collection's documents staged by a job or a group: the collection, the
/// documents, their JSON and each one's index hashes.
type Appended = (String, Docs, Vec<Vec<u8>>, Vec<Vec<u64>>);
/// Documents of a released segment moved into the tree: collection, (position, commit
/// time, JSON).
type Spilled = (String, Vec<(u64, i64, Vec<u8>)>);
/// What recovery found of a capped collection: oldest and next positions, the sizes of
/// `[oldest, next)`, the last seek point.
pub(crate) type RecoveredCapped = (u64, u64, VecDeque<u32>, Option<(u64, u64)>);

/// A change of an earlier layout's log: operation, collection, key, before and after.
pub(crate) type ImportedChange = (ChangeOp, String, String, Option<Kv>, Option<Kv>);

/// Maps of the writer's per-key work (several lookups for every update): hashbrown's
/// default hasher (foldhash, seeded per process), faster than SipHash on these short keys.
type KvHashMap<K, V> = hashbrown::HashMap<K, V>;

/// A keyed document's place, (collection, key), as the staged maps hold it.
type KvKey = (String, String);

/// The staged keyed documents of a job or a group.
type KvMap = KvHashMap<KvKey, Slot>;

/// A [`KvKey`] borrowed, to look one up without building it: it hashes as the tuple does
/// (`derive(Hash)` hashes the fields in order, as a tuple hashes its elements). The filter of
/// stored keys hashes keys as this too.
#[derive(Hash)]
pub(crate) struct KvRef<'a>(pub &'a str, pub &'a str);

impl hashbrown::Equivalent<KvKey> for KvRef<'_> {
    fn equivalent(&self, k: &KvKey) -> bool {
        self.0 == k.0 && self.1 == k.1
    }
}

/// A keyed key's state as staged: `None` once deleted.
#[derive(Clone)]
struct Slot {
    now: Option<Kv>,
    /// Its write time in the tree before the group (for the write-time index).
    orig_ts: Option<i64>,
}

/// A staged change.
pub(crate) struct StagedChange {
    op: ChangeOp,
    coll: String,
    key: String,
    before: Option<Kv>,
    after: Option<Kv>,
}

/// What one job stages; joins the group if the job succeeds.
#[derive(Default)]
struct JobOut {
    appends: Vec<Appended>,
    changes: Vec<StagedChange>,
    kv: KvMap,
    checkpoints: Vec<(String, String)>,
    spills: Vec<Spilled>,
    /// Which appends (index into `appends`) answer the job.
    answer_append: Option<usize>,
}

/// What the group staged.
#[derive(Default)]
struct Group {
    /// Per capped collection, in order of first append: its documents, bodies and index
    /// hashes.
    appends: Vec<Appended>,
    changes: Vec<StagedChange>,
    kv: KvMap,
    checkpoints: Vec<(String, String)>,
    spills: Vec<Spilled>,
    bytes: usize,
}

impl Group {
    fn next_pos(&self, w: &Writer, coll: &str) -> u64 {
        let base = w.capped.get(coll).map_or(1, |c| c.next);
        base + self
            .appends
            .iter()
            .find(|(c, ..)| c == coll)
            .map_or(0, |a| a.1.len() as u64)
    }
}

pub(crate) struct Writer {
    fs: Arc<dyn Fs>,
    dir: PathBuf,
    jdir: PathBuf,
    journal: journal::Writer,
    /// The next record number.
    lsn: u64,
    change_next: u64,
    tree: Arc<Tree>,
    shared: Arc<RwLock<Shared>>,
    catalog: Arc<Mutex<Catalog>>,
    capped: HashMap<String, WCapped>,
    keyed_validators: HashMap<String, Filter>,
    cache: KvCache,
    hub: Hub,
    newest_op: Arc<AtomicU64>,
    /// The record being built and its bytes, kept from commit to commit for their buffers.
    builder: Builder,
    record: Vec<u8>,
    maint: std::sync::mpsc::Sender<Task>,
    memtable_bytes: u64,
    rotate_asked: Arc<AtomicBool>,
    last_change_seek: Option<(u64, u64)>,
    /// Which keyed documents the tree may hold: reads of the others are skipped.
    known: KnownKeys,
    /// After a failed sync nothing more is written: what the disk holds is unknown.
    poisoned: Option<String>,
    /// Commits written but not yet synced, in order: readers see a commit only once its
    /// record is synced (docs/RELIABILITY.md, "What a reader sees").
    pending: Vec<Publication>,
    /// When the oldest of them was committed.
    pending_since: Option<std::time::Instant>,
    /// The last record written, and the last one readers may see (synced): a read waits
    /// for the second to reach the first, so a caller reads its own writes.
    written_lsn: Arc<AtomicU64>,
    published: Arc<tokio::sync::watch::Sender<u64>>,
    /// The last change number written (shown or not): where a change stream started `Now`
    /// starts.
    written_op: Arc<AtomicU64>,
}

/// What a commit shows readers once its record is synced.
#[derive(Default)]
struct Publication {
    /// Its record (or, with none, the last one before it).
    lsn: u64,
    /// The appended collections' positions and sizes after it.
    views: Vec<(String, ViewUpdate)>,
    /// The keyed state's writes up to this sequence number.
    tree_seqno: Option<u64>,
    /// The change numbers it made, `[first, next)`.
    changes: Option<(u64, u64)>,
    /// What the live broadcast sends, and its stored bytes.
    commit: Option<(Commit, u64)>,
}

/// A capped collection as readers see it after a commit.
struct ViewUpdate {
    oldest: u64,
    next: u64,
    count: u64,
    bytes: u64,
}

/// What recovery hands the writer.
pub(crate) struct Recovered {
    pub fs: Arc<dyn Fs>,
    pub dir: PathBuf,
    pub journal: journal::Writer,
    pub lsn: u64,
    pub change_next: u64,
    pub tree: Arc<Tree>,
    pub shared: Arc<RwLock<Shared>>,
    pub catalog: Arc<Mutex<Catalog>>,
    /// Per capped collection: oldest, next, sizes of `[oldest, next)`, last seek.
    pub capped: HashMap<String, RecoveredCapped>,
    pub last_change_seek: Option<(u64, u64)>,
}

/// Each document's hashes of its values of `indexes` (a missing or null value has none).
pub(crate) fn index_hashes<'a>(
    coll: &str,
    indexes: &[String],
    docs: impl Iterator<Item = &'a Arc<Document>>,
) -> Vec<Vec<u64>> {
    docs.map(|d| {
        indexes
            .iter()
            .filter_map(|f| state::value_hash(coll, f, update::get_path(d, f)))
            .collect()
    })
    .collect()
}

fn lock_err<T>(_: T) -> StoreError {
    StoreError::Engine {
        engine: "embedded",
        message: "internal lock poisoned".into(),
    }
}

fn refused(coll: &str, rule: &Filter) -> StoreError {
    StoreError::Engine {
        engine: "embedded",
        message: format!(
            "document failed validation: collection {coll} accepts only documents matching {}",
            rule.as_json()
        ),
    }
}

impl Writer {
    pub(crate) fn new(
        r: Recovered,
        hub: Hub,
        newest_op: Arc<AtomicU64>,
        maint: std::sync::mpsc::Sender<Task>,
        memtable_bytes: u64,
        known_keys_min: usize,
        rotate_asked: Arc<AtomicBool>,
    ) -> Result<Writer> {
        let catalog = r.catalog.lock().map_err(lock_err)?.clone();
        let mut capped = HashMap::new();
        for (name, (oldest, next, sizes, last_seek)) in r.capped {
            let entry = catalog.collections.get(&name);
            let validator = entry
                .and_then(|c| c.validator.as_ref())
                .map(Filter::parse)
                .transpose()
                .map_err(|e| StoreError::Invalid(e.to_string()))?;
            let (count, bytes) = state::retained(&sizes);
            capped.insert(
                name,
                WCapped {
                    max_docs: entry.map_or(u64::MAX, |c| c.max_docs),
                    max_bytes: entry.map_or(u64::MAX, |c| c.max_bytes),
                    indexes: entry.map(|c| c.indexes.clone()).unwrap_or_default(),
                    validator,
                    oldest,
                    next,
                    sizes,
                    count,
                    bytes,
                    newest: Arc::new(AtomicU64::new(next.saturating_sub(1))),
                    last_seek,
                },
            );
        }
        let mut keyed_validators = HashMap::new();
        for (name, c) in &catalog.collections {
            if c.kind == catalog::Kind::Keyed
                && let Some(v) = &c.validator
            {
                keyed_validators.insert(
                    name.clone(),
                    Filter::parse(v).map_err(|e| StoreError::Invalid(e.to_string()))?,
                );
            }
        }
        Ok(Writer {
            fs: r.fs,
            jdir: r.dir.join(journal::DIR),
            dir: r.dir,
            journal: r.journal,
            lsn: r.lsn,
            change_next: r.change_next,
            tree: r.tree,
            shared: r.shared,
            catalog: r.catalog,
            capped,
            keyed_validators,
            cache: KvCache::new(),
            hub,
            newest_op,
            builder: Builder::new(),
            record: Vec::new(),
            maint,
            memtable_bytes,
            rotate_asked,
            last_change_seek: r.last_change_seek,
            known: KnownKeys::new(known_keys_min),
            poisoned: None,
            pending: Vec::new(),
            pending_since: None,
            written_lsn: Arc::new(AtomicU64::new(r.lsn.saturating_sub(1))),
            published: Arc::new(tokio::sync::watch::Sender::new(r.lsn.saturating_sub(1))),
            written_op: Arc::new(AtomicU64::new(r.change_next.saturating_sub(1))),
        })
    }

    /// The last record written, and the last one readers see (see [`Writer::pending`]).
    pub(crate) fn visibility(
        &self,
    ) -> (
        Arc<AtomicU64>,
        Arc<tokio::sync::watch::Sender<u64>>,
        Arc<AtomicU64>,
    ) {
        (
            self.written_lsn.clone(),
            self.published.clone(),
            self.written_op.clone(),
        )
    }

    /// Commits `jobs` (one record); returns each job's result, in order.
    pub(crate) fn commit_group(&mut self, jobs: &mut [Job]) -> Vec<Result<Reply>> {
        if let Some(why) = &self.poisoned {
            let e = StoreError::Engine {
                engine: "embedded",
                message: why.clone(),
            };
            return jobs.iter().map(|_| Err(e.duplicate("embedded"))).collect();
        }
        // Between commits everything written is in the tree: a build may start here.
        self.known.tend(&self.tree, Tree::before(self.lsn));
        let now = now_us();
        let mut group = Group::default();
        let mut results: Vec<Result<Reply>> = Vec::with_capacity(jobs.len());
        let mut sync = false;
        for job in jobs.iter_mut() {
            let op = std::mem::replace(&mut job.op, Op::Barrier);
            let mut out = JobOut::default();
            match self.stage(op, now, &group, &mut out) {
                Ok(reply) => {
                    sync |= job.durability.syncs();
                    results.push(Ok(self.merge(&mut group, out, reply)));
                }
                Err(e) => results.push(Err(e)),
            }
        }
        if let Err(e) = self.write_and_apply(group, now, sync) {
            let engine_err = |r: Result<Reply>| match r {
                Ok(_) => Err(e.duplicate("embedded")),
                Err(own) => Err(own),
            };
            return results.into_iter().map(engine_err).collect();
        }
        if self.rotate_asked.swap(false, Ordering::AcqRel)
            || self.tree.memtable_bytes() >= self.memtable_bytes
        {
            self.rotate();
        }
        results
    }

    /// Seals the tree's memtable (after marking it complete up to the last record) and has the
    /// maintenance thread flush it.
    fn rotate(&mut self) {
        // The tables flushed from this memtable say they hold every record up to the last:
        // that record must be durable first, or a power cut would leave the keyed state ahead
        // of the journal (counters counting events that are gone).
        if self.sync_pending().is_err() {
            return;
        }
        let last = self.lsn.saturating_sub(1);
        self.tree
            .insert(tree::APPLIED, last.to_le_bytes().to_vec(), last);
        if self.tree.rotate() {
            let _ = self.maint.send(Task::Flush);
        }
    }

    /// Joins a staged job to the group; fills in its positions.
    fn merge(&mut self, group: &mut Group, out: JobOut, reply: Reply) -> Reply {
        let mut positions = None;
        for (i, (coll, docs, bodies, hashes)) in out.appends.into_iter().enumerate() {
            let first = group.next_pos(self, &coll);
            if out.answer_append == Some(i) {
                positions = Some((first..first + docs.len() as u64).map(Position).collect());
            }
            group.bytes += bodies.iter().map(Vec::len).sum::<usize>();
            match group.appends.iter_mut().find(|a| a.0 == coll) {
                Some(a) => {
                    a.1.extend(docs);
                    a.2.extend(bodies);
                    a.3.extend(hashes);
                }
                None => group.appends.push((coll, docs, bodies, hashes)),
            }
        }
        for c in &out.changes {
            group.bytes += c.after.as_ref().map_or(0, |a| a.json.len())
                + c.before.as_ref().map_or(0, |b| b.json.len());
        }
        // The first job to stage changes or keys (often the group's only one: a batch's
        // rollups) hands its vector and map over, rather than every key being hashed and
        // inserted again into a map growing from nothing.
        if group.changes.is_empty() {
            group.changes = out.changes;
        } else {
            group.changes.extend(out.changes);
        }
        if group.kv.is_empty() {
            group.kv = out.kv;
        } else {
            for (k, slot) in out.kv {
                match group.kv.get_mut(&k) {
                    Some(existing) => existing.now = slot.now,
                    None => {
                        group.kv.insert(k, slot);
                    }
                }
            }
        }
        group.checkpoints.extend(out.checkpoints);
        group.spills.extend(out.spills);
        match (reply, positions) {
            (Reply::Positions(_), Some(p)) | (Reply::Done, Some(p)) => Reply::Positions(p),
            (r, _) => r,
        }
    }

    /// Stages one operation into `out`.
    fn stage(&mut self, op: Op, now: i64, group: &Group, out: &mut JobOut) -> Result<Reply> {
        match op {
            Op::CreateCapped { name, spec } => {
                self.create_capped(&name, &spec)?;
                let (newest, indexes) = self
                    .capped
                    .get(&name)
                    .map(|c| (c.newest.clone(), Arc::from(c.indexes.as_slice())))
                    .ok_or_else(|| StoreError::Engine {
                        engine: "embedded",
                        message: format!("capped collection {name} was not created"),
                    })?;
                Ok(Reply::Newest(newest, indexes))
            }
            Op::CreateKeyed { name } => {
                self.create_keyed(&name)?;
                Ok(Reply::Done)
            }
            Op::Validate { coll, rule } => {
                self.set_validator(&coll, rule)?;
                Ok(Reply::Done)
            }
            Op::Append {
                coll,
                docs,
                bodies,
                indexed,
                hashes,
            } => {
                let meta = self.capped.get(&coll).ok_or_else(|| {
                    StoreError::Invalid(format!("capped collection {coll} was not opened"))
                })?;
                if bodies.len() != docs.len() {
                    return Err(StoreError::Invalid(format!(
                        "append to {coll}: {} documents and {} encodings",
                        docs.len(),
                        bodies.len()
                    )));
                }
                if let Some(rule) = &meta.validator
                    && docs.iter().any(|d| !rule.matches(d))
                {
                    return Err(refused(&coll, rule));
                }
                let hashes = if *indexed == *meta.indexes && hashes.len() == docs.len() {
                    hashes
                } else {
                    index_hashes(&coll, &meta.indexes, docs.iter())
                };
                if out.answer_append.is_none() {
                    out.answer_append = Some(out.appends.len());
                }
                out.appends.push((coll, docs, bodies, hashes));
                Ok(Reply::Positions(Vec::new()))
            }
            Op::Update { coll, updates } => {
                self.check_keyed(&coll)?;
                for u in &updates {
                    crate::names::check_key(&coll, &u.key)?;
                }
                for u in updates {
                    let current = self.read_kv(&coll, &u.key, group, out)?;
                    let doc = match &current {
                        Some(c) => update::apply_to_copy(&c.doc, u.update)?,
                        None => {
                            let mut d = Document::new();
                            d.insert("_id".into(), u.key.clone().into());
                            update::apply_owned(&mut d, u.update)?;
                            d
                        }
                    };
                    let op = if current.is_some() {
                        ChangeOp::Update
                    } else {
                        ChangeOp::Insert
                    };
                    self.write_kv(&coll, u.key, op, current, doc, now, group, out)?;
                }
                Ok(Reply::Done)
            }
            Op::Set { coll, key, mut doc } => {
                self.check_keyed(&coll)?;
                crate::names::check_key(&coll, &key)?;
                let current = self.read_kv(&coll, &key, group, out)?;
                doc.insert("_id".into(), key.clone().into());
                let op = if current.is_some() {
                    ChangeOp::Replace
                } else {
                    ChangeOp::Insert
                };
                self.write_kv(&coll, key, op, current, doc, now, group, out)?;
                Ok(Reply::Done)
            }
            Op::Delete { coll, key } => {
                self.check_keyed(&coll)?;
                crate::names::check_key(&coll, &key)?;
                let Some(before) = self.read_kv(&coll, &key, group, out)? else {
                    return Ok(Reply::Deleted(false));
                };
                self.delete_kv(&coll, key, before, group, out)?;
                Ok(Reply::Deleted(true))
            }
            Op::Expire {
                coll,
                prefix,
                before,
                limit,
            } => {
                self.check_keyed(&coll)?;
                let n = self.expire(&coll, &prefix, before, limit, group, out)?;
                Ok(Reply::Expired(n))
            }
            Op::Checkpoint { feed, body } => {
                crate::names::check_key("checkpoints", &feed)?;
                out.checkpoints.push((feed, body));
                Ok(Reply::Done)
            }
            Op::Spill { coll, docs } => {
                out.spills.push((coll, docs));
                Ok(Reply::Done)
            }
            Op::Barrier => Ok(Reply::Done),
            Op::Together(ops) => {
                let mut reply = None;
                for op in ops {
                    let r = self.stage(op, now, group, out)?;
                    if reply.is_none() && matches!(r, Reply::Positions(_)) {
                        reply = Some(r);
                    }
                }
                Ok(reply.unwrap_or(Reply::Done))
            }
        }
    }

    fn check_keyed(&self, coll: &str) -> Result<()> {
        let catalog = self.catalog.lock().map_err(lock_err)?;
        match catalog.collections.get(coll) {
            Some(c) if c.kind == catalog::Kind::Keyed => Ok(()),
            _ => Err(StoreError::Invalid(format!(
                "keyed collection {coll} was not opened"
            ))),
        }
    }

    /// The current state of a key: staged by this job, by the group, cached, or in the tree.
    fn read_kv(&self, coll: &str, key: &str, group: &Group, out: &JobOut) -> Result<Option<Kv>> {
        let k = KvRef(coll, key);
        if let Some(slot) = out.kv.get(&k).or_else(|| group.kv.get(&k)) {
            return Ok(slot.now.clone());
        }
        if let Some(kv) = self.cache.get(coll, key) {
            // Every test runs this check too: a cached document that is not the tree's would
            // be updated from a stale state.
            debug_assert_eq!(
                self.read_tree(coll, key).ok().flatten().map(|t| t.json),
                Some(kv.json.clone()),
                "the cache of keyed documents differs from the tree at {coll}/{key}"
            );
            return Ok(Some(kv.clone()));
        }
        if !self.known.may_hold(coll, key) {
            // Every test runs this check: a key the filter left out would be written as new.
            debug_assert!(
                matches!(self.read_tree(coll, key), Ok(None)),
                "the filter of stored keys left out {coll}/{key}"
            );
            return Ok(None);
        }
        self.read_tree(coll, key)
    }

    fn read_tree(&self, coll: &str, key: &str) -> Result<Option<Kv>> {
        // At its own sequence number: its writes not yet shown to readers included.
        let Some(v) = self
            .tree
            .get_at(&tree::doc_key(coll, key), Tree::before(self.lsn))?
        else {
            return Ok(None);
        };
        let (ts, json) = tree::split_value(&v)?;
        let json = std::str::from_utf8(json).map_err(|_| StoreError::Engine {
            engine: "embedded",
            message: format!("keyed state: {coll}/{key} is not UTF-8"),
        })?;
        Ok(Some(Kv {
            doc: Arc::new(format::parse_doc(json.as_bytes())?),
            json: Arc::from(json),
            ts,
        }))
    }

    /// The write time the tree held for a key before this group (for its write-time index
    /// entry): as staged by the job or the group when they touched it, else `current`'s.
    fn orig_ts(k: &KvRef<'_>, group: &Group, out: &JobOut, current: Option<&Kv>) -> Option<i64> {
        match out.kv.get(k).or_else(|| group.kv.get(k)) {
            Some(slot) => slot.orig_ts,
            None => current.map(|c| c.ts),
        }
    }

    /// Stages a key's new state in the job (its key is copied only the first time the job
    /// writes it: a source's summary is written for every event of a batch).
    fn put_slot(out: &mut JobOut, coll: &str, key: &str, slot: Slot) {
        match out.kv.get_mut(&KvRef(coll, key)) {
            Some(staged) => *staged = slot,
            None => {
                out.kv.insert((coll.to_owned(), key.to_owned()), slot);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn write_kv(
        &self,
        coll: &str,
        key: String,
        op: ChangeOp,
        before: Option<Kv>,
        doc: Document,
        now: i64,
        group: &Group,
        out: &mut JobOut,
    ) -> Result<()> {
        if let Some(rule) = self.keyed_validators.get(coll)
            && !rule.matches(&doc)
        {
            return Err(refused(coll, rule));
        }
        let json = format::doc_json(&doc)?;
        let after = Kv {
            doc: Arc::new(doc),
            json,
            ts: now,
        };
        let orig_ts = Self::orig_ts(&KvRef(coll, &key), group, out, before.as_ref());
        Self::put_slot(
            out,
            coll,
            &key,
            Slot {
                now: Some(after.clone()),
                orig_ts,
            },
        );
        out.changes.push(StagedChange {
            op,
            coll: coll.to_owned(),
            key,
            before,
            after: Some(after),
        });
        Ok(())
    }

    fn delete_kv(
        &self,
        coll: &str,
        key: String,
        before: Kv,
        group: &Group,
        out: &mut JobOut,
    ) -> Result<()> {
        let orig_ts = Self::orig_ts(&KvRef(coll, &key), group, out, Some(&before));
        Self::put_slot(out, coll, &key, Slot { now: None, orig_ts });
        out.changes.push(StagedChange {
            op: ChangeOp::Delete,
            coll: coll.to_owned(),
            key,
            before: Some(before),
            after: None,
        });
        Ok(())
    }

    /// Stages the deletes of up to `limit` keys of `coll` starting with `prefix` whose last
    /// write is older than `before`, oldest first.
    fn expire(
        &self,
        coll: &str,
        prefix: &str,
        before: i64,
        limit: usize,
        group: &Group,
        out: &mut JobOut,
    ) -> Result<u64> {
        if limit == 0 {
            return Ok(0);
        }
        let tprefix = tree::time_prefix(coll);
        let last_bucket = tree::bucket(before);
        let seqno = Tree::before(self.lsn);
        let mut candidates: Vec<(i64, String, Kv)> = Vec::new();
        let mut after: Option<Vec<u8>> = None;
        'scan: loop {
            let page = self.tree.page(&tprefix, after.as_deref(), 1024, seqno)?;
            let Some((last, _)) = page.last() else { break };
            after = Some(last.to_vec());
            let full = page.len() == 1024;
            let mut bucket_of_page = 0;
            for (k, _) in page {
                let rest = &k[tprefix.len()..];
                if rest.len() < 8 {
                    continue;
                }
                let mut b = [0u8; 8];
                b.copy_from_slice(&rest[..8]);
                let bucket = u64::from_be_bytes(b);
                if bucket > last_bucket {
                    break 'scan;
                }
                // Once enough keys are found in older buckets, the rest are newer.
                if candidates.len() >= limit && bucket > bucket_of_page {
                    break 'scan;
                }
                bucket_of_page = bucket;
                let Ok(key) = std::str::from_utf8(&rest[8..]) else {
                    continue;
                };
                if !key.starts_with(prefix) {
                    continue;
                }
                let k = KvRef(coll, key);
                if out.kv.contains_key(&k) || group.kv.contains_key(&k) {
                    // Written (or deleted) by this group: not idle.
                    continue;
                }
                let Some(kv) = self.read_tree(coll, key)? else {
                    continue;
                };
                if kv.ts < before && tree::bucket(kv.ts) == bucket {
                    candidates.push((kv.ts, key.to_owned(), kv));
                }
            }
            if !full {
                break;
            }
        }
        candidates.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
        candidates.truncate(limit);
        let n = candidates.len() as u64;
        for (_, key, kv) in candidates {
            self.delete_kv(coll, key, kv, group, out)?;
        }
        Ok(n)
    }

    pub(crate) fn create_capped(&mut self, name: &str, spec: &CappedSpec) -> Result<()> {
        let mut new_fields = Vec::new();
        {
            let mut catalog = self.catalog.lock().map_err(lock_err)?;
            let entry = catalog
                .collections
                .entry(name.to_owned())
                .or_insert_with(|| catalog::Collection::new(catalog::Kind::Capped));
            if entry.kind != catalog::Kind::Capped {
                return Err(StoreError::Incompatible {
                    collection: name.to_string(),
                    problem: "exists as a keyed collection, not a capped one".into(),
                });
            }
            for field in &spec.indexes {
                crate::names::check_field(field)?;
                if !entry.indexes.contains(field) {
                    entry.indexes.push(field.clone());
                    new_fields.push(field.clone());
                }
            }
            // Limits may change between runs: the new ones apply from the next append.
            entry.max_docs = spec.max_docs;
            entry.max_bytes = spec.max_bytes;
            let indexes = entry.indexes.clone();
            let validator = entry
                .validator
                .as_ref()
                .map(Filter::parse)
                .transpose()
                .map_err(|e| StoreError::Invalid(e.to_string()))?;
            catalog.save(&*self.fs, &self.dir)?;
            let c = self
                .capped
                .entry(name.to_owned())
                .or_insert_with(|| WCapped {
                    max_docs: spec.max_docs,
                    max_bytes: spec.max_bytes,
                    indexes: Vec::new(),
                    validator: None,
                    oldest: 1,
                    next: 1,
                    sizes: VecDeque::new(),
                    count: 0,
                    bytes: 0,
                    newest: Arc::new(AtomicU64::new(0)),
                    last_seek: None,
                });
            c.max_docs = spec.max_docs;
            c.max_bytes = spec.max_bytes;
            c.indexes = indexes;
            c.validator = validator;
        }
        {
            let mut shared = self.shared.write().map_err(lock_err)?;
            shared
                .capped
                .entry(name.to_owned())
                .or_insert_with(|| state::CappedView {
                    oldest: 1,
                    next: 1,
                    journal_from: 1,
                    ..Default::default()
                });
        }
        if !new_fields.is_empty() {
            super::recover::backfill_index(
                &*self.fs,
                &self.jdir,
                &self.shared,
                &self.tree,
                name,
                &new_fields,
            )?;
        }
        Ok(())
    }

    pub(crate) fn create_keyed(&mut self, name: &str) -> Result<()> {
        let mut catalog = self.catalog.lock().map_err(lock_err)?;
        match catalog.collections.get(name) {
            Some(c) if c.kind == catalog::Kind::Keyed => Ok(()),
            Some(_) => Err(StoreError::Incompatible {
                collection: name.to_string(),
                problem: "exists as a capped collection, not a keyed one".into(),
            }),
            None => {
                catalog.collections.insert(
                    name.to_owned(),
                    catalog::Collection::new(catalog::Kind::Keyed),
                );
                catalog.save(&*self.fs, &self.dir)
            }
        }
    }

    fn set_validator(&mut self, coll: &str, rule: Option<Filter>) -> Result<()> {
        let mut catalog = self.catalog.lock().map_err(lock_err)?;
        let entry = catalog
            .collections
            .get_mut(coll)
            .ok_or_else(|| StoreError::Invalid(format!("collection {coll} does not exist")))?;
        entry.validator = rule.as_ref().map(|r| r.as_json().clone());
        let kind = entry.kind;
        catalog.save(&*self.fs, &self.dir)?;
        match kind {
            catalog::Kind::Capped => {
                if let Some(c) = self.capped.get_mut(coll) {
                    c.validator = rule;
                }
            }
            catalog::Kind::Keyed => match rule {
                Some(r) => {
                    self.keyed_validators.insert(coll.to_owned(), r);
                }
                None => {
                    self.keyed_validators.remove(coll);
                }
            },
        }
        Ok(())
    }

    /// Writes the group's record, syncs it if asked, applies and publishes it.
    fn write_and_apply(&mut self, group: Group, now: i64, sync: bool) -> Result<()> {
        // Evictions: each appended collection keeps its newest documents within its limits.
        let mut oldest_after: HashMap<String, (u64, usize, u64, u64)> = HashMap::new();
        for (coll, docs, bodies, _) in &group.appends {
            let Some(c) = self.capped.get(coll.as_str()) else {
                continue;
            };
            let (mut count, mut bytes) = (c.count, c.bytes);
            for b in bodies {
                count += 1;
                bytes += b.len() as u64;
            }
            // Walk from the oldest, over the existing sizes and then the new documents.
            let (mut oldest, mut i) = (c.oldest, 0usize);
            let total = c.sizes.len() + docs.len();
            while i + 1 < total && (count > c.max_docs || bytes > c.max_bytes) {
                let size = if i < c.sizes.len() {
                    c.sizes[i]
                } else {
                    bodies[i - c.sizes.len()].len() as u32
                };
                if size != u32::MAX {
                    count -= 1;
                    bytes -= size as u64;
                }
                i += 1;
                oldest += 1;
            }
            // Past holes too, so the oldest position holds a document.
            while i + 1 < total {
                let size = if i < c.sizes.len() { c.sizes[i] } else { 0 };
                if size != u32::MAX {
                    break;
                }
                i += 1;
                oldest += 1;
            }
            oldest_after.insert(coll.clone(), (oldest, i, count, bytes));
        }

        // A spill writes nothing into the record, but it takes one: its tree writes then carry
        // a sequence number of their own, which the release waits to see persisted.
        let has_entries = !group.appends.is_empty()
            || !group.changes.is_empty()
            || !group.checkpoints.is_empty()
            || !group.spills.is_empty();
        let lsn = self.lsn;
        let change_first = self.change_next;
        let mut written = None;
        if has_entries {
            let b = &mut self.builder;
            b.clear();
            for (coll, docs, bodies, _) in &group.appends {
                let first = self.capped.get(coll.as_str()).map_or(1, |c| c.next);
                let oldest = oldest_after.get(coll.as_str()).map_or(first, |o| o.0);
                b.section(coll, first, oldest);
                for body in bodies {
                    b.doc(body);
                }
                let _ = docs;
            }
            for (i, c) in group.changes.iter().enumerate() {
                b.change(
                    change_first + i as u64,
                    c.op,
                    &c.coll,
                    &c.key,
                    c.before.as_ref().map(|k| k.json.as_bytes()),
                    c.after.as_ref().map(|k| k.json.as_bytes()),
                );
            }
            for (feed, body) in &group.checkpoints {
                b.checkpoint(feed, body.as_bytes());
            }
            b.finish(lsn, now, self.journal.last_crc(), &mut self.record);
            let w = self.journal.append(&self.record);
            let w = self.poison_on_sync_failure(w)?;
            if w.rolled {
                // Finishing the segment synced every record before this one.
                self.publish_pending();
            }
            written = Some(w);
        }
        if sync {
            let synced = self.journal.sync();
            self.poison_on_sync_failure(synced)?;
        }
        // Applied from here on: nothing below may fail the group.
        let mut commit = Commit::default();
        let commit_bytes = group.bytes as u64;
        let mut publication = Publication {
            lsn: lsn.saturating_sub(u64::from(written.is_none())),
            ..Publication::default()
        };
        if let Some(w) = written {
            self.lsn += 1;
            self.written_lsn.store(lsn, Ordering::Release);
            self.apply_journal_meta(&group, w, lsn, &oldest_after);
        }
        // Capped collections.
        for (coll, docs, bodies, _) in group.appends {
            let Some(c) = self.capped.get_mut(&coll) else {
                continue;
            };
            let first = c.next;
            for b in &bodies {
                c.sizes.push_back(b.len() as u32);
            }
            c.next += docs.len() as u64;
            if let Some(&(oldest, drop_n, count, bytes)) = oldest_after.get(coll.as_str()) {
                for _ in 0..drop_n {
                    c.sizes.pop_front();
                }
                c.oldest = oldest;
                c.count = count;
                c.bytes = bytes;
            }
            // Written, not yet shown: a tail started `Now` starts after it (and waits for it).
            c.newest.store(c.next - 1, Ordering::Release);
            publication.views.push((
                coll.clone(),
                ViewUpdate {
                    oldest: c.oldest,
                    next: c.next,
                    count: c.count,
                    bytes: c.bytes,
                },
            ));
            commit.appended.push((coll, LiveAppend { first, docs }));
        }
        // Keyed state, checkpoints, spills: into the tree, as of this record.
        let seqno = if written.is_some() {
            lsn
        } else {
            lsn.saturating_sub(1)
        };
        for ((coll, key), slot) in group.kv {
            let dk = tree::doc_key(&coll, &key);
            if let Some(orig) = slot.orig_ts {
                let moved = slot
                    .now
                    .as_ref()
                    .is_none_or(|n| tree::bucket(n.ts) != tree::bucket(orig));
                if moved {
                    self.tree
                        .remove(tree::time_key(&coll, tree::bucket(orig), &key), seqno);
                }
            }
            match slot.now {
                Some(kv) => {
                    if slot
                        .orig_ts
                        .is_none_or(|o| tree::bucket(o) != tree::bucket(kv.ts))
                    {
                        self.tree.insert(
                            tree::time_key(&coll, tree::bucket(kv.ts), &key),
                            Vec::new(),
                            seqno,
                        );
                    }
                    self.tree
                        .insert(dk, tree::value(kv.ts, kv.json.as_bytes()), seqno);
                    self.known.written(&coll, &key);
                    if slot.orig_ts.is_some() {
                        // A key written before is likely written again (a hot counter, a
                        // summary); a new one, on a long tail, mostly is not.
                        self.cache.put(&coll, &key, kv);
                    } else {
                        self.cache.remove(&coll, &key);
                    }
                }
                None => {
                    self.tree.remove(dk, seqno);
                    self.cache.remove(&coll, &key);
                }
            }
        }
        for (feed, body) in group.checkpoints {
            self.tree
                .insert(tree::checkpoint_key(&feed), body.into_bytes(), seqno);
        }
        for (coll, docs) in group.spills {
            for (pos, ts, json) in docs {
                self.tree
                    .insert(tree::spill_key(&coll, pos), tree::value(ts, &json), seqno);
            }
        }
        publication.tree_seqno = Some(seqno);
        // Changes.
        if !group.changes.is_empty() {
            for (i, c) in group.changes.into_iter().enumerate() {
                let seq = change_first + i as u64;
                commit.changes.push(LiveChange {
                    op: c.op,
                    collection: c.coll,
                    key: c.key,
                    before: c.before.map(|k| k.doc),
                    after: c.after.map(|k| k.doc),
                    seq,
                });
            }
            self.change_next = change_first + commit.changes.len() as u64;
            self.written_op
                .store(self.change_next - 1, Ordering::Release);
            publication.changes = Some((change_first, self.change_next));
        }
        if !commit.appended.is_empty() || !commit.changes.is_empty() {
            publication.commit = Some((commit, commit_bytes));
        }
        if self.pending.is_empty() {
            self.pending_since = Some(std::time::Instant::now());
        }
        self.pending.push(publication);
        if sync || !self.journal.dirty() {
            self.publish_pending();
        }
        Ok(())
    }

    /// A journal error as it is returned; a failed sync poisons the writer first.
    fn poison_on_sync_failure<T>(&mut self, r: Result<T>) -> Result<T> {
        if r.is_err() && self.journal.sync_failed() {
            self.poison(format!(
                "a journal sync failed ({}); nothing more is written until tailrace restarts",
                r.as_ref()
                    .err()
                    .map(ToString::to_string)
                    .unwrap_or_default()
            ));
        }
        r
    }

    /// Stops all writing: what the disk holds since the last good sync is unknown. What was
    /// waiting for a sync is never shown to readers.
    fn poison(&mut self, why: String) {
        self.pending.clear();
        self.pending_since = None;
        self.poisoned = Some(why);
        self.release_readers();
    }

    /// Lets go of readers waiting to see writes that will never be shown (a poisoned or
    /// closed writer): they read what is shown.
    pub(crate) fn release_readers(&self) {
        let written = self.written_lsn.load(Ordering::Acquire);
        self.published.send_if_modified(|p| {
            let was = *p;
            *p = (*p).max(written);
            *p != was
        });
    }

    /// How long the oldest commit not yet shown to readers has waited for a sync (`None`:
    /// none waits).
    pub(crate) fn pending_for(&self) -> Option<std::time::Duration> {
        self.pending_since.map(|t| t.elapsed())
    }

    /// Syncs the journal and shows readers every commit that waited for it.
    pub(crate) fn sync_pending(&mut self) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let synced = self.journal.sync();
        self.poison_on_sync_failure(synced)?;
        self.publish_pending();
        Ok(())
    }

    /// Shows readers the commits whose records are synced (all that wait: the journal was
    /// just synced), in order: positions, counts, the keyed state's sequence number, the
    /// change log's end, and the live broadcast.
    fn publish_pending(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let pending = std::mem::take(&mut self.pending);
        self.pending_since = None;
        let mut last_lsn = 0;
        let mut tree_seqno = None;
        if let Ok(mut shared) = self.shared.write() {
            for p in &pending {
                for (coll, v) in &p.views {
                    if let Some(view) = shared.capped.get_mut(coll) {
                        view.oldest = v.oldest;
                        view.next = v.next;
                        view.count = v.count;
                        view.bytes = v.bytes;
                    }
                }
                if let Some((first, next)) = p.changes {
                    shared.change_next = next;
                    if shared.change_first == 0 {
                        shared.change_first = first;
                    }
                }
                tree_seqno = p.tree_seqno.or(tree_seqno);
                last_lsn = last_lsn.max(p.lsn);
            }
            if let Some(seqno) = tree_seqno {
                self.tree.publish(seqno);
            }
            shared.point = (self.tree.visible(), shared.change_next.saturating_sub(1));
        }
        for p in pending {
            if let Some((_, next)) = p.changes {
                self.newest_op.store(next - 1, Ordering::Release);
            }
            if let Some((mut commit, bytes)) = p.commit {
                commit.committed_at_us = now_us();
                self.hub.send(commit, bytes);
            }
        }
        self.published.send_if_modified(|p| {
            let was = *p;
            *p = (*p).max(last_lsn);
            *p != was
        });
    }

    /// After a record was written: the segment table, seek points, index entries and the
    /// capped views readers use.
    fn apply_journal_meta(
        &mut self,
        group: &Group,
        w: journal::Written,
        lsn: u64,
        oldest_after: &HashMap<String, (u64, usize, u64, u64)>,
    ) {
        let Ok(mut shared) = self.shared.write() else {
            return;
        };
        if w.rolled || !shared.segments.contains_key(&w.seq) {
            // The previous segment is finished: its index goes to a file (maintenance).
            if let Some((&prev, _)) = shared.segments.iter().next_back()
                && prev < w.seq
            {
                self.seal(&mut shared, prev);
            }
            match Segment::open(&*self.fs, &self.jdir, w.seq) {
                Ok(seg) => {
                    shared.segments.insert(
                        w.seq,
                        SegInfo {
                            seg,
                            first_lsn: lsn,
                            last_lsn: 0,
                            end: 0,
                            changes: (self.change_next, self.change_next),
                            colls: Default::default(),
                            index: SegIndex::Memory(MemIndex::default()),
                        },
                    );
                }
                Err(e) => {
                    self.poisoned = Some(format!("the journal's new segment cannot be read: {e}"));
                    return;
                }
            }
        }
        let end = self.journal.tail();
        let change_end = self.change_next + group.changes.len() as u64;
        let mut seeks: Vec<(String, Seek)> = Vec::new();
        let mut change_seek = None;
        {
            let Some(info) = shared.segments.get_mut(&w.seq) else {
                return;
            };
            if info.last_lsn == 0 {
                // Its first record (a segment recovered empty, made by a roll before a crash,
                // has had no number of its own until now).
                info.first_lsn = lsn;
            }
            info.last_lsn = lsn;
            info.end = end;
            if info.changes.0 == info.changes.1 {
                info.changes = (self.change_next, self.change_next);
            }
            info.changes.1 = change_end;
            for (coll, docs, _, hashes) in &group.appends {
                let Some(c) = self.capped.get_mut(coll.as_str()) else {
                    continue;
                };
                let first = c.next;
                let end_pos = first + docs.len() as u64;
                let oldest = oldest_after.get(coll.as_str()).map_or(c.oldest, |o| o.0);
                let sc = info.colls.entry(coll.clone()).or_insert(SegColl {
                    first,
                    end: first,
                    oldest_after: oldest,
                });
                sc.end = end_pos;
                sc.oldest_after = oldest;
                if let SegIndex::Memory(m) = &mut info.index {
                    for (i, hs) in hashes.iter().enumerate() {
                        for h in hs {
                            m.push(*h, first + i as u64);
                        }
                    }
                }
                let due = match c.last_seek {
                    Some((seq, off)) => seq != w.seq || w.offset >= off + SEEK_EVERY,
                    None => true,
                };
                if due {
                    c.last_seek = Some((w.seq, w.offset));
                    seeks.push((
                        coll.clone(),
                        Seek {
                            pos: first,
                            seq: w.seq,
                            off: w.offset,
                        },
                    ));
                }
            }
            if !group.changes.is_empty() {
                let due = match self.last_change_seek {
                    Some((seq, off)) => seq != w.seq || w.offset >= off + SEEK_EVERY,
                    None => true,
                };
                if due {
                    self.last_change_seek = Some((w.seq, w.offset));
                    change_seek = Some(Seek {
                        pos: self.change_next,
                        seq: w.seq,
                        off: w.offset,
                    });
                }
            }
        }
        for (coll, seek) in seeks {
            if let Some(v) = shared.capped.get_mut(&coll) {
                v.seeks.push_back(seek);
            }
        }
        if let Some(s) = change_seek {
            shared.change_seeks.push_back(s);
        }
    }

    /// Freezes segment `seq`'s index and asks for its file.
    fn seal(&self, shared: &mut Shared, seq: u64) {
        let Some(info) = shared.segments.get_mut(&seq) else {
            return;
        };
        let SegIndex::Memory(m) =
            std::mem::replace(&mut info.index, SegIndex::Sealed(Arc::default()))
        else {
            return;
        };
        let entries = Arc::new(m.into_sorted());
        info.index = SegIndex::Sealed(entries.clone());
        let summary = super::recover::summarize(shared, seq, &self.capped_sizes());
        if let Some(summary) = summary {
            let _ = self.maint.send(Task::WriteIndex {
                path: journal::index_path(&self.jdir, seq),
                summary,
                entries,
            });
        }
    }

    /// Each capped collection's oldest position and sizes from it.
    fn capped_sizes(&self) -> HashMap<String, (u64, Vec<u32>)> {
        self.capped
            .iter()
            .map(|(k, c)| (k.clone(), (c.oldest, c.sizes.iter().copied().collect())))
            .collect()
    }

    /// Imports documents of a capped collection at the positions they had (the conversion of
    /// an earlier layout): positions between the collection's next one and `first` hold no
    /// document. One record, committed at `ts`.
    pub(crate) fn import_capped(
        &mut self,
        coll: &str,
        first: u64,
        docs: Vec<(Document, String)>,
        ts: i64,
    ) -> Result<()> {
        let c = self.capped.get_mut(coll).ok_or_else(|| {
            StoreError::Invalid(format!("capped collection {coll} was not opened"))
        })?;
        if first < c.next {
            return Err(StoreError::Invalid(format!(
                "importing {coll} at position {first}, below its next position {}",
                c.next
            )));
        }
        if c.count == 0 {
            c.sizes.clear();
            c.oldest = first;
        } else {
            for _ in c.next..first {
                c.sizes.push_back(u32::MAX);
            }
        }
        c.next = first;
        let (oldest, next) = (c.oldest, c.next);
        if let Ok(mut shared) = self.shared.write()
            && let Some(v) = shared.capped.get_mut(coll)
        {
            v.oldest = oldest;
            v.next = next;
            v.journal_from = v.journal_from.min(first).max(1);
        }
        let indexes = self
            .capped
            .get(coll)
            .map(|c| c.indexes.clone())
            .unwrap_or_default();
        let hashes = docs
            .iter()
            .map(|(d, _)| {
                indexes
                    .iter()
                    .filter_map(|f| state::value_hash(coll, f, update::get_path(d, f)))
                    .collect()
            })
            .collect();
        let (docs, bodies): (Vec<Document>, Vec<Vec<u8>>) = docs
            .into_iter()
            .map(|(d, body)| (d, body.into_bytes()))
            .unzip();
        let docs = Docs::from(docs.into_iter().map(Arc::new).collect::<Arc<[_]>>());
        let group = Group {
            appends: vec![(coll.to_owned(), docs, bodies, hashes)],
            ..Group::default()
        };
        self.write_and_apply(group, ts, false)
    }

    /// Imports changes with the sequence numbers they had, from `first_seq` on (the
    /// conversion of an earlier layout): into the change log only, not into the keyed state
    /// (which is imported as it is now). One record, committed at `ts`.
    pub(crate) fn import_changes(
        &mut self,
        first_seq: u64,
        ts: i64,
        changes: Vec<ImportedChange>,
    ) -> Result<()> {
        if first_seq < self.change_next {
            return Err(StoreError::Invalid(format!(
                "importing changes from {first_seq}, below the next sequence number {}",
                self.change_next
            )));
        }
        let empty = self.newest_op.load(Ordering::Acquire) == 0;
        self.change_next = first_seq;
        if let Ok(mut shared) = self.shared.write() {
            shared.change_next = first_seq;
            if empty {
                shared.change_first = first_seq;
            }
        }
        let group = Group {
            changes: changes
                .into_iter()
                .map(|(op, coll, key, before, after)| StagedChange {
                    op,
                    coll,
                    key,
                    before,
                    after,
                })
                .collect(),
            ..Group::default()
        };
        self.write_and_apply(group, ts, false)
    }

    /// Imports a keyed document as it is now, written at `ts` (the conversion of an earlier
    /// layout): into the keyed state, without a change.
    pub(crate) fn import_kv(&mut self, coll: &str, key: &str, json: &str, ts: i64) {
        if !tree::fits(coll, key) {
            crate::telemetry::Problem {
                error_type: "key_too_long",
                detail: &format!(
                    "converting: {coll}/{:?}… has a key of {} bytes, more than the keyed state holds; the document is left out",
                    key.chars().take(24).collect::<String>(),
                    key.len()
                ),
            }
            .warn();
            return;
        }
        let seqno = self.lsn.saturating_sub(1);
        self.tree.insert(
            tree::time_key(coll, tree::bucket(ts), key),
            Vec::new(),
            seqno,
        );
        self.tree.insert(
            tree::doc_key(coll, key),
            tree::value(ts, json.as_bytes()),
            seqno,
        );
        self.known.written(coll, key);
        self.tree.publish(seqno);
    }

    /// Imports a feed's checkpoint (the conversion of an earlier layout).
    pub(crate) fn import_checkpoint(&mut self, feed: &str, body: &str) {
        let seqno = self.lsn.saturating_sub(1);
        self.tree
            .insert(tree::checkpoint_key(feed), body.as_bytes().to_vec(), seqno);
        self.tree.publish(seqno);
    }

    /// Makes the next change's sequence number at least `seq` (the conversion of an earlier
    /// layout, whose newest changes may have been trimmed), durably (in the catalog).
    pub(crate) fn continue_changes_at(&mut self, seq: u64) -> Result<()> {
        if seq <= self.change_next {
            return Ok(());
        }
        let empty = self.newest_op.load(Ordering::Acquire) == 0;
        self.change_next = seq;
        self.newest_op.store(seq - 1, Ordering::Release);
        if let Ok(mut shared) = self.shared.write() {
            shared.change_next = seq;
            if empty {
                shared.change_first = seq;
            }
        }
        let mut catalog = self.catalog.lock().map_err(lock_err)?;
        catalog.next_change = catalog.next_change.max(seq);
        if empty {
            catalog.first_change = seq;
        }
        catalog.save(&*self.fs, &self.dir)
    }

    /// Makes a capped collection's next position at least `pos` (as above), durably.
    pub(crate) fn continue_positions_at(&mut self, coll: &str, pos: u64) -> Result<()> {
        let Some(c) = self.capped.get_mut(coll) else {
            return Ok(());
        };
        if pos <= c.next {
            return Ok(());
        }
        if c.count == 0 {
            c.sizes.clear();
            c.oldest = pos;
        } else {
            for _ in c.next..pos {
                c.sizes.push_back(u32::MAX);
            }
        }
        c.next = pos;
        c.newest.store(pos - 1, Ordering::Release);
        let (oldest, next) = (c.oldest, c.next);
        if let Ok(mut shared) = self.shared.write()
            && let Some(v) = shared.capped.get_mut(coll)
        {
            v.oldest = oldest;
            v.next = next;
        }
        let mut catalog = self.catalog.lock().map_err(lock_err)?;
        if let Some(entry) = catalog.collections.get_mut(coll) {
            entry.next_pos = entry.next_pos.max(next);
            if entry.oldest_pos < oldest {
                entry.oldest_pos = oldest;
            }
            entry.journal_from = entry.journal_from.max(entry.oldest_pos.min(next));
        }
        catalog.save(&*self.fs, &self.dir)
    }

    /// Syncs what the journal holds.
    pub(crate) fn sync_journal(&mut self) -> Result<()> {
        self.journal.sync()
    }

    /// Seals the memtable now (its flush is queued for the maintenance thread).
    pub(crate) fn seal_memtable(&mut self) {
        self.rotate();
    }

    /// Seals the memtable when it holds as much as a commit would seal it at (the conversion
    /// of an earlier layout, which writes keys without commits); whether it did.
    pub(crate) fn seal_if_full(&mut self) -> bool {
        let full = self.tree.memtable_bytes() >= self.memtable_bytes;
        if full {
            self.rotate();
        }
        full
    }

    /// Has the memtable sealed after the next commit.
    pub(crate) fn request_rotation(&self) {
        self.rotate_asked.store(true, Ordering::Release);
    }
}

/// The writer behind its lock, shared by the writer thread, the maintenance thread and setup.
pub(crate) struct WriterCell {
    /// `None` once the store is closed.
    writer: Mutex<Option<Writer>>,
}

impl WriterCell {
    pub(crate) fn new(writer: Writer) -> Self {
        WriterCell {
            writer: Mutex::new(Some(writer)),
        }
    }

    /// Runs `f` on the writer (for setup that needs it, and tests).
    pub(crate) fn with<T>(&self, f: impl FnOnce(&mut Writer) -> T) -> Result<T> {
        let mut guard = self.writer.lock().map_err(|_| poisoned())?;
        let writer = guard.as_mut().ok_or(StoreError::Closed)?;
        Ok(f(writer))
    }

    /// Takes the writer out (after the writer thread has stopped).
    pub(crate) fn close(&self) -> Result<Option<Writer>> {
        let writer = self.writer.lock().map_err(|_| poisoned())?.take();
        if let Some(w) = &writer {
            w.release_readers();
        }
        Ok(writer)
    }
}

fn poisoned() -> StoreError {
    StoreError::Engine {
        engine: "embedded",
        message: "the writer panicked during a commit; reopen the store".into(),
    }
}

/// The writer thread: commits what callers queued, everything queued at once (up to
/// [`MAX_GROUP`] jobs or [`MAX_GROUP_BYTES`]) in one record, until every sender is gone.
/// With `stall`, it first waits for maintenance whenever the keyed state is behind
/// ([`Tree::behind`]), so that its memory stays bounded however fast writes come.
pub(crate) fn run(cell: Arc<WriterCell>, mut rx: mpsc::Receiver<Job>, stall: Option<Arc<Tree>>) {
    // A clock for the wait of commits not yet synced (a runtime of its own: the job queue is
    // async, and a blocking receive has no timeout).
    let Ok(clock) = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
    else {
        tracing::error!("the writer thread could not start its clock; no write is committed");
        return;
    };
    loop {
        // Commits that did not ask for a sync wait for one at most `LAZY_SYNC_AFTER`: the next
        // job may sync them anyway, and several share one sync.
        let waiting = cell
            .writer
            .lock()
            .ok()
            .and_then(|w| w.as_ref().map(Writer::pending_for));
        let first = match waiting {
            Some(Some(waited)) => {
                let left = LAZY_SYNC_AFTER.saturating_sub(waited);
                match clock.block_on(async { tokio::time::timeout(left, rx.recv()).await }) {
                    Ok(job) => job,
                    Err(_) => {
                        if let Ok(mut guard) = cell.writer.lock()
                            && let Some(writer) = guard.as_mut()
                        {
                            // A failure poisons the writer; the next write says so.
                            let _ = writer.sync_pending();
                        }
                        continue;
                    }
                }
            }
            _ => rx.blocking_recv(),
        };
        let Some(first) = first else {
            break;
        };
        if let Some(tree) = &stall
            && tree.behind()
        {
            let waited = tree.stall(STALL_LIMIT);
            if waited >= STALL_LIMIT {
                crate::telemetry::Problem {
                    error_type: "write_stall",
                    detail: &format!(
                        "writes waited {waited:?} for the keyed state's flushes and merges, which are behind; going on"
                    ),
                }
                .warn();
            }
        }
        let mut bytes = first.op.bytes();
        let mut jobs = vec![first];
        let mut guard = match cell.writer.lock() {
            Ok(guard) => guard,
            Err(_) => {
                answer(jobs, || Err(poisoned()));
                continue;
            }
        };
        while jobs.len() < MAX_GROUP && bytes < MAX_GROUP_BYTES {
            match rx.try_recv() {
                Ok(job) => {
                    bytes += job.op.bytes();
                    jobs.push(job);
                }
                Err(_) => break,
            }
        }
        let results = match guard.as_mut() {
            Some(writer) => {
                let results = writer.commit_group(&mut jobs);
                if writer.pending_for().is_some_and(|w| w >= LAZY_SYNC_AFTER) {
                    let _ = writer.sync_pending();
                }
                results
            }
            None => jobs.iter().map(|_| Err(StoreError::Closed)).collect(),
        };
        drop(guard);
        let mut results = results.into_iter();
        answer(jobs, || results.next().unwrap_or(Err(StoreError::Closed)));
    }
    // Every sender gone (the store closing): what waits is synced and shown.
    if let Ok(mut guard) = cell.writer.lock()
        && let Some(writer) = guard.as_mut()
    {
        let _ = writer.sync_pending();
    }
}

/// The longest the writer waits for maintenance at a time (see [`run`]): past it, it goes on
/// and says so.
const STALL_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The longest a commit that did not ask for a sync waits for one (and readers for it). A
/// caller that reads its own write does not wait for it: its read asks for the sync
/// (`Inner::caught_up`).
const LAZY_SYNC_AFTER: std::time::Duration = std::time::Duration::from_millis(2);

/// Sends each job its answer (unacknowledged jobs have nobody waiting).
fn answer(jobs: Vec<Job>, mut result: impl FnMut() -> Result<Reply>) {
    for job in jobs {
        let r = result();
        if let Some(tx) = job.reply {
            let _ = tx.send(r);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A borrowed key finds what was staged under the owned one, and only that: if the two
    /// hashed differently, a job's second update of a key would not see its first.
    #[test]
    fn a_borrowed_key_finds_the_owned_one() {
        let mut m: KvMap = KvMap::default();
        for (c, k) in [
            ("rollups", "hashtags:東京"),
            ("rollups", "source:a"),
            ("r", "ollups"),
        ] {
            m.insert(
                (c.to_owned(), k.to_owned()),
                Slot {
                    now: None,
                    orig_ts: Some(k.len() as i64),
                },
            );
        }
        let ts = |c, k| m.get(&KvRef(c, k)).map(|s| s.orig_ts);
        assert_eq!(ts("rollups", "hashtags:東京"), Some(Some(15)));
        assert_eq!(ts("rollups", "source:a"), Some(Some(8)));
        assert_eq!(ts("r", "ollups"), Some(Some(6)));
        assert_eq!(ts("rollup", "ssource:a"), None);
        assert_eq!(ts("rollups", "hashtags:东京"), None);
    }

    fn kv(json: &str) -> Kv {
        Kv {
            doc: Arc::new(serde_json::from_str(json).expect("a test document")),
            json: Arc::from(json),
            ts: 0,
        }
    }

    /// What the writer does with a key it updates: read it (from the cache when there) and
    /// write it back.
    fn update(cache: &mut KvCache, coll: &str, key: &str, json: &str) -> bool {
        let hit = cache.get(coll, key).is_some();
        cache.put(coll, key, kv(json));
        hit
    }

    /// On a long tail (every event a new hashtag, as at 10^7 distinct values) the keys written
    /// on every event stay cached, and the cache stays within its bytes; a key written twice
    /// in a row is found the second time.
    #[test]
    fn a_long_tail_leaves_the_hot_keys_cached() {
        let mut cache = KvCache::new();
        let hot = ["source:a", "lang:en", "hashtags:東京"];
        let mut misses = 0;
        for i in 0..100_000 {
            for k in hot {
                if !update(&mut cache, "rollups", k, &format!(r#"{{"count":{i}}}"#)) {
                    misses += 1;
                }
            }
            let tail = format!("hashtags:tag{i}");
            assert!(!update(&mut cache, "rollups", &tail, r#"{"count":1}"#));
            assert!(update(&mut cache, "rollups", &tail, r#"{"count":2}"#));
            assert!(cache.docs.weight() <= KvCache::BYTES);
        }
        assert_eq!(misses, hot.len(), "only each hot key's first update misses");
        let json = |k| cache.get("rollups", k).map(|kv| kv.json.to_string());
        assert_eq!(json("lang:en").as_deref(), Some(r#"{"count":99999}"#));
        // An entry replaced by a smaller document weighs less: the bound counts what is held.
        let before = cache.docs.weight();
        cache.put("rollups", "lang:en", kv(r#"{"c":1}"#));
        assert!(cache.docs.weight() < before);
        cache.remove("rollups", "lang:en");
        assert!(cache.get("rollups", "lang:en").is_none());
        // Large documents count by their size, not as one entry each.
        let big = format!(r#"{{"text":"{}"}}"#, "x".repeat(64 * 1024));
        for i in 0..64 {
            cache.put("docs", &format!("doc{i}"), kv(&big));
            assert!(cache.docs.weight() <= KvCache::BYTES);
        }
        let held = (0..64)
            .filter(|i| {
                cache
                    .docs
                    .peek(&KvRef("docs", &format!("doc{i}")))
                    .is_some()
            })
            .count();
        assert!(
            held as u64 * 4 * big.len() as u64 <= KvCache::BYTES,
            "{held} documents of 64 KiB held"
        );
    }
}
