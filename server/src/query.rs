//! `POST /api/aggregate`: a pipeline in MongoDB's aggregation language over one collection's
//! stored documents (`store::query`). The answer says where each stage ran, how many
//! documents were read and how long it took.

use std::time::Instant;

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use store::query::{AggregateError, Input, Pipeline, aggregate as run};

use super::{AppState, error};

/// The collections a query may read.
const COLLECTIONS: &str = "events, dead_letters, rollups, stats";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Request {
    /// `events`, `dead_letters`, `rollups` or `stats`.
    collection: String,
    /// The stages.
    pipeline: Value,
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
        other => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("collection: {other:?} is not one of {COLLECTIONS}"),
            );
        }
    };
    let pipeline = match Pipeline::parse(&req.pipeline) {
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
