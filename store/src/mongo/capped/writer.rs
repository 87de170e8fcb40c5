//! The single writer task of a capped collection: it takes queued appends in order, assigns
//! positions (`_id`s), groups them into ordered inserts, and settles inserts whose outcome the
//! server left uncertain.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use mongodb::Collection;
use mongodb::bson::{Document as BsonDoc, doc};
use mongodb::error::ErrorKind;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use super::super::convert::{DUPLICATE_KEY, engine_err, map_error, write_concern};
use super::super::{Inner, lock_err};
use super::acks::AckRing;
use super::recent::Recent;
use super::{newest_id, position_of};
use crate::clock::now_us;
use crate::telemetry::Problem;
use crate::{Durability, Position, Result, StoreError};

/// At most this many documents go into one `insert_many` (the driver splits further by the
/// server's batch limits; this bounds one group's latency).
const MAX_GROUP_DOCS: usize = 10_000;

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
    /// The documents this process stored lately, where tails poll (see `recent.rs`).
    pub(crate) recent: Option<Recent>,
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
            recent: inner.tail_cursor().0.is_some().then(Recent::new),
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

    /// Queues an append for the writer; waits for its positions unless `durability` does not
    /// wait (then the writer logs a failure, and the positions are not returned).
    pub(super) async fn submit(
        &self,
        docs: Vec<BsonDoc>,
        durability: Durability,
    ) -> Result<Vec<Position>> {
        let sender = self.sender()?;
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
                acknowledged(shared, &pending, first, total);
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
            acknowledged(shared, &pending, first, s);
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

/// The first `n` documents not yet stored of `pending`, at positions `first..`, are on the
/// server: kept in memory where tails poll, then published as acknowledged, in that order, so
/// that a tail woken by the acknowledgment finds them.
fn acknowledged(shared: &CappedShared, pending: &VecDeque<Pending>, first: u64, n: usize) {
    if let Some(recent) = &shared.recent {
        let docs = pending
            .iter()
            .flat_map(|p| p.job.docs[p.stored.len()..].iter());
        recent.stored(first, docs.take(n));
    }
    shared.acks.acked(first, first + n as u64 - 1, now_us());
}

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
