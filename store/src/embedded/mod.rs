//! The embedded engine: SQLite (bundled, WAL) behind the store contract. No server needed.
//!
//! - **Writes** go through one writer ([`writer`]) that commits whatever is queued in one
//!   transaction (group commit): `journaled` throughput is not one fsync per event. A caller
//!   that finds the writer idle and nothing queued commits its write in its own thread.
//! - **Durability**: `synchronous=FULL` (fsync per commit) for `journaled`/`majority`,
//!   `NORMAL` (survives a process crash, not a power loss) for `acknowledged`;
//!   `unacknowledged` returns once the write is queued.
//! - **Tailing** never polls: each commit is broadcast in memory to live tails and change
//!   streams; a reader that fell behind (or starts in the past) reads the tables until it has
//!   caught up, then listens again.

pub mod next;
pub mod probe;
mod read;
pub mod schema;
#[cfg(test)]
mod tests;
mod writer;

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension};
use serde_json::Value;
use tokio::sync::{broadcast, mpsc, oneshot};

use crate::{
    Bounds, Capped, CappedSpec, ChangeFilter, ChangeStart, ChangeStream, Document, Durability,
    Filter, KeyUpdate, Keyed, KeyedDoc, KeyedSnapshot, NewestMatching, Position, Record,
    RecordStream, Result, ResumeToken, Start, Store, StoreError, Usage,
};
use writer::{Commit, Job, Op, Reply, Writer, WriterCell};

/// How many commits a live reader may fall behind before it switches to reading the tables.
/// A commit is released once every live reader has it, so this bounds only a lagging reader.
const HUB_CAPACITY: usize = 1024;
/// How many idle reader connections are kept.
const READER_POOL: usize = 8;

/// Settings of the embedded engine.
#[derive(Clone, Debug)]
pub struct EmbeddedOptions {
    /// The op log keeps at most this many changes; older resume tokens get `HistoryLost`.
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

/// The embedded store. Cheap to clone; all clones share one writer.
#[derive(Clone)]
pub struct EmbeddedStore {
    inner: Arc<Inner>,
}

struct Inner {
    db_path: PathBuf,
    /// `None` once closed: sends then fail with `Closed`.
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    /// The writer, committed to by the writer thread and by callers that find it idle.
    cell: Arc<WriterCell>,
    /// `None` once closed: live readers then end with `Closed`.
    hub: Mutex<Option<broadcast::Sender<Arc<Commit>>>>,
    readers: Mutex<Vec<Connection>>,
    newest_op: Arc<AtomicU64>,
    capped: Mutex<HashMap<String, Arc<CappedShared>>>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Held for the store's lifetime: one process per data directory.
    _lock: File,
}

struct CappedShared {
    spec: CappedSpec,
    newest: Arc<AtomicU64>,
}

fn lock_err<T>(_: T) -> StoreError {
    StoreError::Engine {
        engine: "embedded",
        message: "internal lock poisoned".into(),
    }
}

impl EmbeddedStore {
    /// Opens (creating when absent) the store in directory `dir`.
    pub fn open(dir: impl AsRef<Path>, options: EmbeddedOptions) -> Result<Self> {
        let dir = dir.as_ref();
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
        let db_path = dir.join(schema::DB_FILE);
        let conn = schema::open(&db_path)?;
        conn.execute_batch(schema::CREATE)?;
        schema::migrate(&conn)?;
        let newest_op: i64 = conn
            .query_row(
                "SELECT seq FROM sqlite_sequence WHERE name = 'oplog'",
                [],
                |r| r.get(0),
            )
            .optional()?
            .unwrap_or(0);
        let newest_op = Arc::new(AtomicU64::new(newest_op as u64));
        let (hub, _) = broadcast::channel(HUB_CAPACITY);
        let (tx, rx) = mpsc::channel(options.queue_capacity.max(1));
        let writer = Writer::new(
            conn,
            &db_path,
            options.oplog_max_entries,
            hub.clone(),
            newest_op.clone(),
        )?;
        let cell = Arc::new(WriterCell::new(writer));
        let handle = std::thread::Builder::new()
            .name("tailrace-writer".into())
            .spawn({
                let cell = cell.clone();
                move || writer::run(cell, rx)
            })
            .map_err(|source| StoreError::Io {
                context: "starting the writer thread".into(),
                source,
            })?;
        // Without a runtime (a tool opening the store from plain threads) a large cache
        // waits for the next commit instead.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(writer::cut_idle_cache(
                Arc::downgrade(&cell),
                tx.downgrade(),
            ));
        }
        Ok(EmbeddedStore {
            inner: Arc::new(Inner {
                db_path,
                jobs: Mutex::new(Some(tx)),
                cell,
                hub: Mutex::new(Some(hub)),
                readers: Mutex::new(Vec::new()),
                newest_op,
                capped: Mutex::new(HashMap::new()),
                writer: Mutex::new(Some(handle)),
                _lock: lock,
            }),
        })
    }

    /// The database file, for tools and tests that inspect it.
    pub fn db_path(&self) -> &Path {
        &self.inner.db_path
    }

    /// SQLite's query plan for `latest(field = ..)` on a capped collection: shows whether the
    /// index on the field's column is used.
    pub async fn explain_latest(&self, coll: &str, field: &str) -> Result<String> {
        schema::check_name(coll)?;
        let (coll, field) = (coll.to_string(), field.to_string());
        self.inner
            .read(move |c| read::explain_latest(c, &coll, &field))
            .await
    }
}

impl Inner {
    /// Commits a job in this thread when the writer is idle; queues it for the writer thread
    /// otherwise. Waits for the answer unless the durability is `unacknowledged` (always
    /// queued: it returns before the commit).
    async fn submit(&self, op: Op, durability: Durability) -> Result<Reply> {
        let sender = self
            .jobs
            .lock()
            .map_err(lock_err)?
            .clone()
            .ok_or(StoreError::Closed)?;
        let op = if durability.waits() {
            match self.cell.try_inline(op, durability) {
                Ok(inline) => {
                    if inline.wake_writer {
                        // The WAL is checked after each group.
                        self.cell.wake(&sender);
                    }
                    return inline.result;
                }
                Err(op) => op,
            }
        } else {
            op
        };
        let (tx, rx) = if durability.waits() {
            let (tx, rx) = oneshot::channel();
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        self.cell.queued();
        let job = Job {
            op,
            durability,
            reply: tx,
        };
        if sender.send(job).await.is_err() {
            self.cell.not_queued();
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

    /// Runs a read on a pooled reader connection, off the async threads.
    async fn read<T, F>(self: &Arc<Self>, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
    {
        let inner = self.clone();
        tokio::task::spawn_blocking(move || {
            let pooled = inner.readers.lock().map_err(lock_err)?.pop();
            let conn = match pooled {
                Some(c) => c,
                None => {
                    let c = schema::open(&inner.db_path)?;
                    c.pragma_update(None, "query_only", true)?;
                    c
                }
            };
            let out = f(&conn);
            let mut pool = inner.readers.lock().map_err(lock_err)?;
            if pool.len() < READER_POOL {
                pool.push(conn);
            }
            out
        })
        .await
        .map_err(|e| StoreError::Engine {
            engine: "embedded",
            message: format!("reader task: {e}"),
        })?
    }
}

#[async_trait]
impl Store for EmbeddedStore {
    fn engine(&self) -> &'static str {
        "embedded"
    }

    async fn capped(&self, name: &str, spec: &CappedSpec) -> Result<Arc<dyn Capped>> {
        schema::check_name(name)?;
        if spec.max_docs == 0 || spec.max_bytes == 0 {
            return Err(StoreError::Invalid(format!(
                "capped collection {name}: max_docs and max_bytes must be at least 1"
            )));
        }
        let newest = Arc::new(AtomicU64::new(0));
        self.inner
            .submit(
                Op::CreateCapped {
                    name: name.to_string(),
                    spec: spec.clone(),
                    newest: newest.clone(),
                },
                Durability::Journaled,
            )
            .await?;
        let shared = Arc::new(CappedShared {
            spec: spec.clone(),
            newest,
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
        schema::check_name(name)?;
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
        let n = self.inner.newest_op.load(Ordering::Acquire);
        Ok((n > 0).then(|| ResumeToken(n.to_string())))
    }

    async fn changes_after(&self, token: &ResumeToken) -> Result<Option<u64>> {
        let after = read::parse_token(token)?;
        let newest = self.inner.newest_op.load(Ordering::Acquire);
        Ok(Some(newest.saturating_sub(after)))
    }

    async fn oldest_change_at(&self) -> Result<Option<i64>> {
        self.inner
            .read(|c| {
                Ok(
                    c.query_row("SELECT ts FROM oplog ORDER BY seq LIMIT 1", [], |r| {
                        r.get(0)
                    })
                    .optional()?,
                )
            })
            .await
    }

    async fn load_checkpoint(&self, feed: &str) -> Result<Option<Value>> {
        let feed = feed.to_string();
        let body: Option<String> = self
            .inner
            .read(move |c| {
                Ok(c.query_row(
                    "SELECT body FROM checkpoints WHERE feed = ?1",
                    [feed],
                    |r| r.get(0),
                )
                .optional()?)
            })
            .await?;
        Ok(body.map(|b| serde_json::from_str(&b)).transpose()?)
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
        // Flush: the barrier is answered once everything queued before it is committed.
        match self.inner.submit(Op::Barrier, Durability::Journaled).await {
            Ok(_) | Err(StoreError::Closed) => {}
            Err(e) => return Err(e),
        }
        self.inner.jobs.lock().map_err(lock_err)?.take();
        self.inner.hub.lock().map_err(lock_err)?.take();
        let handle = self.inner.writer.lock().map_err(lock_err)?.take();
        if let Some(handle) = handle {
            tokio::task::spawn_blocking(move || handle.join())
                .await
                .map_err(|e| StoreError::Engine {
                    engine: "embedded",
                    message: e.to_string(),
                })?
                .map_err(|_| StoreError::Engine {
                    engine: "embedded",
                    message: "writer thread panicked".into(),
                })?;
        }
        // No caller commits inline any more (the sender is gone): the connection closes.
        self.inner.cell.close()
    }
}

/// A capped collection of the embedded engine.
struct EmbeddedCapped {
    name: String,
    inner: Arc<Inner>,
    shared: Arc<CappedShared>,
}

impl EmbeddedCapped {
    /// The append of `docs`, their JSON encoded here (on the caller's thread, not the
    /// writer's).
    fn append_op(&self, docs: Vec<Document>) -> Result<Op> {
        Ok(Op::Append {
            coll: self.name.clone(),
            bodies: docs
                .iter()
                .map(serde_json::to_string)
                .collect::<std::result::Result<_, _>>()?,
            docs,
        })
    }

    /// Whether `keyed` is a collection of this very store (one writer, one database file).
    fn same_store(&self, keyed: &dyn Keyed) -> bool {
        keyed
            .as_any()
            .downcast_ref::<EmbeddedKeyed>()
            .is_some_and(|k| Arc::ptr_eq(&k.inner, &self.inner))
    }
}

#[async_trait]
impl Capped for EmbeddedCapped {
    fn name(&self) -> &str {
        &self.name
    }

    async fn append(&self, docs: Vec<Document>, durability: Durability) -> Result<Vec<Position>> {
        if docs.is_empty() {
            return Ok(Vec::new());
        }
        match self.inner.submit(self.append_op(docs)?, durability).await? {
            Reply::Positions(p) => Ok(p),
            _ => Ok(Vec::new()),
        }
    }

    fn commits_with(&self, keyed: &dyn Keyed) -> bool {
        self.same_store(keyed)
    }

    async fn append_with_updates(
        &self,
        docs: Vec<Document>,
        keyed: &dyn Keyed,
        updates: Vec<KeyUpdate>,
        durability: Durability,
    ) -> Result<Vec<Position>> {
        if !self.same_store(keyed) {
            return crate::contract::append_then_update(self, docs, keyed, updates, durability)
                .await;
        }
        let mut ops = Vec::with_capacity(2);
        if !docs.is_empty() {
            ops.push(self.append_op(docs)?);
        }
        if !updates.is_empty() {
            ops.push(Op::Update {
                coll: keyed.name().to_owned(),
                updates,
            });
        }
        match self.inner.submit(Op::Together(ops), durability).await? {
            Reply::Positions(p) => Ok(p),
            _ => Ok(Vec::new()),
        }
    }

    fn tail(&self, start: Start) -> RecordStream {
        read::tail_stream(
            self.inner.clone(),
            self.name.clone(),
            self.shared.newest.clone(),
            start,
        )
    }

    async fn newest_matching(&self, filter: &Filter, limit: usize) -> Result<NewestMatching> {
        let table = schema::capped_table(&self.name);
        let filter = filter.clone();
        self.inner
            .read(move |c| read::newest_matching(c, &table, &filter, limit))
            .await
    }

    async fn get(&self, position: Position) -> Result<Option<Record>> {
        let table = schema::capped_table(&self.name);
        self.inner
            .read(move |c| read::get_record(c, &table, position))
            .await
    }

    async fn latest(&self, field: &str, value: &Value, limit: usize) -> Result<Vec<Record>> {
        if !self.shared.spec.indexes.iter().any(|f| f == field) {
            return Err(StoreError::NotIndexed {
                collection: self.name.clone(),
                field: field.to_string(),
            });
        }
        let table = schema::capped_table(&self.name);
        let (field, value) = (field.to_string(), value.clone());
        self.inner
            .read(move |c| read::latest(c, &table, &field, &value, limit))
            .await
    }

    async fn bounds(&self) -> Result<Option<Bounds>> {
        let table = schema::capped_table(&self.name);
        self.inner.read(move |c| read::bounds(c, &table)).await
    }

    async fn usage(&self) -> Result<Usage> {
        let table = schema::capped_table(&self.name);
        self.inner
            .read(move |c| {
                let (n, b): (i64, i64) = c.query_row(
                    &format!("SELECT COUNT(*), COALESCE(SUM(sz), 0) FROM {table}"),
                    [],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )?;
                Ok(Usage {
                    docs: n as u64,
                    bytes: b as u64,
                })
            })
            .await
    }
}

/// A changefeed-backed collection of the embedded engine.
struct EmbeddedKeyed {
    name: String,
    inner: Arc<Inner>,
}

#[async_trait]
impl Keyed for EmbeddedKeyed {
    fn name(&self) -> &str {
        &self.name
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    async fn update(&self, updates: Vec<KeyUpdate>, durability: Durability) -> Result<()> {
        if updates.is_empty() {
            return Ok(());
        }
        self.inner
            .submit(
                Op::Update {
                    coll: self.name.clone(),
                    updates,
                },
                durability,
            )
            .await?;
        Ok(())
    }

    async fn set(&self, key: &str, doc: Document, durability: Durability) -> Result<()> {
        self.inner
            .submit(
                Op::Set {
                    coll: self.name.clone(),
                    key: key.to_string(),
                    doc,
                },
                durability,
            )
            .await?;
        Ok(())
    }

    async fn delete(&self, key: &str, durability: Durability) -> Result<bool> {
        match self
            .inner
            .submit(
                Op::Delete {
                    coll: self.name.clone(),
                    key: key.to_string(),
                },
                durability,
            )
            .await?
        {
            Reply::Deleted(d) => Ok(d),
            _ => Ok(false),
        }
    }

    async fn expire(
        &self,
        prefix: &str,
        written_before_us: i64,
        limit: usize,
        durability: Durability,
    ) -> Result<u64> {
        match self
            .inner
            .submit(
                Op::Expire {
                    coll: self.name.clone(),
                    prefix: prefix.to_string(),
                    before: written_before_us,
                    limit,
                },
                durability,
            )
            .await?
        {
            Reply::Expired(n) => Ok(n),
            _ => Ok(0),
        }
    }

    async fn get(&self, key: &str) -> Result<Option<Document>> {
        let (coll, key) = (self.name.clone(), key.to_string());
        self.inner
            .read(move |c| {
                let body: Option<String> = c
                    .query_row(
                        "SELECT body FROM kv WHERE coll = ?1 AND key = ?2",
                        [coll, key],
                        |r| r.get(0),
                    )
                    .optional()?;
                Ok(body.map(|b| serde_json::from_str(&b)).transpose()?)
            })
            .await
    }

    async fn scan(&self, prefix: &str) -> Result<Vec<KeyedDoc>> {
        let (coll, prefix) = (self.name.clone(), prefix.to_string());
        self.inner
            .read(move |c| read::scan(c, &coll, &prefix))
            .await
    }

    async fn scan_page(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<KeyedDoc>> {
        let (coll, prefix, after) = (
            self.name.clone(),
            prefix.to_string(),
            after.map(str::to_string),
        );
        self.inner
            .read(move |c| read::scan_page(c, &coll, &prefix, after.as_deref(), limit))
            .await
    }

    async fn snapshot(&self, filter: Option<Filter>) -> Result<KeyedSnapshot> {
        read::snapshot(self.inner.clone(), self.name.clone(), filter).await
    }

    fn changes(&self, mut filter: ChangeFilter, start: ChangeStart) -> ChangeStream {
        filter.collections = vec![self.name.clone()];
        read::change_stream(self.inner.clone(), filter, start)
    }
}
