//! Metric names and descriptions of the feeds (shared with dashboards and checks: keep them).

use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};

/// From a write's acknowledgment to a feed holding it.
pub const NOTIFICATION_LATENCY: &str = "tailrace_notification_latency_seconds";
/// From the source handing the event over to a feed holding it.
pub const END_TO_END_LATENCY: &str = "tailrace_end_to_end_latency_seconds";
/// How far a feed is behind the newest write.
pub const FEED_LAG: &str = "tailrace_feed_lag_events";
/// Feed stream restarts by reason.
pub const FEED_RESTARTS: &str = "tailrace_feed_restarts_total";
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
/// Bollinger bands.
pub const BOLLINGER: &str = "tailrace_bollinger";
/// Top-k counts over the sliding window.
pub const TOPK: &str = "tailrace_topk_events";
/// How long a feed could stop before its resume point is evicted.
pub const RESUME_HEADROOM: &str = "tailrace_feed_resume_headroom_seconds";

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
        FEED_GAPS,
        "Gaps recorded after a feed was overtaken by eviction."
    );
    describe_counter!(
        FEED_GAP_EVENTS,
        "Entries skipped in recorded gaps, as far as known."
    );
    describe_counter!(
        FEED_MISSING,
        "Per-source sequence numbers a feed never saw."
    );
    describe_counter!(
        FEED_DUPLICATES,
        "Per-source sequence numbers a feed saw more than once."
    );
    describe_counter!(FEED_EVENTS, "Events a feed processed.");
    describe_counter!(
        FEED_CHECKPOINTS,
        "Checkpoints (position + statistics state) a feed saved."
    );
    describe_gauge!(
        RATE,
        "Events per second seen by a feed (last closed second)."
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
