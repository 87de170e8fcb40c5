//! The writer behind its lock, and the writer thread that commits what callers queue.

use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use super::core::Writer;
use super::ops::{Job, Reply};
use crate::embedded::tree::Tree;
use crate::{Result, StoreError};

/// At most this many jobs share one record, so one commit's latency stays bounded.
pub(super) const MAX_GROUP: usize = 1024;
/// A group stops taking jobs once its entries pass this many bytes (one job may pass it alone).
pub(super) const MAX_GROUP_BYTES: usize = 8 << 20;

/// The writer behind its lock, shared by the writer thread, the maintenance thread and setup.
pub(crate) struct WriterCell {
    /// `None` once the store is closed.
    pub(super) writer: Mutex<Option<Writer>>,
}

impl WriterCell {
    pub(crate) fn new(writer: Writer) -> Self {
        WriterCell {
            writer: Mutex::new(Some(writer)),
        }
    }

    /// Runs `f` on the writer (for setup that needs it, and tests).
    pub(crate) fn with<T>(&self, f: impl FnOnce(&mut Writer) -> T) -> Result<T> {
        let mut guard = self.writer.lock().map_err(|_| poisoned())?;
        let writer = guard.as_mut().ok_or(StoreError::Closed)?;
        Ok(f(writer))
    }

    /// Takes the writer out (after the writer thread has stopped).
    pub(crate) fn close(&self) -> Result<Option<Writer>> {
        let writer = self.writer.lock().map_err(|_| poisoned())?.take();
        if let Some(w) = &writer {
            w.release_readers();
        }
        Ok(writer)
    }
}

pub(super) fn poisoned() -> StoreError {
    StoreError::Engine {
        engine: "embedded",
        message: "the writer panicked during a commit; reopen the store".into(),
    }
}

/// The writer thread: commits what callers queued, everything queued at once (up to
/// [`MAX_GROUP`] jobs or [`MAX_GROUP_BYTES`]) in one record, until every sender is gone.
/// With `stall`, it first waits for maintenance whenever the keyed state is behind
/// ([`Tree::behind`]), so that its memory stays bounded however fast writes come.
pub(crate) fn run(cell: Arc<WriterCell>, mut rx: mpsc::Receiver<Job>, stall: Option<Arc<Tree>>) {
    // A clock for the wait of commits not yet synced (a runtime of its own: the job queue is
    // async, and a blocking receive has no timeout).
    let Ok(clock) = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
    else {
        tracing::error!("the writer thread could not start its clock; no write is committed");
        return;
    };
    let mut arrivals = Arrivals::default();
    loop {
        // Commits that did not ask for a sync wait for one at most `LAZY_SYNC_AFTER`: the next
        // job may sync them anyway, and several share one sync.
        let waiting = cell
            .writer
            .lock()
            .ok()
            .and_then(|w| w.as_ref().and_then(Writer::pending_for));
        let deadline = waiting.map(|waited| LAZY_SYNC_AFTER.saturating_sub(waited));
        let first = match next_job(&mut rx, &clock, deadline, &mut arrivals) {
            Next::Job(job) => job,
            Next::Closed => break,
            Next::Timeout => {
                if let Ok(mut guard) = cell.writer.lock()
                    && let Some(writer) = guard.as_mut()
                {
                    // A failure poisons the writer; the next write says so.
                    let _ = writer.sync_pending();
                }
                continue;
            }
        };
        if let Some(tree) = &stall
            && tree.behind()
        {
            let waited = tree.stall(STALL_LIMIT);
            if waited >= STALL_LIMIT {
                crate::telemetry::Problem {
                    error_type: "write_stall",
                    detail: &format!(
                        "writes waited {waited:?} for the keyed state's flushes and merges, which are behind; going on"
                    ),
                }
                .warn();
            }
        }
        let mut bytes = first.op.bytes();
        let mut jobs = vec![first];
        let mut guard = match cell.writer.lock() {
            Ok(guard) => guard,
            Err(_) => {
                answer(jobs, || Err(poisoned()));
                continue;
            }
        };
        while jobs.len() < MAX_GROUP && bytes < MAX_GROUP_BYTES {
            match rx.try_recv() {
                Ok(job) => {
                    bytes += job.op.bytes();
                    jobs.push(job);
                }
                Err(_) => break,
            }
        }
        let results = match guard.as_mut() {
            Some(writer) => {
                let results = writer.commit_group(&mut jobs);
                if writer.pending_for().is_some_and(|w| w >= LAZY_SYNC_AFTER) {
                    let _ = writer.sync_pending();
                }
                results
            }
            None => jobs.iter().map(|_| Err(StoreError::Closed)).collect(),
        };
        drop(guard);
        let mut results = results.into_iter();
        answer(jobs, || results.next().unwrap_or(Err(StoreError::Closed)));
    }
    // Every sender gone (the store closing): what waits is synced and shown.
    if let Ok(mut guard) = cell.writer.lock()
        && let Some(writer) = guard.as_mut()
    {
        let _ = writer.sync_pending();
    }
}

/// How long the writer last waited for a job, for [`spin_then_recv`].
#[derive(Default)]
struct Arrivals {
    /// `None` before the first job.
    idle: Option<std::time::Duration>,
}

/// Waits for a job shorter than this make the writer wait for the next one awake.
const SPIN_BELOW: std::time::Duration = std::time::Duration::from_micros(200);

/// What [`next_job`] found.
enum Next {
    Job(Job),
    /// Every sender is gone.
    Closed,
    /// Nothing came before the deadline.
    Timeout,
}

/// The next job, waiting at most `deadline` when there is one.
///
/// While jobs come back to back (one client writing in a loop, each write waiting for its
/// answer), the writer waits for the next one awake, for about twice as long as it last
/// waited, before it sleeps: a sleeping writer is woken by the job's sender, a cross-thread
/// wake-up that costs tens of microseconds on a small virtual machine, a good part of a
/// journaled commit. A slow stream's jobs come milliseconds apart: the writer sleeps at once,
/// and spends nothing waiting.
fn next_job(
    rx: &mut mpsc::Receiver<Job>,
    clock: &tokio::runtime::Runtime,
    deadline: Option<std::time::Duration>,
    arrivals: &mut Arrivals,
) -> Next {
    let started = std::time::Instant::now();
    let spin = arrivals
        .idle
        .filter(|idle| *idle < SPIN_BELOW)
        .map(|idle| (idle * 2).min(SPIN_BELOW))
        .map(|spin| deadline.map_or(spin, |d| spin.min(d)));
    let mut found = None;
    if let Some(spin) = spin {
        while started.elapsed() < spin {
            match rx.try_recv() {
                Ok(job) => {
                    found = Some(Next::Job(job));
                    break;
                }
                Err(mpsc::error::TryRecvError::Disconnected) => return Next::Closed,
                Err(mpsc::error::TryRecvError::Empty) => std::hint::spin_loop(),
            }
        }
    }
    let next = found.unwrap_or_else(|| match deadline {
        None => rx.blocking_recv().map_or(Next::Closed, Next::Job),
        Some(d) => {
            let left = d.saturating_sub(started.elapsed());
            match clock.block_on(async { tokio::time::timeout(left, rx.recv()).await }) {
                Ok(Some(job)) => Next::Job(job),
                Ok(None) => Next::Closed,
                Err(_) => Next::Timeout,
            }
        }
    });
    if matches!(next, Next::Job(_)) {
        arrivals.idle = Some(started.elapsed());
    }
    next
}

/// The longest the writer waits for maintenance at a time (see [`run`]): past it, it goes on
/// and says so.
pub(super) const STALL_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The longest a commit that did not ask for a sync waits for one (and readers for it). A
/// caller that reads its own write does not wait for it: its read asks for the sync
/// (`Inner::caught_up`).
pub(super) const LAZY_SYNC_AFTER: std::time::Duration = std::time::Duration::from_millis(2);

/// Sends each job its answer (unacknowledged jobs have nobody waiting).
pub(super) fn answer(jobs: Vec<Job>, mut result: impl FnMut() -> Result<Reply>) {
    for job in jobs {
        let r = result();
        if let Some(tx) = job.reply {
            let _ = tx.send(r);
        }
    }
}
