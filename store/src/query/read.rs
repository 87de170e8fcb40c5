//! Running a pipeline over a collection: the documents are read on the caller's runtime and
//! handed, a few at a time, to the evaluation on a blocking thread of its own, so a long
//! query never holds a runtime thread (the feeds' and the ingester's) and a full `$limit`
//! stops the reading.

use std::sync::Arc;

use futures::StreamExt;
use serde_json::Value;
use tokio::sync::mpsc;

use super::{Answer, Limits, Live, Pipeline, QueryError};
use crate::{Capped, Document, Keyed, Position, Start, StoreError, TimeSpan};

/// Documents handed over at a time: one wake-up of the evaluation per batch, not per document.
const BATCH: usize = 256;

/// Batches in flight between the reading and the evaluation.
pub(super) const IN_FLIGHT: usize = 4;

/// What a query reads.
#[derive(Clone)]
pub enum Input {
    /// The documents a capped collection retains, oldest first, each with its position as
    /// `_id` (as the MongoDB engine stores it), up to the newest when the query starts.
    Capped(Arc<dyn Capped>),
    /// A keyed collection's documents, by key: as of one moment where the engine reads
    /// in-process, as the server's own `aggregate` reads them where there is one
    /// ([`Keyed::server_query`]).
    Keyed(Arc<dyn Keyed>),
}

/// Why a query over a collection failed.
#[derive(Debug, thiserror::Error)]
pub enum AggregateError {
    /// The pipeline was refused or failed on a document (the client's to fix).
    #[error(transparent)]
    Query(#[from] QueryError),
    /// The collection could not be read.
    #[error("reading the collection: {0}")]
    Store(#[from] StoreError),
}

/// Runs `pipeline` over what `input` holds: on the collection's server as far as it evaluates
/// the stages as tailrace does ([`crate::Capped::server_query`]), the rest here.
pub async fn aggregate(
    input: Input,
    pipeline: Pipeline,
    limits: Limits,
) -> Result<Answer, AggregateError> {
    let server = match &input {
        Input::Capped(c) => c.server_query(),
        Input::Keyed(k) => k.server_query(),
    };
    if let Some(server) = server {
        // A server that cannot be probed (it refuses scratch collections) answers nothing of
        // a query: tailrace reads and evaluates all of it, as on a server without features.
        let features = match server.features().await {
            Ok(f) => Some(f),
            Err(e) if e.is_transient() => return Err(e.into()),
            Err(e) => {
                tracing::warn!(error = %e, "the server's query features could not be probed");
                None
            }
        };
        let n = features.map_or(0, |f| pipeline.server_prefix(&f));
        // A keyed collection's server also reads what it does not evaluate: it reads by key
        // with no snapshot, which a server without a replica set's snapshot reads can do.
        if n > 0 || matches!(input, Input::Keyed(_)) {
            return on_server(server.as_ref(), pipeline, n, limits).await;
        }
    }
    if let Input::Capped(c) = &input
        && let Some(g) = pipeline.grouping()
        && let Some(answer) = super::indexed::aggregate(c.clone(), &pipeline, g, limits).await?
    {
        return Ok(answer);
    }
    if let Input::Capped(c) = &input
        && let Some(g) = pipeline.time_grouping()
        && let Some(answer) = super::timed::aggregate(c.clone(), &pipeline, g, limits).await?
    {
        return Ok(answer);
    }
    let fields = pipeline.fields_read();
    let range = pipeline.received_range();
    let (tx, mut rx) = mpsc::channel::<Vec<Document>>(IN_FLIGHT);
    let eval = evaluate(move || {
        let batches = std::iter::from_fn(move || rx.blocking_recv());
        pipeline.run(batches.flatten(), limits)
    })?;
    let read = off_runtime(async move { read(input, fields.as_deref(), range, tx).await })?
        .await
        .map_err(|_| StoreError::Invalid("the query's reading stopped".into()))?;
    let answer = eval
        .await
        .map_err(|_| StoreError::Invalid("the query's evaluation stopped".into()))?;
    read?;
    Ok(answer?)
}

/// Runs a query's evaluation (or its reading, [`off_runtime`]) on a thread of its own at the
/// lowest priority, on the cores queries may use ([`super::as_query_thread`]): the ingester
/// and the feeds come first, and a long `$group` takes the time they leave.
pub(super) fn evaluate<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<tokio::sync::oneshot::Receiver<T>, StoreError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("tailrace-query".into())
        .spawn(move || {
            super::as_query_thread();
            let _ = tx.send(f());
        })
        .map_err(|e| StoreError::Invalid(format!("starting a query's thread: {e}")))?;
    Ok(rx)
}

/// Drives a query's reading on a thread of its own at the lowest priority, not on the
/// runtime's: handing a million documents to the evaluation is work per document, and on the
/// runtime's threads it delays every task woken meanwhile (a feed told of a new event).
pub(super) fn off_runtime<T: Send + 'static>(
    read: impl std::future::Future<Output = T> + Send + 'static,
) -> Result<tokio::sync::oneshot::Receiver<T>, StoreError> {
    let handle = tokio::runtime::Handle::current();
    evaluate(move || handle.block_on(read))
}

/// Runs the first `n` stages on `server` and the rest here, over what comes out.
async fn on_server(
    server: &dyn super::ServerQuery,
    pipeline: Pipeline,
    n: usize,
    limits: Limits,
) -> Result<Answer, AggregateError> {
    let started = std::time::Instant::now();
    let names = pipeline.stage_names();
    let rest = pipeline.after(n);
    let mut docs = server.run(pipeline.server_stages(n)).await?;
    let (tx, mut rx) = mpsc::channel::<Vec<Document>>(IN_FLIGHT);
    let eval = evaluate(move || {
        let batches = std::iter::from_fn(move || rx.blocking_recv());
        rest.run(batches.flatten(), limits)
    })?;
    let mut batch = Vec::with_capacity(BATCH);
    let mut failed = None;
    while let Some(doc) = docs.next().await {
        match doc {
            Ok(d) => match super::server::normalize(Value::Object(d)) {
                Value::Object(d) => batch.push(d),
                _ => unreachable!("an object normalizes to an object"),
            },
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
        if batch.len() == BATCH && !hand_over(&tx, &mut batch).await {
            break;
        }
    }
    drop(docs);
    hand_over(&tx, &mut batch).await;
    drop(tx);
    let answer = eval
        .await
        .map_err(|_| StoreError::Invalid("the query's evaluation stopped".into()))?;
    if let Some(e) = failed {
        return Err(e.into());
    }
    let mut answer = answer?;
    let from_server = answer.read;
    let mut stages: Vec<super::StageRun> = names[..n]
        .iter()
        .enumerate()
        .map(|(i, stage)| super::StageRun {
            stage,
            ran: "server",
            out: (i + 1 == n).then_some(from_server),
        })
        .collect();
    stages.append(&mut answer.stages);
    answer.stages = stages;
    answer.took_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
    Ok(answer)
}

/// Sends every document of `input`, in batches, until the evaluation stops taking them. With
/// `received` (the range of received times the first `$match` keeps), a capped collection
/// reads only the positions where such documents lie, when its engine can tell.
async fn read(
    input: Input,
    fields: Option<&[String]>,
    received: Option<(i64, i64)>,
    tx: mpsc::Sender<Vec<Document>>,
) -> Result<(), StoreError> {
    let mut batch = Vec::with_capacity(BATCH);
    match input {
        Input::Capped(c) => {
            let Some(bounds) = c.bounds().await? else {
                return Ok(());
            };
            let (first, newest) = match received {
                Some((from, to)) if from > to => return Ok(()),
                Some((from, to)) => match c.time_span(from, to).await? {
                    Some(TimeSpan::Empty) => return Ok(()),
                    Some(TimeSpan::Positions(first, last)) => {
                        (first.max(bounds.oldest), last.min(bounds.newest))
                    }
                    None => (bounds.oldest, bounds.newest),
                },
                None => (bounds.oldest, bounds.newest),
            };
            // A document's position is its `_id`: set only where the pipeline reads it.
            let with_id =
                fields.is_none_or(|f| f.iter().any(|p| p == "_id" || p.starts_with("_id.")));
            return read_range(c, first, newest, fields, with_id, tx).await;
        }
        Input::Keyed(k) => {
            let mut snapshot = k.snapshot(None).await?;
            while let Some(doc) = snapshot.docs.next().await {
                batch.push(take(Arc::new(doc?.doc), fields));
                if batch.len() == BATCH && !hand_over(&tx, &mut batch).await {
                    return Ok(());
                }
            }
        }
    }
    hand_over(&tx, &mut batch).await;
    Ok(())
}

/// Sends the documents of `c` at positions `[first, newest]` still retained, each with its
/// position as `_id` when `with_id`, in batches, until the evaluation stops taking them.
pub(super) async fn read_range(
    c: Arc<dyn Capped>,
    first: Position,
    newest: Position,
    fields: Option<&[String]>,
    with_id: bool,
    tx: mpsc::Sender<Vec<Document>>,
) -> Result<(), StoreError> {
    let mut batch = Vec::with_capacity(BATCH);
    if first > newest {
        return Ok(());
    }
    // The engine's own reading when it has one (projected, on every core), else a tail.
    let projected: Option<Arc<[String]>> = fields.map(Arc::from);
    if let Some(mut scan) = c.scan(first, newest, projected) {
        while let Some(records) = scan.next().await {
            for record in records? {
                let mut doc = take(record.doc, None);
                if with_id {
                    doc.insert("_id".to_owned(), Value::from(record.position.0));
                }
                batch.push(doc);
            }
            if batch.len() >= BATCH && !hand_over(&tx, &mut batch).await {
                return Ok(());
            }
        }
    } else {
        let oldest = c.bounds().await?.map_or(first, |b| b.oldest);
        let start = if first > oldest {
            Start::After(Position(first.0 - 1))
        } else {
            Start::Oldest
        };
        let mut tail = c.tail(start);
        while let Some(record) = tail.next().await {
            let record = record?;
            if record.position > newest {
                break;
            }
            let mut doc = take(record.doc, fields);
            if with_id {
                doc.insert("_id".to_owned(), Value::from(record.position.0));
            }
            batch.push(doc);
            let last = record.position >= newest;
            if (batch.len() == BATCH || last) && !hand_over(&tx, &mut batch).await {
                return Ok(());
            }
            if last {
                break;
            }
        }
    }
    hand_over(&tx, &mut batch).await;
    Ok(())
}

/// Reads the documents of `c` at positions `[first, last]` still retained into `live`, on a
/// query's thread (a window's worth of groups is computed there, never on the runtime's).
pub async fn load_live(
    c: Arc<dyn Capped>,
    mut live: Live,
    first: Position,
    last: Position,
) -> Result<Live, AggregateError> {
    let fields = live.fields_read();
    let (tx, mut rx) = mpsc::channel::<Vec<Document>>(IN_FLIGHT);
    let fill = evaluate(move || {
        while let Some(batch) = rx.blocking_recv() {
            for doc in batch {
                let position = doc.get("_id").and_then(Value::as_u64).unwrap_or(0);
                live.add(Position(position), &doc)?;
            }
        }
        Ok::<_, QueryError>(live)
    })?;
    let read =
        off_runtime(async move { read_range(c, first, last, fields.as_deref(), true, tx).await })?
            .await
            .map_err(|_| StoreError::Invalid("the live answer's reading stopped".into()))?;
    let live = fill
        .await
        .map_err(|_| StoreError::Invalid("the live answer's evaluation stopped".into()))?;
    read?;
    Ok(live?)
}

/// The document, or only the top-level fields the pipeline's paths start with: a document of
/// tweet-like events is mostly text no `$group` looks at, and copying it costs more than
/// evaluating the query.
fn take(doc: Arc<Document>, fields: Option<&[String]>) -> Document {
    match fields {
        Some(paths) => {
            let mut out = Document::new();
            for p in paths {
                let top = p.split('.').next().unwrap_or(p);
                if !out.contains_key(top)
                    && let Some(v) = doc.get(top)
                {
                    out.insert(top.to_owned(), v.clone());
                }
            }
            out
        }
        // Taken, not copied, when this reader holds the only reference.
        None => Arc::try_unwrap(doc).unwrap_or_else(|d| Document::clone(&d)),
    }
}

/// Sends what `batch` holds; false once the evaluation takes no more.
async fn hand_over(tx: &mpsc::Sender<Vec<Document>>, batch: &mut Vec<Document>) -> bool {
    if batch.is_empty() {
        return true;
    }
    let full = std::mem::replace(batch, Vec::with_capacity(BATCH));
    tx.send(full).await.is_ok()
}
