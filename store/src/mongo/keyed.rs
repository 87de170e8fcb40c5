//! Changefeed-backed (keyed) collections on MongoDB: `{_id: key, ...}` documents, created with
//! change-stream pre- and post-images, updated with `$inc`/`$set` upserts.

use crate::telemetry::Problem;
use std::sync::Arc;

use async_trait::async_trait;
use futures::{FutureExt, StreamExt};
use mongodb::bson::{Document as BsonDoc, doc};
use mongodb::options::{ChangeStreamPreAndPostImages, WriteConcern};
use mongodb::{Collection, Database};

use super::capped::{collection_info, ensure_indexes};
use super::convert::DUPLICATE_KEY;
use super::convert::reply_of;
use super::convert::{
    Class, OplogPos, Token, bson_doc_to_json, classify, doc_to_bson, encode_token, engine_err,
    error_code, error_of_code, json_to_bson, key_string, regex_escape, update_document,
    write_concern,
};
use super::{Inner, lock_err};
use crate::clock::now_us;
use crate::{
    Capabilities, Capability, ChangeFilter, ChangeStart, ChangeStream, Document, Durability,
    Filter, KeyUpdate, Keyed, KeyedDoc, KeyedSnapshot, Result, StoreError, WriteId,
};

/// Documents per batch of a snapshot read: bounds memory whatever the collection's size.
pub(crate) const SNAPSHOT_BATCH: u32 = 256;

/// The server's error code for "namespace already exists".
const NAMESPACE_EXISTS: i32 = 48;

/// The engine's own field in every keyed document: when its key was last written (µs since
/// the epoch), for [`Keyed::expire`]. Indexed; removed from every document read back, so keyed
/// documents look the same on both engines (the embedded engine keeps it in a column).
pub(crate) const WRITTEN: &str = "_tailrace_written_us";

/// The engine's own fields naming the newest [`WriteId`] applied to a keyed document (its
/// writer, its sequence number): an update sent again under a name not newer is skipped.
/// Removed from every document read back, as [`WRITTEN`] is.
pub(crate) const ONCE_WRITER: &str = "_tailrace_writer";
pub(crate) const ONCE_SEQ: &str = "_tailrace_seq";

/// The engine's own fields of a keyed document, which no reader sees.
pub(crate) const ENGINE_FIELDS: [&str; 3] = [WRITTEN, ONCE_WRITER, ONCE_SEQ];

/// A keyed document as JSON, without the engine's own fields ([`ENGINE_FIELDS`]).
pub(crate) fn keyed_doc_to_json(mut doc: BsonDoc) -> Document {
    for field in ENGINE_FIELDS {
        doc.remove(field);
    }
    bson_doc_to_json(doc)
}

/// `update` with the write time, and the update's name when it has one, added to its `$set`.
fn stamped_update(mut update: BsonDoc, now: i64, once: Option<WriteId>) -> BsonDoc {
    let mut engine = doc! {WRITTEN: now};
    if let Some(id) = once {
        let (writer, seq) = once_fields(id);
        engine.insert(ONCE_WRITER, writer);
        engine.insert(ONCE_SEQ, seq);
    }
    match update.get_document_mut("$set") {
        Ok(set) => set.extend(engine),
        Err(_) => {
            update.insert("$set", engine);
        }
    }
    update
}

/// A [`WriteId`] as stored: BSON has no unsigned integers, so the writer's 64 bits are kept
/// as an `i64` (compared for equality only) and the sequence number saturates at `i64::MAX`.
fn once_fields(id: WriteId) -> (i64, i64) {
    (
        i64::from_ne_bytes(id.writer.to_ne_bytes()),
        i64::try_from(id.seq).unwrap_or(i64::MAX),
    )
}

/// Whether a document's stored name (its [`ONCE_WRITER`] and [`ONCE_SEQ`]) shows the update
/// named `id` as applied: the same writer, a sequence number at least `id`'s.
fn shows_applied(doc: &BsonDoc, id: WriteId) -> bool {
    let (writer, seq) = once_fields(id);
    doc.get_i64(ONCE_WRITER).ok() == Some(writer)
        && doc.get_i64(ONCE_SEQ).is_ok_and(|stored| stored >= seq)
}

/// Whether an existing collection's `listCollections` entry can serve as a keyed collection,
/// and whether its pre- and post-images still need switching on.
pub(crate) fn check_existing_keyed(name: &str, info: &BsonDoc) -> Result<bool> {
    let kind = info.get_str("type").unwrap_or("collection");
    if kind != "collection" {
        return Err(StoreError::Incompatible {
            collection: name.to_string(),
            problem: format!(
                "exists as a MongoDB {kind}, not a collection; drop it or choose another name"
            ),
        });
    }
    let empty = BsonDoc::new();
    let options = info.get_document("options").unwrap_or(&empty);
    if options.get_bool("capped").unwrap_or(false) {
        return Err(StoreError::Incompatible {
            collection: name.to_string(),
            problem: "is a capped collection, not a keyed one (capped collections refuse deletes \
                      and growing updates); choose another name"
                .into(),
        });
    }
    let images = options
        .get_document("changeStreamPreAndPostImages")
        .ok()
        .and_then(|d| d.get_bool("enabled").ok())
        .unwrap_or(false);
    Ok(!images)
}

/// Creates the keyed collection when absent (with pre- and post-images where the server has
/// them, so change events carry exact before and after documents), and switches the images on
/// for an existing one that lacks them. A server that refuses to switch them on (`collMod`
/// needs more than the `readWrite` role; some servers do not implement it) costs the before
/// images of this collection's changes, which is said once, and the collection is used as it
/// is.
pub(crate) async fn ensure_keyed(
    db: &Database,
    name: &str,
    capabilities: &Capabilities,
) -> Result<()> {
    ensure_keyed_collection(db, name, capabilities.before_images.is_yes()).await?;
    // Expiry reads the oldest writes first. The name is the one the server gives these keys
    // by default (what earlier versions created).
    ensure_indexes(
        &db.collection::<BsonDoc>(name),
        vec![(format!("{WRITTEN}_1"), doc! {WRITTEN: 1})],
    )
    .await
}

async fn ensure_keyed_collection(db: &Database, name: &str, images: bool) -> Result<()> {
    match collection_info(db, name).await? {
        None => {
            let mut create = db.create_collection(name);
            if images {
                create = create.change_stream_pre_and_post_images(
                    ChangeStreamPreAndPostImages::builder()
                        .enabled(true)
                        .build(),
                );
            }
            match create.await {
                Ok(()) => Ok(()),
                Err(e) if error_code(&e) == Some(NAMESPACE_EXISTS) => {
                    // Created meanwhile by another process: check it like any existing one.
                    Box::pin(ensure_keyed_collection(db, name, images)).await
                }
                Err(e) => Err(e.into()),
            }
        }
        Some(info) => {
            let needs_images = check_existing_keyed(name, &info)?;
            if needs_images && images {
                let switched = db
                    .run_command(doc! {
                        "collMod": name,
                        "changeStreamPreAndPostImages": {"enabled": true},
                    })
                    .await;
                match switched {
                    Ok(_) => {
                        tracing::info!(collection = %name, "enabled change-stream pre- and post-images");
                    }
                    Err(e) if classify(&e) == Class::Transient => return Err(e.into()),
                    Err(e) => Problem {
                        error_type: "collmod_refused",
                        detail: &format!(
                            "{name}: collMod to enable change-stream pre- and post-images was \
                             refused ({}): changes of this collection carry no before image \
                             (old_val), and an update's after image is the document when the \
                             change is read; a user with the dbAdmin role can run it once",
                            reply_of(&e)
                        ),
                    }
                    .warn(),
                }
            }
            Ok(())
        }
    }
}

/// The replacement document of `set`: the given fields under `_id = key` (a caller's own `_id`
/// field is replaced by the key, as the embedded engine does).
pub(crate) fn replacement(key: &str, doc: &Document, now: i64) -> BsonDoc {
    let mut out = doc! {"_id": key};
    for (k, v) in doc_to_bson(doc) {
        if k != "_id" && !ENGINE_FIELDS.contains(&k.as_str()) {
            out.insert(k, v);
        }
    }
    out.insert(WRITTEN, now);
    out
}

/// The filter of `scan(prefix)`: string keys starting with `prefix` (anchored, so the `_id`
/// index serves it as a range).
pub(crate) fn scan_filter(prefix: &str) -> BsonDoc {
    if prefix.is_empty() {
        doc! {"_id": {"$type": "string"}}
    } else {
        doc! {"_id": {"$regex": format!("^{}", regex_escape(prefix))}}
    }
}

/// The filter of `scan_page`: `scan_filter(prefix)` and keys after `after`.
pub(crate) fn scan_page_filter(prefix: &str, after: Option<&str>) -> BsonDoc {
    let mut filter = scan_filter(prefix);
    if let (Some(after), Ok(id)) = (after, filter.get_document_mut("_id")) {
        id.insert("$gt", after);
    }
    filter
}

/// The query of a snapshot: the client's filter, on string keys only (as `scan` reads).
pub(crate) fn snapshot_query(filter: Option<&Filter>) -> BsonDoc {
    let keys = doc! {"_id": {"$type": "string"}};
    match filter
        .filter(|f| !f.is_match_all())
        .map(|f| json_to_bson(&f.to_mongo("")))
    {
        Some(mongodb::bson::Bson::Document(f)) => doc! {"$and": [keys, f]},
        _ => keys,
    }
}

/// Update statements per `update` command. MongoDB takes up to 100,000 in one; FerretDB
/// (1.24, SQLite) holds a database connection for each statement until the command answers,
/// and a command of more statements than its pool has connections (100) hangs the whole
/// database. Chunks of 32 keep a batch's rollups to a few round trips on either.
const UPDATE_CHUNK: usize = 32;

/// An upsert failed inside a transaction: carried through the driver's transaction runner as
/// a custom error, so the transaction is aborted and the store error comes out unchanged.
struct UpdateFailed(StoreError);

/// A statement of an `update` command that failed: where it was in the command (ordered, so
/// the ones before it were applied and none after it ran), the server's code, and the error.
struct Refusal {
    index: usize,
    code: i32,
    error: StoreError,
}

/// What the reply of an `update` command says of its statements: `writeErrors` (the first
/// statement that failed) and `writeConcernError` (every statement applied, not yet as durable
/// as asked: a [`Refusal`] of index `usize::MAX`).
fn update_outcome(reply: &BsonDoc) -> std::result::Result<(), Refusal> {
    if let Some(first) = reply
        .get_array("writeErrors")
        .ok()
        .and_then(|errors| errors.first())
        .and_then(mongodb::bson::Bson::as_document)
    {
        let code = first.get_i32("code").unwrap_or(0);
        let index = first.get_i32("index").unwrap_or(0).max(0) as usize;
        let message = first.get_str("errmsg").unwrap_or("(no message)");
        return Err(Refusal {
            index,
            code,
            error: error_of_code(code, format!("update: code {code}: {message}")),
        });
    }
    if let Ok(wce) = reply.get_document("writeConcernError") {
        let code = wce.get_i32("code").unwrap_or(64);
        let message = wce.get_str("errmsg").unwrap_or("(no message)");
        return Err(Refusal {
            index: usize::MAX,
            code,
            error: StoreError::Unavailable {
                engine: "mongodb",
                message: format!("write concern: code {code}: {message}"),
            },
        });
    }
    Ok(())
}

/// An error after `applied` updates of a request were applied for good (no transaction to
/// undo them): [`StoreError::PartlyWritten`] when any were, so a caller retries from the
/// first update not applied instead of applying the others twice.
fn after_applied(applied: usize, error: StoreError) -> StoreError {
    if applied == 0 {
        error
    } else {
        StoreError::PartlyWritten {
            written: applied,
            error: Box::new(error),
        }
    }
}

/// One upsert as sent: its key, its update document (stamped: [`stamped_update`]), its name
/// if the caller gave one, and whether it may have landed already (sent before in a request
/// that did not succeed: [`Inner::unsettled`]).
#[derive(Clone, Debug)]
struct Upsert {
    key: String,
    update: BsonDoc,
    once: Option<WriteId>,
    guard: bool,
}

/// The `update` command of a chunk of upserts: each key's `{q, u, upsert}` statement, in order
/// (`ordered`: a statement runs only after the ones before it). Outside a transaction
/// (`in_transaction` false) a guarded upsert's filter also asks that the document not show it
/// applied ([`shows_applied`]): sent again after it landed, it matches nothing, and its upsert
/// is refused as a duplicate `_id`.
fn update_command(
    collection: &str,
    chunk: &[Upsert],
    wc: Option<&BsonDoc>,
    in_transaction: bool,
) -> BsonDoc {
    let updates: Vec<mongodb::bson::Bson> = chunk
        .iter()
        .map(|op| {
            let mut q = doc! {"_id": op.key.as_str()};
            if let (true, false, Some(id)) = (op.guard, in_transaction, op.once) {
                let (writer, seq) = once_fields(id);
                q.insert(
                    "$or",
                    vec![
                        doc! {ONCE_WRITER: {"$ne": writer}},
                        doc! {ONCE_SEQ: {"$lt": seq}},
                    ],
                );
            }
            mongodb::bson::Bson::Document(doc! {
                "q": q,
                "u": op.update.clone(),
                "upsert": true,
            })
        })
        .collect();
    let mut cmd = doc! {"update": collection, "updates": updates, "ordered": true};
    if let Some(wc) = wc {
        cmd.insert("writeConcern", wc.clone());
    }
    cmd
}

/// The `update` commands of a batch of upserts, in order, [`UPDATE_CHUNK`] to a command.
fn update_commands(
    collection: &str,
    ops: &[Upsert],
    wc: Option<&BsonDoc>,
    in_transaction: bool,
) -> Vec<BsonDoc> {
    ops.chunks(UPDATE_CHUNK)
        .map(|chunk| update_command(collection, chunk, wc, in_transaction))
        .collect()
}

/// How often a guarded upsert refused as a duplicate `_id` whose document does not show it
/// applied is sent again (another writer created the key between its filter and its insert;
/// sent again, it finds the document) before the refusal is handed back.
const GUARD_RETRIES: usize = 3;

/// Applies upserts in order, in one `update` command per [`UPDATE_CHUNK`] keys: one round trip
/// for a batch's rollups, not one per key. Several keys go into one transaction, so the batch
/// commits at once (one journal flush, all or nothing) as the contract's "in one commit" says;
/// one key needs none (a single-document write is atomic). On a server without transactions
/// (not a replica set, or one that refuses `startTransaction`:
/// [`crate::Capability::Transactions`]) the commands run without one: each key's write is
/// atomic, the batch is not.
///
/// Guarded upserts ([`Upsert::guard`]) that landed before are skipped: without a transaction by
/// the guard in their filter ([`update_command`]), which the server evaluates with the write;
/// in a transaction (where a refused statement would abort it) by reading the documents' names
/// first, in the transaction's snapshot. The others go out as plain upserts: on the way every
/// write takes, a name costs one `$set` of two fields.
async fn run_updates(
    inner: Arc<Inner>,
    coll: Collection<BsonDoc>,
    ops: Vec<Upsert>,
    wc: WriteConcern,
) -> Result<()> {
    if ops.len() == 1 || !inner.capabilities.transactions.is_yes() {
        return run_updates_one_by_one(&inner.db, &coll, &ops, &wc).await;
    }
    let db = &inner.db;
    let mut session = inner.client.start_session().await?;
    // `and_run` retries the whole transaction on TransientTransactionError and the commit on
    // UnknownTransactionCommitResult (up to 120 s), as the driver's transaction spec says.
    let ran = session
        .start_transaction()
        .write_concern(wc)
        .and_run((db, &coll, &ops), |session, (db, coll, ops)| {
            async move {
                let applied = applied_before(coll, ops, session).await?;
                let todo: Vec<Upsert> = ops
                    .iter()
                    .filter(|op| {
                        !(op.guard
                            && op.once.is_some_and(|id| {
                                applied.get(&op.key).is_some_and(|d| shows_applied(d, id))
                            }))
                    })
                    .cloned()
                    .collect();
                // Inside a transaction the write concern belongs to the commit, not to each
                // command.
                for cmd in update_commands(coll.name(), &todo, None, true) {
                    let reply = db.run_command(cmd).session(&mut *session).await?;
                    if let Err(refusal) = update_outcome(&reply) {
                        return Err(mongodb::error::Error::custom(Arc::new(UpdateFailed(
                            refusal.error,
                        ))));
                    }
                }
                Ok(())
            }
            .boxed()
        })
        .await;
    match ran {
        Ok(()) => Ok(()),
        Err(e) => match e.get_custom::<Arc<UpdateFailed>>() {
            Some(failed) => Err(failed.0.duplicate("mongodb")),
            None => Err(e.into()),
        },
    }
}

/// The documents, as far as their names go ([`ONCE_WRITER`], [`ONCE_SEQ`]), of the keys of
/// `ops`' guarded upserts, read in `session`'s transaction.
async fn applied_before(
    coll: &Collection<BsonDoc>,
    ops: &[Upsert],
    session: &mut mongodb::ClientSession,
) -> mongodb::error::Result<std::collections::HashMap<String, BsonDoc>> {
    let mut keys: Vec<&str> = ops
        .iter()
        .filter(|op| op.guard)
        .map(|op| op.key.as_str())
        .collect();
    keys.sort_unstable();
    keys.dedup();
    let mut found = std::collections::HashMap::new();
    if keys.is_empty() {
        return Ok(found);
    }
    let mut cursor = coll
        .find(doc! {"_id": {"$in": keys}})
        .projection(doc! {ONCE_WRITER: 1, ONCE_SEQ: 1})
        .session(&mut *session)
        .await?;
    while let Some(doc) = cursor.next(&mut *session).await {
        let doc = doc?;
        if let Ok(key) = doc.get_str("_id") {
            found.insert(key.to_string(), doc);
        }
    }
    Ok(found)
}

/// [`run_updates`] without a transaction: command after command.
async fn run_updates_one_by_one(
    db: &Database,
    coll: &Collection<BsonDoc>,
    ops: &[Upsert],
    wc: &WriteConcern,
) -> Result<()> {
    let wc = mongodb::bson::serialize_to_document(wc)
        .map_err(|e| engine_err(format!("write concern: {e}")))?;
    // The upserts before `next` are applied.
    let mut next = 0;
    let mut guard_retries = 0;
    while next < ops.len() {
        let chunk = &ops[next..ops.len().min(next + UPDATE_CHUNK)];
        let reply = db
            .run_command(update_command(coll.name(), chunk, Some(&wc), false))
            .await
            .map_err(|e| after_applied(next, e.into()))?;
        let refusal = match update_outcome(&reply) {
            Ok(()) => {
                next += chunk.len();
                continue;
            }
            // A write concern error: every statement of the command was applied.
            Err(r) if r.index == usize::MAX => {
                return Err(after_applied(next + chunk.len(), r.error));
            }
            Err(r) => r,
        };
        next += refusal.index.min(chunk.len());
        let guarded = chunk
            .get(refusal.index)
            .filter(|op| op.guard)
            .and_then(|op| op.once);
        match guarded {
            Some(id) if refusal.code == DUPLICATE_KEY => {
                // The guard matched nothing: the upsert landed before (a reply lost), or
                // another writer created the key meanwhile. The document tells which.
                let key = &ops[next].key;
                let stored = coll
                    .find_one(doc! {"_id": key.as_str()})
                    .projection(doc! {ONCE_WRITER: 1, ONCE_SEQ: 1})
                    .await
                    .map_err(|e| after_applied(next, e.into()))?;
                if stored.as_ref().is_some_and(|d| shows_applied(d, id)) {
                    next += 1;
                } else if guard_retries < GUARD_RETRIES {
                    guard_retries += 1;
                } else {
                    return Err(after_applied(next, refusal.error));
                }
            }
            _ => return Err(after_applied(next, refusal.error)),
        }
    }
    Ok(())
}

/// The names of a request of named upserts, marked unsettled ([`Inner::unsettled`]) before it
/// is sent and settled when it succeeds: a request that fails, or is dropped on its way, leaves
/// them marked, and a request that sends them again guards them.
struct Sent {
    inner: Arc<Inner>,
    /// Per writer, the newest sequence number of the request.
    newest: Vec<(u64, u64)>,
}

impl Sent {
    fn mark(inner: &Arc<Inner>, ops: &[Upsert]) -> Result<Sent> {
        let mut newest: Vec<(u64, u64)> = Vec::new();
        for id in ops.iter().filter_map(|op| op.once) {
            match newest.iter_mut().find(|(w, _)| *w == id.writer) {
                Some((_, seq)) => *seq = (*seq).max(id.seq),
                None => newest.push((id.writer, id.seq)),
            }
        }
        if !newest.is_empty() {
            let mut unsettled = inner.unsettled.lock().map_err(lock_err)?;
            for &(writer, seq) in &newest {
                let upto = unsettled.entry(writer).or_insert(seq);
                *upto = (*upto).max(seq);
            }
        }
        Ok(Sent {
            inner: inner.clone(),
            newest,
        })
    }

    /// The request succeeded: a writer's names up to its newest are settled (those sent again
    /// in it were guarded; the ones after it were not sent yet).
    fn settled(self) {
        if self.newest.is_empty() {
            return;
        }
        if let Ok(mut unsettled) = self.inner.unsettled.lock() {
            for (writer, seq) in &self.newest {
                if unsettled.get(writer).is_some_and(|upto| upto <= seq) {
                    unsettled.remove(writer);
                }
            }
        }
    }
}

/// A changefeed-backed collection of the MongoDB engine.
pub(crate) struct MongoKeyed {
    pub(crate) name: String,
    pub(crate) inner: Arc<Inner>,
    pub(crate) coll: Collection<BsonDoc>,
}

impl MongoKeyed {
    fn wc(&self, durability: Durability) -> WriteConcern {
        write_concern(durability, self.inner.options.write_timeout)
    }
}

#[async_trait]
impl Keyed for MongoKeyed {
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
        for u in &updates {
            crate::names::check_key(&self.name, &u.key)?;
        }
        let now = now_us();
        let unsettled = self.inner.unsettled.lock().map_err(lock_err)?.clone();
        let ops = updates
            .into_iter()
            .map(|u| {
                Ok(Upsert {
                    update: stamped_update(update_document(&u.update)?, now, u.once),
                    key: u.key,
                    once: u.once,
                    guard: u.once.is_some_and(|id| {
                        unsettled
                            .get(&id.writer)
                            .is_some_and(|&upto| id.seq <= upto)
                    }),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        // Until the request succeeds, its names may have landed or not.
        let sent = Sent::mark(&self.inner, &ops)?;
        self.inner.wait_for_opening_streams().await;
        let inner = self.inner.clone();
        let coll = self.coll.clone();
        let wc = self.wc(durability);
        let write = async move {
            let done = run_updates(inner.clone(), coll, ops, wc).await;
            inner.keyed_written.send_modify(|n| *n += 1);
            if done.is_ok() {
                sent.settled();
            }
            done
        };
        if durability.waits() {
            return write.await;
        }
        let name = self.name.clone();
        self.inner
            .background(async move {
                if let Err(e) = write.await {
                    Problem {
                        error_type: "unacknowledged_write",
                        detail: &format!(
                            "{name}: an unacknowledged update failed ({e}); it is lost"
                        ),
                    }
                    .error();
                }
            })
            .await
    }

    async fn set(&self, key: &str, doc: Document, durability: Durability) -> Result<()> {
        crate::names::check_key(&self.name, key)?;
        let replacement = replacement(key, &doc, now_us());
        self.inner.wait_for_opening_streams().await;
        let (coll, wc, owned_key) = (self.coll.clone(), self.wc(durability), key.to_string());
        let inner = self.inner.clone();
        let write = async move {
            let done = coll
                .replace_one(doc! {"_id": owned_key}, replacement)
                .upsert(true)
                .write_concern(wc)
                .await;
            inner.keyed_written.send_modify(|n| *n += 1);
            done
        };
        if durability.waits() {
            write.await?;
            return Ok(());
        }
        let (name, key) = (self.name.clone(), key.to_string());
        self.inner
            .background(async move {
                if let Err(e) = write.await {
                    Problem {
                        error_type: "unacknowledged_write",
                        detail: &format!(
                            "{name}: an unacknowledged set of {key:?} failed ({e}); it is lost"
                        ),
                    }
                    .error();
                }
            })
            .await
    }

    async fn delete(&self, key: &str, durability: Durability) -> Result<bool> {
        crate::names::check_key(&self.name, key)?;
        self.inner.wait_for_opening_streams().await;
        let (coll, wc, owned_key) = (self.coll.clone(), self.wc(durability), key.to_string());
        let inner = self.inner.clone();
        let write = async move {
            let done = coll
                .delete_one(doc! {"_id": owned_key})
                .write_concern(wc)
                .await;
            inner.keyed_written.send_modify(|n| *n += 1);
            done
        };
        if durability.waits() {
            return Ok(write.await?.deleted_count > 0);
        }
        let (name, key) = (self.name.clone(), key.to_string());
        self.inner
            .background(async move {
                if let Err(e) = write.await {
                    Problem {
                        error_type: "unacknowledged_write",
                        detail: &format!(
                            "{name}: an unacknowledged delete of {key:?} failed ({e}); it is lost"
                        ),
                    }
                    .error();
                }
            })
            .await?;
        // Like the embedded engine: nobody waited, so nobody knows whether it existed.
        Ok(false)
    }

    async fn expire(
        &self,
        prefix: &str,
        written_before_us: i64,
        limit: usize,
        durability: Durability,
    ) -> Result<u64> {
        if limit == 0 {
            return Ok(0);
        }
        let mut idle = scan_filter(prefix);
        idle.insert(WRITTEN, doc! {"$lt": written_before_us});
        let mut cursor = self
            .coll
            .find(idle.clone())
            .sort(doc! {WRITTEN: 1})
            .limit(i64::try_from(limit).unwrap_or(i64::MAX))
            .projection(doc! {"_id": 1})
            .await?;
        let mut ids = Vec::new();
        while let Some(d) = cursor.next().await {
            if let Some(id) = d?.get("_id") {
                ids.push(id.clone());
            }
        }
        if ids.is_empty() {
            return Ok(0);
        }
        self.inner.wait_for_opening_streams().await;
        // Still idle at delete time: a key written meanwhile stays.
        idle.insert("_id", doc! {"$in": ids});
        let deleted = self
            .coll
            .delete_many(idle)
            .write_concern(self.wc(durability))
            .await;
        self.inner.keyed_written.send_modify(|n| *n += 1);
        Ok(deleted?.deleted_count)
    }

    async fn get(&self, key: &str) -> Result<Option<Document>> {
        if key.len() > crate::MAX_KEY_BYTES {
            // No such key is ever stored (the store refuses them), and a server may refuse
            // the query.
            return Ok(None);
        }
        let doc = self.coll.find_one(doc! {"_id": key}).await?;
        Ok(doc.map(keyed_doc_to_json))
    }

    async fn scan(&self, prefix: &str) -> Result<Vec<KeyedDoc>> {
        // Without a collation MongoDB compares strings bytewise (UTF-8), as the embedded engine
        // does, so both return keys in the same order.
        let mut cursor = self
            .coll
            .find(scan_filter(prefix))
            .sort(doc! {"_id": 1})
            .await?;
        let mut out = Vec::new();
        while let Some(doc) = cursor.next().await {
            let doc = doc?;
            let key = doc.get("_id").map(key_string).unwrap_or_default();
            out.push(KeyedDoc {
                key,
                doc: keyed_doc_to_json(doc),
            });
        }
        Ok(out)
    }

    async fn scan_page(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<KeyedDoc>> {
        if limit == 0 {
            // MongoDB reads `limit(0)` as "no limit".
            return Ok(Vec::new());
        }
        let mut cursor = self
            .coll
            .find(scan_page_filter(prefix, after))
            .sort(doc! {"_id": 1})
            .limit(i64::try_from(limit).unwrap_or(i64::MAX))
            .await?;
        let mut out = Vec::new();
        while let Some(doc) = cursor.next().await {
            let doc = doc?;
            let key = doc.get("_id").map(key_string).unwrap_or_default();
            out.push(KeyedDoc {
                key,
                doc: keyed_doc_to_json(doc),
            });
        }
        Ok(out)
    }

    /// A snapshot session (`readConcern: snapshot`): the first batch fixes the snapshot's
    /// cluster time, every later batch of the cursor reads at that same time, and the change
    /// stream continues strictly after it (`startAtOperationTime` = that time's next tick,
    /// through an oplog-position token). Needs a replica set; the server keeps a snapshot for
    /// `minSnapshotHistoryWindowInSeconds` (300 s by default), so a reader slower than that
    /// gets `SnapshotTooOld` as an error of the stream.
    async fn snapshot(&self, filter: Option<Filter>) -> Result<KeyedSnapshot> {
        if let Some(e) = self.inner.unsupported(Capability::SnapshotReads) {
            return Err(e);
        }
        // Where the server does not evaluate filters as MongoDB does, it reads the keys and
        // the filter runs here.
        let (on_server, here) = match filter {
            Some(f) if !self.inner.capabilities.server_filters.is_yes() => (None, Some(f)),
            f => (f, None),
        };
        let mut session = self.inner.client.start_session().snapshot(true).await?;
        let mut cursor = self
            .coll
            .find(snapshot_query(on_server.as_ref()))
            .sort(doc! {"_id": 1})
            .batch_size(SNAPSHOT_BATCH)
            .session(&mut session)
            .await?;
        let at = session.snapshot_time().ok_or_else(|| {
            engine_err("the server gave no snapshot time for a snapshot read (not a replica set?)")
        })?;
        let token = encode_token(&Token::Oplog(OplogPos::entry(at)))?;
        let docs = async_stream::try_stream! {
            while let Some(doc) = cursor.next(&mut session).await {
                let doc = doc?;
                let key = doc.get("_id").map(key_string).unwrap_or_default();
                let doc = keyed_doc_to_json(doc);
                if here.as_ref().is_none_or(|f| f.matches(&doc)) {
                    yield KeyedDoc { key, doc };
                }
            }
        };
        Ok(KeyedSnapshot {
            token,
            docs: Box::pin(docs),
        })
    }

    fn changes(&self, mut filter: ChangeFilter, start: ChangeStart) -> ChangeStream {
        filter.collections = vec![self.name.clone()];
        self.inner.changes(filter, start)
    }

    fn server_query(&self) -> Option<Arc<dyn crate::query::ServerQuery>> {
        Some(Arc::new(super::query::MongoQuery {
            inner: self.inner.clone(),
            coll: self.coll.clone(),
            keyed: true,
        }))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
