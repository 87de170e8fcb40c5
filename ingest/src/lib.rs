//! # ingest — tailrace's sources, ingester, config, HTTP server and CLI
//!
//! The `tailrace` binary is thin (`main.rs`): it parses the command line, loads [`config`],
//! installs [`telemetry`] and signal handling, and calls [`pipeline::run`].
//!
//! Layout: [`source`] (the `Source` plug-in point and built-in sources), [`ingester`]
//! (validate, stamp, batch, write, dead letters, rollups), [`pipeline`] (wiring and ordered
//! shutdown), [`http`] (`/metrics`, `/healthz`, `/readyz`, `/api`), [`status`] (what the user
//! sees), [`config`] (one tree, defaults, validation), [`telemetry`] (metric names), [`bench`]
//! (`tailrace bench`: the classic database experiments, with floors, tables, JSON and plots).
//!
//! What it is not: the storage engine (`store`) or the consumers (`feeds`).

pub mod bench;
pub mod config;
pub mod dead_letters;
pub mod http;
pub mod ingester;
pub mod pipeline;
pub mod source;
pub mod status;
pub mod telemetry;
