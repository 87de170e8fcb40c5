//! `GET /api/changes`: RethinkDB-style changefeeds for any HTTP client, that resume exactly.
//!
//! ```text
//! /api/changes?collection=events&filter={"lang":"ja"}&include_initial=true&initial_limit=20
//! /api/changes?collection=stats&include_initial=true           (the live page's statistics)
//! /api/changes?collection=rollups&ops=update&squash=1000        (one update per key per second)
//! ```
//!
//! | parameter | meaning |
//! |---|---|
//! | `collection` | `events`, `dead_letters` (capped: every insert) or `rollups`, `stats`, `trends` (keyed: inserts, updates, replaces, deletes) |
//! | `filter` | a document filter in MongoDB query syntax ([`store::Filter`]); an invalid one is a 400 naming what and where |
//! | `ops` | keyed collections: `insert,update,replace,delete` (a subset) |
//! | `include_initial` | first the current matching documents (capped: the newest `initial_limit`, default 50, at most 1000; keyed: a consistent snapshot), then `{"state":"ready"}`, then the changes: no gap, no duplicate between them |
//! | `include_states` | `{"state":"initializing"}` first and `{"state":"ready"}` when the changes begin |
//! | `squash` | milliseconds: changes of one key within the window are sent once, as the latest |
//! | `resume_after` | an id this stream gave: continue exactly after it (the `Last-Event-ID` header wins) |
//!
//! Events: `initial` and `change` carry `{op, collection, key, doc, before?, committed_at_us}`
//! (`initial`: no `op`); `state`, `gap` (the history after the client's id is gone: what was
//! lost, then the stream continues from the oldest entry), `error` (then the stream ends).
//! Every `change` has an `id`: a capped collection's position, a keyed collection's resume
//! token; a capped `initial` has its position; a keyed `initial` has none (a snapshot is no
//! place to resume from: a client cut off during it starts over), and `ready` carries the
//! snapshot's token.
//!
//! **Each client reads the store at its own pace.** Every stream has a task of its own that
//! follows the store with its own tail or change stream (never a broadcast it could fall
//! behind) and hands encoded events to the response through a channel of
//! [`follow::CHANNEL_WRITES`]: a client that reads slowly slows its own task, which reads the store
//! later; nothing piles up in the server. A client that accepts nothing for
//! `http.stream_stall_timeout_ms` is disconnected (it resumes with its last id), so it cannot
//! hold a snapshot or a cursor open for ever (hyper polls a body only when it can write, so a
//! stalled client's queue would otherwise sit in memory until it closed the connection). At
//! most `http.max_streams` streams are open at once; beyond, a 503 says so.
//! `tailrace_change_streams_{open,buffered_bytes,refused_total,stalled_total,gaps_total}`
//! count all this.
//!
//! Every mistake in a request is a 400 naming the parameter. A resume id ahead of the history
//! is refused, so a client of a server that lost its data starts over. A quiet keyed stream
//! whose filter skips entries still moves the client's resume point, in its keep-alive (an
//! SSE block with only `id:`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use store::{Capability, ChangeOp, Filter, ResumeToken, StoreError};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::follow::{self, Request, Target};
use super::wire::Format;
use super::{AppState, error};
use ingest::telemetry as t;

/// `initial_limit` when not given (capped collections).
pub const DEFAULT_INITIAL_LIMIT: usize = 50;
/// The largest `initial_limit`: the initial documents are read before they are sent.
pub const MAX_INITIAL_LIMIT: usize = 1000;
/// The longest `squash` window.
pub const MAX_SQUASH_MS: u64 = 60_000;
/// The parameters `/api/changes` knows.
const PARAMETERS: &str =
    "collection, filter, ops, include_initial, initial_limit, include_states, squash, resume_after";

/// How many change streams may be open at once, and how long one may stall.
#[derive(Clone, Debug)]
pub struct StreamLimits {
    /// The permits: one per open stream.
    permits: Arc<Semaphore>,
    /// `http.max_streams`.
    max: usize,
    /// A client that accepts no byte for this long is disconnected.
    pub(super) stall: Duration,
}

impl StreamLimits {
    /// At most `max` streams; `stall` as above.
    pub fn new(max: usize, stall: Duration) -> Self {
        StreamLimits {
            permits: Arc::new(Semaphore::new(max)),
            max,
            stall,
        }
    }

    /// A permit for one more stream, or the 503 that says why there is none.
    pub(super) fn admit(&self) -> Result<OwnedSemaphorePermit, Box<Response>> {
        self.permits.clone().try_acquire_owned().map_err(|_| {
            t::StreamRefused.emit();
            let mut r = error(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "too many change streams: {} are open, the most http.max_streams allows; \
                     retry later",
                    self.max
                ),
            );
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            Box::new(r)
        })
    }
}

/// The four collections a client can follow.
const COLLECTIONS: &str = "events, dead_letters, rollups, stats, trends";

/// Why a request is refused before the stream starts.
type Refusal = (StatusCode, String);

fn bad(message: impl Into<String>) -> Refusal {
    (StatusCode::BAD_REQUEST, message.into())
}

fn parse_bool(name: &str, v: &str) -> Result<bool, Refusal> {
    match v {
        "true" | "1" | "" => Ok(true),
        "false" | "0" => Ok(false),
        other => Err(bad(format!("{name}: {other:?} is not true or false"))),
    }
}

/// Reads the query string and headers into a [`Request`]; every problem is a 400 that names
/// the parameter.
fn parse(s: &AppState, headers: &HeaderMap, query: &str) -> Result<Request, Refusal> {
    let mut params: HashMap<String, String> = HashMap::new();
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        if !PARAMETERS.split(", ").any(|p| p == k) {
            return Err(bad(format!("unknown parameter {k:?}; known: {PARAMETERS}")));
        }
        if params.insert(k.to_string(), v.to_string()).is_some() {
            return Err(bad(format!("{k}: given twice")));
        }
    }
    let collection = params
        .get("collection")
        .ok_or_else(|| bad(format!("collection: required, one of {COLLECTIONS}")))?
        .clone();
    let target = match collection.as_str() {
        "events" => Target::Capped(s.events.clone()),
        "dead_letters" => Target::Capped(s.dead_letters.clone()),
        "rollups" => Target::Keyed(s.rollups.clone()),
        "stats" => Target::Keyed(s.stats.clone()),
        "trends" => Target::Keyed(s.trends.clone()),
        other => {
            return Err(bad(format!(
                "collection: {other:?} is not one of {COLLECTIONS}"
            )));
        }
    };
    let filter = match params.get("filter").map(|f| f.trim()) {
        None | Some("") => Filter::match_all(),
        // The filter's own error names the place: `filter at $and[1].n.$gt: ...`.
        Some(text) => text.parse::<Filter>().map_err(|e| bad(e.to_string()))?,
    };
    let mut ops = Vec::new();
    if let Some(list) = params.get("ops").filter(|l| !l.is_empty()) {
        for op in list.split(',') {
            let op: ChangeOp = op.trim().parse().map_err(|e| bad(format!("ops: {e}")))?;
            if !ops.contains(&op) {
                ops.push(op);
            }
        }
        if matches!(target, Target::Capped(_)) && ops.iter().any(|o| *o != ChangeOp::Insert) {
            return Err(bad(format!(
                "ops: {collection} is a capped collection, whose only changes are inserts"
            )));
        }
    }
    let include_initial = params
        .get("include_initial")
        .map(|v| parse_bool("include_initial", v))
        .transpose()?
        .unwrap_or(false);
    let include_states = params
        .get("include_states")
        .map(|v| parse_bool("include_states", v))
        .transpose()?
        .unwrap_or(false);
    let initial_limit = match params.get("initial_limit") {
        None => DEFAULT_INITIAL_LIMIT,
        Some(_) if matches!(target, Target::Keyed(_)) => {
            return Err(bad(format!(
                "initial_limit: applies to capped collections (events, dead_letters); the \
                 initial snapshot of {collection} is whole"
            )));
        }
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| *n <= MAX_INITIAL_LIMIT)
            .ok_or_else(|| {
                bad(format!(
                    "initial_limit: {v:?} is not a number from 0 to {MAX_INITIAL_LIMIT}"
                ))
            })?,
    };
    let squash = match params.get("squash") {
        None => None,
        Some(v) => {
            let ms = v
                .parse::<u64>()
                .ok()
                .filter(|ms| *ms <= MAX_SQUASH_MS)
                .ok_or_else(|| {
                    bad(format!(
                        "squash: {v:?} is not a number of milliseconds from 0 to {MAX_SQUASH_MS}"
                    ))
                })?;
            (ms > 0).then(|| Duration::from_millis(ms))
        }
    };
    // A browser reconnecting sends Last-Event-ID with the URL it first used: the header is
    // the newer of the two.
    let resume = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| params.get("resume_after").cloned())
        .filter(|r| !r.is_empty());
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    Ok(Request {
        collection,
        target,
        filter,
        ops,
        include_initial,
        initial_limit,
        include_states,
        squash,
        resume,
        format: Format::from_accept(accept),
    })
}

/// Checks a resume id before the stream starts: one this collection could have given, and not
/// ahead of its history (a server restarted without its data gave it; waiting until the
/// numbers catch up would show nothing for a long time, so the client is told to start over).
async fn check_resume(s: &AppState, req: &Request) -> Result<(), Refusal> {
    let Some(id) = req.resume.as_deref() else {
        return Ok(());
    };
    let server = |e: StoreError| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
    match &req.target {
        Target::Capped(c) => {
            let p: u64 = id.parse().map_err(|_| {
                bad(format!(
                    "resume_after: {id:?} is not a position of {}",
                    req.collection
                ))
            })?;
            let newest = c.bounds().await.map_err(server)?.map_or(0, |b| b.newest.0);
            if p > newest {
                return Err(bad(format!(
                    "resume_after: position {p} is ahead of {} (newest {newest}): not an id of \
                     this server's history; start without it",
                    req.collection
                )));
            }
        }
        Target::Keyed(_) => {
            let token = ResumeToken(id.to_string());
            match s.store.changes_after(&token).await {
                Ok(_) => {}
                Err(StoreError::Invalid(m)) => return Err(bad(format!("resume_after: {m}"))),
                Err(e) => return Err(server(e)),
            }
            // Tokens that are numbers (the embedded engine's) can be checked for "ahead".
            if let Ok(n) = id.parse::<u64>() {
                let newest = match s.store.newest_change().await.map_err(server)? {
                    None => Some(0),
                    Some(t) => t.0.parse::<u64>().ok(),
                };
                if let Some(newest) = newest.filter(|newest| n > *newest) {
                    return Err(bad(format!(
                        "resume_after: {id} is ahead of the change history (newest {newest}): \
                         not an id of this server's history; start without it"
                    )));
                }
            }
        }
    }
    Ok(())
}

/// Refuses, before the stream starts, what the store's server cannot serve: a keyed
/// collection's changes need change streams, and its initial documents snapshot reads.
fn check_supported(s: &AppState, req: &Request) -> Result<(), Refusal> {
    if !matches!(req.target, Target::Keyed(_)) {
        return Ok(());
    }
    let caps = s.store.capabilities();
    let mut needs = vec![Capability::ChangeStreams];
    if req.include_initial {
        needs.push(Capability::SnapshotReads);
    }
    for capability in needs {
        if let Some(reason) = caps.get(capability).reason() {
            return Err((
                StatusCode::NOT_IMPLEMENTED,
                format!(
                    "collection {} is keyed: following it needs {capability}, which the \
                     store's server does not support ({reason}); follow a capped collection \
                     ({}) instead, or run tailrace on a MongoDB replica set",
                    req.collection, "events, dead_letters"
                ),
            ));
        }
    }
    Ok(())
}

/// `GET /api/changes`.
pub(super) async fn changes(
    State(s): State<AppState>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let req = match parse(&s, &headers, query.as_deref().unwrap_or("")) {
        Ok(r) => r,
        Err((status, m)) => return error(status, m),
    };
    if let Err((status, m)) = check_supported(&s, &req) {
        return error(status, m);
    }
    if let Err((status, m)) = check_resume(&s, &req).await {
        return error(status, m);
    }
    let permit = match s.streams.admit() {
        Ok(p) => p,
        Err(refused) => return *refused,
    };
    let format = req.format;
    let body = follow::start(req, s.store.clone(), s.streams.stall, permit);
    follow::response(format, body)
}
