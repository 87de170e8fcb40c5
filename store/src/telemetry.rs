//! The engines' own problems an operator may see (a tail re-opening its cursor, a write nobody
//! waited for that failed, a server refusing an option): each is logged and counted, as the
//! pipeline's are (`ingest/src/telemetry.rs`), under the same metric,
//! `tailrace_errors_total{component="store", error_type}`, so a log line always has a counter
//! beside it. Without a metrics recorder (a library user's program) the count goes nowhere.

use metrics::counter;

/// The pipeline's counter of problems by part and kind (described by `ingest`'s telemetry).
const ERRORS: &str = "tailrace_errors_total";

/// A problem of an engine: `error_type` is the `error_type` label, `detail` says what
/// happened and what follows.
pub(crate) struct Problem<'a> {
    pub error_type: &'static str,
    pub detail: &'a str,
}

impl Problem<'_> {
    /// Counts it and logs it as an error.
    #[cfg_attr(
        not(feature = "mongodb"),
        expect(dead_code, reason = "only the MongoDB engine logs errors of its own")
    )]
    pub(crate) fn error(self) {
        self.count();
        tracing::error!(
            component = "store",
            error_type = self.error_type,
            "{}",
            self.detail
        );
    }

    /// Counts it and logs it as a warning.
    pub(crate) fn warn(self) {
        self.count();
        tracing::warn!(
            component = "store",
            error_type = self.error_type,
            "{}",
            self.detail
        );
    }

    fn count(&self) {
        counter!(ERRORS, "component" => "store", "error_type" => self.error_type).increment(1);
    }
}
