//! # tailrace — the application around the pipeline
//!
//! [`run`] (the pipeline with the HTTP server, the status line and signals, and its ordered
//! shutdown), [`status`] (what the user sees), [`dead_letters`] (`tailrace dead-letters`),
//! [`exporter`] (the Prometheus recorder), [`tail`] (`tailrace tail`), [`query`]
//! (`tailrace query`), [`allocator`] (the
//! binary's allocator), [`priority`] (the async workers' scheduling priority). The binary
//! itself (`main.rs`) parses the command line, loads the configuration, installs telemetry
//! and signal handling, calls the library and maps errors to exit codes.
//!
//! What it is not: the sources, ingester and configuration (`ingest`), the HTTP server
//! (`server`) or the benchmarks (`bench`).

pub mod allocator;
pub mod dead_letters;
pub mod exporter;
pub mod priority;
pub mod query;
pub mod run;
pub mod status;
pub mod tail;
