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
//! Layout: [`feed`] (the runner, checkpoints, gap accounting), [`kind`] (one file per kind of
//! feed: its settings and what it reads), [`stats`] (the
//! [`stats::Statistic`] trait and one file per statistic, pure and table-tested),
//! [`telemetry`] (metric names, descriptions, and every notable occurrence as a type that logs
//! and counts it).
//!
//! ```no_run
//! # async fn demo(store: std::sync::Arc<dyn store::Store>, events: std::sync::Arc<dyn store::Capped>) -> Result<(), feeds::FeedError> {
//! use feeds::{Feed, FeedSpec, kind::tailable::Tail, stats::StatsConfig};
//! let spec = FeedSpec { name: "tail".into(), reader: Box::new(Tail::new(events)), stats: StatsConfig::default() };
//! let feed = Feed::new(spec, store).await?;
//! let handle = feed.handle();
//! let stop = tokio_util::sync::CancellationToken::new();
//! tokio::spawn(feed.run(stop.clone()));
//! println!("{:?}", handle.status().stats);
//! # Ok(()) }
//! ```

pub mod feed;
pub mod kind;
pub mod stats;
pub mod telemetry;

pub use feed::{
    Feed, FeedError, FeedHandle, FeedObserver, FeedPosition, FeedSpec, FeedStatus, Reader,
};
pub use kind::{FeedKindConfig, FeedSettings};
