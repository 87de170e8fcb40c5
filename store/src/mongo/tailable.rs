//! A tailable-await cursor that re-opens after its last position: the loop the capped tail
//! (`capped/tail.rs`) and the oplog watcher (`oplog.rs`) share. Each of them builds its own
//! query from its last position and decides what a document means; this holds what is the
//! same for both: opening with the server's await time, stepping until the store closes, and
//! telling a failure to re-open after (with backoff) from one to give up on.

use futures::StreamExt;
use mongodb::action::Action;
use mongodb::bson::Document as BsonDoc;
use mongodb::options::CursorType;
use mongodb::{Collection, Cursor};
use tokio::sync::watch;
use tokio::time::Instant;

use super::convert::{Class, classify, map_error};
use super::{BACKOFF_MAX, BACKOFF_MIN, Inner, sleep_unless_closed};
use crate::backoff::Backoff;
use crate::telemetry::Problem;
use crate::{Result, StoreError};

/// What one step of an open cursor produced.
pub(crate) enum Step {
    /// The next document.
    Doc(BsonDoc),
    /// Re-open after the last position: the cursor's position was evicted under it, or it
    /// failed in a way worth retrying (the backoff has been waited already).
    Reopen,
    /// The cursor ended: the driver's stream is over (nothing more for now, on a server that
    /// closes it, or on an empty capped collection).
    Dead,
}

/// One tail's cursor loop state: the store's closed flag and the backoff between re-opens.
pub(crate) struct Tailable {
    closed: watch::Receiver<bool>,
    backoff: Backoff,
    /// The `error_type` of its warnings (`tail_reopen`, `oplog_reopen`).
    error_type: &'static str,
    /// Who it is in a warning ("events: a tail", "the oplog watcher").
    who: String,
    /// The batch size it opens with (`Some` where the server closes tailable cursors after
    /// each batch, so the tail polls) and when it last opened.
    batch: Option<u32>,
    opened_at: Instant,
}

impl Tailable {
    pub(crate) fn new(inner: &Inner, error_type: &'static str, who: String) -> Self {
        Tailable {
            closed: inner.closed.subscribe(),
            backoff: Backoff::new(BACKOFF_MIN, BACKOFF_MAX),
            error_type,
            who,
            batch: None,
            opened_at: Instant::now(),
        }
    }

    /// `Err(Closed)` once the store is closed.
    pub(crate) fn check_open(&self) -> Result<()> {
        if *self.closed.borrow() {
            return Err(StoreError::Closed);
        }
        Ok(())
    }

    /// The batch size of the last open: `Some` where the tail polls.
    pub(crate) fn batch(&self) -> Option<u32> {
        self.batch
    }

    /// A reset backoff: the tail is moving again.
    pub(crate) fn reset_backoff(&mut self) {
        self.backoff.reset();
    }

    /// Opens a tailable-await cursor on `filter`; `Ok(None)` after a transient failure, once
    /// the backoff has been waited (the caller re-opens).
    pub(crate) async fn open(
        &mut self,
        inner: &Inner,
        coll: &Collection<BsonDoc>,
        filter: BsonDoc,
    ) -> Result<Option<Cursor<BsonDoc>>> {
        let (batch, await_time) = inner.tail_cursor();
        self.batch = batch;
        self.opened_at = Instant::now();
        let opened = coll
            .find(filter)
            .cursor_type(CursorType::TailableAwait)
            .max_await_time(await_time)
            .optional(batch, |find, b| find.batch_size(b))
            .await;
        match opened {
            Ok(c) => Ok(Some(c)),
            Err(e) if classify(&e) == Class::Transient => {
                Problem {
                    error_type: self.error_type,
                    detail: &format!("{} cannot open its cursor ({e}); retrying", self.who),
                }
                .warn();
                let wait = self.backoff.next_wait();
                self.sleep(wait).await?;
                Ok(None)
            }
            Err(e) => Err(map_error(e)),
        }
    }

    /// The cursor's next step, or `Err(Closed)` as soon as the store closes.
    pub(crate) async fn next(&mut self, cursor: &mut Cursor<BsonDoc>) -> Result<Step> {
        let item = tokio::select! {
            biased;
            _ = self.closed.wait_for(|c| *c) => return Err(StoreError::Closed),
            item = cursor.next() => item,
        };
        match item {
            Some(Ok(d)) => Ok(Step::Doc(d)),
            None => Ok(Step::Dead),
            Some(Err(e)) => match classify(&e) {
                // The cursor's own position was evicted: re-open after the last position,
                // where the caller's check tells eviction from a hole.
                Class::PositionLost => Ok(Step::Reopen),
                // An outage, or a failure that is neither a bad request nor a missing feature
                // (a killed cursor; FerretDB answers a getMore whose position was evicted with
                // InternalError): re-open after the last position.
                Class::Transient | Class::Other => {
                    Problem {
                        error_type: self.error_type,
                        detail: &format!(
                            "{}'s cursor failed ({e}); re-opening after its last position",
                            self.who
                        ),
                    }
                    .warn();
                    let wait = self.backoff.next_wait();
                    self.sleep(wait).await?;
                    Ok(Step::Reopen)
                }
                Class::HistoryLost | Class::Invalid | Class::Unsupported | Class::Closed => {
                    Err(map_error(e))
                }
            },
        }
    }

    /// After a dead cursor: waits for `written` (this process wrote) or the backoff (other
    /// processes' writes), whichever comes first; then, where the tail polls, until at least
    /// `poll_interval` has passed since the cursor opened, so that a process writing small
    /// batches does not have its tail query the server after each of them.
    pub(crate) async fn wait_for_writes<T>(
        &mut self,
        written: &mut watch::Receiver<T>,
        poll_interval: std::time::Duration,
    ) -> Result<()> {
        let woke = tokio::select! {
            biased;
            _ = self.closed.wait_for(|c| *c) => false,
            _ = written.changed() => true,
            _ = tokio::time::sleep(self.backoff.next_wait()) => true,
        };
        if !woke {
            return Err(StoreError::Closed);
        }
        if self.batch.is_some() {
            let left = (self.opened_at + poll_interval).saturating_duration_since(Instant::now());
            self.sleep(left).await?;
        }
        Ok(())
    }

    /// For a tail served from this process's memory once caught up: waits for this
    /// process's next write (`Ok(true)`), or for a second without one (`Ok(false)`: time to
    /// read the server for other processes' writes).
    pub(crate) async fn wait_for_own_writes<T>(
        &mut self,
        written: &mut watch::Receiver<T>,
    ) -> Result<bool> {
        tokio::select! {
            biased;
            _ = self.closed.wait_for(|c| *c) => Err(StoreError::Closed),
            _ = written.changed() => Ok(true),
            _ = tokio::time::sleep(BACKOFF_MAX) => Ok(false),
        }
    }

    async fn sleep(&mut self, d: std::time::Duration) -> Result<()> {
        if sleep_unless_closed(&mut self.closed, d).await {
            Ok(())
        } else {
            Err(StoreError::Closed)
        }
    }
}
