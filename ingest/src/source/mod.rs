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
//!
//! Layout: [`synthetic`], [`http`], [`file`], [`stdin`], [`command`]; the byte-stream sources
//! share [`framing`] (bounded NDJSON lines) and the http source's SSE mode uses [`sse`].

pub mod command;
pub mod file;
pub mod framing;
pub mod http;
pub mod realistic;
pub mod sse;
pub mod stdin;
pub mod synthetic;

use std::time::Duration;

use futures::stream::BoxStream;
use serde_json::Value;

use crate::config::{self, HttpFormat, Pace, SourceConfig, SourceKind};

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

/// Builds the configured sources. `max_event_bytes` is the ingester's limit: a line (NDJSON)
/// or an event's data (SSE) longer than it, and longer than the 4096 bytes a dead letter keeps,
/// is `too_large` at the source, without ever being held whole in memory. Shorter ones reach
/// the validator whole, so their dead letter keeps every byte and `tailrace dead-letters
/// replay` can pass them once the limit is raised.
pub fn build(
    configs: &[SourceConfig],
    max_event_bytes: usize,
) -> Result<Vec<Box<dyn Source>>, SourceError> {
    let max_line = max_event_bytes.max(framing::PREFIX_BYTES);
    configs
        .iter()
        .enumerate()
        .map(|(index, c)| -> Result<Box<dyn Source>, SourceError> {
            let ms = |v: Option<u64>, default: u64| Duration::from_millis(v.unwrap_or(default));
            let reconnect_max = ms(c.reconnect_max_ms, config::DEFAULT_RECONNECT_MAX_MS);
            let missing = |key: &str| SourceError::Setting {
                index,
                name: c.name.clone(),
                key: key.to_owned(),
                message: format!("required for kind = {:?}", c.kind.as_str()),
            };
            match c.kind {
                SourceKind::Synthetic => Ok(Box::new(synthetic::Synthetic::from_config(c))),
                SourceKind::Http => {
                    let url = c.url.clone().ok_or_else(|| missing("url"))?;
                    let mut o = http::HttpOptions::new(
                        url,
                        c.format.unwrap_or(HttpFormat::Ndjson),
                        max_line,
                    );
                    for (header, value) in &c.headers {
                        let value = config::interpolate_env(value, |v| std::env::var(v).ok())
                            .map_err(|message| SourceError::Setting {
                                index,
                                name: c.name.clone(),
                                key: format!("headers.{header}"),
                                message,
                            })?;
                        o.headers.push((header.clone(), value));
                    }
                    o.connect_timeout =
                        ms(c.connect_timeout_ms, config::DEFAULT_CONNECT_TIMEOUT_MS);
                    o.idle_timeout = ms(c.idle_timeout_ms, config::DEFAULT_IDLE_TIMEOUT_MS);
                    o.reconnect_max = reconnect_max;
                    Ok(Box::new(http::HttpSource::new(c.name.clone(), o)))
                }
                SourceKind::File => {
                    let path = c.path.clone().ok_or_else(|| missing("path"))?;
                    let pace = match c.pace.unwrap_or(Pace::Fast) {
                        Pace::Fast => file::Pacing::Fast,
                        Pace::Rate => file::Pacing::Rate(c.rate_per_sec.unwrap_or(1.0)),
                        Pace::Timestamps => file::Pacing::Timestamps {
                            field: c
                                .timestamp_field
                                .clone()
                                .unwrap_or_else(|| config::DEFAULT_TIMESTAMP_FIELD.to_owned()),
                            speed: c.speed.unwrap_or(1.0),
                        },
                    };
                    let o = file::FileOptions {
                        path,
                        pacing: pace,
                        follow: c.follow.unwrap_or(false),
                        max_line,
                    };
                    Ok(Box::new(file::FileSource::new(c.name.clone(), o)))
                }
                SourceKind::Stdin => {
                    Ok(Box::new(stdin::StdinSource::new(c.name.clone(), max_line)))
                }
                SourceKind::Command => {
                    let program = c.program.clone().ok_or_else(|| missing("program"))?;
                    let o = command::CommandOptions {
                        program,
                        args: c.args.clone(),
                        restart: c.restart.unwrap_or(true),
                        reconnect_min: Duration::from_millis(100),
                        reconnect_max,
                        max_line,
                    };
                    Ok(Box::new(command::CommandSource::new(c.name.clone(), o)))
                }
            }
        })
        .collect()
}

/// Waits between reconnects (http) and restarts (command): doubling from `min` up to `max`,
/// with "equal jitter" (half fixed, half random), so many sources do not reconnect in step.
#[derive(Clone, Debug)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    attempt: u32,
}

impl Backoff {
    /// Starts at `min`.
    pub fn new(min: Duration, max: Duration) -> Self {
        Backoff {
            min,
            max: max.max(min),
            attempt: 0,
        }
    }

    /// After a success: the next wait is short again.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    /// The next wait.
    pub fn next_wait(&mut self) -> Duration {
        let min = self.min;
        self.next_from(min)
    }

    /// The next wait, with `base` (e.g. an SSE `retry:`) as the first step.
    pub fn next_from(&mut self, base: Duration) -> Duration {
        let exp = base
            .saturating_mul(1u32 << self.attempt.min(20))
            .min(self.max);
        self.attempt = self.attempt.saturating_add(1);
        let half = exp / 2;
        half + half.mul_f64(rand::random::<f64>())
    }
}
