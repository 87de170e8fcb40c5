//! # ingest — tailrace's sources, ingester and configuration: the library
//!
//! [`source`] (the [`source::Source`] plug-in point and the built-in sources, one file per
//! kind), [`ingester`] (validate, stamp, batch, write, dead letters, rollups), [`config`] (one
//! tree, defaults, loading, validation), [`pipeline`] (what the pipeline is built from),
//! [`live`] (the `ingest` statistics document), [`telemetry`] (metric names and every notable
//! occurrence as a type that logs and counts it). A custom source needs only this crate.
//!
//! What it is not: the storage engine (`store`), the consumers (`feeds`), the HTTP server
//! (`server`) or the `tailrace` application (`tailrace`: CLI, status line, signals).
//!
//! ```no_run
//! use futures::stream::{BoxStream, StreamExt};
//! use ingest::source::{Raw, Source};
//!
//! /// A source of one event.
//! struct Once;
//!
//! impl Source for Once {
//!     fn name(&self) -> &str { "once" }
//!     fn kind(&self) -> &str { "example" }
//!     fn records(self: Box<Self>) -> BoxStream<'static, Raw> {
//!         futures::stream::iter([Raw::Json(serde_json::json!({"hello": "world"}))]).boxed()
//!     }
//! }
//! ```

pub mod config;
pub mod geo;
pub mod ingester;
pub mod live;
pub mod pipeline;
pub mod source;
pub mod telemetry;
