//! tailrace configuration: the whole tree, its defaults, loading and validation.
//!
//! Sources, later ones overriding earlier ones key by key:
//!
//! 1. the built-in defaults ([`Config::default`], also written out with comments in
//!    `config/tailrace.toml`),
//! 2. the TOML file, if a path is given (a missing file is an error),
//! 3. environment variables `TAILRACE_<KEY>` with `__` between levels, e.g.
//!    `TAILRACE_STORE__ENGINE=mongodb` or `TAILRACE_HTTP__LISTEN=127.0.0.1:0`.
//!    `TAILRACE_CONFIG` and `TAILRACE_LOG` belong to the CLI and are not config keys.
//!
//! Every error is one line that names the dotted key (`store.durability`,
//! `sources[0].rate_per_sec`), what was found, what is allowed, and where the value
//! came from (file or environment variable) when that is known.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use figment::error::{Actual, Kind};
use figment::providers::{Env, Format, Serialized, Toml};
use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider, Source};
use serde::{Deserialize, Serialize};

/// Prefix of the environment variables that override config keys.
pub const ENV_PREFIX: &str = "TAILRACE_";
/// Separator between levels in environment variable names (`TAILRACE_STORE__ENGINE`).
pub const ENV_SEPARATOR: &str = "__";
/// Variables with [`ENV_PREFIX`] that belong to the CLI, not to the config tree
/// (`TAILRACE_CONFIG`, `TAILRACE_LOG`), written without the prefix.
pub const ENV_IGNORED: [&str; 2] = ["config", "log"];

/// The replacement for secrets in [`Config::redacted`].
pub const REDACTED: &str = "***";

/// Collections with a fixed size (capped) that a `tailable` feed can follow.
pub const CAPPED_COLLECTIONS: [&str; 2] = ["events", "dead_letters"];

// ---------------------------------------------------------------------------------------
// The tree
// ---------------------------------------------------------------------------------------

/// The whole tailrace configuration.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
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

/// The HTTP server.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Address the server binds: serves /metrics, /healthz, /readyz and /api.
    /// Port 0 picks a free port (tests).
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
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

/// Which storage engine holds the collections.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum StoreEngine {
    /// In-process engine writing files under `store.path`; needs nothing else running.
    Embedded,
    /// A MongoDB replica set at `store.uri` (change streams need a replica set).
    Mongodb,
}

/// How long a write waits before it is acknowledged (MongoDB's write concerns): the store's
/// own type, so the configured value is the one the engines use.
pub use store::Durability;

/// The store.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// The storage engine: `embedded` (no dependencies) or `mongodb`.
    #[serde(default = "default_engine")]
    pub engine: StoreEngine,
    /// Embedded engine: directory of the database files (created if missing).
    #[serde(default = "default_store_path")]
    pub path: PathBuf,
    /// MongoDB engine: connection string; needs a replica set for change streams.
    #[serde(default = "default_uri")]
    pub uri: String,
    /// Database name holding the collections (both engines).
    #[serde(default = "default_database")]
    pub database: String,
    /// Write concern of every write; trades latency for what survives a crash.
    #[serde(default = "default_durability")]
    pub durability: Durability,
    /// Embedded engine: how many entries the op log (change feed history) keeps; a feed
    /// that falls further behind must resynchronise. At least 1000.
    #[serde(default = "default_oplog_max_entries")]
    pub oplog_max_entries: u64,
    /// The capped collection of ingested events.
    #[serde(default = "default_events")]
    pub events: EventsCollectionConfig,
    /// The capped collection of rejected events (too large, unparsable), for inspection.
    #[serde(default = "default_dead_letters")]
    pub dead_letters: DeadLettersConfig,
}

/// The capped `events` collection.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct EventsCollectionConfig {
    /// Newest documents kept; older ones are evicted. At least 1.
    #[serde(default = "default_events_max_docs")]
    pub max_docs: u64,
    /// Total size bound in bytes; whichever bound is hit first evicts. At least 4096.
    #[serde(default = "default_events_max_bytes")]
    pub max_bytes: u64,
    /// Fields (dotted paths) indexed so that `latest(field = value)` is a lookup, not a scan.
    #[serde(default = "default_events_indexes")]
    pub indexes: Vec<String>,
}

/// The capped `dead_letters` collection.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DeadLettersConfig {
    /// Newest rejected events kept. At least 1.
    #[serde(default = "default_dead_letters_max_docs")]
    pub max_docs: u64,
    /// Total size bound in bytes. At least 4096.
    #[serde(default = "default_dead_letters_max_bytes")]
    pub max_bytes: u64,
}

/// Batching between the sources and the store writer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct IngestConfig {
    /// Most events in one write; bigger batches mean fewer, larger commits. 1..=10000.
    #[serde(default = "default_batch_max_events")]
    pub batch_max_events: usize,
    /// A partial batch is written after waiting this long, bounding the added latency.
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
}

/// Statistics computed by the feeds.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct StatsConfig {
    /// Bollinger period N: the moving window, in events. At least 2.
    #[serde(default = "default_period")]
    pub period: usize,
    /// Bollinger band width in standard deviations. Greater than 0.
    #[serde(default = "default_k")]
    pub k: f64,
    /// Numeric field (dotted path) whose Bollinger bands are computed.
    #[serde(default = "default_value_field")]
    pub value_field: String,
    /// How many of the most frequent values of `topk_field` are reported. At least 1.
    #[serde(default = "default_topk")]
    pub topk: usize,
    /// Field (dotted path) whose most frequent values are counted; arrays count each element.
    #[serde(default = "default_topk_field")]
    pub topk_field: String,
    /// Sliding window of the top-k counts, in seconds. At least 1.
    #[serde(default = "default_topk_window_secs")]
    pub topk_window_secs: u64,
    /// How often each feed saves its position and state, so a restart resumes there. At least 1.
    #[serde(default = "default_checkpoint_interval_ms")]
    pub checkpoint_interval_ms: u64,
}

/// What produces a source's events.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SourceKind {
    /// Generated tweet-like events at `rate_per_sec`, with bursts.
    Synthetic,
    /// A streaming HTTP response at `url` (`format`: ndjson or sse).
    Http,
    /// A file of newline-delimited JSON at `path`, replayed at `pace`.
    File,
    /// Newline-delimited JSON on standard input.
    Stdin,
    /// Newline-delimited JSON on the standard output of `program` with `args`.
    Command,
}

/// Framing of an HTTP source's response body.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum HttpFormat {
    /// One JSON document per line.
    Ndjson,
    /// Server-sent events; each `data:` payload is one JSON document.
    Sse,
}

/// How fast a file source replays its events.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Pace {
    /// As fast as the pipeline accepts them.
    Fast,
    /// At `rate_per_sec`.
    Rate,
    /// Following the gaps between the events' own timestamps.
    Timestamps,
}

/// One event source. A flat struct rather than an enum tagged by `kind`: serde reports
/// unknown and mistyped fields of a flat struct with their key, while an internally tagged
/// enum loses them; [`Config::validate`] checks which fields each kind needs and allows.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SourceConfig {
    /// Unique name, `[a-z0-9_-]+`; labels metrics and is stored with each event.
    pub name: String,
    /// What produces the events: synthetic, http, file, stdin or command.
    pub kind: SourceKind,
    /// Events per second: required for synthetic and for file with `pace = "rate"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_per_sec: Option<f64>,
    /// Synthetic only: random seed, for a reproducible stream; absent = random.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Synthetic: chance per second that a burst starts (0..=1).
    #[serde(default = "default_burst_probability")]
    pub burst_probability: f64,
    /// Synthetic: the rate is multiplied by this during a burst (>= 1).
    #[serde(default = "default_burst_multiplier")]
    pub burst_multiplier: f64,
    /// Synthetic: how long a burst lasts, in seconds (>= 1).
    #[serde(default = "default_burst_secs")]
    pub burst_secs: u64,
    /// Http only (required): the streaming endpoint, `http://` or `https://`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Http only: body framing, ndjson (the default) or sse.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<HttpFormat>,
    /// Http only: extra request headers (e.g. authorization); redacted when printed.
    /// `${NAME}` in a value is replaced by the environment variable NAME when the source
    /// starts (`"Bearer ${API_TOKEN}"`); `$$` is a literal `$`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// Http only: give up a connection attempt after this long (ms); default 10000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_timeout_ms: Option<u64>,
    /// Http only: a connection that delivers no byte for this long (ms), heartbeats
    /// included, is stalled: it is dropped and reopened. Also bounds the wait for the response
    /// headers. Default 90000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_ms: Option<u64>,
    /// Http and command: the longest wait between reconnects / restarts (ms); waits double
    /// from 100 ms up to this, with jitter. Default 30000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconnect_max_ms: Option<u64>,
    /// File only (required): the newline-delimited JSON file to replay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// File only: replay speed, fast (the default), rate or timestamps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pace: Option<Pace>,
    /// File with pace = "timestamps": the field (dotted path) holding each event's time, an
    /// RFC 3339 string or a number of seconds (milliseconds when above 10^11) since the
    /// epoch; default "created_at". Events without it are not delayed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp_field: Option<String>,
    /// File with pace = "timestamps": replay this many times faster than recorded; default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speed: Option<f64>,
    /// File only: at the end, wait for appended lines like `tail -f` (the source never ends;
    /// a truncated or replaced file is read again from its start). Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub follow: Option<bool>,
    /// Command only (required): the program to run (looked up in PATH).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub program: Option<String>,
    /// Command only: the program's arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Command only: start the program again (with backoff) when it exits; default true.
    /// With false, the source ends when the program exits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart: Option<bool>,
}

/// How a feed reads the store (tailable | changes | oplog): the feeds crate's own type.
pub use feeds::FeedKind;

/// A kind of change a change feed can select (insert | update | replace | delete): the
/// store's own type.
pub use store::ChangeOp;

/// One consumer of the store.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FeedConfig {
    /// Unique name, `[a-z0-9_-]+`; names its checkpoint and its metrics.
    pub name: String,
    /// How it reads: tailable, changes or oplog.
    pub kind: FeedKind,
    /// Tailable only: the capped collection followed (events or dead_letters);
    /// absent = "events".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collection: Option<String>,
    /// Changes and oplog only: the collections watched; absent or empty = ["rollups"].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub collections: Vec<String>,
    /// Changes and oplog only: which changes are delivered; absent = all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<ChangeFilterConfig>,
}

/// Selects the changes a change/oplog feed delivers.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ChangeFilterConfig {
    /// Kinds of change delivered (insert, update, replace, delete); empty = all.
    #[serde(default)]
    pub ops: Vec<ChangeOp>,
    /// Only changes of documents whose key starts with this; absent = all keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_prefix: Option<String>,
}

// ---------------------------------------------------------------------------------------
// Defaults
// ---------------------------------------------------------------------------------------

/// An http source's `connect_timeout_ms` when not given.
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 10_000;
/// An http source's `idle_timeout_ms` when not given.
pub const DEFAULT_IDLE_TIMEOUT_MS: u64 = 90_000;
/// An http or command source's `reconnect_max_ms` when not given.
pub const DEFAULT_RECONNECT_MAX_MS: u64 = 30_000;
/// A file source's `timestamp_field` (pace = "timestamps") when not given.
pub const DEFAULT_TIMESTAMP_FIELD: &str = "created_at";

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 9750))
}
fn default_status_interval_secs() -> u64 {
    10
}
fn default_engine() -> StoreEngine {
    StoreEngine::Embedded
}
fn default_store_path() -> PathBuf {
    PathBuf::from("data")
}
fn default_uri() -> String {
    "mongodb://localhost:27017/?replicaSet=rs0".to_owned()
}
fn default_database() -> String {
    "tailrace".to_owned()
}
fn default_durability() -> Durability {
    Durability::Journaled
}
fn default_oplog_max_entries() -> u64 {
    1_000_000
}
fn default_events() -> EventsCollectionConfig {
    EventsCollectionConfig::default()
}
fn default_events_max_docs() -> u64 {
    100_000
}
fn default_events_max_bytes() -> u64 {
    64 * 1024 * 1024
}
fn default_events_indexes() -> Vec<String> {
    vec!["user.screen_name".into(), "user.id".into(), "id".into()]
}
fn default_dead_letters() -> DeadLettersConfig {
    DeadLettersConfig::default()
}
fn default_dead_letters_max_docs() -> u64 {
    10_000
}
fn default_dead_letters_max_bytes() -> u64 {
    16 * 1024 * 1024
}
fn default_batch_max_events() -> usize {
    256
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
fn default_period() -> usize {
    20
}
fn default_k() -> f64 {
    2.0
}
fn default_value_field() -> String {
    "retweet_count".to_owned()
}
fn default_topk() -> usize {
    10
}
fn default_topk_field() -> String {
    "hashtags".to_owned()
}
fn default_topk_window_secs() -> u64 {
    60
}
fn default_checkpoint_interval_ms() -> u64 {
    1000
}
fn default_burst_probability() -> f64 {
    0.01
}
fn default_burst_multiplier() -> f64 {
    5.0
}
fn default_burst_secs() -> u64 {
    3
}
fn default_tailable_collection() -> String {
    "events".to_owned()
}
fn default_change_collections() -> Vec<String> {
    vec!["rollups".to_owned()]
}
fn default_sources() -> Vec<SourceConfig> {
    vec![SourceConfig {
        rate_per_sec: Some(70.0),
        ..SourceConfig::new("sample", SourceKind::Synthetic)
    }]
}
fn default_feeds() -> Vec<FeedConfig> {
    vec![
        FeedConfig {
            collection: Some(default_tailable_collection()),
            ..FeedConfig::new("tail", FeedKind::Tailable)
        },
        FeedConfig {
            collections: default_change_collections(),
            filter: Some(ChangeFilterConfig {
                ops: vec![ChangeOp::Insert, ChangeOp::Update],
                key_prefix: Some("source:".to_owned()),
            }),
            ..FeedConfig::new("changes", FeedKind::Changes)
        },
    ]
}

impl Default for Config {
    fn default() -> Self {
        Config {
            http: HttpConfig::default(),
            log: LogConfig::default(),
            store: StoreConfig::default(),
            ingest: IngestConfig::default(),
            stats: StatsConfig::default(),
            sources: default_sources(),
            feeds: default_feeds(),
        }
    }
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            listen: default_listen(),
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

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            engine: default_engine(),
            path: default_store_path(),
            uri: default_uri(),
            database: default_database(),
            durability: default_durability(),
            oplog_max_entries: default_oplog_max_entries(),
            events: default_events(),
            dead_letters: default_dead_letters(),
        }
    }
}

impl Default for EventsCollectionConfig {
    fn default() -> Self {
        EventsCollectionConfig {
            max_docs: default_events_max_docs(),
            max_bytes: default_events_max_bytes(),
            indexes: default_events_indexes(),
        }
    }
}

impl Default for DeadLettersConfig {
    fn default() -> Self {
        DeadLettersConfig {
            max_docs: default_dead_letters_max_docs(),
            max_bytes: default_dead_letters_max_bytes(),
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
        }
    }
}

impl Default for StatsConfig {
    fn default() -> Self {
        StatsConfig {
            period: default_period(),
            k: default_k(),
            value_field: default_value_field(),
            topk: default_topk(),
            topk_field: default_topk_field(),
            topk_window_secs: default_topk_window_secs(),
            checkpoint_interval_ms: default_checkpoint_interval_ms(),
        }
    }
}

impl SourceConfig {
    /// A source with this name and kind and every optional field unset (burst settings at
    /// their defaults); fill in what the kind requires before validating.
    pub fn new(name: impl Into<String>, kind: SourceKind) -> Self {
        SourceConfig {
            name: name.into(),
            kind,
            rate_per_sec: None,
            seed: None,
            burst_probability: default_burst_probability(),
            burst_multiplier: default_burst_multiplier(),
            burst_secs: default_burst_secs(),
            url: None,
            format: None,
            headers: BTreeMap::new(),
            connect_timeout_ms: None,
            idle_timeout_ms: None,
            reconnect_max_ms: None,
            path: None,
            pace: None,
            timestamp_field: None,
            speed: None,
            follow: None,
            program: None,
            args: Vec::new(),
            restart: None,
        }
    }
}

impl FeedConfig {
    /// A feed with this name and kind and every optional field unset.
    pub fn new(name: impl Into<String>, kind: FeedKind) -> Self {
        FeedConfig {
            name: name.into(),
            kind,
            collection: None,
            collections: Vec::new(),
            filter: None,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Enum names
// ---------------------------------------------------------------------------------------

macro_rules! names {
    ($ty:ident { $($variant:ident => $name:literal),+ $(,)? }) => {
        impl $ty {
            /// Every value, in the order of the docs.
            pub const ALL: &'static [$ty] = &[$($ty::$variant),+];

            /// The lowercase name used in the config file.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($ty::$variant => $name),+
                }
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

names!(StoreEngine { Embedded => "embedded", Mongodb => "mongodb" });
names!(SourceKind {
    Synthetic => "synthetic",
    Http => "http",
    File => "file",
    Stdin => "stdin",
    Command => "command",
});
names!(HttpFormat { Ndjson => "ndjson", Sse => "sse" });
names!(Pace { Fast => "fast", Rate => "rate", Timestamps => "timestamps" });

// ---------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------

/// Why the configuration could not be loaded. Every message is one line.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file given does not exist (figment alone would silently skip it).
    #[error(
        "config file {} does not exist (give the path of an existing TOML file, or none to run on the defaults and TAILRACE_* variables)",
        .path.display()
    )]
    MissingFile {
        /// The path as given.
        path: PathBuf,
    },
    /// The file or an environment variable could not be read into the tree: syntax, unknown
    /// key, wrong type, unknown enum value. One entry per problem.
    #[error("{}", .problems.join("; "))]
    Load {
        /// One-line descriptions, each naming the key and where it came from.
        problems: Vec<String>,
    },
    /// The tree was read but breaks rules ([`Config::validate`]). One entry per problem.
    #[error("{}", .problems.join("; "))]
    Invalid {
        /// One-line descriptions, each starting with the dotted key.
        problems: Vec<String>,
    },
}

impl ConfigError {
    /// The individual problems (one for [`ConfigError::MissingFile`]).
    pub fn problems(&self) -> Vec<String> {
        match self {
            ConfigError::MissingFile { .. } => vec![self.to_string()],
            ConfigError::Load { problems } | ConfigError::Invalid { problems } => problems.clone(),
        }
    }

    /// Turns a figment error (possibly several chained) into one-line problems.
    fn from_figment(figment: &Figment, error: figment::Error) -> ConfigError {
        let problems = error
            .into_iter()
            .map(|e| describe_figment_error(figment, &e))
            .collect();
        ConfigError::Load { problems }
    }
}

/// Name given to the environment provider's metadata, to recognise it in errors.
const ENV_METADATA_NAME: &str = "environment variable";

/// The environment variable that sets the key at `path` (`TAILRACE_STORE__ENGINE`). An
/// array comes whole from one variable, so the name stops before the first index.
fn env_var_name<S: AsRef<str>>(path: &[S]) -> String {
    let keys: Vec<String> = path
        .iter()
        .map(AsRef::as_ref)
        .take_while(|k| !is_index(k))
        .map(str::to_ascii_uppercase)
        .collect();
    format!("{ENV_PREFIX}{}", keys.join(ENV_SEPARATOR))
}

/// `TAILRACE_*` variables, minus the CLI's own, split into levels at `__`; its metadata
/// names the variable of a key, so errors can point at it.
struct EnvProvider;

impl EnvProvider {
    fn env() -> Env {
        Env::prefixed(ENV_PREFIX)
            .ignore(&ENV_IGNORED)
            .split(ENV_SEPARATOR)
    }
}

impl Provider for EnvProvider {
    fn metadata(&self) -> Metadata {
        Metadata::named(ENV_METADATA_NAME)
            .interpolater(|_: &Profile, keys: &[&str]| env_var_name(keys))
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        Self::env().data()
    }
}

/// Whether a path segment is an array index.
fn is_index(segment: &str) -> bool {
    !segment.is_empty() && segment.bytes().all(|b| b.is_ascii_digit())
}

/// `store.events.max_docs`, `sources[0].url`: array indices in brackets.
fn dotted_key<S: AsRef<str>>(path: &[S]) -> String {
    let mut key = String::new();
    for segment in path {
        let segment = segment.as_ref();
        if !key.is_empty() && is_index(segment) {
            key.push('[');
            key.push_str(segment);
            key.push(']');
        } else {
            if !key.is_empty() {
                key.push('.');
            }
            key.push_str(segment);
        }
    }
    key
}

/// Where a value came from, e.g. `file config/tailrace.toml` or `env TAILRACE_STORE__ENGINE`;
/// `None` for the built-in defaults or when unknown.
fn origin(md: &Metadata, profile: &Profile, path: &[String]) -> Option<String> {
    match &md.source {
        Some(Source::File(file)) => Some(format!("file {}", file.display())),
        Some(Source::Code(_)) => None,
        Some(Source::Custom(custom)) => Some(format!("{} {custom}", md.name)),
        None if md.name == ENV_METADATA_NAME && !path.is_empty() => {
            Some(format!("env {}", md.interpolate(profile, path)))
        }
        None if md.name == ENV_METADATA_NAME => Some("environment variables".to_owned()),
        None => Some(md.name.to_string()),
        // `Source` is non-exhaustive.
        Some(_) => Some(md.name.to_string()),
    }
}

/// Where the value that a figment error is about came from.
fn error_origin(error: &figment::Error) -> Option<String> {
    let profile = error.profile.clone().unwrap_or_default();
    origin(error.metadata.as_ref()?, &profile, &error.path)
}

/// Where the value at `path` (or, if it is absent, its nearest present parent) came from.
fn value_origin(figment: &Figment, path: &[String]) -> Option<String> {
    (1..=path.len()).rev().find_map(|len| {
        let value = find_value(figment, &path[..len])?;
        let md = figment.get_metadata(value.tag())?;
        let profile = value.tag().profile().unwrap_or_default();
        Some(origin(md, &profile, &path[..len]))
    })?
}

/// `sources[1].url` back to `["sources", "1", "url"]`.
fn key_path(key: &str) -> Vec<String> {
    key.split(['.', '[', ']'])
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Plain words for serde's "expected" strings.
fn expected_words(expected: &str) -> String {
    match expected {
        "u8" | "u16" | "u32" | "u64" | "u128" | "usize" => "a non-negative integer".to_owned(),
        "i8" | "i16" | "i32" | "i64" | "i128" | "isize" => "an integer".to_owned(),
        "f32" | "f64" => "a number".to_owned(),
        "a sequence" => "an array".to_owned(),
        "a map" => "a table".to_owned(),
        e if e.starts_with("struct ") => "a table".to_owned(),
        e => e.to_owned(),
    }
}

/// Plain words for what serde found.
fn actual_words(actual: &Actual) -> String {
    match actual {
        Actual::Bool(v) => format!("boolean {v}"),
        Actual::Unsigned(v) => format!("integer {v}"),
        Actual::Signed(v) => format!("integer {v}"),
        Actual::Float(v) => format!("number {v}"),
        Actual::Char(v) => format!("{:?}", v.to_string()),
        Actual::Str(v) => format!("string {v:?}"),
        Actual::Seq => "an array".to_owned(),
        Actual::Map => "a table".to_owned(),
        Actual::Unit | Actual::Option => "nothing".to_owned(),
        other => other.to_string(),
    }
}

/// Comma-separated, as in `a, b, c`.
fn list(items: &[&str]) -> String {
    items.join(", ")
}

/// Makes a possibly multi-line message (TOML syntax errors draw a snippet) one line.
fn one_line(message: &str) -> String {
    let lines: Vec<&str> = message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        // The snippet: `  |`, `1 | a = `, `  |     ^`.
        .filter(|l| {
            !l.starts_with('|')
                && !l
                    .split_once(" |")
                    .is_some_and(|(n, _)| n.trim().bytes().all(|b| b.is_ascii_digit()))
        })
        .collect();
    lines.join(": ")
}

/// The value at `path` in the merged configuration.
fn find_value(figment: &Figment, path: &[String]) -> Option<Value> {
    let (first, rest) = path.split_first()?;
    let mut value: Value = figment.find_value(first).ok()?;
    for key in rest {
        value = match value {
            Value::Dict(_, mut dict) => dict.remove(key)?,
            Value::Array(_, mut items) => {
                let index: usize = key.parse().ok()?;
                if index >= items.len() {
                    return None;
                }
                items.swap_remove(index)
            }
            _ => return None,
        };
    }
    Some(value)
}

/// One line: dotted key, what was found, what is allowed, where it came from.
fn describe_figment_error(figment: &Figment, error: &figment::Error) -> String {
    let path = &error.path;
    let key = dotted_key(path);
    let mut message = match &error.kind {
        Kind::UnknownField(field, allowed) => {
            let mut full = path.clone();
            if full.last() != Some(field) {
                full.push(field.clone());
            }
            let mut text = format!(
                "unknown key {} (allowed: {})",
                dotted_key(&full),
                list(allowed)
            );
            let from_env = error
                .metadata
                .as_ref()
                .is_some_and(|md| md.name == ENV_METADATA_NAME);
            // TAILRACE_STORE_ENGINE: one `_` where the level separator `__` was meant.
            let meant = allowed.iter().find_map(|a| {
                let rest = field.strip_prefix(a)?.strip_prefix('_')?;
                let mut meant = path[..full.len() - 1].to_vec();
                meant.extend([(*a).to_owned(), rest.to_owned()]);
                Some(meant)
            });
            if let (true, Some(meant)) = (from_env, meant) {
                text.push_str(&format!(
                    " (levels are separated by __: did you mean {}?)",
                    env_var_name(&meant)
                ));
            }
            text
        }
        Kind::UnknownVariant(found, allowed) => {
            format!("{key}: {found:?} is not one of {}", list(allowed))
        }
        Kind::MissingField(field) => {
            let mut full = path.clone();
            full.push(field.to_string());
            format!("{}: missing (required)", dotted_key(&full))
        }
        Kind::DuplicateField(field) => {
            let mut full = path.clone();
            full.push((*field).to_owned());
            format!("{}: given more than once", dotted_key(&full))
        }
        Kind::InvalidType(actual, expected) => {
            let mut text = format!(
                "{key}: expected {}, found {}",
                expected_words(expected),
                actual_words(actual)
            );
            let from_env = error
                .metadata
                .as_ref()
                .is_some_and(|md| md.name == ENV_METADATA_NAME);
            if from_env && *actual == Actual::Map && expected == "a sequence" {
                text.push_str(&format!(
                    " (an array cannot be set element by element: set {} to the whole array, e.g. '[{{ name = \"a\", kind = \"stdin\" }}]')",
                    env_var_name(path)
                ));
            } else if from_env && expected == "a string" {
                // Environment values are parsed: 123 is a number, true a boolean.
                text.push_str(&format!(
                    " (quote it to keep it a string: {}='\"...\"')",
                    env_var_name(path)
                ));
            }
            text
        }
        Kind::InvalidValue(actual, expected) => format!(
            "{key}: {} is out of range, expected {}",
            actual_words(actual),
            expected_words(expected)
        ),
        Kind::InvalidLength(len, expected) => {
            format!("{key}: {len} items, expected {expected}")
        }
        Kind::Message(text) if key.is_empty() => {
            // Not about a key: the file could not be read or parsed.
            return match error_origin(error) {
                Some(origin) => format!("{origin}: {}", one_line(text)),
                None => one_line(text),
            };
        }
        Kind::Message(text) => {
            match find_value(figment, path).and_then(|v| serde_json::to_string(&v).ok()) {
                Some(found) if text.contains("socket address") => format!(
                    "{key}: {found} is not valid: {} (expected ip:port, e.g. 127.0.0.1:9750)",
                    one_line(text)
                ),
                Some(found) => format!("{key}: {found} is not valid: {}", one_line(text)),
                None => format!("{key}: {}", one_line(text)),
            }
        }
        other => {
            let text = one_line(&other.to_string());
            if key.is_empty() {
                text
            } else {
                format!("{key}: {text}")
            }
        }
    };
    if let Some(origin) = error_origin(error) {
        message.push_str(" (from ");
        message.push_str(&origin);
        message.push(')');
    }
    message
}

// ---------------------------------------------------------------------------------------
// Loading
// ---------------------------------------------------------------------------------------

impl Config {
    /// Loads the configuration: defaults, then the TOML file at `path` (which must exist),
    /// then `TAILRACE_*` environment variables; then validates it.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        if let Some(missing) = path.filter(|p| !p.exists()) {
            return Err(ConfigError::MissingFile {
                path: missing.to_path_buf(),
            });
        }
        Config::from_figment(Config::figment(path))
    }

    /// The layered sources without extracting them: defaults, the file (if any, taken as
    /// given, not searched for in parent directories), then the environment. Does not check
    /// that the file exists; [`Config::load`] does.
    pub fn figment(path: Option<&Path>) -> Figment {
        let figment = Figment::from(Serialized::defaults(Config::default()));
        let figment = match path {
            Some(path) => figment.merge(Toml::file_exact(path)),
            None => figment,
        };
        figment.merge(EnvProvider)
    }

    /// Extracts, fills in the per-kind defaults (a tailable feed's `collection`, a change
    /// feed's `collections`, an http source's `format`, a file source's `pace`) and validates.
    pub fn from_figment(figment: Figment) -> Result<Config, ConfigError> {
        let mut config: Config = figment
            .extract()
            .map_err(|e| ConfigError::from_figment(&figment, e))?;
        config.fill_kind_defaults();
        config.validate_from(&figment)?;
        Ok(config)
    }

    /// Sets the defaults that depend on a source's or feed's kind where they were left out.
    fn fill_kind_defaults(&mut self) {
        for source in &mut self.sources {
            match source.kind {
                SourceKind::Http => {
                    source.format.get_or_insert(HttpFormat::Ndjson);
                    source
                        .connect_timeout_ms
                        .get_or_insert(DEFAULT_CONNECT_TIMEOUT_MS);
                    source
                        .idle_timeout_ms
                        .get_or_insert(DEFAULT_IDLE_TIMEOUT_MS);
                    source
                        .reconnect_max_ms
                        .get_or_insert(DEFAULT_RECONNECT_MAX_MS);
                }
                SourceKind::File => {
                    let pace = *source.pace.get_or_insert(Pace::Fast);
                    source.follow.get_or_insert(false);
                    if pace == Pace::Timestamps {
                        source
                            .timestamp_field
                            .get_or_insert_with(|| DEFAULT_TIMESTAMP_FIELD.to_owned());
                        source.speed.get_or_insert(1.0);
                    }
                }
                SourceKind::Command => {
                    source.restart.get_or_insert(true);
                    source
                        .reconnect_max_ms
                        .get_or_insert(DEFAULT_RECONNECT_MAX_MS);
                }
                _ => {}
            }
        }
        for feed in &mut self.feeds {
            match feed.kind {
                FeedKind::Tailable if feed.collection.is_none() => {
                    feed.collection = Some(default_tailable_collection());
                }
                FeedKind::Changes | FeedKind::Oplog if feed.collections.is_empty() => {
                    feed.collections = default_change_collections();
                }
                _ => {}
            }
        }
    }

    /// Checks every rule and reports all broken ones at once, each as `key: message`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let problems = self.problems();
        if problems.is_empty() {
            return Ok(());
        }
        Err(ConfigError::Invalid {
            problems: problems
                .into_iter()
                .map(|(key, message)| format!("{key}: {message}"))
                .collect(),
        })
    }

    /// Like [`Config::validate`], adding where each offending value came from.
    fn validate_from(&self, figment: &Figment) -> Result<(), ConfigError> {
        let problems = self.problems();
        if problems.is_empty() {
            return Ok(());
        }
        Err(ConfigError::Invalid {
            problems: problems
                .into_iter()
                .map(
                    |(key, message)| match value_origin(figment, &key_path(&key)) {
                        Some(origin) => format!("{key}: {message} (from {origin})"),
                        None => format!("{key}: {message}"),
                    },
                )
                .collect(),
        })
    }

    /// Every broken rule: (dotted key, message).
    fn problems(&self) -> Vec<(String, String)> {
        let mut p = Problems::default();
        self.validate_store(&mut p);
        self.validate_ingest(&mut p);
        self.validate_stats(&mut p);
        let mut names = BTreeSet::new();
        for (i, source) in self.sources.iter().enumerate() {
            validate_source(&mut p, i, source, &mut names);
        }
        let mut names = BTreeSet::new();
        for (i, feed) in self.feeds.iter().enumerate() {
            validate_feed(&mut p, i, feed, &mut names);
        }
        p.0
    }

    fn validate_store(&self, p: &mut Problems) {
        let s = &self.store;
        match s.engine {
            StoreEngine::Embedded => {
                if s.path.as_os_str().is_empty() {
                    p.push(
                        "store.path",
                        "required for engine = \"embedded\" (a directory, e.g. \"data\")",
                    );
                }
            }
            StoreEngine::Mongodb => {
                if s.uri.trim().is_empty() {
                    p.push("store.uri", "required for engine = \"mongodb\" (e.g. \"mongodb://localhost:27017/?replicaSet=rs0\")");
                } else if !(s.uri.starts_with("mongodb://") || s.uri.starts_with("mongodb+srv://"))
                {
                    p.push(
                        "store.uri",
                        format!(
                            "must start with mongodb:// or mongodb+srv:// (got {})",
                            scheme_of(&s.uri)
                        ),
                    );
                }
            }
        }
        if s.database.is_empty() {
            p.push("store.database", "must not be empty");
        } else if s.database.len() >= 64 || s.database.chars().any(|c| "/\\. \"$\0".contains(c)) {
            p.push(
                "store.database",
                format!(
                    "{:?} is not a database name (under 64 bytes, none of / \\ . space \" $)",
                    s.database
                ),
            );
        }
        p.at_least("store.oplog_max_entries", s.oplog_max_entries, 1000);
        p.at_least("store.events.max_docs", s.events.max_docs, 1);
        p.at_least("store.events.max_bytes", s.events.max_bytes, 4096);
        p.field_paths("store.events.indexes", &s.events.indexes);
        p.at_least("store.dead_letters.max_docs", s.dead_letters.max_docs, 1);
        p.at_least(
            "store.dead_letters.max_bytes",
            s.dead_letters.max_bytes,
            4096,
        );
    }

    fn validate_ingest(&self, p: &mut Problems) {
        let i = &self.ingest;
        if !(1..=10_000).contains(&i.batch_max_events) {
            p.push(
                "ingest.batch_max_events",
                format!("must be in 1..=10000 (got {})", i.batch_max_events),
            );
        }
        if i.queue_capacity < i.batch_max_events {
            p.push(
                "ingest.queue_capacity",
                format!(
                    "must be >= ingest.batch_max_events = {} (got {})",
                    i.batch_max_events, i.queue_capacity
                ),
            );
        }
        p.at_least("ingest.max_event_bytes", i.max_event_bytes, 64);
        if i.max_event_bytes > self.store.events.max_bytes {
            p.push(
                "ingest.max_event_bytes",
                format!(
                    "must be <= store.events.max_bytes = {} (got {}): a larger event could never be stored",
                    self.store.events.max_bytes, i.max_event_bytes
                ),
            );
        }
        p.field_paths("ingest.rollup_fields", &i.rollup_fields);
    }

    fn validate_stats(&self, p: &mut Problems) {
        let s = &self.stats;
        p.at_least("stats.period", s.period as u64, 2);
        if !(s.k.is_finite() && s.k > 0.0) {
            p.push("stats.k", format!("must be > 0 (got {})", s.k));
        }
        p.field_path("stats.value_field", &s.value_field);
        p.at_least("stats.topk", s.topk as u64, 1);
        p.field_path("stats.topk_field", &s.topk_field);
        p.at_least("stats.topk_window_secs", s.topk_window_secs, 1);
        p.at_least("stats.checkpoint_interval_ms", s.checkpoint_interval_ms, 1);
    }

    /// A copy safe to print: header values and URL passwords (`store.uri`, http source
    /// `url`s) replaced with `***`.
    pub fn redacted(&self) -> Config {
        let mut config = self.clone();
        config.store.uri = redact_url(&config.store.uri);
        for source in &mut config.sources {
            for value in source.headers.values_mut() {
                *value = REDACTED.to_owned();
            }
            if let Some(url) = &mut source.url {
                *url = redact_url(url);
            }
        }
        config
    }
}

/// The scheme of a URL for messages, without echoing the rest (it may hold a password).
fn scheme_of(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, _)) => format!("scheme {scheme:?}"),
        None => "no scheme".to_owned(),
    }
}

/// Replaces the password of a URL's userinfo (`scheme://user:password@host`) with `***`.
fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let rest_start = scheme_end + 3;
    let rest = &url[rest_start..];
    // The userinfo ends at the last '@' before the query or fragment.
    let before_query = rest.find(['?', '#']).unwrap_or(rest.len());
    let Some(at) = rest[..before_query].rfind('@') else {
        return url.to_owned();
    };
    let Some(colon) = rest[..at].find(':') else {
        return url.to_owned();
    };
    format!(
        "{}{}{}",
        &url[..rest_start + colon + 1],
        REDACTED,
        &url[rest_start + at..]
    )
}

/// Validation problems: (dotted key, message).
#[derive(Default)]
struct Problems(Vec<(String, String)>);

impl Problems {
    fn push(&mut self, key: impl fmt::Display, message: impl fmt::Display) {
        self.0.push((key.to_string(), message.to_string()));
    }

    fn at_least(&mut self, key: &str, value: u64, min: u64) {
        if value < min {
            self.push(key, format!("must be >= {min} (got {value})"));
        }
    }

    /// A dotted field path: non-empty segments, not starting with `$`.
    fn field_path(&mut self, key: &str, path: &str) {
        if path.is_empty() || path.split('.').any(|s| s.is_empty() || s.starts_with('$')) {
            self.push(
                key,
                format!("{path:?} is not a field path (dot-separated names, e.g. \"user.id\")"),
            );
        }
    }

    fn field_paths(&mut self, key: &str, paths: &[String]) {
        let mut seen = BTreeSet::new();
        for (i, path) in paths.iter().enumerate() {
            self.field_path(&format!("{key}[{i}]"), path);
            if !seen.insert(path) {
                self.push(format!("{key}[{i}]"), format!("{path:?} is listed twice"));
            }
        }
    }

    /// `[a-z0-9_-]+`, unique among `names`.
    fn name(&mut self, key: &str, name: &str, names: &mut BTreeSet<String>) {
        let valid = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
        if !valid {
            self.push(key, format!("{name:?} must match [a-z0-9_-]+"));
        } else if !names.insert(name.to_owned()) {
            self.push(
                key,
                format!("{name:?} is used twice (names must be unique)"),
            );
        }
    }

    fn required<T>(&mut self, key: &str, value: &Option<T>, what: &str) {
        if value.is_none() {
            self.push(key, format!("required for {what}"));
        }
    }

    fn forbidden(&mut self, key: &str, is_set: bool, what: &str) {
        if is_set {
            self.push(key, format!("only for {what}"));
        }
    }
}

fn validate_source(p: &mut Problems, i: usize, s: &SourceConfig, names: &mut BTreeSet<String>) {
    let key = |field: &str| format!("sources[{i}].{field}");
    p.name(&key("name"), &s.name, names);
    let kind = format!("kind = {:?}", s.kind.as_str());

    // Which fields each kind takes.
    let synthetic = s.kind == SourceKind::Synthetic;
    let http = s.kind == SourceKind::Http;
    let file = s.kind == SourceKind::File;
    let command = s.kind == SourceKind::Command;
    let rated_file = file && s.pace == Some(Pace::Rate);

    if synthetic {
        p.required(&key("rate_per_sec"), &s.rate_per_sec, &kind);
    } else if rated_file {
        p.required(
            &key("rate_per_sec"),
            &s.rate_per_sec,
            "kind = \"file\" with pace = \"rate\"",
        );
    } else {
        p.forbidden(
            &key("rate_per_sec"),
            s.rate_per_sec.is_some(),
            "kind = \"synthetic\", or \"file\" with pace = \"rate\"",
        );
    }
    if let Some(rate) = s.rate_per_sec.filter(|r| !(r.is_finite() && *r > 0.0)) {
        p.push(key("rate_per_sec"), format!("must be > 0 (got {rate})"));
    }
    p.forbidden(
        &key("seed"),
        !synthetic && s.seed.is_some(),
        "kind = \"synthetic\"",
    );
    if !(0.0..=1.0).contains(&s.burst_probability) {
        p.push(
            key("burst_probability"),
            format!("must be in 0..=1 (got {})", s.burst_probability),
        );
    }
    if !(s.burst_multiplier.is_finite() && s.burst_multiplier >= 1.0) {
        p.push(
            key("burst_multiplier"),
            format!("must be >= 1 (got {})", s.burst_multiplier),
        );
    }
    p.at_least(&key("burst_secs"), s.burst_secs, 1);

    if http {
        p.required(&key("url"), &s.url, &kind);
        if let Some(url) = s
            .url
            .as_ref()
            .filter(|u| !(u.starts_with("http://") || u.starts_with("https://")))
        {
            p.push(
                key("url"),
                format!(
                    "must start with http:// or https:// (got {})",
                    scheme_of(url)
                ),
            );
        }
        for (name, value) in &s.headers {
            let token = !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
            if !token {
                p.push(key("headers"), format!("{name:?} is not a header name"));
            }
            if value.contains(['\r', '\n']) {
                p.push(
                    format!("{}.{name}", key("headers")),
                    "must not contain line breaks",
                );
            }
            if let Err(e) = check_env_refs(value) {
                p.push(format!("{}.{name}", key("headers")), e);
            }
        }
        for (field, value) in [
            ("connect_timeout_ms", s.connect_timeout_ms),
            ("idle_timeout_ms", s.idle_timeout_ms),
        ] {
            if let Some(v) = value {
                p.at_least(&key(field), v, 1);
            }
        }
    } else {
        p.forbidden(&key("url"), s.url.is_some(), "kind = \"http\"");
        p.forbidden(&key("format"), s.format.is_some(), "kind = \"http\"");
        p.forbidden(&key("headers"), !s.headers.is_empty(), "kind = \"http\"");
        p.forbidden(
            &key("connect_timeout_ms"),
            s.connect_timeout_ms.is_some(),
            "kind = \"http\"",
        );
        p.forbidden(
            &key("idle_timeout_ms"),
            s.idle_timeout_ms.is_some(),
            "kind = \"http\"",
        );
    }
    if http || command {
        if let Some(v) = s.reconnect_max_ms {
            p.at_least(&key("reconnect_max_ms"), v, 100);
        }
    } else {
        p.forbidden(
            &key("reconnect_max_ms"),
            s.reconnect_max_ms.is_some(),
            "kind = \"http\" or \"command\"",
        );
    }

    if file {
        p.required(&key("path"), &s.path, &kind);
        if s.path
            .as_ref()
            .is_some_and(|path| path.as_os_str().is_empty())
        {
            p.push(key("path"), "must not be empty");
        }
        let gz = s
            .path
            .as_ref()
            .is_some_and(|path| path.extension().is_some_and(|e| e == "gz"));
        if gz && s.follow == Some(true) {
            p.push(
                key("follow"),
                "a .gz file cannot be followed (it is compressed as a whole); set follow = false",
            );
        }
    } else {
        p.forbidden(&key("path"), s.path.is_some(), "kind = \"file\"");
        p.forbidden(&key("pace"), s.pace.is_some(), "kind = \"file\"");
        p.forbidden(&key("follow"), s.follow.is_some(), "kind = \"file\"");
    }
    let timestamps = "kind = \"file\" with pace = \"timestamps\"";
    if file && s.pace == Some(Pace::Timestamps) {
        if let Some(field) = &s.timestamp_field {
            p.field_path(&key("timestamp_field"), field);
        }
        if let Some(speed) = s.speed.filter(|v| !(v.is_finite() && *v > 0.0)) {
            p.push(key("speed"), format!("must be > 0 (got {speed})"));
        }
    } else {
        p.forbidden(
            &key("timestamp_field"),
            s.timestamp_field.is_some(),
            timestamps,
        );
        p.forbidden(&key("speed"), s.speed.is_some(), timestamps);
    }

    if command {
        p.required(&key("program"), &s.program, &kind);
        if s.program
            .as_ref()
            .is_some_and(|prog| prog.trim().is_empty())
        {
            p.push(key("program"), "must not be empty");
        }
    } else {
        p.forbidden(&key("program"), s.program.is_some(), "kind = \"command\"");
        p.forbidden(&key("args"), !s.args.is_empty(), "kind = \"command\"");
        p.forbidden(&key("restart"), s.restart.is_some(), "kind = \"command\"");
    }
}

/// Replaces `${NAME}` in `value` with what `lookup(NAME)` gives and `$$` with `$`; any other
/// `$` is kept as it is. An unset variable or an unclosed `${` is an error naming it.
pub fn interpolate_env(
    value: &str,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<String, String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('{') {
            let Some(end) = inner.find('}') else {
                return Err("has an unclosed ${ (write ${NAME}, or $$ for a literal $)".into());
            };
            let name = &inner[..end];
            let valid =
                !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !valid {
                return Err(format!(
                    "${{{name}}} is not a variable reference (letters, digits and _)"
                ));
            }
            match lookup(name) {
                Some(v) => out.push_str(&v),
                None => return Err(format!("environment variable {name} is not set")),
            }
            rest = &inner[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// Checks the `${NAME}` references of a header value (syntax only: the variables are read
/// when the source starts, so `check-config` does not need the secrets).
fn check_env_refs(value: &str) -> Result<(), String> {
    interpolate_env(value, |_| Some(String::new())).map(|_| ())
}

fn validate_feed(p: &mut Problems, i: usize, f: &FeedConfig, names: &mut BTreeSet<String>) {
    let key = |field: &str| format!("feeds[{i}].{field}");
    p.name(&key("name"), &f.name, names);
    let change_kinds = "kind = \"changes\" or \"oplog\"";
    match f.kind {
        FeedKind::Tailable => {
            p.required(&key("collection"), &f.collection, "kind = \"tailable\"");
            if let Some(c) = f
                .collection
                .as_ref()
                .filter(|c| !CAPPED_COLLECTIONS.contains(&c.as_str()))
            {
                p.push(
                    key("collection"),
                    format!(
                        "{c:?} is not a capped collection (allowed: {})",
                        list(&CAPPED_COLLECTIONS)
                    ),
                );
            }
            p.forbidden(&key("collections"), !f.collections.is_empty(), change_kinds);
            p.forbidden(&key("filter"), f.filter.is_some(), change_kinds);
        }
        FeedKind::Changes | FeedKind::Oplog => {
            p.forbidden(
                &key("collection"),
                f.collection.is_some(),
                "kind = \"tailable\" (use collections = [...])",
            );
            if f.collections.is_empty() {
                p.push(
                    key("collections"),
                    format!(
                        "required for kind = {:?} (e.g. [\"rollups\"])",
                        f.kind.as_str()
                    ),
                );
            }
            let mut seen = BTreeSet::new();
            for (j, c) in f.collections.iter().enumerate() {
                let ckey = format!("{}[{j}]", key("collections"));
                if c.is_empty() || c.contains(['$', '\0']) {
                    p.push(&ckey, format!("{c:?} is not a collection name"));
                } else if !seen.insert(c) {
                    p.push(&ckey, format!("{c:?} is listed twice"));
                }
            }
            if let Some(filter) = &f.filter {
                let mut ops = std::collections::HashSet::new();
                for (j, op) in filter.ops.iter().enumerate() {
                    if !ops.insert(op) {
                        p.push(
                            format!("{}.ops[{j}]", key("filter")),
                            format!("{:?} is listed twice", op.as_str()),
                        );
                    }
                }
                if filter.key_prefix.as_deref() == Some("") {
                    p.push(
                        format!("{}.key_prefix", key("filter")),
                        "must not be empty (leave it out to match every key)",
                    );
                }
            }
        }
    }
}

#[cfg(test)]
// `result_large_err`: `Jail::expect_with` closures must return `figment::Result`.
#[allow(clippy::unwrap_used, clippy::result_large_err)]
mod tests {
    use super::*;
    use figment::Jail;

    /// The annotated reference configuration shipped in the repository.
    const REFERENCE: &str = include_str!("../../config/tailrace.toml");

    /// Defaults + this TOML (no environment: safe outside a jail).
    fn with_toml(toml: &str) -> Result<Config, ConfigError> {
        Config::from_figment(
            Figment::from(Serialized::defaults(Config::default())).merge(Toml::string(toml)),
        )
    }

    /// The error message of loading defaults + this TOML.
    fn toml_err(toml: &str) -> String {
        match with_toml(toml) {
            Ok(config) => panic!("expected an error for {toml:?}, loaded {config:?}"),
            Err(e) => e.to_string(),
        }
    }

    /// The validation problems of `config`.
    fn problems(config: &Config) -> Vec<String> {
        match config.validate() {
            Ok(()) => Vec::new(),
            Err(ConfigError::Invalid { problems }) => problems,
            Err(other) => panic!("validate returned a non-validation error: {other}"),
        }
    }

    /// Asserts that one of `problems` is exactly `expected`.
    #[track_caller]
    fn assert_problem(problems: &[String], expected: &str) {
        assert!(
            problems.iter().any(|p| p == expected),
            "expected problem {expected:?}, got {problems:#?}"
        );
    }

    /// Loads with `path` inside a jail (whose environment the caller set up), expecting an error.
    fn load_err(path: Option<&str>) -> String {
        match Config::load(path.map(Path::new)) {
            Ok(config) => panic!("expected an error, loaded {config:?}"),
            Err(e) => e.to_string(),
        }
    }

    fn source(kind: SourceKind) -> SourceConfig {
        SourceConfig::new("s", kind)
    }

    fn config_with_source(source: SourceConfig) -> Config {
        Config {
            sources: vec![source],
            ..Config::default()
        }
    }

    fn config_with_feed(feed: FeedConfig) -> Config {
        Config {
            feeds: vec![feed],
            ..Config::default()
        }
    }

    #[test]
    fn defaults_validate() {
        let config = Config::default();
        assert_eq!(problems(&config), Vec::<String>::new());
        assert_eq!(config.sources.len(), 1, "{:?}", config.sources);
        assert_eq!(config.sources[0].name, "sample");
        assert_eq!(config.sources[0].rate_per_sec, Some(70.0));
        assert_eq!(config.sources[0].seed, None);
        let names: Vec<&str> = config.feeds.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["tail", "changes"]);
    }

    #[test]
    fn reference_file_equals_defaults() {
        let loaded = with_toml(REFERENCE).unwrap_or_else(|e| panic!("reference file: {e}"));
        assert_eq!(loaded, Config::default());
        // Without the defaults layer too: the file alone describes the defaults.
        let alone: Config = Figment::from(Toml::string(REFERENCE))
            .extract()
            .unwrap_or_else(|e| panic!("reference file alone: {e}"));
        assert_eq!(alone, Config::default());
    }

    #[test]
    fn reference_file_spells_out_every_key() {
        fn leaves(value: &Value, path: String, out: &mut BTreeSet<String>) {
            match value {
                Value::Dict(_, dict) if !dict.is_empty() => {
                    for (k, v) in dict {
                        let p = if path.is_empty() {
                            k.clone()
                        } else {
                            format!("{path}.{k}")
                        };
                        leaves(v, p, out);
                    }
                }
                Value::Array(_, items) if items.iter().any(|v| matches!(v, Value::Dict(..))) => {
                    for (i, v) in items.iter().enumerate() {
                        leaves(v, format!("{path}[{i}]"), out);
                    }
                }
                _ => {
                    out.insert(path);
                }
            }
        }
        let mut defaults = BTreeSet::new();
        let value: Value = Figment::from(Serialized::defaults(Config::default()))
            .extract()
            .unwrap();
        leaves(&value, String::new(), &mut defaults);
        let mut reference = BTreeSet::new();
        let value: Value = Figment::from(Toml::string(REFERENCE)).extract().unwrap();
        leaves(&value, String::new(), &mut reference);
        let missing: Vec<_> = defaults.difference(&reference).collect();
        assert!(
            missing.is_empty(),
            "keys missing from config/tailrace.toml: {missing:?}"
        );
        assert!(defaults.len() > 30, "suspiciously few keys: {defaults:?}");
    }

    #[test]
    fn reference_file_loads_from_disk() {
        Jail::expect_with(|jail| {
            jail.clear_env();
            jail.create_file("tailrace.toml", REFERENCE)?;
            let config = Config::load(Some(Path::new("tailrace.toml")));
            assert!(
                matches!(&config, Ok(c) if *c == Config::default()),
                "{config:?}"
            );
            Ok(())
        });
    }

    #[test]
    fn env_overrides_defaults() {
        Jail::expect_with(|jail| {
            jail.clear_env();
            jail.set_env("TAILRACE_STORE__ENGINE", "mongodb");
            jail.set_env("TAILRACE_HTTP__LISTEN", "127.0.0.1:0");
            jail.set_env("TAILRACE_STATS__PERIOD", "30");
            jail.set_env("TAILRACE_INGEST__ROLLUP_FIELDS", r#"["lang"]"#);
            let config = Config::load(None).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(config.store.engine, StoreEngine::Mongodb);
            assert_eq!(config.http.listen, SocketAddr::from(([127, 0, 0, 1], 0)));
            assert_eq!(config.stats.period, 30);
            assert_eq!(config.ingest.rollup_fields, ["lang"]);
            // Untouched keys keep their defaults.
            assert_eq!(config.store.database, "tailrace");
            Ok(())
        });
    }

    #[test]
    fn env_overrides_file_which_overrides_defaults() {
        Jail::expect_with(|jail| {
            jail.clear_env();
            jail.create_file(
                "tailrace.toml",
                "[stats]\nperiod = 5\nk = 3.5\n[store]\ndurability = \"acknowledged\"\n",
            )?;
            jail.set_env("TAILRACE_STATS__PERIOD", "7");
            let config =
                Config::load(Some(Path::new("tailrace.toml"))).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(config.stats.period, 7, "env must win over the file");
            assert_eq!(config.stats.k, 3.5, "file must win over defaults");
            assert_eq!(config.store.durability, Durability::Acknowledged);
            assert_eq!(config.stats.topk, 10, "defaults fill the rest");
            Ok(())
        });
    }

    #[test]
    fn env_values_that_look_like_other_types() {
        Jail::expect_with(|jail| {
            jail.clear_env();
            let uri = "mongodb://u:p@h1:27017,h2:27017/?replicaSet=rs0&w=majority";
            jail.set_env("TAILRACE_STORE__URI", uri);
            jail.set_env("TAILRACE_STORE__PATH", "/var/lib/tailrace");
            let config = Config::load(None).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(config.store.uri, uri);
            assert_eq!(config.store.path, Path::new("/var/lib/tailrace"));

            jail.set_env("TAILRACE_STORE__DATABASE", "123");
            let message = load_err(None);
            assert_eq!(
                message,
                "store.database: expected a string, found integer 123 (quote it to keep it a \
                 string: TAILRACE_STORE__DATABASE='\"...\"') (from env TAILRACE_STORE__DATABASE)"
            );
            jail.set_env("TAILRACE_STORE__DATABASE", "\"123\"");
            let config = Config::load(None).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(config.store.database, "123");
            Ok(())
        });
    }

    #[test]
    fn cli_variables_are_not_config_keys() {
        Jail::expect_with(|jail| {
            jail.clear_env();
            jail.set_env("TAILRACE_CONFIG", "/nonexistent/tailrace.toml");
            jail.set_env("TAILRACE_LOG", "debug");
            // Keys under [log] are still reachable.
            jail.set_env("TAILRACE_LOG__STATUS_INTERVAL_SECS", "0");
            let config = Config::load(None).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(config.log.status_interval_secs, 0);
            Ok(())
        });
    }

    #[test]
    fn unknown_key_in_file_names_dotted_key_and_file() {
        Jail::expect_with(|jail| {
            jail.clear_env();
            jail.create_file("tailrace.toml", "[store]\nenigne = \"mongodb\"\n")?;
            let message = load_err(Some("tailrace.toml"));
            assert_eq!(
                message,
                "unknown key store.enigne (allowed: engine, path, uri, database, durability, \
                 oplog_max_entries, events, dead_letters) (from file tailrace.toml)"
            );
            Ok(())
        });
    }

    #[test]
    fn unknown_key_in_array_element_names_index() {
        let message = toml_err("[[sources]]\nname = \"a\"\nkind = \"stdin\"\nurll = \"x\"\n");
        assert!(
            message.starts_with("unknown key sources[0].urll (allowed: name, kind,"),
            "{message}"
        );
        let message = toml_err("[store.dead_letters]\nindexes = [\"id\"]\n");
        assert!(
            message.starts_with("unknown key store.dead_letters.indexes "),
            "{message}"
        );
    }

    #[test]
    fn unknown_env_var_is_named() {
        Jail::expect_with(|jail| {
            jail.clear_env();
            jail.set_env("TAILRACE_STORE__ENIGNE", "mongodb");
            let message = load_err(None);
            assert!(message.contains("unknown key store.enigne"), "{message}");
            assert!(
                message.ends_with("(from env TAILRACE_STORE__ENIGNE)"),
                "{message}"
            );

            jail.clear_env();
            jail.set_env("TAILRACE_BOGUS", "1");
            let message = load_err(None);
            assert_eq!(
                message,
                "unknown key bogus (allowed: http, log, store, ingest, stats, sources, feeds) \
                 (from env TAILRACE_BOGUS)"
            );

            jail.clear_env();
            jail.set_env("TAILRACE_STORE_ENGINE", "mongodb");
            let message = load_err(None);
            assert!(
                message.contains("did you mean TAILRACE_STORE__ENGINE?"),
                "{message}"
            );
            assert!(
                message.contains("(from env TAILRACE_STORE_ENGINE)"),
                "{message}"
            );
            Ok(())
        });
    }

    #[test]
    fn bad_enum_value_lists_allowed_values() {
        Jail::expect_with(|jail| {
            jail.clear_env();
            jail.create_file("tailrace.toml", "[store]\ndurability = \"fast\"\n")?;
            let message = load_err(Some("tailrace.toml"));
            assert_eq!(
                message,
                "store.durability: \"fast\" is not one of unacknowledged, acknowledged, journaled, \
                 majority (from file tailrace.toml)"
            );

            jail.set_env("TAILRACE_STORE__ENGINE", "postgres");
            let message = load_err(None);
            assert_eq!(
                message,
                "store.engine: \"postgres\" is not one of embedded, mongodb \
                 (from env TAILRACE_STORE__ENGINE)"
            );
            Ok(())
        });
        let message = toml_err(
            "[[feeds]]\nname = \"a\"\nkind = \"changes\"\nfilter = { ops = [\"upsert\"] }\n",
        );
        assert!(
            message.starts_with(
                "feeds[0].filter.ops[0]: \"upsert\" is not one of insert, update, replace, delete"
            ),
            "{message}"
        );
    }

    #[test]
    fn missing_file_names_the_path() {
        Jail::expect_with(|jail| {
            jail.clear_env();
            let result = Config::load(Some(Path::new("conf/nope.toml")));
            match result {
                Err(ConfigError::MissingFile { ref path }) => {
                    assert_eq!(path, Path::new("conf/nope.toml"))
                }
                other => panic!("expected MissingFile, got {other:?}"),
            }
            let message = load_err(Some("conf/nope.toml"));
            assert!(message.contains("conf/nope.toml"), "{message}");
            Ok(())
        });
    }

    #[test]
    fn syntax_error_is_one_line_naming_the_file() {
        Jail::expect_with(|jail| {
            jail.clear_env();
            jail.create_file("broken.toml", "[store\nengine = 1\n")?;
            let message = load_err(Some("broken.toml"));
            assert!(
                message.starts_with("file broken.toml: TOML parse error at line 1"),
                "{message}"
            );
            assert!(!message.contains('\n'), "{message:?}");
            Ok(())
        });
    }

    #[test]
    fn wrong_types_name_key_found_and_expected() {
        let message = toml_err("[stats]\nperiod = \"x\"\n");
        assert_eq!(
            message,
            "stats.period: expected a non-negative integer, found string \"x\" (from TOML source string)"
        );
        let message = toml_err("[ingest]\nbatch_max_events = -1\n");
        assert!(
            message.starts_with("ingest.batch_max_events: integer -1 is out of range"),
            "{message}"
        );
        let message = toml_err("[http]\nlisten = \"localhost\"\n");
        assert!(
            message.starts_with(
                "http.listen: \"localhost\" is not valid: invalid socket address syntax"
            ),
            "{message}"
        );
        let message = toml_err("[[sources]]\nkind = \"stdin\"\n");
        assert!(
            message.starts_with("sources[0].name: missing (required)"),
            "{message}"
        );
    }

    #[test]
    fn env_array_elements_cannot_be_set_one_by_one() {
        Jail::expect_with(|jail| {
            jail.clear_env();
            jail.set_env("TAILRACE_SOURCES__0__NAME", "x");
            let message = load_err(None);
            assert!(
                message.starts_with("sources: expected an array, found a table"),
                "{message}"
            );
            assert!(
                message.contains("set TAILRACE_SOURCES to the whole array"),
                "{message}"
            );

            jail.clear_env();
            jail.set_env(
                "TAILRACE_SOURCES",
                r#"[{ name = "x", kind = "stdin", rate_per_sec = 0 }]"#,
            );
            let message = load_err(None);
            assert!(
                message.contains(
                    "sources[0].rate_per_sec: must be > 0 (got 0) (from env TAILRACE_SOURCES)"
                ),
                "{message}"
            );
            Ok(())
        });
    }

    #[test]
    fn validation_collects_every_problem() {
        let mut config = Config::default();
        config.stats.period = 1;
        config.stats.k = 0.0;
        config.ingest.batch_max_events = 0;
        config.store.events.max_bytes = 100;
        config.sources[0].rate_per_sec = Some(-1.0);
        config.feeds[1].name = "tail".into();
        let found = problems(&config);
        for expected in [
            "stats.period: must be >= 2 (got 1)",
            "stats.k: must be > 0 (got 0)",
            "ingest.batch_max_events: must be in 1..=10000 (got 0)",
            "store.events.max_bytes: must be >= 4096 (got 100)",
            "ingest.max_event_bytes: must be <= store.events.max_bytes = 100 (got 65536): a larger event could never be stored",
            "sources[0].rate_per_sec: must be > 0 (got -1)",
            "feeds[1].name: \"tail\" is used twice (names must be unique)",
        ] {
            assert_problem(&found, expected);
        }
        assert_eq!(found.len(), 7, "{found:#?}");
        let message = config.validate().map_err(|e| e.to_string()).unwrap_err();
        assert_eq!(message, found.join("; "));
        assert!(!message.contains('\n'), "{message:?}");
    }

    #[test]
    fn validation_problems_say_where_the_value_came_from() {
        Jail::expect_with(|jail| {
            jail.clear_env();
            jail.create_file(
                "tailrace.toml",
                "[[sources]]\nname = \"web\"\nkind = \"http\"\n",
            )?;
            jail.set_env("TAILRACE_STATS__PERIOD", "1");
            let message = load_err(Some("tailrace.toml"));
            assert_eq!(
                message,
                "stats.period: must be >= 2 (got 1) (from env TAILRACE_STATS__PERIOD); \
                 sources[0].url: required for kind = \"http\" (from file tailrace.toml)"
            );
            Ok(())
        });
    }

    #[test]
    fn header_values_interpolate_environment_variables() {
        let env = |name: &str| (name == "TOKEN").then(|| "s3cret".to_owned());
        assert_eq!(
            interpolate_env("Bearer ${TOKEN}", env).as_deref(),
            Ok("Bearer s3cret")
        );
        assert_eq!(interpolate_env("a$$b $x", env).as_deref(), Ok("a$b $x"));
        assert_eq!(
            interpolate_env("${MISSING}", env),
            Err("environment variable MISSING is not set".to_owned())
        );
        assert!(
            interpolate_env("${TOKEN", env)
                .unwrap_err()
                .contains("unclosed")
        );
        assert!(
            interpolate_env("${A-B}", env)
                .unwrap_err()
                .contains("not a variable")
        );
    }

    #[test]
    fn source_kinds_get_their_defaults_and_only_their_keys() {
        Jail::expect_with(|jail| {
            jail.clear_env();
            jail.create_file(
                "t.toml",
                "[[sources]]\nname = \"w\"\nkind = \"http\"\nurl = \"http://127.0.0.1:1/\"\n\
                 [[sources]]\nname = \"f\"\nkind = \"file\"\npath = \"e.ndjson\"\npace = \"timestamps\"\n\
                 [[sources]]\nname = \"c\"\nkind = \"command\"\nprogram = \"x\"\n",
            )?;
            let c = Config::load(Some(Path::new("t.toml"))).unwrap_or_else(|e| panic!("{e}"));
            let (w, f, cmd) = (&c.sources[0], &c.sources[1], &c.sources[2]);
            assert_eq!(w.format, Some(HttpFormat::Ndjson));
            assert_eq!(w.connect_timeout_ms, Some(DEFAULT_CONNECT_TIMEOUT_MS));
            assert_eq!(w.idle_timeout_ms, Some(DEFAULT_IDLE_TIMEOUT_MS));
            assert_eq!(w.reconnect_max_ms, Some(DEFAULT_RECONNECT_MAX_MS));
            assert_eq!(f.timestamp_field.as_deref(), Some(DEFAULT_TIMESTAMP_FIELD));
            assert_eq!((f.speed, f.follow), (Some(1.0), Some(false)));
            assert_eq!(cmd.restart, Some(true));
            Ok(())
        });
        let mut s = source(SourceKind::Stdin);
        s.follow = Some(true);
        s.speed = Some(2.0);
        s.restart = Some(false);
        s.idle_timeout_ms = Some(5);
        let p = problems(&config_with_source(s));
        assert_problem(&p, "sources[0].follow: only for kind = \"file\"");
        assert_problem(
            &p,
            "sources[0].speed: only for kind = \"file\" with pace = \"timestamps\"",
        );
        assert_problem(&p, "sources[0].restart: only for kind = \"command\"");
        assert_problem(&p, "sources[0].idle_timeout_ms: only for kind = \"http\"");
        let mut s = source(SourceKind::File);
        s.path = Some("e.ndjson.gz".into());
        s.follow = Some(true);
        let p = problems(&config_with_source(s));
        assert!(
            p.iter()
                .any(|m| m.starts_with("sources[0].follow: a .gz file")),
            "{p:?}"
        );
        let mut s = source(SourceKind::Http);
        s.url = Some("http://x/".into());
        s.headers
            .insert("Authorization".into(), "Bearer ${TOKEN".into());
        let p = problems(&config_with_source(s));
        assert!(
            p.iter()
                .any(|m| m.starts_with("sources[0].headers.Authorization: has an unclosed ${")),
            "{p:?}"
        );
    }

    #[test]
    fn limits() {
        let mut config = Config::default();
        config.store.oplog_max_entries = 999;
        config.store.events.max_docs = 0;
        config.store.dead_letters.max_bytes = 4095;
        config.ingest.batch_max_events = 10_001;
        config.ingest.queue_capacity = 10_000;
        config.ingest.max_event_bytes = 63;
        config.stats.topk = 0;
        config.stats.k = f64::NAN;
        config.stats.value_field = "user..id".into();
        config.store.events.indexes = vec!["id".into(), "id".into()];
        let found = problems(&config);
        assert_problem(&found, "store.oplog_max_entries: must be >= 1000 (got 999)");
        assert_problem(&found, "store.events.max_docs: must be >= 1 (got 0)");
        assert_problem(
            &found,
            "store.dead_letters.max_bytes: must be >= 4096 (got 4095)",
        );
        assert_problem(
            &found,
            "ingest.batch_max_events: must be in 1..=10000 (got 10001)",
        );
        assert_problem(
            &found,
            "ingest.queue_capacity: must be >= ingest.batch_max_events = 10001 (got 10000)",
        );
        assert_problem(&found, "ingest.max_event_bytes: must be >= 64 (got 63)");
        assert_problem(&found, "stats.topk: must be >= 1 (got 0)");
        assert_problem(&found, "stats.k: must be > 0 (got NaN)");
        assert_problem(
            &found,
            "stats.value_field: \"user..id\" is not a field path (dot-separated names, e.g. \"user.id\")",
        );
        assert_problem(&found, "store.events.indexes[1]: \"id\" is listed twice");
        assert_eq!(found.len(), 10, "{found:#?}");
    }

    #[test]
    fn mongodb_engine_needs_a_mongodb_uri() {
        let mut config = Config::default();
        config.store.engine = StoreEngine::Mongodb;
        config.store.uri = String::new();
        assert_eq!(
            problems(&config),
            [
                "store.uri: required for engine = \"mongodb\" (e.g. \"mongodb://localhost:27017/?replicaSet=rs0\")"
            ]
        );
        config.store.uri = "postgres://u:secret@h/db".into();
        let found = problems(&config);
        assert_eq!(
            found,
            ["store.uri: must start with mongodb:// or mongodb+srv:// (got scheme \"postgres\")"]
        );
        // The embedded engine ignores the uri.
        config.store.engine = StoreEngine::Embedded;
        assert_eq!(problems(&config), Vec::<String>::new());
    }

    #[test]
    fn source_required_fields_per_kind() {
        let cases = [
            (
                SourceKind::Synthetic,
                "sources[0].rate_per_sec: required for kind = \"synthetic\"",
            ),
            (
                SourceKind::Http,
                "sources[0].url: required for kind = \"http\"",
            ),
            (
                SourceKind::File,
                "sources[0].path: required for kind = \"file\"",
            ),
            (
                SourceKind::Command,
                "sources[0].program: required for kind = \"command\"",
            ),
        ];
        for (kind, expected) in cases {
            assert_eq!(
                problems(&config_with_source(source(kind))),
                [expected],
                "kind {kind}"
            );
        }
        assert_eq!(
            problems(&config_with_source(source(SourceKind::Stdin))),
            Vec::<String>::new()
        );
        let rated = SourceConfig {
            path: Some("events.ndjson".into()),
            pace: Some(Pace::Rate),
            ..source(SourceKind::File)
        };
        assert_eq!(
            problems(&config_with_source(rated)),
            ["sources[0].rate_per_sec: required for kind = \"file\" with pace = \"rate\""]
        );
        // And in a second source, from a file.
        let message = toml_err(
            "[[sources]]\nname = \"a\"\nkind = \"stdin\"\n[[sources]]\nname = \"b\"\nkind = \"http\"\n",
        );
        assert_eq!(
            message,
            "sources[1].url: required for kind = \"http\" (from TOML source string)"
        );
    }

    #[test]
    fn source_fields_of_other_kinds_are_rejected() {
        let synthetic = SourceConfig {
            rate_per_sec: Some(1.0),
            url: Some("http://x".into()),
            format: Some(HttpFormat::Sse),
            headers: BTreeMap::from([("a".to_owned(), "b".to_owned())]),
            path: Some("x".into()),
            pace: Some(Pace::Fast),
            program: Some("x".into()),
            args: vec!["-v".into()],
            ..source(SourceKind::Synthetic)
        };
        assert_eq!(
            problems(&config_with_source(synthetic)),
            [
                "sources[0].url: only for kind = \"http\"",
                "sources[0].format: only for kind = \"http\"",
                "sources[0].headers: only for kind = \"http\"",
                "sources[0].path: only for kind = \"file\"",
                "sources[0].pace: only for kind = \"file\"",
                "sources[0].program: only for kind = \"command\"",
                "sources[0].args: only for kind = \"command\"",
            ]
        );
        let stdin = SourceConfig {
            rate_per_sec: Some(5.0),
            seed: Some(1),
            ..source(SourceKind::Stdin)
        };
        assert_eq!(
            problems(&config_with_source(stdin)),
            [
                "sources[0].rate_per_sec: only for kind = \"synthetic\", or \"file\" with pace = \"rate\"",
                "sources[0].seed: only for kind = \"synthetic\"",
            ]
        );
    }

    #[test]
    fn source_values_are_checked() {
        let http = SourceConfig {
            url: Some("ftp://u:secret@x".into()),
            headers: BTreeMap::from([
                ("bad name".to_owned(), "v".to_owned()),
                ("x-ok".to_owned(), "a\r\nInjected: 1".to_owned()),
            ]),
            burst_probability: 1.5,
            burst_multiplier: 0.5,
            burst_secs: 0,
            ..source(SourceKind::Http)
        };
        let found = problems(&config_with_source(http));
        assert_eq!(
            found,
            [
                "sources[0].burst_probability: must be in 0..=1 (got 1.5)",
                "sources[0].burst_multiplier: must be >= 1 (got 0.5)",
                "sources[0].burst_secs: must be >= 1 (got 0)",
                "sources[0].url: must start with http:// or https:// (got scheme \"ftp\")",
                "sources[0].headers: \"bad name\" is not a header name",
                "sources[0].headers.x-ok: must not contain line breaks",
            ]
        );
        assert!(
            !found.iter().any(|p| p.contains("secret")),
            "a password leaked: {found:?}"
        );
    }

    #[test]
    fn names_are_checked_and_unique() {
        let mut config = Config::default();
        config
            .sources
            .push(SourceConfig::new("Bad Name", SourceKind::Stdin));
        config
            .sources
            .push(SourceConfig::new("sample", SourceKind::Stdin));
        config.feeds.push(FeedConfig {
            collection: Some("events".into()),
            ..FeedConfig::new("", FeedKind::Tailable)
        });
        assert_eq!(
            problems(&config),
            [
                "sources[1].name: \"Bad Name\" must match [a-z0-9_-]+",
                "sources[2].name: \"sample\" is used twice (names must be unique)",
                "feeds[2].name: \"\" must match [a-z0-9_-]+",
            ]
        );
    }

    #[test]
    fn feed_fields_per_kind() {
        let tailable = FeedConfig {
            collection: Some("rollups".into()),
            collections: vec!["x".into()],
            filter: Some(ChangeFilterConfig {
                ops: vec![],
                key_prefix: None,
            }),
            ..FeedConfig::new("t", FeedKind::Tailable)
        };
        assert_eq!(
            problems(&config_with_feed(tailable)),
            [
                "feeds[0].collection: \"rollups\" is not a capped collection (allowed: events, dead_letters)",
                "feeds[0].collections: only for kind = \"changes\" or \"oplog\"",
                "feeds[0].filter: only for kind = \"changes\" or \"oplog\"",
            ]
        );
        assert_eq!(
            problems(&config_with_feed(FeedConfig::new("t", FeedKind::Tailable))),
            ["feeds[0].collection: required for kind = \"tailable\""]
        );
        let oplog = FeedConfig {
            collection: Some("events".into()),
            filter: Some(ChangeFilterConfig {
                ops: vec![ChangeOp::Delete, ChangeOp::Delete],
                key_prefix: Some(String::new()),
            }),
            ..FeedConfig::new("o", FeedKind::Oplog)
        };
        assert_eq!(
            problems(&config_with_feed(oplog)),
            [
                "feeds[0].collection: only for kind = \"tailable\" (use collections = [...])",
                "feeds[0].collections: required for kind = \"oplog\" (e.g. [\"rollups\"])",
                "feeds[0].filter.ops[1]: \"delete\" is listed twice",
                "feeds[0].filter.key_prefix: must not be empty (leave it out to match every key)",
            ]
        );
    }

    #[test]
    fn kind_defaults_are_filled_in_when_loading() {
        let config = with_toml(
            r#"
            [[sources]]
            name = "web"
            kind = "http"
            url = "https://example.com/stream"
            [[sources]]
            name = "replay"
            kind = "file"
            path = "events.ndjson"
            [[feeds]]
            name = "t"
            kind = "tailable"
            [[feeds]]
            name = "o"
            kind = "oplog"
            "#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        // Any [[sources]] / [[feeds]] replaces the default lists.
        assert_eq!(config.sources.len(), 2, "{:?}", config.sources);
        assert_eq!(config.sources[0].format, Some(HttpFormat::Ndjson));
        assert_eq!(config.sources[1].pace, Some(Pace::Fast));
        assert_eq!(config.feeds.len(), 2, "{:?}", config.feeds);
        assert_eq!(config.feeds[0].collection.as_deref(), Some("events"));
        assert_eq!(config.feeds[1].collections, ["rollups"]);
        assert_eq!(config.feeds[1].filter, None);
    }

    #[test]
    fn redacted_hides_secrets_only() {
        let mut config = Config::default();
        config.store.uri =
            "mongodb://admin:s3cr%40t@db1:27017,db2:27017/?replicaSet=rs0&w=majority".into();
        config.sources.push(SourceConfig {
            url: Some("https://bot:tok@example.com/stream?user=a@b".into()),
            headers: BTreeMap::from([("authorization".to_owned(), "Bearer abc".to_owned())]),
            ..SourceConfig::new("web", SourceKind::Http)
        });
        let redacted = config.redacted();
        assert_eq!(
            redacted.store.uri,
            "mongodb://admin:***@db1:27017,db2:27017/?replicaSet=rs0&w=majority"
        );
        assert_eq!(
            redacted.sources[1].url.as_deref(),
            Some("https://bot:***@example.com/stream?user=a@b")
        );
        assert_eq!(redacted.sources[1].headers["authorization"], "***");
        let printed = serde_json::to_string(&redacted).unwrap();
        for secret in ["s3cr", "tok@", "Bearer"] {
            assert!(!printed.contains(secret), "{secret:?} in {printed}");
        }
        // The original is untouched, and everything else is the same.
        assert_eq!(config.sources[1].headers["authorization"], "Bearer abc");
        let mut restored = redacted.clone();
        restored.store.uri = config.store.uri.clone();
        restored.sources[1] = config.sources[1].clone();
        assert_eq!(restored, config);
    }

    #[test]
    fn redact_url_leaves_urls_without_password_alone() {
        for url in [
            "mongodb://localhost:27017/?replicaSet=rs0",
            "mongodb://user@host/db",
            "mongodb://host/db?authSource=a@b",
            "not a url",
        ] {
            assert_eq!(redact_url(url), url);
        }
        assert_eq!(
            redact_url("mongodb+srv://u:p@cluster/x"),
            "mongodb+srv://u:***@cluster/x"
        );
    }

    #[test]
    fn every_load_error_is_one_line() {
        let inputs = [
            "[store]\nenigne = 1\n",
            "[store]\ndurability = \"fast\"\n",
            "[stats]\nperiod = [1, 2]\n",
            "[http]\nlisten = 1\n",
            "sources = 3\n",
            "[[sources]]\nname = \"a\"\n",
            "x = \n",
            "[ingest]\nrollup_fields = \"lang\"\n",
            "[[feeds]]\nname = \"a\"\nkind = \"tailable\"\nfilter = { ops = [\"insert\"], extra = 1 }\n",
        ];
        for input in inputs {
            let message = toml_err(input);
            assert!(
                !message.contains('\n'),
                "{input:?} gave a multi-line message: {message:?}"
            );
            assert!(!message.is_empty(), "{input:?} gave an empty message");
        }
    }

    #[test]
    fn serializes_and_deserializes_back() {
        let config = Config::default();
        let json = serde_json::to_string(&config).unwrap();
        let back: Config = serde_json::from_str(&json).unwrap();
        assert_eq!(back, config);
        assert!(json.contains("\"engine\":\"embedded\""), "{json}");
    }
}
