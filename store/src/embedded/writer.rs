//! The single writer: owns the write connection, commits whatever is queued in one
//! transaction (group commit), evicts capped collections, appends to the op log, then
//! publishes the commit to tail readers and answers every caller.
//!
//! The [`Writer`] sits behind a lock ([`WriterCell`]). A caller that finds it idle, with
//! nothing queued, commits its own small job in its own thread ([`WriterCell::try_inline`]):
//! a single write then pays no hand-off to another thread and back (two cross-thread wake-ups,
//! 20-60 µs each on a small VM, more than SQLite's own commit at `synchronous=NORMAL`).
//! Otherwise the job is queued, and the writer thread ([`run`]) commits everything queued
//! together. A caller never overtakes a queued job: it commits inline only while no job is
//! queued or being committed ([`WriterCell::pending`]), so one caller's writes still commit
//! in the order it made them, whichever way each went.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, TryLockError};
use std::time::{Duration, Instant};

use rusqlite::{Connection, OptionalExtension, params};
use tokio::sync::{broadcast, mpsc, oneshot};

use super::schema::{self, capped_table};
use crate::clock::now_us;
use crate::{
    CappedSpec, Change, ChangeOp, Document, Durability, KeyUpdate, Position, Record, Result,
    ResumeToken, StoreError, update,
};

/// The WAL is copied into the database once it holds this many pages (see [`Writer::new`]).
#[cfg(not(test))]
const WAL_CHECKPOINT_PAGES: i64 = 16_384;
/// Small in unit tests, so a test sees several checkpoints.
#[cfg(test)]
pub(crate) const WAL_CHECKPOINT_PAGES: i64 = 64;

/// A job of more documents or updates than this is always queued for the writer thread, never
/// committed in its caller's thread: a large commit would hold an async thread for as long as
/// it takes. (Running it in [`tokio::task::block_in_place`] instead moves the runtime to a
/// fresh thread each time; every one of them then keeps its own allocator heap: 70/s ran with
/// six such threads and 5-8 MiB more resident memory.) A single event, a feed's checkpoint,
/// the rollups of a slow stream's event stay inline.
pub(crate) const INLINE_MAX_ITEMS: usize = 16;

/// At most this many jobs share one transaction, so one commit's latency stays bounded.
const MAX_GROUP: usize = 1024;

/// The write connection's page cache while it commits large groups, in KiB (SQLite's
/// `cache_size` when negative). A batch of long-tail events changes index and rollup pages
/// scattered over the file; with SQLite's default cache (2,000 KiB) most of them were read
/// again for the next batch (`pread`: 11 % of the writer's samples). See [`PageCache`].
pub(crate) const BUSY_CACHE_KIB: i64 = 16 * 1024;
/// SQLite's default, kept while writes are small: at 70 events/s a larger cache would fill
/// over the hours, and hold its pages.
pub(crate) const IDLE_CACHE_KIB: i64 = 2_000;
/// A group of at least this many documents and updates is a busy writer's.
const BUSY_GROUP_ITEMS: usize = 256;
/// How long after the last large group the cache is cut back.
#[cfg(not(test))]
const BUSY_CACHE_LINGER: Duration = Duration::from_secs(10);
#[cfg(test)]
pub(crate) const BUSY_CACHE_LINGER: Duration = Duration::from_secs(1);

/// What a caller asks the writer to do.
pub(crate) enum Op {
    CreateCapped {
        name: String,
        spec: CappedSpec,
        newest: Arc<AtomicU64>,
    },
    CreateKeyed {
        name: String,
    },
    Append {
        coll: String,
        docs: Vec<Document>,
        /// Each document's JSON text, encoded by the caller: the encoding then runs on the
        /// caller's thread, beside the writer's, not on it.
        bodies: Vec<String>,
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
    /// Commits everything queued before it; used by `close` to flush, and to wake the
    /// writer thread for a WAL checkpoint.
    Barrier,
    /// Several operations as one job: all of them or none (an append and the updates derived
    /// from it). Answered with the first append's positions.
    Together(Vec<Op>),
}

impl Op {
    /// Documents or updates carried (1 for the others).
    fn items(&self) -> usize {
        match self {
            Op::Append { docs, .. } => docs.len(),
            Op::Update { updates, .. } => updates.len(),
            Op::Together(ops) => ops.iter().map(Op::items).sum(),
            _ => 1,
        }
    }
}

/// The writer's answer.
pub(crate) enum Reply {
    Positions(Vec<Position>),
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

/// What one commit made visible; sent to every live tail and change stream.
#[derive(Default)]
pub(crate) struct Commit {
    /// Appended records per capped collection, in position order.
    pub appended: Vec<(String, Vec<Record>)>,
    /// Published changes in op-log order.
    pub changes: Vec<Change>,
}

/// In-memory bookkeeping of a capped collection, so eviction needs no `COUNT(*)`.
struct CappedMeta {
    table: String,
    /// The index columns of the table and their fields (every one, whatever the spec of the
    /// handle that appends: a document is indexed by every index its collection has).
    indexed: Vec<(String, String)>,
    /// The insert statement, with a parameter per index column.
    insert: String,
    max_docs: u64,
    max_bytes: u64,
    count: u64,
    bytes: u64,
    /// Shared with readers: the newest committed position (0 = none yet).
    newest: Arc<AtomicU64>,
}

/// Documents of keyed collections as last written, with their JSON text: an update of a hot
/// key (a source's summary, updated on every event) then needs no read and no parse. The
/// writer is the only writer, so the cache is exact; it is cleared whenever a job or a
/// transaction is rolled back.
#[derive(Default)]
struct KvCache {
    /// By collection, then key (nested so a lookup by borrowed strings allocates nothing).
    docs: HashMap<String, HashMap<String, (Document, String)>>,
    len: usize,
}

impl KvCache {
    /// Entries kept at most; beyond, the cache starts over (cold keys of a long tail are read
    /// from the table anyway).
    const CAPACITY: usize = 4096;

    /// Takes the entry out: its key is about to be rewritten or deleted.
    fn take(&mut self, coll: &str, key: &str) -> Option<(Document, String)> {
        let entry = self.docs.get_mut(coll)?.remove(key)?;
        self.len -= 1;
        Some(entry)
    }

    fn put(&mut self, coll: &str, key: &str, doc: Document, body: String) {
        if self.len >= Self::CAPACITY {
            self.clear();
        }
        let keys = match self.docs.get_mut(coll) {
            Some(keys) => keys,
            None => self.docs.entry(coll.to_owned()).or_default(),
        };
        if keys.insert(key.to_owned(), (doc, body)).is_none() {
            self.len += 1;
        }
    }

    fn remove(&mut self, coll: &str, key: &str) {
        if let Some(keys) = self.docs.get_mut(coll)
            && keys.remove(key).is_some()
        {
            self.len -= 1;
        }
    }

    fn clear(&mut self) {
        self.docs.clear();
        self.len = 0;
    }
}

pub(crate) struct Writer {
    /// Declared first, so it stops (and closes its connection) before the writer's own
    /// connection closes, which then is the last and removes the WAL.
    copier: WalCopier,
    conn: Connection,
    capped: HashMap<String, CappedMeta>,
    kv: KvCache,
    oplog_max_entries: u64,
    /// Whether `synchronous=FULL` is currently set; toggled per group as durability needs.
    sync_full: bool,
    hub: broadcast::Sender<Arc<Commit>>,
    newest_op: Arc<AtomicU64>,
    /// Pages in the WAL after the last commit (SQLite's WAL hook sets it).
    wal_pages: Arc<AtomicU64>,
    cache: PageCache,
}

/// The write connection's page cache: larger while the writer commits large groups, emptied
/// and back to SQLite's default [`BUSY_CACHE_LINGER`] after the last one. `bench replay`'s
/// long tail (10^7 distinct hashtags) ran 15 % faster with it, `bench insert` random
/// batched 4 % (docs/BENCHMARKS.md, "Memory after a burst"). Emptied, the cache's pages go
/// back to the allocator, which returns them to the system: the binary gives SQLite mimalloc
/// (`tailrace::allocator::route_sqlite`); glibc kept them.
#[derive(Default)]
struct PageCache {
    /// Until when the cache stays large: the last large group's commit and the linger.
    /// `None` while it is at its default. Checked at each commit, and by [`cut_idle_cache`]
    /// when no commit comes.
    busy_until: Option<Instant>,
}

impl PageCache {
    /// Whether the cache is large and its while is over.
    fn due(&self, now: Instant) -> bool {
        self.busy_until.is_some_and(|until| now >= until)
    }

    /// The `cache_size` to set before committing a group of `items`, if it changes.
    fn resize(&mut self, items: usize, now: Instant) -> Option<i64> {
        if items >= BUSY_GROUP_ITEMS {
            let grow = self.busy_until.is_none();
            self.busy_until = Some(now + BUSY_CACHE_LINGER);
            return grow.then_some(-BUSY_CACHE_KIB);
        }
        if self.due(now) {
            self.busy_until = None;
            return Some(-IDLE_CACHE_KIB);
        }
        None
    }
}

/// No copy of the WAL is under way.
const COPY_IDLE: u8 = 0;
/// The copy thread is copying the WAL.
const COPY_RUNNING: u8 = 1;
/// The copy thread is done; the writer copies what was committed meanwhile.
const COPY_DONE: u8 = 2;

/// Copies the WAL into the database on a thread and connection of its own. A copy of a full
/// WAL (16,384 pages) took 80-300 ms on this machine's disk, most of it the database file's
/// `fsync`; made on the writer's connection, it held the writer and every caller for that
/// long (`bench insert`, random: ten times in a 7-second run). SQLite lets another
/// connection copy while the writer commits: the copy takes the frames committed when it
/// starts, and the writer then copies the few committed meanwhile itself
/// ([`Writer::maintain_wal`]), after which the WAL starts over at the next commit.
struct WalCopier {
    shared: Arc<CopyState>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Default)]
struct CopyState {
    /// [`COPY_IDLE`], [`COPY_RUNNING`] or [`COPY_DONE`].
    state: AtomicU8,
    stop: AtomicBool,
    /// Copies made by the copy thread.
    copies: AtomicU64,
    lock: Mutex<()>,
    wake: Condvar,
}

impl WalCopier {
    fn start(db: &Path) -> Result<Self> {
        let conn = schema::open(db)?;
        let shared = Arc::new(CopyState::default());
        let thread = std::thread::Builder::new()
            .name("tailrace-wal-copy".into())
            .spawn({
                let shared = shared.clone();
                move || copy_wal_when_asked(conn, &shared)
            })
            .map_err(|source| StoreError::Io {
                context: "starting the WAL copy thread".into(),
                source,
            })?;
        Ok(WalCopier {
            shared,
            thread: Some(thread),
        })
    }

    fn state(&self) -> u8 {
        self.shared.state.load(Ordering::Acquire)
    }

    /// Starts a copy unless one is under way, or done and not yet followed up by the writer.
    fn ask(&self) {
        if self
            .shared
            .state
            .compare_exchange(COPY_IDLE, COPY_RUNNING, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            // Under the lock, so the thread is either before its check or waiting.
            let _guard = self.shared.lock.lock();
            self.shared.wake.notify_one();
        }
    }

    fn finished(&self) {
        self.shared.state.store(COPY_IDLE, Ordering::Release);
    }
}

impl Drop for WalCopier {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        {
            let _guard = self.shared.lock.lock();
            self.shared.wake.notify_one();
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The WAL copy thread: waits to be asked, copies (`PASSIVE`: waits for no reader or writer),
/// says it is done; until stopped.
fn copy_wal_when_asked(conn: Connection, shared: &CopyState) {
    loop {
        {
            let Ok(mut guard) = shared.lock.lock() else {
                return;
            };
            while shared.state.load(Ordering::Acquire) != COPY_RUNNING
                && !shared.stop.load(Ordering::Acquire)
            {
                guard = match shared.wake.wait(guard) {
                    Ok(guard) => guard,
                    Err(_) => return,
                };
            }
        }
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        let started = Instant::now();
        match conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
            Ok((r.get::<_, i64>(1)?, r.get::<_, i64>(2)?))
        }) {
            Ok((pages, copied)) => tracing::debug!(
                pages,
                copied,
                ms = started.elapsed().as_millis() as u64,
                "WAL copied by the copy thread"
            ),
            // The writer copies what is left, as it did before this thread existed.
            Err(e) => tracing::warn!(error = %e, "WAL copy failed; the writer copies it"),
        }
        shared.copies.fetch_add(1, Ordering::Relaxed);
        shared.state.store(COPY_DONE, Ordering::Release);
    }
}

/// The writer behind its lock, shared by the writer thread and the callers that commit inline.
pub(crate) struct WriterCell {
    /// `None` once the store is closed.
    writer: Mutex<Option<Writer>>,
    /// Jobs queued for the writer thread and not yet answered. A caller commits inline only
    /// while this is 0: it is counted before a job is queued and uncounted once its group is
    /// committed, so a queued job is never overtaken.
    pending: AtomicUsize,
    /// Jobs committed in their caller's thread (for tests and diagnostics).
    inline: AtomicU64,
    /// A caller's inline commit found the WAL full and woke the writer thread to copy it.
    checkpoint_asked: std::sync::atomic::AtomicBool,
}

impl WriterCell {
    pub(crate) fn new(writer: Writer) -> Self {
        WriterCell {
            writer: Mutex::new(Some(writer)),
            pending: AtomicUsize::new(0),
            inline: AtomicU64::new(0),
            checkpoint_asked: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Commits `op` in the calling thread when the writer is idle, nothing is queued and `op`
    /// is small ([`INLINE_MAX_ITEMS`]); gives `op` back otherwise (the caller then queues it).
    /// When the commit leaves the WAL full, the caller must wake the writer thread to copy
    /// it (`Inline::wake_writer`): the copy is not done on the caller's thread.
    pub(crate) fn try_inline(
        &self,
        op: Op,
        durability: Durability,
    ) -> std::result::Result<Inline, Op> {
        if op.items() > INLINE_MAX_ITEMS || self.pending.load(Ordering::Acquire) != 0 {
            return Err(op);
        }
        let mut guard = match self.writer.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::WouldBlock) => return Err(op),
            Err(TryLockError::Poisoned(_)) => return Ok(Inline::done(Err(poisoned()))),
        };
        // Counted before the lock is released by whoever held it: checked again under it.
        if self.pending.load(Ordering::Acquire) != 0 {
            return Err(op);
        }
        let Some(writer) = guard.as_mut() else {
            return Ok(Inline::done(Err(StoreError::Closed)));
        };
        let mut jobs = [Job {
            op,
            durability,
            reply: None,
        }];
        let result = writer.commit_group(&mut jobs).pop();
        let wake_writer = writer.wal_due() && !self.checkpoint_asked.swap(true, Ordering::AcqRel);
        self.inline.fetch_add(1, Ordering::Relaxed);
        Ok(Inline {
            result: result.unwrap_or(Err(StoreError::Closed)),
            wake_writer,
        })
    }

    /// How many jobs were committed in their caller's thread so far.
    #[cfg(test)]
    pub(crate) fn inline_commits(&self) -> u64 {
        self.inline.load(Ordering::Relaxed)
    }

    /// Copies of the WAL made by the copy thread so far.
    #[cfg(test)]
    pub(crate) fn background_copies(&self) -> u64 {
        self.hold()
            .as_ref()
            .map_or(0, |w| w.copier.shared.copies.load(Ordering::Relaxed))
    }

    /// Jobs queued and not yet answered.
    #[cfg(test)]
    pub(crate) fn pending(&self) -> usize {
        self.pending.load(Ordering::Acquire)
    }

    /// The write connection's `cache_size` (negative: KiB).
    #[cfg(test)]
    pub(crate) fn cache_size(&self) -> i64 {
        let guard = self.hold();
        let writer = guard.as_ref().expect("open");
        writer
            .conn
            .query_row("PRAGMA cache_size", [], |r| r.get(0))
            .expect("cache_size")
    }

    /// Bytes of the write connection's page cache in use (`SQLITE_DBSTATUS_CACHE_USED`).
    #[cfg(test)]
    #[allow(unsafe_code)]
    pub(crate) fn cache_used(&self) -> i64 {
        let guard = self.hold();
        let writer = guard.as_ref().expect("open");
        let (mut used, mut highwater) = (0, 0);
        // SAFETY: the handle is the writer's open connection, used by no one else while the
        // lock is held; SQLite writes the two counters and returns.
        let rc = unsafe {
            rusqlite::ffi::sqlite3_db_status(
                writer.conn.handle(),
                rusqlite::ffi::SQLITE_DBSTATUS_CACHE_USED,
                &mut used,
                &mut highwater,
                0,
            )
        };
        assert_eq!(rc, rusqlite::ffi::SQLITE_OK);
        i64::from(used)
    }

    /// Holds the writer, as a long commit would: every write is queued meanwhile.
    #[cfg(test)]
    pub(crate) fn hold(&self) -> std::sync::MutexGuard<'_, Option<Writer>> {
        self.writer.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a job about to be queued (see [`WriterCell::pending`]).
    pub(crate) fn queued(&self) {
        self.pending.fetch_add(1, Ordering::AcqRel);
    }

    /// Queues an empty job ([`Op::Barrier`]) so the writer thread commits a group and does
    /// what it does after one (copy a full WAL, cut a page cache whose while is over). A full
    /// queue needs none: the writer thread is busy with it and will.
    pub(crate) fn wake(&self, jobs: &mpsc::Sender<Job>) {
        self.queued();
        let wake = Job {
            op: Op::Barrier,
            durability: Durability::Acknowledged,
            reply: None,
        };
        if jobs.try_send(wake).is_err() {
            self.not_queued();
        }
    }

    /// Uncounts a job that could not be queued after all.
    pub(crate) fn not_queued(&self) {
        self.pending.fetch_sub(1, Ordering::AcqRel);
    }

    /// Takes the writer out, closing its connection (after the writer thread has stopped).
    pub(crate) fn close(&self) -> Result<()> {
        let writer = self.writer.lock().map_err(|_| poisoned())?.take();
        drop(writer);
        Ok(())
    }
}

fn poisoned() -> StoreError {
    StoreError::Engine {
        engine: "embedded",
        message: "the writer panicked during a commit; reopen the store".into(),
    }
}

/// Cuts a large page cache back when no commit comes to do it (a stream that stopped right
/// after a burst): every [`BUSY_CACHE_LINGER`], if the cache's while is over, queues a
/// [`Op::Barrier`], whose empty commit cuts it. Holds neither the writer nor the queue
/// between checks, so a store dropped unclosed closes its connection as before; ends once
/// they are gone.
pub(crate) async fn cut_idle_cache(cell: std::sync::Weak<WriterCell>, jobs: mpsc::WeakSender<Job>) {
    loop {
        tokio::time::sleep(BUSY_CACHE_LINGER).await;
        let (Some(cell), Some(sender)) = (cell.upgrade(), jobs.upgrade()) else {
            return;
        };
        // Busy (the lock taken): the commit under way cuts it if due.
        let due = match cell.writer.try_lock() {
            Ok(guard) => guard.as_ref().is_some_and(|w| w.cache.due(Instant::now())),
            Err(_) => false,
        };
        if due {
            cell.wake(&sender);
        }
    }
}

/// What an inline commit did.
pub(crate) struct Inline {
    pub result: Result<Reply>,
    /// The WAL is full: queue a job (a [`Op::Barrier`]) so the writer thread copies it.
    pub wake_writer: bool,
}

impl Inline {
    fn done(result: Result<Reply>) -> Self {
        Inline {
            result,
            wake_writer: false,
        }
    }
}

/// The writer thread: commits what callers queued, everything queued at once (up to
/// [`MAX_GROUP`] jobs) in one transaction, and copies the WAL into the database when it is
/// full, until every sender is gone.
pub(crate) fn run(cell: Arc<WriterCell>, mut rx: mpsc::Receiver<Job>) {
    while let Some(first) = rx.blocking_recv() {
        let mut jobs = vec![first];
        let mut guard = match cell.writer.lock() {
            Ok(guard) => guard,
            Err(_) => {
                cell.pending.fetch_sub(jobs.len(), Ordering::AcqRel);
                answer(jobs, || Err(poisoned()));
                continue;
            }
        };
        while jobs.len() < MAX_GROUP {
            match rx.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        let results = match guard.as_mut() {
            Some(writer) => writer.commit_group(&mut jobs),
            None => jobs.iter().map(|_| Err(StoreError::Closed)).collect(),
        };
        // Uncounted before the lock is released, so the callers answered here may commit
        // their next write inline.
        cell.pending.fetch_sub(jobs.len(), Ordering::AcqRel);
        let mut results = results.into_iter();
        if let Some(writer) = guard.as_mut().filter(|w| w.wal_due()) {
            // Answered first: the copy can take a while, and these writes are committed.
            answer(std::mem::take(&mut jobs), || {
                results.next().unwrap_or(Err(StoreError::Closed))
            });
            writer.maintain_wal();
            cell.checkpoint_asked.store(false, Ordering::Release);
        }
        drop(guard);
        answer(jobs, || results.next().unwrap_or(Err(StoreError::Closed)));
    }
}

/// Sends each job its answer (unacknowledged jobs have nobody waiting).
fn answer(jobs: Vec<Job>, mut result: impl FnMut() -> Result<Reply>) {
    for job in jobs {
        let r = result();
        if let Some(tx) = job.reply {
            let _ = tx.send(r);
        }
    }
}

impl Writer {
    pub(crate) fn new(
        conn: Connection,
        db: &Path,
        oplog_max_entries: u64,
        hub: broadcast::Sender<Arc<Commit>>,
        newest_op: Arc<AtomicU64>,
    ) -> Result<Self> {
        conn.pragma_update(None, "synchronous", "FULL")?;
        // Every job runs in a savepoint, whose sub-journal (a copy of each page the job
        // changes) spills to a temporary *file* past 64 KiB by default: one pwrite per page,
        // on every group commit. Memory is where it belongs; it lives for one job.
        conn.pragma_update(None, "temp_store", "MEMORY")?;
        // The WAL is copied into the database when it reaches this many pages. SQLite's 1,000
        // (4 MB) is about one batch of 256 long-tail events (each lands on its own index and
        // rollup pages), so nearly every commit paid a checkpoint and every page was written
        // twice. At 16,384 a page changed by many commits is copied once: bench insert,
        // realistic, 22.6 → 15.3 KB written and 10-12k → 15-16k events/s. The file is cut
        // back to that size after a checkpoint if readers made it outgrow it.
        //
        // The checkpoint is the writer thread's ([`Writer::checkpoint_wal`]), not SQLite's
        // automatic one: that one runs inside whichever commit crosses the limit, which may be
        // a caller's inline commit on an async thread, and copying 64 MB would stall it. The
        // hook (which replaces the automatic checkpoint) only records the WAL's size.
        let wal_pages = Arc::new(AtomicU64::new(0));
        let mut conn = conn;
        conn.wal_hook(Some({
            let wal_pages = wal_pages.clone();
            move |_: &mut rusqlite::hooks::Wal, pages: std::os::raw::c_int| {
                wal_pages.store(pages.max(0) as u64, Ordering::Relaxed);
                Ok(())
            }
        }))?;
        conn.pragma_update(None, "journal_size_limit", WAL_CHECKPOINT_PAGES * 4096)?;
        Ok(Writer {
            copier: WalCopier::start(db)?,
            conn,
            kv: KvCache::default(),
            capped: HashMap::new(),
            oplog_max_entries,
            sync_full: true,
            hub,
            newest_op,
            wal_pages,
            cache: PageCache::default(),
        })
    }

    /// Whether the WAL has grown to the size at which it is copied into the database.
    fn wal_full(&self) -> bool {
        self.wal_pages.load(Ordering::Relaxed) >= WAL_CHECKPOINT_PAGES as u64
    }

    /// Whether the WAL needs the writer thread: it is full, and no copy is under way on the
    /// copy thread. A finished copy that left nothing to add (no commit came meanwhile, so the
    /// WAL started over) is closed here.
    fn wal_due(&self) -> bool {
        let full = self.wal_full();
        match self.copier.state() {
            COPY_RUNNING => false,
            COPY_DONE if !full => {
                self.copier.finished();
                false
            }
            _ => full,
        }
    }

    /// Keeps the WAL bounded once it is full: has the copy thread copy it and, once that is
    /// done, copies the frames committed meanwhile, so the WAL starts over at the next commit.
    fn maintain_wal(&mut self) {
        match self.copier.state() {
            COPY_IDLE => self.copier.ask(),
            COPY_RUNNING => {}
            _ => {
                self.checkpoint_wal();
                self.copier.finished();
            }
        }
    }

    /// Copies the WAL into the database, as far as readers allow (`PASSIVE`: it waits for no
    /// one; what a reader still needs is copied next time), so the WAL starts over.
    fn checkpoint_wal(&mut self) {
        let r = self
            .conn
            .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
                Ok((r.get::<_, i64>(1)?, r.get::<_, i64>(2)?))
            });
        match r {
            Ok((pages, copied)) => {
                tracing::debug!(pages, copied, "WAL checkpointed");
                if copied >= pages {
                    self.wal_pages.store(0, Ordering::Relaxed);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "WAL checkpoint failed; retried after the next commit")
            }
        }
    }

    /// Commits `jobs` in one transaction; returns each job's answer, in order.
    fn commit_group(&mut self, jobs: &mut [Job]) -> Vec<Result<Reply>> {
        let items = jobs.iter().map(|j| j.op.items()).sum();
        if let Some(kib) = self.cache.resize(items, Instant::now()) {
            let mut r = self.conn.pragma_update(None, "cache_size", kib);
            if kib == -IDLE_CACHE_KIB {
                // Cut back, the cache frees its least recent pages only, and the ones it
                // keeps are scattered over the allocator's pages, so hardly any memory goes
                // back. Emptied, it frees every page it had, and refills from the next commit.
                r = r.and_then(|()| self.conn.release_memory());
            }
            if let Err(e) = r {
                // Only a speed-up: the commit goes on with the cache it has.
                tracing::debug!(error = %e, kib, "resizing the page cache failed");
            }
        }
        let full = jobs.iter().any(|j| j.durability.syncs());
        let mut results: Vec<Result<Reply>> = Vec::with_capacity(jobs.len());
        let mut commit = Commit::default();
        let outcome = self.transaction(full, jobs, &mut results, &mut commit);
        if let Err(e) = outcome {
            // The whole transaction is gone: every caller hears why, and the in-memory
            // bookkeeping is reloaded from what is really on disk.
            let _ = self.conn.execute_batch("ROLLBACK");
            self.kv.clear();
            tracing::error!(error = %e, jobs = jobs.len(), transient = e.is_transient(), "embedded store commit failed");
            self.reload_capped_meta();
            return jobs.iter().map(|_| Err(e.duplicate("embedded"))).collect();
        }
        let committed_at = now_us();
        for (_, records) in &mut commit.appended {
            for r in records.iter_mut() {
                r.committed_at_us = Some(committed_at);
            }
        }
        for c in &mut commit.changes {
            c.committed_at_us = committed_at;
        }
        for (coll, records) in &commit.appended {
            if let (Some(meta), Some(last)) = (self.capped.get(coll), records.last()) {
                meta.newest.store(last.position.0, Ordering::Release);
            }
        }
        if let Some(last) = commit.changes.last()
            && let Ok(seq) = last.token.0.parse::<u64>()
        {
            self.newest_op.store(seq, Ordering::Release);
        }
        if !commit.appended.is_empty() || !commit.changes.is_empty() {
            // No receivers is fine: nobody is tailing.
            let _ = self.hub.send(Arc::new(commit));
        }
        results
    }

    /// Runs a statement without parameters through the statement cache (`execute_batch`
    /// parses its text on every call; these run several times per group).
    fn exec_cached(&self, sql: &str) -> Result<()> {
        self.conn.prepare_cached(sql)?.execute([])?;
        Ok(())
    }

    fn transaction(
        &mut self,
        full: bool,
        jobs: &mut [Job],
        results: &mut Vec<Result<Reply>>,
        commit: &mut Commit,
    ) -> Result<()> {
        if full != self.sync_full {
            self.conn
                .pragma_update(None, "synchronous", if full { "FULL" } else { "NORMAL" })?;
            self.sync_full = full;
        }
        let now = now_us();
        self.exec_cached("BEGIN IMMEDIATE")?;
        let mut wrote_oplog = false;
        // A group of one job needs no savepoint: if it fails, the whole transaction is undone.
        let alone = jobs.len() == 1;
        for job in jobs.iter_mut() {
            if alone {
                let before_changes = commit.changes.len();
                match self.apply(&mut job.op, now, commit) {
                    Ok(reply) => {
                        wrote_oplog |= commit.changes.len() > before_changes;
                        results.push(Ok(reply));
                    }
                    Err(e) => {
                        self.exec_cached("ROLLBACK")?;
                        self.kv.clear();
                        commit.appended.clear();
                        commit.changes.clear();
                        self.reload_capped_meta();
                        results.push(Err(e));
                        return Ok(());
                    }
                }
                continue;
            }
            self.exec_cached("SAVEPOINT job")?;
            let before_appended = commit.appended.len();
            let before_changes = commit.changes.len();
            match self.apply(&mut job.op, now, commit) {
                Ok(reply) => {
                    self.exec_cached("RELEASE job")?;
                    wrote_oplog |= commit.changes.len() > before_changes;
                    results.push(Ok(reply));
                }
                Err(e) => {
                    // Only this job is undone; the others in the group still commit.
                    self.conn.execute_batch("ROLLBACK TO job; RELEASE job")?;
                    self.kv.clear();
                    commit.appended.truncate(before_appended);
                    commit.changes.truncate(before_changes);
                    self.reload_capped_meta();
                    results.push(Err(e));
                }
            }
        }
        if wrote_oplog
            && let Some(max_seq) = commit
                .changes
                .last()
                .and_then(|c| c.token.0.parse::<i64>().ok())
        {
            // The op log is bounded like a capped collection: oldest entries go first.
            let cut = max_seq - self.oplog_max_entries as i64;
            if cut > 0 {
                self.conn
                    .prepare_cached("DELETE FROM oplog WHERE seq <= ?1")?
                    .execute([cut])?;
            }
        }
        self.exec_cached("COMMIT")?;
        Ok(())
    }

    fn apply(&mut self, op: &mut Op, now: i64, commit: &mut Commit) -> Result<Reply> {
        match op {
            Op::CreateCapped { name, spec, newest } => {
                self.create_capped(name, spec, newest.clone())?;
                Ok(Reply::Done)
            }
            Op::CreateKeyed { name } => {
                self.conn.execute(
                    "INSERT INTO collections(name, kind) VALUES (?1, 'keyed')
                     ON CONFLICT(name) DO NOTHING",
                    [&*name],
                )?;
                let kind: String = self.conn.query_row(
                    "SELECT kind FROM collections WHERE name = ?1",
                    [&*name],
                    |r| r.get(0),
                )?;
                if kind != "keyed" {
                    return Err(StoreError::Incompatible {
                        collection: name.clone(),
                        problem: format!("exists as a {kind} collection, not a keyed one"),
                    });
                }
                Ok(Reply::Done)
            }
            Op::Append { coll, docs, bodies } => {
                let records =
                    self.append(coll, std::mem::take(docs), std::mem::take(bodies), now)?;
                let positions = records.iter().map(|r| r.position).collect();
                commit.appended.push((coll.clone(), records));
                Ok(Reply::Positions(positions))
            }
            Op::Update { coll, updates } => {
                // A key updated again later in the job (a source's summary: once per event of
                // a batch) has its row written once, with its last state; each state before
                // that is logged, as change feeds read every one, and held here meanwhile.
                //
                // The updates are the job's: their `$set` values move into the documents.
                let rewritten = rewritten_later(updates);
                let mut held: HashMap<String, (Document, String)> = HashMap::new();
                for (KeyUpdate { key, update: u }, again) in
                    std::mem::take(updates).into_iter().zip(rewritten)
                {
                    let before = match held.remove(key.as_str()) {
                        Some(entry) => Some(entry),
                        None => self.take_kv(coll, &key)?,
                    };
                    let mut after = match &before {
                        Some((doc, _)) => doc.clone(),
                        None => {
                            let mut d = Document::new();
                            d.insert("_id".into(), key.clone().into());
                            d
                        }
                    };
                    update::apply_owned(&mut after, u)?;
                    let op = if before.is_some() {
                        ChangeOp::Update
                    } else {
                        ChangeOp::Insert
                    };
                    let change = if again {
                        let body = serde_json::to_string(&after)?;
                        let (before_doc, before_body) = before.unzip();
                        let change = self.log_texts(
                            coll,
                            op,
                            &key,
                            (before_doc, before_body.as_deref()),
                            (Some(after.clone()), Some(&body)),
                            now,
                        )?;
                        held.insert(key, (after, body));
                        change
                    } else {
                        self.write_kv(coll, &key, op, before, after, now)?
                    };
                    commit.changes.push(change);
                }
                Ok(Reply::Done)
            }
            Op::Set { coll, key, doc } => {
                let before = self.take_kv(coll, key)?;
                let mut after = std::mem::take(doc);
                after.insert("_id".into(), key.clone().into());
                let op = if before.is_some() {
                    ChangeOp::Replace
                } else {
                    ChangeOp::Insert
                };
                let change = self.write_kv(coll, key, op, before, after, now)?;
                commit.changes.push(change);
                Ok(Reply::Done)
            }
            Op::Delete { coll, key } => {
                let Some(before) = self.take_kv(coll, key)? else {
                    return Ok(Reply::Deleted(false));
                };
                self.conn
                    .prepare_cached("DELETE FROM kv WHERE coll = ?1 AND key = ?2")?
                    .execute([&*coll, &*key])?;
                let change = self.log(coll, ChangeOp::Delete, key, Some(before), None, now)?;
                commit.changes.push(change);
                Ok(Reply::Deleted(true))
            }
            Op::Expire {
                coll,
                prefix,
                before,
                limit,
            } => {
                let (coll, prefix) = (coll.clone(), prefix.clone());
                let n = self.expire(&coll, &prefix, *before, *limit, now, commit)?;
                Ok(Reply::Expired(n))
            }
            Op::Checkpoint { feed, body } => {
                self.conn
                    .prepare_cached(
                        "INSERT INTO checkpoints(feed, body, ts) VALUES (?1, ?2, ?3)
                         ON CONFLICT(feed) DO UPDATE SET body = excluded.body, ts = excluded.ts",
                    )?
                    .execute(params![&*feed, &*body, now])?;
                Ok(Reply::Done)
            }
            Op::Barrier => Ok(Reply::Done),
            Op::Together(ops) => {
                // A failure undoes the whole job (its savepoint, or the transaction when it is
                // alone), so no part of it is committed without the others.
                let mut reply = None;
                for op in ops.iter_mut() {
                    let r = self.apply(op, now, commit)?;
                    if reply.is_none() && matches!(r, Reply::Positions(_)) {
                        reply = Some(r);
                    }
                }
                Ok(reply.unwrap_or(Reply::Done))
            }
        }
    }

    fn create_capped(
        &mut self,
        name: &str,
        spec: &CappedSpec,
        newest: Arc<AtomicU64>,
    ) -> Result<()> {
        let table = capped_table(name);
        let kind: Option<String> = self
            .conn
            .query_row(
                "SELECT kind FROM collections WHERE name = ?1",
                [name],
                |r| r.get(0),
            )
            .optional()?;
        if let Some(kind) = kind.filter(|k| k != "capped") {
            return Err(StoreError::Incompatible {
                collection: name.to_string(),
                problem: format!("exists as a {kind} collection, not a capped one"),
            });
        }
        self.conn.execute_batch(&format!(
            "CREATE TABLE IF NOT EXISTS {table}(
                pos INTEGER PRIMARY KEY AUTOINCREMENT,
                body TEXT NOT NULL,
                sz INTEGER NOT NULL,
                ts INTEGER NOT NULL
            )"
        ))?;
        // Limits may change between runs: the new ones apply from the next append.
        self.conn.execute(
            "INSERT INTO collections(name, kind, max_docs, max_bytes) VALUES (?1, 'capped', ?2, ?3)
             ON CONFLICT(name) DO UPDATE SET max_docs = excluded.max_docs, max_bytes = excluded.max_bytes",
            params![name, spec.max_docs as i64, spec.max_bytes as i64],
        )?;
        let columns = |conn: &Connection| -> Result<Vec<String>> {
            let mut stmt =
                conn.prepare(&format!("SELECT name FROM pragma_table_info('{table}')"))?;
            let names = stmt.query_map([], |r| r.get::<_, String>(0))?;
            Ok(names.collect::<rusqlite::Result<_>>()?)
        };
        let existing = columns(&self.conn)?;
        for field in &spec.indexes {
            schema::check_field(field)?;
            let col = schema::index_column(field);
            if !existing.contains(&col) {
                // A new index: a column, filled once from the documents already stored.
                self.conn.execute_batch(&format!(
                    "ALTER TABLE {table} ADD COLUMN {col};
                     UPDATE {table} SET {col} = {};",
                    schema::field_expr(field)
                ))?;
            }
            self.conn.execute_batch(&format!(
                "DROP INDEX IF EXISTS {old};
                 CREATE INDEX IF NOT EXISTS {table}_{col} ON {table}({col});",
                old = schema::index_name(name, field),
            ))?;
        }
        let indexed: Vec<(String, String)> = columns(&self.conn)?
            .into_iter()
            .filter_map(|c| schema::column_field(&c).map(|f| (c, f)))
            .collect();
        let insert = format!(
            "INSERT INTO {table}(body, sz, ts{cols}) VALUES (?1, ?2, ?3{params})",
            cols = indexed
                .iter()
                .map(|(c, _)| format!(", {c}"))
                .collect::<String>(),
            params = (0..indexed.len())
                .map(|i| format!(", ?{}", i + 4))
                .collect::<String>(),
        );
        let (count, bytes, max): (i64, i64, i64) = self.conn.query_row(
            &format!("SELECT COUNT(*), COALESCE(SUM(sz), 0), COALESCE(MAX(pos), 0) FROM {table}"),
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )?;
        newest.store(max as u64, Ordering::Release);
        self.capped.insert(
            name.to_string(),
            CappedMeta {
                table,
                indexed,
                insert,
                max_docs: spec.max_docs,
                max_bytes: spec.max_bytes,
                count: count as u64,
                bytes: bytes as u64,
                newest,
            },
        );
        Ok(())
    }

    /// Re-reads counts and sizes after a rolled-back job, so eviction stays exact.
    fn reload_capped_meta(&mut self) {
        for meta in self.capped.values_mut() {
            let row: rusqlite::Result<(i64, i64)> = self.conn.query_row(
                &format!("SELECT COUNT(*), COALESCE(SUM(sz), 0) FROM {}", meta.table),
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            );
            if let Ok((count, bytes)) = row {
                meta.count = count as u64;
                meta.bytes = bytes as u64;
            }
        }
    }

    fn append(
        &mut self,
        coll: &str,
        docs: Vec<Document>,
        bodies: Vec<String>,
        now: i64,
    ) -> Result<Vec<Record>> {
        let meta = self.capped.get_mut(coll).ok_or_else(|| {
            StoreError::Invalid(format!("capped collection {coll} was not opened"))
        })?;
        if bodies.len() != docs.len() {
            return Err(StoreError::Invalid(format!(
                "append to {coll}: {} documents and {} encodings",
                docs.len(),
                bodies.len()
            )));
        }
        let mut records = Vec::with_capacity(docs.len());
        {
            let mut insert = self.conn.prepare_cached(&meta.insert)?;
            for (doc, body) in docs.into_iter().zip(bodies) {
                let size = body.len() as u64;
                // Bound in place: the index values are borrowed from the document.
                insert.raw_bind_parameter(1, &body)?;
                insert.raw_bind_parameter(2, size as i64)?;
                insert.raw_bind_parameter(3, now)?;
                for (i, (_, field)) in meta.indexed.iter().enumerate() {
                    let value = schema::index_value(update::get_path(&doc, field));
                    insert.raw_bind_parameter(4 + i, value)?;
                }
                insert.raw_execute()?;
                let pos = self.conn.last_insert_rowid() as u64;
                meta.count += 1;
                meta.bytes += size;
                records.push(Record {
                    position: Position(pos),
                    doc,
                    committed_at_us: None,
                });
            }
        }
        evict(&self.conn, meta)?;
        Ok(records)
    }

    /// The document of `key` and its JSON text, taken from the cache (the key is about to be
    /// rewritten or deleted) or read from the table.
    fn take_kv(&mut self, coll: &str, key: &str) -> Result<Option<(Document, String)>> {
        if let Some(entry) = self.kv.take(coll, key) {
            return Ok(Some(entry));
        }
        let body: Option<String> = self
            .conn
            .prepare_cached("SELECT body FROM kv WHERE coll = ?1 AND key = ?2")?
            .query_row([coll, key], |r| r.get(0))
            .optional()?;
        body.map(|b| Ok((serde_json::from_str(&b)?, b))).transpose()
    }

    /// Writes `after` as the document of `key` and logs the change: `after` is encoded once
    /// (for the table and the op log), and `before` keeps the text it was read with.
    fn write_kv(
        &mut self,
        coll: &str,
        key: &str,
        op: ChangeOp,
        before: Option<(Document, String)>,
        after: Document,
        now: i64,
    ) -> Result<Change> {
        let body = serde_json::to_string(&after)?;
        self.put_kv(coll, key, &body, now)?;
        if before.is_some() {
            // A key written before is likely written again (a hot counter, a summary); a new
            // one, on a long tail, mostly is not, and caching it would cost a copy of it.
            self.kv.put(coll, key, after.clone(), body.clone());
        }
        let (before_doc, before_body) = before.unzip();
        self.log_texts(
            coll,
            op,
            key,
            (before_doc, before_body.as_deref()),
            (Some(after), Some(&body)),
            now,
        )
    }

    fn put_kv(&self, coll: &str, key: &str, body: &str, now: i64) -> Result<()> {
        self.conn
            .prepare_cached(
                "INSERT INTO kv(coll, key, body, ts) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT(coll, key) DO UPDATE SET body = excluded.body, ts = excluded.ts",
            )?
            .execute(params![coll, key, body, now])?;
        Ok(())
    }

    /// Deletes (and logs, as deletes) up to `limit` keys of `coll` starting with `prefix` that
    /// were last written before `before`, oldest first.
    fn expire(
        &mut self,
        coll: &str,
        prefix: &str,
        before: i64,
        limit: usize,
        now: i64,
        commit: &mut Commit,
    ) -> Result<u64> {
        let upper = format!("{prefix}\u{10FFFF}");
        let idle: Vec<(String, String)> = {
            let mut stmt = self.conn.prepare_cached(
                "SELECT key, body FROM kv WHERE coll = ?1 AND ts < ?2 AND key >= ?3 AND key < ?4
                 ORDER BY ts LIMIT ?5",
            )?;
            let rows = stmt.query_map(params![coll, before, prefix, upper, limit as i64], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
            })?;
            rows.collect::<rusqlite::Result<_>>()?
        };
        for (key, body) in idle.iter() {
            self.conn
                .prepare_cached("DELETE FROM kv WHERE coll = ?1 AND key = ?2")?
                .execute([coll, key.as_str()])?;
            self.kv.remove(coll, key);
            let before_image: Document = serde_json::from_str(body)?;
            commit.changes.push(self.log_texts(
                coll,
                ChangeOp::Delete,
                key,
                (Some(before_image), Some(body)),
                (None, None),
                now,
            )?);
        }
        Ok(idle.len() as u64)
    }

    fn log(
        &self,
        coll: &str,
        op: ChangeOp,
        key: &str,
        before: Option<(Document, String)>,
        after: Option<Document>,
        now: i64,
    ) -> Result<Change> {
        let after_body = after.as_ref().map(serde_json::to_string).transpose()?;
        let (before_doc, before_body) = before.unzip();
        self.log_texts(
            coll,
            op,
            key,
            (before_doc, before_body.as_deref()),
            (after, after_body.as_deref()),
            now,
        )
    }

    /// Appends a change to the op log, with its images already encoded.
    fn log_texts(
        &self,
        coll: &str,
        op: ChangeOp,
        key: &str,
        (before, before_body): (Option<Document>, Option<&str>),
        (after, after_body): (Option<Document>, Option<&str>),
        now: i64,
    ) -> Result<Change> {
        self.conn
            .prepare_cached(
                "INSERT INTO oplog(coll, op, key, before, after, ts) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?
            .execute(params![coll, op.as_str(), key, before_body, after_body, now])?;
        let seq = self.conn.last_insert_rowid();
        Ok(Change {
            op,
            collection: coll.to_string(),
            key: key.to_string(),
            before,
            after,
            token: ResumeToken(seq.to_string()),
            committed_at_us: now,
        })
    }
}

/// For each update, whether a later one of `updates` is of the same key.
fn rewritten_later(updates: &[KeyUpdate]) -> Vec<bool> {
    if updates.len() < 2 {
        return vec![false; updates.len()];
    }
    let mut seen = std::collections::HashSet::with_capacity(updates.len());
    let mut again: Vec<bool> = updates
        .iter()
        .rev()
        .map(|u| !seen.insert(u.key.as_str()))
        .collect();
    again.reverse();
    again
}

/// Deletes the oldest documents until the collection is within both limits (never the newest).
fn evict(conn: &Connection, meta: &mut CappedMeta) -> Result<()> {
    if meta.count <= meta.max_docs && meta.bytes <= meta.max_bytes {
        return Ok(());
    }
    let excess_docs = meta.count.saturating_sub(meta.max_docs);
    let (mut n, mut freed, mut cut) = (0u64, 0u64, None::<i64>);
    {
        let mut oldest =
            conn.prepare_cached(&format!("SELECT pos, sz FROM {} ORDER BY pos", meta.table))?;
        let mut rows = oldest.query([])?;
        while let Some(row) = rows.next()? {
            if (n >= excess_docs && meta.bytes - freed <= meta.max_bytes) || n + 1 >= meta.count {
                break;
            }
            let (pos, sz): (i64, i64) = (row.get(0)?, row.get(1)?);
            n += 1;
            freed += sz as u64;
            cut = Some(pos);
        }
    }
    if let Some(cut) = cut {
        conn.prepare_cached(&format!("DELETE FROM {} WHERE pos <= ?1", meta.table))?
            .execute([cut])?;
        meta.count -= n;
        meta.bytes -= freed;
    }
    Ok(())
}
