//! Capped collections on MongoDB: creation and the compatibility check, the single writer task
//! that assigns positions, the ring of acknowledgment times, and the tailable-await tail.

use crate::telemetry::Problem;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use mongodb::action::Action;
use mongodb::bson::{Bson, Document as BsonDoc, doc};
use mongodb::error::ErrorKind;
use mongodb::options::{CursorType, IndexOptions};
use mongodb::{Collection, Database, IndexModel};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use super::convert::{
    Class, bson_as_i64, bson_doc_to_json, classify, doc_to_bson, engine_err, error_code,
    json_to_bson, map_error, position_filter, write_concern,
};
use super::{BACKOFF_MAX, BACKOFF_MIN, Inner, lock_err, sleep_unless_closed};
use crate::backoff::Backoff;
use crate::clock::now_us;
use crate::names::check_field;
use crate::{
    Bounds, Capped, CappedSpec, Document, Durability, Filter, NewestMatching, Position, Record,
    RecordStream, Result, Start, StoreError, Usage,
};

/// At most this many documents go into one `insert_many` (the driver splits further by the
/// server's batch limits; this bounds one group's latency).
const MAX_GROUP_DOCS: usize = 10_000;
/// How long a tail waits for this process's writer to learn a document's acknowledgment time
/// before yielding it with `committed_at_us: None`.
const ACK_WAIT: Duration = Duration::from_secs(2);
/// How often a tail on a server whose tailable cursors close after their first batch queries
/// it at most, once caught up (see `tail_stream`).
const POLL_INTERVAL: Duration = Duration::from_millis(200);
/// The server's error code for "namespace already exists" (a concurrent creator won).
const NAMESPACE_EXISTS: i32 = 48;

// ---------------------------------------------------------------------------------------------
// Acknowledgment times
// ---------------------------------------------------------------------------------------------

/// Positions `first..=last` were acknowledged at `at_us`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct AckRange {
    first: u64,
    last: u64,
    at_us: i64,
}

/// One wait of a tail for acknowledgments (see [`AckRing::committed_at`]): positions up to
/// `up_to` wait until `deadline` at most.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AckWindow {
    up_to: u64,
    deadline: tokio::time::Instant,
}

/// The bounded memory of when this process's writes were acknowledged, shared by the writer
/// and the tails, so [`Record::committed_at_us`] is the real acknowledgment time of the
/// documents this process wrote (and `None` for others'). One entry per `insert_many`, not per
/// document; the oldest entries are forgotten first.
pub(crate) struct AckRing {
    ranges: Mutex<VecDeque<AckRange>>,
    capacity: usize,
    /// The highest position handed to an insert.
    allocated: AtomicU64,
    /// The highest position acknowledged by the server (or found there at open): what
    /// `Start::Now` starts after.
    committed: AtomicU64,
    /// The highest position whose insert has finished, acknowledged or failed: a tail that
    /// reads a document before its writer heard the acknowledgment waits on this.
    resolved: watch::Sender<u64>,
}

impl AckRing {
    /// A ring for a collection whose newest position is `newest`.
    pub(crate) fn new(capacity: usize, newest: u64) -> Self {
        AckRing {
            ranges: Mutex::new(VecDeque::new()),
            capacity: capacity.max(1),
            allocated: AtomicU64::new(newest),
            committed: AtomicU64::new(newest),
            resolved: watch::Sender::new(newest),
        }
    }

    /// The highest position handed out so far.
    pub(crate) fn allocated(&self) -> u64 {
        self.allocated.load(Ordering::Acquire)
    }

    /// Where a tail opened "now" starts after: the newest position known to be on the
    /// server. Not [`AckRing::allocated`]: positions in flight may be handed out again when
    /// their insert fails (see [`AckRing::resync`]), and a tail starting after them would
    /// never see the documents that re-use them. A group in flight that succeeds is then
    /// yielded by such a tail, which is right: it was not visible when the tail opened.
    pub(crate) fn now(&self) -> u64 {
        self.committed.load(Ordering::Acquire)
    }

    /// Hands out `n` consecutive positions. Only the collection's writer task calls this.
    pub(crate) fn allocate(&self, n: u64) -> (u64, u64) {
        let first = self.allocated.fetch_add(n, Ordering::AcqRel) + 1;
        (first, first + n - 1)
    }

    /// After a failed insert: continue after what the server really holds, so a failed group
    /// leaves no gap (a gap right after a reader's position would look like eviction). The
    /// positions above it will be handed out again, so they are no longer "finished": a reader
    /// of one waits for its new insert. (Nobody waits for the failed ones themselves: those
    /// documents are not on the server, so no tail reads them.)
    pub(crate) fn resync(&self, newest_on_server: u64) {
        self.allocated.store(newest_on_server, Ordering::Release);
        self.resolved
            .send_modify(|r| *r = (*r).min(newest_on_server));
    }

    /// Records an acknowledged range and wakes tails waiting for it.
    pub(crate) fn acked(&self, first: u64, last: u64, at_us: i64) {
        self.committed.fetch_max(last, Ordering::AcqRel);
        if let Ok(mut ranges) = self.ranges.lock() {
            ranges.push_back(AckRange { first, last, at_us });
            while ranges.len() > self.capacity {
                ranges.pop_front();
            }
        }
        self.resolve(last);
    }

    /// Marks positions up to `last` as finished (acknowledged or failed).
    pub(crate) fn resolve(&self, last: u64) {
        self.resolved.send_modify(|r| *r = (*r).max(last));
    }

    /// The acknowledgment time of `position`, if this process wrote it and still remembers.
    pub(crate) fn lookup(&self, position: u64) -> Option<i64> {
        let ranges = self.ranges.lock().ok()?;
        // Ranges are appended in position order (a resync never goes below an acknowledged
        // position: acknowledged documents are the newest on the server), so bisect.
        let i = ranges.partition_point(|r| r.last < position);
        ranges
            .get(i)
            .filter(|r| r.first <= position)
            .map(|r| r.at_us)
    }

    /// Like [`AckRing::lookup`], but when `position` is in flight in this process, waits for
    /// its insert to finish: a tail can see a document before its writer has heard the
    /// acknowledgment. The wait is `window`'s: it covers every position in flight when it
    /// began, so a tail reading a large insert whose reply is slow (a server restarting, or
    /// starved) waits `wait` once for all of it, not once per document.
    pub(crate) async fn committed_at(
        &self,
        position: u64,
        window: &mut Option<AckWindow>,
        wait: Duration,
    ) -> Option<i64> {
        if position <= *self.resolved.borrow() || position > self.allocated() {
            return self.lookup(position);
        }
        let deadline = match window {
            Some(w) if position <= w.up_to => w.deadline,
            _ => {
                let w = AckWindow {
                    up_to: self.allocated(),
                    deadline: tokio::time::Instant::now() + wait,
                };
                *window = Some(w);
                w.deadline
            }
        };
        let mut rx = self.resolved.subscribe();
        let _ = tokio::time::timeout_at(deadline, rx.wait_for(|r| *r >= position)).await;
        self.lookup(position)
    }

    /// A receiver that changes whenever an insert finishes (tails use it to retry at once
    /// when their cursor died on an empty collection and this process then wrote to it).
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.resolved.subscribe()
    }
}

// ---------------------------------------------------------------------------------------------
// Shared per-collection state and the writer task
// ---------------------------------------------------------------------------------------------

/// One queued `append`.
pub(crate) struct AppendJob {
    /// The documents, converted, without `_id` (the writer sets it).
    docs: Vec<BsonDoc>,
    durability: Durability,
    /// `None` for unacknowledged appends: failures are logged.
    reply: Option<oneshot::Sender<Result<Vec<Position>>>>,
}

/// What every handle of one capped collection in this process shares: one writer per
/// collection, so `_id`s are assigned in one order and inserted in that order.
pub(crate) struct CappedShared {
    pub(crate) name: String,
    pub(crate) coll: Collection<BsonDoc>,
    pub(crate) acks: AckRing,
    /// `None` once the store is closed.
    jobs: Mutex<Option<mpsc::Sender<AppendJob>>>,
    writer: Mutex<Option<JoinHandle<()>>>,
}

impl CappedShared {
    /// Opens the shared state of `name`: reads the newest `_id` and starts the writer task.
    pub(crate) async fn start(inner: &Arc<Inner>, name: &str) -> Result<Arc<Self>> {
        let coll = inner.db.collection::<BsonDoc>(name);
        let newest = newest_id(&coll, name).await?.unwrap_or(0);
        let (tx, rx) = mpsc::channel(inner.options.queue_capacity.max(1));
        let shared = Arc::new(CappedShared {
            name: name.to_string(),
            coll,
            acks: AckRing::new(inner.options.ack_ring_capacity, newest),
            jobs: Mutex::new(Some(tx)),
            writer: Mutex::new(None),
        });
        let handle = tokio::spawn(run_writer(shared.clone(), rx, inner.options.write_timeout));
        *shared.writer.lock().map_err(lock_err)? = Some(handle);
        Ok(shared)
    }

    /// Stops accepting appends and waits until every queued one is written.
    pub(crate) async fn close(&self) -> Result<()> {
        self.jobs.lock().map_err(lock_err)?.take();
        let handle = self.writer.lock().map_err(lock_err)?.take();
        if let Some(handle) = handle {
            handle
                .await
                .map_err(|e| engine_err(format!("capped writer of {}: {e}", self.name)))?;
        }
        Ok(())
    }

    fn sender(&self) -> Result<mpsc::Sender<AppendJob>> {
        self.jobs
            .lock()
            .map_err(lock_err)?
            .clone()
            .ok_or(StoreError::Closed)
    }
}

/// Unacknowledged and acknowledged appends both go out as `w: 1`, so they may share a group.
fn group_level(d: Durability) -> Durability {
    match d {
        Durability::Unacknowledged => Durability::Acknowledged,
        other => other,
    }
}

/// The writer: takes queued appends in order, groups consecutive ones of the same write
/// concern into one ordered `insert_many` (group commit: one journal flush for many appends),
/// assigns `_id`s, and answers each caller with its positions.
async fn run_writer(
    shared: Arc<CappedShared>,
    mut rx: mpsc::Receiver<AppendJob>,
    write_timeout: Duration,
) {
    let mut carry: Option<AppendJob> = None;
    let mut uncertain: Option<Uncertain> = None;
    loop {
        let first = match carry.take() {
            Some(job) => job,
            None => match rx.recv().await {
                Some(job) => job,
                None => break,
            },
        };
        let level = group_level(first.durability);
        let mut n = first.docs.len();
        let mut group = VecDeque::from([first]);
        while n < MAX_GROUP_DOCS {
            match rx.try_recv() {
                Ok(job) if group_level(job.durability) == level => {
                    n += job.docs.len();
                    group.push_back(job);
                }
                Ok(job) => {
                    carry = Some(job);
                    break;
                }
                Err(_) => break,
            }
        }
        write_group(&shared, group, level, write_timeout, &mut uncertain).await;
    }
}

/// A group whose insert failed without the writer learning how far it got (the connection
/// was lost, and the server could not be asked right after): its documents (without `_id`),
/// from position `first` on. Its callers were told it failed, and retry; when the next group
/// starts with the same documents, the ones the server had stored after all are not stored
/// twice.
struct Uncertain {
    first: u64,
    docs: Vec<BsonDoc>,
}

/// An append of a group, and the positions of its leading documents already on the server.
struct Pending {
    job: AppendJob,
    stored: Vec<Position>,
}

impl Pending {
    fn remaining(&self) -> usize {
        self.job.docs.len() - self.stored.len()
    }

    /// Answers the caller: its positions, or `error` (as [`StoreError::PartlyWritten`] when
    /// some of its documents are stored, which the caller must not write again).
    fn answer(self, shared: &CappedShared, error: Option<StoreError>) {
        match error {
            None => {
                if let Some(reply) = self.job.reply {
                    let _ = reply.send(Ok(self.stored));
                }
            }
            Some(error) if self.stored.is_empty() => fail_job(shared, self.job, error),
            Some(error) => fail_job(
                shared,
                self.job,
                StoreError::PartlyWritten {
                    written: self.stored.len(),
                    error: Box::new(error),
                },
            ),
        }
    }
}

fn without_id(d: &BsonDoc) -> BsonDoc {
    let mut d = d.clone();
    d.remove("_id");
    d
}

/// Marks the first `n` remaining documents of the group as stored from position `first` on.
fn mark_stored(pending: &mut VecDeque<Pending>, first: u64, n: usize) {
    let mut p = first;
    let mut left = n;
    for job in pending.iter_mut() {
        let take = job.remaining().min(left);
        job.stored.extend((p..p + take as u64).map(Position));
        p += take as u64;
        left -= take;
        if left == 0 {
            break;
        }
    }
}

/// Before a group is inserted: of an earlier group whose outcome was not known, which
/// documents did the server store? Those that this group starts with are taken as stored.
/// `Err` when the server still cannot say (the group then fails as the earlier one did).
async fn settle_uncertain(
    shared: &CappedShared,
    pending: &mut VecDeque<Pending>,
    uncertain: &mut Option<Uncertain>,
) -> Result<()> {
    let Some(u) = uncertain.take() else {
        return Ok(());
    };
    let newest = match newest_id(&shared.coll, &shared.name).await {
        Ok(n) => n.unwrap_or(0),
        Err(e) => {
            *uncertain = Some(u);
            return Err(e);
        }
    };
    // One writer per collection: positions `first..=newest` are that group's own.
    let landed = (newest + 1)
        .saturating_sub(u.first)
        .min(u.docs.len() as u64) as usize;
    let mut matched = 0;
    'group: for p in pending.iter_mut() {
        while matched < landed && p.remaining() > 0 {
            if without_id(&p.job.docs[p.stored.len()]) != u.docs[matched] {
                break 'group;
            }
            p.stored.push(Position(u.first + matched as u64));
            matched += 1;
        }
        if matched == landed {
            break;
        }
    }
    if matched < landed {
        Problem {
            error_type: "uncertain_insert",
            detail: &format!(
                "{}: {} documents of an insert whose outcome was unknown were stored after all, \
                 and were not sent again as they were: they may be stored twice",
                shared.name,
                landed - matched
            ),
        }
        .warn();
    }
    shared.acks.resync(newest);
    Ok(())
}

/// Inserts one group. On a write error at document `k` (ordered inserts stop there), the
/// documents before `k` are stored, the append holding `k` fails (with
/// [`StoreError::PartlyWritten`] when some of its documents are stored: a retry of the whole
/// append would store those twice), and the appends after it are retried with fresh
/// positions: one bad document fails only its own caller. When the insert fails without
/// saying how far it got, the newest position on the server says.
async fn write_group(
    shared: &CappedShared,
    group: VecDeque<AppendJob>,
    level: Durability,
    write_timeout: Duration,
    uncertain: &mut Option<Uncertain>,
) {
    let wc = write_concern(level, write_timeout);
    let mut pending: VecDeque<Pending> = group
        .into_iter()
        .map(|job| Pending {
            job,
            stored: Vec::new(),
        })
        .collect();
    if let Err(e) = settle_uncertain(shared, &mut pending, uncertain).await {
        for p in pending {
            p.answer(shared, Some(e.duplicate("mongodb")));
        }
        return;
    }
    loop {
        let total: usize = pending.iter().map(Pending::remaining).sum();
        if total == 0 {
            for p in pending {
                p.answer(shared, None);
            }
            return;
        }
        let (first, last) = shared.acks.allocate(total as u64);
        let mut next = first;
        for p in pending.iter_mut() {
            let done = p.stored.len();
            for d in p.job.docs[done..].iter_mut() {
                if d.contains_key("_id") {
                    // A retry after a failed group: replaced in place (it is already first).
                    d.insert("_id", next as i64);
                } else {
                    let mut with_id = doc! {"_id": next as i64};
                    with_id.extend(std::mem::take(d));
                    *d = with_id;
                }
                next += 1;
            }
        }
        // Ordered: `_id` order must equal insertion (natural) order, which is what a tailable
        // cursor follows; an unordered insert could also apply documents out of order.
        let result = shared
            .coll
            .insert_many(
                pending
                    .iter()
                    .flat_map(|p| p.job.docs[p.stored.len()..].iter()),
            )
            .ordered(true)
            .write_concern(wc.clone())
            .await;
        let e = match result {
            Ok(_) => {
                shared.acks.acked(first, last, now_us());
                mark_stored(&mut pending, first, total);
                for p in pending {
                    p.answer(shared, None);
                }
                return;
            }
            Err(e) => e,
        };
        // Which document failed and why, when the server said (a write error, not a lost
        // connection or an unmet write concern, after which nothing is known but what it
        // holds).
        let failed = match &*e.kind {
            ErrorKind::InsertMany(m) if m.write_concern_error.is_none() => m
                .write_errors
                .as_ref()
                .and_then(|w| w.iter().min_by_key(|w| w.index))
                .map(|w| (w.index, w.code)),
            _ => None,
        };
        let failed_at = failed.map(|(k, _)| k);
        let newest = newest_id(&shared.coll, &shared.name).await;
        let mut stored = match (failed_at, &newest) {
            (Some(k), _) => Some(k.min(total)),
            (None, Ok(n)) => {
                Some((n.unwrap_or(0) + 1).saturating_sub(first).min(total as u64) as usize)
            }
            (None, Err(_)) => None,
        };
        // A duplicate `_id` at one of this group's own positions: the driver sent the insert
        // twice (a retryable write after a lost connection) to a server that did not know it
        // for a retry (FerretDB; MongoDB answers a retry with the first attempt's outcome),
        // and the first attempt stored documents from there on. Those the server holds as
        // sent are this group's; the rest go round again. Anything else there (another
        // writer's documents) is refused as before.
        let mut again = false;
        if let (Some((k, DUPLICATE_KEY)), Ok(Some(n))) = (failed, &newest)
            && k < total
            && first + k as u64 <= *n
        {
            let rest: Vec<&BsonDoc> = pending
                .iter()
                .flat_map(|p| p.job.docs[p.stored.len()..].iter())
                .skip(k)
                .collect();
            let own = stored_as_sent(shared, first + k as u64, &rest).await;
            if own > 0 {
                stored = Some(k + own);
                again = true;
            }
        }
        if let Some(s) = stored.filter(|s| *s > 0) {
            shared.acks.acked(first, first + s as u64 - 1, now_us());
        }
        // Every position of the group is finished (acknowledged or failed): wake the readers
        // waiting on them. Then the ones not on the server are handed out again, so the
        // resync comes after (it lowers what counts as finished).
        shared.acks.resolve(last);
        match (&newest, stored) {
            (Ok(n), _) => shared.acks.resync(n.unwrap_or(0)),
            (Err(_), Some(s)) => shared.acks.resync(first + s as u64 - 1),
            (Err(re), None) => Problem {
                error_type: "store_read",
                detail: &format!(
                    "{}: could not re-read the newest position after a failed insert ({re}); \
                     the next insert settles what this one stored",
                    shared.name
                ),
            }
            .warn(),
        }
        let Some(s) = stored else {
            *uncertain = Some(Uncertain {
                first,
                docs: pending
                    .iter()
                    .flat_map(|p| p.job.docs[p.stored.len()..].iter().map(without_id))
                    .collect(),
            });
            for p in pending {
                p.answer(shared, Some(map_error(e.clone())));
            }
            return;
        };
        mark_stored(&mut pending, first, s);
        // The appends wholly stored are done; the one holding the first document not stored
        // fails; after a write error the rest never reached the server and go round again,
        // after anything else they fail with it.
        while pending.front().is_some_and(|p| p.remaining() == 0) {
            if let Some(p) = pending.pop_front() {
                p.answer(shared, None);
            }
        }
        if again {
            continue;
        }
        if let Some(p) = pending.pop_front() {
            p.answer(shared, Some(map_error(e.clone())));
        }
        if failed_at.is_none() {
            for p in pending {
                p.answer(shared, Some(map_error(e.clone())));
            }
            return;
        }
    }
}

/// MongoDB's code for a duplicate key.
pub(crate) const DUPLICATE_KEY: i32 = 11000;

/// How many of `docs`, from position `at` on, the server holds as sent: the length of the run
/// of positions `at, at + 1, ..` whose stored document equals the one in `docs`. 0 when the
/// server cannot be read (the insert then fails as the server answered).
async fn stored_as_sent(shared: &CappedShared, at: u64, docs: &[&BsonDoc]) -> usize {
    let read = async {
        let mut cursor = shared
            .coll
            .find(doc! {"_id": {"$gt": at as i64 - 1}})
            .sort(doc! {"_id": 1})
            .limit(docs.len() as i64)
            .await?;
        let mut own = 0;
        while let Some(d) = cursor.next().await {
            let d = d?;
            let mine = docs.get(own);
            if position_of(&shared.name, &d).ok() != Some(at + own as u64)
                || mine.is_none_or(|m| without_id(m) != without_id(&d))
            {
                break;
            }
            own += 1;
        }
        Ok::<_, mongodb::error::Error>(own)
    };
    match read.await {
        Ok(own) => own,
        Err(e) => {
            Problem {
                error_type: "store_read",
                detail: &format!(
                    "{}: could not read back the documents at a duplicate position ({e}); the \
                     insert fails as the server answered",
                    shared.name
                ),
            }
            .warn();
            0
        }
    }
}

fn fail_job(shared: &CappedShared, job: AppendJob, error: StoreError) {
    match job.reply {
        Some(reply) => {
            let _ = reply.send(Err(error));
        }
        None => Problem {
            error_type: "unacknowledged_write",
            detail: &format!(
                "{}: an unacknowledged append of {} documents failed ({error}); the documents \
                 are lost",
                shared.name,
                job.docs.len()
            ),
        }
        .error(),
    }
}

// ---------------------------------------------------------------------------------------------
// Creation and reads
// ---------------------------------------------------------------------------------------------

/// The `listCollections` entry of `name`, if it exists.
pub(crate) async fn collection_info(db: &Database, name: &str) -> Result<Option<BsonDoc>> {
    let reply = db
        .run_command(doc! {"listCollections": 1, "filter": {"name": name}})
        .await?;
    let first = reply
        .get_document("cursor")
        .ok()
        .and_then(|c| c.get_array("firstBatch").ok())
        .and_then(|b| b.first())
        .and_then(Bson::as_document)
        .cloned();
    Ok(first)
}

/// The options of a capped collection, for creating one and for checking an existing one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CappedOptions {
    /// `size`: the byte limit (the server rounds it up to a multiple of 256, minimum 4096).
    pub size: u64,
    /// `max`: the document limit.
    pub max: u64,
}

impl CappedOptions {
    /// What a spec asks MongoDB for.
    pub(crate) fn from_spec(spec: &CappedSpec) -> Self {
        CappedOptions {
            size: spec.max_bytes,
            max: spec.max_docs,
        }
    }
}

/// Checks an existing collection's `listCollections` entry against the spec: it must be a
/// capped collection at least as large as configured. `Ok(Some(warning))` when it is larger.
pub(crate) fn check_existing_capped(
    name: &str,
    info: &BsonDoc,
    want: CappedOptions,
) -> Result<Option<String>> {
    let incompatible = |problem: String| StoreError::Incompatible {
        collection: name.to_string(),
        problem,
    };
    let kind = info.get_str("type").unwrap_or("collection");
    if kind != "collection" {
        return Err(incompatible(format!(
            "exists as a MongoDB {kind}, not a capped collection; drop it or choose another name"
        )));
    }
    let empty = BsonDoc::new();
    let options = info.get_document("options").unwrap_or(&empty);
    if !options.get_bool("capped").unwrap_or(false) {
        return Err(incompatible(format!(
            "exists and is not capped, so it cannot be tailed or bounded; drop it \
             (db.{name}.drop()), rename it, or configure another collection name"
        )));
    }
    let size = options
        .get("size")
        .and_then(bson_as_i64)
        .unwrap_or(0)
        .max(0) as u64;
    let max = options.get("max").and_then(bson_as_i64).unwrap_or(0).max(0) as u64;
    if size < want.size {
        return Err(incompatible(format!(
            "is capped at {size} bytes, smaller than the configured max_bytes {}; enlarge it with \
             db.runCommand({{collMod: \"{name}\", cappedSize: {}}}) (MongoDB 6.0+), or drop it, \
             or lower max_bytes",
            want.size, want.size
        )));
    }
    if max > 0 && max < want.max {
        return Err(incompatible(format!(
            "is capped at {max} documents, fewer than the configured max_docs {}; enlarge it with \
             db.runCommand({{collMod: \"{name}\", cappedMax: {}}}) (MongoDB 6.0+), or drop it, \
             or lower max_docs",
            want.max, want.max
        )));
    }
    // The server rounds `size` up to a multiple of 256 bytes, at least 4096: not "larger".
    let rounded = want.size.div_ceil(256).saturating_mul(256).max(4096);
    if size > rounded || max == 0 || max > want.max {
        let max_text = if max == 0 {
            "no document limit".to_string()
        } else {
            format!("{max} documents")
        };
        return Ok(Some(format!(
            "existing capped collection {name} is larger than configured ({size} bytes, \
             {max_text}; configured {} bytes, {} documents): it keeps more",
            want.size, want.max
        )));
    }
    Ok(None)
}

/// A filter as the query document of a `find` on the collection's documents.
fn filter_document(filter: &Filter) -> BsonDoc {
    match json_to_bson(&filter.to_mongo("")) {
        Bson::Document(d) => d,
        // `to_mongo` always returns an object.
        _ => BsonDoc::new(),
    }
}

/// The name of the index that serves `latest(field, ..)`.
pub(crate) fn latest_index_name(field: &str) -> String {
    format!("tailrace_latest_{field}")
}

/// The key of that index: the field, then `_id`, so "newest N with field = value" is an index
/// range read backwards, with no in-memory sort.
pub(crate) fn latest_index_keys(field: &str) -> BsonDoc {
    doc! {field: 1, "_id": 1}
}

/// Creates the capped collection when absent, refuses an incompatible existing one, and
/// creates the indexes `latest` uses.
pub(crate) async fn ensure_capped(db: &Database, name: &str, spec: &CappedSpec) -> Result<()> {
    let want = CappedOptions::from_spec(spec);
    for field in &spec.indexes {
        check_field(field)?;
    }
    let mut created = false;
    loop {
        match collection_info(db, name).await? {
            Some(info) => {
                if let Some(warning) = check_existing_capped(name, &info, want)? {
                    Problem {
                        error_type: "collection_options",
                        detail: &warning,
                    }
                    .warn();
                }
                break;
            }
            None if created => {
                return Err(engine_err(format!(
                    "capped collection {name} was created but is not listed"
                )));
            }
            None => {
                let res = db
                    .create_collection(name)
                    .capped(true)
                    .size(want.size)
                    .max(want.max)
                    .await;
                match res {
                    Ok(()) => {}
                    // Another process created it meanwhile: check what it created.
                    Err(e) if error_code(&e) == Some(NAMESPACE_EXISTS) => {}
                    Err(e) => return Err(e.into()),
                }
                created = true;
            }
        }
    }
    if !spec.indexes.is_empty() {
        let coll = db.collection::<BsonDoc>(name);
        let models = spec
            .indexes
            .iter()
            .map(|field| (latest_index_name(field), latest_index_keys(field)))
            .collect();
        ensure_indexes(&coll, models).await?;
    }
    Ok(())
}

/// Creates the indexes (by name) that the collection lacks. Asking for the ones it has would
/// be a no-op on MongoDB; FerretDB (1.24) answers it by dropping the connection (a panic in
/// its `createIndexes`), so a restarted process could not open its collections.
pub(crate) async fn ensure_indexes(
    coll: &Collection<BsonDoc>,
    wanted: Vec<(String, BsonDoc)>,
) -> Result<()> {
    let existing = coll.list_index_names().await?;
    let missing: Vec<IndexModel> = wanted
        .into_iter()
        .filter(|(name, _)| !existing.contains(name))
        .map(|(name, keys)| {
            IndexModel::builder()
                .keys(keys)
                .options(IndexOptions::builder().name(name).build())
                .build()
        })
        .collect();
    if !missing.is_empty() {
        coll.create_indexes(missing).await?;
    }
    Ok(())
}

/// A stored document's position.
fn position_of(name: &str, doc: &BsonDoc) -> Result<u64> {
    doc.get("_id")
        .and_then(bson_as_i64)
        .filter(|i| *i >= 0)
        .map(|i| i as u64)
        .ok_or_else(|| StoreError::Incompatible {
            collection: name.to_string(),
            problem: format!(
                "holds a document whose _id is not a tailrace position ({:?}); only tailrace may \
                 write to its capped collections",
                doc.get("_id")
            ),
        })
}

/// The `_id` at one end of the collection (`order` 1: oldest, -1: newest).
async fn end_id(coll: &Collection<BsonDoc>, name: &str, order: i32) -> Result<Option<u64>> {
    let doc = coll
        .find_one(doc! {})
        .sort(doc! {"_id": order})
        .projection(doc! {"_id": 1})
        .await?;
    doc.map(|d| position_of(name, &d)).transpose()
}

/// The newest position stored.
pub(crate) async fn newest_id(coll: &Collection<BsonDoc>, name: &str) -> Result<Option<u64>> {
    end_id(coll, name, -1).await
}

/// The oldest position stored.
pub(crate) async fn oldest_id(coll: &Collection<BsonDoc>, name: &str) -> Result<Option<u64>> {
    end_id(coll, name, 1).await
}

/// A stored document as a [`Record`] (its `_id` becomes the position).
fn to_record(name: &str, mut doc: BsonDoc, committed_at_us: Option<i64>) -> Result<Record> {
    let position = Position(position_of(name, &doc)?);
    doc.remove("_id");
    Ok(Record {
        position,
        doc: Arc::new(bson_doc_to_json(doc)),
        committed_at_us,
    })
}

/// Converts appended documents; the `_id` field is the engine's (the position), so a document
/// carrying its own is refused rather than silently overwritten.
pub(crate) fn convert_append<D: std::borrow::Borrow<Document>>(
    name: &str,
    docs: &[D],
) -> Result<Vec<BsonDoc>> {
    docs.iter()
        .map(|d| {
            let d = d.borrow();
            if d.contains_key("_id") {
                return Err(StoreError::Invalid(format!(
                    "a document appended to capped collection {name} has an _id field; MongoDB \
                     uses _id for the position: rename the field"
                )));
            }
            Ok(doc_to_bson(d))
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The collection handle
// ---------------------------------------------------------------------------------------------

/// A capped collection of the MongoDB engine.
pub(crate) struct MongoCapped {
    pub(crate) inner: Arc<Inner>,
    pub(crate) shared: Arc<CappedShared>,
    /// Fields `latest` may query (this handle's spec).
    pub(crate) indexes: Vec<String>,
}

impl MongoCapped {
    /// The `limit` newest documents matching `query` (and `here`, evaluated in this process,
    /// when given), newest first (`limit` > 0: MongoDB reads 0 as no limit). With `here` the
    /// server cannot stop at `limit`, so documents are read in batches until enough match.
    async fn newest_first(
        &self,
        query: BsonDoc,
        here: Option<&Filter>,
        limit: usize,
    ) -> Result<Vec<Record>> {
        let mut find = self.shared.coll.find(query).sort(doc! {"_id": -1});
        if here.is_none() {
            find = find.limit(i64::try_from(limit).unwrap_or(i64::MAX));
        }
        let mut cursor = find.await?;
        let mut records = Vec::new();
        while records.len() < limit
            && let Some(doc) = cursor.next().await
        {
            let doc = doc?;
            let position = position_of(&self.shared.name, &doc)?;
            let record = to_record(&self.shared.name, doc, self.shared.acks.lookup(position))?;
            if here.is_none_or(|f| f.matches(&record.doc)) {
                records.push(record);
            }
        }
        Ok(records)
    }

    /// Whether document filters run on the server: only where it evaluates them as MongoDB
    /// does ([`crate::Capability::ServerFilters`]); elsewhere they run here, with the same
    /// meaning as on the embedded engine.
    fn filters_on_server(&self) -> bool {
        self.inner.capabilities.server_filters.is_yes()
    }
}

impl MongoCapped {
    /// Appends `docs`, converted to BSON here: [`Capped::append`] and
    /// [`Capped::append_shared`].
    async fn append_converted<D: std::borrow::Borrow<Document> + Sync>(
        &self,
        docs: &[D],
        durability: Durability,
    ) -> Result<Vec<Position>> {
        if docs.is_empty() {
            return Ok(Vec::new());
        }
        let docs = convert_append(&self.shared.name, docs)?;
        let sender = self.shared.sender()?;
        if !durability.waits() {
            // The driver refuses w:0, so the write goes out as w:1 from the writer task and
            // nobody waits for it; the queue keeps it in order with the other appends.
            sender
                .send(AppendJob {
                    docs,
                    durability,
                    reply: None,
                })
                .await
                .map_err(|_| StoreError::Closed)?;
            return Ok(Vec::new());
        }
        let (tx, rx) = oneshot::channel();
        sender
            .send(AppendJob {
                docs,
                durability,
                reply: Some(tx),
            })
            .await
            .map_err(|_| StoreError::Closed)?;
        rx.await.map_err(|_| StoreError::Closed)?
    }
}

#[async_trait]
impl Capped for MongoCapped {
    fn name(&self) -> &str {
        &self.shared.name
    }

    async fn append(&self, docs: Vec<Document>, durability: Durability) -> Result<Vec<Position>> {
        self.append_converted(&docs, durability).await
    }

    async fn append_shared(
        &self,
        docs: Arc<[Arc<Document>]>,
        durability: Durability,
    ) -> Result<Vec<Position>> {
        // Converted to BSON from the shared documents: nothing to copy first.
        self.append_converted(&docs, durability).await
    }

    fn tail(&self, start: Start) -> RecordStream {
        tail_stream(self.inner.clone(), self.shared.clone(), start, None)
    }

    fn tail_matching(&self, start: Start, filter: Filter) -> RecordStream {
        if filter.is_match_all() {
            return self.tail(start);
        }
        if !self.filters_on_server() {
            let tail = self.tail(start);
            return tail
                .filter(move |r| {
                    futures::future::ready(r.as_ref().map_or(true, |r| filter.matches(&r.doc)))
                })
                .boxed();
        }
        // On the server: the tailable cursor's query, so non-matching documents never travel.
        let query = Some(filter_document(&filter));
        tail_stream(self.inner.clone(), self.shared.clone(), start, query)
    }

    async fn newest_matching(&self, filter: &Filter, limit: usize) -> Result<NewestMatching> {
        // The newest position first, then only documents up to it: a document appended in
        // between is left to the tail that continues after `as_of`, never given twice.
        let Some(newest) = newest_id(&self.shared.coll, &self.shared.name).await? else {
            return Ok(NewestMatching {
                records: Vec::new(),
                as_of: None,
            });
        };
        let as_of = Some(Position(newest));
        if limit == 0 {
            // MongoDB reads `limit(0)` as "no limit".
            return Ok(NewestMatching {
                records: Vec::new(),
                as_of,
            });
        }
        let mut query = doc! {"_id": {"$lte": newest as i64}};
        let mut here = None;
        if !filter.is_match_all() {
            if self.filters_on_server() {
                query = doc! {"$and": [query, filter_document(filter)]};
            } else {
                here = Some(filter);
            }
        }
        let records = self.newest_first(query, here, limit).await?;
        Ok(NewestMatching { records, as_of })
    }

    async fn get(&self, position: Position) -> Result<Option<Record>> {
        let doc = self
            .shared
            .coll
            .find_one(position_filter(position.0))
            .await?;
        doc.map(|d| to_record(&self.shared.name, d, self.shared.acks.lookup(position.0)))
            .transpose()
    }

    async fn latest(&self, field: &str, value: &Value, limit: usize) -> Result<Vec<Record>> {
        if !self.indexes.iter().any(|f| f == field) {
            return Err(StoreError::NotIndexed {
                collection: self.shared.name.clone(),
                field: field.to_string(),
            });
        }
        if matches!(value, Value::Array(_) | Value::Object(_)) {
            // Same rule as the embedded engine (and MongoDB would match array elements).
            return Err(StoreError::Invalid(format!(
                "latest() compares scalars only, not {value}"
            )));
        }
        if limit == 0 {
            // MongoDB reads `limit(0)` as "no limit".
            return Ok(Vec::new());
        }
        self.newest_first(doc! {field: json_to_bson(value)}, None, limit)
            .await
    }

    async fn bounds(&self) -> Result<Option<Bounds>> {
        let oldest = oldest_id(&self.shared.coll, &self.shared.name).await?;
        let newest = newest_id(&self.shared.coll, &self.shared.name).await?;
        Ok(oldest.zip(newest).map(|(o, n)| Bounds {
            oldest: Position(o),
            newest: Position(n),
        }))
    }

    async fn usage(&self) -> Result<Usage> {
        // `$collStats.storageStats`: `count` and `size` (uncompressed BSON bytes, the measure
        // the capped `size` limit applies to), without scanning the collection.
        let mut cursor = self
            .shared
            .coll
            .aggregate([doc! {"$collStats": {"storageStats": {}}}])
            .await?;
        let Some(stats) = cursor.next().await.transpose()? else {
            return Ok(Usage::default());
        };
        let storage = stats.get_document("storageStats").map_err(|_| {
            engine_err(format!(
                "$collStats of {} has no storageStats",
                self.shared.name
            ))
        })?;
        let num = |k: &str| storage.get(k).and_then(bson_as_i64).unwrap_or(0).max(0) as u64;
        Ok(Usage {
            docs: num("count"),
            bytes: num("size"),
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Tailing
// ---------------------------------------------------------------------------------------------

/// What one step of a tail produced.
enum Step {
    Doc(BsonDoc),
    /// The cursor is dead (the driver's stream ended).
    Dead,
    Failed(mongodb::error::Error),
    Closed,
}

/// A tail: a tailable-await cursor on `{_id: {$gt: last}}` in natural order, re-opened after
/// the last seen position whenever it dies. It never polls at steady state: the server blocks
/// each `getMore` for up to `max_await_time`. The one exception is an **empty** collection:
/// the server does not keep a tailable cursor on an empty capped collection, so the tail
/// re-opens with backoff (up to [`BACKOFF_MAX`]) — and at once when this process appends.
/// On a server whose tailable cursors close after their first batch
/// ([`crate::Capability::AwaitingTails`] lacking) the tail polls that way all the time.
///
/// With a `query` (a filtered tail) the first document after a re-open may rightly lie far
/// beyond the last position, so eviction is detected the other way: once the cursor is open,
/// the oldest retained position must be at most one past the last one read.
fn tail_stream(
    inner: Arc<Inner>,
    shared: Arc<CappedShared>,
    start: Start,
    query: Option<BsonDoc>,
) -> RecordStream {
    // Resolved here, not on the first poll, so `Now` means when `tail` was called.
    let mut last: Option<u64> = match start {
        Start::Oldest => None,
        Start::After(p) => Some(p.0),
        Start::Now => Some(shared.acks.now()),
    };
    let mut closed = inner.closed.subscribe();
    let mut written = shared.acks.subscribe();
    Box::pin(async_stream::try_stream! {
        let mut backoff = Backoff::new(BACKOFF_MIN, BACKOFF_MAX);
        let mut ack_window = None;
        loop {
            if *closed.borrow() {
                Err(StoreError::Closed)?;
            }
            // Marked before opening: an insert finishing after this point wakes a tail whose
            // cursor died on an empty collection.
            written.borrow_and_update();
            let after = match last {
                Some(l) => doc! {"_id": {"$gt": l as i64}},
                None => doc! {},
            };
            let filter = match &query {
                Some(q) => doc! {"$and": [after, q.clone()]},
                None => after,
            };
            let (batch, await_time) = inner.tail_cursor();
            let opened_at = tokio::time::Instant::now();
            let opened = shared
                .coll
                .find(filter)
                .cursor_type(CursorType::TailableAwait)
                .max_await_time(await_time)
                .optional(batch, |find, b| find.batch_size(b))
                .await;
            let mut cursor = match opened {
                Ok(c) => c,
                Err(e) if classify(&e) == Class::Transient => {
                    Problem {
                        error_type: "tail_reopen",
                        detail: &format!("{}: a tail cannot open its cursor ({e}); retrying", shared.name),
                    }
                    .warn();
                    if !sleep_unless_closed(&mut closed, backoff.next_wait()).await {
                        Err(StoreError::Closed)?;
                    }
                    continue;
                }
                Err(e) => Err(map_error(e))?,
            };
            if query.is_some()
                && let Some(l) = last
            {
                // The cursor is open (its first batch read): if the document right after
                // `last` was still there now, it was there when the cursor started.
                let oldest = oldest_id(&shared.coll, &shared.name).await?;
                if let Some(o) = oldest.filter(|o| *o > l + 1) {
                    Err(StoreError::PositionLost {
                        collection: shared.name.clone(),
                        after: Position(l),
                        oldest: Position(o),
                    })?;
                }
            }
            let mut first = query.is_none();
            let mut yielded = false;
            let mut received = 0u32;
            loop {
                let step = tokio::select! {
                    biased;
                    _ = closed.wait_for(|c| *c) => Step::Closed,
                    item = cursor.next() => match item {
                        Some(Ok(d)) => Step::Doc(d),
                        Some(Err(e)) => Step::Failed(e),
                        None => Step::Dead,
                    },
                };
                match step {
                    Step::Closed => Err(StoreError::Closed)?,
                    Step::Doc(d) => {
                        received += 1;
                        let position = position_of(&shared.name, &d)?;
                        if first {
                            // Unfiltered: the first document must be the next position.
                            first = false;
                            // The first document after a (re-)open must be the next one; if it
                            // is further on, check whether the next one was evicted (it may
                            // also be a hole left by a failed insert, which is no loss).
                            if let Some(l) = last.filter(|l| position > l + 1) {
                                let oldest = oldest_id(&shared.coll, &shared.name).await?;
                                if let Some(o) = oldest.filter(|o| *o > l + 1) {
                                    Err(StoreError::PositionLost {
                                        collection: shared.name.clone(),
                                        after: Position(l),
                                        oldest: Position(o),
                                    })?;
                                }
                            }
                        }
                        if last.is_some_and(|l| position <= l) {
                            continue;
                        }
                        last = Some(position);
                        yielded = true;
                        if batch.is_none() {
                            backoff.reset();
                        }
                        let at = shared.acks.committed_at(position, &mut ack_window, ACK_WAIT).await;
                        yield to_record(&shared.name, d, at)?;
                    }
                    Step::Failed(e) => match classify(&e) {
                        // The cursor's own position was evicted: re-open after `last`; the
                        // first-document check above decides whether anything was lost.
                        Class::PositionLost => break,
                        // An outage, or a failure that is neither a bad request nor a missing
                        // feature (a killed cursor; FerretDB answers a getMore whose position
                        // was evicted with InternalError): re-open after `last`, where the
                        // first-document check tells eviction from a hole.
                        Class::Transient | Class::Other => {
                            Problem {
                                error_type: "tail_reopen",
                                detail: &format!("{}: a tail's cursor failed ({e}); re-opening after its last position", shared.name),
                            }
                            .warn();
                            if !sleep_unless_closed(&mut closed, backoff.next_wait()).await {
                                Err(StoreError::Closed)?;
                            }
                            break;
                        }
                        Class::HistoryLost | Class::Invalid | Class::Unsupported | Class::Closed => {
                            Err(map_error(e))?
                        }
                    },
                    Step::Dead => {
                        // Dead at once: the collection is empty. Polling (the server closes
                        // a tailable cursor after its first batch), a batch short of full
                        // reached the end too. Re-opening at once would cost the server a
                        // query for nothing, and FerretDB (1.24, on SQLite) answers each by
                        // reading the whole collection: `_id > last` is not pushed down. So
                        // the tail waits for this process's next write, or for the backoff
                        // (not reset by documents while polling: up to BACKOFF_MAX) for
                        // other processes' writes.
                        let at_end = !yielded || batch.is_some_and(|b| received < b);
                        if at_end {
                            let woke = tokio::select! {
                                biased;
                                _ = closed.wait_for(|c| *c) => false,
                                _ = written.changed() => true,
                                _ = tokio::time::sleep(backoff.next_wait()) => true,
                            };
                            // Polling, at most one query per POLL_INTERVAL: a process writing
                            // small batches would otherwise have its tail query the server
                            // after each of them.
                            if !woke
                                || (batch.is_some()
                                    && !sleep_unless_closed(
                                        &mut closed,
                                        (opened_at + POLL_INTERVAL)
                                            .saturating_duration_since(tokio::time::Instant::now()),
                                    )
                                    .await)
                            {
                                Err(StoreError::Closed)?;
                            }
                        }
                        break;
                    }
                }
            }
        }
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A group fails (a document the server refuses) while a tail opens at "now": the writer
    /// re-reads the newest position on the server and hands the failed group's positions to
    /// the next appends. The tail must start at or before them, and a reader of a re-used
    /// position must wait for its acknowledgment again.
    #[tokio::test]
    async fn a_tail_opened_during_a_failed_group_sees_the_positions_it_frees() {
        let ring = Arc::new(AckRing::new(16, 10));
        assert_eq!(ring.allocate(3), (11, 13), "a group in flight");
        let now = ring.now();
        // The group failed entirely; the server holds up to 10.
        ring.resolve(13);
        ring.resync(10);
        assert_eq!(
            ring.allocate(2),
            (11, 12),
            "the next group re-uses 11 and 12"
        );
        assert!(
            now < 11,
            "a tail opened at 'now' ({now}) would skip the re-used positions 11 and 12"
        );
        // A tail reading 11 before the writer hears its acknowledgment waits for it.
        let acker = ring.clone();
        let ack = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            acker.acked(11, 12, 4242);
        });
        let at = ring
            .committed_at(11, &mut None, Duration::from_secs(5))
            .await;
        ack.await.unwrap();
        assert_eq!(
            at,
            Some(4242),
            "the re-used position's own acknowledgment time"
        );
    }

    #[test]
    fn ring_finds_ack_times_by_range_and_forgets_the_oldest() {
        let ring = AckRing::new(2, 10);
        assert_eq!(ring.allocate(3), (11, 13));
        ring.acked(11, 13, 1000);
        assert_eq!(ring.allocate(2), (14, 15));
        ring.acked(14, 15, 2000);
        assert_eq!(ring.lookup(10), None, "written before this process");
        assert_eq!(ring.lookup(11), Some(1000));
        assert_eq!(ring.lookup(13), Some(1000));
        assert_eq!(ring.lookup(14), Some(2000));
        assert_eq!(ring.lookup(16), None, "not written yet");
        assert_eq!(ring.allocate(1), (16, 16));
        ring.acked(16, 16, 3000);
        assert_eq!(
            ring.lookup(11),
            None,
            "capacity 2: the oldest range is forgotten"
        );
        assert_eq!(ring.lookup(16), Some(3000));
        assert_eq!(ring.allocated(), 16);
    }

    #[test]
    fn ring_resync_continues_after_the_server_newest() {
        let ring = AckRing::new(8, 0);
        assert_eq!(ring.allocate(5), (1, 5));
        // The insert failed after two documents: the server holds 1..=2.
        ring.acked(1, 2, 7);
        ring.resolve(5);
        ring.resync(2);
        assert_eq!(ring.allocate(3), (3, 5), "no gap after a failed insert");
        ring.acked(3, 5, 9);
        assert_eq!(ring.lookup(2), Some(7));
        assert_eq!(ring.lookup(4), Some(9));
    }

    #[tokio::test]
    async fn a_tail_waits_for_the_ack_of_an_in_flight_position() {
        let ring = Arc::new(AckRing::new(8, 0));
        let (first, last) = ring.allocate(2);
        let r = ring.clone();
        let waiter =
            tokio::spawn(async move { r.committed_at(2, &mut None, Duration::from_secs(5)).await });
        tokio::task::yield_now().await;
        ring.acked(first, last, 42);
        assert_eq!(waiter.await.unwrap(), Some(42));
        // Not in flight (beyond what was handed out): no wait, no time.
        let start = std::time::Instant::now();
        assert_eq!(
            ring.committed_at(99, &mut None, Duration::from_secs(5))
                .await,
            None
        );
        assert!(start.elapsed() < Duration::from_secs(1));
        // In flight but failed: resolves to None without waiting out the timeout.
        let (_, last) = ring.allocate(1);
        let r = ring.clone();
        let waiter =
            tokio::spawn(async move { r.committed_at(3, &mut None, Duration::from_secs(5)).await });
        tokio::task::yield_now().await;
        ring.resolve(last);
        assert_eq!(waiter.await.unwrap(), None);
    }

    /// A large insert whose reply is slow: the server shows its documents, the writer has
    /// not heard back. A tail reading them waits once for all of them, not once each (at 2 s
    /// a document, a few hundred documents held a tail for minutes).
    #[tokio::test(start_paused = true)]
    async fn a_tail_waits_once_for_the_acks_of_one_slow_insert() {
        let ring = AckRing::new(8, 0);
        ring.allocate(500);
        let wait = Duration::from_secs(2);
        let start = tokio::time::Instant::now();
        let mut window = None;
        for p in 1..=500 {
            assert_eq!(ring.committed_at(p, &mut window, wait).await, None);
        }
        assert_eq!(start.elapsed(), wait, "one wait for the whole insert");
        // The next insert in flight gets a wait of its own.
        ring.allocate(10);
        assert_eq!(ring.committed_at(501, &mut window, wait).await, None);
        assert_eq!(start.elapsed(), wait * 2);
    }

    fn info(options: BsonDoc) -> BsonDoc {
        doc! {"name": "events", "type": "collection", "options": options}
    }

    #[test]
    fn capped_options_come_from_the_spec() {
        let spec = CappedSpec {
            max_docs: 100_000,
            max_bytes: 64 << 20,
            indexes: vec!["user.id".into()],
        };
        assert_eq!(
            CappedOptions::from_spec(&spec),
            CappedOptions {
                size: 64 << 20,
                max: 100_000
            }
        );
        assert_eq!(latest_index_keys("user.id"), doc! {"user.id": 1, "_id": 1});
        assert_eq!(latest_index_name("user.id"), "tailrace_latest_user.id");
    }

    #[test]
    fn existing_collections_are_checked_not_silently_used() {
        let want = CappedOptions {
            size: 4096,
            max: 10,
        };
        let not_capped = check_existing_capped("events", &info(doc! {}), want).unwrap_err();
        assert!(
            matches!(&not_capped, StoreError::Incompatible { collection, problem }
                if collection == "events" && problem.contains("not capped") && problem.contains("drop")),
            "got {not_capped}"
        );
        let small = check_existing_capped(
            "events",
            &info(doc! {"capped": true, "size": 1024_i32, "max": 10_i64}),
            want,
        )
        .unwrap_err();
        assert!(
            small.to_string().contains("collMod"),
            "names the fix: {small}"
        );
        let few = check_existing_capped(
            "events",
            &info(doc! {"capped": true, "size": 4096.0, "max": 5_i32}),
            want,
        )
        .unwrap_err();
        assert!(few.to_string().contains("max_docs"), "got {few}");
        let view = check_existing_capped(
            "events",
            &doc! {"name": "events", "type": "view", "options": {}},
            want,
        )
        .unwrap_err();
        assert!(view.to_string().contains("view"), "got {view}");
        assert_eq!(
            check_existing_capped(
                "events",
                &info(doc! {"capped": true, "size": 4096_i64, "max": 10_i64}),
                want
            )
            .unwrap(),
            None,
            "exactly as configured"
        );
        let larger = check_existing_capped(
            "events",
            &info(doc! {"capped": true, "size": 8192_i64}),
            want,
        )
        .unwrap();
        assert!(larger.is_some(), "a larger one is used, with a warning");
        let rounded = check_existing_capped(
            "events",
            &info(doc! {"capped": true, "size": 5120_i64, "max": 10_i64}),
            CappedOptions {
                size: 5000,
                max: 10,
            },
        )
        .unwrap();
        assert_eq!(
            rounded, None,
            "the server's rounding up is not a larger collection"
        );
    }

    #[test]
    fn appended_documents_must_not_carry_an_id() {
        let ok = convert_append("events", &[crate::Document::new()]).unwrap();
        assert_eq!(ok.len(), 1);
        let mut d = crate::Document::new();
        d.insert("_id".into(), Value::from(1));
        let err = convert_append("events", &[d]).unwrap_err();
        assert!(matches!(err, StoreError::Invalid(_)), "got {err}");
    }

    #[test]
    fn records_take_their_position_from_the_id() {
        let r = to_record("events", doc! {"_id": 7_i64, "n": 1_i64}, Some(5)).unwrap();
        assert_eq!(r.position, Position(7));
        assert!(
            !r.doc.contains_key("_id"),
            "the position is not part of the document"
        );
        assert_eq!(r.doc["n"], Value::from(1));
        let foreign = to_record("events", doc! {"_id": "abc"}, None).unwrap_err();
        assert!(
            matches!(foreign, StoreError::Incompatible { .. }),
            "got {foreign}"
        );
    }
}
