//! The embedded engine: a segmented journal with an LSM tree for keyed state. No server.
//!
//! One process owns a data directory (`store.path`; an advisory lock on its `LOCK` file keeps a
//! second one out). It holds:
//!
//! ```text
//! journal/<n>.log  journal segments: every commit's record, in order
//! journal/<n>.idx  a finished segment's index file: its field-value index, positions, sizes,
//!                  seek points
//! journal/<n>.val  a finished segment's values file: each indexed field's distinct values
//!                  and their counts, for a `$group` by the field (`values`; a cache)
//! keyed/           the LSM tree: keyed documents, their write-time index, the feeds'
//!                  checkpoints, capped documents moved out of released segments
//! catalog.json     collections (kind, limits, indexes, validation rule) and what released
//!                  segments no longer say
//! ```
//!
//! - **Writes** go through one writer (`writer`) that stages whatever is queued and writes it
//!   as one record at the journal's tail (group commit): a commit is one sequential write and,
//!   for `journaled`, one `fdatasync`, whatever the number of indexes and counters. Callers
//!   hand over documents already encoded and their indexed values already hashed, on their own
//!   threads, so the writer thread, which every commit waits for, does the least. Hot keys'
//!   documents stay decoded in a cache bounded by bytes (512 KiB, CLOCK-Pro: a long tail of keys
//!   written once does not push out a source's summary). An update of a key the tree does not
//!   hold skips the tree's read: a Bloom filter of every stored key (`known`) says so. In debug
//!   builds the writer checks every read the cache or the filter saves against the tree, so the
//!   whole test suite checks both.
//! - **The journal** (`journal`; the record's layout in `format`): segments of 8 MiB
//!   ([`Tuning::segment_bytes`]) whose space is allocated 1 MiB ahead of the tail, so a full
//!   disk shows as a transient error before any record is written (`/readyz` says so, and
//!   writes resume once there is room). Written with `O_DIRECT` where the filesystem allows, in
//!   whole blocks of at least 4 KiB, so the device never does a read-modify-write of a sector
//!   holding synced records. A record's entries are cut into blocks of ~32 KiB, each
//!   LZ4-compressed where that pays; its header carries a CRC-32, its record number and its
//!   predecessor's checksum, and it is padded to 512 bytes. A segment is synced before the next
//!   one starts, so one sync covers every earlier write.
//! - **Capped collections live in the journal**: a document is written once, in the record of
//!   its commit, and read back from there (`read`). The writer keeps each collection's oldest
//!   and next positions, each retained document's size (eviction by count and bytes is exact and
//!   reads nothing) and a seek point every 64 KiB of journal, so a point read scans at most that
//!   far. Eviction only moves the oldest position, which every record carries. Per segment, an
//!   index maps a hash of (collection, field, value) to positions (`state`), so
//!   `latest(field = value)` reads the newest segments first and stops at its limit. An index
//!   added to an existing collection is built over the documents already stored.
//! - **Keyed collections and checkpoints** live in an LSM tree (`tree`: the `lsm-tree` crate
//!   without a journal of its own; the journal is its log, and recovery replays the records
//!   after the last one its tables hold). Its memtable (2 MiB, [`Tuning::memtable_bytes`]) is
//!   flushed, and the tree compacted, by the maintenance thread (`maint`), off the commit's
//!   path: a key written a thousand times meanwhile is written once. A write-time index lets
//!   `expire` find idle keys oldest first. Snapshots read the tree at one sequence number, with
//!   the change token of that moment.
//! - **The change log** is the journal's change entries; a change's sequence number is its
//!   resume token. It keeps `store.oplog_max_entries` changes: an older token gets
//!   `HistoryLost`.
//! - **Release** (`maint`): the oldest segment is deleted once nothing needs it; the few
//!   retained documents of a slowly evicted collection are moved into the tree first. The
//!   catalog (`catalog`) is rewritten atomically before a segment's files go.
//! - **Validation rules** ([`EmbeddedStore::set_validator`], MongoDB's query validators): a
//!   document that does not match its collection's rule is refused with an error naming it.
//! - **Durability**: `journaled`/`majority` sync the record before they answer;
//!   `acknowledged` answers once it is written (it survives a process crash, not a power
//!   loss nor a failed sync); `unacknowledged` returns once the write is queued.
//! - **What readers see**: a commit only once its record is synced. A commit that did not ask
//!   for a sync waits for the writer's next one (2 ms at most); a read waits for the writes
//!   made before it, asking for that sync at once, so a caller reads its own.
//!   So a power cut never takes back a position or a change number a reader was shown.
//! - **A failed sync** stops all writing (the disk may have dropped those writes, and Linux
//!   reports it once); the next open cuts the journal where the last good sync ended.
//! - **Tailing** never polls: each commit is broadcast in memory to live tails and change
//!   streams, its documents shared, not copied ([`Capped::append_shared`]). A reader
//!   subscribes before it reads the journal, catches up from it, then follows the broadcast. A
//!   commit stays in the broadcast until every live reader took it: a reader 1,024 commits
//!   behind reads the journal instead, and past [`Tuning::live_bytes`] (8 MiB) of held
//!   documents, commits go out without their documents and changes, which such a reader reads
//!   from the journal. Catching up reads steps of at most 512 entries or ~1 MiB; a tail decodes
//!   its next two steps on storage threads while its consumer takes the current one.
//! - **The earlier layout** (SQLite, `tailrace.db`) is converted at its first open (`migrate`),
//!   the old files kept in `sqlite-backup/`.
//! - **Files** go through one narrow interface ([`fs::Fs`]): the real file system, or a
//!   simulated disk that the crash tests cut the power of before every call
//!   (`store/tests/crash_points.rs`).
//!
//! ## Why this layout
//!
//! A commit must be one sequential append to one journal and one `fdatasync` per group, whatever
//! the number of indexes and counters. fjall, the maintained LSM store, writes every commit
//! through a buffered journal of its own (each sync writes back at least a 4 KiB page) and every
//! byte again when its memtable is flushed. With `O_DIRECT` a commit writes exactly its padded
//! record, and the journal *is* where events live: they are never written again. Keyed state,
//! unbounded in key count on a long tail, goes to an LSM tree whose flushes write a hot key once
//! per flush, not once per event, while the journal makes it durable in between. A B-tree store
//! such as SQLite dirties a page per long-tail index and counter key. The measurements behind
//! the choice are in `docs/results/journal-engine-2026-12-02.md`, today's figures in
//! `docs/BENCHMARKS.md`.

mod capped;
mod catalog;
mod format;
pub mod fs;
mod journal;
mod keyed;
mod known;
mod maint;
mod migrate;
mod read;
mod recover;
pub mod schema;
mod settings;
mod state;
mod timeline;
mod tree;
mod values;
mod writer;

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use async_trait::async_trait;
use serde_json::Value;
use tokio::sync::{broadcast, mpsc, oneshot};

pub use journal::{IoCounts, TailState};
pub use settings::EmbeddedSettings;

use crate::{
    Capped, CappedSpec, ChangeFilter, ChangeStart, ChangeStream, Durability, Filter, Keyed, Result,
    ResumeToken, Store, StoreError,
};
use capped::EmbeddedCapped;
use keyed::EmbeddedKeyed;
use writer::{Commit, Job, Op, Reply, WriterCell};

/// How many commits a live reader may fall behind before it switches to reading the journal.
/// A commit is released once every live reader has it, so this bounds only a lagging reader;
/// [`Tuning::live_bytes`] bounds what such a reader holds in bytes.
const HUB_CAPACITY: usize = 1024;

/// Settings of the embedded engine.
#[derive(Clone, Debug)]
pub struct EmbeddedOptions {
    /// The change log keeps at least this many changes; older resume tokens get
    /// `HistoryLost`.
    pub oplog_max_entries: u64,
    /// Writes waiting for the writer thread; when full, writers wait (backpressure).
    pub queue_capacity: usize,
}

impl Default for EmbeddedOptions {
    fn default() -> Self {
        EmbeddedOptions {
            oplog_max_entries: 1_000_000,
            queue_capacity: 4096,
        }
    }
}

/// Sizes of the engine's files and buffers. The defaults suit tailrace; tests use small
/// segments to see them finished and released.
#[derive(Clone, Debug)]
pub struct Tuning {
    /// Bytes allocated per journal segment (a record larger than this gets a segment of its
    /// own size).
    pub segment_bytes: u64,
    /// The tree's memtable is sealed and flushed once it holds this many bytes.
    pub memtable_bytes: u64,
    /// The filter of stored keyed documents (reads of keys it does not hold are skipped) is
    /// sized for half as many keys again as the tree holds, and at least this many; 0: no
    /// filter.
    pub known_keys_min: usize,
    /// Stored bytes of the commits the live broadcast may hold for readers that have not
    /// taken them yet (a reader that stopped reading holds every commit since). Past it,
    /// commits go out without their documents and changes, and readers behind read them
    /// from the journal.
    pub live_bytes: u64,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            segment_bytes: 8 << 20,
            // Memory before bytes: the memtable filling (and a sealed one until its flush)
            // is held in memory, so a smaller one lowers the resident set at a low rate, for
            // some more bytes written (a key updated often is flushed more often). The rate
            // flat out did not move (docs/results/memtable-2026-12-05.md).
            memtable_bytes: 2 << 20,
            // ~80 KB of filter at 1 % false positives.
            known_keys_min: 1 << 16,
            // Parsed, documents take up to a few times their stored bytes. At 70 events/s
            // 1,024 commits are ~1 MB, well inside it.
            live_bytes: 8 << 20,
        }
    }
}

/// Where the engine's files live and who runs its maintenance. The defaults are the real file
/// system and a maintenance thread; the crash tests use a simulated disk ([`fs::sim`]) and run
/// maintenance themselves ([`EmbeddedStore::maintain`]), so that every run of a workload
/// makes the same file operations in the same order.
#[derive(Clone, Debug)]
pub struct Io {
    pub fs: Arc<dyn fs::Fs>,
    /// Maintenance (memtable flushes, index files, releases) runs only when
    /// [`EmbeddedStore::maintain`] is called, on the caller's thread.
    pub manual_maintenance: bool,
}

impl Default for Io {
    fn default() -> Self {
        Io {
            fs: fs::RealFs::shared(),
            manual_maintenance: false,
        }
    }
}

/// The embedded store. Cheap to clone; all clones share one writer.
#[derive(Clone)]
pub struct EmbeddedStore {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    fs: Arc<dyn fs::Fs>,
    /// The last journal record written, and the last one readers see (synced): a read waits
    /// for the second to reach the first as it was when the read began, so a caller reads
    /// its own writes ([`Inner::caught_up`]).
    written: Arc<AtomicU64>,
    published: Arc<tokio::sync::watch::Sender<u64>>,
    /// The last change number written, shown or not: a change stream started `Now` starts
    /// after it.
    written_op: Arc<AtomicU64>,
    dir: PathBuf,
    /// `None` once closed: sends then fail with `Closed`.
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    /// The writer, committed to by the writer thread and by callers that find it idle.
    cell: Arc<WriterCell>,
    /// `None` once closed: live readers then end with `Closed`.
    hub: Mutex<Option<broadcast::Sender<Arc<Commit>>>>,
    /// Stored bytes of the commits the broadcast holds (see [`writer::Hub`]).
    hub_held: Arc<AtomicU64>,
    newest_op: Arc<AtomicU64>,
    shared: Arc<RwLock<state::Shared>>,
    tree: Arc<tree::Tree>,
    snapshots: Arc<maint::Snapshots>,
    oplog_max: u64,
    stats: Arc<journal::IoStats>,
    capped: Mutex<HashMap<String, Arc<CappedShared>>>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    maint: Mutex<Option<std::sync::mpsc::Sender<maint::Task>>>,
    /// With manual maintenance: the maintenance work and its queue, run by
    /// [`EmbeddedStore::maintain`].
    manual: Mutex<Option<(maint::Maint, std::sync::mpsc::Receiver<maint::Task>)>>,
    /// Held while the store is open (and its threads run): one process per data directory.
    /// Let go of at `close`.
    lock: Mutex<Option<Arc<File>>>,
    /// Where received times lie in capped collections, built as queries ask.
    timelines: timeline::Timelines,
}

struct CappedShared {
    spec: CappedSpec,
    newest: Arc<AtomicU64>,
    /// The collection's indexes as the writer had them when this handle opened it: appends
    /// hash their documents' values of these on the caller's thread.
    indexes: Arc<[String]>,
}

pub(crate) fn lock_err<T>(_: T) -> StoreError {
    StoreError::Engine {
        engine: "embedded",
        message: "internal lock poisoned".into(),
    }
}

impl EmbeddedStore {
    /// Opens (creating when absent) the store in directory `dir`.
    pub fn open(dir: impl AsRef<Path>, options: EmbeddedOptions) -> Result<Self> {
        Self::open_tuned(dir, options, Tuning::default())
    }

    /// [`EmbeddedStore::open`] on a thread of its own: the recovery of a large data directory
    /// (and the conversion of an earlier layout) reads and writes for as long as it takes,
    /// and must not hold an async runtime's thread meanwhile. Not the runtime's blocking pool:
    /// the store's threads are started there and inherit its priority, and a runtime may run
    /// its pool below it (`tailrace` does); a thread started by the caller has the caller's.
    pub async fn open_async(dir: impl AsRef<Path>, options: EmbeddedOptions) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        let (tx, rx) = oneshot::channel();
        std::thread::Builder::new()
            .name("tailrace-open".into())
            .spawn(move || {
                let _ = tx.send(Self::open(dir, options));
            })
            .map_err(|source| StoreError::Io {
                context: "starting the thread that opens the store".into(),
                source,
            })?;
        rx.await.map_err(|_| StoreError::Engine {
            engine: "embedded",
            message: "the thread opening the store ended without an answer".into(),
        })?
    }

    /// [`EmbeddedStore::open`] with other file and buffer sizes.
    pub fn open_tuned(
        dir: impl AsRef<Path>,
        options: EmbeddedOptions,
        tuning: Tuning,
    ) -> Result<Self> {
        Self::open_with(dir, options, tuning, Io::default())
    }

    /// [`EmbeddedStore::open_tuned`] on another file system, or with manual maintenance (see
    /// [`Io`]). The data directory's lock and the keyed state's tree are real files in `dir`
    /// whatever `io.fs` is.
    pub fn open_with(
        dir: impl AsRef<Path>,
        options: EmbeddedOptions,
        tuning: Tuning,
        io: Io,
    ) -> Result<Self> {
        let dir = dir.as_ref();
        let fs = io.fs.clone();
        if !fs.exists(dir) {
            fs.create_dir_all(dir).map_err(|source| StoreError::Io {
                context: format!("creating data directory {}", dir.display()),
                source,
            })?;
        }
        // The lock and the tree are real files, whatever the journal's file system.
        std::fs::create_dir_all(dir).map_err(|source| StoreError::Io {
            context: format!("creating data directory {}", dir.display()),
            source,
        })?;
        let lock_path = dir.join("LOCK");
        let lock = File::create(&lock_path).map_err(|source| StoreError::Io {
            context: format!("creating {}", lock_path.display()),
            source,
        })?;
        if lock.try_lock().is_err() {
            return Err(StoreError::Locked(format!(
                "data directory {} is in use by another tailrace process; stop it or set store.path to another directory",
                dir.display()
            )));
        }
        let lock = Arc::new(lock);
        if migrate::needed(&*fs, dir) {
            migrate::from_sqlite(&fs, dir, &options, &tuning)?;
        } else {
            migrate::tidy(&*fs, dir);
        }
        let stats = Arc::new(journal::IoStats::default());
        let recovered = recover::open(fs.clone(), dir, tuning.segment_bytes, stats.clone())?;
        let tree = recovered.tree.clone();
        let shared = recovered.shared.clone();
        let catalog = recovered.catalog.clone();
        let newest_op = Arc::new(AtomicU64::new(recovered.change_next.saturating_sub(1)));
        {
            let mut s = shared.write().map_err(lock_err)?;
            s.point = (tree.visible(), recovered.change_next.saturating_sub(1));
        }
        let hub = writer::Hub::new(HUB_CAPACITY, tuning.live_bytes);
        let (tx, rx) = mpsc::channel(options.queue_capacity.max(1));
        let (maint_tx, maint_rx) = std::sync::mpsc::channel();
        let rotate_asked = Arc::new(AtomicBool::new(false));
        let snapshots = Arc::new(maint::Snapshots::default());
        let links = writer::Links {
            hub: hub.clone(),
            newest_op: newest_op.clone(),
            maint: maint_tx.clone(),
            rotate_asked: rotate_asked.clone(),
        };
        let writer = writer::Writer::new(
            recovered,
            links,
            tuning.memtable_bytes,
            tuning.known_keys_min,
        )?;
        let (written, published, written_op) = writer.visibility();
        let cell = Arc::new(WriterCell::new(writer));
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name.into())
                .spawn(f)
                .map_err(|source| StoreError::Io {
                    context: format!("starting the {name} thread"),
                    source,
                })
        };
        let writer_thread = spawn("tailrace-writer", {
            let cell = cell.clone();
            let lock = lock.clone();
            // With manual maintenance nobody flushes meanwhile: no waiting for it.
            let stall = (!io.manual_maintenance).then(|| tree.clone());
            Box::new(move || {
                writer::run(cell, rx, stall);
                drop(lock);
            })
        })?;
        let m = maint::Maint {
            fs: fs.clone(),
            dir: dir.to_path_buf(),
            tree: tree.clone(),
            shared: shared.clone(),
            catalog,
            snapshots: snapshots.clone(),
            rotate_asked,
            oplog_max: options.oplog_max_entries,
            submit: submitter(tx.downgrade(), Arc::downgrade(&cell)),
            spilled: None,
            values: maint::ValuesDue::default(),
        };
        let mut threads = vec![writer_thread];
        let mut manual = None;
        if io.manual_maintenance {
            manual = Some((m, maint_rx));
        } else {
            threads.push(spawn("tailrace-maint", {
                let lock = lock.clone();
                Box::new(move || {
                    maint::run(m, maint_rx);
                    drop(lock);
                })
            })?);
        }
        Ok(EmbeddedStore {
            inner: Arc::new(Inner {
                fs,
                written,
                published,
                written_op,
                dir: dir.to_path_buf(),
                jobs: Mutex::new(Some(tx)),
                cell,
                hub: Mutex::new(Some(hub.tx)),
                hub_held: hub.held,
                newest_op,
                shared,
                tree,
                snapshots,
                oplog_max: options.oplog_max_entries,
                stats,
                capped: Mutex::new(HashMap::new()),
                threads: Mutex::new(threads),
                maint: Mutex::new(Some(maint_tx)),
                manual: Mutex::new(manual),
                lock: Mutex::new(Some(lock)),
                timelines: timeline::Timelines::default(),
            }),
        })
    }

    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Stored bytes of the commits the live broadcast holds for readers that have not taken
    /// them yet (at most about [`Tuning::live_bytes`] and one commit).
    pub fn live_bytes_held(&self) -> u64 {
        self.inner.hub_held.load(Ordering::Acquire)
    }

    /// What the journal has written so far (records, bytes, syncs).
    pub fn io_counts(&self) -> IoCounts {
        self.inner.stats.counts()
    }

    /// Sets (or with `None` removes) a collection's validation rule: from then on a document
    /// that does not match `rule` (a capped collection's document, a keyed collection's
    /// document after an update) is refused, its write failing with an error that names the
    /// rule — MongoDB's query validators (`validationAction: "error"`). Kept in the catalog.
    pub async fn set_validator(&self, collection: &str, rule: Option<Filter>) -> Result<()> {
        self.inner
            .submit(
                Op::Validate {
                    coll: collection.to_owned(),
                    rule,
                },
                Durability::Journaled,
            )
            .await
            .map(|_| ())
    }

    /// Seals the tree's memtable and waits until the maintenance thread had a chance to flush
    /// it (for tests of recovery and release).
    #[doc(hidden)]
    pub async fn flush_keyed_state(&self) -> Result<()> {
        self.inner.cell.with(|w| w.request_rotation())?;
        self.inner
            .submit(Op::Barrier, Durability::Journaled)
            .await?;
        if let Ok(m) = self.inner.maint.lock()
            && let Some(m) = m.as_ref()
        {
            let _ = m.send(maint::Task::Check);
        }
        Ok(())
    }

    /// With manual maintenance ([`Io::manual_maintenance`]): does the maintenance work that is
    /// due (flushes, index files, releases, values files due) on this thread, until none is
    /// left. Blocks on the writer: never call it from an async task.
    #[doc(hidden)]
    pub fn maintain(&self) -> Result<()> {
        let mut manual = self.inner.manual.lock().map_err(lock_err)?;
        let Some((m, rx)) = manual.as_mut() else {
            return Ok(());
        };
        // Each round may queue more (a release asks for a flush); a bound, in case it loops.
        for _ in 0..64 {
            let mut did = false;
            while let Ok(task) = rx.try_recv() {
                did = true;
                m.run_task(task)?;
            }
            m.release()?;
            if !did && rx.try_recv().map(|t| m.run_task(t)).is_err() {
                break;
            }
        }
        // What the thread does when idle: a look for values files due, and each one.
        m.run_task(maint::Task::Check)?;
        while m.values_due() {
            m.run_task(maint::Task::WriteValues)?;
        }
        Ok(())
    }

    /// Journal segments currently retained.
    pub fn segments(&self) -> usize {
        self.inner
            .shared
            .read()
            .map(|s| s.segments.len())
            .unwrap_or(0)
    }
}

/// The maintenance thread's way to hand the writer an operation and wait for it.
fn submitter(
    jobs: mpsc::WeakSender<Job>,
    cell: std::sync::Weak<WriterCell>,
) -> Box<dyn Fn(Op, Durability) -> bool + Send> {
    // Weak: the maintenance thread must not keep the writer (and with it the maintenance
    // thread's own queue) alive once the store is gone.
    Box::new(move |op, durability| {
        let (Some(sender), Some(cell)) = (jobs.upgrade(), cell.upgrade()) else {
            return false;
        };
        let (tx, rx) = oneshot::channel();
        let job = Job {
            op,
            durability,
            reply: Some(tx),
        };
        if sender.blocking_send(job).is_err() {
            return false;
        }
        drop((sender, cell));
        matches!(rx.blocking_recv(), Ok(Ok(_)))
    })
}

/// What a data directory's journal holds, read without opening the store (and without
/// changing anything): for the torture test, which looks at it right after a kill.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JournalReport {
    /// Segments and whole records with good checksums.
    pub segments: usize,
    pub records: u64,
    /// The last record's number.
    pub last_lsn: u64,
    /// Where the last segment's records end, and whether something other than zeros lies
    /// there (a write the kill interrupted).
    pub tail: TailState,
    /// Bytes of the journal's files.
    pub bytes: u64,
}

/// Reads the journal of the data directory `dir` (see [`JournalReport`]). A finished segment
/// that does not hold only whole records, or records out of sequence, is an error.
pub fn inspect(dir: impl AsRef<Path>) -> Result<JournalReport> {
    inspect_on(&fs::RealFs, dir.as_ref())
}

/// [`inspect`] on another file system.
pub fn inspect_on(fs: &dyn fs::Fs, dir: &Path) -> Result<JournalReport> {
    let jdir = dir.join(journal::DIR);
    let first = catalog::Catalog::load(fs, dir)?.map_or(1, |c| c.first_segment);
    let segs: Vec<u64> = journal::list_segments(fs, &jdir)?
        .into_iter()
        .filter(|s| *s >= first)
        .collect();
    let mut report = JournalReport {
        segments: segs.len(),
        ..JournalReport::default()
    };
    let mut next: Option<u64> = None;
    for (i, seq) in segs.iter().enumerate() {
        let seg = journal::Segment::open(fs, &jdir, *seq)?;
        report.bytes += seg.len().unwrap_or(0);
        let mut records = 0;
        let tail = recover::scan_records(&seg, next, |_, h, _| {
            records += 1;
            next = Some(h.lsn + 1);
            report.last_lsn = h.lsn;
            Ok(())
        })?;
        report.records += records;
        if i + 1 < segs.len() && tail.torn {
            return Err(StoreError::Engine {
                engine: "embedded",
                message: format!(
                    "journal segment {seq:x} is damaged at offset {}: a finished segment holds only whole records",
                    tail.end
                ),
            });
        }
        report.tail = tail;
    }
    Ok(report)
}

impl Inner {
    /// Queues a job for the writer thread. Waits for the answer unless the durability is
    /// `unacknowledged` (it returns before the commit).
    async fn submit(&self, op: Op, durability: Durability) -> Result<Reply> {
        let sender = self
            .jobs
            .lock()
            .map_err(lock_err)?
            .clone()
            .ok_or(StoreError::Closed)?;
        let (tx, rx) = if durability.waits() {
            let (tx, rx) = oneshot::channel();
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        let job = Job {
            op,
            durability,
            reply: tx,
        };
        if sender.send(job).await.is_err() {
            return Err(StoreError::Closed);
        }
        match rx {
            Some(rx) => rx.await.map_err(|_| StoreError::Closed)?,
            None => Ok(Reply::Done),
        }
    }

    fn subscribe(&self) -> Result<broadcast::Receiver<Arc<Commit>>> {
        Ok(self
            .hub
            .lock()
            .map_err(lock_err)?
            .as_ref()
            .ok_or(StoreError::Closed)?
            .subscribe())
    }

    /// Runs a read off the async threads, once every write before it is shown to readers.
    async fn read<T, F>(self: &Arc<Self>, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Inner) -> Result<T> + Send + 'static,
    {
        self.caught_up().await?;
        self.read_started(f).await
    }

    /// Waits until readers see every record written before this call: commits that did not
    /// wait for a sync are shown only once synced, and a caller reads its own writes. Such a
    /// wait is one sync: it asks the writer for it.
    async fn caught_up(&self) -> Result<()> {
        let target = self.written.load(Ordering::Acquire);
        if *self.published.borrow() >= target {
            return Ok(());
        }
        // A sync now, rather than the writer's next one: a barrier that asks for a sync
        // shows everything written before it.
        let mut rx = self.published.subscribe();
        let sender = self.jobs.lock().ok().and_then(|j| j.clone());
        if let Some(sender) = sender {
            let _ = sender
                .send(Job {
                    op: Op::Barrier,
                    durability: Durability::Journaled,
                    reply: None,
                })
                .await;
        }
        // The writer is gone (closed, or poisoned and never syncing again): read what is shown.
        let _ = rx.wait_for(|p| *p >= target).await;
        Ok(())
    }

    /// [`Inner::read`] started at once, not when first polled: a reader that is handing
    /// over one batch reads the next meanwhile, on another thread.
    fn read_started<T, F>(self: &Arc<Self>, f: F) -> impl Future<Output = Result<T>> + use<T, F>
    where
        T: Send + 'static,
        F: FnOnce(&Inner) -> Result<T> + Send + 'static,
    {
        let inner = self.clone();
        let task = tokio::task::spawn_blocking(move || f(&inner));
        async move {
            task.await.map_err(|e| StoreError::Engine {
                engine: "embedded",
                message: format!("reader task: {e}"),
            })?
        }
    }

    /// A consistent read point: the tree's sequence number, the last change then, and a hold
    /// that keeps the tree's versions as of it.
    fn snapshot_point(&self) -> Result<(u64, u64, maint::Hold)> {
        let shared = self.shared.read().map_err(lock_err)?;
        let (seqno, token) = shared.point;
        Ok((seqno, token, self.snapshots.hold(seqno)))
    }
}

#[async_trait]
impl Store for EmbeddedStore {
    fn engine(&self) -> &'static str {
        "embedded"
    }

    async fn capped(&self, name: &str, spec: &CappedSpec) -> Result<Arc<dyn Capped>> {
        crate::names::check_name(name)?;
        if spec.max_docs == 0 || spec.max_bytes == 0 {
            return Err(StoreError::Invalid(format!(
                "capped collection {name}: max_docs and max_bytes must be at least 1"
            )));
        }
        let reply = self
            .inner
            .submit(
                Op::CreateCapped {
                    name: name.to_string(),
                    spec: spec.clone(),
                },
                Durability::Journaled,
            )
            .await?;
        let Reply::Newest(newest, indexes) = reply else {
            return Err(StoreError::Engine {
                engine: "embedded",
                message: "the writer did not answer the collection's creation".into(),
            });
        };
        let shared = Arc::new(CappedShared {
            spec: spec.clone(),
            newest,
            indexes,
        });
        self.inner
            .capped
            .lock()
            .map_err(lock_err)?
            .insert(name.to_string(), shared.clone());
        Ok(Arc::new(EmbeddedCapped {
            name: name.to_string(),
            inner: self.inner.clone(),
            shared,
        }))
    }

    async fn keyed(&self, name: &str) -> Result<Arc<dyn Keyed>> {
        crate::names::check_name(name)?;
        self.inner
            .submit(
                Op::CreateKeyed {
                    name: name.to_string(),
                },
                Durability::Journaled,
            )
            .await?;
        Ok(Arc::new(EmbeddedKeyed {
            name: name.to_string(),
            inner: self.inner.clone(),
        }))
    }

    fn changes(&self, filter: ChangeFilter, start: ChangeStart) -> ChangeStream {
        read::change_stream(self.inner.clone(), filter, start)
    }

    async fn newest_change(&self) -> Result<Option<ResumeToken>> {
        self.inner.caught_up().await?;
        let n = self.inner.newest_op.load(Ordering::Acquire);
        Ok((n > 0).then(|| ResumeToken(n.to_string())))
    }

    async fn changes_after(&self, token: &ResumeToken) -> Result<Option<u64>> {
        let after = read::parse_token(token)?;
        // Every change written before this call counts (a feed draining at a stop asks how
        // far behind it is, and must not stop short of the last commits not yet synced).
        self.inner.caught_up().await?;
        let newest = self.inner.newest_op.load(Ordering::Acquire);
        Ok(Some(newest.saturating_sub(after)))
    }

    async fn oldest_change_at(&self) -> Result<Option<i64>> {
        self.inner
            .read(|i| {
                let (changes, _) =
                    read::changes_after(i, None, &ChangeFilter::default(), 1, u64::MAX)?;
                Ok(changes.first().map(|c| c.committed_at_us))
            })
            .await
    }

    async fn load_checkpoint(&self, feed: &str) -> Result<Option<Value>> {
        let key = tree::checkpoint_key(feed);
        let body = self.inner.read(move |i| i.tree.get(&key)).await?;
        Ok(body.map(|b| serde_json::from_slice(&b)).transpose()?)
    }

    async fn save_checkpoint(
        &self,
        feed: &str,
        checkpoint: Value,
        durability: Durability,
    ) -> Result<()> {
        let body = serde_json::to_string(&checkpoint)?;
        self.inner
            .submit(
                Op::Checkpoint {
                    feed: feed.to_string(),
                    body,
                },
                durability,
            )
            .await?;
        Ok(())
    }

    async fn close(&self) -> Result<()> {
        // Flush: the barrier is answered once everything queued before it is committed. A
        // writer that cannot (a sync failed) still stops, and lets go of the directory.
        let flushed = match self.inner.submit(Op::Barrier, Durability::Journaled).await {
            Ok(_) | Err(StoreError::Closed) => Ok(()),
            Err(e) => Err(e),
        };
        self.inner.jobs.lock().map_err(lock_err)?.take();
        self.inner.hub.lock().map_err(lock_err)?.take();
        let threads = std::mem::take(&mut *self.inner.threads.lock().map_err(lock_err)?);
        let mut threads = threads.into_iter();
        // The writer thread first; then, the writer (which holds the maintenance thread's
        // queue) closed, the maintenance thread.
        if let Some(w) = threads.next() {
            join(w).await?;
        }
        self.inner.cell.close()?;
        self.inner.maint.lock().map_err(lock_err)?.take();
        self.inner.manual.lock().map_err(lock_err)?.take();
        for t in threads {
            join(t).await?;
        }
        // Both threads are done: the directory is free for the next open.
        self.inner.lock.lock().map_err(lock_err)?.take();
        flushed
    }
}

async fn join(handle: std::thread::JoinHandle<()>) -> Result<()> {
    tokio::task::spawn_blocking(move || handle.join())
        .await
        .map_err(|e| StoreError::Engine {
            engine: "embedded",
            message: e.to_string(),
        })?
        .map_err(|_| StoreError::Engine {
            engine: "embedded",
            message: "a storage thread panicked".into(),
        })
}
