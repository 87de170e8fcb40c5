//! The one clock of tailrace: wall time in microseconds since the Unix epoch.
//!
//! Every timestamp that is stored (commit times, ingest stamps, checkpoints) or compared
//! across components (notification latency = a feed's `now_us()` minus a commit's) comes from
//! here, so they agree on the unit and the epoch.

use std::time::{SystemTime, UNIX_EPOCH};

/// Microseconds since the Unix epoch; 0 if the system clock is set before 1970.
pub fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_microseconds_since_the_epoch() {
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        let us = now_us();
        assert!(
            (us / 1_000_000 - secs).abs() <= 1,
            "now_us() = {us} should be {secs} s in µs"
        );
    }
}
