//! The MongoDB engine (cargo feature `mongodb`): the store contract on a MongoDB replica set,
//! through the official `mongodb` driver.
//!
//! What it is: capped collections tailed with tailable-await cursors, keyed collections whose
//! changes come from change streams (or, as an option, from the oplog read directly),
//! checkpoints in a `checkpoints` collection. What it is not: a general MongoDB client, nor a
//! multi-writer log (see *positions*). It needs a **replica set** (a single-node one will do)
//! for change streams, the oplog and multi-key transactions; capped collections work on a
//! standalone server too.
//!
//! Layout:
//! - `convert.rs`: JSON ⇄ BSON, durability → write concern, errors,
//!   `$inc`/`$set` documents, resume tokens; pure and unit-tested;
//! - `capped.rs`: creation and checks, the writer task, acknowledgment times, the tail;
//! - `keyed.rs`: keyed collections;
//! - `changes.rs`: change streams; `oplog.rs`: the raw oplog;
//! - `probe.rs`: what the server supports, asked at connect.
//!
//! ## Positions: one writer per capped collection
//! A position is the document's `_id`, an integer the engine assigns: at open it reads the
//! newest `_id` and continues from it. A tailable cursor follows *natural* (insertion) order
//! and resumes with `{_id: {$gt: last}}`, which is only right when `_id` order equals
//! insertion order. So one tailrace process writes a capped collection, and in it one task
//! per collection assigns `_id`s and inserts them **ordered** (an unordered insert may apply
//! documents out of order). ObjectIds from several processes would not do: they are ordered
//! by each process's clock and counter, not by insertion. The writer groups consecutive
//! appends of the same write concern into one `insert_many` (group commit).
//!
//! ## Durability
//! | level | write concern |
//! |---|---|
//! | `unacknowledged` | `w: 1`, sent by the writer task (capped) or a background task (keyed, checkpoints); the caller does not wait. The Rust driver refuses `w: 0` on the client side. Failures are logged and counted (`tailrace_errors_total{component="store"}`). |
//! | `acknowledged` | `w: 1` |
//! | `journaled` | `w: 1, j: true` |
//! | `majority` | `w: "majority", j: true` |
//!
//! Every level carries `wtimeout` = [`MongoOptions::write_timeout`]. Reads go to the
//! primary. [`Record::committed_at_us`](crate::Record) is the time this process received the
//! acknowledgment of the insert (kept in a bounded ring); `None` for documents it did not
//! write or has forgotten.
//!
//! ## Changes
//! A change stream on the database, filtered by a `$match` stage built from the
//! [`ChangeFilter`], with exact post-images (`fullDocument: whenAvailable`) and pre-images
//! (`fullDocumentBeforeChange: whenAvailable`) on MongoDB 6.0+, where keyed collections are
//! created with `changeStreamPreAndPostImages`. Tokens are the JSON of the driver's
//! `ResumeToken`; resuming uses `startAfter`. `ChangeStreamHistoryLost` (286) ends the stream
//! with [`StoreError::HistoryLost`] and is never retried with the same token. With
//! [`MongoOptions::raw_oplog`] (and always through [`Store::oplog`]) changes are read from
//! `local.oplog.rs` instead; its tokens are oplog positions (`{"oplog": {..}}`), which change
//! streams accept too. A stream's [`ChangeStream::resume_token`] also moves past changes the
//! filter skipped and on a quiet stream (MongoDB's post-batch token; in oplog mode, every
//! entry read, periodic no-ops included), so a checkpoint stays fresh without new changes.
//!
//! An oplog position is `(ts, operation index, end)`: an `applyOps` entry (a transaction) holds
//! several operations at one `ts`, and a whole entry (`ChangeStart::Now`, `newest_change`, a
//! snapshot's token) compares equal to its last operation and after all of them, so a stream
//! resumed from one never replays part of a transaction.
//!
//! ## What the server supports is asked of the server
//! At connect, `probe.rs` asks (about a dozen round trips): `hello` (a set name, and the
//! `setVersion` a real member reports), a change stream on the database, `local.oplog.rs` in
//! `listCollections`, an update in a transaction, a snapshot read (it must come back with
//! `atClusterTime`), and, on scratch collections dropped afterwards, documents with `$`-prefixed
//! and dotted keys and a nested array, a capped collection of one document after more inserts,
//! a tailable cursor that stays open, and five corners of the query language compared with
//! [`crate::Filter`]. A network failure fails the connect; any other refusal is an answer, kept
//! with the reply ([`Store::capabilities`]). What a missing capability changes:
//!
//! | missing | the engine then | the pipeline |
//! |---|---|---|
//! | change streams | `changes()` fails with `Unsupported` | a `changes` feed is refused at startup, naming the alternatives; `/api/changes` on a keyed collection answers 501 |
//! | an oplog | `oplog()` fails with `Unsupported` | an `oplog` feed is refused at startup, saying how to create `local.oplog.rs` |
//! | transactions | a multi-key update runs without one (each key atomic, the batch not) | logged once |
//! | snapshot reads | `Keyed::snapshot` fails with `Unsupported` | `include_initial` on a keyed collection answers 501; queries over it still answer (`query.rs`: they read as the server's `aggregate` does) |
//! | before images | change streams without pre-images; `collMod` is never sent | `old_val` absent |
//! | server filters | document filters run in tailrace, with the embedded engine's meaning | — |
//! | tailable cursors that stay open | tails read batches of 1,000 and wait 50 ms per `getMore` | — |
//! | documents as sent, capped bounds, majority | nothing: the server's own behaviour | logged once, with its cost |
//!
//! The contract suite (`store/tests/mongodb.rs`, on libtest-mimic) reads the same probe and
//! reports a check that needs something missing as ignored, labelled `[needs …]`.
//!
//! ## Writes that cannot be undone
//! The driver retries a read or write once after a network error or a step-down (retryable
//! writes) and resumes change streams on resumable errors. Beyond that:
//! - **Capped inserts** are ordered, and no transaction can hold one, so the server keeps the
//!   documents before one it refuses: the append answers [`StoreError::PartlyWritten`] and the
//!   ingester writes none of them again. After a failure that does not say how far it got (a
//!   lost connection), the newest position on the server does (one writer per collection);
//!   when even that cannot be read, the next group starting with the same documents takes the
//!   ones the server holds as stored. A server that does not recognise the driver's retry
//!   (FerretDB) refuses it as a duplicate `_id` at the group's own positions: the documents held
//!   there as sent are taken as stored, once; another document there (a second writer) is
//!   refused.
//! - **Keyed upserts** go out as one ordered `update` command per 32 keys (in one transaction
//!   where the server runs them); a write error names how many statements were applied
//!   (`PartlyWritten`). The driver does not retry an `update` whose reply is lost, and the
//!   ingester sends the batch again, so each update is named ([`crate::WriteId`]: a writer
//!   drawn when the ingester starts, a sequence number per update) and the engine keeps the
//!   newest name applied beside each document (`_tailrace_writer`, `_tailrace_seq`, left out of
//!   every read). Only updates named at or below the newest one sent in a request that did not
//!   succeed are guarded, so the write every event takes stays a plain upsert. Without a
//!   transaction a guarded statement matches only a document that does not show its name, so a
//!   repeat is refused as a duplicate `_id` and counted as applied; in a transaction the names
//!   are read first and what landed is left out. Names guard one writer's retries, not two
//!   writers interleaving.
//! - Tails and change streams re-open after their last position with backoff (a tail or the
//!   oplog watcher on any `getMore` error that is neither a bad request nor a missing feature);
//!   operations return [`StoreError::Engine`] with the driver's message.
//!
//! Errors are mapped by meaning (`convert.rs`): CommandNotFound (59), CommandNotSupported (115),
//! NotImplemented (238), 40573 (a change stream off a replica set) and 40324 (an unknown
//! pipeline stage) are [`StoreError::Unsupported`]; FailedToParse (9) stays `Invalid`.
//!
//! ## FerretDB
//! FerretDB 1.24 on SQLite runs in CI (`scripts/ferretdb.sh`). Besides what the probe finds
//! missing, the engine works around, without changing what it sends to MongoDB: `createIndexes`
//! of existing indexes drops the connection (only missing ones are created); an `update` holds a
//! database connection per statement until it answers (hence 32 keys a command); a waiting
//! `getMore` holds a connection per 10 ms of its wait (hence the short wait of polling tails); a
//! tailable `find` reads the whole capped collection, so a polling tail queries once per write
//! of this process, at most every 200 ms, and otherwise up to a second apart; a collection a
//! first upsert creates while a tail reads can hang the database (`checkpoints` is created at
//! connect); an update's oplog entry holds the whole document in `$set`, taken as the exact
//! image. What remains is slow: writers queue for SQLite's one write lock, and oplog reads,
//! `update`s and `_id` lookups scan their collections (`config/ferretdb.toml` keeps rollups to a
//! low-cardinality field; figures in `docs/BENCHMARKS.md`). Its background capped cleanup hung
//! a database in the end-to-end tests, which run it off (`tailrace/tests/ferretdb.rs`).
//!
//! ```no_run
//! # async fn demo() -> store::Result<()> {
//! use store::mongo::{MongoOptions, MongoStore};
//! use store::{CappedSpec, Durability, Start, Store};
//! let store = MongoStore::connect(
//!     "mongodb://localhost:27017/?replicaSet=rs0",
//!     "tailrace",
//!     MongoOptions::default(),
//! )
//! .await?;
//! let spec = CappedSpec { max_docs: 1000, max_bytes: 1 << 20, indexes: vec![] };
//! let events = store.capped("events", &spec).await?;
//! let mut tail = events.tail(Start::Now);
//! store.close().await?;
//! # Ok(()) }
//! ```

mod capped;
mod changes;
mod convert;
mod keyed;
mod oplog;
mod probe;
mod query;
mod settings;
mod tailable;
mod token;

use crate::telemetry::Problem;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;
use mongodb::bson::{Bson, DateTime, Document as BsonDoc, doc};
use mongodb::options::ClientOptions;
use mongodb::{Client, Database};
use serde_json::Value;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::names::check_name;
use crate::{
    Capabilities, Capability, Capped, CappedSpec, ChangeFilter, ChangeStart, ChangeStream,
    Durability, Keyed, Result, ResumeToken, Store, StoreError,
};
use capped::{CappedShared, MongoCapped, ensure_capped};
use convert::{bson_to_json, engine_err, json_to_bson, write_concern};
use keyed::{MongoKeyed, ensure_keyed};

pub(crate) use convert::map_error;
pub use settings::MongoSettings;

/// The collection holding feed checkpoints: `{_id: feed, body, ts}`.
pub(crate) const CHECKPOINTS: &str = "checkpoints";
/// The first wire version of MongoDB 6.0 (change-stream pre- and post-images).
const WIRE_VERSION_6_0: i32 = 17;
/// First pause before re-opening a dead or failed cursor.
pub(crate) const BACKOFF_MIN: Duration = Duration::from_millis(10);
/// Longest pause before re-opening (also the worst-case delay of a tail on an empty
/// collection for writes from other processes).
pub(crate) const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// How long a keyed write waits for change streams being opened (see
/// [`Inner::begin_opening`]) before it goes ahead anyway.
const OPENING_WAIT: Duration = Duration::from_secs(10);
/// How long `close` lets the driver finish cleaning up (killing cursors, ending sessions)
/// before shutting it down without waiting.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// Background (unacknowledged) keyed writes and checkpoints waiting to be sent; when full,
/// callers wait (backpressure, not unbounded memory).
const BACKGROUND_QUEUE: usize = 1024;

/// Settings of the MongoDB engine. The connection itself (hosts, replica set, TLS, timeouts,
/// pool size, credentials) is configured in the URI.
#[derive(Clone, Debug)]
pub struct MongoOptions {
    /// `wtimeout` of every write: how long the server waits for the write concern (journal,
    /// majority) before answering with an error. The write may still have been applied.
    pub write_timeout: Duration,
    /// How long the server holds a tailable or change-stream `getMore` open while there is
    /// nothing new (`maxAwaitTimeMS`). Longer means fewer round trips on a quiet collection;
    /// it does not delay new documents, which are returned as soon as they are written.
    pub max_await_time: Duration,
    /// Read changes by tailing `local.oplog.rs` directly instead of change streams
    /// (`Store::changes` and `Keyed::changes`). No before images then, and an update's after
    /// image is looked up when read; see `oplog.rs`.
    pub raw_oplog: bool,
    /// Appends waiting for a capped collection's writer; when full, appenders wait.
    pub queue_capacity: usize,
    /// How many acknowledged inserts (each a range of positions) per capped collection keep
    /// their acknowledgment time for `Record::committed_at_us`.
    pub ack_ring_capacity: usize,
}

impl Default for MongoOptions {
    fn default() -> Self {
        MongoOptions {
            write_timeout: Duration::from_secs(10),
            max_await_time: Duration::from_secs(1),
            raw_oplog: false,
            queue_capacity: 1024,
            ack_ring_capacity: 16_384,
        }
    }
}

/// The MongoDB store. Cheap to clone; all clones share one client and one writer per capped
/// collection.
#[derive(Clone)]
pub struct MongoStore {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) client: Client,
    pub(crate) db: Database,
    pub(crate) options: MongoOptions,
    /// What the server supports, probed at connect (`probe.rs`).
    pub(crate) capabilities: Capabilities,
    /// One shared writer per capped collection name.
    capped: tokio::sync::Mutex<HashMap<String, Arc<CappedShared>>>,
    /// Unacknowledged keyed writes and checkpoints, sent in order by one task. `None` once
    /// closed.
    background: Mutex<Option<mpsc::Sender<BoxFuture<'static, ()>>>>,
    background_task: Mutex<Option<JoinHandle<()>>>,
    /// Set once by `close`: tails and change streams end with `Closed`.
    pub(crate) closed: watch::Sender<bool>,
    /// Bumped after each keyed write of this process: an oplog watcher whose cursor the
    /// server closed (a server that keeps no tailable cursor open when it has nothing more,
    /// such as FerretDB) re-opens at once for this process's own writes instead of at the
    /// end of its backoff.
    pub(crate) keyed_written: watch::Sender<u64>,
    /// Change streams being opened. Keyed writes wait for zero, so a change stream opened
    /// with `ChangeStart::Now` sees every write issued after `changes()` returned, although
    /// opening it takes a round trip (`changes()` itself is not async).
    opening: Arc<watch::Sender<usize>>,
    /// Per writer of named keyed updates ([`crate::WriteId`]): the newest sequence number sent
    /// in a request that has not succeeded (it failed, or was dropped on its way). An update
    /// named at or below it may have landed, so it goes out guarded (`keyed.rs`); every other
    /// update was never sent and needs no guard.
    pub(crate) unsettled: Mutex<HashMap<u64, u64>>,
    /// Which query features the server evaluates as tailrace does, probed on the first query
    /// that could run on it (`query.rs`).
    pub(crate) query_features: tokio::sync::OnceCell<Arc<crate::query::Features>>,
}

pub(crate) fn lock_err<T>(_: T) -> StoreError {
    engine_err("internal lock poisoned")
}

/// Sleeps `d`, or less when the store closes; `false` when it closed.
pub(crate) async fn sleep_unless_closed(closed: &mut watch::Receiver<bool>, d: Duration) -> bool {
    tokio::select! {
        biased;
        _ = closed.wait_for(|c| *c) => false,
        _ = tokio::time::sleep(d) => true,
    }
}

/// Held while a change stream opens (see [`Inner::begin_opening`]).
pub(crate) struct OpeningGuard(Arc<watch::Sender<usize>>);

impl Drop for OpeningGuard {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// A tail's batch size, and how long a getMore waits, on a server whose tailable cursors do
/// not stay open ([`Capability::AwaitingTails`]): every document there is comes in the first
/// batch, so the cursor closes and the tail re-opens it (which it must do anyway), and a
/// getMore seldom waits. FerretDB (1.24) holds one database connection per 10 ms that a
/// getMore waits, until it answers, and runs out of them under a few waiting tails: the whole
/// database then hangs.
const POLLING_TAIL_BATCH: u32 = 1000;
const POLLING_TAIL_AWAIT: Duration = Duration::from_millis(50);

impl Inner {
    /// How a tailable cursor is opened: its batch size (`None`: the server's default) and
    /// its getMore's `maxAwaitTimeMS`.
    pub(crate) fn tail_cursor(&self) -> (Option<u32>, Duration) {
        if self.capabilities.awaiting_tails.is_yes() {
            (None, self.options.max_await_time)
        } else {
            (
                Some(POLLING_TAIL_BATCH),
                POLLING_TAIL_AWAIT.min(self.options.max_await_time),
            )
        }
    }

    /// [`StoreError::Unsupported`] with the probe's reason, when the server lacks `capability`.
    pub(crate) fn unsupported(&self, capability: Capability) -> Option<StoreError> {
        self.capabilities
            .get(capability)
            .reason()
            .map(|reason| StoreError::Unsupported {
                capability,
                reply: reason.to_string(),
            })
    }

    /// Marks a change stream as opening until the guard is dropped.
    pub(crate) fn begin_opening(&self) -> OpeningGuard {
        self.opening.send_modify(|n| *n += 1);
        OpeningGuard(self.opening.clone())
    }

    /// Waits (bounded) until no change stream is opening.
    pub(crate) async fn wait_for_opening_streams(&self) {
        if *self.opening.borrow() == 0 {
            return;
        }
        let mut rx = self.opening.subscribe();
        if tokio::time::timeout(OPENING_WAIT, rx.wait_for(|n| *n == 0))
            .await
            .is_err()
        {
            Problem {
                error_type: "stream_opening",
                detail: "a change stream is still opening; writing anyway",
            }
            .warn();
        }
    }

    /// Queues an unacknowledged write; waits only when the queue is full.
    pub(crate) async fn background(
        &self,
        write: impl Future<Output = ()> + Send + 'static,
    ) -> Result<()> {
        let sender = self
            .background
            .lock()
            .map_err(lock_err)?
            .clone()
            .ok_or(StoreError::Closed)?;
        sender
            .send(Box::pin(write))
            .await
            .map_err(|_| StoreError::Closed)
    }

    /// Changes through change streams or the oplog, as configured.
    pub(crate) fn changes(
        self: &Arc<Self>,
        filter: ChangeFilter,
        start: ChangeStart,
    ) -> ChangeStream {
        if self.options.raw_oplog {
            oplog::oplog_stream(self.clone(), filter, start)
        } else {
            changes::change_stream(self.clone(), filter, start)
        }
    }
}

/// Creates the checkpoints collection when absent, before any stream reads the database:
/// every collection this engine writes exists before its first write. A collection created by
/// an upsert's first write instead may be created inside a multi-document transaction (which
/// MongoDB before 4.4 refuses), and FerretDB was seen to hang a whole database when a
/// checkpoint's first upsert created the collection while a tailable cursor awaited data.
async fn ensure_checkpoints(db: &Database) -> Result<()> {
    /// "Namespace already exists": created meanwhile by another process, or earlier.
    const NAMESPACE_EXISTS: i32 = 48;
    if capped::collection_info(db, CHECKPOINTS).await?.is_some() {
        return Ok(());
    }
    match db.create_collection(CHECKPOINTS).await {
        Ok(()) => Ok(()),
        Err(e) if convert::error_code(&e) == Some(NAMESPACE_EXISTS) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Refuses names the engine keeps for itself or that the embedded engine would refuse (one
/// naming rule for both engines).
fn check_collection_name(name: &str) -> Result<()> {
    check_name(name)?;
    if name == CHECKPOINTS {
        return Err(StoreError::Invalid(format!(
            "collection name {name:?} is where the MongoDB engine keeps feed checkpoints; \
             choose another"
        )));
    }
    Ok(())
}

/// Checks a database name against MongoDB's rules.
fn check_database_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() < 64
        && !name.contains(['/', '\\', '.', ' ', '"', '$', '\0']);
    if ok {
        Ok(())
    } else {
        Err(StoreError::Invalid(format!(
            "database name {name:?}: use 1-63 characters without / \\ . space \" $"
        )))
    }
}

impl MongoStore {
    /// Connects to MongoDB at `uri` (a `mongodb://` or `mongodb+srv://` connection string) and
    /// uses `database`. Contacts the server once (`hello`), so a wrong URI or an unreachable
    /// server fails here (after the URI's `serverSelectionTimeoutMS`, 30 s by default), not
    /// at the first write. Then probes what the server supports ([`Store::capabilities`]):
    /// change streams, the oplog, transactions and snapshot reads need a replica set, before
    /// images MongoDB 6.0; the probe asks the server for each.
    pub async fn connect(uri: &str, database: &str, options: MongoOptions) -> Result<Self> {
        check_database_name(database)?;
        let mut client_options = ClientOptions::parse(uri).await?;
        if client_options.app_name.is_none() {
            client_options.app_name = Some("tailrace".into());
        }
        let client = Client::with_options(client_options)?;
        let hello = client
            .database("admin")
            .run_command(doc! {"hello": 1})
            .await?;
        let db = client.database(database);
        let capabilities = probe::probe(&client, &db, &probe::Hello::from_reply(&hello)).await?;
        ensure_checkpoints(&db).await?;
        let missing: Vec<&str> = capabilities.missing().map(|(c, _)| c.as_str()).collect();
        if !missing.is_empty() {
            tracing::info!(
                missing = %missing.join(", "),
                "the MongoDB server lacks some capabilities (Store::capabilities has each reason)"
            );
        }
        let (bg_tx, mut bg_rx) = mpsc::channel::<BoxFuture<'static, ()>>(BACKGROUND_QUEUE);
        let background_task = tokio::spawn(async move {
            while let Some(write) = bg_rx.recv().await {
                write.await;
            }
        });
        Ok(MongoStore {
            inner: Arc::new(Inner {
                db,
                client,
                options,
                capabilities,
                capped: tokio::sync::Mutex::new(HashMap::new()),
                background: Mutex::new(Some(bg_tx)),
                background_task: Mutex::new(Some(background_task)),
                closed: watch::Sender::new(false),
                keyed_written: watch::Sender::new(0),
                opening: Arc::new(watch::Sender::new(0)),
                unsettled: Mutex::new(HashMap::new()),
                query_features: tokio::sync::OnceCell::new(),
            }),
        })
    }

    /// The database this store uses.
    pub fn database(&self) -> &Database {
        &self.inner.db
    }

    /// The driver's client (for tools and tests, e.g. to drop a test database).
    pub fn client(&self) -> &Client {
        &self.inner.client
    }
}

#[async_trait]
impl Store for MongoStore {
    fn engine(&self) -> &'static str {
        "mongodb"
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities.clone()
    }

    async fn capped(&self, name: &str, spec: &CappedSpec) -> Result<Arc<dyn Capped>> {
        check_collection_name(name)?;
        if spec.max_docs == 0 || spec.max_bytes == 0 {
            return Err(StoreError::Invalid(format!(
                "capped collection {name}: max_docs and max_bytes must be at least 1"
            )));
        }
        if *self.inner.closed.borrow() {
            return Err(StoreError::Closed);
        }
        ensure_capped(&self.inner.db, name, spec).await?;
        // Held across the start, so two opens of one name share one writer.
        let mut registry = self.inner.capped.lock().await;
        let shared = match registry.get(name) {
            Some(shared) => shared.clone(),
            None => {
                let shared = CappedShared::start(&self.inner, name).await?;
                registry.insert(name.to_string(), shared.clone());
                shared
            }
        };
        Ok(Arc::new(MongoCapped {
            inner: self.inner.clone(),
            shared,
            indexes: spec.indexes.clone(),
        }))
    }

    async fn keyed(&self, name: &str) -> Result<Arc<dyn Keyed>> {
        check_collection_name(name)?;
        ensure_keyed(&self.inner.db, name, &self.inner.capabilities).await?;
        Ok(Arc::new(MongoKeyed {
            name: name.to_string(),
            inner: self.inner.clone(),
            coll: self.inner.db.collection(name),
        }))
    }

    fn changes(&self, filter: ChangeFilter, start: ChangeStart) -> ChangeStream {
        self.inner.changes(filter, start)
    }

    fn oplog(&self, filter: ChangeFilter, start: ChangeStart) -> ChangeStream {
        oplog::oplog_stream(self.inner.clone(), filter, start)
    }

    async fn newest_change(&self) -> Result<Option<ResumeToken>> {
        oplog::newest_change(&self.inner).await
    }

    async fn changes_after(&self, token: &ResumeToken) -> Result<Option<u64>> {
        oplog::changes_after(&self.inner, token).await
    }

    async fn oldest_change_at(&self) -> Result<Option<i64>> {
        Ok(oplog::oldest_entry(&self.inner).await?.map(|e| e.at_us()))
    }

    async fn load_checkpoint(&self, feed: &str) -> Result<Option<Value>> {
        let doc = self
            .inner
            .db
            .collection::<BsonDoc>(CHECKPOINTS)
            .find_one(doc! {"_id": feed})
            .await?;
        Ok(doc.map(|mut d| d.remove("body").map(bson_to_json).unwrap_or(Value::Null)))
    }

    async fn save_checkpoint(
        &self,
        feed: &str,
        checkpoint: Value,
        durability: Durability,
    ) -> Result<()> {
        crate::names::check_key("checkpoints", feed)?;
        // One document per feed, replaced whole: position and state change atomically.
        let doc = doc! {
            "_id": feed,
            "body": json_to_bson(&checkpoint),
            "ts": DateTime::now(),
        };
        let coll = self.inner.db.collection::<BsonDoc>(CHECKPOINTS);
        let wc = write_concern(durability, self.inner.options.write_timeout);
        let feed = feed.to_string();
        let write = async move {
            coll.replace_one(doc! {"_id": Bson::String(feed.clone())}, doc)
                .upsert(true)
                .write_concern(wc)
                .await
                .map(|_| ())
                .map_err(|e| (feed, e))
        };
        if durability.waits() {
            return write.await.map_err(|(_, e)| e.into());
        }
        self.inner
            .background(async move {
                if let Err((feed, e)) = write.await {
                    Problem {
                        error_type: "unacknowledged_write",
                        detail: &format!("feed {feed}: an unacknowledged checkpoint failed ({e}); the feed resumes from its previous one"),
                    }
                    .error();
                }
            })
            .await
    }

    async fn close(&self) -> Result<()> {
        // Tails and change streams end (and drop their cursors) first.
        self.inner.closed.send_replace(true);
        // Queued appends are written: each writer drains its queue, then stops.
        let writers: Vec<Arc<CappedShared>> =
            self.inner.capped.lock().await.values().cloned().collect();
        for shared in writers {
            shared.close().await?;
        }
        // Then the unacknowledged keyed writes and checkpoints.
        self.inner.background.lock().map_err(lock_err)?.take();
        let task = self.inner.background_task.lock().map_err(lock_err)?.take();
        if let Some(task) = task {
            task.await
                .map_err(|e| engine_err(format!("background writer: {e}")))?;
        }
        // `shutdown` waits for every cursor and session to be dropped; a stream its consumer
        // still holds (without polling it) would make it wait forever, hence the grace period.
        let client = self.inner.client.clone();
        if tokio::time::timeout(SHUTDOWN_GRACE, client.shutdown())
            .await
            .is_err()
        {
            Problem {
                error_type: "close",
                detail: "MongoDB client: cursors still held after close; shutting down anyway",
            }
            .warn();
            self.inner.client.clone().shutdown().immediate(true).await;
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_one_rule_and_checkpoints_is_reserved() {
        assert!(check_collection_name("events").is_ok());
        assert!(
            check_collection_name("Events").is_err(),
            "same rule as the embedded engine"
        );
        assert!(matches!(
            check_collection_name(CHECKPOINTS),
            Err(StoreError::Invalid(_))
        ));
        assert!(check_database_name("tailrace_test_1_2").is_ok());
        for bad in ["", "a.b", "a b", "a$b", &"x".repeat(64)] {
            assert!(check_database_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn default_options_are_sane() {
        let o = MongoOptions::default();
        assert!(!o.raw_oplog, "change streams by default");
        assert!(o.max_await_time < o.write_timeout);
        assert!(o.queue_capacity > 0 && o.ack_ring_capacity > 0);
    }

    #[tokio::test]
    async fn the_opening_gate_holds_writers_until_streams_are_open() {
        let opening = Arc::new(watch::Sender::new(0usize));
        let guard = {
            opening.send_modify(|n| *n += 1);
            OpeningGuard(opening.clone())
        };
        let mut rx = opening.subscribe();
        let waiter =
            tokio::spawn(async move { rx.wait_for(|n| *n == 0).await.map(|_| ()).is_ok() });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "a writer waits while a stream opens");
        drop(guard);
        assert!(waiter.await.unwrap());
        assert_eq!(*opening.borrow(), 0);
    }
}
