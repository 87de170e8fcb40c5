//! The ingester: validates each record, stamps it, groups records into batches, writes them
//! with the configured durability, keeps the per-key counters of the `rollups` collection, and
//! keeps every rejected record as a dead letter with its reason.
//!
//! Order matters: one task assigns per-source sequence numbers and writes batches one after
//! the other, so sequence order is commit order and a feed can prove completeness.
//!
//! Layout: this file runs the loop and writes; [`validate`] decides what is an event and
//! what a dead letter keeps; [`rollups`] derives the `rollups` updates of each event.

pub mod rollups;
pub mod validate;

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use store::backoff::Backoff;
use store::clock::now_us;
use store::{Capped, Durability, Keyed, STAMP_SOURCE_PATH, Stamp, StoreError};
use tokio::sync::mpsc;

pub use rollups::{coalesce_counters, rollups};
pub use validate::{Rejection, dead_letter, validate};

use crate::source::Raw;
use crate::telemetry as t;

/// Ingester settings.
#[derive(Clone, Debug)]
pub struct IngestOptions {
    /// Largest batch written at once.
    pub batch_max_events: usize,
    /// A partial batch is written after waiting this long for more.
    pub batch_max_wait: Duration,
    /// Larger events are rejected.
    pub max_event_bytes: usize,
    /// Fields whose values get `$inc` counters in `rollups` (`<field>:<value>` keys).
    pub rollup_fields: Vec<String>,
    /// The numeric field copied into each `source:<name>` rollup (for change feeds).
    pub value_field: String,
    /// The top-k field copied into each `source:<name>` rollup (for change feeds).
    pub topk_field: String,
    /// Write concern of every write.
    pub durability: Durability,
}

/// A record as handed over by a source, with the time of hand-over.
pub struct Handed {
    /// The source's name.
    pub source: Arc<str>,
    /// The record.
    pub raw: Raw,
    /// When the source handed it over (µs since the epoch).
    pub received_us: i64,
}

/// What the status line and `/api` show about ingestion.
#[derive(Default)]
pub struct IngestStats {
    /// Events written to `events`.
    pub written: AtomicI64,
    /// Records rejected.
    pub rejected: AtomicI64,
    /// Records waiting between the sources and the writer.
    pub queue_depth: AtomicI64,
    /// Write latency of `events` batches since the last status line (µs).
    pub write_latency_us: Mutex<Option<hdrhistogram::Histogram<u64>>>,
}

/// The ingester's collections.
pub struct Ingester {
    /// The capped collection of events.
    pub events: Arc<dyn Capped>,
    /// The capped collection of rejected records.
    pub dead_letters: Arc<dyn Capped>,
    /// The changefeed-backed per-key counters.
    pub rollups: Arc<dyn Keyed>,
    /// Settings.
    pub options: IngestOptions,
    /// `embedded` or `mongodb`, for metric labels.
    pub engine: &'static str,
    /// Shared counters for the status line and API.
    pub stats: Arc<IngestStats>,
}

impl Ingester {
    /// The next sequence number of `source`: one after the newest stored, so sequences continue
    /// across restarts (and crashes: only acknowledged writes are found).
    ///
    /// The events and the rollups of a batch are written concurrently (on the embedded engine
    /// they usually share one group commit, but need not), so a crash between the two commits
    /// can leave either one ahead. When the `source:<name>` rollup is behind, the missing
    /// rollup updates are applied from the stored events, so change feeds see every sequence
    /// number too. When it is ahead, the sequence continues after it, and the events that never
    /// committed are counted as missing by tailable feeds.
    async fn recover_source(&self, source: &str) -> Result<u64, StoreError> {
        let newest_event = self
            .events
            .latest(STAMP_SOURCE_PATH, &json!(source), 1)
            .await?
            .first()
            .and_then(|r| Stamp::of(&r.doc))
            .map(|s| s.seq);
        let rollup_seq = self
            .rollups
            .get(&format!("source:{source}"))
            .await?
            .and_then(|d| Stamp::of(&d))
            .map(|s| s.seq);
        if let Some(event_seq) = newest_event {
            let behind = event_seq.saturating_sub(rollup_seq.unwrap_or(0));
            if behind > 0 {
                self.repair_rollups(source, rollup_seq.unwrap_or(0), behind)
                    .await?;
            }
        }
        Ok(newest_event.max(rollup_seq).map_or(1, |s| s + 1))
    }

    async fn repair_rollups(
        &self,
        source: &str,
        after_seq: u64,
        behind: u64,
    ) -> Result<(), StoreError> {
        const MAX_REPAIR: u64 = 100_000;
        if behind > MAX_REPAIR {
            tracing::warn!(
                source,
                behind,
                "rollups are too far behind the events to repair; change feeds will count the difference as missing"
            );
            return Ok(());
        }
        let newest_first = self
            .events
            .latest(STAMP_SOURCE_PATH, &json!(source), behind as usize)
            .await?;
        let mut updates = Vec::new();
        let mut repaired = 0;
        for record in newest_first.iter().rev() {
            if Stamp::of(&record.doc).is_some_and(|s| s.seq > after_seq) {
                rollups(&record.doc, source, &self.options, &mut updates);
                repaired += 1;
            }
        }
        self.rollups.update(updates, Durability::Journaled).await?;
        tracing::info!(
            source,
            repaired,
            "rollups caught up with events written just before a crash"
        );
        Ok(())
    }

    /// Runs until every sender of `rx` is gone and the last batch is written.
    pub async fn run(self, mut rx: mpsc::Receiver<Handed>) {
        let mut next_seq: HashMap<Arc<str>, u64> = HashMap::new();
        let mut batch: Vec<Handed> = Vec::with_capacity(self.options.batch_max_events);
        loop {
            batch.clear();
            // Wait for the first record, then up to batch_max_wait for more.
            let Some(first) = rx.recv().await else { break };
            batch.push(first);
            let deadline = tokio::time::Instant::now() + self.options.batch_max_wait;
            while batch.len() < self.options.batch_max_events {
                match rx.try_recv() {
                    Ok(h) => batch.push(h),
                    Err(mpsc::error::TryRecvError::Empty) => {
                        match tokio::time::timeout_at(deadline, rx.recv()).await {
                            Ok(Some(h)) => batch.push(h),
                            Ok(None) | Err(_) => break,
                        }
                    }
                    Err(mpsc::error::TryRecvError::Disconnected) => break,
                }
            }
            let d = self
                .stats
                .queue_depth
                .fetch_sub(batch.len() as i64, Ordering::Relaxed)
                - batch.len() as i64;
            t::queue_depth(d);
            self.write_batch(&mut batch, &mut next_seq).await;
        }
        tracing::info!("ingester flushed and stopped");
    }

    async fn write_batch(&self, batch: &mut Vec<Handed>, next_seq: &mut HashMap<Arc<str>, u64>) {
        let now = now_us();
        let mut docs = Vec::with_capacity(batch.len());
        let mut dead = Vec::new();
        let mut updates = Vec::new();
        let mut last_seq: HashMap<Arc<str>, u64> = HashMap::new();
        for h in batch.drain(..) {
            match validate(h.raw, self.options.max_event_bytes) {
                Ok(mut doc) => {
                    let seq = match next_seq.get_mut(&h.source) {
                        Some(s) => s,
                        None => {
                            let mut backoff =
                                Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
                            let start = loop {
                                match self.recover_source(&h.source).await {
                                    Ok(s) => break s,
                                    Err(e) => {
                                        let wait = backoff.next_wait();
                                        tracing::error!(source = %h.source, error = %e, retry_in = ?wait, "cannot read the last sequence number; retrying");
                                        tokio::time::sleep(wait).await;
                                    }
                                }
                            };
                            t::SequenceRecovered {
                                source: &h.source,
                                next_seq: start,
                            }
                            .emit();
                            next_seq.entry(h.source.clone()).or_insert(start)
                        }
                    };
                    let stamp = Stamp {
                        source: h.source.to_string(),
                        seq: *seq,
                        received_us: h.received_us,
                        ingested_us: now,
                    };
                    validate::stamp(&mut doc, &stamp);
                    last_seq.insert(h.source.clone(), *seq);
                    *seq += 1;
                    rollups(&doc, &h.source, &self.options, &mut updates);
                    docs.push(doc);
                }
                Err((rejection, bytes)) => {
                    t::RecordRejected {
                        source: &h.source,
                        reason: rejection.reason,
                    }
                    .emit();
                    self.stats.rejected.fetch_add(1, Ordering::Relaxed);
                    dead.push(dead_letter(&h.source, &rejection, &bytes, h.received_us));
                }
            }
        }
        coalesce_counters(&mut updates);
        let n = docs.len();
        let d = self.options.durability;
        let (events, rollups, dead_letters) = tokio::join!(
            self.timed(self.events.name(), n, || self
                .events
                .append(docs.clone(), d)),
            self.timed("rollups", updates.len(), || self
                .rollups
                .update(updates.clone(), d)),
            self.timed(self.dead_letters.name(), dead.len(), || self
                .dead_letters
                .append(dead.clone(), d)),
        );
        let _ = (rollups, dead_letters);
        if let Some(us) = events {
            self.stats.written.fetch_add(n as i64, Ordering::Relaxed);
            if let Ok(mut h) = self.stats.write_latency_us.lock()
                && let Some(h) = h.as_mut()
            {
                let _ = h.record(us.max(1));
            }
            for (source, seq) in last_seq {
                t::sequence_acked(&source, seq);
            }
        }
    }

    /// Runs a write, retrying with backoff until it succeeds (nothing is dropped while the
    /// store is down; backpressure reaches the sources), and records its latency.
    /// Returns the latency in µs of the successful attempt, or `None` for an empty write.
    async fn timed<F, Fut, T>(&self, collection: &str, n: usize, mut write: F) -> Option<u64>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, StoreError>>,
    {
        if n == 0 {
            return None;
        }
        let d = self.options.durability;
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        loop {
            let start = Instant::now();
            match write().await {
                Ok(_) => {
                    let latency = start.elapsed();
                    t::WriteAcked {
                        engine: self.engine,
                        collection,
                        durability: d,
                        latency,
                    }
                    .emit();
                    return Some(latency.as_micros() as u64);
                }
                Err(e) => {
                    let wait = backoff.next_wait();
                    t::WriteFailed {
                        collection,
                        items: n,
                        error: e.to_string(),
                        retry_in: wait,
                    }
                    .emit();
                    if matches!(e, StoreError::Closed) {
                        return None;
                    }
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }
}
