//! `GET /api/aggregate?live=true`: a `$group` (after at most one `$match`) over a capped
//! collection's window, answered once and then kept: a `snapshot` event holds every group, and
//! a `change` event follows for each group that an arriving or evicted document moves (its new
//! document, or `null` when it left the answer). The window's oldest position is read after
//! each batch of arrivals and every second, so evictions come with the arrivals that caused
//! them, or within a second.
//!
//! | parameter | meaning |
//! |---|---|
//! | `live` | `true` (required: `POST /api/aggregate` answers once) |
//! | `collection` | `events` or `dead_letters` |
//! | `pipeline` | the pipeline, JSON (URL-encoded) |
//! | `resume_after` | an id this stream gave (the `Last-Event-ID` header wins) |
//!
//! The last event of each batch carries the id `<newest>.<oldest>`: the positions of the
//! window its groups cover once it is applied. A
//! client that reconnects with the id of the last event it applied gets the changes since, as
//! long as the oldest document of that window is still stored (the groups are computed again
//! over it, then moved by what happened since); otherwise a new `snapshot`, which replaces
//! everything. Either way the client's groups equal a query from scratch
//! (`store::query::Live`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use futures::{FutureExt, StreamExt};
use serde_json::{Map, Value, json};
use store::query::{Limits, Live, Pipeline, QueryError, load_live};
use store::{Capped, Position, Start, StoreError};

use super::follow::{Sink, Stop, response, spawn};
use super::wire::{Event, Format};
use super::{AppState, error};

/// The parameters the live answer knows.
const PARAMETERS: &str = "live, collection, pipeline, resume_after";
/// How often the window's oldest position is read, to let evicted documents go.
const EVICTION_CHECK: Duration = Duration::from_secs(1);
/// A quiet stream sends a keep-alive this often.
const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// Documents taken from the tail at once: their groups move on a blocking thread together.
const BATCH: usize = 256;

struct Request {
    collection: String,
    target: Arc<dyn Capped>,
    pipeline: Pipeline,
    resume: Option<(u64, u64)>,
    format: Format,
}

fn parse(s: &AppState, headers: &HeaderMap, query: &str) -> Result<Request, String> {
    let mut params: HashMap<String, String> = HashMap::new();
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        if !PARAMETERS.split(", ").any(|p| p == k) {
            return Err(format!("unknown parameter {k:?}; known: {PARAMETERS}"));
        }
        if params.insert(k.to_string(), v.to_string()).is_some() {
            return Err(format!("{k}: given twice"));
        }
    }
    if !matches!(
        params.get("live").map(String::as_str),
        Some("true" | "1" | "")
    ) {
        return Err(
            "live: GET /api/aggregate follows a live answer (live=true); POST /api/aggregate \
             answers once"
                .into(),
        );
    }
    let collection = params
        .get("collection")
        .cloned()
        .unwrap_or_else(|| "events".into());
    let target = match collection.as_str() {
        "events" => s.events.clone(),
        "dead_letters" => s.dead_letters.clone(),
        other => {
            return Err(format!(
                "collection: {other:?} cannot be followed live (events, dead_letters can; \
                 rollups, stats and trends are themselves kept live: follow them with \
                 /api/changes)"
            ));
        }
    };
    let text = params.get("pipeline").ok_or(
        "pipeline: required, e.g. [{\"$group\": {\"_id\": \"$lang\", \"n\": {\"$sum\": 1}}}]",
    )?;
    let pipeline = Pipeline::parse_text(text).map_err(|e| format!("pipeline{}", at(&e)))?;
    // Refused now, with the stage named, rather than in the stream.
    Live::new(&pipeline, s.query).map_err(|e| format!("pipeline{}", at(&e)))?;
    let resume = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| params.get("resume_after").cloned())
        .filter(|r| !r.is_empty())
        .map(|id| {
            parse_id(&id).ok_or_else(|| {
                format!("resume_after: {id:?} is not an id this stream gives (<newest>.<oldest>)")
            })
        })
        .transpose()?;
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    Ok(Request {
        collection,
        target,
        pipeline,
        resume,
        format: Format::from_accept(accept),
    })
}

fn at(e: &QueryError) -> String {
    if e.path.is_empty() {
        format!(": {}", e.message)
    } else {
        format!(" at {e}")
    }
}

fn parse_id(id: &str) -> Option<(u64, u64)> {
    let (newest, oldest) = id.split_once('.')?;
    let (newest, oldest) = (newest.parse().ok()?, oldest.parse().ok()?);
    (oldest <= newest + 1).then_some((newest, oldest))
}

/// `GET /api/aggregate`.
pub(super) async fn aggregate(
    State(s): State<AppState>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let req = match parse(&s, &headers, query.as_deref().unwrap_or("")) {
        Ok(r) => r,
        Err(m) => return error(StatusCode::BAD_REQUEST, m),
    };
    let permit = match s.streams.admit() {
        Ok(p) => p,
        Err(refused) => return *refused,
    };
    let format = req.format;
    let limits = s.query;
    let body = spawn(
        format,
        req.collection.clone(),
        s.streams.stall,
        permit,
        move |sink| async move { follow(req, limits, &sink).await }.boxed(),
    );
    response(format, body)
}

/// Where a live answer stands: the window `[oldest, newest]` its groups cover.
struct Stand {
    live: Live,
    oldest: u64,
    /// `None` before the collection's first document.
    newest: Option<u64>,
}

impl Stand {
    fn id(&self) -> Option<String> {
        self.newest.map(|n| format!("{n}.{}", self.oldest))
    }
}

fn query_stop(e: QueryError) -> Stop {
    Stop::Store(StoreError::Invalid(format!("the live answer stopped: {e}")))
}

async fn follow(req: Request, limits: Limits, sink: &Sink) -> Result<(), Stop> {
    let c = req.target.clone();
    let mut resume = req.resume;
    loop {
        let mut stand = start(&c, &req.pipeline, limits, resume.take(), sink).await?;
        match keep(&c, &mut stand, sink).await {
            // Overtaken by eviction (a client far behind): start again from a snapshot.
            Err(Stop::Store(e)) if e.is_position_lost() => continue,
            other => return other,
        }
    }
}

/// The groups to start from: the client's window when it is still stored (and the changes
/// since its id), else the window now, sent as a `snapshot`.
async fn start(
    c: &Arc<dyn Capped>,
    pipeline: &Pipeline,
    limits: Limits,
    resume: Option<(u64, u64)>,
    sink: &Sink,
) -> Result<Stand, Stop> {
    let live = Live::new(pipeline, limits).map_err(query_stop)?;
    let bounds = c.bounds().await?;
    if let (Some((newest, oldest)), Some(b)) = (resume, bounds)
        && oldest >= b.oldest.0
        && newest <= b.newest.0
    {
        let live = load_live(c.clone(), live, Position(oldest), Position(newest))
            .await
            .map_err(aggregate_stop)?;
        let mut stand = Stand {
            live,
            oldest,
            newest: Some(newest),
        };
        evict(c, &mut stand, sink).await?;
        return Ok(stand);
    }
    let mut stand = match bounds {
        Some(b) => Stand {
            live: load_live(c.clone(), live, b.oldest, b.newest)
                .await
                .map_err(aggregate_stop)?,
            oldest: b.oldest.0,
            newest: Some(b.newest.0),
        },
        None => Stand {
            live,
            oldest: 0,
            newest: None,
        },
    };
    let (live, docs) = tokio::task::spawn_blocking(move || {
        let docs = stand.live.snapshot();
        (stand.live, docs)
    })
    .await
    .map_err(|e| Stop::Store(StoreError::Invalid(format!("the snapshot stopped: {e}"))))?;
    stand.live = live;
    let docs = docs.map_err(query_stop)?;
    let mut data = Map::new();
    data.insert("position".into(), json!(stand.newest));
    data.insert("docs".into(), Value::Array(docs));
    let mut event = Event::new("snapshot", data);
    if let Some(id) = stand.id() {
        event = event.with_id(id);
    }
    sink.send(&event).await?;
    Ok(stand)
}

fn aggregate_stop(e: store::query::AggregateError) -> Stop {
    match e {
        store::query::AggregateError::Store(e) => Stop::Store(e),
        store::query::AggregateError::Query(e) => query_stop(e),
    }
}

/// Follows the collection from the stand: each document taken moves its group.
async fn keep(c: &Arc<dyn Capped>, stand: &mut Stand, sink: &Sink) -> Result<(), Stop> {
    let start = stand
        .newest
        .map_or(Start::Oldest, |n| Start::After(Position(n)));
    let mut tail = c.tail(start);
    let mut check = tokio::time::interval(EVICTION_CHECK);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut quiet_since = tokio::time::Instant::now();
    loop {
        tokio::select! {
            r = tail.next() => {
                let Some(first) = r else { return Ok(()) };
                let mut records = vec![first?];
                while records.len() < BATCH
                    && let Some(Some(r)) = tail.next().now_or_never()
                {
                    records.push(r?);
                }
                let newest = records.last().map(|r| r.position.0);
                stand.newest = newest.or(stand.newest);
                // What this batch's appends evicted goes in the same changes.
                let evicted = oldest_now(c, stand).await?;
                move_groups(stand, records, evicted, sink).await?;
                quiet_since = tokio::time::Instant::now();
            }
            _ = check.tick() => {
                if evict(c, stand, sink).await? {
                    quiet_since = tokio::time::Instant::now();
                } else if quiet_since.elapsed() >= KEEP_ALIVE {
                    sink.keep_alive(stand.id().as_deref()).await?;
                    quiet_since = tokio::time::Instant::now();
                }
            }
            _ = sink.closed() => return Ok(()),
        }
    }
}

/// An empty live answer, held while the real one is on a blocking thread.
fn placeholder() -> Live {
    let group = Pipeline::parse_text(r#"[{"$group": {"_id": null}}]"#);
    Live::new(&group.unwrap_or_else(|_| unreachable!()), Limits::default())
        .unwrap_or_else(|_| unreachable!("a $group alone is kept live"))
}

/// Adds `records` to `live` and lets the documents before `evicted` go: the groups that
/// moved, each with its answer.
fn take(
    live: &mut Live,
    records: Vec<store::Record>,
    evicted: Option<Position>,
) -> Result<Vec<store::query::GroupChange>, QueryError> {
    let mut moved: Vec<String> = Vec::new();
    for r in records {
        if evicted.is_some_and(|o| r.position < o) {
            continue;
        }
        let mut doc = store::Document::clone(&r.doc);
        doc.insert("_id".into(), Value::from(r.position.0));
        if let Some(key) = live.add(r.position, &doc)? {
            moved.push(key);
        }
    }
    if let Some(oldest) = evicted {
        moved.extend(live.evict_before(oldest));
    }
    let mut seen = std::collections::HashSet::new();
    moved.retain(|k| seen.insert(k.clone()));
    moved.iter().map(|k| live.change(k)).collect()
}

/// The window's oldest position when it moved past the stand's (never past its newest
/// document and one), recorded in the stand.
async fn oldest_now(c: &Arc<dyn Capped>, stand: &mut Stand) -> Result<Option<Position>, Stop> {
    let Some(b) = c.bounds().await? else {
        return Ok(None);
    };
    let limit = stand.newest.map_or(0, |n| n + 1);
    let oldest = b.oldest.0.min(limit);
    if oldest <= stand.oldest {
        return Ok(None);
    }
    stand.oldest = oldest;
    Ok(Some(Position(oldest)))
}

/// Lets evicted documents go: whether any group moved.
async fn evict(c: &Arc<dyn Capped>, stand: &mut Stand, sink: &Sink) -> Result<bool, Stop> {
    let Some(oldest) = oldest_now(c, stand).await? else {
        return Ok(false);
    };
    move_groups(stand, Vec::new(), Some(oldest), sink).await
}

/// Takes `records` and lets the documents before `evicted` go ([`take`], on a blocking
/// thread: each moved group is computed again), then sends the changes: whether any group
/// moved.
async fn move_groups(
    stand: &mut Stand,
    records: Vec<store::Record>,
    evicted: Option<Position>,
    sink: &Sink,
) -> Result<bool, Stop> {
    let live = std::mem::replace(&mut stand.live, placeholder());
    let (live, changes) = tokio::task::spawn_blocking(move || {
        let mut live = live;
        let changes = take(&mut live, records, evicted);
        (live, changes)
    })
    .await
    .map_err(|e| Stop::Store(StoreError::Invalid(format!("the live answer stopped: {e}"))))?;
    stand.live = live;
    let changes = changes.map_err(query_stop)?;
    let any = !changes.is_empty();
    send_changes(stand, changes, sink).await?;
    Ok(any)
}

/// Sends `changes`, the last with the stand's id: a client that resumes after any of them
/// gets them all again (each change is the group's whole document, so a change applied twice
/// is applied once), never only some.
async fn send_changes(
    stand: &Stand,
    changes: Vec<store::query::GroupChange>,
    sink: &Sink,
) -> Result<(), Stop> {
    let id = stand.id();
    let n = changes.len();
    for (i, change) in changes.into_iter().enumerate() {
        let mut data = Map::new();
        data.insert("_id".into(), change.key);
        data.insert("doc".into(), change.doc.unwrap_or(Value::Null));
        let mut event = Event::new("change", data);
        if i + 1 == n
            && let Some(id) = &id
        {
            event = event.with_id(id.clone());
        }
        sink.send(&event).await?;
    }
    Ok(())
}
