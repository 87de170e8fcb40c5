//! Sources: where events come from.
//!
//! [`Source`] is the plug-in point. A source turns some stream (a generator, an HTTP
//! response, a file, a child process) into a pull-based stream of [`Raw`] records; the
//! ingester pulls it through a bounded channel, so a source that is faster than the store
//! waits (backpressure by construction). A record that cannot be an event is still a value
//! ([`Raw::Invalid`]): the ingester keeps it as a dead letter with its reason; it never stops
//! the stream.
//!
//! Built-in sources are chosen by one explicit `match` on the configured kind in
//! [`build`]; a user's own source is any type implementing [`Source`] (see `examples/`).

pub mod synthetic;

use futures::stream::BoxStream;
use serde_json::Value;

use crate::config::{SourceConfig, SourceKind};

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
        /// A short machine-readable reason (the `reason` metric label).
        reason: &'static str,
    },
}

/// A stream of events with a name.
///
/// Contract: `records` is called once. The stream yields records in order and ends when the
/// source is exhausted (a file, stdin) — the pipeline then keeps running the other sources —
/// or never (a generator, a live stream). Transient failures (a dropped connection) are the
/// source's to handle (reconnect with backoff) and to log; they do not end the stream. The
/// stream is dropped on shutdown, so it must not need an explicit stop.
pub trait Source: Send + 'static {
    /// The source's name: the `source` label of metrics, stored with each event.
    fn name(&self) -> &str;

    /// The kind, for logs (`synthetic`, `http`, ... or a custom name).
    fn kind(&self) -> &str;

    /// The records.
    fn records(self: Box<Self>) -> BoxStream<'static, Raw>;
}

/// Why a source could not be built from its configuration.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The kind is valid configuration but not built into this version.
    #[error("sources[{index}] ({name}): kind {kind} is not available in this build")]
    Unsupported {
        /// Position in the `sources` list.
        index: usize,
        /// Source name.
        name: String,
        /// Its kind.
        kind: &'static str,
    },
}

/// Builds the configured sources.
pub fn build(configs: &[SourceConfig]) -> Result<Vec<Box<dyn Source>>, SourceError> {
    configs
        .iter()
        .enumerate()
        .map(|(index, c)| -> Result<Box<dyn Source>, SourceError> {
            match c.kind {
                SourceKind::Synthetic => Ok(Box::new(synthetic::Synthetic::from_config(c))),
                kind => Err(SourceError::Unsupported {
                    index,
                    name: c.name.clone(),
                    kind: kind.as_str(),
                }),
            }
        })
        .collect()
}
