//! The store contract: what every engine provides. The contract test suite
//! (`store/tests/contract/`) checks each engine against it.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use async_trait::async_trait;
use futures::stream::{BoxStream, Stream, StreamExt};
use serde_json::Value;

use crate::{
    Bounds, Capabilities, CappedSpec, Change, ChangeFilter, ChangeStart, Document, Durability,
    Filter, KeyUpdate, KeyedDoc, KeyedSnapshot, NewestMatching, Position, ReceivedRun, Record,
    Result, ResumeToken, Start, StoreError, TimeSpan, Usage, ValueGroup,
};

/// A stream of capped-collection documents in insertion order. It never ends on its own while
/// the store is open: after the last document it waits for the next commit. It ends with
/// [`StoreError::PositionLost`] when eviction overtook the reader.
pub type RecordStream = BoxStream<'static, Result<Record, StoreError>>;

/// A stream of changes in commit order; waits for new ones like [`RecordStream`]. It ends with
/// [`StoreError::HistoryLost`] when resumed from a token older than the retained history.
///
/// Besides the changes it yields, it tells how far it has *read*: [`ChangeStream::resume_token`]
/// advances past entries its filter skipped (MongoDB: the post-batch resume token), so a
/// consumer of a rare kind of change still checkpoints a fresh token and never wakes up with
/// one that has fallen out of the history.
pub struct ChangeStream {
    inner: BoxStream<'static, Result<Change, StoreError>>,
    read_up_to: Arc<Mutex<Option<ResumeToken>>>,
}

impl ChangeStream {
    /// Wraps an engine's stream; the engine updates `read_up_to` as it reads past entries
    /// (never ahead of a change the consumer has not yet received).
    pub fn new(
        inner: BoxStream<'static, Result<Change, StoreError>>,
        read_up_to: Arc<Mutex<Option<ResumeToken>>>,
    ) -> Self {
        ChangeStream { inner, read_up_to }
    }

    /// A stream that fails at once (for errors found before the stream starts).
    pub fn failed(e: StoreError) -> Self {
        let inner = futures::stream::once(async move { Err(e) }).boxed();
        ChangeStream::new(inner, Arc::default())
    }

    /// Resuming after this token continues exactly where this stream has read to, including
    /// entries that did not pass the filter; `None` before it read anything.
    pub fn resume_token(&self) -> Option<ResumeToken> {
        self.read_up_to.lock().ok().and_then(|t| t.clone())
    }

    /// The shared cell behind [`ChangeStream::resume_token`].
    pub fn resume_cell(&self) -> Arc<Mutex<Option<ResumeToken>>> {
        self.read_up_to.clone()
    }
}

impl Stream for ChangeStream {
    type Item = Result<Change, StoreError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.poll_next_unpin(cx)
    }
}

/// A storage engine: the factory of collections, the change log and the checkpoints.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// `embedded` or `mongodb` (the `engine` metric label).
    fn engine(&self) -> &'static str;

    /// What the server behind this store supports, probed when it was opened (the embedded
    /// engine supports everything). Callers check it before opening a feed that needs a
    /// capability, to fail at startup with the reason instead of with a stream that errors.
    fn capabilities(&self) -> Capabilities {
        Capabilities::all()
    }

    /// Opens (creating when absent) a capped collection.
    async fn capped(&self, name: &str, spec: &CappedSpec) -> Result<Arc<dyn Capped>>;

    /// Opens (creating when absent) a changefeed-backed keyed collection.
    async fn keyed(&self, name: &str) -> Result<Arc<dyn Keyed>>;

    /// Every change of the changefeed-backed collections that passes `filter`, in commit order
    /// (the op-log watcher; a collection's `changes` is this with one collection).
    fn changes(&self, filter: ChangeFilter, start: ChangeStart) -> ChangeStream;

    /// The same changes read at the log level (MongoDB: `local.oplog.rs` tailed directly, as
    /// older tools do). Engines whose change streams already are their log use `changes`.
    fn oplog(&self, filter: ChangeFilter, start: ChangeStart) -> ChangeStream {
        self.changes(filter, start)
    }

    /// The newest change's token, if any change was ever committed (for feed lag).
    async fn newest_change(&self) -> Result<Option<crate::ResumeToken>>;

    /// How many changes lie after `token` up to the newest (a feed's lag in changes), where the
    /// engine can tell cheaply; `None` where it cannot.
    async fn changes_after(&self, token: &crate::ResumeToken) -> Result<Option<u64>>;

    /// The commit time (µs since the epoch) of the oldest retained change: how far back a
    /// stopped feed can resume from.
    async fn oldest_change_at(&self) -> Result<Option<i64>>;

    /// The saved checkpoint of a feed.
    async fn load_checkpoint(&self, feed: &str) -> Result<Option<Value>>;

    /// Saves a feed's checkpoint (position and state together, atomically).
    async fn save_checkpoint(
        &self,
        feed: &str,
        checkpoint: Value,
        durability: Durability,
    ) -> Result<()>;

    /// Flushes queued writes and stops the engine's background work.
    async fn close(&self) -> Result<()>;
}

/// [`Capped::append_with_updates`] for an engine that cannot commit the two together: the
/// documents, then the updates, each its own commit.
pub(crate) async fn append_then_update<C: Capped + ?Sized>(
    capped: &C,
    docs: Arc<[Arc<Document>]>,
    keyed: &dyn Keyed,
    updates: Vec<KeyUpdate>,
    durability: Durability,
) -> Result<Vec<Position>> {
    let positions = capped.append_shared(docs, durability).await?;
    keyed.update(updates, durability).await?;
    Ok(positions)
}

/// A capped collection: bounded by count and bytes, insertion-ordered, oldest evicted first.
#[async_trait]
pub trait Capped: Send + Sync + 'static {
    /// The collection's name.
    fn name(&self) -> &str;

    /// Appends documents in order. Returns their positions (strictly increasing), or an empty
    /// list for [`Durability::Unacknowledged`], which returns before the commit.
    async fn append(&self, docs: Vec<Document>, durability: Durability) -> Result<Vec<Position>>;

    /// [`Capped::append`] of documents the caller keeps: to write them again should this
    /// attempt fail, as the ingester does. An engine that needs the documents after the call
    /// (the embedded engine hands them to live tails) shares them instead of copying them;
    /// the default copies.
    async fn append_shared(
        &self,
        docs: Arc<[Arc<Document>]>,
        durability: Durability,
    ) -> Result<Vec<Position>> {
        self.append(
            docs.iter().map(|d| Document::clone(d)).collect(),
            durability,
        )
        .await
    }

    /// Whether [`Capped::append_with_updates`] commits into `keyed` together with this
    /// collection's documents (all or nothing, one commit). `false` by default: the engine
    /// cannot (MongoDB does not write capped collections inside a transaction), or `keyed`
    /// belongs to another store.
    fn commits_with(&self, keyed: &dyn Keyed) -> bool {
        let _ = keyed;
        false
    }

    /// Whether a synced commit of this collection makes every earlier commit of `keyed`
    /// durable too (one log, synced in order): an unsynced write to `keyed` is then lost only
    /// together with every later write of this collection, in a crash that restarts the
    /// process, never while it runs on. `false` by default: a server can lose writes it did
    /// not journal and carry on.
    fn syncs_earlier_commits_of(&self, keyed: &dyn Keyed) -> bool {
        let _ = keyed;
        false
    }

    /// Appends `docs` and applies `updates` to `keyed` (as [`Keyed::update`] does), in one
    /// commit where [`Capped::commits_with`] says so: both are written or neither is, and tails
    /// and change streams see them at once. The ingester writes each batch's events and their
    /// rollups so: one commit instead of two. Where the engine cannot, the default writes them
    /// in turn (documents first); a failure then may leave the documents written without the
    /// updates. The documents are shared, as [`Capped::append_shared`] takes them: the caller
    /// keeps them to write in turn should the call fail.
    async fn append_with_updates(
        &self,
        docs: Arc<[Arc<Document>]>,
        keyed: &dyn Keyed,
        updates: Vec<KeyUpdate>,
        durability: Durability,
    ) -> Result<Vec<Position>> {
        append_then_update(self, docs, keyed, updates, durability).await
    }

    /// Every document after `start`, in order, then waits for new ones without polling.
    fn tail(&self, start: Start) -> RecordStream;

    /// [`Capped::tail`] restricted to the documents that match `filter`: same order, same
    /// waiting, same [`StoreError::PositionLost`] when eviction overtook the reader (whether or
    /// not the evicted documents matched). MongoDB evaluates the filter on the server (the
    /// tailable cursor's query); the default, used by the embedded engine, evaluates it here.
    fn tail_matching(&self, start: Start, filter: Filter) -> RecordStream {
        let tail = self.tail(start);
        if filter.is_match_all() {
            return tail;
        }
        tail.filter(move |r| {
            let keep = match r {
                Ok(record) => filter.matches(&record.doc),
                Err(_) => true,
            };
            futures::future::ready(keep)
        })
        .boxed()
    }

    /// The `limit` newest documents that match `filter`, newest first, and the newest position
    /// at the time of the read (matching or not): a tail from
    /// [`NewestMatching::continue_from`] yields exactly the documents appended after this read,
    /// so the two together have no gap and no duplicate (RethinkDB's `include_initial`).
    /// Scans back from the newest in bounded chunks; a rare filter reads the whole collection.
    async fn newest_matching(&self, filter: &Filter, limit: usize) -> Result<NewestMatching>;

    /// The document at a position, if still retained.
    async fn get(&self, position: Position) -> Result<Option<Record>>;

    /// The `limit` newest documents whose `field` equals `value` (newest first), on an
    /// indexed field; an unindexed field is [`StoreError::NotIndexed`].
    async fn latest(&self, field: &str, value: &Value, limit: usize) -> Result<Vec<Record>>;

    /// Oldest and newest retained positions, or `None` when empty.
    async fn bounds(&self) -> Result<Option<Bounds>>;

    /// For queries over the stored window: the documents at positions `[from, to]` still
    /// retained when each is read, in order, in batches, holding only the field paths `fields`
    /// (dotted; see [`crate::query::only_paths`]) when given (a query decodes no more than it
    /// uses), read ahead of the consumer, on
    /// threads of their own. Documents evicted meanwhile are skipped: the answer is over the
    /// window as the read found it. `None` when the engine has no faster way than a tail,
    /// which the caller then reads.
    fn scan(
        &self,
        from: Position,
        to: Position,
        fields: Option<Arc<[String]>>,
    ) -> Option<BoxStream<'static, Result<Vec<Record>>>> {
        let _ = (from, to, fields);
        None
    }

    /// Where the documents received in `[from_ms, to_ms]` (milliseconds since the epoch,
    /// inclusive; the date at [`crate::RECEIVED_PATH`]) lie, so that a query on a time range
    /// reads only those positions; `None` when the engine cannot tell, and every document is
    /// read. A document without a date there is never in a range. The default cannot tell.
    async fn time_span(&self, from_ms: i64, to_ms: i64) -> Result<Option<TimeSpan>> {
        let _ = (from_ms, to_ms);
        Ok(None)
    }

    /// For a query grouping by the indexed `field`: calls `each` with the groups of its
    /// values in whole stretches of positions within `[from, to]` that the engine keeps a
    /// summary of (each stretch's groups in turn), and returns those stretches (inclusive, in
    /// order). The caller reads the documents of the rest. A summary holds only what a
    /// `$group` by the field finds there: string values, and null or missing as `None`.
    /// Blocking (it reads files): call it from a query's thread. The default keeps none.
    fn value_groups(
        &self,
        field: &str,
        from: Position,
        to: Position,
        each: &mut dyn FnMut(ValueGroup<'_>),
    ) -> Result<Vec<(Position, Position)>> {
        let _ = (field, from, to, each);
        Ok(Vec::new())
    }

    /// For a query counting documents by when they arrived: calls `each` with stretches of
    /// positions within `[from, to]`, in order, whose documents arrived within one second
    /// ([`ReceivedRun`]), where the engine keeps a record of that. The caller reads the
    /// documents of the rest. Blocking (it may read files): call it from a query's thread.
    /// The default keeps none.
    fn received_runs(
        &self,
        from: Position,
        to: Position,
        each: &mut dyn FnMut(ReceivedRun),
    ) -> Result<()> {
        let _ = (from, to, each);
        Ok(())
    }

    /// Number of retained documents and their encoded size in bytes.
    async fn usage(&self) -> Result<Usage>;

    /// The server that stores this collection, when it runs aggregation pipelines itself: a
    /// query then sends it the longest prefix it evaluates as tailrace does
    /// ([`crate::query::ServerQuery`]). `None` (the default) for an engine that reads
    /// in-process.
    fn server_query(&self) -> Option<Arc<dyn crate::query::ServerQuery>> {
        None
    }
}

/// A keyed collection whose every insert, update, replace and delete is published as a
/// [`Change`].
#[async_trait]
pub trait Keyed: Send + Sync + 'static {
    /// The collection's name.
    fn name(&self) -> &str;

    /// The collection as [`std::any::Any`], so an engine can recognise its own collections
    /// (see [`Capped::commits_with`]).
    fn as_any(&self) -> &dyn std::any::Any;

    /// Upserts: applies each `$inc`/`$set` update to its key (creating the key when absent), in
    /// order, in one commit. Each key's change is published. An update named with a
    /// [`crate::WriteId`] and sent again after a failure is applied once where the engine can
    /// lose a reply (MongoDB).
    async fn update(&self, updates: Vec<KeyUpdate>, durability: Durability) -> Result<()>;

    /// Inserts or replaces the whole document of `key`.
    async fn set(&self, key: &str, doc: Document, durability: Durability) -> Result<()>;

    /// Removes `key`; returns whether it existed.
    async fn delete(&self, key: &str, durability: Durability) -> Result<bool>;

    /// Removes up to `limit` keys starting with `prefix` whose last write (update, set) is
    /// older than `written_before_us` (µs since the epoch), oldest first, each published as a
    /// delete; returns how many. The write time is the engine's, kept beside each document
    /// (not in it): documents read back are unchanged.
    async fn expire(
        &self,
        prefix: &str,
        written_before_us: i64,
        limit: usize,
        durability: Durability,
    ) -> Result<u64>;

    /// The document of `key`.
    async fn get(&self, key: &str) -> Result<Option<Document>>;

    /// Every document whose key starts with `prefix`, by key.
    async fn scan(&self, prefix: &str) -> Result<Vec<KeyedDoc>>;

    /// One page of [`Keyed::scan`]: at most `limit` documents whose key starts with `prefix`
    /// and sorts after `after` (bytewise, UTF-8), by key. The next page starts after the last
    /// key of this one.
    async fn scan_page(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<KeyedDoc>>;

    /// A consistent snapshot of the documents that match `filter` (all when `None`), by key,
    /// and the token right after it: changes from [`KeyedSnapshot::token`] are exactly those
    /// committed after the snapshot, so snapshot and changes together have no gap and no
    /// duplicate. The snapshot is fixed when this returns; its documents are read in bounded
    /// pages as the stream is polled (the engine holds its snapshot open until the stream is
    /// finished or dropped, so read it promptly).
    async fn snapshot(&self, filter: Option<Filter>) -> Result<KeyedSnapshot>;

    /// Changes of this collection only (see [`Store::changes`]).
    fn changes(&self, filter: ChangeFilter, start: ChangeStart) -> ChangeStream;

    /// The server that stores this collection, when it runs aggregation pipelines itself (see
    /// [`Capped::server_query`]). Its stages see the documents as [`Keyed::snapshot`] gives
    /// them, by key, and with no stages it reads them all: a query over a keyed collection
    /// needs no snapshot read then. `None` (the default) for an engine that reads in-process.
    fn server_query(&self) -> Option<Arc<dyn crate::query::ServerQuery>> {
        None
    }
}
