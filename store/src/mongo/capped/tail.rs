//! The tail of a capped collection: a tailable-await cursor re-opened after its last position.

use std::sync::Arc;
use std::time::Duration;

use mongodb::bson::{Document as BsonDoc, doc};

use super::super::Inner;
use super::super::tailable::{Step, Tailable};
use super::writer::CappedShared;
use super::{is_stored, oldest_id, position_of, to_record};
use crate::{Position, RecordStream, Result, Start, StoreError};

/// How long a tail waits for this process's writer to learn a document's acknowledgment time
/// before yielding it with `committed_at_us: None`.
const ACK_WAIT: Duration = Duration::from_secs(2);
/// How often a tail on a server whose tailable cursors close after their first batch queries
/// it at most, once caught up (see `tail_stream`).
const POLL_INTERVAL: Duration = Duration::from_millis(200);
/// At most this many documents are taken from memory at a time (see `recent.rs`).
const RUN_FROM_MEMORY: usize = 1000;

/// A tail: a tailable-await cursor on `{_id: {$gt: last}}` in natural order, re-opened after
/// the last seen position whenever it dies. It never polls at steady state: the server blocks
/// each `getMore` for up to `max_await_time`. The one exception is an **empty** collection:
/// the server does not keep a tailable cursor on an empty capped collection, so the tail
/// re-opens with backoff (up to `BACKOFF_MAX`) — and at once when this process appends.
/// On a server whose tailable cursors close after their first batch
/// ([`crate::Capability::AwaitingTails`] lacking) the tail would poll that way all the time,
/// and each re-open may cost the server a read of the whole collection; there, once caught
/// up, it takes this process's own appends from the writer's memory (`recent.rs`) and reads
/// the server only for what memory does not hold.
///
/// With a `query` (a filtered tail) the first document after a re-open may rightly lie far
/// beyond the last position, so eviction is detected the other way: once the cursor is open,
/// the oldest retained position must be at most one past the last one read.
pub(super) fn tail_stream(
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
    let mut written = shared.acks.subscribe();
    Box::pin(async_stream::try_stream! {
        let mut cursor_loop = Tailable::new(&inner, "tail_reopen", format!("{}: a tail", shared.name));
        let mut ack_window = None;
        loop {
            cursor_loop.check_open()?;
            // Marked before opening: an insert finishing after this point wakes a tail whose
            // cursor died on an empty collection.
            written.borrow_and_update();
            // Where tails poll, this process's own documents come from memory (`recent.rs`).
            if let (Some(recent), None, Some(l)) = (&shared.recent, &query, last) {
                let run = recent.after(l, RUN_FROM_MEMORY);
                if !run.is_empty() {
                    // As a server read would find: the document after `last` is still kept.
                    check_next_kept(&shared, l).await?;
                    for (position, d) in run {
                        last = Some(position);
                        let at = shared.acks.lookup(position);
                        yield to_record(&shared.name, d, at)?;
                    }
                    continue;
                }
                if l >= shared.acks.now() {
                    if cursor_loop.wait_for_own_writes(&mut written).await? {
                        // Caught up with what this process wrote, and it wrote again.
                        continue;
                    }
                    // A quiet spell: has another process written after `last`? Asked by
                    // equality, which such a server answers in its backend; a re-open after
                    // `last` would read the whole collection into it.
                    // (A failed read goes on to the server read, which retries.)
                    if matches!(is_stored(&shared.coll, l + 1).await, Ok(false)) {
                        continue;
                    }
                }
                // Behind what memory keeps, or another process wrote: read the server.
            }
            let after = match last {
                Some(l) => doc! {"_id": {"$gt": l as i64}},
                None => doc! {},
            };
            let filter = match &query {
                Some(q) => doc! {"$and": [after, q.clone()]},
                None => after,
            };
            let Some(mut cursor) = cursor_loop.open(&inner, &shared.coll, filter).await? else {
                continue;
            };
            if query.is_some()
                && let Some(l) = last
            {
                // The cursor is open (its first batch read): if the document right after
                // `last` was still there now, it was there when the cursor started.
                check_next_kept(&shared, l).await?;
            }
            let batch = cursor_loop.batch();
            let mut first = query.is_none();
            let mut yielded = false;
            let mut received = 0u32;
            loop {
                match cursor_loop.next(&mut cursor).await? {
                    Step::Doc(d) => {
                        received += 1;
                        let position = position_of(&shared.name, &d)?;
                        if first {
                            // Unfiltered: the first document after a (re-)open must be the
                            // next one; if it is further on, check whether the next one was
                            // evicted (it may also be a hole left by a failed insert, which
                            // is no loss).
                            first = false;
                            if let Some(l) = last.filter(|l| position > l + 1) {
                                check_next_kept(&shared, l).await?;
                            }
                        }
                        if last.is_some_and(|l| position <= l) {
                            continue;
                        }
                        last = Some(position);
                        yielded = true;
                        if batch.is_none() {
                            cursor_loop.reset_backoff();
                        }
                        let at = shared.acks.committed_at(position, &mut ack_window, ACK_WAIT).await;
                        yield to_record(&shared.name, d, at)?;
                    }
                    // Re-open after `last`; the first-document check above decides whether
                    // anything was lost.
                    Step::Reopen => break,
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
                            cursor_loop.wait_for_writes(&mut written, POLL_INTERVAL).await?;
                        }
                        break;
                    }
                }
            }
        }
    })
}

/// `PositionLost` when the document after `last` has been evicted: the oldest one kept is
/// further on.
async fn check_next_kept(shared: &CappedShared, last: u64) -> Result<()> {
    match oldest_id(&shared.coll, &shared.name).await? {
        Some(oldest) if oldest > last + 1 => Err(StoreError::PositionLost {
            collection: shared.name.clone(),
            after: Position(last),
            oldest: Position(oldest),
        }),
        _ => Ok(()),
    }
}
