//! Helpers of the source tests (`sources_http`, `sources_websocket`), which run the library's
//! sources in-process against local servers: the captured log, the process's metrics recorder
//! and a parser of what it renders.
//!
//! Each test binary compiles its own copy of this module.

pub mod logs;
pub mod metrics;
pub mod recorder;

use std::time::Duration;

pub use logs::{log_line, log_text, logs};
pub use metrics::Metrics;
pub use recorder::{metric, recorder};

/// How long any one wait of these tests may take before it fails.
pub const T: Duration = Duration::from_secs(20);
