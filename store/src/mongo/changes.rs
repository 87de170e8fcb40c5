//! Change streams: the `$match` pipeline built from a [`ChangeFilter`], change events mapped to
//! [`Change`], and the stream that follows them (re-opening after network trouble, ending with
//! `HistoryLost` when the resume point left the oplog).

use crate::telemetry::Problem;
use std::sync::{Arc, Mutex};

use futures::FutureExt;
use futures::future::BoxFuture;
use mongodb::bson::{Bson, Document as BsonDoc, Timestamp, doc};
use mongodb::change_stream::ChangeStream as DriverStream;
use mongodb::change_stream::event::{
    ChangeStreamEvent, OperationType, ResumeToken as DriverToken, UpdateDescription,
};
use mongodb::options::{FullDocumentBeforeChangeType, FullDocumentType};
use tokio::sync::{oneshot, watch};

use super::convert::{
    Class, OplogPos, Token, bson_to_json, classify, decode_token, encode_token, engine_err,
    json_to_bson, key_string, map_error, regex_escape, reply_of,
};
use super::keyed::{ENGINE_FIELDS, keyed_doc_to_json};
use super::oplog::oldest_entry;
use super::token::{TokenCell, publish, publish_if_unset};
use super::{BACKOFF_MAX, BACKOFF_MIN, CHECKPOINTS, Inner, sleep_unless_closed};
use crate::backoff::Backoff;
use crate::clock::now_us;
use crate::{
    Capability, Change, ChangeFilter, ChangeOp, ChangeStart, ChangeStream, Document, Result,
    ResumeToken, StoreError, Update,
};

/// How often `ChangeStart::Oldest` retries when the oplog was truncated between reading its
/// oldest entry and opening the stream there.
const OLDEST_ATTEMPTS: usize = 3;

type Events = DriverStream<ChangeStreamEvent<BsonDoc>>;

/// The `operationType` of a [`ChangeOp`].
pub(crate) fn op_name(op: ChangeOp) -> &'static str {
    match op {
        ChangeOp::Insert => "insert",
        ChangeOp::Update => "update",
        ChangeOp::Replace => "replace",
        ChangeOp::Delete => "delete",
    }
}

/// The `$match` stage of a filter. It pre-filters on the server (the stream then filters
/// again with [`ChangeFilter::matches`], so both engines mean exactly the same):
/// - only insert/update/replace/delete events (restricted to `ops` when given);
/// - `ns.coll` in `collections`, or, when empty, every collection but `checkpoints`;
/// - string keys only (`documentKey._id` of type string): capped collections, whose `_id` is
///   an integer position, are never changefeed-backed collections;
/// - the key prefix as an anchored, escaped regex on `documentKey._id`;
/// - the document filter ([`crate::Filter::to_mongo`]) on the image the contract names: the
///   post-image `fullDocument.` of inserts, updates and replaces, the pre-image
///   `fullDocumentBeforeChange.` of deletes. A delete event has no `fullDocument`, so one
///   prefix for every event would test deletes against a missing document (`{lang: "ja"}`
///   would drop every delete, `{lang: {$ne: "ja"}}` would keep every one). Before MongoDB 6.0
///   there is no pre-image: a delete then matches only a filter that holds on an empty
///   document here, and the in-process check drops it (no image, no match).
pub(crate) fn match_stage(filter: &ChangeFilter, server_filters: bool) -> Result<BsonDoc> {
    let ops: Vec<Bson> = if filter.ops.is_empty() {
        [
            ChangeOp::Insert,
            ChangeOp::Update,
            ChangeOp::Replace,
            ChangeOp::Delete,
        ]
        .into_iter()
        .map(|o| Bson::from(op_name(o)))
        .collect()
    } else {
        filter.ops.iter().map(|o| Bson::from(op_name(*o))).collect()
    };
    let mut m = doc! {"operationType": {"$in": ops}};
    if filter.collections.is_empty() {
        m.insert("ns.coll", doc! {"$ne": CHECKPOINTS});
    } else {
        let colls: Vec<Bson> = filter
            .collections
            .iter()
            .map(|c| Bson::from(c.as_str()))
            .collect();
        m.insert("ns.coll", doc! {"$in": colls});
    }
    let mut key = doc! {"$type": "string"};
    if let Some(prefix) = filter.key_prefix.as_deref().filter(|p| !p.is_empty()) {
        key.insert("$regex", format!("^{}", regex_escape(prefix)));
    }
    m.insert("documentKey._id", key);
    // A server that evaluates filters otherwise than MongoDB gets none: every change of the
    // collections comes back, and the in-process check alone decides.
    if let Some(f) = filter.document_filter().filter(|_| server_filters) {
        let on = |prefix: &str, ops: Bson| -> BsonDoc {
            let mut branch = doc! {"operationType": ops};
            if let Bson::Document(q) = json_to_bson(&f.to_mongo(prefix)) {
                branch.extend(q);
            }
            branch
        };
        m.insert(
            "$or",
            vec![
                Bson::Document(on("fullDocument.", Bson::Document(doc! {"$ne": "delete"}))),
                Bson::Document(on("fullDocumentBeforeChange.", Bson::from("delete"))),
            ],
        );
    }
    Ok(doc! {"$match": m})
}

/// Removes a dotted path from a document; `None` when a part on the way is not an object.
fn remove_path(doc: &mut Document, path: &str) -> Option<()> {
    let mut parts: Vec<&str> = path.split('.').collect();
    let last = parts.pop()?;
    let mut cur = doc;
    for part in parts {
        match cur.get_mut(part) {
            Some(v) => cur = v.as_object_mut()?,
            None => return Some(()),
        }
    }
    cur.remove(last);
    Some(())
}

/// An update's after image rebuilt from its before image and the event's update description,
/// for when the server has no post-image (collection without `changeStreamPreAndPostImages`,
/// or an expired one). `None` when it cannot be rebuilt exactly (truncated arrays, paths
/// through arrays).
pub(crate) fn rebuild_after(before: &Document, desc: &UpdateDescription) -> Option<Document> {
    if desc
        .truncated_arrays
        .as_ref()
        .is_some_and(|t| !t.is_empty())
    {
        return None;
    }
    let mut after = before.clone();
    let set = Update {
        inc: vec![],
        set: desc
            .updated_fields
            .iter()
            .map(|(k, v)| (k.clone(), bson_to_json(v.clone())))
            .collect(),
    };
    crate::update::apply(&mut after, &set).ok()?;
    for path in &desc.removed_fields {
        remove_path(&mut after, path)?;
    }
    Some(after)
}

/// Maps one change event. `Ok(None)` for events that are not changes of documents (drop,
/// rename, create, ...); an `invalidate` event ends the stream with an error.
pub(crate) fn to_change(event: ChangeStreamEvent<BsonDoc>) -> Result<Option<Change>> {
    let op = match event.operation_type {
        OperationType::Insert => ChangeOp::Insert,
        OperationType::Update => ChangeOp::Update,
        OperationType::Replace => ChangeOp::Replace,
        OperationType::Delete => ChangeOp::Delete,
        OperationType::Invalidate => {
            return Err(engine_err(
                "the change stream was invalidated (its database was dropped or renamed); \
                 open a new one",
            ));
        }
        _ => return Ok(None),
    };
    let collection = event
        .ns
        .as_ref()
        .and_then(|ns| ns.coll.clone())
        .unwrap_or_default();
    let key = event
        .document_key
        .as_ref()
        .and_then(|k| k.get("_id"))
        .map(key_string)
        .ok_or_else(|| engine_err(format!("a {} event without documentKey._id", op.as_str())))?;
    let before = event.full_document_before_change.map(keyed_doc_to_json);
    let after = match op {
        ChangeOp::Delete => None,
        ChangeOp::Update => match event.full_document {
            Some(d) => Some(keyed_doc_to_json(d)),
            None => before
                .as_ref()
                .zip(event.update_description.as_ref())
                .and_then(|(b, desc)| rebuild_after(b, desc))
                .map(|mut d| {
                    for field in ENGINE_FIELDS {
                        d.remove(field);
                    }
                    d
                }),
        },
        ChangeOp::Insert | ChangeOp::Replace => event.full_document.map(keyed_doc_to_json),
    };
    let committed_at_us = event
        .wall_time
        .map(|w| w.timestamp_millis().saturating_mul(1000))
        .or_else(|| {
            event
                .cluster_time
                .map(|t| i64::from(t.time).saturating_mul(1_000_000))
        })
        .unwrap_or_else(now_us);
    Ok(Some(Change {
        op,
        collection,
        key,
        before: before.map(Arc::new),
        after: after.map(Arc::new),
        token: encode_token(&Token::Stream(event.id))?,
        committed_at_us,
    }))
}

/// Where a change stream (re)opens.
#[derive(Clone, Debug)]
enum StartAt {
    /// No start option: the server's present.
    Now,
    /// `startAtOperationTime`.
    OpTime(Timestamp),
    /// `startAfter` (not `resumeAfter`: it also passes an `invalidate`).
    After(DriverToken),
}

async fn open(
    inner: &Inner,
    pipeline: &[BsonDoc],
    from: &StartAt,
) -> mongodb::error::Result<Events> {
    let images = inner.capabilities.before_images.is_yes();
    // With pre- and post-images (MongoDB 6.0+) an update's `fullDocument` is its exact
    // post-image; `UpdateLookup` would read the document when the event is read, which can
    // be a later version or gone (the contract needs the document right after the change).
    let mut watch = inner
        .db
        .watch()
        .pipeline(pipeline.iter().cloned())
        .full_document(if images {
            FullDocumentType::WhenAvailable
        } else {
            FullDocumentType::UpdateLookup
        })
        .max_await_time(inner.options.max_await_time);
    if images {
        watch = watch.full_document_before_change(FullDocumentBeforeChangeType::WhenAvailable);
    }
    match from {
        StartAt::Now => watch.await,
        StartAt::OpTime(ts) => watch.start_at_operation_time(*ts).await,
        StartAt::After(t) => watch.start_after(t.clone()).await,
    }
}

/// Where a [`ChangeStart`] begins, resolved against the server.
async fn resolve(inner: &Inner, start: &ChangeStart) -> Result<StartAt> {
    Ok(match start {
        ChangeStart::Now => StartAt::Now,
        ChangeStart::Oldest => {
            let oldest = oldest_entry(inner).await?.ok_or_else(|| {
                engine_err(
                    "ChangeStart::Oldest needs the oplog (local.oplog.rs), which this server \
                     does not have or this user cannot read",
                )
            })?;
            StartAt::OpTime(oldest.ts)
        }
        ChangeStart::After(t) => match decode_token(t)? {
            Token::Stream(t) => StartAt::After(t),
            Token::Oplog(p) => StartAt::OpTime(p.resume_operation_time()),
        },
    })
}

/// `HistoryLost` for a resume point, naming the oldest retained oplog entry (as a token that
/// resumes right before it) when the oplog is readable.
pub(crate) async fn history_lost(inner: &Inner, token: ResumeToken) -> StoreError {
    let oldest = match oldest_entry(inner).await {
        Ok(Some(e)) => encode_token(&Token::Oplog(OplogPos::before(e.ts)))
            .unwrap_or_else(|_| ResumeToken("(unknown)".into())),
        _ => ResumeToken("(unknown)".into()),
    };
    StoreError::HistoryLost { token, oldest }
}

fn encode_driver(token: Option<DriverToken>) -> Option<ResumeToken> {
    token.and_then(|t| encode_token(&Token::Stream(t)).ok())
}

/// The first open: resolves the start and opens the stream.
async fn open_first(
    inner: &Inner,
    pipeline: &[BsonDoc],
    start: &ChangeStart,
) -> Result<(Events, StartAt)> {
    let given = match start {
        ChangeStart::After(t) => Some(t.clone()),
        _ => None,
    };
    let mut attempt = 0;
    loop {
        attempt += 1;
        let from = resolve(inner, start).await?;
        match open(inner, pipeline, &from).await {
            Ok(events) => return Ok((events, from)),
            Err(e) if classify(&e) == Class::HistoryLost => {
                // `Oldest` raced the oplog's truncation: read the new oldest and try again.
                if matches!(start, ChangeStart::Oldest) && attempt < OLDEST_ATTEMPTS {
                    continue;
                }
                let token = given.unwrap_or_else(|| ResumeToken("(oldest)".into()));
                return Err(history_lost(inner, token).await);
            }
            Err(e) => return Err(map_open_error(e)),
        }
    }
}

/// An error opening a change stream: a server without them says so here (for a server whose
/// probe said yes and that then refuses, e.g. after a downgrade).
fn map_open_error(e: mongodb::error::Error) -> StoreError {
    if classify(&e) == Class::Unsupported {
        return StoreError::Unsupported {
            capability: Capability::ChangeStreams,
            reply: reply_of(&e),
        };
    }
    map_error(e)
}

/// A change stream on the database. Opening starts at once (in a task) when called inside a
/// Tokio runtime, and keyed writes issued after this call wait until it is open: so
/// `ChangeStart::Now` means "when `changes` was called", as with the embedded engine.
/// Outside a runtime the stream opens on its first poll.
///
/// The stream's resume token (the contract's read-up-to cell) is the token of the change
/// being handed over, or, after a server batch that held nothing for this filter, MongoDB's
/// post-batch token: so it advances past filtered-out changes and on a quiet stream.
pub(crate) fn change_stream(
    inner: Arc<Inner>,
    filter: ChangeFilter,
    start: ChangeStart,
) -> ChangeStream {
    if let Some(e) = inner.unsupported(Capability::ChangeStreams) {
        return ChangeStream::failed(e);
    }
    let server_filters = inner.capabilities.server_filters.is_yes();
    let pipeline = match match_stage(&filter, server_filters) {
        Ok(stage) => vec![stage],
        Err(e) => return ChangeStream::failed(e),
    };
    let given = match &start {
        ChangeStart::After(t) => Some(t.clone()),
        _ => None,
    };
    let cell: TokenCell = Arc::new(Mutex::new(given.clone()));
    let opened: BoxFuture<'static, Result<(Events, StartAt)>> =
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                let guard = inner.begin_opening();
                let (tx, rx) = oneshot::channel();
                let (i, p, s, c) = (inner.clone(), pipeline.clone(), start.clone(), cell.clone());
                handle.spawn(async move {
                    let opened = open_first(&i, &p, &s).await;
                    if let Ok((events, _)) = &opened {
                        // `Now`: the position the stream opened at is already a valid
                        // checkpoint, before any change arrives.
                        publish_if_unset(&c, encode_driver(events.resume_token()));
                    }
                    // The stream may be gone already: then the opened one is dropped (killed).
                    let _ = tx.send(opened);
                    drop(guard);
                });
                async move { rx.await.map_err(|_| StoreError::Closed)? }.boxed()
            }
            Err(_) => {
                let (i, p, s) = (inner.clone(), pipeline.clone(), start.clone());
                async move { open_first(&i, &p, &s).await }.boxed()
            }
        };
    let tokens = cell.clone();
    let stream = async_stream::try_stream! {
        let mut closed = inner.closed.subscribe();
        let (mut events, first_from) = opened.await?;
        publish_if_unset(&tokens, encode_driver(events.resume_token()));
        let mut backoff = Backoff::new(BACKOFF_MIN, BACKOFF_MAX);
        loop {
            // `next_if_any` makes at most one getMore (which the server holds for up to
            // `max_await_time`), so the post-batch token is seen even on a quiet stream.
            let step = tokio::select! {
                biased;
                _ = closed.wait_for(|c| *c) => None,
                r = events.next_if_any() => Some(r),
            };
            let Some(step) = step else {
                Err(StoreError::Closed)?;
                break;
            };
            match step {
                Ok(Some(event)) => {
                    backoff.reset();
                    let change = to_change(event)?;
                    // The event's own token (the driver's token is the current event's while
                    // its batch lasts): set before the hand-over, read by the consumer after.
                    publish(&tokens, encode_driver(events.resume_token()));
                    if let Some(change) = change.filter(|c| filter.matches(c)) {
                        yield filter.shape(change);
                    }
                }
                Ok(None) => {
                    // An empty batch: the post-batch token covers everything the server
                    // scanned, including changes the `$match` dropped.
                    publish(&tokens, encode_driver(events.resume_token()));
                    if !events.is_alive() {
                        Err(engine_err(
                            "the server closed the change stream (invalidated: its database \
                             was dropped or renamed)",
                        ))?;
                    }
                }
                Err(e) => match classify(&e) {
                    // Not resumable: never re-watch with the same token (that loops forever).
                    Class::HistoryLost => {
                        let token = given
                            .clone()
                            .or_else(|| encode_driver(events.resume_token()))
                            .unwrap_or_else(|| ResumeToken("(unknown)".into()));
                        Err(history_lost(&inner, token).await)?;
                    }
                    // The driver already resumed once on resumable errors; this is an outage
                    // that outlasted it. Re-open after the newest token, with backoff.
                    Class::Transient => {
                        Problem {
                            error_type: "change_stream_reopen",
                            detail: &format!("a change stream failed ({e}); re-opening after its last token"),
                        }
                        .warn();
                        let from = match events.resume_token() {
                            Some(t) => StartAt::After(t),
                            None => first_from.clone(),
                        };
                        events = reopen(&inner, &pipeline, &from, &mut closed, &mut backoff).await?;
                    }
                    _ => Err(map_error(e))?,
                },
            }
        }
    };
    ChangeStream::new(Box::pin(stream), cell)
}

/// Re-opens after a transient failure, backing off, until it works or the store closes.
async fn reopen(
    inner: &Inner,
    pipeline: &[BsonDoc],
    from: &StartAt,
    closed: &mut watch::Receiver<bool>,
    backoff: &mut Backoff,
) -> Result<Events> {
    loop {
        if !sleep_unless_closed(closed, backoff.next_wait()).await {
            return Err(StoreError::Closed);
        }
        match open(inner, pipeline, from).await {
            Ok(events) => return Ok(events),
            Err(e) => match classify(&e) {
                Class::Transient => {
                    Problem {
                        error_type: "change_stream_reopen",
                        detail: &format!("a change stream cannot re-open yet ({e}); retrying"),
                    }
                    .warn();
                }
                Class::HistoryLost => {
                    let token = match from {
                        StartAt::After(t) => encode_driver(Some(t.clone())),
                        _ => None,
                    }
                    .unwrap_or_else(|| ResumeToken("(unknown)".into()));
                    return Err(history_lost(inner, token).await);
                }
                _ => return Err(map_open_error(e)),
            },
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::Filter;
    use mongodb::bson::{self, DateTime};
    use serde_json::{Value, json};

    #[test]
    fn filters_become_one_match_stage() {
        let filter = ChangeFilter {
            collections: vec!["k_filter".into()],
            ops: vec![ChangeOp::Update],
            key_prefix: Some("source:".into()),
            filter: Some(Filter::parse(&json!({"kind": "keep", "a.n": {"$gt": 3}})).unwrap()),
            post_images_only: false,
        };
        assert_eq!(
            match_stage(&filter, true).unwrap(),
            doc! {"$match": {
                "operationType": {"$in": ["update"]},
                "ns.coll": {"$in": ["k_filter"]},
                "documentKey._id": {"$type": "string", "$regex": "^source:"},
                "$or": [
                    {"operationType": {"$ne": "delete"},
                     "fullDocument.kind": {"$eq": "keep"}, "fullDocument.a.n": {"$gt": 3_i64}},
                    {"operationType": "delete",
                     "fullDocumentBeforeChange.kind": {"$eq": "keep"},
                     "fullDocumentBeforeChange.a.n": {"$gt": 3_i64}},
                ],
            }}
        );
    }

    #[test]
    fn an_empty_filter_watches_every_keyed_change_but_checkpoints() {
        let expected = doc! {"$match": {
            "operationType": {"$in": ["insert", "update", "replace", "delete"]},
            "ns.coll": {"$ne": "checkpoints"},
            "documentKey._id": {"$type": "string"},
        }};
        assert_eq!(
            match_stage(&ChangeFilter::default(), true).unwrap(),
            expected
        );
        let everything = ChangeFilter {
            filter: Some(Filter::match_all()),
            ..ChangeFilter::default()
        };
        assert_eq!(
            match_stage(&everything, true).unwrap(),
            expected,
            "{{}} adds no condition"
        );
    }

    #[test]
    fn deletes_are_matched_on_their_pre_image_here_too() {
        let f = ChangeFilter {
            filter: Some(Filter::parse(&json!({"lang": "ja"})).unwrap()),
            ..ChangeFilter::default()
        };
        let change = |op, before: Option<Value>, after: Option<Value>| Change {
            op,
            collection: "k".into(),
            key: "a".into(),
            before: before.and_then(|v| v.as_object().cloned()).map(Arc::new),
            after: after.and_then(|v| v.as_object().cloned()).map(Arc::new),
            token: ResumeToken("t".into()),
            committed_at_us: 0,
        };
        assert!(f.matches(&change(ChangeOp::Delete, Some(json!({"lang": "ja"})), None)));
        assert!(!f.matches(&change(ChangeOp::Delete, Some(json!({"lang": "en"})), None)));
        assert!(
            !f.matches(&change(ChangeOp::Delete, None, None)),
            "no pre-image (MongoDB before 6.0): no match"
        );
        assert!(f.matches(&change(
            ChangeOp::Update,
            Some(json!({"lang": "en"})),
            Some(json!({"lang": "ja"}))
        )));
    }

    #[test]
    fn key_prefixes_are_escaped() {
        let f = ChangeFilter {
            key_prefix: Some("a.b*".into()),
            ..ChangeFilter::default()
        };
        let m = match_stage(&f, true).unwrap();
        assert_eq!(
            m.get_document("$match")
                .unwrap()
                .get_document("documentKey._id")
                .unwrap(),
            &doc! {"$type": "string", "$regex": "^a\\.b\\*"}
        );
    }

    fn event(d: BsonDoc) -> ChangeStreamEvent<BsonDoc> {
        bson::deserialize_from_document(d).unwrap()
    }

    #[test]
    fn update_events_map_to_changes_with_both_images() {
        let ev = event(doc! {
            "_id": {"_data": "82AA"},
            "operationType": "update",
            "ns": {"db": "t", "coll": "k_ops"},
            "documentKey": {"_id": "a"},
            "updateDescription": {"updatedFields": {"count": 3_i64}, "removedFields": []},
            "clusterTime": Timestamp { time: 1_700_000_000, increment: 1 },
            "wallTime": DateTime::from_millis(1_700_000_000_123),
            "fullDocument": {"_id": "a", "count": 3_i64, "tag": "x"},
            "fullDocumentBeforeChange": {"_id": "a", "count": 1_i64},
        });
        let c = to_change(ev).unwrap().unwrap();
        assert_eq!(c.op, ChangeOp::Update);
        assert_eq!((c.collection.as_str(), c.key.as_str()), ("k_ops", "a"));
        assert_eq!(c.before.unwrap()["count"], json!(1));
        assert_eq!(c.after.unwrap()["count"], json!(3));
        assert_eq!(c.committed_at_us, 1_700_000_000_123_000, "from wallTime");
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&c.token.0).unwrap(),
            json!({"_data": "82AA"})
        );
    }

    #[test]
    fn insert_replace_delete_and_other_events() {
        let base = |op: &str| {
            doc! {
                "_id": {"_data": "82BB"},
                "operationType": op,
                "ns": {"db": "t", "coll": "k"},
                "documentKey": {"_id": "k1"},
                "clusterTime": Timestamp { time: 10, increment: 1 },
            }
        };
        let mut ins = base("insert");
        ins.insert("fullDocument", doc! {"_id": "k1", "n": 1_i64});
        let c = to_change(event(ins)).unwrap().unwrap();
        assert_eq!(c.op, ChangeOp::Insert);
        assert!(c.before.is_none());
        assert_eq!(c.after.unwrap()["n"], json!(1));
        assert_eq!(
            c.committed_at_us, 10_000_000,
            "from clusterTime without wallTime"
        );

        let mut del = base("delete");
        del.insert("fullDocumentBeforeChange", doc! {"_id": "k1", "n": 1_i64});
        let c = to_change(event(del)).unwrap().unwrap();
        assert_eq!(c.op, ChangeOp::Delete);
        assert!(c.after.is_none());
        assert!(c.before.is_some());

        let mut rep = base("replace");
        rep.insert("fullDocument", doc! {"_id": "k1", "fresh": true});
        assert_eq!(
            to_change(event(rep)).unwrap().unwrap().op,
            ChangeOp::Replace
        );

        let mut drop = base("drop");
        drop.remove("documentKey");
        assert!(
            to_change(event(drop)).unwrap().is_none(),
            "not a document change"
        );

        let mut inv = base("invalidate");
        inv.remove("documentKey");
        inv.remove("ns");
        assert!(to_change(event(inv)).is_err(), "invalidate ends the stream");
    }

    #[test]
    fn an_update_without_post_image_is_rebuilt_from_the_pre_image() {
        let ev = event(doc! {
            "_id": {"_data": "82CC"},
            "operationType": "update",
            "ns": {"db": "t", "coll": "k"},
            "documentKey": {"_id": "a"},
            "updateDescription": {
                "updatedFields": {"count": 3_i64, "user.name": "b"},
                "removedFields": ["gone"],
            },
            "clusterTime": Timestamp { time: 10, increment: 1 },
            "fullDocumentBeforeChange": {"_id": "a", "count": 1_i64, "gone": 1_i64, "user": {"name": "a"}},
        });
        let after = to_change(ev).unwrap().unwrap().after.unwrap();
        assert_eq!(
            serde_json::Value::Object(Arc::unwrap_or_clone(after)),
            json!({"_id": "a", "count": 3, "user": {"name": "b"}})
        );
    }
}
