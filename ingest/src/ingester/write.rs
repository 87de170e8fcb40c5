//! Writing a batch so that nothing stalls and nothing is lost: a transient failure (disk full,
//! connection lost, no primary) is retried with backoff while the sources wait, and the store
//! is reported unwritable meanwhile; a permanent failure (the store refuses what the batch
//! carries) is isolated — the batch is split in halves until each culprit is alone — and the
//! rest is written.

use std::future::Future;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use store::backoff::Backoff;
use store::{Capped, Document, Durability, KeyUpdate, Keyed, StoreError};

use crate::telemetry as t;

/// Whether the store can be written, as the last write of each collection found it;
/// `/readyz` and the `tailrace_store_writable` gauge show it. Unwritable while any
/// collection's writes are failing for a transient reason: on a nearly full disk a small
/// write may still pass while the events cannot be written, and that is not "writable".
pub struct StoreHealth {
    /// Collections whose writes are failing, with the last error.
    failing: std::sync::Mutex<std::collections::BTreeMap<String, String>>,
    /// Mirrors `failing.is_empty()`, for cheap reads.
    writable: AtomicBool,
    gauge: metrics::Gauge,
}

impl StoreHealth {
    /// Writable until a write says otherwise.
    pub fn new() -> Self {
        let gauge = t::store_writable();
        gauge.set(1.0);
        StoreHealth {
            failing: Default::default(),
            writable: AtomicBool::new(true),
            gauge,
        }
    }

    /// `None` when writable, else why not.
    pub fn unwritable_reason(&self) -> Option<String> {
        if self.writable.load(Ordering::Acquire) {
            return None;
        }
        let failing = self.failing.lock().ok()?;
        let reasons: Vec<String> = failing
            .iter()
            .map(|(collection, error)| format!("writing {collection}: {error}"))
            .collect();
        (!reasons.is_empty()).then(|| reasons.join("; "))
    }

    fn failed(&self, collection: &str, error: &StoreError) {
        let Ok(mut failing) = self.failing.lock() else {
            return;
        };
        failing.insert(collection.to_owned(), error.to_string());
        if self.writable.swap(false, Ordering::AcqRel) {
            self.gauge.set(0.0);
            t::StoreUnwritable { error }.emit();
        }
    }

    fn succeeded(&self, collection: &str) {
        let Ok(mut failing) = self.failing.lock() else {
            return;
        };
        if failing.remove(collection).is_some()
            && failing.is_empty()
            && !self.writable.swap(true, Ordering::AcqRel)
        {
            self.gauge.set(1.0);
            t::StoreWritableAgain.emit();
        }
    }
}

impl Default for StoreHealth {
    fn default() -> Self {
        Self::new()
    }
}

/// An item the store refused for good.
pub(super) struct Refused<T> {
    /// Its index among the items written.
    pub index: usize,
    pub item: T,
    /// The store's reason.
    pub error: StoreError,
}

/// What became of the items of one write.
pub(super) struct Written<T> {
    /// The time of the first successful attempt, when any part was written.
    pub latency: Option<Duration>,
    /// Items the store refused for good, in order.
    pub refused: Vec<Refused<T>>,
    /// Items not written because the store was closed meanwhile (shutdown).
    pub unwritten: usize,
}

impl<T> Written<T> {
    /// Nothing written yet.
    pub fn none() -> Self {
        Written {
            latency: None,
            refused: Vec::new(),
            unwritten: 0,
        }
    }

    /// Everything written, the first attempt taking `latency`.
    pub fn landed(latency: Duration) -> Self {
        Written {
            latency: Some(latency),
            ..Written::none()
        }
    }

    /// Adds what another write of the same batch did, whose items started at `offset` among
    /// the batch's (so refused indices stay indices into the whole batch).
    pub fn absorb(&mut self, other: Written<T>, offset: usize) {
        self.latency = self.latency.or(other.latency);
        self.unwritten += other.unwritten;
        self.refused.extend(other.refused.into_iter().map(|mut r| {
            r.index += offset;
            r
        }));
    }
}

/// Writes `items` with `write`: transient failures are retried with backoff (the store is
/// marked unwritable until a write succeeds); a permanent failure splits the group in halves,
/// written in order, until each refused item is alone. Items keep their order: positions
/// still increase with insertion order. `write` gets the items shared: this keeps them to
/// write again, and an attempt of all of them (every attempt but a retry after a refusal)
/// copies nothing.
pub(super) async fn write_isolating<T, F, Fut>(
    collection: &str,
    items: Vec<T>,
    health: &Arc<StoreHealth>,
    write: F,
) -> Written<T>
where
    T: Clone,
    F: FnMut(Arc<[T]>) -> Fut,
    Fut: Future<Output = Result<(), StoreError>>,
{
    write_shared(collection, items, health, write, false)
        .await
        .0
}

/// [`write_isolating`] of items the caller can make again, exactly (`remake`: the same items
/// in the same order). The first attempt is handed the items themselves, and nothing is kept:
/// an engine that takes its updates by value then copies nothing. Only after a failed attempt
/// are the items made again, to write again or to isolate the one refused.
pub(super) async fn write_isolating_remade<T, R, F, Fut>(
    collection: &str,
    items: Vec<T>,
    remake: R,
    health: &Arc<StoreHealth>,
    write: F,
) -> Written<T>
where
    T: Clone,
    R: FnOnce() -> Vec<T>,
    F: FnMut(Part<T>) -> Fut,
    Fut: Future<Output = Result<(), StoreError>>,
{
    write_ordered(collection, items, Some(remake), health, write, false)
        .await
        .0
}

/// What one attempt writes: the items themselves (the first attempt of
/// [`write_isolating_remade`]), or shared with what is kept to write again.
pub(super) enum Part<T> {
    Owned(Vec<T>),
    Shared(Arc<[T]>),
}

impl<T: Clone> Part<T> {
    /// The items by value: copied only when shared.
    pub(super) fn into_vec(self) -> Vec<T> {
        match self {
            Part::Owned(items) => items,
            Part::Shared(items) => items.to_vec(),
        }
    }

    /// The items shared.
    fn into_shared(self) -> Arc<[T]> {
        match self {
            Part::Owned(items) => items.into(),
            Part::Shared(items) => items,
        }
    }
}

/// [`write_isolating`] up to the first item the store refuses: every item before it is
/// written, it is in the answer's `refused`, and the items after it come back unwritten, in
/// order. A caller that must keep something of the refused item before the later ones are
/// written (a dead letter, in hand-over order) does that and calls again with the rest.
pub(super) async fn write_until_refused<T, F, Fut>(
    collection: &str,
    items: Vec<T>,
    health: &Arc<StoreHealth>,
    write: F,
) -> (Written<T>, Vec<T>)
where
    T: Clone,
    F: FnMut(Arc<[T]>) -> Fut,
    Fut: Future<Output = Result<(), StoreError>>,
{
    write_shared(collection, items, health, write, true).await
}

/// [`write_ordered`] of items every attempt shares.
async fn write_shared<T, F, Fut>(
    collection: &str,
    items: Vec<T>,
    health: &Arc<StoreHealth>,
    mut write: F,
    stop_at_refusal: bool,
) -> (Written<T>, Vec<T>)
where
    T: Clone,
    F: FnMut(Arc<[T]>) -> Fut,
    Fut: Future<Output = Result<(), StoreError>>,
{
    let by_part = |part: Part<T>| write(part.into_shared());
    let no_remake = None::<fn() -> Vec<T>>;
    write_ordered(
        collection,
        items,
        no_remake,
        health,
        by_part,
        stop_at_refusal,
    )
    .await
}

/// The items kept to write again: shared from the start, or made again by `remake` the first
/// time they are needed.
fn kept<'a, T, R: FnOnce() -> Vec<T>>(
    shared: &'a mut Option<Arc<[T]>>,
    remake: &mut Option<R>,
    len: usize,
) -> &'a Arc<[T]> {
    shared.get_or_insert_with(|| {
        let again = remake.take().map(|r| r()).unwrap_or_default();
        // The ranges index the first items: made again, they must be as many.
        assert_eq!(again.len(), len, "items made again differ in number");
        again.into()
    })
}

async fn write_ordered<T, R, F, Fut>(
    collection: &str,
    items: Vec<T>,
    mut remake: Option<R>,
    health: &Arc<StoreHealth>,
    mut write: F,
    stop_at_refusal: bool,
) -> (Written<T>, Vec<T>)
where
    T: Clone,
    R: FnOnce() -> Vec<T>,
    F: FnMut(Part<T>) -> Fut,
    Fut: Future<Output = Result<(), StoreError>>,
{
    let mut out = Written {
        latency: None,
        refused: Vec::new(),
        unwritten: 0,
    };
    if items.is_empty() {
        return (out, Vec::new());
    }
    let len = items.len();
    // With `remake`, the first attempt takes the items; otherwise every attempt shares them.
    let (mut first, mut shared) = if remake.is_some() {
        (Some(items), None)
    } else {
        (None, Some(Arc::<[T]>::from(items)))
    };
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    // Ranges still to write, in order (the next one last).
    let mut todo: Vec<Range<usize>> = Vec::with_capacity(8);
    todo.push(0..len);
    let mut refused: Vec<(usize, StoreError)> = Vec::new();
    while let Some(mut range) = todo.pop() {
        if stop_at_refusal && !refused.is_empty() {
            todo.push(range);
            break;
        }
        let started = Instant::now();
        let part = match first.take() {
            Some(items) => Part::Owned(items),
            None => {
                let items = kept(&mut shared, &mut remake, len);
                if range.len() == len {
                    Part::Shared(items.clone())
                } else {
                    Part::Shared(items[range.clone()].into())
                }
            }
        };
        let mut result = write(part).await;
        if let Err(StoreError::PartlyWritten { written, error }) = result {
            // The first `written` items are stored for good (an engine that cannot undo a
            // partial write): never write them again. The next one failed with `error`.
            let written = written.min(range.len());
            if written > 0 {
                health.succeeded(collection);
                out.latency.get_or_insert(started.elapsed());
            }
            range.start += written;
            if range.is_empty() {
                continue;
            }
            if !error.is_transient() && !matches!(*error, StoreError::Closed) {
                // Ordered: the first item of what is left is the one refused.
                health.succeeded(collection);
                refused.push((range.start, *error));
                if range.len() > 1 {
                    todo.push(range.start + 1..range.end);
                }
                continue;
            }
            result = Err(*error);
        }
        match result {
            Ok(()) => {
                health.succeeded(collection);
                backoff.reset();
                out.latency.get_or_insert(started.elapsed());
            }
            Err(StoreError::Closed) => {
                out.unwritten += range.len() + todo.iter().map(|r| r.len()).sum::<usize>();
                todo.clear();
                break;
            }
            Err(e) if e.is_transient() => {
                health.failed(collection, &e);
                let wait = backoff.next_wait();
                t::WriteFailed {
                    collection,
                    items: range.len(),
                    error: e.to_string(),
                    retry_in: wait,
                }
                .emit();
                tokio::time::sleep(wait).await;
                todo.push(range);
            }
            Err(e) if range.len() == 1 => {
                // The store answered, so it is writable; it refuses this one item.
                health.succeeded(collection);
                refused.push((range.start, e));
            }
            Err(e) => {
                health.succeeded(collection);
                t::WriteSplit {
                    collection,
                    items: range.len(),
                    error: e.to_string(),
                }
                .emit();
                let mid = range.start + range.len() / 2;
                // Popped last-in first: the left half is written first.
                todo.push(mid..range.end);
                todo.push(range.start..mid);
            }
        }
    }
    if refused.is_empty() && todo.is_empty() {
        return (out, Vec::new());
    }
    let items = kept(&mut shared, &mut remake, len);
    out.refused = refused
        .into_iter()
        .map(|(index, error)| Refused {
            index,
            item: items[index].clone(),
            error,
        })
        .collect();
    // What is left, in order: the ranges still to write, the next one last.
    let rest = todo
        .iter()
        .rev()
        .flat_map(|r| items[r.clone()].iter().cloned())
        .collect();
    (out, rest)
}

/// Writes a batch's events and their rollup updates in one commit: one commit (one sync, one
/// wake-up of each reader) instead of two. The caller checks first that the engine commits the
/// two together ([`store::Capped::commits_with`]; it waits for earlier rollups before it calls
/// this). Returns the commit's latency. `None` when the attempt failed: then nothing of it was
/// written (all or nothing), and the caller writes both in turn, which retries transient
/// failures and isolates refused items. The updates are consumed either way: the caller
/// derives them again from the events should it need them.
pub(super) async fn write_together(
    events: &Arc<dyn Capped>,
    rollups: &Arc<dyn Keyed>,
    docs: &[Arc<Document>],
    mut updates: Vec<KeyUpdate>,
    durability: Durability,
    health: &StoreHealth,
) -> Option<Duration> {
    if docs.is_empty() {
        return None;
    }
    // Shared, not copied: the caller keeps the batch for the writes in turn, should this one
    // fail.
    let n = docs.len();
    let docs: Arc<[Arc<Document>]> = docs.into();
    super::coalesce_counters(&mut updates);
    let started = Instant::now();
    match events
        .append_with_updates(docs, rollups.as_ref(), updates, durability)
        .await
    {
        Ok(_) => {
            health.succeeded(events.name());
            health.succeeded(rollups.name());
            Some(started.elapsed())
        }
        Err(e) => {
            tracing::debug!(error = %e, events = n, "events and rollups not written together; writing them in turn");
            None
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    fn engine(message: &str) -> StoreError {
        StoreError::Engine {
            engine: "embedded",
            message: message.into(),
        }
    }

    /// Items 3 and 11 are refused for good; the first two attempts fail transiently.
    #[tokio::test(start_paused = true)]
    async fn transient_failures_retry_and_permanent_ones_are_isolated_in_order() {
        let health = Arc::new(StoreHealth::new());
        let written: Mutex<Vec<u32>> = Mutex::new(Vec::new());
        let attempts = Mutex::new(0u32);
        // What each attempt of all 16 items was handed: the same shared items each time.
        let whole: Mutex<Vec<Arc<[u32]>>> = Mutex::new(Vec::new());
        let items: Vec<u32> = (0..16).collect();
        let out = write_isolating("events", items, &health, |chunk: Arc<[u32]>| {
            let n = {
                let mut a = attempts.lock().unwrap();
                *a += 1;
                *a
            };
            if chunk.len() == 16 {
                whole.lock().unwrap().push(chunk.clone());
            }
            let result = if n <= 2 {
                Err(StoreError::Unavailable {
                    engine: "embedded",
                    message: "database or disk is full".into(),
                })
            } else if chunk.iter().any(|i| *i == 3 || *i == 11) {
                Err(engine("CHECK constraint failed"))
            } else {
                written.lock().unwrap().extend(chunk.iter());
                Ok(())
            };
            async move { result }
        })
        .await;
        let refused: Vec<u32> = out.refused.iter().map(|r| r.item).collect();
        let at: Vec<usize> = out.refused.iter().map(|r| r.index).collect();
        assert_eq!(at, [3, 11]);
        assert_eq!(refused, [3, 11], "only the culprits are refused");
        let expected: Vec<u32> = (0..16).filter(|i| *i != 3 && *i != 11).collect();
        assert_eq!(
            *written.lock().unwrap(),
            expected,
            "everything else written, in order"
        );
        assert_eq!(out.unwritten, 0);
        assert!(out.latency.is_some());
        assert_eq!(health.unwritable_reason(), None, "writable again");
        let whole = whole.lock().unwrap();
        assert_eq!(whole.len(), 3, "two transient failures, then the refusal");
        assert!(
            whole.iter().all(|c| Arc::ptr_eq(c, &whole[0])),
            "retries of all the items share them, copying nothing"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_store_is_unwritable_while_transient_failures_last() {
        let health = Arc::new(StoreHealth::new());
        let fail = Arc::new(AtomicBool::new(true));
        let task = {
            let (health, fail) = (health.clone(), fail.clone());
            tokio::spawn(async move {
                write_isolating("events", vec![1u8], &health, move |_| {
                    let failing = fail.load(Ordering::Acquire);
                    async move {
                        if failing {
                            Err(StoreError::Unavailable {
                                engine: "embedded",
                                message: "database or disk is full".into(),
                            })
                        } else {
                            Ok(())
                        }
                    }
                })
                .await
            })
        };
        // Let a few retries happen.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let reason = health
            .unwritable_reason()
            .expect("unwritable while failing");
        assert!(
            reason.contains("disk is full") && reason.contains("events"),
            "the reason names the collection and the error: {reason}"
        );
        fail.store(false, Ordering::Release);
        let out = tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .unwrap()
            .unwrap();
        assert!(out.refused.is_empty());
        assert_eq!(health.unwritable_reason(), None);
    }

    /// An engine that writes in order and cannot undo a partial write (MongoDB's ordered
    /// inserts into a capped collection) stores everything before a refused item; that part
    /// is never written again, the refused item is the one after it, and a write that fails
    /// for a passing reason part way resumes after what it stored.
    #[tokio::test(start_paused = true)]
    async fn what_a_partial_write_stored_is_never_written_again() {
        let health = Arc::new(StoreHealth::new());
        let stored: Mutex<Vec<u32>> = Mutex::new(Vec::new());
        let outage = Mutex::new(true);
        let items: Vec<u32> = (0..10).collect();
        let out = write_isolating("events", items, &health, |chunk: Arc<[u32]>| {
            let mut result = Ok(());
            let mut written = 0;
            for item in chunk.iter() {
                if *item == 4 {
                    result = Err(engine("invalid key: \"$x\""));
                    break;
                }
                if *item == 7 && std::mem::replace(&mut *outage.lock().unwrap(), false) {
                    result = Err(StoreError::Unavailable {
                        engine: "mongodb",
                        message: "connection lost".into(),
                    });
                    break;
                }
                stored.lock().unwrap().push(*item);
                written += 1;
            }
            let result = result.map_err(|error| StoreError::PartlyWritten {
                written,
                error: Box::new(error),
            });
            async move { result }
        })
        .await;
        let refused: Vec<u32> = out.refused.iter().map(|r| r.item).collect();
        assert_eq!(
            refused,
            [4],
            "the item after the stored ones is the refused one"
        );
        let expected: Vec<u32> = (0..10).filter(|i| *i != 4).collect();
        assert_eq!(
            *stored.lock().unwrap(),
            expected,
            "each stored once, in order"
        );
        assert_eq!(out.unwritten, 0);
        assert_eq!(health.unwritable_reason(), None);
    }

    /// Up to the first refusal, on an engine that commits all or nothing (halves) and on one
    /// that stores a prefix: the items before the refused one are written, the ones after it
    /// come back unwritten, in order.
    #[tokio::test]
    async fn writing_stops_at_the_first_refused_item_and_hands_back_the_rest() {
        for partial in [false, true] {
            let health = Arc::new(StoreHealth::new());
            let stored: Mutex<Vec<u32>> = Mutex::new(Vec::new());
            let items: Vec<u32> = (0..10).collect();
            let (out, rest) = write_until_refused("events", items, &health, |chunk: Arc<[u32]>| {
                let result = match chunk.iter().position(|i| *i == 3 || *i == 8) {
                    None => {
                        stored.lock().unwrap().extend(chunk.iter());
                        Ok(())
                    }
                    Some(at) if partial => {
                        stored.lock().unwrap().extend(&chunk[..at]);
                        Err(StoreError::PartlyWritten {
                            written: at,
                            error: Box::new(engine("refused")),
                        })
                    }
                    Some(_) => Err(engine("refused")),
                };
                async move { result }
            })
            .await;
            let refused: Vec<u32> = out.refused.iter().map(|r| r.item).collect();
            assert_eq!(
                refused,
                [3],
                "partial={partial}: stops at the first refusal"
            );
            assert_eq!(*stored.lock().unwrap(), [0, 1, 2], "partial={partial}");
            assert_eq!(
                rest,
                [4, 5, 6, 7, 8, 9],
                "partial={partial}: the rest, in order"
            );
        }
    }

    /// Items the caller can make again: the first attempt is handed the items themselves and,
    /// when it succeeds, they are never made again. When it fails (for a passing reason, by a
    /// refusal, or part way), they are made again once, and what is written, refused and
    /// resumed is as with shared items.
    #[tokio::test(start_paused = true)]
    async fn items_made_again_are_made_only_after_a_failed_first_attempt() {
        #[derive(Clone, Copy, Debug, PartialEq)]
        enum Fail {
            Never,
            Passing,
            Refusal,
            PartWay,
        }
        for fail in [Fail::Never, Fail::Passing, Fail::Refusal, Fail::PartWay] {
            let health = Arc::new(StoreHealth::new());
            let stored: Mutex<Vec<u32>> = Mutex::new(Vec::new());
            let attempts: Mutex<Vec<bool>> = Mutex::new(Vec::new());
            let remade = AtomicBool::new(false);
            let items: Vec<u32> = (0..10).collect();
            let out = write_isolating_remade(
                "rollups",
                items,
                || {
                    assert!(!remade.swap(true, Ordering::SeqCst), "made again once");
                    (0..10).collect()
                },
                &health,
                |part: Part<u32>| {
                    let first = attempts.lock().unwrap().is_empty();
                    attempts
                        .lock()
                        .unwrap()
                        .push(matches!(part, Part::Owned(_)));
                    let chunk = part.into_vec();
                    let culprit = chunk.iter().position(|i| *i == 6);
                    let result = match (fail, first, culprit) {
                        (Fail::Passing, true, _) => Err(StoreError::Unavailable {
                            engine: "embedded",
                            message: "database or disk is full".into(),
                        }),
                        (Fail::PartWay, true, Some(at)) => {
                            stored.lock().unwrap().extend(&chunk[..at]);
                            Err(StoreError::PartlyWritten {
                                written: at,
                                error: Box::new(engine("refused")),
                            })
                        }
                        (Fail::Refusal | Fail::PartWay, _, Some(_)) => Err(engine("refused")),
                        _ => {
                            stored.lock().unwrap().extend(&chunk);
                            Ok(())
                        }
                    };
                    async move { result }
                },
            )
            .await;
            let attempts = attempts.lock().unwrap();
            assert!(attempts[0], "{fail:?}: the first attempt takes the items");
            assert!(
                attempts[1..].iter().all(|owned| !owned),
                "{fail:?}: later attempts share what was made again"
            );
            assert_eq!(
                remade.load(Ordering::SeqCst),
                fail != Fail::Never,
                "{fail:?}: made again only after a failure"
            );
            let refused: Vec<u32> = out.refused.iter().map(|r| r.item).collect();
            let expected: Vec<u32> = match fail {
                Fail::Never | Fail::Passing => {
                    assert!(refused.is_empty(), "{fail:?}");
                    (0..10).collect()
                }
                Fail::Refusal | Fail::PartWay => {
                    assert_eq!(refused, [6], "{fail:?}: the culprit alone is refused");
                    (0..10).filter(|i| *i != 6).collect()
                }
            };
            assert_eq!(
                *stored.lock().unwrap(),
                expected,
                "{fail:?}: in order, once"
            );
            assert_eq!(out.unwritten, 0);
        }
    }

    #[tokio::test]
    async fn a_closed_store_ends_the_write_and_counts_what_was_not_written() {
        let health = Arc::new(StoreHealth::new());
        let out = write_isolating("events", vec![1, 2, 3], &health, |_| async {
            Err(StoreError::Closed)
        })
        .await;
        assert_eq!(out.unwritten, 3);
        assert!(out.refused.is_empty());
    }
}
