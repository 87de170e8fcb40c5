//! `tailrace dead-letters`: what was rejected, by source and reason, and `replay`: submit the
//! rejected records again, through the same validation, once their cause is fixed (a raised
//! `ingest.max_event_bytes`, say).
//!
//! ## How a replayed dead letter is "removed"
//!
//! `dead_letters` is a capped collection, and the store contract has no delete for capped
//! collections (eviction only; MongoDB forbids deletes from capped collections too). So a
//! replay does not delete: it records each dead letter it re-ingested in a keyed collection,
//! `dead_letters_replayed` (key = the dead letter's position, zero-padded so keys sort like
//! positions), and listing and replaying skip those positions. Why per-letter markers and not
//! a single "replayed up to position P" checkpoint: a replay re-ingests only the letters that
//! now pass and leaves the rest, so what is removed is not a prefix. The markers cannot grow
//! without bound: every replay deletes the markers of positions that eviction has already
//! removed from `dead_letters`.
//!
//! Replay is at-least-once: the events are written (and acknowledged) before their markers,
//! so a crash in between replays those letters again on the next run; nothing is lost.
//!
//! What cannot be replayed, and is reported as such: a dead letter whose raw copy was cut (the
//! dead letter keeps the first 4096 bytes), an `invalid_utf8` one (its stored copy is lossy),
//! and the `truncated` and `empty_event` ones (the source never had a whole record). A line
//! that was over the limit when the source read it was only kept as a prefix: its replay is
//! rejected again (as malformed JSON) and it stays.
//!
//! Both commands open the store directly, so the pipeline must be stopped (the embedded
//! engine's data directory is locked by a running pipeline, and the message says so).

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};
use store::{Capped, Keyed, Position, Start, Store};
use tokio::sync::mpsc;

use ingest::config::Config;
use ingest::ingester::{Handed, IngestStats, Ingester, validate};
use ingest::pipeline::{self, PipelineError};
use ingest::source::Raw;

/// The keyed collection of replayed dead letters' positions.
pub const REPLAYED: &str = "dead_letters_replayed";

/// Reasons whose stored raw copy can never pass again as it is.
const NOT_REPLAYABLE: [&str; 3] = ["invalid_utf8", "truncated", "empty_event"];

/// Which dead letters a command is about.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    /// Only this source's.
    pub source: Option<String>,
    /// Only this reason's.
    pub reason: Option<String>,
}

impl Filter {
    fn matches(&self, d: &DeadLetter) -> bool {
        self.source.as_ref().is_none_or(|s| *s == d.source)
            && self.reason.as_ref().is_none_or(|r| *r == d.reason)
    }
}

/// One retained dead letter.
#[derive(Clone, Debug, PartialEq)]
pub struct DeadLetter {
    /// Its position in `dead_letters`.
    pub position: u64,
    /// The source that handed it over.
    pub source: String,
    /// Why it was rejected.
    pub reason: String,
    /// The detail of the rejection.
    pub detail: String,
    /// The raw record (lossy UTF-8, at most 4096 bytes).
    pub raw: String,
    /// The raw record's full length.
    pub raw_len: u64,
    /// Whether `raw` is cut.
    pub truncated: bool,
    /// When the source handed it over (µs since the epoch).
    pub received_us: i64,
}

impl DeadLetter {
    fn from_doc(position: Position, doc: &store::Document) -> DeadLetter {
        let s = |k: &str| doc.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
        DeadLetter {
            position: position.0,
            source: s("source"),
            reason: s("reason"),
            detail: s("detail"),
            raw: s("raw"),
            raw_len: doc.get("raw_len").and_then(Value::as_u64).unwrap_or(0),
            truncated: doc
                .get("truncated")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            received_us: doc.get("received_us").and_then(Value::as_i64).unwrap_or(0),
        }
    }

    /// Why it cannot be replayed as stored, if so.
    pub fn not_replayable(&self) -> Option<&'static str> {
        if self.truncated {
            return Some("only the first 4096 bytes were kept");
        }
        NOT_REPLAYABLE
            .contains(&self.reason.as_str())
            .then_some(match self.reason.as_str() {
                "invalid_utf8" => "the stored copy of invalid UTF-8 is lossy",
                _ => "the source never had the whole record",
            })
    }
}

/// What `tailrace dead-letters` shows.
#[derive(Debug, Default)]
pub struct Listing {
    /// Matching, not replayed dead letters per (source, reason).
    pub groups: BTreeMap<(String, String), usize>,
    /// The newest matching ones, newest first (at most the limit asked for).
    pub newest: Vec<DeadLetter>,
    /// Dead letters retained in all (before filtering), and how many were replayed.
    pub retained: usize,
    /// Of `retained`, how many were already replayed (hidden).
    pub replayed: usize,
}

impl fmt::Display for Listing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total: usize = self.groups.values().sum();
        writeln!(
            f,
            "{total} dead letters ({} retained, {} already replayed)",
            self.retained, self.replayed
        )?;
        if total == 0 {
            return Ok(());
        }
        let w = self
            .groups
            .keys()
            .map(|(s, _)| s.len())
            .max()
            .unwrap_or(6)
            .max(6);
        writeln!(f, "\n  {:w$}  {:16}  count", "source", "reason")?;
        for ((source, reason), n) in &self.groups {
            writeln!(f, "  {source:w$}  {reason:16}  {n}")?;
        }
        if !self.newest.is_empty() {
            writeln!(f, "\nnewest {}:", self.newest.len())?;
            for d in &self.newest {
                let raw: String = d.raw.chars().take(100).collect();
                let more = if d.raw_len as usize > raw.len() {
                    format!(" … ({} bytes)", d.raw_len)
                } else {
                    String::new()
                };
                writeln!(
                    f,
                    "  #{} {} {} {}: {}\n      {raw:?}{more}",
                    d.position,
                    humantime::format_rfc3339_millis(
                        std::time::UNIX_EPOCH + Duration::from_micros(d.received_us.max(0) as u64)
                    ),
                    d.source,
                    d.reason,
                    d.detail
                )?;
            }
        }
        Ok(())
    }
}

/// What `tailrace dead-letters replay` did.
#[derive(Debug, Default, PartialEq)]
pub struct ReplayReport {
    /// Dead letters that matched the filter and were not replayed before.
    pub candidates: usize,
    /// Re-ingested now (or that would be, in a dry run).
    pub replayed: usize,
    /// Rejected again, by the reason of this validation.
    pub still_rejected: BTreeMap<String, usize>,
    /// Not replayable as stored, by why.
    pub not_replayable: BTreeMap<&'static str, usize>,
    /// Markers of evicted dead letters deleted.
    pub pruned: usize,
    /// Whether nothing was written.
    pub dry_run: bool,
}

impl fmt::Display for ReplayReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verb = if self.dry_run {
            "would replay"
        } else {
            "replayed"
        };
        writeln!(
            f,
            "{verb} {} of {} dead letters",
            self.replayed, self.candidates
        )?;
        for (reason, n) in &self.still_rejected {
            writeln!(f, "  {n} still rejected: {reason} (they stay)")?;
        }
        for (why, n) in &self.not_replayable {
            writeln!(f, "  {n} not replayable: {why} (they stay)")?;
        }
        Ok(())
    }
}

/// What a dead-letters command can fail with.
#[derive(Debug, thiserror::Error)]
pub enum DeadLetterError {
    /// The store could not be opened (e.g. the pipeline is running).
    #[error("{0}")]
    Open(#[from] PipelineError),
    /// A read or write failed.
    #[error("store: {0}")]
    Store(#[from] store::StoreError),
}

struct Opened {
    store: Arc<dyn Store>,
    dead: Arc<dyn Capped>,
    replayed: Arc<dyn Keyed>,
}

async fn open(c: &Config) -> Result<Opened, DeadLetterError> {
    let store = pipeline::open_store(c).await?;
    let dead = store
        .capped("dead_letters", &pipeline::dead_letters_spec(c))
        .await?;
    let replayed = store.keyed(REPLAYED).await?;
    Ok(Opened {
        store,
        dead,
        replayed,
    })
}

fn marker_key(position: u64) -> String {
    format!("{position:020}")
}

/// Every retained dead letter, oldest first, and the set of replayed positions.
async fn read_all(o: &Opened) -> Result<(Vec<DeadLetter>, HashSet<u64>), DeadLetterError> {
    let replayed: HashSet<u64> = o
        .replayed
        .scan("")
        .await?
        .into_iter()
        .filter_map(|e| e.key.parse().ok())
        .collect();
    let Some(store::Bounds { newest, .. }) = o.dead.bounds().await? else {
        return Ok((Vec::new(), replayed));
    };
    let mut out = Vec::new();
    let mut tail = o.dead.tail(Start::Oldest);
    while let Some(r) = tail.next().await {
        let r = r?;
        out.push(DeadLetter::from_doc(r.position, &r.doc));
        if r.position >= newest {
            break;
        }
    }
    Ok((out, replayed))
}

/// Lists the dead letters matching `filter` (not yet replayed): counts per source and reason
/// and the `limit` newest.
pub async fn list(c: &Config, filter: &Filter, limit: usize) -> Result<Listing, DeadLetterError> {
    let o = open(c).await?;
    let result = read_all(&o).await;
    let _ = o.store.close().await;
    let (all, replayed) = result?;
    let mut listing = Listing {
        retained: all.len(),
        replayed: all
            .iter()
            .filter(|d| replayed.contains(&d.position))
            .count(),
        ..Listing::default()
    };
    let matching: Vec<DeadLetter> = all
        .into_iter()
        .filter(|d| !replayed.contains(&d.position) && filter.matches(d))
        .collect();
    for d in &matching {
        *listing
            .groups
            .entry((d.source.clone(), d.reason.clone()))
            .or_default() += 1;
    }
    listing.newest = matching.into_iter().rev().take(limit).collect();
    Ok(listing)
}

/// Re-submits the dead letters matching `filter` through the ingester's validation; those that
/// pass are written as events (with their source's next sequence numbers and their original
/// `received_us`) and marked replayed. With `dry_run`, only reports what it would do.
pub async fn replay(
    c: &Config,
    filter: &Filter,
    dry_run: bool,
) -> Result<ReplayReport, DeadLetterError> {
    let o = open(c).await?;
    let result = replay_open(c, &o, filter, dry_run).await;
    let closed = o.store.close().await;
    let report = result?;
    closed?;
    Ok(report)
}

async fn replay_open(
    c: &Config,
    o: &Opened,
    filter: &Filter,
    dry_run: bool,
) -> Result<ReplayReport, DeadLetterError> {
    let options = pipeline::ingest_options(c);
    let (all, replayed) = read_all(o).await?;
    let mut report = ReplayReport {
        dry_run,
        ..ReplayReport::default()
    };
    let mut passing = Vec::new();
    for d in all
        .iter()
        .filter(|d| !replayed.contains(&d.position) && filter.matches(d))
    {
        report.candidates += 1;
        if let Some(why) = d.not_replayable() {
            *report.not_replayable.entry(why).or_default() += 1;
            continue;
        }
        match validate(
            Raw::Bytes(d.raw.as_bytes().to_vec()),
            options.max_event_bytes,
        ) {
            Ok(_) => passing.push(d),
            Err((r, _)) => {
                *report
                    .still_rejected
                    .entry(r.reason.as_str().to_owned())
                    .or_default() += 1
            }
        }
    }
    report.replayed = passing.len();
    if dry_run {
        return Ok(report);
    }
    if !passing.is_empty() {
        // The real ingester: the same validation, stamps, sequence numbers and rollups.
        let store = &o.store;
        let ingester = Ingester {
            events: store.capped("events", &pipeline::events_spec(c)).await?,
            dead_letters: o.dead.clone(),
            rollups: store.keyed("rollups").await?,
            options: options.clone(),
            engine: store.engine(),
            stats: Arc::new(IngestStats::default()),
            health: Default::default(),
            observer: None,
        };
        let (tx, rx) = mpsc::channel::<Handed>(c.ingest.queue_capacity);
        let writer = tokio::spawn(ingester.run(rx));
        for d in &passing {
            let handed = Handed {
                source: Arc::from(d.source.as_str()),
                raw: Raw::Bytes(d.raw.as_bytes().to_vec()),
                received_us: d.received_us,
                // A replayed record is not where its source stands now.
                position: None,
            };
            if tx.send(handed).await.is_err() {
                break;
            }
        }
        drop(tx);
        // The ingester returns once everything sent is written (it retries failed writes).
        let _ = writer.await;
        let marked_us = store::clock::now_us();
        for d in &passing {
            let doc = json!({"position": d.position, "source": d.source, "reason": d.reason,
                             "replayed_us": marked_us});
            let doc = doc.as_object().cloned().unwrap_or_default();
            o.replayed
                .set(&marker_key(d.position), doc, options.durability)
                .await?;
        }
    }
    // Markers of letters that eviction removed are of no use any more.
    let oldest = all.first().map(|d| d.position).unwrap_or(u64::MAX);
    for p in replayed.iter().filter(|p| **p < oldest) {
        o.replayed
            .delete(&marker_key(*p), options.durability)
            .await?;
        report.pruned += 1;
    }
    Ok(report)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn letter(reason: &str, truncated: bool) -> DeadLetter {
        DeadLetter {
            position: 1,
            source: "s".into(),
            reason: reason.into(),
            detail: String::new(),
            raw: "{}".into(),
            raw_len: 2,
            truncated,
            received_us: 0,
        }
    }

    #[test]
    fn what_can_be_replayed() {
        assert_eq!(letter("too_large", false).not_replayable(), None);
        assert_eq!(letter("malformed_json", false).not_replayable(), None);
        assert!(letter("too_large", true).not_replayable().is_some());
        for r in NOT_REPLAYABLE {
            assert!(letter(r, false).not_replayable().is_some(), "{r}");
        }
    }

    #[test]
    fn markers_sort_like_positions() {
        assert!(marker_key(9) < marker_key(10));
        assert_eq!(marker_key(42).parse::<u64>().unwrap(), 42);
    }
}
