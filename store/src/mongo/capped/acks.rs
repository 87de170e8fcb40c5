//! The ring of acknowledgment times: which positions this process's writer has handed out,
//! and when the server acknowledged each range of them, so that a tail can give a record its
//! commit time (waiting briefly for an insert still in flight).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::watch;

/// Positions `first..=last` were acknowledged at `at_us`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct AckRange {
    first: u64,
    last: u64,
    at_us: i64,
}

/// One wait of a tail for acknowledgments (see [`AckRing::committed_at`]): positions up to
/// `up_to` wait until `deadline` at most.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AckWindow {
    up_to: u64,
    deadline: tokio::time::Instant,
}

/// The bounded memory of when this process's writes were acknowledged, shared by the writer
/// and the tails, so [`Record::committed_at_us`] is the real acknowledgment time of the
/// documents this process wrote (and `None` for others'). One entry per `insert_many`, not per
/// document; the oldest entries are forgotten first.
pub(crate) struct AckRing {
    ranges: Mutex<VecDeque<AckRange>>,
    capacity: usize,
    /// The highest position handed to an insert.
    allocated: AtomicU64,
    /// The highest position acknowledged by the server (or found there at open): what
    /// `Start::Now` starts after.
    committed: AtomicU64,
    /// The highest position whose insert has finished, acknowledged or failed: a tail that
    /// reads a document before its writer heard the acknowledgment waits on this.
    resolved: watch::Sender<u64>,
}

impl AckRing {
    /// A ring for a collection whose newest position is `newest`.
    pub(crate) fn new(capacity: usize, newest: u64) -> Self {
        AckRing {
            ranges: Mutex::new(VecDeque::new()),
            capacity: capacity.max(1),
            allocated: AtomicU64::new(newest),
            committed: AtomicU64::new(newest),
            resolved: watch::Sender::new(newest),
        }
    }

    /// The highest position handed out so far.
    pub(crate) fn allocated(&self) -> u64 {
        self.allocated.load(Ordering::Acquire)
    }

    /// Where a tail opened "now" starts after: the newest position known to be on the
    /// server. Not [`AckRing::allocated`]: positions in flight may be handed out again when
    /// their insert fails (see [`AckRing::resync`]), and a tail starting after them would
    /// never see the documents that re-use them. A group in flight that succeeds is then
    /// yielded by such a tail, which is right: it was not visible when the tail opened.
    pub(crate) fn now(&self) -> u64 {
        self.committed.load(Ordering::Acquire)
    }

    /// A position found on the server (the newest there, read by this process): where
    /// `Start::Now` starts after, at least.
    pub(crate) fn saw(&self, position: u64) {
        self.committed.fetch_max(position, Ordering::AcqRel);
    }

    /// Hands out `n` consecutive positions. Only the collection's writer task calls this.
    pub(crate) fn allocate(&self, n: u64) -> (u64, u64) {
        let first = self.allocated.fetch_add(n, Ordering::AcqRel) + 1;
        (first, first + n - 1)
    }

    /// After a failed insert: continue after what the server really holds, so a failed group
    /// leaves no gap (a gap right after a reader's position would look like eviction). The
    /// positions above it will be handed out again, so they are no longer "finished": a reader
    /// of one waits for its new insert. (Nobody waits for the failed ones themselves: those
    /// documents are not on the server, so no tail reads them.)
    pub(crate) fn resync(&self, newest_on_server: u64) {
        self.allocated.store(newest_on_server, Ordering::Release);
        self.resolved
            .send_modify(|r| *r = (*r).min(newest_on_server));
    }

    /// Records an acknowledged range and wakes tails waiting for it.
    pub(crate) fn acked(&self, first: u64, last: u64, at_us: i64) {
        self.committed.fetch_max(last, Ordering::AcqRel);
        if let Ok(mut ranges) = self.ranges.lock() {
            ranges.push_back(AckRange { first, last, at_us });
            while ranges.len() > self.capacity {
                ranges.pop_front();
            }
        }
        self.resolve(last);
    }

    /// Marks positions up to `last` as finished (acknowledged or failed).
    pub(crate) fn resolve(&self, last: u64) {
        self.resolved.send_modify(|r| *r = (*r).max(last));
    }

    /// The acknowledgment time of `position`, if this process wrote it and still remembers.
    pub(crate) fn lookup(&self, position: u64) -> Option<i64> {
        let ranges = self.ranges.lock().ok()?;
        // Ranges are appended in position order (a resync never goes below an acknowledged
        // position: acknowledged documents are the newest on the server), so bisect.
        let i = ranges.partition_point(|r| r.last < position);
        ranges
            .get(i)
            .filter(|r| r.first <= position)
            .map(|r| r.at_us)
    }

    /// Like [`AckRing::lookup`], but when `position` is in flight in this process, waits for
    /// its insert to finish: a tail can see a document before its writer has heard the
    /// acknowledgment. The wait is `window`'s: it covers every position in flight when it
    /// began, so a tail reading a large insert whose reply is slow (a server restarting, or
    /// starved) waits `wait` once for all of it, not once per document.
    pub(crate) async fn committed_at(
        &self,
        position: u64,
        window: &mut Option<AckWindow>,
        wait: Duration,
    ) -> Option<i64> {
        if position <= *self.resolved.borrow() || position > self.allocated() {
            return self.lookup(position);
        }
        let deadline = match window {
            Some(w) if position <= w.up_to => w.deadline,
            _ => {
                let w = AckWindow {
                    up_to: self.allocated(),
                    deadline: tokio::time::Instant::now() + wait,
                };
                *window = Some(w);
                w.deadline
            }
        };
        let mut rx = self.resolved.subscribe();
        let _ = tokio::time::timeout_at(deadline, rx.wait_for(|r| *r >= position)).await;
        self.lookup(position)
    }

    /// A receiver that changes whenever an insert finishes (tails use it to retry at once
    /// when their cursor died on an empty collection and this process then wrote to it).
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.resolved.subscribe()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A group fails (a document the server refuses) while a tail opens at "now": the writer
    /// re-reads the newest position on the server and hands the failed group's positions to
    /// the next appends. The tail must start at or before them, and a reader of a re-used
    /// position must wait for its acknowledgment again.
    #[tokio::test]
    async fn a_tail_opened_during_a_failed_group_sees_the_positions_it_frees() {
        let ring = Arc::new(AckRing::new(16, 10));
        assert_eq!(ring.allocate(3), (11, 13), "a group in flight");
        let now = ring.now();
        // The group failed entirely; the server holds up to 10.
        ring.resolve(13);
        ring.resync(10);
        assert_eq!(
            ring.allocate(2),
            (11, 12),
            "the next group re-uses 11 and 12"
        );
        assert!(
            now < 11,
            "a tail opened at 'now' ({now}) would skip the re-used positions 11 and 12"
        );
        // A tail reading 11 before the writer hears its acknowledgment waits for it.
        let acker = ring.clone();
        let ack = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            acker.acked(11, 12, 4242);
        });
        let at = ring
            .committed_at(11, &mut None, Duration::from_secs(5))
            .await;
        ack.await.unwrap();
        assert_eq!(
            at,
            Some(4242),
            "the re-used position's own acknowledgment time"
        );
    }

    #[test]
    fn ring_finds_ack_times_by_range_and_forgets_the_oldest() {
        let ring = AckRing::new(2, 10);
        assert_eq!(ring.allocate(3), (11, 13));
        ring.acked(11, 13, 1000);
        assert_eq!(ring.allocate(2), (14, 15));
        ring.acked(14, 15, 2000);
        assert_eq!(ring.lookup(10), None, "written before this process");
        assert_eq!(ring.lookup(11), Some(1000));
        assert_eq!(ring.lookup(13), Some(1000));
        assert_eq!(ring.lookup(14), Some(2000));
        assert_eq!(ring.lookup(16), None, "not written yet");
        assert_eq!(ring.allocate(1), (16, 16));
        ring.acked(16, 16, 3000);
        assert_eq!(
            ring.lookup(11),
            None,
            "capacity 2: the oldest range is forgotten"
        );
        assert_eq!(ring.lookup(16), Some(3000));
        assert_eq!(ring.allocated(), 16);
    }

    #[test]
    fn ring_resync_continues_after_the_server_newest() {
        let ring = AckRing::new(8, 0);
        assert_eq!(ring.allocate(5), (1, 5));
        // The insert failed after two documents: the server holds 1..=2.
        ring.acked(1, 2, 7);
        ring.resolve(5);
        ring.resync(2);
        assert_eq!(ring.allocate(3), (3, 5), "no gap after a failed insert");
        ring.acked(3, 5, 9);
        assert_eq!(ring.lookup(2), Some(7));
        assert_eq!(ring.lookup(4), Some(9));
    }

    #[tokio::test]
    async fn a_tail_waits_for_the_ack_of_an_in_flight_position() {
        let ring = Arc::new(AckRing::new(8, 0));
        let (first, last) = ring.allocate(2);
        let r = ring.clone();
        let waiter =
            tokio::spawn(async move { r.committed_at(2, &mut None, Duration::from_secs(5)).await });
        tokio::task::yield_now().await;
        ring.acked(first, last, 42);
        assert_eq!(waiter.await.unwrap(), Some(42));
        // Not in flight (beyond what was handed out): no wait, no time.
        let start = std::time::Instant::now();
        assert_eq!(
            ring.committed_at(99, &mut None, Duration::from_secs(5))
                .await,
            None
        );
        assert!(start.elapsed() < Duration::from_secs(1));
        // In flight but failed: resolves to None without waiting out the timeout.
        let (_, last) = ring.allocate(1);
        let r = ring.clone();
        let waiter =
            tokio::spawn(async move { r.committed_at(3, &mut None, Duration::from_secs(5)).await });
        tokio::task::yield_now().await;
        ring.resolve(last);
        assert_eq!(waiter.await.unwrap(), None);
    }

    /// A large insert whose reply is slow: the server shows its documents, the writer has
    /// not heard back. A tail reading them waits once for all of them, not once each (at 2 s
    /// a document, a few hundred documents held a tail for minutes).
    #[tokio::test(start_paused = true)]
    async fn a_tail_waits_once_for_the_acks_of_one_slow_insert() {
        let ring = AckRing::new(8, 0);
        ring.allocate(500);
        let wait = Duration::from_secs(2);
        let start = tokio::time::Instant::now();
        let mut window = None;
        for p in 1..=500 {
            assert_eq!(ring.committed_at(p, &mut window, wait).await, None);
        }
        assert_eq!(start.elapsed(), wait, "one wait for the whole insert");
        // The next insert in flight gets a wait of its own.
        ring.allocate(10);
        assert_eq!(ring.committed_at(501, &mut window, wait).await, None);
        assert_eq!(start.elapsed(), wait * 2);
    }
}
