//! The ingester: validates each record, stamps it, groups records into batches, writes them
//! with the configured durability, keeps the per-key counters of the `rollups` collection, and
//! keeps every rejected record as a dead letter with its reason.
//!
//! Order matters: one task assigns per-source sequence numbers and writes batches one after
//! the other, so sequence order is commit order and a feed can prove completeness.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use metrics::{counter, gauge, histogram};
use serde_json::{Map, Value, json};
use store::update::get_path;
use store::{Capped, Document, Durability, Keyed, StoreError, Update};
use tokio::sync::mpsc;

use crate::source::Raw;
use crate::telemetry as t;

/// The field that carries the ingest stamp (`source`, `seq`, `received_us`, `ingested_us`).
pub use feeds::sample::STAMP;
/// The indexed path used to recover each source's last sequence number.
pub const STAMP_SOURCE: &str = "_tailrace.source";

/// Nesting deeper than this is rejected (MongoDB's limit is 100 levels).
const MAX_DEPTH: usize = 100;
/// Raw bytes kept in a dead letter (the rest is dropped, the length is kept).
const DEAD_LETTER_RAW_BYTES: usize = 4096;

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

/// A record the ingester refused, with why.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejection {
    /// Machine-readable reason (metric label).
    pub reason: &'static str,
    /// Human-readable detail.
    pub detail: String,
}

fn reject(reason: &'static str, detail: impl Into<String>) -> Rejection {
    Rejection {
        reason,
        detail: detail.into(),
    }
}

/// Checks that a record is a JSON object the stores can hold, within the size limit.
pub fn validate(raw: Raw, max_bytes: usize) -> Result<Document, (Rejection, Vec<u8>)> {
    let (value, bytes) = match raw {
        Raw::Invalid { bytes, reason } => {
            return Err((reject(reason, "rejected by the source"), bytes));
        }
        Raw::Bytes(bytes) => {
            if bytes.len() > max_bytes {
                let d = format!("{} bytes, limit {max_bytes}", bytes.len());
                return Err((reject("too_large", d), bytes));
            }
            match serde_json::from_slice::<Value>(&bytes) {
                Ok(v) => (v, Some(bytes)),
                Err(e) => {
                    let reason = if std::str::from_utf8(&bytes).is_err() {
                        "invalid_utf8"
                    } else {
                        "malformed_json"
                    };
                    return Err((reject(reason, e.to_string()), bytes));
                }
            }
        }
        Raw::Json(v) => (v, None),
    };
    let raw_bytes = |v: &Value, b: Option<Vec<u8>>| {
        b.unwrap_or_else(|| serde_json::to_vec(v).unwrap_or_default())
    };
    let Value::Object(doc) = value else {
        let d = format!(
            "a JSON {} is not an event; events are objects",
            kind_of(&value)
        );
        return Err((reject("not_object", d), raw_bytes(&value, bytes)));
    };
    if bytes.is_none() {
        let size = serde_json::to_vec(&doc)
            .map(|b| b.len())
            .unwrap_or(usize::MAX);
        if size > max_bytes {
            let v = Value::Object(doc);
            return Err((
                reject("too_large", format!("{size} bytes, limit {max_bytes}")),
                raw_bytes(&v, None),
            ));
        }
    }
    if let Err(r) = check_keys(&doc, 1) {
        let v = Value::Object(doc);
        return Err((r, raw_bytes(&v, bytes)));
    }
    Ok(doc)
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Keys must be storable by every engine: not `$`-prefixed, no `.`, no NUL; nesting bounded.
fn check_keys(doc: &Map<String, Value>, depth: usize) -> Result<(), Rejection> {
    if depth > MAX_DEPTH {
        return Err(reject(
            "too_deep",
            format!("nested deeper than {MAX_DEPTH} levels"),
        ));
    }
    for (k, v) in doc {
        if k.starts_with('$') || k.contains('.') || k.contains('\0') {
            return Err(reject(
                "invalid_key",
                format!("key {k:?}: keys may not start with $ or contain . or NUL"),
            ));
        }
        check_value(v, depth)?;
    }
    Ok(())
}

fn check_value(v: &Value, depth: usize) -> Result<(), Rejection> {
    match v {
        Value::Object(o) => check_keys(o, depth + 1),
        Value::Array(items) => {
            if depth + 1 > MAX_DEPTH {
                return Err(reject(
                    "too_deep",
                    format!("nested deeper than {MAX_DEPTH} levels"),
                ));
            }
            items.iter().try_for_each(|i| check_value(i, depth + 1))
        }
        _ => Ok(()),
    }
}

/// The dead-letter document of a rejected record.
pub fn dead_letter(
    source: &str,
    rejection: &Rejection,
    bytes: &[u8],
    received_us: i64,
) -> Document {
    let kept = &bytes[..bytes.len().min(DEAD_LETTER_RAW_BYTES)];
    let doc = json!({
        "source": source,
        "reason": rejection.reason,
        "detail": rejection.detail,
        "raw": String::from_utf8_lossy(kept),
        "raw_len": bytes.len(),
        "truncated": bytes.len() > kept.len(),
        "received_us": received_us,
    });
    match doc {
        Value::Object(d) => d,
        _ => Document::new(),
    }
}

/// The rollup updates of one stamped event.
pub fn rollups(doc: &Document, source: &str, o: &IngestOptions, out: &mut Vec<(String, Update)>) {
    let mut summary = Update::inc("count", 1);
    if let Some(stamp) = doc.get(STAMP) {
        summary = summary.and_set(STAMP, stamp.clone());
    }
    for field in [&o.value_field, &o.topk_field] {
        if let Some(v) = get_path(doc, field) {
            summary = summary.and_set(field.clone(), v.clone());
        }
    }
    out.push((format!("source:{source}"), summary));
    for field in &o.rollup_fields {
        let key = |v: &Value| match v {
            Value::String(s) => Some(s.to_lowercase()),
            Value::Number(n) => Some(n.to_string()),
            Value::Bool(b) => Some(b.to_string()),
            _ => None,
        };
        match get_path(doc, field) {
            Some(Value::Array(items)) => {
                for k in items.iter().filter_map(key) {
                    out.push((format!("{field}:{k}"), Update::inc("count", 1)));
                }
            }
            Some(v) => {
                if let Some(k) = key(v) {
                    out.push((format!("{field}:{k}"), Update::inc("count", 1)));
                }
            }
            None => {}
        }
    }
}

/// Merges the pure-`$inc` updates of one key within a batch into one update at the place of
/// the first, its increments added: the counters end exactly where one update per event would
/// leave them, with one write and one change-log entry per key and batch instead of one per
/// event (a batch of 256 tweets carries ~900 counter updates over ~40 keys). Updates that
/// also `$set` — the `source:<name>` summary, which change feeds read once per event — are
/// kept one per event, in order.
pub fn coalesce_counters(updates: &mut Vec<(String, Update)>) {
    let mut first: HashMap<String, usize> = HashMap::new();
    let mut out: Vec<(String, Update)> = Vec::with_capacity(updates.len());
    for (key, u) in updates.drain(..) {
        if u.set.is_empty()
            && let Some(&i) = first.get(&key)
            && let Some(merged) = add_increments(&out[i].1, &u)
        {
            out[i].1 = merged;
            continue;
        }
        if u.set.is_empty() {
            first.entry(key.clone()).or_insert(out.len());
        }
        out.push((key, u));
    }
    *updates = out;
}

/// `a` with `b`'s integer increments added, or `None` when they cannot be added exactly
/// (a non-integer, an overflow): such updates stay separate.
fn add_increments(a: &Update, b: &Update) -> Option<Update> {
    let mut sum = a.clone();
    for (field, delta) in &b.inc {
        let delta = delta.as_i64()?;
        match sum.inc.iter_mut().find(|(f, _)| f == field) {
            Some((_, v)) => *v = Value::from(v.as_i64()?.checked_add(delta)?),
            None => sum.inc.push((field.clone(), Value::from(delta))),
        }
    }
    Some(sum)
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
    /// Also repairs the `source:<name>` rollup when a crash came between the events commit and
    /// the rollups commit (events are always submitted first, so the rollup can only be
    /// behind): the missing rollup updates are applied from the stored events, so change feeds
    /// see every sequence number too.
    async fn recover_source(&self, source: &str) -> Result<u64, StoreError> {
        let newest_event = self
            .events
            .latest(STAMP_SOURCE, &json!(source), 1)
            .await?
            .first()
            .and_then(|r| feeds::sample::stamp(&r.doc).seq);
        let rollup_seq = self
            .rollups
            .get(&format!("source:{source}"))
            .await?
            .and_then(|d| feeds::sample::stamp(&d).seq);
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
            .latest(STAMP_SOURCE, &json!(source), behind as usize)
            .await?;
        let mut updates = Vec::new();
        let mut repaired = 0;
        for record in newest_first.iter().rev() {
            if feeds::sample::stamp(&record.doc)
                .seq
                .is_some_and(|s| s > after_seq)
            {
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
        let depth = gauge!(t::QUEUE_DEPTH);
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
            depth.set(d.max(0) as f64);
            self.write_batch(&mut batch, &mut next_seq).await;
        }
        tracing::info!("ingester flushed and stopped");
    }

    async fn write_batch(&self, batch: &mut Vec<Handed>, next_seq: &mut HashMap<Arc<str>, u64>) {
        let now = crate::source::synthetic::now_us();
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
                            let start = loop {
                                match self.recover_source(&h.source).await {
                                    Ok(s) => break s,
                                    Err(e) => {
                                        tracing::error!(source = %h.source, error = %e, "cannot read the last sequence number; retrying");
                                        tokio::time::sleep(Duration::from_secs(1)).await;
                                    }
                                }
                            };
                            tracing::info!(source = %h.source, next_seq = start, "source sequence recovered from the store");
                            next_seq.entry(h.source.clone()).or_insert(start)
                        }
                    };
                    doc.insert(
                        STAMP.into(),
                        json!({"source": &*h.source, "seq": *seq, "received_us": h.received_us, "ingested_us": now}),
                    );
                    last_seq.insert(h.source.clone(), *seq);
                    *seq += 1;
                    rollups(&doc, &h.source, &self.options, &mut updates);
                    docs.push(doc);
                }
                Err((rejection, bytes)) => {
                    counter!(t::REJECTED, "source" => h.source.to_string(), "reason" => rejection.reason).increment(1);
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
                gauge!(t::LAST_SEQ, "source" => source.to_string()).set(seq as f64);
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
        let mut backoff = Duration::from_millis(100);
        loop {
            let start = Instant::now();
            match write().await {
                Ok(_) => {
                    let secs = start.elapsed().as_secs_f64();
                    histogram!(t::WRITE_LATENCY, "engine" => self.engine, "collection" => collection.to_string(), "durability" => d.as_str())
                        .record(secs);
                    return Some((secs * 1e6) as u64);
                }
                Err(e) => {
                    counter!(t::WRITE_ERRORS, "collection" => collection.to_string()).increment(1);
                    tracing::error!(collection, events = n, error = %e, retry_in = ?backoff, "write failed; retrying (sources wait meanwhile)");
                    if matches!(e, StoreError::Closed) {
                        return None;
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn reason(raw: Raw) -> &'static str {
        validate(raw, 1000).unwrap_err().0.reason
    }

    #[test]
    fn classifies_bad_records() {
        assert_eq!(reason(Raw::Bytes(b"{\"a\":".to_vec())), "malformed_json");
        assert_eq!(
            reason(Raw::Bytes(vec![b'"', 0xff, 0xfe, b'"'])),
            "invalid_utf8"
        );
        assert_eq!(reason(Raw::Bytes(b"[1,2]".to_vec())), "not_object");
        assert_eq!(reason(Raw::Json(json!(3))), "not_object");
        assert_eq!(reason(Raw::Bytes(vec![b' '; 1001])), "too_large");
        assert_eq!(
            reason(Raw::Json(json!({"a": "x".repeat(1000)}))),
            "too_large"
        );
        assert_eq!(reason(Raw::Json(json!({"$where": 1}))), "invalid_key");
        assert_eq!(reason(Raw::Json(json!({"a": {"b.c": 1}}))), "invalid_key");
        assert_eq!(
            reason(Raw::Invalid {
                bytes: vec![],
                reason: "truncated"
            }),
            "truncated"
        );
        let mut deep = json!(1);
        for _ in 0..101 {
            deep = json!({"d": deep});
        }
        assert_eq!(
            validate(Raw::Json(deep), 1 << 20).unwrap_err().0.reason,
            "too_deep"
        );
        assert!(validate(Raw::Bytes(b"{\"ok\": [1, {\"x\": 2}]}".to_vec()), 1000).is_ok());
    }

    #[test]
    fn dead_letters_keep_a_truncated_copy_and_the_length() {
        let bytes = vec![b'x'; 10_000];
        let d = dead_letter("s", &reject("too_large", "big"), &bytes, 5);
        assert_eq!(d["raw"].as_str().unwrap().len(), DEAD_LETTER_RAW_BYTES);
        assert_eq!(d["raw_len"], json!(10_000));
        assert_eq!(d["truncated"], json!(true));
        assert_eq!(
            (d["source"].as_str(), d["reason"].as_str()),
            (Some("s"), Some("too_large"))
        );
    }

    #[test]
    fn counters_are_coalesced_per_batch_and_summaries_kept() {
        let summary = |seq: u64| Update::inc("count", 1).and_set("_tailrace.seq", seq);
        let mut updates = vec![
            ("source:s".to_string(), summary(1)),
            ("lang:en".to_string(), Update::inc("count", 1)),
            ("hashtags:rust".to_string(), Update::inc("count", 1)),
            ("source:s".to_string(), summary(2)),
            ("lang:en".to_string(), Update::inc("count", 1)),
            ("lang:ja".to_string(), Update::inc("count", 1)),
            (
                "lang:en".to_string(),
                Update::inc("count", 2).and_inc("n", 1),
            ),
        ];
        coalesce_counters(&mut updates);
        assert_eq!(
            updates,
            vec![
                ("source:s".to_string(), summary(1)),
                (
                    "lang:en".to_string(),
                    Update::inc("count", 4).and_inc("n", 1)
                ),
                ("hashtags:rust".to_string(), Update::inc("count", 1)),
                ("source:s".to_string(), summary(2)),
                ("lang:ja".to_string(), Update::inc("count", 1)),
            ]
        );
        let mut big = vec![
            ("k".to_string(), Update::inc("count", i64::MAX)),
            ("k".to_string(), Update::inc("count", 1)),
        ];
        coalesce_counters(&mut big);
        assert_eq!(big.len(), 2, "an overflowing sum stays two updates");
    }

    #[test]
    fn rollups_count_each_value_and_summarise_the_source() {
        let o = IngestOptions {
            batch_max_events: 1,
            batch_max_wait: Duration::ZERO,
            max_event_bytes: 1000,
            rollup_fields: vec!["lang".into(), "hashtags".into()],
            value_field: "retweet_count".into(),
            topk_field: "hashtags".into(),
            durability: Durability::Acknowledged,
        };
        let doc = json!({"lang": "EN", "hashtags": ["Rust", "db"], "retweet_count": 4,
                         "_tailrace": {"source": "s", "seq": 9}});
        let mut out = Vec::new();
        rollups(doc.as_object().unwrap(), "s", &o, &mut out);
        let keys: Vec<&str> = out.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            vec!["source:s", "lang:en", "hashtags:rust", "hashtags:db"]
        );
        let mut summary = Document::new();
        store::update::apply(&mut summary, &out[0].1).unwrap();
        assert_eq!(summary["_tailrace"]["seq"], json!(9));
        assert_eq!(summary["retweet_count"], json!(4));
        assert_eq!(summary["hashtags"], json!(["Rust", "db"]));
        assert_eq!(summary["count"], json!(1));
    }
}
