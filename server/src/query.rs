//! `POST /api/aggregate`: a pipeline in MongoDB's aggregation language over one collection's
//! stored documents (`store::query`). The answer says where each stage ran, how many
//! documents were read and how long it took. `GET /api/events`: a page of stored events,
//! filtered, in a range of received times, with a cursor to the next.

use std::time::Instant;

use axum::Json;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use store::Filter;
use store::query::{AggregateError, Input, Order, PageRequest, Pipeline, aggregate as run, page};

use super::{AppState, error};

/// The collections a query may read.
const COLLECTIONS: &str = "events, dead_letters, rollups, stats, trends";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Request {
    /// `events`, `dead_letters`, `rollups`, `stats` or `trends`.
    collection: String,
    /// The stages, as sent: the text keeps the order of a `$sort`'s keys.
    pipeline: Box<serde_json::value::RawValue>,
}

pub(super) async fn aggregate(
    State(s): State<AppState>,
    body: Result<Json<Request>, JsonRejection>,
) -> Response {
    let Json(req) = match body {
        Ok(b) => b,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!(
                    "{} (send {{\"collection\": \"events\", \"pipeline\": [...]}})",
                    e.body_text()
                ),
            );
        }
    };
    let input = match req.collection.as_str() {
        "events" => Input::Capped(s.events.clone()),
        "dead_letters" => Input::Capped(s.dead_letters.clone()),
        "rollups" => Input::Keyed(s.rollups.clone()),
        "stats" => Input::Keyed(s.stats.clone()),
        "trends" => Input::Keyed(s.trends.clone()),
        other => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("collection: {other:?} is not one of {COLLECTIONS}"),
            );
        }
    };
    let pipeline = match Pipeline::parse_text(req.pipeline.get()) {
        Ok(p) => p,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("pipeline{e}", e = at(&e))),
    };
    let started = Instant::now();
    match run(input, pipeline, s.query).await {
        Ok(answer) => Json(json!({
            "collection": req.collection,
            "docs": answer.docs,
            "stages": answer.stages,
            "read": answer.read,
            "took_ms": started.elapsed().as_secs_f64() * 1e3,
        }))
        .into_response(),
        Err(AggregateError::Query(e)) => {
            error(StatusCode::BAD_REQUEST, format!("pipeline{}", at(&e)))
        }
        Err(AggregateError::Store(e)) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

/// `[2].$group.n: ...` after `pipeline`, or `: ...` for the pipeline as a whole.
fn at(e: &store::query::QueryError) -> String {
    if e.path.is_empty() {
        format!(": {}", e.message)
    } else {
        format!("{}: {}", e.path, e.message)
    }
}

/// The largest page of `GET /api/events`, and the page when none is named.
const EVENTS_MAX_LIMIT: usize = 1000;
const EVENTS_DEFAULT_LIMIT: usize = 100;

/// Query of `GET /api/events`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct EventsQuery {
    /// A filter in MongoDB query syntax (JSON).
    filter: Option<String>,
    /// Received at or after this time (RFC 3339).
    from: Option<String>,
    /// Received before this time (RFC 3339).
    to: Option<String>,
    /// `newest` (the default) or `oldest` first.
    order: Option<String>,
    limit: Option<usize>,
    /// The cursor: the last position of the previous page.
    after: Option<u64>,
}

/// One page of stored events: a JSON array of `{"position", "doc"}`, filtered, in a range of
/// received times, newest or oldest first. A full page links to the next
/// (`Link: <...>; rel="next"`), which continues after its last position; `X-Tailrace-Read`
/// says how many documents were read to find it.
pub(super) async fn events(
    State(s): State<AppState>,
    q: Result<Query<EventsQuery>, QueryRejection>,
) -> Response {
    let Query(q) = match q {
        Ok(q) => q,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.body_text()),
    };
    let req = match events_request(&q) {
        Ok(r) => r,
        Err(message) => return error(StatusCode::BAD_REQUEST, message),
    };
    match page(&s.events, &req).await {
        Ok(p) => {
            let docs: Vec<Value> = p
                .records
                .into_iter()
                .map(|r| json!({"position": r.position.0, "doc": r.doc}))
                .collect();
            let mut response = Json(docs).into_response();
            let headers = response.headers_mut();
            headers.insert("x-tailrace-read", HeaderValue::from(p.read));
            if let Some(next) = p.next {
                let mut link = form_urlencoded::Serializer::new(String::new());
                for (k, v) in [("filter", &q.filter), ("from", &q.from), ("to", &q.to)] {
                    if let Some(v) = v {
                        link.append_pair(k, v);
                    }
                }
                let order = if req.order == Order::Oldest {
                    "oldest"
                } else {
                    "newest"
                };
                link.append_pair("order", order)
                    .append_pair("limit", &req.limit.to_string())
                    .append_pair("after", &next.0.to_string());
                if let Ok(v) =
                    HeaderValue::from_str(&format!("</api/events?{}>; rel=\"next\"", link.finish()))
                {
                    headers.insert(header::LINK, v);
                }
            }
            response
        }
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

/// The page `q` asks for, or what is wrong with it (naming the parameter).
fn events_request(q: &EventsQuery) -> Result<PageRequest, String> {
    let filter = match &q.filter {
        None => Filter::match_all(),
        Some(text) => {
            let json: Value = serde_json::from_str(text)
                .map_err(|e| format!("filter: not JSON ({e}); send e.g. {{\"lang\":\"ja\"}}"))?;
            Filter::parse(&json).map_err(|e| e.to_string())?
        }
    };
    let time = |name: &str, v: &Option<String>| -> Result<Option<i64>, String> {
        v.as_deref()
            .map(|t| {
                store::date::parse_rfc3339(t).ok_or_else(|| {
                    format!("{name}: {t:?} is not an RFC 3339 time such as 2026-12-06T14:00:00Z")
                })
            })
            .transpose()
    };
    let (from, to) = (time("from", &q.from)?, time("to", &q.to)?);
    let received = match (from, to) {
        (None, None) => None,
        (from, to) => Some((
            from.unwrap_or(i64::MIN),
            to.map_or(i64::MAX, |t| t.saturating_sub(1)),
        )),
    };
    let order = match q.order.as_deref() {
        None | Some("newest") => Order::Newest,
        Some("oldest") => Order::Oldest,
        Some(other) => return Err(format!("order: {other:?} is not newest or oldest")),
    };
    let limit = q.limit.unwrap_or(EVENTS_DEFAULT_LIMIT);
    if limit == 0 || limit > EVENTS_MAX_LIMIT {
        return Err(format!(
            "limit: {limit} is not within 1..={EVENTS_MAX_LIMIT}"
        ));
    }
    Ok(PageRequest {
        filter,
        received,
        order,
        limit,
        after: q.after.map(store::Position),
    })
}
