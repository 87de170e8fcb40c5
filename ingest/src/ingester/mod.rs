//! The ingester: validates each record, stamps it, groups records into batches, writes them
//! with the configured durability, keeps the per-key counters of the `rollups` collection, and
//! keeps every rejected record as a dead letter with its reason.
//!
//! Three stages, each a task (`Ingester::run`), joined by channels of one batch, so the store's
//! writer always has the next commit queued:
//! - **prepare** takes up to `ingest.batch_max_events` records (or what came within
//!   `ingest.batch_max_wait_ms`), validates each, stamps it with its source's next sequence
//!   number and its place, if its source's rules find one ([`crate::geo`]), and derives its
//!   rollup updates;
//! - **events** writes the batch's events and dead letters, in hand-over order (`order`): a
//!   crash leaves each source a prefix of what it handed over, so a source resumed after its
//!   newest stored record loses nothing;
//! - **rollups** coalesces the counters of each key, writes the rollups and accounts for the
//!   batch, while the events stage already writes the next batch's events (with two stages the
//!   writer would sit idle between a batch's two commits). It hands its updates to the store by
//!   value; should that write fail, it derives them again from the batch's events, with the
//!   same names (`write_isolating_remade`).
//!
//! Each stage takes the batches in order, so sequence order is commit order, each key's rollups
//! apply in order, and a feed can prove completeness. A batch of at most `JOINT_MAX_EVENTS`
//! (64) events without dead letters commits its events and rollups together where the engine
//! can ([`store::Capped::commits_with`]: the embedded engine), after every earlier batch's
//! rollups: one commit, one sync and one wake-up of each reader instead of two. Otherwise the
//! rollups follow their events, so a crash leaves them behind, never ahead; startup rebuilds
//! them from the stored events (`recover_source`). On the embedded engine rollups written in
//! turn go `acknowledged` whatever the configured level (`rollups_durability`): the next synced
//! events commit makes them durable, and only a crash of the machine loses them, which restarts
//! tailrace. A server can lose what it did not journal and restart on its own, so on MongoDB
//! they keep the configured level.
//!
//! A transient store error is retried with backoff while backpressure holds the sources; a
//! permanent one splits the batch until the refused record is alone, and it becomes a
//! `store_rejected` dead letter ([`write`]).
//!
//! Layout: this file runs the loop; [`validate`] decides what is an event (keys are stored as
//! sent) and what a dead letter keeps; [`rollups`] derives the `rollups` updates of each event;
//! [`write`] writes a batch so that transient failures are retried and permanent ones
//! isolated; `order` puts a batch's events and dead letters in hand-over order; [`retention`]
//! removes rollup counters that went idle.

mod durability;
mod order;
pub mod retention;
pub mod rollups;
pub mod validate;
pub mod write;

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use store::backoff::Backoff;
use store::clock::now_us;
use store::{
    Capped, Document, Durability, GEO_FIELD, KeyUpdate, Keyed, STAMP_FIELD, STAMP_SOURCE_PATH,
    Stamp, StoreError,
};
use tokio::sync::mpsc;

use durability::{interim_durability, rollups_durability};
use rollups::UpdateNames;
pub use rollups::{coalesce_counters, rollups};
pub use validate::{Rejection, dead_letter, validate};
pub use write::StoreHealth;

use write::{
    Refused, Written, write_isolating, write_isolating_remade, write_together, write_until_refused,
};

use crate::geo::{GeoRules, GeoTally};
use crate::source::{Raw, RejectReason};
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
    /// The fields (dotted paths) copied from each event into its `source:<name>` rollup, which
    /// change feeds read instead of the event: the fields the feeds' statistics declare they
    /// read (`feeds::stats::fields_read`).
    pub summary_fields: Vec<String>,
    /// Write concern of every write.
    pub durability: Durability,
    /// Where each source's events come from, by source name, presets filled in
    /// ([`crate::geo`]): stamped as `_tailrace.geo`. A source not in it places no event.
    pub geo: GeoRules,
}

/// A record as handed over by a source, with the time of hand-over.
pub struct Handed {
    /// The source's name.
    pub source: Arc<str>,
    /// The record.
    pub raw: Raw,
    /// When the source handed it over (µs since the epoch); strictly increasing per source,
    /// and made non-decreasing across sources in the order the ingester stores them.
    pub received_us: i64,
    /// The source's position right after this record, if it can resume (see
    /// [`crate::source::Source::positioned`]); stored in the stamp of the event it becomes.
    pub position: Option<Value>,
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
    /// The metrics each commit records into, registered once.
    pub(crate) meters: t::Meters,
    /// What the geo metrics counted, with where in each source's sequence (`GET /api/geo`).
    pub geo: Mutex<GeoTally>,
}

/// Told of every batch whose events the store acknowledged: how many were stored, at which
/// durability, and how long the write took as the ingester waited for it (its first
/// attempt). The one place to watch the ingester's writes (the `ingest` statistics document,
/// `tailrace bench insert`) without wrapping the collection it writes to.
pub trait WriteObserver: Send + Sync + 'static {
    /// One batch's events are stored and acknowledged.
    fn events_written(&self, events: usize, durability: Durability, latency: Duration);
}

/// A batch ready for the store.
struct Prepared {
    /// Validated, stamped events, shared with the store (and through it with live tails) ...
    docs: Vec<Arc<Document>>,
    /// ... and the source each came from.
    sources: Vec<Arc<str>>,
    /// Their rollup updates, uncoalesced ...
    updates: Vec<KeyUpdate>,
    /// ... and the index in `docs` of the event each belongs to (the updates of an event the
    /// store refuses are not applied).
    owners: Vec<usize>,
    /// Dead letters of the records that are not events ...
    dead: Vec<Document>,
    /// ... and, for each, how many of `docs` were handed over before it (the batch is written
    /// in that order: `order`).
    letters_at: Vec<usize>,
    /// The newest sequence number of each source in `docs`.
    last_seq: HashMap<Arc<str>, u64>,
}

/// A batch whose events are written, on its way to the rollups ([`Ingester::write_rollups`]).
struct Landed {
    /// How many events the batch had.
    n: usize,
    /// What became of its events ...
    events: Written<Arc<Document>>,
    /// ... and of its dead letters.
    dead_letters: Written<Arc<Document>>,
    /// The rollup updates of its stored events, uncoalesced ...
    updates: Vec<KeyUpdate>,
    /// ... and those events with their sources, in order: their updates again, should the
    /// first attempt to write them fail ([`write_isolating_remade`]).
    stored: Vec<(Arc<Document>, Arc<str>)>,
    /// The newest sequence number of each source among its events.
    last_seq: HashMap<Arc<str>, u64>,
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
    /// Whether the store takes writes (for `/readyz` and the gauge).
    pub health: Arc<StoreHealth>,
    /// Told of every batch written, if any.
    pub observer: Option<Arc<dyn WriteObserver>>,
}

impl Ingester {
    /// Where `source` stood after its newest stored record: the position in the stamp of its
    /// newest event, or in its newest dead letter when that came later (a bad last record).
    /// Records re-ingested by `tailrace dead-letters replay` carry no position and an old
    /// hand-over time, so they are passed over. `None` for a source that never stored a
    /// position (or cannot resume).
    pub async fn stored_position(&self, source: &str) -> Result<Option<Value>, StoreError> {
        /// Newest events looked at: more than a replay usually re-ingests at once.
        const LOOK_BACK: usize = 256;
        let key = json!(source);
        let event = self
            .events
            .latest(STAMP_SOURCE_PATH, &key, LOOK_BACK)
            .await?
            .iter()
            .filter_map(|r| Stamp::of(&r.doc))
            .filter_map(|s| Some((s.received_us, s.position?)))
            .max_by_key(|(at, _)| *at);
        let letter = self
            .dead_letters
            .latest("source", &key, 1)
            .await?
            .into_iter()
            .next()
            .and_then(|r| {
                let at = r.doc.get("received_us").and_then(Value::as_i64)?;
                Some((at, r.doc.get("position").cloned()?))
            });
        Ok(match (event, letter) {
            (Some(e), Some(l)) if l.0 > e.0 => Some(l.1),
            (Some(e), _) => Some(e.1),
            (None, l) => l.map(|l| l.1),
        })
    }

    /// Repairs the `source:<name>` rollup of `source` when it is behind its stored events (a
    /// crash between a batch's events and rollups commits; see `recover_source`). The pipeline
    /// calls it for every source at startup: the repair at a source's first record in a run is
    /// not enough, since a source may never hand over another one (a replay at the end of its
    /// file), and its summary would stay behind for good.
    pub async fn catch_up_rollups(&self, source: &str) -> Result<(), StoreError> {
        self.recover_source(source).await.map(|_| ())
    }

    /// The next sequence number of `source`: one after the newest stored, so sequences continue
    /// across restarts (and crashes: only acknowledged writes are found).
    ///
    /// A batch's rollups are written after its events, or with them in one commit (a small
    /// batch on the embedded engine, [`JOINT_MAX_EVENTS`]), so a crash between two commits
    /// leaves the rollups behind. When the `source:<name>` rollup is behind, the missing
    /// rollup updates are applied from the stored events, so change feeds see every sequence
    /// number too. Should it be ahead (a server that rolled back journaled events), the
    /// sequence continues after it, and the events that never committed are counted as
    /// missing by tailable feeds.
    async fn recover_source(&self, source: &str) -> Result<u64, StoreError> {
        /// Newest dead letters looked at for a store-refused event's sequence number (those of
        /// records that were not events, which carry none, may be newer).
        const LETTERS_LOOK_BACK: usize = 256;
        let letters = match self
            .dead_letters
            .latest("source", &json!(source), LETTERS_LOOK_BACK)
            .await
        {
            Ok(letters) => letters,
            // A dead-letters collection opened without the index (by a library user; the
            // pipeline always has it) cannot answer, and asking again will not help: the
            // sequence then continues after the stored events only.
            Err(e @ StoreError::NotIndexed { .. }) => {
                t::Problem {
                    component: "ingester",
                    error_type: "store_read",
                    detail: &format!(
                        "source {source}: {e}; a store-refused event's sequence number may be \
                         given again after a restart (index `source` on the dead letters)"
                    ),
                }
                .warn();
                Vec::new()
            }
            Err(e) => return Err(e),
        };
        let refused_seq = letters
            .iter()
            .filter_map(|r| r.doc.get("seq").and_then(Value::as_u64))
            .max();
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
        Ok(newest_event
            .max(rollup_seq)
            .max(refused_seq)
            .map_or(1, |s| s + 1))
    }

    async fn repair_rollups(
        &self,
        source: &str,
        after_seq: u64,
        behind: u64,
    ) -> Result<(), StoreError> {
        const MAX_REPAIR: u64 = 100_000;
        if behind > MAX_REPAIR {
            t::Problem {
                component: "ingester",
                error_type: "rollups_behind",
                detail: &format!(
                    "source {source}: rollups are {behind} events behind the events, too far to repair; change feeds will count the difference as missing"
                ),
            }
            .warn();
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
    ///
    /// Three stages, each a task, so the store's writer is not idle while a batch is between
    /// two of its commits: this task gathers a batch and prepares it (validation, stamps,
    /// rollup updates); the second writes its events (and dead letters); the third writes its
    /// rollups and accounts for it, while the second already writes the next batch's events.
    /// Each stage takes the batches in order: sequence order is still commit order, and each
    /// key's rollups are applied in order.
    pub async fn run(self, mut rx: mpsc::Receiver<Handed>) {
        let this = Arc::new(self);
        let (to_write, mut prepared) = mpsc::channel::<Prepared>(1);
        let (to_roll, mut landed) = mpsc::channel::<Landed>(1);
        // How many batches the third stage has finished: a joint commit waits for all before.
        let (rolled, mut rolled_rx) = tokio::sync::watch::channel(0u64);
        let roller = {
            let this = this.clone();
            tokio::spawn(async move {
                let mut names = UpdateNames::new();
                while let Some(batch) = landed.recv().await {
                    this.write_rollups(batch, &mut names).await;
                    rolled.send_modify(|n| *n += 1);
                }
            })
        };
        let writer = {
            let this = this.clone();
            tokio::spawn(async move {
                let mut sent = 0u64;
                while let Some(batch) = prepared.recv().await {
                    let Some(rest) = this.write_events(batch, &mut rolled_rx, sent).await else {
                        continue;
                    };
                    sent += 1;
                    if to_roll.send(rest).await.is_err() {
                        break;
                    }
                }
            })
        };
        let mut next_seq: HashMap<Arc<str>, u64> = HashMap::new();
        let mut batch: Vec<Handed> = Vec::with_capacity(this.options.batch_max_events);
        let mut last_received_us = i64::MIN;
        loop {
            batch.clear();
            if !gather(
                &mut rx,
                &mut batch,
                this.options.batch_max_events,
                this.options.batch_max_wait,
            )
            .await
            {
                break;
            }
            let d = this
                .stats
                .queue_depth
                .fetch_sub(batch.len() as i64, Ordering::Relaxed)
                - batch.len() as i64;
            t::queue_depth(d);
            // Receipt order is store order: sources hand over concurrently, so one may stamp a
            // record a few microseconds before another's that reaches this queue first. Each
            // takes at least the previous one's time, so that the stored received times only
            // grow along the collection and a time range is a range of positions (see
            // `store::Capped::time_span`). Still strictly increasing per source.
            for h in &mut batch {
                h.received_us = h.received_us.max(last_received_us.saturating_add(1));
                last_received_us = h.received_us;
            }
            let ready = this.prepare(&mut batch, &mut next_seq).await;
            if to_write.send(ready).await.is_err() {
                break;
            }
        }
        drop(to_write);
        for (stage, task) in [("events", writer), ("rollups", roller)] {
            if let Err(e) = task.await {
                t::Problem {
                    component: "ingester",
                    error_type: "task_failed",
                    detail: &format!("the {stage} stage of the ingester failed: {e}"),
                }
                .error();
            }
        }
        tracing::info!("ingester flushed and stopped");
    }

    /// Validates and stamps a batch, and derives its rollup updates.
    async fn prepare(
        &self,
        batch: &mut Vec<Handed>,
        next_seq: &mut HashMap<Arc<str>, u64>,
    ) -> Prepared {
        let now = now_us();
        let mut ready = Prepared {
            docs: Vec::with_capacity(batch.len()),
            sources: Vec::with_capacity(batch.len()),
            updates: Vec::with_capacity(batch.len() * 4),
            owners: Vec::with_capacity(batch.len() * 4),
            dead: Vec::new(),
            letters_at: Vec::new(),
            last_seq: HashMap::new(),
        };
        let mut tally = GeoTally::default();
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
                                        t::Problem {
                                            component: "ingester",
                                            error_type: "store_read",
                                            detail: &format!("source {}: cannot read the last sequence number ({e}); retrying in {wait:?}", h.source),
                                        }
                                        .error();
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
                        position: h.position,
                    };
                    // Read from the event as sent, before its own `_id`/`_tailrace` move.
                    let geo = self
                        .options
                        .geo
                        .get(&*h.source)
                        .and_then(|rules| rules.locate(&doc));
                    validate::stamp(&mut doc, &stamp);
                    if let Some(geo) = &geo
                        && let Some(Value::Object(stamped)) = doc.get_mut(STAMP_FIELD)
                    {
                        stamped.insert(GEO_FIELD.to_owned(), geo.to_value());
                    }
                    self.stats.meters.placed(geo.as_ref());
                    tally.add(geo.as_ref());
                    ready.last_seq.insert(h.source.clone(), *seq);
                    *seq += 1;
                    rollups(&doc, &h.source, &self.options, &mut ready.updates);
                    ready.owners.resize(ready.updates.len(), ready.docs.len());
                    ready.docs.push(Arc::new(doc));
                    ready.sources.push(h.source.clone());
                }
                Err((rejection, bytes)) => {
                    t::RecordRejected {
                        source: &h.source,
                        reason: rejection.reason,
                    }
                    .emit();
                    self.stats.rejected.fetch_add(1, Ordering::Relaxed);
                    let mut letter = dead_letter(&h.source, &rejection, &bytes, h.received_us);
                    if let Some(p) = h.position {
                        // So a restart resumes after a bad last record too.
                        letter.insert("position".into(), p);
                    }
                    ready.dead.push(letter);
                    ready.letters_at.push(ready.docs.len());
                }
            }
        }
        // Once per batch, so a reader of the tally never sees half a batch.
        if let Ok(mut total) = self.stats.geo.lock() {
            total.merge(
                &tally,
                ready.last_seq.iter().map(|(source, seq)| (&**source, *seq)),
            );
        }
        ready
    }

    /// The second stage: writes a batch's events and dead letters, and returns what the third
    /// stage needs to write its rollups ([`Ingester::write_rollups`]). A small batch commits
    /// its events and rollups together where the engine can, once every earlier batch's
    /// rollups are written (`rolled` has reached `sent`), so a key's rollups stay in order;
    /// that batch is accounted for here and `None` returned.
    async fn write_events(
        &self,
        ready: Prepared,
        rolled: &mut tokio::sync::watch::Receiver<u64>,
        sent: u64,
    ) -> Option<Landed> {
        let Prepared {
            mut docs,
            sources,
            mut updates,
            mut owners,
            mut dead,
            letters_at,
            last_seq,
        } = ready;
        let d = self.options.durability;
        let n = docs.len();
        // A small batch without dead letters (a slow stream's, the usual one): events and
        // rollups in one commit where the engine can ([`write_together`]); both land or
        // neither does, so the rollups are never behind. The events' durability covers both.
        if n <= JOINT_MAX_EVENTS
            && dead.is_empty()
            && self.events.commits_with(self.rollups.as_ref())
        {
            // Every earlier batch's rollups first (the third stage may still be on them).
            let _ = rolled.wait_for(|done| *done >= sent).await;
            // Handed over, not copied: a failed attempt writes nothing, and the updates are
            // derived again from the events for the writes in turn (as `write_rollups`
            // remakes them), which is rarer than a copy of every batch's updates.
            if let Some(latency) = write_together(
                &self.events,
                &self.rollups,
                &docs,
                std::mem::take(&mut updates),
                d,
                &self.health,
            )
            .await
            {
                let (events, rollups) = (Written::landed(latency), Written::landed(latency));
                self.account(n, events, (rollups, d), Written::none(), last_seq)
                    .await;
                return None;
            }
            owners.clear();
            for (i, (doc, source)) in docs.iter().zip(&sources).enumerate() {
                rollups(doc, source, &self.options, &mut updates);
                owners.resize(updates.len(), i);
            }
        }
        // The events, shared with what the store keeps, and their sources: the rollups are
        // derived from them again only if their first write fails.
        let stored: Vec<(Arc<Document>, Arc<str>)> = docs.iter().cloned().zip(sources).collect();
        // Events and dead letters in hand-over order, stage after stage ([`order`]): a crash
        // leaves each source a prefix of what it handed over, so a restart that resumes after
        // its newest stored record loses no record. The last stage's dead letters too are
        // written before the next batch's events, for the same reason. Then the rollups, in
        // the third stage, after every event of the batch: a crash in between leaves the
        // rollups behind the events, never ahead (recovery repairs behind; ahead would count
        // events twice once their source re-reads them from the stored position).
        //
        // Stages before the last are committed without waiting for stable storage
        // (`acknowledged`): the last stage's events, committed after them with the configured
        // durability, make them durable too (one log, flushed in order: the embedded
        // engine's journal, MongoDB's), and nothing of the batch is acknowledged to a source before. So
        // a batch with rejects among its events costs one more commit per stage, not one more
        // fsync. Not so for `majority`: a failover between two stages can roll the earlier
        // ones back on the old primary while the retried last stage lands on the new one, so
        // with `majority` every stage waits for the majority. On the embedded engine the
        // rollups skip the sync too ([`rollups_durability`]).
        let stages = order::stages(docs.len(), &letters_at);
        let interim = interim_durability(d);
        let mut events = Written::none();
        let mut dead_letters = Written::none();
        for (i, stage) in stages.iter().enumerate() {
            let last = i + 1 == stages.len();
            let durability = if last { d } else { interim };
            let mut part = take_front(&mut docs, stage.events.len());
            let mut at = stage.events.start;
            // An event the store refuses becomes a dead letter before any later event is
            // written: hand-over order holds for it too.
            loop {
                let sent = part.len();
                let (written, rest) =
                    write_until_refused(self.events.name(), part, &self.health, |docs| {
                        let events = self.events.clone();
                        async move { events.append_shared(docs, durability).await.map(|_| ()) }
                    })
                    .await;
                let letters: Vec<Document> = written
                    .refused
                    .iter()
                    .map(|r| Self::store_rejected_letter(self.events.name(), &r.item, &r.error))
                    .collect();
                events.absorb(written, at);
                if !letters.is_empty() {
                    let kept = self.write_letters(letters, durability).await;
                    dead_letters.absorb(kept, 0);
                }
                if rest.is_empty() {
                    break;
                }
                at += sent - rest.len();
                part = rest;
            }
            let letters = take_front(&mut dead, stage.letters.len());
            let written = self.write_letters(letters, durability).await;
            dead_letters.absorb(written, stage.letters.start);
        }
        // The rollups of the events that were stored (not of the ones the store refused).
        let (updates, stored) = if events.refused.is_empty() {
            (updates, stored)
        } else {
            let refused: std::collections::HashSet<usize> =
                events.refused.iter().map(|r| r.index).collect();
            let stored = stored
                .into_iter()
                .enumerate()
                .filter(|(i, _)| !refused.contains(i))
                .map(|(_, s)| s)
                .collect();
            let updates = updates
                .into_iter()
                .zip(owners)
                .filter(|(_, event)| !refused.contains(event))
                .map(|(u, _)| u)
                .collect();
            (updates, stored)
        };
        Some(Landed {
            n,
            events,
            dead_letters,
            updates,
            stored,
            last_seq,
        })
    }

    /// The dead letter of an event the store refused (reason `store_rejected`): the stamped
    /// event as it was sent to the store, and the store's reason.
    fn store_rejected_letter(collection: &str, doc: &Document, error: &StoreError) -> Document {
        let stamp = Stamp::of(doc);
        let source = stamp.as_ref().map_or("", |s| s.source.as_str());
        let bytes = serde_json::to_vec(doc).unwrap_or_default();
        let rejection = Rejection {
            reason: RejectReason::StoreRejected,
            detail: format!("{collection}: {error}"),
        };
        let received = stamp.as_ref().map_or(0, |s| s.received_us);
        let mut letter = dead_letter(source, &rejection, &bytes, received);
        if let Some(stamp) = stamp {
            // Its sequence number was given, and its source moved past it: a restart
            // continues after both (`stored_position`, `recover_source`), as after a stored
            // event.
            letter.insert("seq".into(), json!(stamp.seq));
            if let Some(p) = stamp.position {
                letter.insert("position".into(), p);
            }
        }
        letter
    }

    /// The third stage: writes the rollups of a batch whose events are written, then accounts
    /// for the batch. Each update is named (`names`), so one that landed before a failure whose
    /// outcome was not known (a reply lost with its connection) counts once when the batch is
    /// written again.
    async fn write_rollups(&self, batch: Landed, names: &mut UpdateNames) {
        let Landed {
            n,
            events,
            dead_letters,
            mut updates,
            stored,
            last_seq,
        } = batch;
        coalesce_counters(&mut updates);
        let mut again = names.clone();
        names.name(&mut updates);
        // The same updates with the same names: derived, merged and named as above.
        let capacity = updates.len();
        let remake = move || {
            let mut updates = Vec::with_capacity(capacity);
            for (doc, source) in &stored {
                rollups(doc, source, &self.options, &mut updates);
            }
            coalesce_counters(&mut updates);
            again.name(&mut updates);
            updates
        };
        let rollups_d = rollups_durability(
            self.options.durability,
            self.events.syncs_earlier_commits_of(self.rollups.as_ref()),
        );
        let rollups = write_isolating_remade("rollups", updates, remake, &self.health, |updates| {
            let rollups = self.rollups.clone();
            async move { rollups.update(updates.into_vec(), rollups_d).await }
        })
        .await;
        self.account(n, events, (rollups, rollups_d), dead_letters, last_seq)
            .await;
    }

    /// Appends dead letters (transient failures retried, refused ones isolated).
    async fn write_letters(&self, letters: Vec<Document>, d: Durability) -> Written<Arc<Document>> {
        let letters = letters.into_iter().map(Arc::new).collect();
        write_isolating(self.dead_letters.name(), letters, &self.health, |dead| {
            let letters = self.dead_letters.clone();
            async move { letters.append_shared(dead, d).await.map(|_| ()) }
        })
        .await
    }

    /// Counts what was written, turns events the store refused into dead letters (reason
    /// `store_rejected`), and reports what could not be kept anywhere.
    async fn account(
        &self,
        n: usize,
        events: Written<Arc<Document>>,
        (rollups, rollups_d): (Written<store::KeyUpdate>, Durability),
        dead_letters: Written<Arc<Document>>,
        last_seq: HashMap<Arc<str>, u64>,
    ) {
        let d = self.options.durability;
        let events_name = self.events.name();
        // Every event that was neither refused nor left unwritten at shutdown.
        let stored = n - events.refused.len() - events.unwritten;
        self.stats
            .written
            .fetch_add(stored as i64, Ordering::Relaxed);
        // Events the store refused: their dead letters were written in their place, in
        // hand-over order (`write_events`); here they are counted.
        for Refused {
            item: doc, error, ..
        } in &events.refused
        {
            let stamp = Stamp::of(doc);
            let source = stamp.as_ref().map_or("", |s| s.source.as_str());
            t::StoreRefused {
                collection: events_name,
                what: stamp.as_ref().map_or_else(String::new, |s| {
                    format!("event {} of source {}", s.seq, s.source)
                }),
                error,
                outcome: "dead letters",
            }
            .emit();
            t::RecordRejected {
                source,
                reason: RejectReason::StoreRejected,
            }
            .emit();
        }
        self.stats
            .rejected
            .fetch_add(events.refused.len() as i64, Ordering::Relaxed);
        let lost = dead_letters.refused;
        for Refused {
            item: letter,
            error,
            ..
        } in &lost
        {
            t::StoreRefused {
                collection: self.dead_letters.name(),
                what: format!(
                    "a dead letter of source {} ({})",
                    letter.get("source").and_then(Value::as_str).unwrap_or("?"),
                    letter.get("reason").and_then(Value::as_str).unwrap_or("?"),
                ),
                error,
                outcome: "lost",
            }
            .emit();
        }
        for Refused {
            item: update,
            error,
            ..
        } in &rollups.refused
        {
            t::StoreRefused {
                collection: "rollups",
                what: format!("the update of key {:?}", update.key),
                error,
                outcome: "dropped (its event is stored)",
            }
            .emit();
        }
        if let Some(latency) = events.latency {
            if let Some(o) = &self.observer {
                o.events_written(stored, d, latency);
            }
            if let Ok(mut h) = self.stats.write_latency_us.lock()
                && let Some(h) = h.as_mut()
            {
                let _ = h.record((latency.as_micros() as u64).max(1));
            }
            t::WriteAcked {
                engine: self.engine,
                collection: events_name,
                durability: d,
                latency,
            }
            .emit_to(&self.stats.meters);
            for (source, seq) in last_seq {
                self.stats.meters.sequence_acked(&source, seq);
            }
        }
        for (collection, written, durability) in [
            ("rollups", rollups.latency, rollups_d),
            (self.dead_letters.name(), dead_letters.latency, d),
        ] {
            if let Some(latency) = written {
                t::WriteAcked {
                    engine: self.engine,
                    collection,
                    durability,
                    latency,
                }
                .emit_to(&self.stats.meters);
            }
        }
    }
}

/// A batch of at most this many events commits its events and rollups together where the
/// engine can. One commit instead of two pays where commits are many and small (a slow
/// stream, a single client): half the commits, syncs and wake-ups of the feeds. A large batch
/// keeps two commits: its feeds get the events while the writer is still on their rollups,
/// where waiting for both held every event of the batch back by the rollups' commit and
/// gained no throughput.
const JOINT_MAX_EVENTS: usize = 64;

/// Gathers the next batch into `batch` (empty on entry): waits for a first record, takes what
/// is queued behind it, and waits up to `max_wait` for more, to at most `max` records. False
/// when every sender is gone and nothing was left.
///
/// A zero `max_wait` arms no timer: tokio's timers tick in whole milliseconds, so a deadline of
/// "now" would still hold a lone event up to a millisecond and join it to whatever came
/// meanwhile, which is not what an operator asking for no wait means.
async fn gather<T>(
    rx: &mut mpsc::Receiver<T>,
    batch: &mut Vec<T>,
    max: usize,
    max_wait: Duration,
) -> bool {
    let Some(first) = rx.recv().await else {
        return false;
    };
    batch.push(first);
    let deadline = tokio::time::Instant::now() + max_wait;
    while batch.len() < max {
        match rx.try_recv() {
            Ok(h) => batch.push(h),
            Err(mpsc::error::TryRecvError::Empty) if max_wait.is_zero() => break,
            Err(mpsc::error::TryRecvError::Empty) => {
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(h)) => batch.push(h),
                    Ok(None) | Err(_) => break,
                }
            }
            Err(mpsc::error::TryRecvError::Disconnected) => break,
        }
    }
    true
}

/// The first `n` items of `items`, removed from it (without copying the documents).
fn take_front<T>(items: &mut Vec<T>, n: usize) -> Vec<T> {
    let rest = items.split_off(n.min(items.len()));
    std::mem::replace(items, rest)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
