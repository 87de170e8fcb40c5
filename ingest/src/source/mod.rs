//! Sources: where events come from.
//!
//! [`Source`] is the plug-in point. A source turns some stream (a generator, an HTTP
//! response, a file, a child process) into a pull-based stream of [`Raw`] records; the
//! ingester pulls it through a bounded channel, so a source that is faster than the store
//! waits (backpressure by construction). A record that cannot be an event is still a value
//! ([`Raw::Invalid`]): the ingester keeps it as a dead letter with its reason; it never stops
//! the stream.
//!
//! **A source kind is one file**: the module holds the kind's settings (its `[[sources]]`
//! keys, their defaults, unknown keys refused), its rules ([`SourceSettings::validate`]), how
//! it is built ([`SourceSettings::build`]) and the source itself. Adding a kind = one new
//! file, one variant of [`SourceKind`], and its arm in the two accessors below (the compiler
//! points at them). A user's own source is any type implementing [`Source`] (see
//! `examples/custom_source.rs`).
//!
//! Layout: [`synthetic`], [`http`], [`websocket`], [`file`], [`stdin`], [`command`]; the
//! byte-stream sources share [`framing`] (bounded NDJSON lines), the http source's SSE mode
//! uses [`sse`], and the sources that resume from a cursor in their events (websocket, http
//! NDJSON) use [`resume`]. [`realistic`] is the long-tail generator behind the synthetic
//! source's realistic vocabulary and the benches' default dataset.

pub mod command;
pub mod file;
pub mod framing;
pub mod http;
pub mod realistic;
pub mod resume;
pub mod sse;
pub mod stdin;
pub mod synthetic;
pub mod websocket;

use futures::stream::{BoxStream, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::config::entries::{self, Entry};
use crate::config::problems::Problems;
use crate::geo::GeoConfig;
pub use crate::telemetry::RejectReason;

/// The `User-Agent` of every outgoing request, unless a source's `headers` set one: services
/// such as Wikimedia and GitHub refuse requests without one.
pub const USER_AGENT: &str = concat!(
    "tailrace/",
    env!("CARGO_PKG_VERSION"),
    " (+https://github.com/tailrace/tailrace)"
);

/// One record as a source hands it over.
#[derive(Debug, Clone, PartialEq)]
pub enum Raw {
    /// An already-parsed JSON value (validated by the ingester: it must be an object).
    Json(Value),
    /// Bytes that should hold one JSON document (parsed and validated by the ingester).
    Bytes(Vec<u8>),
    /// Something the source already knows is bad (a line over the size limit, a truncated
    /// last line); kept as a dead letter with `reason`.
    Invalid {
        /// The offending bytes (possibly truncated).
        bytes: Vec<u8>,
        /// Why (the `reason` metric label).
        reason: RejectReason,
    },
}

/// A record with where the source stood right after it.
#[derive(Debug, Clone, PartialEq)]
pub struct Positioned {
    /// The record.
    pub raw: Raw,
    /// The source's position right after this record (a file offset, an SSE event id, a
    /// stream cursor), if the source can resume from it. Stored with the event it produced.
    pub position: Option<Value>,
}

impl From<Raw> for Positioned {
    fn from(raw: Raw) -> Self {
        Positioned {
            raw,
            position: None,
        }
    }
}

/// A stream of events with a name.
///
/// Contract: `records` (or `positioned`) is called once. The stream yields records in order
/// and ends when the source is exhausted (a file, stdin) — the pipeline then keeps running
/// the other sources — or never (a generator, a live stream). Transient failures (a dropped
/// connection) are the source's to handle (reconnect with backoff) and to log; they do not end
/// the stream. The stream is dropped on shutdown, so it must not need an explicit stop.
///
/// **Resumable sources** (a file, an SSE stream with event ids, a WebSocket or an NDJSON http
/// stream with a cursor) also implement [`Source::positioned`], giving with each record where
/// the source stood right after it, and [`Source::resume`]. The ingester stores a record's
/// position in the same document as the event it became, so it is committed with it; before a
/// restarted pipeline starts a source, it calls `resume` with the position stored with that
/// source's newest record: the source continues exactly after it, and nothing is read twice or
/// skipped.
pub trait Source: Send + 'static {
    /// The source's name: the `source` label of metrics, stored with each event.
    fn name(&self) -> &str;

    /// The kind, for logs (`synthetic`, `http`, ... or a custom name).
    fn kind(&self) -> &str;

    /// The records.
    fn records(self: Box<Self>) -> BoxStream<'static, Raw>;

    /// The records with their positions; by default none (a source that cannot resume).
    fn positioned(self: Box<Self>) -> BoxStream<'static, Positioned> {
        self.records().map(Positioned::from).boxed()
    }

    /// Called once, before the records are read, with the position stored with this
    /// source's newest record in the store. A source that cannot use it ignores it (the
    /// default); one that can, continues right after it.
    fn resume(&mut self, position: &Value) {
        let _ = position;
    }

    /// Where its events come from ([`crate::geo`]): the rules a source plugged in with
    /// `Pipeline::build` places its events by. A configured `[[sources]]` entry's own `geo`
    /// (or its stream's preset) takes precedence. `None`, the default, places none.
    fn geo(&self) -> Option<crate::geo::GeoConfig> {
        None
    }
}

/// What every source kind's settings provide.
pub trait SourceSettings {
    /// Checks what serde cannot (ranges, combinations); problems are keyed under `at`
    /// (`sources[2]`), e.g. `sources[2].url`.
    fn validate(&self, at: &str, p: &mut Problems);

    /// Builds the source.
    fn build(&self, name: &str, ctx: &BuildContext) -> Result<Box<dyn Source>, SourceError>;

    /// A few words for the startup block, after the kind (`70/s`, a URL); empty for none.
    fn describe(&self) -> String {
        String::new()
    }

    /// Replaces secrets (header values, URL passwords) with `***`, for printing.
    fn redact(&mut self) {}
}

/// What building a source may need beyond its own settings.
#[derive(Clone, Debug)]
pub struct BuildContext {
    /// Position in the `sources` list (for error messages).
    pub index: usize,
    /// The longest line (NDJSON) or event (SSE) a byte source keeps whole: the ingester's
    /// `max_event_bytes`, or the 4 KiB a dead letter keeps when that is smaller. Longer ones
    /// are `too_large` at the source, without ever being held whole in memory.
    pub max_line: usize,
}

/// One `[[sources]]` table: a name, the settings of its kind, and the keys every kind takes.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceConfig {
    /// Unique name, `[a-z0-9_-]+`; labels metrics and is stored with each event.
    pub name: String,
    /// What produces the events, with the settings of that kind.
    pub kind: SourceKind,
    /// Where its events' places are (`geo = { point = "coordinates", ... }`); `None` when the
    /// table has no `geo`: the preset of a stream tailrace knows, if any
    /// ([`crate::geo::GeoConfig::preset`]). `geo = {}` places nothing.
    pub geo: Option<GeoConfig>,
}

/// The keys of a `[[sources]]` table that are not its kind's: read beside the kind's own,
/// whatever the kind ([`Entry::Shared`]).
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceShared {
    /// [`SourceConfig::geo`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub geo: Option<GeoConfig>,
}

/// The source kinds, each with its settings (`kind = "..."` in `[[sources]]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceKind {
    /// Generated tweet-like events at `rate_per_sec`, with bursts.
    Synthetic(synthetic::SyntheticConfig),
    /// A streaming HTTP response (NDJSON or server-sent events).
    Http(http::HttpConfig),
    /// A file of newline-delimited JSON, replayed.
    File(file::FileConfig),
    /// Newline-delimited JSON on standard input.
    Stdin(stdin::StdinConfig),
    /// Newline-delimited JSON on the standard output of a program.
    Command(command::CommandConfig),
    /// JSON text frames of a WebSocket, resumable from a cursor.
    Websocket(websocket::WebSocketConfig),
}

impl SourceKind {
    /// The settings, behind the trait every kind implements.
    pub fn settings(&self) -> &dyn SourceSettings {
        match self {
            SourceKind::Synthetic(c) => c,
            SourceKind::Http(c) => c,
            SourceKind::File(c) => c,
            SourceKind::Stdin(c) => c,
            SourceKind::Command(c) => c,
            SourceKind::Websocket(c) => c,
        }
    }

    fn settings_mut(&mut self) -> &mut dyn SourceSettings {
        match self {
            SourceKind::Synthetic(c) => c,
            SourceKind::Http(c) => c,
            SourceKind::File(c) => c,
            SourceKind::Stdin(c) => c,
            SourceKind::Command(c) => c,
            SourceKind::Websocket(c) => c,
        }
    }

    /// The kind's name, as written in `kind = "..."`.
    pub fn name(&self) -> String {
        match serde_json::to_value(self) {
            Ok(Value::Object(o)) => o.keys().next().cloned().unwrap_or_default(),
            _ => String::new(),
        }
    }
}

impl SourceConfig {
    /// The default source: the synthetic stream at 70 events/s.
    pub fn default_sample() -> Self {
        SourceConfig {
            name: "sample".into(),
            kind: SourceKind::Synthetic(synthetic::SyntheticConfig::at(70.0)),
            geo: None,
        }
    }

    /// Where its events' places are: its own `geo`, else its kind's preset, if any.
    pub fn geo_rules(&self) -> Option<GeoConfig> {
        self.geo.clone().or_else(|| GeoConfig::preset(&self.kind))
    }

    /// The settings of its kind.
    pub fn settings(&self) -> &dyn SourceSettings {
        self.kind.settings()
    }

    /// The settings of its kind, to change them.
    pub fn settings_mut(&mut self) -> &mut dyn SourceSettings {
        self.kind.settings_mut()
    }
}

impl Entry for SourceConfig {
    type Kind = SourceKind;
    type Shared = SourceShared;
    const SHARED: &'static [&'static str] = &["geo"];

    fn new(name: String, kind: SourceKind, shared: SourceShared) -> Self {
        SourceConfig {
            name,
            kind,
            geo: shared.geo,
        }
    }

    fn shared(&self) -> SourceShared {
        SourceShared {
            geo: self.geo.clone(),
        }
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> &SourceKind {
        &self.kind
    }
}

impl Serialize for SourceConfig {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        entries::serialize(self, s)
    }
}

/// Why a source could not be built from its configuration.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// A setting could be read but not used (an unset environment variable in a header).
    #[error("sources[{index}] ({name}): {key}: {message}")]
    Setting {
        /// Position in the `sources` list.
        index: usize,
        /// Source name.
        name: String,
        /// The key, relative to the source (`headers.Authorization`).
        key: String,
        /// What is wrong and how to fix it.
        message: String,
    },
}

/// Builds the configured sources. `max_event_bytes` is the ingester's limit (see
/// [`BuildContext::max_line`]): shorter records reach the validator whole, so their dead
/// letter keeps every byte and `tailrace dead-letters replay` can pass them once the limit is
/// raised.
pub fn build(
    configs: &[SourceConfig],
    max_event_bytes: usize,
) -> Result<Vec<Box<dyn Source>>, SourceError> {
    let max_line = max_event_bytes.max(framing::PREFIX_BYTES);
    configs
        .iter()
        .enumerate()
        .map(|(index, c)| {
            c.settings()
                .build(&c.name, &BuildContext { index, max_line })
        })
        .collect()
}
