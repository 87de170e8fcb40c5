//! # ingest — tailrace's sources, ingester and configuration, and the `tailrace` application
//!
//! **The library** (always built): [`source`] (the [`source::Source`] plug-in point and the
//! built-in sources, one file per kind), [`ingester`] (validate, stamp, batch, write, dead
//! letters, rollups), [`config`] (one tree, defaults, loading, validation), [`telemetry`]
//! (metric names and every notable occurrence as a type that logs and counts it). A custom
//! source needs only this: depend on `ingest` with `default-features = false` and nothing of
//! the HTTP server, the CLI or the bench is compiled.
//!
//! **The application** (feature `app`, on by default; the `tailrace` binary needs it):
//! [`pipeline`] (wiring and ordered shutdown), [`http`] (`/metrics`, `/healthz`, `/readyz`,
//! `/api`, the change streams `/api/changes` and the live page `/`), [`live`] (the `ingest`
//! statistics document the page draws), [`status`] (what the user sees), [`dead_letters`] (`tailrace dead-letters`),
//! [`exporter`] (the Prometheus recorder), [`tail`] (`tailrace tail`), [`bench`]
//! (`tailrace bench`). The binary itself
//! (`main.rs`) parses the command line, loads the configuration, installs telemetry and signal
//! handling, calls [`pipeline::run`] and maps errors to exit codes.
//!
//! What it is not: the storage engine (`store`) or the consumers (`feeds`).
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
pub mod ingester;
pub mod source;
pub mod telemetry;

#[cfg(feature = "app")]
pub mod allocator;
#[cfg(feature = "app")]
pub mod bench;
#[cfg(feature = "app")]
pub mod dead_letters;
#[cfg(feature = "app")]
pub mod exporter;
#[cfg(feature = "app")]
pub mod http;
#[cfg(feature = "app")]
pub mod live;
#[cfg(feature = "app")]
pub mod pipeline;
#[cfg(feature = "app")]
pub mod status;
#[cfg(feature = "app")]
pub mod tail;
