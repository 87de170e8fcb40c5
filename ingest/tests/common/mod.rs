//! Helpers of the source tests (`sources_http`, `sources_websocket`), which run the library's
//! sources in-process against local servers.
//!
//! Each test binary compiles its own copy of this module.

pub mod metrics;

pub use metrics::Metrics;
