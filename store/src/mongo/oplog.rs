//! The raw oplog: `local.oplog.rs` tailed directly (the "oplog watcher" older tools use), and
//! the oplog reads behind `newest_change`, `changes_after` and `oldest_change_at`.
//!
//! Differences from change streams, all inherent to the oplog:
//! - **no before images** (`before` is always `None`);
//! - an update's **after image is looked up** when the change is read (the entry holds only a
//!   diff): it is the document as it is *then*, possibly a later version, or `None` if it was
//!   deleted since. Inserts and replacements carry their exact document;
//! - entries are read as soon as the node wrote them, before they are majority-committed
//!   (change streams wait for that), so an entry can later be rolled back by a failover;
//! - transactions appear as `applyOps` entries and are unpacked; tokens name the operation's
//!   index inside its entry. Prepared (sharded) transactions are not followed.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use mongodb::Collection;
use mongodb::bson::{Bson, DateTime, Document as BsonDoc, Timestamp, doc};

use super::convert::{
    OplogPos, Token, decode_token, encode_token, engine_err, error_code, regex_escape,
};
use super::keyed::keyed_doc_to_json;
use super::tailable::{Step, Tailable};
use super::token::{TokenCell, publish};
use super::{CHECKPOINTS, Inner};
use crate::{
    Capability, Change, ChangeFilter, ChangeOp, ChangeStart, ChangeStream, Result, ResumeToken,
    StoreError,
};

/// `MaxTimeMSExpired`: a bounded oplog read took too long.
const MAX_TIME_EXPIRED: i32 = 50;
/// Bounds the oplog scans of `newest_change` and `changes_after` (the oplog has no index).
const OPLOG_SCAN_TIME: Duration = Duration::from_secs(2);

/// `local.oplog.rs`.
pub(crate) fn oplog_collection(inner: &Inner) -> Collection<BsonDoc> {
    inner.client.database("local").collection("oplog.rs")
}

/// One end of the oplog.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct OplogEnd {
    /// Its `ts`.
    pub ts: Timestamp,
    /// Its `wall` clock time, when the server records one (4.0+).
    pub wall: Option<DateTime>,
}

impl OplogEnd {
    /// Its commit time in µs since the epoch.
    pub(crate) fn at_us(&self) -> i64 {
        entry_time_us(self.ts, self.wall)
    }
}

fn entry_time_us(ts: Timestamp, wall: Option<DateTime>) -> i64 {
    wall.map(|w| w.timestamp_millis().saturating_mul(1000))
        .unwrap_or_else(|| i64::from(ts.time).saturating_mul(1_000_000))
}

fn end_of(entry: &BsonDoc) -> Option<OplogEnd> {
    Some(OplogEnd {
        ts: entry.get_timestamp("ts").ok()?,
        wall: entry.get_datetime("wall").ok().copied(),
    })
}

/// The oldest oplog entry, or `None` where there is no oplog (a standalone server).
pub(crate) async fn oldest_entry(inner: &Inner) -> Result<Option<OplogEnd>> {
    let entry = oplog_collection(inner)
        .find_one(doc! {})
        .sort(doc! {"$natural": 1})
        .projection(doc! {"ts": 1, "wall": 1})
        .await?;
    Ok(entry.as_ref().and_then(end_of))
}

/// The newest oplog entry of any kind.
pub(crate) async fn newest_entry(inner: &Inner) -> Result<Option<OplogEnd>> {
    let entry = oplog_collection(inner)
        .find_one(doc! {})
        .sort(doc! {"$natural": -1})
        .projection(doc! {"ts": 1, "wall": 1})
        .await?;
    Ok(entry.as_ref().and_then(end_of))
}

/// The oplog operation codes of a filter's operations (updates and replacements are both `u`;
/// an upsert that inserts is `i`).
fn op_codes(ops: &[ChangeOp]) -> Vec<Bson> {
    let mut codes: Vec<&str> = Vec::new();
    let all = [
        ChangeOp::Insert,
        ChangeOp::Update,
        ChangeOp::Replace,
        ChangeOp::Delete,
    ];
    for op in if ops.is_empty() { &all[..] } else { ops } {
        let code = match op {
            ChangeOp::Insert => "i",
            ChangeOp::Update | ChangeOp::Replace => "u",
            ChangeOp::Delete => "d",
        };
        if !codes.contains(&code) {
            codes.push(code);
        }
    }
    codes.into_iter().map(Bson::from).collect()
}

/// The entries of this database's changefeed-backed collections: a filter's collections, or
/// every collection but `checkpoints`.
fn crud_clause(db: &str, filter: &ChangeFilter) -> BsonDoc {
    let ns = if filter.collections.is_empty() {
        Bson::from(doc! {
            "$regex": format!("^{}\\.", regex_escape(db)),
            "$ne": format!("{db}.{CHECKPOINTS}"),
        })
    } else {
        let mut nss: Vec<Bson> = filter
            .collections
            .iter()
            .map(|c| Bson::from(format!("{db}.{c}")))
            .collect();
        // One namespace as plain equality: the form a server that pushes only equality down
        // to its backend can narrow by (FerretDB 1.24 on PostgreSQL).
        match nss.len() {
            1 => nss.remove(0),
            _ => Bson::from(doc! {"$in": nss}),
        }
    };
    doc! {"ns": ns, "op": {"$in": op_codes(&filter.ops)}}
}

/// The tail's query: this database's changes, transactions (`applyOps`, unpacked and filtered
/// by the reader), and the periodic no-op entries (`n`), which carry nothing but keep a quiet
/// stream's token moving; from `after` on (`$gte`: the entry at `after` is read again and its
/// operations up to `after` skipped, since one entry may hold several operations).
///
/// With `crud_only` (a server without transactions, which writes neither `applyOps` nor
/// no-op entries: FerretDB 1.24) only the changes themselves, with no `$or`, so that such a
/// server can push the namespace's equality down to its backend: FerretDB otherwise reads
/// the whole oplog into its own process at every poll.
pub(crate) fn tail_filter(
    db: &str,
    filter: &ChangeFilter,
    after: Option<OplogPos>,
    crud_only: bool,
) -> BsonDoc {
    let mut f = if crud_only {
        crud_clause(db, filter)
    } else {
        doc! {"$or": [
            crud_clause(db, filter),
            {"op": "c", "ns": "admin.$cmd", "o.applyOps": {"$exists": true}},
            {"op": "n"},
        ]}
    };
    if let Some(p) = after {
        f.insert("ts", doc! {"$gte": p.ts()});
    }
    f
}

/// One change read off an entry, before the after image of an update is looked up.
#[derive(Debug, PartialEq)]
pub(crate) struct Pending {
    pub op: ChangeOp,
    pub collection: String,
    pub key: String,
    /// The exact document for inserts and replacements.
    pub after: Option<crate::Document>,
}

/// Reads one operation (`{op, ns, o, o2}`) of an entry. `None` when it is not a change of a
/// changefeed-backed collection of `db` (another database, `checkpoints`, a no-op, or a
/// non-string key, i.e. a capped collection's position).
pub(crate) fn read_op(db: &str, op: &BsonDoc) -> Option<Pending> {
    let ns = op.get_str("ns").ok()?;
    let (op_db, coll) = ns.split_once('.')?;
    if op_db != db || coll == CHECKPOINTS || coll.starts_with("system.") {
        return None;
    }
    let o = op.get_document("o").ok()?;
    let string_key = |d: &BsonDoc| match d.get("_id") {
        Some(Bson::String(s)) => Some(s.clone()),
        _ => None,
    };
    let (kind, key, after) = match op.get_str("op").ok()? {
        "i" => (
            ChangeOp::Insert,
            string_key(o)?,
            Some(keyed_doc_to_json(o.clone())),
        ),
        "d" => (ChangeOp::Delete, string_key(o)?, None),
        "u" => {
            let key = string_key(op.get_document("o2").ok()?)?;
            // A replacement holds the whole new document; an update holds `$v`/`diff` (or
            // `$set`... before 5.0): operator keys. A `$set` that carries the `_id` holds the
            // whole new document too (FerretDB writes updates so), and it is the exact image
            // right after this change, where reading the document later may find a newer one:
            // MongoDB's `$set` never names the `_id`, which no update can change.
            let whole = o
                .get_document("$set")
                .ok()
                .filter(|set| set.contains_key("_id") && o.len() <= 2);
            if let Some(set) = whole {
                (ChangeOp::Update, key, Some(keyed_doc_to_json(set.clone())))
            } else if o.keys().any(|k| k.starts_with('$') || k == "diff") {
                (ChangeOp::Update, key, None)
            } else {
                (ChangeOp::Replace, key, Some(keyed_doc_to_json(o.clone())))
            }
        }
        _ => return None,
    };
    Some(Pending {
        op: kind,
        collection: coll.to_string(),
        key,
        after,
    })
}

/// The operations of one entry with their positions: an `applyOps` entry (a transaction)
/// yields each inner operation; any other entry yields itself.
pub(crate) fn expand(entry: &BsonDoc) -> Vec<(OplogPos, &BsonDoc)> {
    let Ok(ts) = entry.get_timestamp("ts") else {
        return Vec::new();
    };
    if entry.get_str("op").ok() == Some("c") {
        let inner: Vec<&BsonDoc> = entry
            .get_document("o")
            .and_then(|o| o.get_array("applyOps"))
            .map(|ops| ops.iter().filter_map(Bson::as_document).collect())
            .unwrap_or_default();
        let len = inner.len();
        return inner
            .into_iter()
            .enumerate()
            .map(|(n, op)| {
                (
                    OplogPos {
                        t: ts.time,
                        i: ts.increment,
                        n: n as i64,
                        end: n + 1 == len,
                    },
                    op,
                )
            })
            .collect();
    }
    vec![(OplogPos::entry(ts), entry)]
}

/// Whether the oplog still holds everything after `last`; `Err(HistoryLost)` when not.
async fn check_history(inner: &Inner, last: OplogPos) -> Result<()> {
    if let Some(oldest) = oldest_entry(inner).await?
        && (oldest.ts.time, oldest.ts.increment) > (last.t, last.i)
    {
        return Err(StoreError::HistoryLost {
            token: encode_token(&Token::Oplog(last))?,
            oldest: encode_token(&Token::Oplog(OplogPos::before(oldest.ts)))?,
        });
    }
    Ok(())
}

/// The oplog watcher: a tailable-await cursor on `local.oplog.rs`, re-opened after the last
/// position whenever it dies, same contract as [`super::changes::change_stream`].
///
/// Its resume token moves with every entry read, matching or not (no-op entries included), so
/// it stays fresh on a quiet stream.
pub(crate) fn oplog_stream(
    inner: Arc<Inner>,
    filter: ChangeFilter,
    start: ChangeStart,
) -> ChangeStream {
    if let Some(e) = inner.unsupported(Capability::Oplog) {
        return ChangeStream::failed(e);
    }
    let given = match &start {
        ChangeStart::After(t) => Some(t.clone()),
        _ => None,
    };
    let cell: TokenCell = Arc::new(Mutex::new(given));
    // `Now` needs the newest entry, a server read: it runs in a task started here, and keyed
    // writes wait for it (see `Inner::begin_opening`), so `Now` means when this was called.
    let resolved: futures::future::BoxFuture<'static, Result<Option<OplogPos>>> = {
        let i = inner.clone();
        let s = start.clone();
        let resolve = async move {
            match s {
                ChangeStart::Oldest => Ok(None),
                ChangeStart::Now => Ok(newest_entry(&i).await?.map(|e| OplogPos::entry(e.ts))),
                ChangeStart::After(t) => match decode_token(&t)? {
                    Token::Oplog(p) => Ok(Some(p)),
                    Token::Stream(_) => Err(StoreError::Invalid(format!(
                        "resume token {t} comes from a change stream; the oplog watcher resumes \
                         only from its own tokens"
                    ))),
                },
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                let guard = inner.begin_opening();
                let c = cell.clone();
                let task = handle.spawn(async move {
                    let r = resolve.await;
                    if let Ok(Some(p)) = &r {
                        // `Now`: the start is already a valid checkpoint.
                        let mut cur = c.lock().map_err(super::lock_err)?;
                        if cur.is_none() {
                            *cur = encode_token(&Token::Oplog(*p)).ok();
                        }
                    }
                    drop(guard);
                    r
                });
                Box::pin(async move {
                    task.await
                        .map_err(|e| engine_err(format!("oplog watcher start: {e}")))?
                })
            }
            Err(_) => Box::pin(resolve),
        }
    };
    let db = inner.db.name().to_string();
    let crud_only = !inner.capabilities.transactions.is_yes();
    let tokens = cell.clone();
    let stream = async_stream::try_stream! {
        let mut last = resolved.await?;
        let oplog = oplog_collection(&inner);
        let mut cursor_loop = Tailable::new(&inner, "oplog_reopen", "the oplog watcher".to_string());
        let mut written = inner.keyed_written.subscribe();
        loop {
            cursor_loop.check_open()?;
            // Marked before opening: a write finishing after this point wakes a dead cursor.
            written.borrow_and_update();
            // Whether the entry at `last` is still in the oplog: the query starts at it
            // (`$gte`), so finding it first proves nothing before it was lost, and only
            // otherwise is the oldest entry read (a scan of the oplog on some servers).
            let mut verify = last;
            let Some(mut cursor) = cursor_loop.open(&inner, &oplog, tail_filter(&db, &filter, last, crud_only)).await? else {
                continue;
            };
            loop {
                match cursor_loop.next(&mut cursor).await? {
                    Step::Doc(entry) => {
                        cursor_loop.reset_backoff();
                        let ts = entry.get_timestamp("ts").ok();
                        if let Some(l) = verify.take()
                            && ts.is_none_or(|ts| (ts.time, ts.increment) != (l.t, l.i))
                        {
                            check_history(&inner, l).await?;
                        }
                        let wall = entry.get_datetime("wall").ok().copied();
                        for (pos, op) in expand(&entry) {
                            if last.is_some_and(|l| pos <= l) {
                                continue;
                            }
                            if let Some(p) = read_op(&db, op) {
                                let after = match (p.op, p.after) {
                                    (ChangeOp::Update, None) => inner
                                        .db
                                        .collection::<BsonDoc>(&p.collection)
                                        .find_one(doc! {"_id": p.key.as_str()})
                                        .await?
                                        .map(keyed_doc_to_json),
                                    (_, after) => after,
                                };
                                let change = Change {
                                    op: p.op,
                                    collection: p.collection,
                                    key: p.key,
                                    before: None,
                                    after: after.map(Arc::new),
                                    token: encode_token(&Token::Oplog(pos))?,
                                    committed_at_us: ts.map(|ts| entry_time_us(ts, wall)).unwrap_or(0),
                                };
                                last = Some(pos);
                                publish(&tokens, Some(change.token.clone()));
                                if filter.matches(&change) {
                                    yield change;
                                }
                                continue;
                            }
                            last = Some(pos);
                            publish(&tokens, encode_token(&Token::Oplog(pos)).ok());
                        }
                        // A no-op entry (or an empty transaction) still moves the token.
                        if let Some(ts) = ts {
                            let whole = OplogPos::entry(ts);
                            if last.is_none_or(|l| (l.t, l.i) < (whole.t, whole.i)) {
                                last = Some(whole);
                                publish(&tokens, encode_token(&Token::Oplog(whole)).ok());
                            }
                        }
                    }
                    // Overwritten while reading, or failed: re-open; `check_history` decides.
                    Step::Reopen => break,
                    Step::Dead => {
                        if let Some(l) = verify.take() {
                            check_history(&inner, l).await?;
                        }
                        // MongoDB keeps a tailable cursor on the oplog open, so a dead one
                        // was killed; a server that closes it whenever it has nothing more
                        // (FerretDB) makes this a poll. Either way: re-open after a pause, or
                        // at once when this process writes a keyed collection.
                        cursor_loop.wait_for_writes(&mut written, Duration::ZERO).await?;
                        break;
                    }
                }
            }
        }
    };
    ChangeStream::new(Box::pin(stream), cell)
}

/// The token of the newest change of this database's changefeed-backed collections (an oplog
/// token). When that scan exceeds its time bound (a busy oplog, this database quiet), the
/// newest entry of any kind stands in: a position at the end of the log, which is what lag is
/// measured against.
pub(crate) async fn newest_change(inner: &Inner) -> Result<Option<ResumeToken>> {
    let f = doc! {"$or": [
        crud_clause(inner.db.name(), &ChangeFilter::default()),
        {"op": "c", "ns": "admin.$cmd", "o.applyOps": {"$exists": true}},
    ]};
    let found = oplog_collection(inner)
        .find_one(f)
        .sort(doc! {"$natural": -1})
        .projection(doc! {"ts": 1, "wall": 1})
        .max_time(OPLOG_SCAN_TIME)
        .await;
    let end = match found {
        Ok(entry) => entry.as_ref().and_then(end_of),
        Err(e) if error_code(&e) == Some(MAX_TIME_EXPIRED) => newest_entry(inner).await?,
        Err(e) => return Err(e.into()),
    };
    end.map(|e| encode_token(&Token::Oplog(OplogPos::entry(e.ts))))
        .transpose()
}

/// How many oplog entries of this database's changefeed-backed collections (a transaction
/// counts once) lie after an oplog token. `None` for a change-stream token (its cluster time
/// is encoded in a format the server does not document) or when the count exceeds its time
/// bound.
pub(crate) async fn changes_after(inner: &Inner, token: &ResumeToken) -> Result<Option<u64>> {
    let Token::Oplog(p) = decode_token(token)? else {
        return Ok(None);
    };
    let f = doc! {
        "ts": {"$gt": p.ts()},
        "$or": [
            crud_clause(inner.db.name(), &ChangeFilter::default()),
            {"op": "c", "ns": "admin.$cmd", "o.applyOps": {"$exists": true}},
        ],
    };
    match oplog_collection(inner)
        .count_documents(f)
        .max_time(OPLOG_SCAN_TIME)
        .await
    {
        Ok(n) => Ok(Some(n)),
        Err(e) if error_code(&e) == Some(MAX_TIME_EXPIRED) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ts(time: u32, increment: u32) -> Timestamp {
        Timestamp { time, increment }
    }

    #[test]
    fn the_tail_filter_selects_this_database_transactions_and_noops() {
        let f = tail_filter(
            "tailrace",
            &ChangeFilter::collections(["k_a", "k_b"]),
            Some(OplogPos::entry(ts(5, 1))),
            false,
        );
        assert_eq!(
            f,
            doc! {
                "$or": [
                    {"ns": {"$in": ["tailrace.k_a", "tailrace.k_b"]}, "op": {"$in": ["i", "u", "d"]}},
                    {"op": "c", "ns": "admin.$cmd", "o.applyOps": {"$exists": true}},
                    {"op": "n"},
                ],
                "ts": {"$gte": ts(5, 1)},
            }
        );
        // Without transactions: the changes alone, one namespace by equality.
        assert_eq!(
            tail_filter(
                "tailrace",
                &ChangeFilter::collections(["k_a"]),
                Some(OplogPos::entry(ts(5, 1))),
                true,
            ),
            doc! {
                "ns": "tailrace.k_a",
                "op": {"$in": ["i", "u", "d"]},
                "ts": {"$gte": ts(5, 1)},
            }
        );
        let all = tail_filter("t.x", &ChangeFilter::default(), None, false);
        let crud = all.get_array("$or").unwrap()[0]
            .as_document()
            .unwrap()
            .clone();
        assert_eq!(
            crud.get_document("ns").unwrap(),
            &doc! {"$regex": "^t\\.x\\.", "$ne": "t.x.checkpoints"}
        );
        let deletes = ChangeFilter {
            ops: vec![ChangeOp::Delete, ChangeOp::Update, ChangeOp::Replace],
            ..ChangeFilter::default()
        };
        assert_eq!(
            op_codes(&deletes.ops),
            vec![Bson::from("d"), Bson::from("u")]
        );
    }

    #[test]
    fn oplog_operations_map_to_pending_changes() {
        let ins = doc! {"op": "i", "ns": "db.k", "o": {"_id": "a", "n": 1_i64}};
        assert_eq!(
            read_op("db", &ins),
            Some(Pending {
                op: ChangeOp::Insert,
                collection: "k".into(),
                key: "a".into(),
                after: Some(json!({"_id": "a", "n": 1}).as_object().unwrap().clone()),
            })
        );
        let upd = doc! {"op": "u", "ns": "db.k", "o": {"$v": 2, "diff": {"u": {"n": 2_i64}}}, "o2": {"_id": "a"}};
        let p = read_op("db", &upd).unwrap();
        assert_eq!(
            (p.op, p.after),
            (ChangeOp::Update, None),
            "updates need a lookup"
        );
        let rep =
            doc! {"op": "u", "ns": "db.k", "o": {"_id": "a", "fresh": true}, "o2": {"_id": "a"}};
        assert_eq!(read_op("db", &rep).unwrap().op, ChangeOp::Replace);
        let del = doc! {"op": "d", "ns": "db.k", "o": {"_id": "a"}};
        assert_eq!(read_op("db", &del).unwrap().op, ChangeOp::Delete);
        let capped = doc! {"op": "i", "ns": "db.events", "o": {"_id": 7_i64}};
        assert_eq!(
            read_op("db", &capped),
            None,
            "integer keys are capped positions"
        );
        let other_db = doc! {"op": "i", "ns": "other.k", "o": {"_id": "a"}};
        assert_eq!(read_op("db", &other_db), None);
        let cp = doc! {"op": "u", "ns": "db.checkpoints", "o": {"_id": "f"}, "o2": {"_id": "f"}};
        assert_eq!(read_op("db", &cp), None);
    }

    #[test]
    fn transactions_expand_into_their_operations() {
        let entry = doc! {
            "ts": ts(9, 3), "op": "c", "ns": "admin.$cmd",
            "o": {"applyOps": [
                {"op": "i", "ns": "db.k", "o": {"_id": "a"}},
                {"op": "u", "ns": "db.k", "o": {"$v": 2, "diff": {}}, "o2": {"_id": "b"}},
            ]},
        };
        let ops = expand(&entry);
        assert_eq!(ops.len(), 2);
        assert_eq!((ops[0].0.n, ops[0].0.end), (0, false));
        assert_eq!((ops[1].0.n, ops[1].0.end), (1, true));
        assert!(ops[0].0 < ops[1].0);
        let plain = doc! {"ts": ts(9, 4), "op": "i", "ns": "db.k", "o": {"_id": "c"}};
        assert_eq!(expand(&plain)[0].0, OplogPos::entry(ts(9, 4)));
        assert!(
            ops[1].0 < expand(&plain)[0].0,
            "entries order by ts, then index"
        );
    }

    /// A stream resumed from a whole-entry position (`ChangeStart::Now`, `newest_change`, a
    /// snapshot's token) has seen all of that entry: none of a transaction's operations at
    /// that `ts` may be handed over again, and the next entry's may.
    #[test]
    fn a_whole_entry_position_covers_every_operation_of_a_transaction() {
        let entry = doc! {
            "ts": ts(9, 3), "op": "c", "ns": "admin.$cmd",
            "o": {"applyOps": [
                {"op": "u", "ns": "db.rollups", "o": {"$v": 2, "diff": {}}, "o2": {"_id": "a"}},
                {"op": "u", "ns": "db.rollups", "o": {"$v": 2, "diff": {}}, "o2": {"_id": "b"}},
                {"op": "u", "ns": "db.rollups", "o": {"$v": 2, "diff": {}}, "o2": {"_id": "c"}},
            ]},
        };
        let last = OplogPos::entry(ts(9, 3));
        let replayed: Vec<i64> = expand(&entry)
            .into_iter()
            .filter(|(pos, _)| *pos > last)
            .map(|(pos, _)| pos.n)
            .collect();
        assert_eq!(
            replayed,
            Vec::<i64>::new(),
            "operations replayed after resuming from the whole entry"
        );
        // Part way through: resuming after operation 0 hands over 1 and 2 only.
        let after_first = expand(&entry)[0].0;
        let rest: Vec<i64> = expand(&entry)
            .into_iter()
            .filter(|(pos, _)| *pos > after_first)
            .map(|(pos, _)| pos.n)
            .collect();
        assert_eq!(rest, vec![1, 2]);
        // The entry's last operation and the whole entry are the same place.
        assert_eq!(expand(&entry)[2].0, last);
        let next = doc! {"ts": ts(9, 4), "op": "i", "ns": "db.rollups", "o": {"_id": "d"}};
        assert!(expand(&next)[0].0 > last, "the next entry follows");
        assert!(OplogPos::before(ts(9, 3)) < expand(&entry)[0].0);
    }

    /// FerretDB writes an update as `{$v: 1, $set: <the whole new document>}`: that is the
    /// exact image after the change. MongoDB's `$set` (before 5.0) names changed fields only,
    /// never the `_id`: the image is read later.
    #[test]
    fn an_update_that_sets_the_whole_document_carries_its_image() {
        let whole = doc! {
            "op": "u", "ns": "db.rollups", "o2": {"_id": "source:a"},
            "o": {"$v": 1, "$set": {
                "_id": "source:a", "count": 7, "_tailrace_written_us": 5_i64,
                "_tailrace_writer": -3_i64, "_tailrace_seq": 12_i64,
            }},
        };
        let p = read_op("db", &whole).unwrap();
        assert_eq!(p.op, ChangeOp::Update);
        assert_eq!(
            p.after.map(serde_json::Value::Object),
            Some(serde_json::json!({"_id": "source:a", "count": 7})),
            "the image, without the engine's write time and update name"
        );
        let fields = doc! {
            "op": "u", "ns": "db.rollups", "o2": {"_id": "source:a"},
            "o": {"$v": 1, "$set": {"count": 7}},
        };
        assert_eq!(read_op("db", &fields).unwrap().after, None, "read later");
    }

    #[test]
    fn oplog_times_prefer_the_wall_clock() {
        assert_eq!(entry_time_us(ts(10, 1), None), 10_000_000);
        assert_eq!(
            entry_time_us(ts(10, 1), Some(DateTime::from_millis(10_500))),
            10_500_000
        );
    }
}
