//! The HTTP server, on one port: `/metrics`, `/healthz`, `/readyz`, the JSON API, the change
//! streams (`/api/changes`) and the live page (`/`).
//!
//! Layout: this file holds what the handlers share and the routes; [`api`] the JSON
//! endpoints and the per-feed stream; [`changes`] `/api/changes`, RethinkDB-style changefeeds
//! that resume exactly (requests; `follow`: each stream's task); [`wire`] how an event is written as server-sent events or NDJSON;
//! [`assets`] the page's files, embedded at compile time.

mod api;
mod assets;
pub mod changes;
mod follow;
mod live;
mod query;
pub mod wire;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use axum::Router;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use feeds::FeedHandle;
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::{Value, json};
use store::{Capped, Keyed, Store};

use ingest::ingester::{IngestStats, StoreHealth};
use ingest::pipeline::{Collections, Pipeline};

pub use changes::StreamLimits;

/// What the handlers share.
#[derive(Clone)]
pub struct AppState {
    /// Renders `/metrics`.
    pub metrics: PrometheusHandle,
    /// The running feeds.
    pub feeds: Arc<Vec<FeedHandle>>,
    /// The store, for what no single collection answers (the newest change, token checks).
    pub store: Arc<dyn Store>,
    /// The events collection, for `latest`, point reads and change streams.
    pub events: Arc<dyn Capped>,
    /// The rejected records, for change streams.
    pub dead_letters: Arc<dyn Capped>,
    /// The rollups collection.
    pub rollups: Arc<dyn Keyed>,
    /// The feeds' and the ingester's statistics documents (what the live page draws).
    pub stats: Arc<dyn Keyed>,
    /// The feeds' trend changes.
    pub trends: Arc<dyn Keyed>,
    /// Ingest counters.
    pub ingest: Arc<IngestStats>,
    /// Set once the store is open and every feed has started.
    pub ready: Arc<AtomicBool>,
    /// Whether the store takes writes.
    pub health: Arc<StoreHealth>,
    /// Static facts: version, engine, durability, sources.
    pub info: Arc<Value>,
    /// How many change streams may be open at once, and how long one may stall.
    pub streams: StreamLimits,
    /// What one query (`/api/aggregate`) may hold in memory.
    pub query: store::query::Limits,
}

impl AppState {
    /// The state of a pipeline's server: its store, collections, feeds, counters and
    /// readiness; `metrics` renders `/metrics`, `info` is what `/api/status` says about it.
    pub fn for_pipeline(
        p: &Pipeline,
        metrics: PrometheusHandle,
        info: Value,
        streams: StreamLimits,
    ) -> AppState {
        AppState {
            metrics,
            feeds: p.feeds().clone(),
            store: p.store().clone(),
            events: p.collections().events.clone(),
            dead_letters: p.collections().dead_letters.clone(),
            rollups: p.collections().rollups.clone(),
            stats: p.collections().stats.clone(),
            trends: p.collections().trends.clone(),
            ingest: p.ingest_stats().clone(),
            ready: p.ready().clone(),
            health: p.health().clone(),
            info: Arc::new(info),
            streams,
            query: store::query::Limits {
                max_bytes: p.config().http.query_max_bytes,
            },
        }
    }

    /// A server over collections alone, without a pipeline (`tailrace bench`): no feeds,
    /// ready, and a metrics recorder of its own (not installed globally).
    pub fn for_collections(
        store: Arc<dyn Store>,
        collections: Collections,
        info: Value,
        streams: StreamLimits,
    ) -> AppState {
        AppState {
            metrics: metrics_exporter_prometheus::PrometheusBuilder::new()
                .build_recorder()
                .handle(),
            feeds: Arc::new(Vec::new()),
            store,
            events: collections.events,
            dead_letters: collections.dead_letters,
            rollups: collections.rollups,
            stats: collections.stats,
            trends: collections.trends,
            ingest: Arc::new(IngestStats::default()),
            ready: Arc::new(AtomicBool::new(true)),
            health: Arc::new(StoreHealth::new()),
            info: Arc::new(info),
            streams,
            query: store::query::Limits::default(),
        }
    }
}

/// The router.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/", get(assets::index))
        .route("/assets/{*path}", get(assets::asset))
        .route("/metrics", get(api::metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(api::readyz))
        .route("/api", get(api::index))
        .route("/api/status", get(api::status))
        .route("/api/geo", get(api::geo))
        .route("/api/feeds", get(api::feeds_list))
        .route("/api/feeds/{name}", get(api::feed_one))
        .route("/api/feeds/{name}/stream", get(api::feed_stream))
        .route("/api/changes", get(changes::changes))
        .route("/api/events", get(query::events))
        .route("/api/events/latest", get(api::latest))
        .route("/api/events/{position}", get(api::event))
        .route("/api/rollups", get(api::rollups))
        .route(
            "/api/aggregate",
            post(query::aggregate).get(live::aggregate),
        )
        .with_state(state)
}

/// An error answer: `{"error": message}` with `status`.
pub(crate) fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, axum::Json(json!({"error": message.into()}))).into_response()
}
