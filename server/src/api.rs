//! The JSON API (`/api/...`), `/metrics`, `/readyz`, and the per-feed stream.

use std::convert::Infallible;
use std::sync::atomic::Ordering;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use feeds::FeedHandle;
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};
use store::Position;
use tokio::sync::broadcast::error::RecvError;

use super::{AppState, error};

/// Rows per page of `/api/rollups` when the query names no `limit`.
const ROLLUPS_DEFAULT_LIMIT: usize = 100;
/// The largest page of `/api/rollups`.
const ROLLUPS_MAX_LIMIT: usize = 10_000;

pub(super) async fn metrics(State(s): State<AppState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.metrics.render(),
    )
        .into_response()
}

pub(super) async fn readyz(State(s): State<AppState>) -> Response {
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

pub(super) async fn index() -> Json<Value> {
    Json(json!({
        "endpoints": {
            "/api/status": "version, engine, ingest counters, every feed's status",
            "/api/feeds": "every feed's status and rolling statistics",
            "/api/feeds/{name}": "one feed",
            "/api/feeds/{name}/stream": "server-sent events: every event the feed holds, live, each with its position as id",
            "/api/changes?collection=C": "a changefeed of events, dead_letters, rollups, stats or trends (the feeds' breakouts of their rate from its bands): server-sent events (NDJSON with Accept: application/x-ndjson); filter=<MongoDB query JSON>, ops=insert,update,replace,delete, include_initial=true, initial_limit=N, include_states=true, squash=<ms>, resume_after=<id> (or Last-Event-ID)",
            "/api/events?filter=F&from=T&to=T&order=newest&limit=N&after=P": "a page of stored events (newest or oldest first), filtered (MongoDB query JSON) and received in [from, to) (RFC 3339); a full page links to the next (Link: rel=next) after its last position P",
            "/api/events/latest?field=F&value=V&limit=N": "the N newest events whose indexed field F equals V",
            "/api/events/{position}": "one event by position",
            "/api/rollups?prefix=P&limit=N&after=K": "per-key counters whose key starts with P (e.g. hashtags:), by key, N per page (default 100); the next page starts after the last key K",
            "POST /api/aggregate": "a MongoDB aggregation pipeline over one collection's stored documents: {\"collection\": \"events\" (or dead_letters, rollups, stats, trends), \"pipeline\": [{\"$match\": ...}, {\"$group\": ...}]}; stages $match $sort $limit $skip $project $unwind $group $count $sortByCount; the answer says where each stage ran, documents read, time taken",
            "GET /api/aggregate?live=true&collection=events&pipeline=[...]": "a $group (after at most one $match) kept live over SSE or NDJSON: a snapshot event, then a change event ({_id, doc}, doc null when the group left) for each group an arriving or evicted event moves; resume with Last-Event-ID or resume_after",
            "/api/geo": "what tailrace_events_geo_total and tailrace_events_geo_country_total have counted (precision, country) and the newest sequence number of each source counted (seq): follow /api/changes?collection=events and add the events of a source whose _tailrace.seq is above it, and the counts stay exact",
            "/metrics": "Prometheus metrics",
            "/": "the live page",
        }
    }))
}

pub(super) async fn status(State(s): State<AppState>) -> Json<Value> {
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

/// `GET /api/geo`: the geo counters with the point of each source's sequence they are exact
/// at (`ingest::geo::GeoTally`). The live page's map starts its counts here: it opens its
/// events stream first, then reads this, and adds only the streamed events of a source past
/// that source's `seq`; an event stamped later is written later, so the stream has it. (An
/// event the store refuses once stamped, a dead letter, is counted here and in /metrics but
/// never streamed.)
pub(super) async fn geo(State(s): State<AppState>) -> Response {
    match s.ingest.geo.lock() {
        Ok(tally) => Json(tally.to_value()).into_response(),
        Err(_) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the geo tally is unavailable (a writer panicked)",
        ),
    }
}

pub(super) async fn feeds_list(State(s): State<AppState>) -> Json<Value> {
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

pub(super) async fn feed_one(State(s): State<AppState>, Path(name): Path<String>) -> Response {
    match find(&s, &name) {
        Ok(f) => Json(json!(f.status())).into_response(),
        Err(r) => *r,
    }
}

/// Every event the feed holds from now on, as server-sent events. Each carries the feed's
/// position (tailable: the capped position; changes: the resume token) as its `id`. The stream
/// is a broadcast of the feed, not a reader of its own: a slow client misses events and is
/// told how many (`lagged`); `/api/changes` is the stream that never loses one.
pub(super) async fn feed_stream(State(s): State<AppState>, Path(name): Path<String>) -> Response {
    let rx = match find(&s, &name) {
        Ok(f) => f.subscribe(),
        Err(r) => return *r,
    };
    // It counts against http.max_streams like a change stream; the permit lives in the
    // stream's state and is returned when the response is dropped.
    let permit = match s.streams.admit() {
        Ok(p) => p,
        Err(refused) => return *refused,
    };
    let stream = futures::stream::unfold((rx, permit), |(mut rx, permit)| async move {
        let ev = match rx.recv().await {
            Ok(v) => {
                let ev = Event::default().data(v.to_string());
                match feed_event_id(&v) {
                    Some(id) => ev.id(id),
                    None => ev,
                }
            }
            // A slow client misses events; it is told how many, and the feed never waits.
            Err(RecvError::Lagged(n)) => Event::default()
                .event("lagged")
                .data(json!({"missed": n}).to_string()),
            Err(RecvError::Closed) => return None,
        };
        Some((Ok::<_, Infallible>(ev), (rx, permit)))
    });
    Sse::new(stream.boxed())
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// The `id` of a feed's event: its position, as text (a resume token is already text; an id
/// cannot hold a line break, which neither has).
fn feed_event_id(v: &Value) -> Option<String> {
    let id = match &v["position"] {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        _ => return None,
    };
    (!id.contains(['\n', '\r', '\0'])).then_some(id)
}

/// Query of `/api/events/latest`.
#[derive(Deserialize)]
pub(super) struct LatestQuery {
    field: String,
    value: String,
    limit: Option<usize>,
}

pub(super) async fn latest(State(s): State<AppState>, Query(q): Query<LatestQuery>) -> Response {
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

pub(super) async fn event(State(s): State<AppState>, Path(position): Path<u64>) -> Response {
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
pub(super) struct RollupQuery {
    prefix: Option<String>,
    /// Rows per page.
    limit: Option<usize>,
    /// The cursor: the last key of the previous page.
    after: Option<String>,
}

/// One page of the rollups whose key starts with `prefix`, by key: a JSON array of documents
/// (each holds its key in `_id`). A full page links to the next (`Link: <...>; rel="next"`),
/// which continues after its last key.
pub(super) async fn rollups(State(s): State<AppState>, Query(q): Query<RollupQuery>) -> Response {
    let limit = q.limit.unwrap_or(ROLLUPS_DEFAULT_LIMIT);
    if limit == 0 || limit > ROLLUPS_MAX_LIMIT {
        return error(
            StatusCode::BAD_REQUEST,
            format!("limit: {limit} is not within 1..={ROLLUPS_MAX_LIMIT}"),
        );
    }
    let prefix = q.prefix.unwrap_or_default();
    match s
        .rollups
        .scan_page(&prefix, q.after.as_deref(), limit)
        .await
    {
        Ok(rows) => {
            let next = (rows.len() == limit)
                .then(|| rows.last().map(|r| r.key.clone()))
                .flatten();
            let mut response =
                Json(json!(rows.into_iter().map(|e| e.doc).collect::<Vec<_>>())).into_response();
            if let Some(last) = next {
                let query: String = form_urlencoded::Serializer::new(String::new())
                    .append_pair("prefix", &prefix)
                    .append_pair("limit", &limit.to_string())
                    .append_pair("after", &last)
                    .finish();
                if let Ok(link) =
                    HeaderValue::from_str(&format!("</api/rollups?{query}>; rel=\"next\""))
                {
                    response.headers_mut().insert(header::LINK, link);
                }
            }
            response
        }
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}
