//! Everything notable the ingest side does, in one place: metric names and descriptions
//! (shared with dashboards and checks: keep them), the reason labels as enums, and one small
//! type per occurrence whose `emit()` both logs and counts it. A new metric or reason touches
//! this file only.
//!
//! What happens once per event (a record read, an event written) is counted through handles
//! registered once, and never logged: at 70+ events a second a log line per event would drown
//! everything else.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use metrics::{
    Counter, Gauge, Histogram, Unit, counter, describe_counter, describe_gauge, describe_histogram,
    gauge, histogram,
};

use crate::geo::{Geo, Precision};

/// Events read, by source.
pub const SOURCE_EVENTS: &str = "tailrace_source_events_total";
/// Bad records kept as dead letters, by source and reason.
pub const REJECTED: &str = "tailrace_events_rejected_total";
/// Events stamped, by how precisely their place is known (`precision`: point, place, country,
/// language, none).
pub const EVENTS_GEO: &str = "tailrace_events_geo_total";
/// Events stamped, by the country of their place: an ISO 3166-1 alpha-2 code, or `none` (no
/// place, or a place of no known country). Bounded: about 250 codes and `none`.
pub const EVENTS_GEO_COUNTRY: &str = "tailrace_events_geo_country_total";
/// Reconnects of network sources and restarts of command sources, by source and reason.
pub const SOURCE_RECONNECTS: &str = "tailrace_source_reconnects_total";
/// 1 while a source holds a live connection (http) or a running program (command).
pub const SOURCE_CONNECTED: &str = "tailrace_source_connected";
/// Events a source dropped because it had already handed them over (a replay after a resume).
pub const DUPLICATES_DROPPED: &str = "tailrace_source_duplicates_dropped_total";
/// Server-sent events of types a source does not ingest (not records, not dead letters), by
/// source and event name.
pub const SOURCE_EVENTS_SKIPPED: &str = "tailrace_source_events_skipped_total";
/// Distinct `event` label values of [`SOURCE_EVENTS_SKIPPED`] per source; the names a server
/// sends after these are counted as `other` (servers choose names: the label must stay bounded).
pub const MAX_SKIPPED_EVENT_LABELS: usize = 16;
/// Records waiting for the writer.
pub const QUEUE_DEPTH: &str = "tailrace_ingest_queue_depth";
/// From handing a batch to the store to its acknowledgment.
pub const WRITE_LATENCY: &str = "tailrace_write_latency_seconds";
/// Failed write attempts (each is retried).
pub const WRITE_ERRORS: &str = "tailrace_write_errors_total";
/// 1 while the store takes writes, 0 while a write keeps failing for a transient reason.
pub const STORE_WRITABLE: &str = "tailrace_store_writable";
/// What the store's server supports, one series per capability (1 or 0).
pub const STORE_CAPABILITY: &str = "tailrace_store_capability";
/// Items the store refused for good (isolated from their batch), by collection.
pub const STORE_REFUSED: &str = "tailrace_store_refused_total";
/// Rollup counters removed after going idle, by field.
pub const ROLLUPS_EXPIRED: &str = "tailrace_rollups_expired_total";
/// The newest acknowledged sequence number per source.
pub const LAST_SEQ: &str = "tailrace_source_last_acked_seq";
/// Build information (always 1).
pub const BUILD_INFO: &str = "tailrace_build_info";
/// Process start time.
pub const START_TIME: &str = "tailrace_start_time_seconds";
/// CPU time used per second over the last collection interval (1.0 = one core busy).
pub const PROCESS_CPU: &str = "tailrace_process_cpu_usage_ratio";
/// Change streams (`/api/changes`) open, by collection.
pub const STREAMS_OPEN: &str = "tailrace_change_streams_open";
/// Bytes of change-stream events encoded and not yet taken by their responses.
pub const STREAMS_BUFFERED: &str = "tailrace_change_streams_buffered_bytes";
/// Change streams refused because `http.max_streams` were open.
pub const STREAMS_REFUSED: &str = "tailrace_change_streams_refused_total";
/// Change streams cut because their client accepted nothing for the stall timeout.
pub const STREAMS_STALLED: &str = "tailrace_change_streams_stalled_total";
/// Gaps change streams reported (a client resumed after history that was gone), by collection.
pub const STREAMS_GAPS: &str = "tailrace_change_streams_gaps_total";
/// Problems of a source that are not a reconnect or a bad record, by source and error type.
pub const SOURCE_ERRORS: &str = "tailrace_source_errors_total";
/// Problems of the pipeline's other parts, by component and error type.
pub const ERRORS: &str = "tailrace_errors_total";

/// Describes the ingest metrics (call once, after installing a recorder).
pub fn describe() {
    describe_counter!(
        SOURCE_EVENTS,
        "Records read from each source (valid or not)."
    );
    describe_counter!(
        REJECTED,
        "Records rejected and kept as dead letters, by source and reason."
    );
    describe_counter!(
        EVENTS_GEO,
        "Events stamped, by the precision of their place (_tailrace.geo): point (their own coordinates), place (the centre of their place's polygon), country (a country code), language (the likely country of their language), none (no place)."
    );
    describe_counter!(
        EVENTS_GEO_COUNTRY,
        "Events stamped, by the ISO 3166-1 alpha-2 code of their place's country, or none."
    );
    describe_counter!(
        SOURCE_RECONNECTS,
        "Reconnects of http and websocket sources and restarts of command sources, by source and reason (connect_error, http_status, idle_timeout, read_error, closed, exited)."
    );
    describe_counter!(
        DUPLICATES_DROPPED,
        "Events dropped by a source because it had already handed them over (replayed after a resume from a cursor), by source."
    );
    describe_counter!(
        SOURCE_EVENTS_SKIPPED,
        "Server-sent events of types the source does not ingest (not in its `events`), by source and event name (the first 16 names per source; later ones as `other`). Not records, not dead letters."
    );
    describe_gauge!(
        SOURCE_CONNECTED,
        "1 while a source holds a live connection (http) or a running program (command), else 0."
    );
    describe_gauge!(
        QUEUE_DEPTH,
        "Records waiting between the sources and the writer."
    );
    describe_histogram!(
        WRITE_LATENCY,
        Unit::Seconds,
        "Time from handing a batch to the store to its acknowledgment, by engine, collection and durability."
    );
    describe_counter!(
        WRITE_ERRORS,
        "Failed write attempts by collection: transient ones are retried, permanent ones split the batch to isolate what the store refuses."
    );
    describe_counter!(
        ROLLUPS_EXPIRED,
        "Rollup counters removed because their value was not counted for ingest.rollup_idle_ttl_secs, by field."
    );
    describe_gauge!(
        STORE_WRITABLE,
        "1 while the store takes writes; 0 while writes fail for a transient reason (disk full, connection lost, no primary) and are being retried."
    );
    describe_gauge!(
        STORE_CAPABILITY,
        "1 when the store's server supports the capability, 0 when its probe found it missing (reasons in /api/status): change streams, an oplog, transactions, a majority write concern, before images, snapshot reads, documents as sent, capped bounds, server filters, awaiting tails."
    );
    describe_counter!(
        STORE_REFUSED,
        "Items the store refused for good, isolated from their batch, by collection: events become dead letters (reason store_rejected); a refused rollup update or dead letter is logged."
    );
    describe_gauge!(
        LAST_SEQ,
        "The newest acknowledged per-source sequence number."
    );
    describe_gauge!(
        BUILD_INFO,
        "Build information: version and engine; always 1."
    );
    describe_gauge!(
        START_TIME,
        Unit::Seconds,
        "Process start time, seconds since the Unix epoch."
    );
    describe_gauge!(
        PROCESS_CPU,
        "CPU seconds used per second of wall time over the last collection interval (1.0 = one core busy)."
    );
    describe_gauge!(
        STREAMS_OPEN,
        "Change streams (/api/changes) open, by collection."
    );
    describe_gauge!(
        STREAMS_BUFFERED,
        Unit::Bytes,
        "Bytes of change-stream events encoded and not yet taken by their HTTP responses (bounded per stream: a client that stops reading stops its stream's reads)."
    );
    describe_counter!(
        STREAMS_REFUSED,
        "Change streams refused with 503 because http.max_streams streams were open."
    );
    describe_counter!(
        STREAMS_STALLED,
        "Change streams disconnected because their client accepted nothing for http.stream_stall_timeout_ms."
    );
    describe_counter!(
        STREAMS_GAPS,
        "Gap events sent by change streams (a client resumed after history that was no longer kept), by collection."
    );
    describe_counter!(
        SOURCE_ERRORS,
        "Problems of a source other than reconnects (tailrace_source_reconnects_total) and bad records (tailrace_events_rejected_total), by source and error_type (resume_position, request, io, watch, setup, program); each is logged."
    );
    describe_counter!(
        ERRORS,
        "Problems of the pipeline's other parts, by component (ingester, retention, ingest_document, change_streams, http, signals) and error_type; each is logged."
    );
}

/// Why a record was rejected (the `reason` label of [`REJECTED`], stored in its dead letter).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RejectReason {
    /// Not parseable as JSON.
    MalformedJson,
    /// Not UTF-8 (JSON must be).
    InvalidUtf8,
    /// Valid JSON, but not an object.
    NotObject,
    /// Larger than `ingest.max_event_bytes`.
    TooLarge,
    /// Nested deeper than the engines allow.
    TooDeep,
    /// A key no engine can store.
    InvalidKey,
    /// Cut off by the end of the stream.
    Truncated,
    /// An SSE event without data.
    EmptyEvent,
    /// A binary WebSocket frame (events are JSON text).
    BinaryFrame,
    /// Valid, but the store refused it (a validation rule, a document it cannot hold).
    StoreRejected,
}

impl RejectReason {
    /// Every reason, for registering the counters at zero.
    pub const ALL: [RejectReason; 10] = [
        RejectReason::MalformedJson,
        RejectReason::InvalidUtf8,
        RejectReason::NotObject,
        RejectReason::TooLarge,
        RejectReason::TooDeep,
        RejectReason::InvalidKey,
        RejectReason::Truncated,
        RejectReason::EmptyEvent,
        RejectReason::BinaryFrame,
        RejectReason::StoreRejected,
    ];

    /// The label value, as stored in dead letters.
    pub fn as_str(self) -> &'static str {
        match self {
            RejectReason::MalformedJson => "malformed_json",
            RejectReason::InvalidUtf8 => "invalid_utf8",
            RejectReason::NotObject => "not_object",
            RejectReason::TooLarge => "too_large",
            RejectReason::TooDeep => "too_deep",
            RejectReason::InvalidKey => "invalid_key",
            RejectReason::Truncated => "truncated",
            RejectReason::EmptyEvent => "empty_event",
            RejectReason::BinaryFrame => "binary_frame",
            RejectReason::StoreRejected => "store_rejected",
        }
    }
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for RejectReason {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RejectReason::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| {
                let all: Vec<&str> = RejectReason::ALL.iter().map(|r| r.as_str()).collect();
                format!("{s:?} is not one of {}", all.join(", "))
            })
    }
}

/// Why a source reconnects or restarts (the `reason` label of [`SOURCE_RECONNECTS`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReconnectReason {
    /// No connection could be made (refused, DNS, TLS, no response headers in time).
    ConnectError,
    /// The server answered with an error status.
    HttpStatus,
    /// The stream stalled: nothing for `idle_timeout_ms`.
    IdleTimeout,
    /// Reading the stream failed.
    ReadError,
    /// The server closed the stream.
    Closed,
    /// The program of a command source exited.
    Exited,
}

impl ReconnectReason {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ReconnectReason::ConnectError => "connect_error",
            ReconnectReason::HttpStatus => "http_status",
            ReconnectReason::IdleTimeout => "idle_timeout",
            ReconnectReason::ReadError => "read_error",
            ReconnectReason::Closed => "closed",
            ReconnectReason::Exited => "exited",
        }
    }
}

/// Registers a source's counters at zero, so dashboards and alerts see a series (and a rate
/// of 0) before the first rejection; returns the handle that counts its records.
pub fn register_source(source: &str) -> Counter {
    for reason in RejectReason::ALL {
        counter!(REJECTED, "source" => source.to_string(), "reason" => reason.as_str()).absolute(0);
    }
    let read = counter!(SOURCE_EVENTS, "source" => source.to_string());
    read.absolute(0);
    read
}

/// Records waiting for the writer, after the ingester took a batch.
pub fn queue_depth(depth: i64) {
    gauge!(QUEUE_DEPTH).set(depth.max(0) as f64);
}

/// The gauge of whether the store takes writes.
pub fn store_writable() -> metrics::Gauge {
    gauge!(STORE_WRITABLE)
}

/// What the store's server supports, found by its probe when the store opened: each
/// capability's gauge, and one line per missing one saying what it costs here.
pub struct StoreCapabilities<'a> {
    /// The probe's answers.
    pub capabilities: &'a store::Capabilities,
    /// The configured durability (a missing majority matters only when it is asked for).
    pub durability: store::Durability,
}

impl StoreCapabilities<'_> {
    /// Sets the gauges and logs what is missing.
    pub fn emit(self) {
        use store::Capability as C;
        for c in C::ALL {
            let support = self.capabilities.get(c);
            gauge!(STORE_CAPABILITY, "capability" => capability_label(c))
                .set(if support.is_yes() { 1.0 } else { 0.0 });
            let Some(reason) = support.reason() else {
                continue;
            };
            let cost = match c {
                C::ChangeStreams => {
                    "feeds of kind changes and /api/changes on keyed collections are refused"
                }
                C::Oplog => "feeds of kind oplog are refused",
                C::Transactions => {
                    "rollup updates of several keys are written one key at a time: each key's write is atomic, a batch's are not (a crash may leave part of a batch's rollups, repaired at the next start)"
                }
                C::Majority if self.durability == store::Durability::Majority => {
                    "durability = majority waits for this one server only"
                }
                C::Majority => continue,
                C::BeforeImages => "changes carry no before image (old_val)",
                C::SnapshotReads => {
                    "/api/changes with include_initial on keyed collections is refused"
                }
                C::DocumentsAsSent => {
                    "events with $-prefixed or dotted keys or nested arrays are refused by the server and kept as dead letters (reason store_rejected)"
                }
                C::CappedBounds => {
                    "capped collections may hold more than their limits until the server's background cleanup, and tails are overtaken later"
                }
                C::ServerFilters => {
                    "filters of /api/changes are evaluated by tailrace on every document read"
                }
                C::AwaitingTails => {
                    "tails poll the server: at once when this process writes, otherwise up to a second apart"
                }
                C::Other => continue,
            };
            tracing::warn!(
                capability = c.as_str(),
                reason,
                "the store's server lacks {c}: {cost}"
            );
        }
    }
}

/// The `capability` label of [`STORE_CAPABILITY`].
fn capability_label(c: store::Capability) -> &'static str {
    use store::Capability as C;
    match c {
        C::ChangeStreams => "change_streams",
        C::Oplog => "oplog",
        C::Transactions => "transactions",
        C::Majority => "majority",
        C::BeforeImages => "before_images",
        C::SnapshotReads => "snapshot_reads",
        C::DocumentsAsSent => "documents_as_sent",
        C::CappedBounds => "capped_bounds",
        C::ServerFilters => "server_filters",
        C::AwaitingTails => "awaiting_tails",
        C::Other => "other",
    }
}

/// Writes started failing for a transient reason; they are retried until they pass.
pub struct StoreUnwritable<'a> {
    /// The first error.
    pub error: &'a store::StoreError,
}

impl StoreUnwritable<'_> {
    /// Logs it (the gauge is set by the caller, which owns it).
    pub fn emit(self) {
        tracing::error!(error = %self.error, "the store cannot be written; retrying with backoff, sources wait meanwhile (/readyz answers 503)");
    }
}

/// Writes pass again after a transient failure.
pub struct StoreWritableAgain;

impl StoreWritableAgain {
    /// Logs it.
    pub fn emit(self) {
        tracing::info!("the store takes writes again");
    }
}

/// The store refused a batch for a reason retrying will not change; it is split to find
/// what it refuses.
pub struct WriteSplit<'a> {
    /// The collection.
    pub collection: &'a str,
    /// Items in the refused group.
    pub items: usize,
    /// The store's reason.
    pub error: String,
}

impl WriteSplit<'_> {
    /// Counts it (as a failed write) and logs it.
    pub fn emit(self) {
        counter!(WRITE_ERRORS, "collection" => self.collection.to_string()).increment(1);
        tracing::warn!(collection = self.collection, items = self.items, error = %self.error, "the store refused a batch; splitting it to isolate what it refuses");
    }
}

/// The store refused one item for good.
pub struct StoreRefused<'a> {
    /// The collection.
    pub collection: &'a str,
    /// What it was (an event's source and sequence number, a rollup key).
    pub what: String,
    /// The store's reason.
    pub error: &'a store::StoreError,
    /// Where it went: `dead letters`, or `dropped` (a rollup update: its event is stored).
    pub outcome: &'static str,
}

impl StoreRefused<'_> {
    /// Counts and logs it.
    pub fn emit(self) {
        counter!(STORE_REFUSED, "collection" => self.collection.to_string()).increment(1);
        tracing::warn!(collection = self.collection, what = %self.what, error = %self.error, outcome = self.outcome, "the store refused an item");
    }
}

/// The write-latency histograms and last-sequence gauges the ingester has registered, kept
/// so that a commit records into them without registering them again: `histogram!` and
/// `gauge!` with labels copy every label into a new key and search the registry at each
/// call, for series that are the same from one commit to the next. Handles of the recorder
/// installed when each was first used, which is the global one for a whole run.
#[derive(Default)]
pub struct Meters {
    /// `(engine, collection, durability)` and its histogram; a handful at most.
    write_latency: std::sync::Mutex<Vec<(&'static str, String, store::Durability, Histogram)>>,
    /// One gauge per source.
    last_seq: std::sync::Mutex<std::collections::HashMap<std::sync::Arc<str>, Gauge>>,
    /// The counters of placed events, registered (at zero) with the first event.
    geo: std::sync::OnceLock<GeoCounters>,
}

/// [`EVENTS_GEO`] by precision, [`EVENTS_GEO_COUNTRY`] by country.
struct GeoCounters {
    /// One per precision, in the order of [`Precision::ALL`].
    by_precision: [Counter; 5],
    /// `country="none"`.
    no_country: Counter,
    /// Each country seen so far (the codes are `crate::geo`'s: at most about 250).
    by_country: std::sync::Mutex<std::collections::HashMap<&'static str, Counter>>,
}

impl GeoCounters {
    fn new() -> Self {
        let by_precision = Precision::ALL.map(|p| {
            let c = counter!(EVENTS_GEO, "precision" => p.as_str());
            c.absolute(0);
            c
        });
        let no_country = counter!(EVENTS_GEO_COUNTRY, "country" => "none");
        no_country.absolute(0);
        GeoCounters {
            by_precision,
            no_country,
            by_country: Default::default(),
        }
    }
}

impl Meters {
    /// An event was stamped, placed by `geo` or not at all.
    pub fn placed(&self, geo: Option<&Geo>) {
        let counters = self.geo.get_or_init(GeoCounters::new);
        let precision = geo.map_or(Precision::None, |g| g.precision);
        if let Some(i) = Precision::ALL.iter().position(|p| *p == precision) {
            counters.by_precision[i].increment(1);
        }
        let Some(country) = geo.and_then(|g| g.country) else {
            return counters.no_country.increment(1);
        };
        match counters.by_country.lock() {
            Ok(mut known) => known
                .entry(country)
                .or_insert_with(|| counter!(EVENTS_GEO_COUNTRY, "country" => country))
                .increment(1),
            Err(_) => counter!(EVENTS_GEO_COUNTRY, "country" => country).increment(1),
        }
    }

    /// The newest sequence number of a source that the store acknowledged.
    pub fn sequence_acked(&self, source: &std::sync::Arc<str>, seq: u64) {
        let Ok(mut gauges) = self.last_seq.lock() else {
            return sequence_acked(source, seq);
        };
        gauges
            .entry(source.clone())
            .or_insert_with(|| gauge!(LAST_SEQ, "source" => source.to_string()))
            .set(seq as f64);
    }
}

/// A write was acknowledged by the store.
pub struct WriteAcked<'a> {
    /// `embedded` or `mongodb`.
    pub engine: &'static str,
    /// The collection.
    pub collection: &'a str,
    /// Its durability.
    pub durability: store::Durability,
    /// From handing it to the store to the acknowledgment.
    pub latency: Duration,
}

impl WriteAcked<'_> {
    /// Records its latency.
    pub fn emit(self) {
        self.histogram().record(self.latency.as_secs_f64());
    }

    /// Records its latency into the histogram `meters` keeps for its labels.
    pub fn emit_to(self, meters: &Meters) {
        let Ok(mut known) = meters.write_latency.lock() else {
            return self.emit();
        };
        let at = known.iter().position(|(e, c, d, _)| {
            *e == self.engine && c == self.collection && *d == self.durability
        });
        let at = at.unwrap_or_else(|| {
            let h = self.histogram();
            known.push((self.engine, self.collection.to_owned(), self.durability, h));
            known.len() - 1
        });
        known[at].3.record(self.latency.as_secs_f64());
    }

    fn histogram(&self) -> Histogram {
        histogram!(WRITE_LATENCY, "engine" => self.engine, "collection" => self.collection.to_string(), "durability" => self.durability.as_str())
    }
}

/// Idle rollup counters of `field` were removed.
pub fn rollups_expired(field: &str, n: u64) {
    counter!(ROLLUPS_EXPIRED, "field" => field.to_string()).increment(n);
    if n > 0 {
        tracing::debug!(field, removed = n, "idle rollup counters removed");
    }
}

/// The newest sequence number of a source that the store acknowledged.
pub fn sequence_acked(source: &str, seq: u64) {
    gauge!(LAST_SEQ, "source" => source.to_string()).set(seq as f64);
}

/// A record was rejected and kept as a dead letter (counted; not logged: a flood of bad
/// records would flood the log — the dead letters keep each one with its reason).
pub struct RecordRejected<'a> {
    /// The source that handed it over.
    pub source: &'a str,
    /// Why.
    pub reason: RejectReason,
}

impl RecordRejected<'_> {
    /// Counts it.
    pub fn emit(self) {
        counter!(REJECTED, "source" => self.source.to_string(), "reason" => self.reason.as_str())
            .increment(1);
    }
}

/// A write to the store failed; it will be retried.
pub struct WriteFailed<'a> {
    /// The collection.
    pub collection: &'a str,
    /// How many events or updates it carried.
    pub items: usize,
    /// The error, in words.
    pub error: String,
    /// The wait before the retry.
    pub retry_in: Duration,
}

impl WriteFailed<'_> {
    /// Counts and logs it.
    pub fn emit(self) {
        counter!(WRITE_ERRORS, "collection" => self.collection.to_string()).increment(1);
        tracing::error!(collection = self.collection, items = self.items, error = %self.error, retry_in = ?self.retry_in, "write failed; retrying (sources wait meanwhile)");
    }
}

/// A source lost its connection (or its program exited) and will try again.
pub struct SourceReconnecting<'a> {
    /// The source.
    pub source: &'a str,
    /// What it connects to, for the log (a URL without its secrets, a program).
    pub target: &'a str,
    /// Why.
    pub reason: ReconnectReason,
    /// What happened, in words (`cannot connect: …`, `the server closed the stream`).
    pub detail: String,
    /// The wait before the next attempt.
    pub delay: Duration,
}

impl SourceReconnecting<'_> {
    /// Counts and logs it.
    pub fn emit(self) {
        counter!(SOURCE_RECONNECTS, "source" => self.source.to_string(), "reason" => self.reason.as_str())
            .increment(1);
        tracing::warn!(source = %self.source, target = %self.target, reason = self.reason.as_str(), "{}; reconnecting in {:.1} s", self.detail, self.delay.as_secs_f64());
    }
}

/// What kind of problem a source had (the `error_type` label of [`SOURCE_ERRORS`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceErrorType {
    /// The position stored with its newest record means nothing to it (or no longer fits
    /// the file): it starts elsewhere, as the log line says.
    ResumePosition,
    /// A request could not be made as configured (a header not sent).
    Request,
    /// Opening, seeking or reading a file or standard input failed.
    Io,
    /// No file-change notifications: it re-checks on a timer instead.
    Watch,
    /// It could not be set up (a client, a URL, a program that does not start).
    Setup,
    /// A command source's program, run once, failed (or could not be waited for).
    Program,
}

impl SourceErrorType {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            SourceErrorType::ResumePosition => "resume_position",
            SourceErrorType::Request => "request",
            SourceErrorType::Io => "io",
            SourceErrorType::Watch => "watch",
            SourceErrorType::Setup => "setup",
            SourceErrorType::Program => "program",
        }
    }
}

/// A source's problem that is neither a reconnect nor a bad record.
pub struct SourceProblem<'a> {
    /// The source.
    pub source: &'a str,
    /// What kind.
    pub error_type: SourceErrorType,
    /// What happened and what the source does now, in words.
    pub detail: String,
    /// Whether the source ends because of it (its records stop; the pipeline goes on).
    pub ends: bool,
}

impl SourceProblem<'_> {
    /// Counts and logs it (an error when the source ends, else a warning).
    pub fn emit(self) {
        counter!(SOURCE_ERRORS, "source" => self.source.to_string(), "error_type" => self.error_type.as_str())
            .increment(1);
        let error_type = self.error_type.as_str();
        if self.ends {
            tracing::error!(source = %self.source, error_type, "{}; the source ends", self.detail);
        } else {
            tracing::warn!(source = %self.source, error_type, "{}", self.detail);
        }
    }
}

/// A problem of one of the pipeline's other parts (the ingester, the rollup retention, the
/// `ingest` document, change streams, the HTTP server, signal handling).
pub struct Problem<'a> {
    /// The part (`component` label of [`ERRORS`]).
    pub component: &'static str,
    /// What kind (`error_type` label): `store_read`, `store_write`, `task_failed`, ...
    pub error_type: &'static str,
    /// What happened and what follows, in words.
    pub detail: &'a str,
}

impl Problem<'_> {
    /// Counts it and logs it as an error.
    pub fn error(self) {
        self.count();
        tracing::error!(
            component = self.component,
            error_type = self.error_type,
            "{}",
            self.detail
        );
    }

    /// Counts it and logs it as a warning.
    pub fn warn(self) {
        self.count();
        tracing::warn!(
            component = self.component,
            error_type = self.error_type,
            "{}",
            self.detail
        );
    }

    /// Counts it without a log line (a repeat of one already logged).
    pub fn count(&self) {
        counter!(ERRORS, "component" => self.component, "error_type" => self.error_type)
            .increment(1);
    }
}

/// Server-sent events of one source whose types it does not ingest: counted by name, the
/// label's values capped at [`MAX_SKIPPED_EVENT_LABELS`] (then `other`); each new name is
/// logged once, so a misconfigured `events` list shows at once what the server sends.
pub struct SkippedEvents {
    source: String,
    /// The names the source ingests, for the log line.
    accepted: String,
    /// One counter per name seen, at most [`MAX_SKIPPED_EVENT_LABELS`].
    names: Vec<(String, Counter)>,
    /// Everything after: created (and logged) on first use.
    other: Option<Counter>,
}

/// The longest `event` label value, in characters (names are the server's choice).
const MAX_EVENT_LABEL_CHARS: usize = 64;

impl SkippedEvents {
    /// The skipped-event counters of `source`, which ingests the types `accepted`.
    pub fn new(source: &str, accepted: &[String]) -> Self {
        SkippedEvents {
            source: source.to_owned(),
            accepted: accepted.join(", "),
            names: Vec::new(),
            other: None,
        }
    }

    /// One event of type `event` was skipped.
    pub fn emit(&mut self, event: &str) {
        let label: String = event.chars().take(MAX_EVENT_LABEL_CHARS).collect();
        if let Some((_, c)) = self.names.iter().find(|(n, _)| *n == label) {
            c.increment(1);
            return;
        }
        if self.names.len() < MAX_SKIPPED_EVENT_LABELS {
            tracing::info!(source = %self.source, event = %label, ingested = %self.accepted, "skipping server-sent events of a type this source does not ingest (counted in {SOURCE_EVENTS_SKIPPED}; add it to the source's `events` to ingest it)");
            let c = counter!(SOURCE_EVENTS_SKIPPED, "source" => self.source.clone(), "event" => label.clone());
            c.increment(1);
            self.names.push((label, c));
            return;
        }
        let source = &self.source;
        self.other
            .get_or_insert_with(|| {
                tracing::warn!(source = %source, "more than {MAX_SKIPPED_EVENT_LABELS} distinct server-sent event types; further ones are counted as event=\"other\"");
                counter!(SOURCE_EVENTS_SKIPPED, "source" => source.clone(), "event" => "other")
            })
            .increment(1);
    }
}

/// The counter of events a resuming source dropped as already handed over.
pub fn duplicates_dropped(source: &str) -> Counter {
    counter!(DUPLICATES_DROPPED, "source" => source.to_string())
}

/// Whether a source holds a live connection (or a running program), as a gauge.
pub struct SourceLink(metrics::Gauge);

impl SourceLink {
    /// The gauge of `source`.
    pub fn new(source: &str) -> Self {
        SourceLink(gauge!(SOURCE_CONNECTED, "source" => source.to_string()))
    }

    /// Connected (or started).
    pub fn up(&self) {
        self.0.set(1.0);
    }

    /// Disconnected (or exited).
    pub fn down(&self) {
        self.0.set(0.0);
    }
}

/// A source's sequence numbering continues from the store after a (re)start.
pub struct SequenceRecovered<'a> {
    /// The source.
    pub source: &'a str,
    /// Its next sequence number.
    pub next_seq: u64,
}

impl SequenceRecovered<'_> {
    /// Logs it.
    pub fn emit(self) {
        tracing::info!(source = %self.source, next_seq = self.next_seq, "source sequence recovered from the store");
    }
}

/// A change stream is open (a guard: the gauge counts it down when dropped).
pub struct StreamOpen(metrics::Gauge);

impl StreamOpen {
    /// Counts a stream of `collection` up.
    pub fn new(collection: &str) -> Self {
        let g = gauge!(STREAMS_OPEN, "collection" => collection.to_string());
        g.increment(1.0);
        StreamOpen(g)
    }
}

impl Drop for StreamOpen {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

/// Change-stream bytes were queued for (positive) or taken by (negative) a response.
pub fn stream_buffered(delta: f64) {
    gauge!(STREAMS_BUFFERED).increment(delta);
}

/// A change stream was refused: every permit was taken.
pub struct StreamRefused;

impl StreamRefused {
    /// Counts it (not logged: a client retrying in a loop would flood the log; the 503 says
    /// why).
    pub fn emit(self) {
        counter!(STREAMS_REFUSED).increment(1);
    }
}

/// A change stream's client accepted nothing for the stall timeout; the stream was cut.
pub struct StreamStalled {
    /// The stall timeout.
    pub after: Duration,
    /// Bytes still queued for it when it was cut.
    pub buffered: u64,
}

impl StreamStalled {
    /// Counts and logs it.
    pub fn emit(self) {
        counter!(STREAMS_STALLED).increment(1);
        tracing::info!(
            buffered = self.buffered,
            "a change-stream client read nothing for {:.0} s; disconnected (it can resume with its last id)",
            self.after.as_secs_f64()
        );
    }
}

/// A change stream told its client that history after its id was gone.
pub struct StreamGap<'a> {
    /// The collection.
    pub collection: &'a str,
    /// The gap event's data (reason, after, oldest, missed).
    pub detail: &'a serde_json::Map<String, serde_json::Value>,
}

impl StreamGap<'_> {
    /// Counts and logs it.
    pub fn emit(self) {
        counter!(STREAMS_GAPS, "collection" => self.collection.to_string()).increment(1);
        tracing::info!(collection = %self.collection, detail = %serde_json::Value::Object(self.detail.clone()), "change stream: history after the client's id is gone; continuing from the oldest");
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use store::Durability;

    use super::*;

    /// The handles `Meters` keeps record into the series `histogram!`/`gauge!` name: one
    /// per set of labels, whichever commit registered it.
    #[test]
    fn meters_record_into_one_series_per_set_of_labels() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let value = |text: &str, series: &str| -> Option<f64> {
            text.lines()
                .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
                .and_then(|v| v.trim().parse().ok())
        };
        metrics::with_local_recorder(&recorder, || {
            let meters = Meters::default();
            let acked = |collection, durability, ms| WriteAcked {
                engine: "embedded",
                collection,
                durability,
                latency: Duration::from_millis(ms),
            };
            acked("events", Durability::Journaled, 2).emit_to(&meters);
            acked("events", Durability::Journaled, 3).emit_to(&meters);
            acked("rollups", Durability::Acknowledged, 4).emit_to(&meters);
            acked("events", Durability::Acknowledged, 5).emit_to(&meters);
            let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
            meters.sequence_acked(&a, 7);
            meters.sequence_acked(&b, 1);
            meters.sequence_acked(&a, 9);
            let text = handle.render();
            let count = |collection: &str, durability: &str| {
                let series = format!(
                    "{WRITE_LATENCY}_count{{engine=\"embedded\",collection=\"{collection}\",durability=\"{durability}\"}}"
                );
                value(&text, &series)
            };
            assert_eq!(count("events", "journaled"), Some(2.0), "{text}");
            assert_eq!(count("rollups", "acknowledged"), Some(1.0), "{text}");
            assert_eq!(count("events", "acknowledged"), Some(1.0), "{text}");
            let sum = format!(
                "{WRITE_LATENCY}_sum{{engine=\"embedded\",collection=\"events\",durability=\"journaled\"}}"
            );
            assert!(
                value(&text, &sum).is_some_and(|s| (s - 0.005).abs() < 1e-9),
                "{text}"
            );
            let seq = |source: &str| value(&text, &format!("{LAST_SEQ}{{source=\"{source}\"}}"));
            assert_eq!((seq("a"), seq("b")), (Some(9.0), Some(1.0)), "{text}");
        });
    }
}
