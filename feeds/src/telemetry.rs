//! Everything notable a feed does, in one place: metric names and descriptions (shared with
//! dashboards and checks: keep them), the reason labels, and one small type per occurrence
//! whose `emit()` both logs and counts it. A new metric or reason touches this file only.
//!
//! Per-event figures (notification latency, events processed) are recorded through handles
//! registered once per feed (`feed::Meters`), not through these types: they happen 70+ times a
//! second and are not log-worthy. The statistics publish their own figures (see
//! [`crate::stats`]), under the names declared here.

use metrics::{
    Counter, Gauge, Histogram, Unit, counter, describe_counter, describe_gauge, describe_histogram,
    gauge, histogram,
};
use serde_json::Value;

/// From a write's acknowledgment to a feed holding it.
pub const NOTIFICATION_LATENCY: &str = "tailrace_notification_latency_seconds";
/// From the source handing the event over to a feed holding it.
pub const END_TO_END_LATENCY: &str = "tailrace_end_to_end_latency_seconds";
/// How far a feed is behind the newest write.
pub const FEED_LAG: &str = "tailrace_feed_lag_events";
/// Feed stream restarts by reason.
pub const FEED_RESTARTS: &str = "tailrace_feed_restarts_total";
/// Feeds stopped because the store's server no longer supports what they read.
pub const FEED_UNSUPPORTED: &str = "tailrace_feed_unsupported_total";
/// Gaps a feed recorded after being overtaken.
pub const FEED_GAPS: &str = "tailrace_feed_gaps_total";
/// Entries a feed skipped over in its gaps, as far as known.
pub const FEED_GAP_EVENTS: &str = "tailrace_feed_gap_events_total";
/// Sequence numbers a feed never saw.
pub const FEED_MISSING: &str = "tailrace_feed_missing_events_total";
/// Sequence numbers a feed saw more than once.
pub const FEED_DUPLICATES: &str = "tailrace_feed_duplicate_events_total";
/// Events a feed processed.
pub const FEED_EVENTS: &str = "tailrace_feed_events_total";
/// Checkpoints a feed saved.
pub const FEED_CHECKPOINTS: &str = "tailrace_feed_checkpoints_total";
/// The rolling rate.
pub const RATE: &str = "tailrace_rate_events_per_second";
/// Per-source sequence numbers a feed did not see because the store refused their events (kept
/// as dead letters): not missing.
pub const FEED_REFUSED: &str = "tailrace_feed_refused_events_total";
/// Bollinger bands.
pub const BOLLINGER: &str = "tailrace_bollinger";
/// Times a feed's rate broke out of its Bollinger band, by direction.
pub const TREND_CHANGES: &str = "tailrace_trend_changes_total";
/// Times a value of a field (a hashtag, a language) broke out of its band, by field and
/// direction.
pub const VALUE_TREND_CHANGES: &str = "tailrace_value_trend_changes_total";
/// Top-k counts over the sliding window.
pub const TOPK: &str = "tailrace_topk_events";
/// How long a feed could stop before its resume point is evicted.
pub const RESUME_HEADROOM: &str = "tailrace_feed_resume_headroom_seconds";
/// A feed's problems other than restarts and gaps, by feed and error type.
pub const FEED_ERRORS: &str = "tailrace_feed_errors_total";

/// Registers the descriptions of every feed metric (call once, after installing a recorder).
pub fn describe() {
    describe_histogram!(
        NOTIFICATION_LATENCY,
        Unit::Seconds,
        "Time from a write's acknowledgment to a feed holding it (live events only, not replays)."
    );
    describe_histogram!(
        END_TO_END_LATENCY,
        Unit::Seconds,
        "Time from the source handing an event over to a feed holding it (live events only)."
    );
    describe_gauge!(
        FEED_LAG,
        "How many entries a feed is behind the newest write."
    );
    describe_counter!(
        FEED_RESTARTS,
        "Feed stream restarts: position_lost, history_lost, cursor_died, error."
    );
    describe_counter!(
        FEED_UNSUPPORTED,
        "Feeds stopped because the store's server refused what they read as unsupported (a feed the server cannot serve is refused at startup instead)."
    );
    describe_counter!(
        FEED_GAPS,
        "Gaps recorded after a feed was overtaken by eviction."
    );
    describe_counter!(
        FEED_GAP_EVENTS,
        "Entries skipped in recorded gaps, as far as known."
    );
    describe_counter!(
        FEED_MISSING,
        "Per-source sequence numbers a feed never saw, those of events the store refused (kept as dead letters) aside."
    );
    describe_counter!(
        FEED_DUPLICATES,
        "Per-source sequence numbers a feed saw more than once."
    );
    describe_counter!(
        FEED_REFUSED,
        "Per-source sequence numbers a feed did not see because the store refused their events, which are kept as dead letters (reason store_rejected): not counted as missing."
    );
    describe_counter!(FEED_EVENTS, "Events a feed processed.");
    describe_counter!(
        FEED_ERRORS,
        "A feed's problems other than restarts and gaps, by feed and error_type: checkpoint_ignored (it started from the oldest entry), statistic_reset (one statistic started afresh), write_failed (a checkpoint, stats or gap document not written), refusals_unread (a gap counted as missing because the dead letters could not be read); each is logged."
    );
    describe_counter!(
        FEED_CHECKPOINTS,
        "Checkpoints (position + statistics state) a feed saved."
    );
    describe_gauge!(
        RATE,
        "Events per second seen by a feed (last closed second)."
    );
    describe_counter!(
        TREND_CHANGES,
        "Times a feed's rate broke out of its Bollinger band and stayed out (direction up or down): a burst begins, or the stream drops."
    );
    describe_counter!(
        VALUE_TREND_CHANGES,
        "Times a value of a trend field (a hashtag, a language) broke out of the band its share of the stream predicts, by field and direction: something is suddenly talked about."
    );
    describe_gauge!(
        BOLLINGER,
        "Bollinger bands (period N, k sigma, population sigma) over the rate and the value field."
    );
    describe_gauge!(
        TOPK,
        "Counts of the top keys (hashtags) over the sliding window."
    );
    describe_gauge!(
        RESUME_HEADROOM,
        Unit::Seconds,
        "Age of the oldest retained entry minus the feed's lag: how long the feed could stop before its resume point is lost."
    );
}

/// Why a feed's stream was reopened (the `reason` label of [`FEED_RESTARTS`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestartReason {
    /// Overtaken by eviction in a capped collection.
    PositionLost,
    /// Resumed from a token older than the retained change history.
    HistoryLost,
    /// The stream ended on its own (a dead cursor).
    CursorDied,
    /// The stream failed with another error.
    Error,
}

impl RestartReason {
    /// Every reason, for registering the counters at zero.
    pub const ALL: [RestartReason; 4] = [
        RestartReason::PositionLost,
        RestartReason::HistoryLost,
        RestartReason::CursorDied,
        RestartReason::Error,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            RestartReason::PositionLost => "position_lost",
            RestartReason::HistoryLost => "history_lost",
            RestartReason::CursorDied => "cursor_died",
            RestartReason::Error => "error",
        }
    }
}

/// The per-event and per-tick metric handles of one feed that are not statistics (those
/// publish their own), registered once: recording through a handle is cheap.
pub struct FeedMeters {
    /// [`NOTIFICATION_LATENCY`].
    pub notification: Histogram,
    /// [`END_TO_END_LATENCY`].
    pub end_to_end: Histogram,
    /// [`FEED_EVENTS`].
    pub events: Counter,
    /// [`FEED_CHECKPOINTS`].
    pub checkpoints: Counter,
    /// [`FEED_LAG`].
    pub lag: Gauge,
    /// [`RESUME_HEADROOM`].
    pub headroom: Gauge,
}

impl FeedMeters {
    /// The handles of `feed` on `engine`; also registers its incident counters at zero.
    pub fn new(engine: &'static str, feed: &str) -> Self {
        register_feed(feed);
        let f = || feed.to_string();
        FeedMeters {
            notification: histogram!(NOTIFICATION_LATENCY, "engine" => engine, "feed" => f()),
            end_to_end: histogram!(END_TO_END_LATENCY, "engine" => engine, "feed" => f()),
            events: counter!(FEED_EVENTS, "feed" => f()),
            checkpoints: counter!(FEED_CHECKPOINTS, "feed" => f()),
            lag: gauge!(FEED_LAG, "feed" => f()),
            headroom: gauge!(RESUME_HEADROOM, "feed" => f()),
        }
    }
}

/// Registers a feed's counters at zero, so dashboards and alerts see a series before the
/// first incident.
fn register_feed(feed: &str) {
    for reason in RestartReason::ALL {
        counter!(FEED_RESTARTS, "feed" => feed.to_string(), "reason" => reason.as_str())
            .absolute(0);
    }
    counter!(FEED_GAPS, "feed" => feed.to_string()).absolute(0);
    counter!(FEED_GAP_EVENTS, "feed" => feed.to_string()).absolute(0);
}

/// A feed continues from its checkpoint.
pub struct FeedResumed<'a> {
    /// The feed.
    pub feed: &'a str,
    /// Where it resumes after.
    pub position: String,
    /// Events it had processed before.
    pub events: u64,
}

impl FeedResumed<'_> {
    /// Logs it.
    pub fn emit(self) {
        tracing::info!(feed = %self.feed, position = %self.position, events = self.events, "feed resumes from its checkpoint");
    }
}

fn feed_error(feed: &str, error_type: &'static str) {
    counter!(FEED_ERRORS, "feed" => feed.to_string(), "error_type" => error_type).increment(1);
}

/// A feed's checkpoint could not be used; it starts from the oldest entry.
pub struct CheckpointIgnored<'a> {
    /// The feed.
    pub feed: &'a str,
    /// Why.
    pub why: String,
}

impl CheckpointIgnored<'_> {
    /// Counts and logs it.
    pub fn emit(self) {
        feed_error(self.feed, "checkpoint_ignored");
        tracing::warn!(feed = %self.feed, why = %self.why, "checkpoint not used; starting from the oldest entry");
    }
}

/// One statistic's saved state could not be restored; that statistic starts afresh (the
/// others and the position are restored).
pub struct StatisticReset<'a> {
    /// The feed.
    pub feed: &'a str,
    /// The statistic.
    pub statistic: &'static str,
    /// Why.
    pub error: String,
}

impl StatisticReset<'_> {
    /// Counts and logs it.
    pub fn emit(self) {
        feed_error(self.feed, "statistic_reset");
        tracing::warn!(feed = %self.feed, statistic = self.statistic, error = %self.error, "saved state of a statistic not restored (saved by another version?); it starts afresh");
    }
}

/// A feed's stream stopped (not a gap) and is reopened after its last position.
pub struct FeedRestarted<'a> {
    /// The feed.
    pub feed: &'a str,
    /// Why.
    pub reason: RestartReason,
    /// The error, in words.
    pub error: String,
    /// The wait before reopening.
    pub retry_in: std::time::Duration,
}

impl FeedRestarted<'_> {
    /// Counts and logs it.
    pub fn emit(self) {
        counter!(FEED_RESTARTS, "feed" => self.feed.to_string(), "reason" => self.reason.as_str())
            .increment(1);
        tracing::warn!(feed = %self.feed, reason = self.reason.as_str(), error = %self.error, retry_in = ?self.retry_in, "feed stream stopped; reopening after its last position");
    }
}

/// A feed's stream was refused as unsupported by the store's server: the feed stops.
pub struct FeedUnsupported<'a> {
    /// The feed.
    pub feed: &'a str,
    /// The error, in words (it names the capability and the alternatives).
    pub error: String,
}

impl FeedUnsupported<'_> {
    /// Counts and logs it.
    pub fn emit(self) {
        counter!(FEED_UNSUPPORTED, "feed" => self.feed.to_string()).increment(1);
        tracing::error!(feed = %self.feed, error = %self.error, "feed stopped: the store's server does not support what it reads");
    }
}

/// A feed was overtaken (eviction or lost history); it continues from the oldest entry.
pub struct GapRecorded<'a> {
    /// The feed.
    pub feed: &'a str,
    /// [`RestartReason::PositionLost`] or [`RestartReason::HistoryLost`].
    pub reason: RestartReason,
    /// The last position or token the feed held.
    pub from: &'a Value,
    /// The oldest one still retained.
    pub to: &'a Value,
    /// How many entries were skipped, when known.
    pub missed: Option<u64>,
}

impl GapRecorded<'_> {
    /// Counts and logs it.
    pub fn emit(self) {
        let feed = self.feed.to_string();
        counter!(FEED_RESTARTS, "feed" => feed.clone(), "reason" => self.reason.as_str())
            .increment(1);
        counter!(FEED_GAPS, "feed" => feed.clone()).increment(1);
        if let Some(n) = self.missed {
            counter!(FEED_GAP_EVENTS, "feed" => feed).increment(n);
        }
        tracing::warn!(feed = %self.feed, reason = self.reason.as_str(), from = %self.from, to = %self.to, missed = ?self.missed, "feed was overtaken; gap recorded, continuing from the oldest retained entry");
    }
}

/// A feed's own write (checkpoint, stats document, gap document) failed; the feed goes on.
pub struct FeedWriteFailed<'a> {
    /// The feed.
    pub feed: &'a str,
    /// What it tried to write: `checkpoint`, `stats document`, `gap document`.
    pub what: &'static str,
    /// The error, in words.
    pub error: String,
}

impl FeedWriteFailed<'_> {
    /// Counts and logs it.
    pub fn emit(self) {
        feed_error(self.feed, "write_failed");
        tracing::warn!(feed = %self.feed, error = %self.error, "could not write the {}", self.what);
    }
}

/// The dead letters could not be read to tell a gap's refused numbers from its lost ones; the
/// gap counts as missing.
pub struct RefusalsUnread<'a> {
    /// The feed.
    pub feed: &'a str,
    /// The error, in words.
    pub error: String,
}

impl RefusalsUnread<'_> {
    /// Counts and logs it.
    pub fn emit(self) {
        feed_error(self.feed, "refusals_unread");
        tracing::warn!(feed = %self.feed, error = %self.error,
            "could not read the dead letters' refused sequence numbers: this gap counts as missing");
    }
}

/// A feed stopped after saving its checkpoint.
pub struct FeedStopped<'a> {
    /// The feed.
    pub feed: &'a str,
    /// Events processed in all.
    pub events: u64,
}

impl FeedStopped<'_> {
    /// Logs it.
    pub fn emit(self) {
        tracing::info!(feed = %self.feed, events = self.events, "feed stopped and checkpointed");
    }
}
