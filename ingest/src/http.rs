//! The HTTP server: `/metrics`, `/healthz`, `/readyz` and the JSON API, on one port.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use feeds::FeedHandle;
use futures::StreamExt;
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Deserialize;
use serde_json::{Value, json};
use store::{Capped, Keyed, Position};
use tokio::sync::broadcast::error::RecvError;

use crate::ingester::{IngestStats, StoreHealth};

/// What the handlers share.
#[derive(Clone)]
pub struct AppState {
    /// Renders `/metrics`.
    pub metrics: PrometheusHandle,
    /// The running feeds.
    pub feeds: Arc<Vec<FeedHandle>>,
    /// The events collection, for `latest` and point reads.
    pub events: Arc<dyn Capped>,
    /// The rollups collection.
    pub rollups: Arc<dyn Keyed>,
    /// Ingest counters.
    pub ingest: Arc<IngestStats>,
    /// Set once the store is open and every feed has started.
    pub ready: Arc<AtomicBool>,
    /// Whether the store takes writes.
    pub health: Arc<StoreHealth>,
    /// Static facts: version, engine, durability, sources.
    pub info: Arc<Value>,
}

/// The router.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/api", get(index))
        .route("/api/status", get(status))
        .route("/api/feeds", get(feeds_list))
        .route("/api/feeds/{name}", get(feed_one))
        .route("/api/feeds/{name}/stream", get(feed_stream))
        .route("/api/events/latest", get(latest))
        .route("/api/events/{position}", get(event))
        .route("/api/rollups", get(rollups))
        .with_state(state)
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({"error": message.into()}))).into_response()
}

async fn metrics(State(s): State<AppState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.metrics.render(),
    )
        .into_response()
}

async fn readyz(State(s): State<AppState>) -> Response {
    if !s.ready.load(Ordering::Acquire) {
        return (StatusCode::SERVICE_UNAVAILABLE, "starting\n").into_response();
    }
    match s.health.unwritable_reason() {
        None => (StatusCode::OK, "ready\n").into_response(),
        Some(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the store cannot be written: {reason}\n"),
        )
            .into_response(),
    }
}

async fn index() -> Json<Value> {
    Json(json!({
        "endpoints": {
            "/api/status": "version, engine, ingest counters, every feed's status",
            "/api/feeds": "every feed's status and rolling statistics",
            "/api/feeds/{name}": "one feed",
            "/api/feeds/{name}/stream": "server-sent events: every event the feed holds, live",
            "/api/events/latest?field=F&value=V&limit=N": "the N newest events whose indexed field F equals V",
            "/api/events/{position}": "one event by position",
            "/api/rollups?prefix=P": "per-key counters whose key starts with P (e.g. hashtags:)",
            "/metrics": "Prometheus metrics",
        }
    }))
}

async fn status(State(s): State<AppState>) -> Json<Value> {
    let feeds: Vec<_> = s.feeds.iter().map(FeedHandle::status).collect();
    Json(json!({
        "info": *s.info,
        "ready": s.ready.load(Ordering::Acquire),
        "store_writable": s.health.unwritable_reason().is_none(),
        "store_unwritable_reason": s.health.unwritable_reason(),
        "ingest": {
            "written": s.ingest.written.load(Ordering::Relaxed),
            "rejected": s.ingest.rejected.load(Ordering::Relaxed),
            "queue_depth": s.ingest.queue_depth.load(Ordering::Relaxed).max(0),
        },
        "feeds": feeds,
    }))
}

async fn feeds_list(State(s): State<AppState>) -> Json<Value> {
    Json(json!(
        s.feeds.iter().map(FeedHandle::status).collect::<Vec<_>>()
    ))
}

fn find<'a>(s: &'a AppState, name: &str) -> Result<&'a FeedHandle, Box<Response>> {
    s.feeds.iter().find(|f| f.name == name).ok_or_else(|| {
        let names: Vec<&str> = s.feeds.iter().map(|f| f.name.as_str()).collect();
        Box::new(error(
            StatusCode::NOT_FOUND,
            format!("no feed {name:?}; feeds: {}", names.join(", ")),
        ))
    })
}

async fn feed_one(State(s): State<AppState>, Path(name): Path<String>) -> Response {
    match find(&s, &name) {
        Ok(f) => Json(json!(f.status())).into_response(),
        Err(r) => *r,
    }
}

async fn feed_stream(State(s): State<AppState>, Path(name): Path<String>) -> Response {
    let rx = match find(&s, &name) {
        Ok(f) => f.subscribe(),
        Err(r) => return *r,
    };
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        let ev = match rx.recv().await {
            Ok(v) => Event::default().data(v.to_string()),
            // A slow client misses events; it is told how many, and the feed never waits.
            Err(RecvError::Lagged(n)) => Event::default()
                .event("lagged")
                .data(json!({"missed": n}).to_string()),
            Err(RecvError::Closed) => return None,
        };
        Some((Ok::<_, Infallible>(ev), rx))
    });
    Sse::new(stream.boxed())
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// Query of `/api/events/latest`.
#[derive(Deserialize)]
struct LatestQuery {
    field: String,
    value: String,
    limit: Option<usize>,
}

async fn latest(State(s): State<AppState>, Query(q): Query<LatestQuery>) -> Response {
    // `value=12` is the number 12, `value="12"` the string; anything else is a string.
    let value = serde_json::from_str::<Value>(&q.value)
        .ok()
        .filter(|v| v.is_number() || v.is_string() || v.is_boolean())
        .unwrap_or(Value::String(q.value.clone()));
    let limit = q.limit.unwrap_or(20).min(1000);
    match s.events.latest(&q.field, &value, limit).await {
        Ok(records) => Json(json!(
            records
                .into_iter()
                .map(|r| json!({"position": r.position.0, "doc": r.doc}))
                .collect::<Vec<_>>()
        ))
        .into_response(),
        Err(e @ store::StoreError::NotIndexed { .. }) => {
            error(StatusCode::BAD_REQUEST, e.to_string())
        }
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn event(State(s): State<AppState>, Path(position): Path<u64>) -> Response {
    match s.events.get(Position(position)).await {
        Ok(Some(r)) => Json(json!({"position": r.position.0, "doc": r.doc})).into_response(),
        Ok(None) => error(
            StatusCode::NOT_FOUND,
            format!("no event at position {position} (evicted or not yet written)"),
        ),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// Query of `/api/rollups`.
#[derive(Deserialize)]
struct RollupQuery {
    prefix: Option<String>,
}

async fn rollups(State(s): State<AppState>, Query(q): Query<RollupQuery>) -> Response {
    match s.rollups.scan(q.prefix.as_deref().unwrap_or("")).await {
        Ok(rows) => {
            Json(json!(rows.into_iter().map(|e| e.doc).collect::<Vec<_>>())).into_response()
        }
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}
