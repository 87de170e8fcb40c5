//! A change stream's task (see [`super::changes`]): the initial documents and states, then
//! the changes, read from the store at the client's pace and handed to the response through a
//! bounded channel; `squash` windows, `gap` events, keep-alives, and the stall timeout.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use serde_json::{Map, Value, json};
use store::{
    Capped, Change, ChangeFilter, ChangeOp, ChangeStart, Filter, Keyed, Position, Record,
    ResumeToken, Start, StoreError,
};
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tokio::time::Instant;

use super::wire::{self, Event, Format};
use ingest::telemetry as t;

/// What a stream follows.
#[derive(Clone)]
pub(super) enum Target {
    /// `events`, `dead_letters`.
    Capped(Arc<dyn Capped>),
    /// `rollups`, `stats`.
    Keyed(Arc<dyn Keyed>),
}

/// A validated request.
pub(super) struct Request {
    /// The collection's name, as asked.
    pub(super) collection: String,
    /// Its handle.
    pub(super) target: Target,
    /// `filter` (every document when absent).
    pub(super) filter: Filter,
    /// `ops` (every kind when empty).
    pub(super) ops: Vec<ChangeOp>,
    /// `include_initial`.
    pub(super) include_initial: bool,
    /// `initial_limit` (capped collections).
    pub(super) initial_limit: usize,
    /// `include_states`.
    pub(super) include_states: bool,
    /// `squash`, when above 0.
    pub(super) squash: Option<Duration>,
    /// The id to continue after: `Last-Event-ID`, else `resume_after`.
    pub(super) resume: Option<String>,
    /// SSE or NDJSON.
    pub(super) format: Format,
}

/// Writes (each one event, or the events that were ready together, up to [`BATCH_BYTES`])
/// waiting between a stream's task and its response: the most a client that stopped reading
/// costs the server, about 16 × 64 KB (besides the kernel's socket buffer and hyper's).
pub const CHANNEL_WRITES: usize = 16;
/// Events already read from the store that go out in one write with the one awaited.
const BATCH_EVENTS: usize = 64;
/// ... and the bytes after which no more are added (one event may be larger on its own).
const BATCH_BYTES: usize = 64 * 1024;
/// Keys held in one squash window; more flush the window early (bounded memory).
const SQUASH_MAX_KEYS: usize = 10_000;
/// A quiet stream sends a keep-alive this often (axum's `KeepAlive` default), so proxies and
/// the page's idle watchdog see it is alive.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// Starts the task of a validated request; returns the response body it feeds. The task holds
/// `permit` until it ends; a client that takes nothing for `stall` is cut.
pub(super) fn start(
    req: Request,
    store: Arc<dyn store::Store>,
    stall: Duration,
    permit: OwnedSemaphorePermit,
) -> Drain {
    let (format, collection) = (req.format, req.collection.clone());
    spawn(format, collection, stall, permit, move |sink| {
        async move { run(req, store, &sink).await }.boxed()
    })
}

/// Starts a stream's task, `body`, which writes to the [`Sink`] it is given; returns the
/// response body it feeds. A store error that ends `body` goes to the client as an `error`
/// event; the task holds `permit` until it ends.
pub(super) fn spawn<F>(
    format: Format,
    collection: String,
    stall: Duration,
    permit: OwnedSemaphorePermit,
    body: F,
) -> Drain
where
    F: FnOnce(Arc<Sink>) -> futures::future::BoxFuture<'static, Result<(), Stop>> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(CHANNEL_WRITES);
    let rx = Arc::new(Mutex::new(rx));
    let buffered = Arc::new(AtomicU64::new(0));
    let sink = Arc::new(Sink {
        tx,
        rx: rx.clone(),
        format,
        stall,
        buffered: buffered.clone(),
    });
    tokio::spawn(produce(collection, sink, permit, body));
    Drain { rx, buffered }
}

/// The response of a stream: `body`, with the headers every stream sends.
pub(super) fn response(format: Format, body: Drain) -> axum::response::Response {
    use axum::http::header;
    use axum::response::IntoResponse;
    (
        [
            (header::CONTENT_TYPE, format.content_type()),
            (header::CACHE_CONTROL, "no-store"),
            // Tells nginx-like proxies not to buffer the stream.
            (header::HeaderName::from_static("x-accel-buffering"), "no"),
        ],
        axum::body::Body::from_stream(body),
    )
        .into_response()
}

/// The response's end of a stream's channel. Counts the buffered bytes down as it takes
/// them, and on drop (the client went away) for what it never took.
///
/// The receiver is shared with the stream's task, which empties it when it cuts a stalled
/// client: hyper polls a body only when it can write, so a client that reads nothing would
/// otherwise keep those events in memory until it closes its connection.
pub(super) struct Drain {
    rx: Arc<Mutex<mpsc::Receiver<Bytes>>>,
    buffered: Arc<AtomicU64>,
}

impl Drain {
    /// Closes the channel and counts out (and frees) whatever is still queued.
    fn empty(rx: &Mutex<mpsc::Receiver<Bytes>>, buffered: &AtomicU64) {
        if let Ok(mut rx) = rx.lock() {
            rx.close();
            while let Ok(b) = rx.try_recv() {
                buffered.fetch_sub(b.len() as u64, Ordering::Relaxed);
                t::stream_buffered(-(b.len() as f64));
            }
        }
    }
}

impl futures::Stream for Drain {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        let Ok(mut rx) = self.rx.lock() else {
            return std::task::Poll::Ready(None);
        };
        let polled = rx.poll_recv(cx);
        drop(rx);
        polled.map(|b| {
            b.map(|b| {
                self.buffered.fetch_sub(b.len() as u64, Ordering::Relaxed);
                t::stream_buffered(-(b.len() as f64));
                Ok(b)
            })
        })
    }
}

impl Drop for Drain {
    fn drop(&mut self) {
        Drain::empty(&self.rx, &self.buffered);
    }
}

/// Why a stream's task stops.
pub(super) enum Stop {
    /// The client went away (or never read within the stall timeout): nothing to tell it.
    Client,
    /// The store failed: the client gets an `error` event.
    Store(StoreError),
}

impl From<StoreError> for Stop {
    fn from(e: StoreError) -> Self {
        Stop::Store(e)
    }
}

/// The task's end of the channel.
pub(super) struct Sink {
    tx: mpsc::Sender<Bytes>,
    /// The response's end, emptied when the client is cut for stalling.
    rx: Arc<Mutex<mpsc::Receiver<Bytes>>>,
    format: Format,
    stall: Duration,
    buffered: Arc<AtomicU64>,
}

impl Sink {
    async fn bytes(&self, bytes: Bytes) -> Result<(), Stop> {
        let n = bytes.len();
        self.buffered.fetch_add(n as u64, Ordering::Relaxed);
        t::stream_buffered(n as f64);
        match tokio::time::timeout(self.stall, self.tx.send(bytes)).await {
            Ok(Ok(())) => Ok(()),
            // The bytes were never queued: count them out again.
            Ok(Err(_)) => {
                self.buffered.fetch_sub(n as u64, Ordering::Relaxed);
                t::stream_buffered(-(n as f64));
                Err(Stop::Client)
            }
            Err(_) => {
                self.buffered.fetch_sub(n as u64, Ordering::Relaxed);
                t::stream_buffered(-(n as f64));
                self.stalled();
                Err(Stop::Client)
            }
        }
    }

    pub(super) async fn send(&self, event: &Event) -> Result<(), Stop> {
        self.bytes(event.encode(self.format)).await
    }

    pub(super) async fn keep_alive(&self, id: Option<&str>) -> Result<(), Stop> {
        self.bytes(wire::keep_alive(self.format, id)).await
    }

    /// Resolves when the client has gone away (the response was dropped).
    pub(super) async fn closed(&self) {
        self.tx.closed().await;
    }

    /// Whether the client has not taken the events already queued.
    fn is_full(&self) -> bool {
        self.tx.capacity() == 0
    }

    /// Waits until the client took something (at most the stall timeout).
    async fn room(&self) -> Result<(), Stop> {
        match tokio::time::timeout(self.stall, self.tx.reserve()).await {
            Ok(Ok(_permit)) => Ok(()),
            Ok(Err(_)) => Err(Stop::Client),
            Err(_) => {
                self.stalled();
                Err(Stop::Client)
            }
        }
    }

    /// The client accepted nothing for the stall timeout: counted, logged, and what is queued
    /// for it freed.
    fn stalled(&self) {
        t::StreamStalled {
            after: self.stall,
            buffered: self.buffered.load(Ordering::Relaxed),
        }
        .emit();
        Drain::empty(&self.rx, &self.buffered);
    }
}

fn state(name: &str) -> Event {
    let mut data = Map::new();
    data.insert("state".into(), Value::from(name));
    Event::new("state", data)
}

fn object(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// A capped collection's document as an `initial` or `change` event.
fn record_event(kind: &'static str, collection: &str, r: Record) -> Event {
    let key = r.position.0.to_string();
    let mut data = r.into_json(collection);
    if kind == "change" {
        // A capped collection only ever inserts.
        data.insert("op".into(), Value::from("insert"));
    }
    Event::new(kind, data).with_id(key)
}

/// A keyed collection's change as a `change` event, its token as the id.
fn change_event(c: Change) -> Event {
    let id = c.token.0.clone();
    Event::new("change", c.into_json()).with_id(id)
}

/// What the stream follows, and from where it (re)opens.
enum Cursor {
    Capped {
        coll: Arc<dyn Capped>,
        filter: Filter,
        start: Start,
    },
    Keyed {
        coll: Arc<dyn Keyed>,
        filter: ChangeFilter,
        start: ChangeStart,
        /// How far the open change stream has read (past changes its filter skipped).
        read_up_to: Option<Arc<Mutex<Option<ResumeToken>>>>,
    },
}

/// One entry of an open cursor: the key squashing coalesces on, and the event.
type Entry = (String, Event);

impl Cursor {
    fn open(&mut self, collection: &str) -> BoxStream<'static, Result<Entry, StoreError>> {
        match self {
            Cursor::Capped {
                coll,
                filter,
                start,
            } => {
                let name = collection.to_string();
                coll.tail_matching(*start, filter.clone())
                    .map(move |r| {
                        r.map(|r| {
                            let e = record_event("change", &name, r);
                            (e.id.clone().unwrap_or_default(), e)
                        })
                    })
                    .boxed()
            }
            Cursor::Keyed {
                coll,
                filter,
                start,
                read_up_to,
            } => {
                let s = coll.changes(filter.clone(), start.clone());
                *read_up_to = Some(s.resume_cell());
                s.map(|c| c.map(|c| (c.key.clone(), change_event(c))))
                    .boxed()
            }
        }
    }

    /// After `PositionLost` / `HistoryLost`: the `gap` event saying what was lost, and the
    /// cursor moved to continue from the oldest retained entry. `None` for other errors.
    fn after_gap(&mut self, e: &StoreError) -> Option<Event> {
        let data = match (self, e) {
            (Cursor::Capped { start, .. }, StoreError::PositionLost { after, oldest, .. }) => {
                // Just before the oldest, not `Start::Oldest`: if more is evicted before the
                // tail reopens, that is another gap, reported as exactly as this one.
                *start = Start::After(Position(oldest.0.saturating_sub(1)));
                json!({
                    "reason": "position_lost",
                    "after": after.0.to_string(),
                    "oldest": oldest.0.to_string(),
                    "missed": oldest.0.saturating_sub(after.0 + 1),
                    "resume": "oldest",
                })
            }
            (Cursor::Keyed { start, .. }, StoreError::HistoryLost { token, oldest }) => {
                *start = ChangeStart::Oldest;
                // Numeric tokens (the embedded engine's op log) tell how many entries went.
                let missed = token
                    .0
                    .parse::<u64>()
                    .ok()
                    .zip(oldest.0.parse::<u64>().ok())
                    .map(|(a, o)| o.saturating_sub(a + 1));
                json!({
                    "reason": "history_lost",
                    "after": token.0,
                    "oldest": oldest.0,
                    "missed": missed,
                    "resume": "oldest",
                })
            }
            _ => return None,
        };
        Some(Event::new("gap", object(data)))
    }

    /// Notes an entry read from the open stream, so a re-open continues after it.
    fn read(&mut self, event: &Event) {
        if let (Cursor::Capped { start, .. }, Some(p)) = (
            self,
            event.id.as_deref().and_then(|id| id.parse::<u64>().ok()),
        ) {
            *start = Start::After(Position(p));
        }
    }

    /// Before the open stream is dropped: a re-open continues after everything it read,
    /// including (keyed) the entries its filter skipped.
    fn suspend(&mut self) {
        if let Cursor::Keyed {
            start, read_up_to, ..
        } = self
            && let Some(t) = read_up_to
                .take()
                .and_then(|cell| cell.lock().ok().and_then(|t| t.clone()))
        {
            *start = ChangeStart::After(t);
        }
    }

    /// Where the stream has read to, when that is past the last event sent (a keyed stream
    /// whose filter skipped entries).
    fn read_up_to(&self) -> Option<String> {
        match self {
            Cursor::Keyed {
                read_up_to: Some(cell),
                ..
            } => cell
                .lock()
                .ok()
                .and_then(|t| t.as_ref().map(|t| t.0.clone())),
            _ => None,
        }
    }
}

/// A stream's task: the initial documents and states, then the changes, until the client goes
/// away or the store fails. Holds the stream's permit.
async fn produce<F>(collection: String, sink: Arc<Sink>, permit: OwnedSemaphorePermit, body: F)
where
    F: FnOnce(Arc<Sink>) -> futures::future::BoxFuture<'static, Result<(), Stop>>,
{
    let _open = t::StreamOpen::new(&collection);
    match body(sink.clone()).await {
        Ok(()) | Err(Stop::Client) => {}
        // The store is closing (the server stops): the client reconnects to the next one.
        Err(Stop::Store(StoreError::Closed)) => {}
        Err(Stop::Store(e)) => {
            t::Problem {
                component: "change_streams",
                error_type: "store_read",
                detail: &format!("a change stream of {collection} failed: {e}"),
            }
            .warn();
            let mut data = Map::new();
            data.insert("error".into(), Value::from(e.to_string()));
            let _ = sink.send(&Event::new("error", data)).await;
        }
    }
    drop(permit);
}

async fn run(req: Request, store: Arc<dyn store::Store>, sink: &Sink) -> Result<(), Stop> {
    let mut last_id: Option<String> = req.resume.clone();
    let states = req.include_states || req.include_initial;
    let mut cursor = match &req.target {
        Target::Capped(coll) => {
            let start = match req.resume.as_deref().map(str::parse::<u64>) {
                Some(Ok(p)) => Start::After(Position(p)),
                // Checked before the stream started.
                Some(Err(_)) => return Err(StoreError::Invalid("resume id".into()).into()),
                None => {
                    if req.include_states {
                        sink.send(&state("initializing")).await?;
                    }
                    let start = if req.include_initial {
                        let newest = coll.newest_matching(&req.filter, req.initial_limit).await?;
                        let start = newest.continue_from();
                        for r in newest.records.into_iter().rev() {
                            let e = record_event("initial", &req.collection, r);
                            last_id.clone_from(&e.id);
                            sink.send(&e).await?;
                        }
                        start
                    } else {
                        // An explicit position, so `ready` can carry it as an id.
                        match coll.bounds().await? {
                            Some(b) => Start::After(b.newest),
                            None => Start::Oldest,
                        }
                    };
                    if states {
                        let mut ready = state("ready");
                        if let Start::After(p) = start {
                            ready = ready.with_id(p.0.to_string());
                            last_id = Some(p.0.to_string());
                        }
                        sink.send(&ready).await?;
                    }
                    start
                }
            };
            Cursor::Capped {
                coll: coll.clone(),
                filter: req.filter.clone(),
                start,
            }
        }
        Target::Keyed(coll) => {
            let start = match &req.resume {
                Some(t) => ChangeStart::After(ResumeToken(t.clone())),
                None => {
                    if req.include_states {
                        sink.send(&state("initializing")).await?;
                    }
                    let token = if req.include_initial {
                        let snapshot = coll.snapshot(Some(req.filter.clone())).await?;
                        let mut docs = snapshot.docs;
                        while let Some(d) = docs.next().await {
                            let d = d?;
                            let data = object(json!({
                                "collection": req.collection,
                                "key": d.key,
                                "doc": d.doc,
                            }));
                            sink.send(&Event::new("initial", data)).await?;
                        }
                        Some(snapshot.token)
                    } else {
                        store.newest_change().await?
                    };
                    if states {
                        let mut ready = state("ready");
                        if let Some(t) = &token {
                            ready = ready.with_id(t.0.clone());
                            last_id = Some(t.0.clone());
                        }
                        sink.send(&ready).await?;
                    }
                    // No change ever: from the beginning is exactly "after now".
                    token.map_or(ChangeStart::Oldest, ChangeStart::After)
                }
            };
            Cursor::Keyed {
                coll: coll.clone(),
                filter: ChangeFilter {
                    collections: Vec::new(),
                    ops: req.ops.clone(),
                    key_prefix: None,
                    filter: Some(req.filter.clone()),
                    // A client gets each change's old value too (`old_val`).
                    post_images_only: false,
                },
                start,
                read_up_to: None,
            }
        }
    };
    if req.resume.is_some() && req.include_states {
        // Resumed: the changes continue at once; a client waiting for `ready` gets it.
        sink.send(&state("ready")).await?;
    }
    follow(&req, &mut cursor, sink, last_id).await
}

/// Changes of one key within a window, sent once as the latest (RethinkDB's `squash`), in the
/// order of each key's latest change: a client that receives a prefix of the window and
/// resumes after the last id it got misses nothing (every earlier change it did not get is
/// superseded by a later one that follows).
#[derive(Default)]
struct Squash {
    /// Slots in arrival order of each key's latest event; superseded ones are `None`.
    slots: Vec<Option<Event>>,
    /// Key → its slot.
    index: HashMap<String, usize>,
    /// When the window closes; `None` while it is empty.
    deadline: Option<Instant>,
}

impl Squash {
    fn push(&mut self, key: String, event: Event, window: Duration) {
        if let Some(old) = self.index.insert(key, self.slots.len()) {
            self.slots[old] = None;
        }
        self.slots.push(Some(event));
        self.deadline.get_or_insert_with(|| Instant::now() + window);
    }

    fn full(&self) -> bool {
        self.index.len() >= SQUASH_MAX_KEYS
    }

    fn take(&mut self) -> Vec<Event> {
        self.index.clear();
        self.deadline = None;
        self.slots.drain(..).flatten().collect()
    }

    async fn due(&self) {
        match self.deadline {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    }
}

/// Follows the cursor: each change to the client (through the squash window, if any), a gap
/// event and a re-open when history was lost, keep-alives while quiet.
///
/// The store stream is dropped whenever the client's channel is full, and re-opened from
/// where it was once there is room: a reader waiting for a slow client holds nothing of the
/// store (the embedded engine keeps every commit a live reader has not taken yet, up to its
/// hub's capacity; a MongoDB cursor holds server resources).
async fn follow(
    req: &Request,
    cursor: &mut Cursor,
    sink: &Sink,
    mut last_id: Option<String>,
) -> Result<(), Stop> {
    let mut squash = Squash::default();
    let mut keep_alive = tokio::time::interval_at(Instant::now() + KEEP_ALIVE, KEEP_ALIVE);
    keep_alive.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut open: Option<BoxStream<'static, Result<Entry, StoreError>>> = None;
    loop {
        if sink.is_full() {
            cursor.suspend();
            open = None;
            sink.room().await?;
        }
        let stream = open.get_or_insert_with(|| cursor.open(&req.collection));
        tokio::select! {
            biased;
            _ = sink.closed() => return Err(Stop::Client),
            item = stream.next() => {
                // What else is ready now goes out with it, as one write: at a high rate one
                // chunk carries many events; at a low rate nothing waits for company.
                let mut out = BytesMut::new();
                let mut count = 0;
                let mut next = Some(item);
                while let Some(item) = next.take() {
                    match item {
                        Some(Ok((key, event))) => {
                            cursor.read(&event);
                            count += 1;
                            match req.squash {
                                Some(window) => squash.push(key, event, window),
                                None => {
                                    last_id.clone_from(&event.id);
                                    event.encode_into(sink.format, &mut out);
                                }
                            }
                        }
                        Some(Err(e)) => {
                            open = None;
                            // What was read before the loss is still sent, in order.
                            if !out.is_empty() {
                                sink.bytes(out.split().freeze()).await?;
                            }
                            flush(&mut squash, sink, &mut last_id).await?;
                            let Some(gap) = cursor.after_gap(&e) else {
                                return Err(e.into());
                            };
                            t::StreamGap { collection: &req.collection, detail: &gap.data }.emit();
                            sink.send(&gap).await?;
                            break;
                        }
                        None => return Err(StoreError::Closed.into()),
                    }
                    if count < BATCH_EVENTS && out.len() < BATCH_BYTES && !squash.full() {
                        next = stream.next().now_or_never();
                    }
                }
                if !out.is_empty() {
                    sink.bytes(out.freeze()).await?;
                    keep_alive.reset();
                }
                // Also here: a busy stream is always ready, and `biased` would never get to
                // the deadline branch below.
                if squash.full() || squash.deadline.is_some_and(|d| Instant::now() >= d) {
                    cursor.suspend();
                    open = None;
                    flush(&mut squash, sink, &mut last_id).await?;
                }
            }
            _ = squash.due() => {
                cursor.suspend();
                open = None;
                flush(&mut squash, sink, &mut last_id).await?;
                keep_alive.reset();
            }
            _ = keep_alive.tick() => {
                // Move the client's resume point past skipped entries, unless squashed
                // changes before that point are still to be sent.
                let read = cursor.read_up_to().filter(|r| {
                    squash.deadline.is_none() && last_id.as_deref() != Some(r.as_str())
                });
                if read.is_some() {
                    last_id.clone_from(&read);
                }
                // A full channel means the client is not reading: no keep-alive needed.
                if !sink.is_full() {
                    sink.keep_alive(read.as_deref()).await?;
                }
            }
        }
    }
}

/// Sends a squash window's events (the store stream is closed meanwhile, see [`follow`]).
async fn flush(squash: &mut Squash, sink: &Sink, last_id: &mut Option<String>) -> Result<(), Stop> {
    for event in squash.take() {
        last_id.clone_from(&event.id);
        sink.send(&event).await?;
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn ev(key: &str, id: u64) -> (String, Event) {
        let data = object(json!({"key": key, "n": id}));
        (
            key.to_string(),
            Event::new("change", data).with_id(id.to_string()),
        )
    }

    #[test]
    fn squash_keeps_each_keys_latest_in_the_order_of_the_latest() {
        let mut s = Squash::default();
        let w = Duration::from_millis(100);
        for (k, id) in [("a", 1), ("b", 2), ("a", 3), ("c", 4), ("b", 5)] {
            let (key, e) = ev(k, id);
            s.push(key, e, w);
        }
        let out: Vec<String> = s.take().into_iter().map(|e| e.id.unwrap()).collect();
        assert_eq!(
            out,
            vec!["3", "4", "5"],
            "a's latest (3), then c (4), then b's latest (5): ids increase, so a client that \
             got a prefix resumes after it without missing a key's final state"
        );
        assert!(s.deadline.is_none() && s.index.is_empty(), "a new window");
    }

    #[test]
    fn a_full_window_is_flushed_early() {
        let mut s = Squash::default();
        for i in 0..SQUASH_MAX_KEYS {
            let (key, e) = ev(&format!("k{i}"), i as u64);
            s.push(key, e, Duration::from_secs(1));
        }
        assert!(s.full(), "as many keys as the bound");
        assert_eq!(s.take().len(), SQUASH_MAX_KEYS);
    }

    #[test]
    fn gaps_say_what_was_lost_and_where_the_stream_continues() {
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let store = store::embedded::EmbeddedStore::open(
                dir.path(),
                store::embedded::EmbeddedOptions::default(),
            )
            .unwrap();
            use store::Store;
            let coll = store
                .capped(
                    "c",
                    &store::CappedSpec {
                        max_docs: 10,
                        max_bytes: 1 << 20,
                        indexes: vec![],
                    },
                )
                .await
                .unwrap();
            let mut c = Cursor::Capped {
                coll,
                filter: Filter::match_all(),
                start: Start::After(Position(3)),
            };
            let lost = StoreError::PositionLost {
                collection: "c".into(),
                after: Position(3),
                oldest: Position(10),
            };
            let gap = c.after_gap(&lost).unwrap();
            assert_eq!(gap.kind, "gap");
            assert_eq!(
                Value::Object(gap.data),
                json!({"reason": "position_lost", "after": "3", "oldest": "10", "missed": 6,
                       "resume": "oldest"})
            );
            assert!(
                matches!(
                    c,
                    Cursor::Capped {
                        start: Start::After(Position(9)),
                        ..
                    }
                ),
                "continues right before the oldest retained"
            );
            assert!(c.after_gap(&StoreError::Closed).is_none());
            store.close().await.unwrap();
        });
    }
}
