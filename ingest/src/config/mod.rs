//! tailrace configuration: one tree, its defaults, loading, validation.
//!
//! Sources, later ones overriding earlier ones key by key:
//!
//! 1. the built-in defaults ([`Config::default`], also written out with comments in
//!    `config/tailrace.toml`),
//! 2. the TOML file, if a path is given (a missing file is an error),
//! 3. environment variables `TAILRACE_<KEY>` with `__` between levels, e.g.
//!    `TAILRACE_STORE__ENGINE=mongodb` or `TAILRACE_HTTP__LISTEN=127.0.0.1:0`.
//!    `TAILRACE_CONFIG`, `TAILRACE_LOG` and `TAILRACE_LOG_FORMAT` belong to the CLI and are not
//!    config keys.
//!
//! Every error is one line that names the dotted key (`store.durability`,
//! `sources[0].rate_per_sec`), what was found, what is allowed, and where the value
//! came from (file or environment variable) when that is known.
//!
//! Layout: this file holds the tree and its defaults; each source kind's settings live in
//! its own file under [`crate::source`], each feed kind's in `feeds::kind` (crate `feeds`;
//! the `[[feeds]]` table in [`feeds`]), the statistics' in
//! [`feeds::stats::StatsConfig`] (crate `feeds`). [`load`] layers and reads the sources,
//! [`validate`] checks the rules serde cannot express, [`errors`] renders problems,
//! [`store`] reads `[store]` by its engine, [`redact`] hides secrets for printing,
//! [`interpolate`] resolves `${VAR}` in header values,
//! [`entries`] reads and writes `[[sources]]` / `[[feeds]]` tables.

pub mod entries;
mod env;
pub mod errors;
pub mod feeds;
pub mod interpolate;
pub mod load;
pub mod problems;
pub mod redact;
pub mod store;
#[cfg(test)]
mod tests;
pub mod validate;

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

pub use self::feeds::FeedConfig;
/// Each feed kind's settings: the feeds crate's own types (one file per kind in `feeds::kind`).
pub use ::feeds::kind::changes::{ChangeFeedConfig, ChangeFilterConfig};
pub use ::feeds::kind::oplog::OplogFeedConfig;
pub use ::feeds::kind::tailable::TailableFeedConfig;
pub use ::feeds::kind::{FeedKindConfig, FeedSettings};
pub use env::{ENV_IGNORED, ENV_PREFIX, ENV_SEPARATOR};
pub use errors::ConfigError;
pub use interpolate::interpolate_env;
pub use problems::Problems;
pub use redact::REDACTED;
pub use store::{DeadLettersConfig, Engine, EventsCollectionConfig, StoreConfig};

pub use crate::source::{SourceConfig, SourceKind};
/// The statistics every feed computes: the feeds crate's own type.
pub use ::feeds::stats::StatsConfig;
/// A kind of change a change feed can select (insert | update | replace | delete): the
/// store's own type.
pub use ::store::ChangeOp;
/// How long a write waits before it is acknowledged (MongoDB's write concerns): the store's
/// own type, so the configured value is the one the engines use.
pub use ::store::Durability;

/// Collections with a fixed size (capped) that a `tailable` feed can follow.
pub const CAPPED_COLLECTIONS: [&str; 2] = ["events", "dead_letters"];

/// The whole tailrace configuration.
///
/// Read it with [`Config::load`] (or [`Config::from_figment`]); it is not `Deserialize` on
/// its own, because the `[[sources]]` and `[[feeds]]` tables are read in a second step that
/// keeps every error's key (see [`entries`]).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Config {
    /// The HTTP server (metrics, health, API).
    pub http: HttpConfig,
    /// Logging that is part of the pipeline's behaviour (the periodic status line).
    pub log: LogConfig,
    /// Where events, rollups and the change history are stored.
    pub store: StoreConfig,
    /// Batching and limits between the sources and the store writer.
    pub ingest: IngestConfig,
    /// The statistics computed by the feeds (Bollinger bands, top-k).
    pub stats: StatsConfig,
    /// Where events come from; names are unique.
    pub sources: Vec<SourceConfig>,
    /// Consumers of the store's tailable cursor / change stream / op log; names are unique.
    pub feeds: Vec<FeedConfig>,
}

impl Config {
    /// A copy safe to print: URL passwords (`store.uri`, source URLs) and header values
    /// replaced with `***`; each source kind hides its own secrets.
    pub fn redacted(&self) -> Config {
        let mut config = self.clone();
        config.store.engine.settings_mut().redact();
        for source in &mut config.sources {
            source.settings_mut().redact();
        }
        config
    }
}

/// The HTTP server.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Address the server binds: serves /metrics, /healthz, /readyz and /api.
    /// Port 0 picks a free port (tests).
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// At most this many `/api/changes` streams (and per-feed streams) open at once; more are
    /// refused with 503. Each holds a task, a reader of the store and a few events in memory.
    #[serde(default = "default_max_streams")]
    pub max_streams: usize,
    /// A change-stream client that accepts no byte for this long (ms) is disconnected, so it
    /// cannot hold a snapshot or a cursor open for ever; it resumes with its last event id.
    #[serde(default = "default_stream_stall_timeout_ms")]
    pub stream_stall_timeout_ms: u64,
    /// What one query (`POST /api/aggregate`) may hold in memory, in bytes (its groups, a
    /// sort's buffer, sets); a query past it is refused. At least 1 MiB.
    #[serde(default = "default_query_max_bytes")]
    pub query_max_bytes: usize,
    /// How many cores a query's threads may use; the rest are left to the pipeline, so that
    /// questions asked back to back do not delay the feeds' notifications. 0 (the default):
    /// all but one, and the only one on a machine of one core.
    #[serde(default)]
    pub query_cores: usize,
}

/// Pipeline logging.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// One status line (rates, queue depth, lag) every this many seconds, so a running
    /// pipeline shows it is alive without a metrics scraper; 0 disables it.
    #[serde(default = "default_status_interval_secs")]
    pub status_interval_secs: u64,
}

/// Batching between the sources and the store writer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct IngestConfig {
    /// Most events in one write; bigger batches mean fewer, larger commits. 1..=10000.
    #[serde(default = "default_batch_max_events")]
    pub batch_max_events: usize,
    /// A partial batch is written after waiting this long for more, bounding the added
    /// latency; 0: at once, with what is already queued.
    #[serde(default = "default_batch_max_wait_ms")]
    pub batch_max_wait_ms: u64,
    /// Capacity of the bounded queue between the sources and the writer; when full, sources
    /// wait (backpressure). At least `batch_max_events`.
    #[serde(default = "default_queue_capacity")]
    pub queue_capacity: usize,
    /// Events larger than this (bytes of JSON) are rejected into the dead letters. At least 64.
    #[serde(default = "default_max_event_bytes")]
    pub max_event_bytes: u64,
    /// Fields (dotted paths) with per-value counters in the `rollups` collection; for an
    /// array field each element is counted.
    #[serde(default = "default_rollup_fields")]
    pub rollup_fields: Vec<String>,
    /// A per-value counter not counted for this many seconds is removed (published as a
    /// delete), so `rollups` holds the values seen lately, not every value ever seen; 0 keeps
    /// them forever. The per-source summaries are kept.
    #[serde(default = "default_rollup_idle_ttl_secs")]
    pub rollup_idle_ttl_secs: u64,
    /// When the pipeline stops: how long the writer may take to write what is queued; past it,
    /// what was not written is reported lost (never acknowledged to a source). At least 1.
    #[serde(default = "default_stop_flush_timeout_secs")]
    pub stop_flush_timeout_secs: u64,
    /// When the pipeline stops: how long the feeds together may take to drain and checkpoint;
    /// a feed still running past it resumes from its previous checkpoint. At least 1.
    #[serde(default = "default_stop_checkpoint_timeout_secs")]
    pub stop_checkpoint_timeout_secs: u64,
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 9750))
}
fn default_max_streams() -> usize {
    64
}
fn default_stream_stall_timeout_ms() -> u64 {
    30_000
}
/// 256 MiB: see [`store::query::Limits`]'s default.
fn default_query_max_bytes() -> usize {
    256 << 20
}
fn default_status_interval_secs() -> u64 {
    10
}
/// 1,024: on long-tail data each event dirties its own pages of every index, and a commit
/// writes each dirty page once however many of its events share it, so larger batches write
/// fewer bytes per event and ingest more flat out. A batch fills only when events wait: a
/// slow stream's events still go alone, after `batch_max_wait_ms`.
fn default_batch_max_events() -> usize {
    1024
}
fn default_batch_max_wait_ms() -> u64 {
    5
}
fn default_queue_capacity() -> usize {
    4096
}
fn default_max_event_bytes() -> u64 {
    64 * 1024
}
fn default_rollup_fields() -> Vec<String> {
    vec!["lang".into(), "hashtags".into()]
}
fn default_rollup_idle_ttl_secs() -> u64 {
    86_400
}

fn default_stop_flush_timeout_secs() -> u64 {
    10
}

fn default_stop_checkpoint_timeout_secs() -> u64 {
    5
}

impl Default for Config {
    fn default() -> Self {
        Config {
            http: HttpConfig::default(),
            log: LogConfig::default(),
            store: StoreConfig::default(),
            ingest: IngestConfig::default(),
            stats: StatsConfig::default(),
            sources: vec![SourceConfig::default_sample()],
            feeds: self::feeds::default_feeds(),
        }
    }
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            listen: default_listen(),
            max_streams: default_max_streams(),
            stream_stall_timeout_ms: default_stream_stall_timeout_ms(),
            query_max_bytes: default_query_max_bytes(),
            query_cores: 0,
        }
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            status_interval_secs: default_status_interval_secs(),
        }
    }
}

impl Default for IngestConfig {
    fn default() -> Self {
        IngestConfig {
            batch_max_events: default_batch_max_events(),
            batch_max_wait_ms: default_batch_max_wait_ms(),
            queue_capacity: default_queue_capacity(),
            max_event_bytes: default_max_event_bytes(),
            rollup_fields: default_rollup_fields(),
            rollup_idle_ttl_secs: default_rollup_idle_ttl_secs(),
            stop_flush_timeout_secs: default_stop_flush_timeout_secs(),
            stop_checkpoint_timeout_secs: default_stop_checkpoint_timeout_secs(),
        }
    }
}
