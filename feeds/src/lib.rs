//! # feeds — consumers that react to every event
//!
//! A feed reads a stream from the store (a tailable cursor on a capped collection, or a
//! change stream / op-log watcher on changefeed-backed collections), recomputes rolling
//! statistics on every event ([`stats`]: rate, Bollinger bands, top-k, sequence completeness),
//! publishes them as metrics, documents (`stats` collection) and a live JSON stream, and
//! checkpoints its position together with its statistics state so a restart resumes with no
//! gap.
//!
//! What it is not: a source of events (that is `ingest`) or a store (that is `store`).
//!
//! Layout: [`feed`] (the runner, checkpoints, gap accounting), [`sample`] (what the statistics
//! read from a document), [`stats`] (pure, table-tested statistics), [`telemetry`] (metric
//! names and descriptions).

pub mod feed;
pub mod sample;
pub mod stats;
pub mod telemetry;

pub use feed::{Feed, FeedError, FeedHandle, FeedKind, FeedSpec, FeedStatus};
