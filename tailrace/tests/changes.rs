//! `/api/changes` through the real binary: initial documents and changes exactly once under
//! concurrent writes (capped and keyed), filters and their 400s, `squash`, resuming by
//! `Last-Event-ID` across a restart, `gap` after lost history, a client that stops reading,
//! the stream limit, `tailrace tail --collection`, live aggregates, and the smaller routes that
//! came with them (ids on the per-feed stream, paged rollups, the page's files).
//!
//! The store side of the same promises (both engines) is in `store/tests/contract/`.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::time::{Duration, Instant};

use common::Tailrace;
use futures::{StreamExt, TryStreamExt};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::codec::{FramedRead, LinesCodec};
use tokio_util::io::StreamReader;

/// How long one event may take to arrive.
const WAIT: Duration = Duration::from_secs(20);

fn sources(rate: f64) -> String {
    format!(r#"[{{ name = "sample", kind = "synthetic", rate_per_sec = {rate:.1}, seed = 5 }}]"#)
}

fn encode(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// One event as the client sees it, from either format.
#[derive(Clone, Debug)]
struct Ev {
    kind: String,
    id: Option<String>,
    data: Value,
}

impl Ev {
    fn seq(&self) -> u64 {
        self.data["doc"]["_tailrace"]["seq"]
            .as_u64()
            .unwrap_or_else(|| panic!("an event with a stamp; saw {self:?}"))
    }
}

/// A client of `/api/changes`: NDJSON or SSE, every read under [`WAIT`].
struct Client {
    lines: FramedRead<
        StreamReader<
            futures::stream::BoxStream<'static, std::io::Result<bytes::Bytes>>,
            bytes::Bytes,
        >,
        LinesCodec,
    >,
    sse: bool,
    url: String,
}

/// Opens a stream; panics (with the body) unless it answers 200.
async fn open(t: &Tailrace, query: &str, sse: bool, last_event_id: Option<&str>) -> Client {
    open_at(t, &format!("/api/changes?{query}"), sse, last_event_id).await
}

async fn open_at(t: &Tailrace, path: &str, sse: bool, last_event_id: Option<&str>) -> Client {
    let url = format!("http://{}{path}", t.addr);
    let mut req = ingest::source::http::client()
        .build()
        .unwrap()
        .get(&url)
        .header(
            "accept",
            if sse {
                "text/event-stream"
            } else {
                "application/x-ndjson"
            },
        );
    if let Some(id) = last_event_id {
        req = req.header("last-event-id", id);
    }
    let resp = tokio::time::timeout(WAIT, req.send())
        .await
        .expect("the stream answers in time")
        .expect("the request is sent");
    let status = resp.status();
    if !status.is_success() {
        let body = resp.text().await.unwrap_or_default();
        panic!("GET {url} -> {status}: {body}\n{}", t.report());
    }
    let ct = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let want = if sse {
        "text/event-stream"
    } else {
        "application/x-ndjson"
    };
    assert_eq!(ct, want, "content type of {url}");
    let body = resp.bytes_stream().map_err(std::io::Error::other).boxed();
    Client {
        lines: FramedRead::new(
            StreamReader::new(body),
            LinesCodec::new_with_max_length(64 << 20),
        ),
        sse,
        url,
    }
}

impl Client {
    async fn line(&mut self, deadline: tokio::time::Instant) -> Option<String> {
        match tokio::time::timeout_at(deadline, self.lines.next()).await {
            Ok(Some(Ok(l))) => Some(l),
            Ok(Some(Err(e))) => panic!("{}: reading: {e}", self.url),
            Ok(None) => None,
            Err(_) => panic!("{}: no event within {WAIT:?}", self.url),
        }
    }

    /// The next event (keep-alives and id-only blocks skipped), within [`WAIT`] however many
    /// keep-alives arrive; `None` when the stream ended.
    async fn next(&mut self) -> Option<Ev> {
        let deadline = tokio::time::Instant::now() + WAIT;
        if !self.sse {
            loop {
                let line = self.line(deadline).await?;
                if line.is_empty() {
                    continue;
                }
                let mut v: Value = serde_json::from_str(&line).unwrap();
                let kind = v["type"].as_str().unwrap().to_string();
                if kind == "checkpoint" {
                    continue;
                }
                let id = v["id"].as_str().map(str::to_string);
                let m = v.as_object_mut().unwrap();
                m.remove("type");
                m.remove("id");
                return Some(Ev { kind, id, data: v });
            }
        }
        let (mut kind, mut id, mut data) = (String::from("message"), None, None::<String>);
        loop {
            let line = self.line(deadline).await?;
            if line.is_empty() {
                if let Some(d) = data.take() {
                    return Some(Ev {
                        kind,
                        id,
                        data: serde_json::from_str(&d).unwrap(),
                    });
                }
                (kind, id) = (String::from("message"), None);
                continue;
            }
            if line.starts_with(':') {
                continue;
            }
            let (field, value) = line.split_once(": ").unwrap_or((&line, ""));
            match field {
                "id" => id = Some(value.to_string()),
                "event" => kind = value.to_string(),
                "data" => data = Some(value.to_string()),
                _ => {}
            }
        }
    }

    /// The next event, which must exist.
    async fn expect(&mut self) -> Ev {
        let url = self.url.clone();
        self.next()
            .await
            .unwrap_or_else(|| panic!("{url}: the stream ended"))
    }
}

/// Waits until the pipeline has written at least `n` events.
async fn written(t: &Tailrace, n: u64) {
    t.wait_until(
        &format!("{n} events written"),
        Duration::from_secs(60),
        async |t| t.json("/api/status").await["ingest"]["written"].as_u64() >= Some(n),
    )
    .await;
}

/// The newest `initial_limit` events, `ready`, then every later event: ids strictly increase
/// and the source's sequence numbers are contiguous from the first initial event on, while
/// the pipeline writes 400 events a second (no gap, no duplicate between initial and changes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capped_initial_then_changes_exactly_once_under_writes() {
    let dir = tempfile::tempdir().unwrap();
    let t = Tailrace::start(dir.path(), &[("TAILRACE_SOURCES", &sources(400.0))]).await;
    written(&t, 300).await;
    let mut c = open(
        &t,
        "collection=events&include_initial=true&initial_limit=100",
        true,
        None,
    )
    .await;
    let mut initial = Vec::new();
    let ready = loop {
        let e = c.expect().await;
        match e.kind.as_str() {
            "initial" => initial.push(e),
            "state" => break e,
            other => panic!("before ready only initial events; saw {other}: {e:?}"),
        }
    };
    assert_eq!(initial.len(), 100, "initial_limit=100 of 300+ events");
    assert_eq!(ready.data, json!({"state": "ready"}));
    assert_eq!(
        ready.id, initial[99].id,
        "ready carries the position the changes continue after"
    );
    let mut all = initial;
    while all.len() < 500 {
        let e = c.expect().await;
        assert_eq!(e.kind, "change", "after ready only changes; saw {e:?}");
        assert_eq!(e.data["op"], json!("insert"));
        all.push(e);
    }
    let ids: Vec<u64> = all
        .iter()
        .map(|e| e.id.as_ref().unwrap().parse().unwrap())
        .collect();
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "ids strictly increase across initial and changes: {ids:?}"
    );
    for (e, id) in all.iter().zip(&ids) {
        assert_eq!(e.data["key"], json!(id.to_string()), "key = id = position");
    }
    let seqs: Vec<u64> = all.iter().map(Ev::seq).collect();
    let first = seqs[0];
    assert_eq!(
        seqs,
        (first..first + 500).collect::<Vec<_>>(),
        "every event exactly once from the first initial one on"
    );
}

/// A keyed snapshot, `ready` with its token, then the changes: the `source:sample` rollup's
/// counter continues exactly from its snapshot value, one per event, while events arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_snapshot_then_changes_exactly_once_under_writes() {
    let dir = tempfile::tempdir().unwrap();
    let t = Tailrace::start(dir.path(), &[("TAILRACE_SOURCES", &sources(400.0))]).await;
    written(&t, 200).await;
    let filter = encode(r#"{"_id": "source:sample"}"#);
    let mut c = open(
        &t,
        &format!("collection=rollups&include_initial=true&include_states=true&filter={filter}"),
        false,
        None,
    )
    .await;
    let first = c.expect().await;
    assert_eq!(
        (first.kind.as_str(), &first.data),
        ("state", &json!({"state": "initializing"}))
    );
    let snap = c.expect().await;
    assert_eq!(snap.kind, "initial", "{snap:?}");
    assert_eq!(
        snap.id, None,
        "a snapshot document is no place to resume from"
    );
    assert_eq!(snap.data["key"], json!("source:sample"));
    let ready = c.expect().await;
    assert_eq!(ready.kind, "state");
    assert_eq!(ready.data, json!({"state": "ready"}));
    assert!(ready.id.is_some(), "ready carries the snapshot's token");
    let mut count = snap.data["doc"]["count"].as_u64().unwrap();
    let mut seq = snap.data["doc"]["_tailrace"]["seq"].as_u64().unwrap();
    for _ in 0..300 {
        let e = c.expect().await;
        assert_eq!(e.kind, "change", "{e:?}");
        assert_eq!(e.data["op"], json!("update"));
        let n = e.data["doc"]["count"].as_u64().unwrap();
        assert_eq!(
            n,
            count + 1,
            "the change after count {count} must be {}, saw {n}: a gap or a duplicate between \
             snapshot and changes",
            count + 1
        );
        assert_eq!(
            e.data["before"]["count"],
            json!(count),
            "with its pre-image"
        );
        let s = e.data["doc"]["_tailrace"]["seq"].as_u64().unwrap();
        assert_eq!(s, seq + 1, "the stamped sequence follows too");
        (count, seq) = (n, s);
    }
}

/// Filters narrow (on the server), `ops` selects kinds of change, and every mistake is a 400
/// that names the parameter (a filter's names its place), before any event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_ops_and_refusals() {
    let dir = tempfile::tempdir().unwrap();
    let t = Tailrace::start(dir.path(), &[("TAILRACE_SOURCES", &sources(300.0))]).await;
    written(&t, 100).await;
    let f = encode(r#"{"lang": "ja", "retweet_count": {"$gte": 0}}"#);
    let mut c = open(
        &t,
        &format!("collection=events&filter={f}&include_initial=true&initial_limit=10"),
        false,
        None,
    )
    .await;
    let mut n = 0;
    while n < 40 {
        let e = c.expect().await;
        if e.kind == "state" {
            continue;
        }
        assert_eq!(e.data["doc"]["lang"], json!("ja"), "only lang ja: {e:?}");
        n += 1;
    }
    // ops on a keyed collection: the counters of known keys are updates, never inserts.
    let mut up = open(&t, "collection=rollups&ops=update", false, None).await;
    for _ in 0..50 {
        let e = up.expect().await;
        assert_eq!(e.data["op"], json!("update"), "{e:?}");
    }

    let refusals = [
        (
            "collection=events&filter=%7B%22n%22%3A%7B%22%24regex%22%3A%22x%22%7D%7D",
            "filter at n.$regex:",
        ),
        (
            "collection=events&filter=%7B",
            "filter at top level: not valid JSON",
        ),
        ("collection=nope", "collection: \"nope\" is not one of"),
        ("", "collection: required"),
        (
            "collection=events&ops=update",
            "ops: events is a capped collection",
        ),
        (
            "collection=rollups&ops=upsert",
            "ops: \"upsert\" is not one of",
        ),
        ("collection=events&bogus=1", "unknown parameter \"bogus\""),
        ("collection=events&initial_limit=5000", "initial_limit:"),
        (
            "collection=stats&initial_limit=5",
            "initial_limit: applies to capped",
        ),
        ("collection=events&squash=fast", "squash:"),
        (
            "collection=events&include_initial=maybe",
            "include_initial:",
        ),
        (
            "collection=events&resume_after=abc",
            "resume_after: \"abc\" is not a position",
        ),
        (
            "collection=events&resume_after=99999999",
            "resume_after: position 99999999 is ahead",
        ),
        ("collection=rollups&resume_after=xyz", "resume_after:"),
        (
            "collection=rollups&resume_after=99999999999",
            "resume_after: 99999999999 is ahead",
        ),
    ];
    for (query, want) in refusals {
        let (status, body) = t.get(&format!("/api/changes?{query}")).await;
        assert_eq!(status, 400, "{query} -> {status} {body}");
        let msg = serde_json::from_str::<Value>(&body).unwrap()["error"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(msg.contains(want), "{query}: expected {want:?} in {msg:?}");
    }
}

/// `squash=<ms>`: a key's changes within the window arrive once, as the latest; the window
/// never holds back the final state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn squash_sends_each_key_once_per_window_as_the_latest() {
    let dir = tempfile::tempdir().unwrap();
    let t = Tailrace::start(dir.path(), &[("TAILRACE_SOURCES", &sources(300.0))]).await;
    written(&t, 50).await;
    let filter = encode(r#"{"_id": {"$in": ["source:sample", "lang:en", "lang:ja"]}}"#);
    let mut c = open(
        &t,
        &format!("collection=rollups&squash=700&filter={filter}"),
        false,
        None,
    )
    .await;
    let started = Instant::now();
    let mut arrivals: BTreeMap<String, Vec<(Instant, u64)>> = BTreeMap::new();
    while started.elapsed() < Duration::from_secs(4) {
        let e = c.expect().await;
        let key = e.data["key"].as_str().unwrap().to_string();
        let count = e.data["doc"]["count"].as_u64().unwrap();
        arrivals
            .entry(key)
            .or_default()
            .push((Instant::now(), count));
    }
    let sample = &arrivals["source:sample"];
    assert!(
        (3..=8).contains(&sample.len()),
        "about one change of source:sample per 700 ms window in 4 s; saw {}",
        sample.len()
    );
    for (key, seen) in &arrivals {
        for w in seen.windows(2) {
            assert!(
                w[1].0 - w[0].0 >= Duration::from_millis(600),
                "{key}: two changes {:?} apart, within one window",
                w[1].0 - w[0].0
            );
            assert!(
                w[1].1 > w[0].1,
                "{key}: the latest count each time: {seen:?}"
            );
        }
    }
    let jumps: Vec<u64> = sample.windows(2).map(|w| w[1].1 - w[0].1).collect();
    assert!(
        jumps.iter().all(|j| *j > 50),
        "300 events/s: a window coalesces ~200 updates of source:sample; saw jumps {jumps:?}"
    );
}

/// A client that read some events, then the server stops (SIGTERM) and starts again on the same
/// data: `Last-Event-ID` continues exactly after the last event it got (capped: the next
/// sequence number; keyed: the next counter value).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_event_id_resumes_exactly_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let env = [("TAILRACE_SOURCES", sources(300.0))];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut t = Tailrace::start(dir.path(), &env).await;
    written(&t, 50).await;
    let filter = encode(r#"{"_id": "source:sample"}"#);
    let keyed_query = format!("collection=rollups&filter={filter}");
    let mut events = open(&t, "collection=events", true, None).await;
    let mut rollups = open(&t, &keyed_query, true, None).await;
    let mut last_event = events.expect().await;
    for _ in 0..40 {
        last_event = events.expect().await;
    }
    let mut last_rollup = rollups.expect().await;
    for _ in 0..40 {
        last_rollup = rollups.expect().await;
    }
    drop((events, rollups));
    t.stop().await;

    let t = Tailrace::start(dir.path(), &env).await;
    let mut events = open(&t, "collection=events", true, last_event.id.as_deref()).await;
    let next = events.expect().await;
    assert_eq!(next.kind, "change", "{next:?}");
    assert_eq!(
        next.seq(),
        last_event.seq() + 1,
        "the event right after id {:?}, across the restart",
        last_event.id
    );
    let mut rollups = open(&t, &keyed_query, true, last_rollup.id.as_deref()).await;
    let next = rollups.expect().await;
    assert_eq!(
        next.data["doc"]["count"].as_u64().unwrap(),
        last_rollup.data["doc"]["count"].as_u64().unwrap() + 1,
        "the change right after token {:?}, across the restart",
        last_rollup.id
    );
}

/// A client whose id fell out of the retained history gets a `gap` saying what was lost, then
/// the stream continues from the oldest entry (capped: evicted positions; keyed: the op log).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_behind_the_retained_history_gets_a_gap() {
    let dir = tempfile::tempdir().unwrap();
    let t = Tailrace::start(
        dir.path(),
        &[
            ("TAILRACE_SOURCES", &sources(500.0)),
            ("TAILRACE_STORE__EVENTS__MAX_DOCS", "200"),
            ("TAILRACE_STORE__OPLOG_MAX_ENTRIES", "1000"),
        ],
    )
    .await;
    written(&t, 600).await;
    let mut c = open(&t, "collection=events&resume_after=5", false, None).await;
    let gap = c.expect().await;
    assert_eq!(gap.kind, "gap", "{gap:?}");
    assert_eq!(gap.data["reason"], json!("position_lost"));
    assert_eq!(gap.data["after"], json!("5"));
    let oldest: u64 = gap.data["oldest"].as_str().unwrap().parse().unwrap();
    assert!(
        oldest > 6,
        "positions up to 5 and beyond were evicted; oldest {oldest}"
    );
    assert_eq!(gap.data["missed"], json!(oldest - 6));
    let next = c.expect().await;
    if next.kind == "change" {
        assert_eq!(
            next.id,
            Some(oldest.to_string()),
            "the stream continues exactly at the oldest retained position"
        );
    } else {
        assert_eq!(
            next.kind, "gap",
            "evicted again before the re-open: {next:?}"
        );
    }

    // The op log keeps 1000 entries; 600 events made well over 2000 rollup changes.
    let mut k = open(&t, "collection=rollups&resume_after=1", false, None).await;
    let gap = k.expect().await;
    assert_eq!(gap.kind, "gap", "{gap:?}");
    assert_eq!(gap.data["reason"], json!("history_lost"));
    assert_eq!(gap.data["after"], json!("1"));
    assert!(gap.data["missed"].as_u64().unwrap() > 0, "{gap:?}");
    let next = k.expect().await;
    assert_eq!(next.kind, "change", "then the changes go on: {next:?}");
}

/// The resident memory of the server's process (Linux), in bytes.
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// A client that sends its request and never reads: the server reads the store for it only as
/// fast as it takes bytes (so its buffer stays a few events, however much is written), its
/// memory does not grow with what the client leaves unread, and after the stall timeout the
/// stream is cut and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_does_not_grow_the_servers_memory() {
    let dir = tempfile::tempdir().unwrap();
    // 4,000 events of ~24 KB (every script and emoji): ~96 MB the client will never read.
    // That many so that what a process starved of CPU holds in flight for everyone (~30 MB
    // beside two busy loops, whether 2,000 or 4,000 events go by: freed pages the allocator
    // keeps for its purge delay, batches under way) stays below the half allowed; a server
    // keeping what the client leaves unread would grow by all of it.
    let path = dir.path().join("big.ndjson");
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
        let phrase = "東京の雨 🦀🚀 مرحبا שלום नमस्ते Ünïcödé ";
        for i in 0..4000 {
            let text: String = phrase.repeat(24_000 / phrase.len());
            let doc = json!({"n": i, "lang": "und", "text": text, "user": {"screen_name": format!("ユーザー{i}")}});
            writeln!(f, "{doc}").unwrap();
        }
    }
    let sources = format!(
        r#"[{{ name = "big", kind = "file", path = "{}", pace = "rate", rate_per_sec = 250.0, follow = true }}]"#,
        path.display()
    );
    let t = Tailrace::start(
        dir.path(),
        &[
            ("TAILRACE_SOURCES", &sources),
            ("TAILRACE_HTTP__STREAM_STALL_TIMEOUT_MS", "4000"),
            ("TAILRACE_STORE__DURABILITY", "acknowledged"),
        ],
    )
    .await;
    let mut sock = tokio::net::TcpStream::connect(t.addr).await.unwrap();
    sock.write_all(
        format!(
            "GET /api/changes?collection=events&include_initial=true HTTP/1.1\r\nHost: {}\r\n\r\n",
            t.addr
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    // Read only the response head, so the stream is known to be open; then read nothing.
    let mut head = [0u8; 256];
    let n = tokio::time::timeout(WAIT, sock.read(&mut head))
        .await
        .unwrap()
        .unwrap();
    assert!(
        head[..n].starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head[..n])
    );
    let rss_start = rss_bytes(t.pid());
    let mut max_buffered = 0.0f64;
    let mut max_rss = rss_start;
    let mut stalled;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let m = t.metrics().await;
        max_buffered = max_buffered.max(m.sum("tailrace_change_streams_buffered_bytes", &[]));
        max_rss = max_rss.max(rss_bytes(t.pid()));
        stalled = m.sum("tailrace_change_streams_stalled_total", &[]);
        let done = t.json("/api/status").await["ingest"]["written"].as_u64() == Some(4000);
        if done && stalled >= 1.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not every event written and the stream cut within 60 s (stalled {stalled})\n{}",
            t.report()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let unread = 4000.0 * 24_000.0;
    eprintln!(
        "silent client: at most {max_buffered} bytes buffered; resident memory {} MB at the start, \
         {} MB at the peak; {} MB left unread",
        rss_start >> 20,
        max_rss >> 20,
        unread as u64 >> 20
    );
    assert!(
        max_buffered <= 16.0 * (64.0 + 40.0) * 1024.0,
        "the server buffered at most its channel of 16 writes (64 KB, or one event) for the \
         silent client; saw {max_buffered} bytes of {unread} unread"
    );
    let grew = max_rss.saturating_sub(rss_start);
    assert!(
        (grew as f64) < unread / 2.0,
        "resident memory grew {} MB while the client left {} MB unread (start {} MB, peak {} MB)",
        grew >> 20,
        unread as u64 >> 20,
        rss_start >> 20,
        max_rss >> 20
    );
    assert_eq!(
        stalled, 1.0,
        "the silent stream was cut after the stall timeout"
    );
    t.wait_until(
        "the cut stream's gauges back to zero",
        Duration::from_secs(10),
        async |t| {
            let m = t.metrics().await;
            m.sum("tailrace_change_streams_open", &[]) == 0.0
                && m.sum("tailrace_change_streams_buffered_bytes", &[]) == 0.0
        },
    )
    .await;
}

/// `http.max_streams`: one more stream than allowed is a 503 that says why (with
/// Retry-After); when one closes, a new one is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_beyond_max_streams_get_503() {
    let dir = tempfile::tempdir().unwrap();
    let t = Tailrace::start(
        dir.path(),
        &[
            ("TAILRACE_SOURCES", &sources(50.0)),
            ("TAILRACE_HTTP__MAX_STREAMS", "2"),
        ],
    )
    .await;
    let a = open(&t, "collection=events", false, None).await;
    let _b = open(&t, "collection=stats", true, None).await;
    let client = ingest::source::http::client().build().unwrap();
    for path in ["/api/changes?collection=rollups", "/api/feeds/tail/stream"] {
        let resp =
            tokio::time::timeout(WAIT, client.get(format!("http://{}{path}", t.addr)).send())
                .await
                .unwrap()
                .unwrap();
        assert_eq!(resp.status().as_u16(), 503, "{path}: a third stream");
        assert_eq!(
            resp.headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok()),
            Some("1")
        );
        let body: Value = serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
        assert!(
            body["error"]
                .as_str()
                .unwrap()
                .contains("2 are open, the most http.max_streams allows"),
            "{body}"
        );
    }
    let refused = t
        .metrics()
        .await
        .sum("tailrace_change_streams_refused_total", &[]);
    assert_eq!(refused, 2.0);
    drop(a);
    t.wait_until(
        "a closed stream's permit is returned",
        Duration::from_secs(10),
        async |t| t.metrics().await.sum("tailrace_change_streams_open", &[]) < 2.0,
    )
    .await;
    let mut c = open(&t, "collection=events", false, None).await;
    assert_eq!(c.expect().await.kind, "change");
}

/// `tailrace tail --collection`: initial documents then changes, filtered, one NDJSON line
/// each with its id; and the per-feed stream, `/api/rollups` pages and the page's files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_cli_feed_ids_rollup_pages_and_page_files() {
    let dir = tempfile::tempdir().unwrap();
    let t = Tailrace::start(dir.path(), &[("TAILRACE_SOURCES", &sources(300.0))]).await;
    written(&t, 100).await;

    let mut tail = tokio::process::Command::new(env!("CARGO_BIN_EXE_tailrace"))
        .args([
            "tail",
            "--collection",
            "events",
            "--filter",
            r#"{"lang": "en"}"#,
            "--include-initial",
            "--initial-limit",
            "5",
            "--url",
            &format!("http://{}", t.addr),
        ])
        .env_remove("TAILRACE_CONFIG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut out = FramedRead::new(tail.stdout.take().unwrap(), LinesCodec::new());
    let mut lines = Vec::new();
    while lines.len() < 15 {
        let line = tokio::time::timeout(WAIT, out.next())
            .await
            .expect("tailrace tail prints within the timeout")
            .expect("tailrace tail keeps running")
            .unwrap();
        lines.push(serde_json::from_str::<Value>(&line).unwrap());
    }
    tail.kill().await.unwrap();
    let kinds: Vec<&str> = lines.iter().map(|l| l["type"].as_str().unwrap()).collect();
    assert_eq!(&kinds[..5], ["initial"; 5], "{kinds:?}");
    assert!(kinds[5..].iter().all(|k| *k == "change"), "{kinds:?}");
    assert!(
        lines
            .iter()
            .all(|l| l["doc"]["lang"] == json!("en") && l["id"].is_string()),
        "filtered, each with its id: {lines:?}"
    );

    // The per-feed stream: every event has the feed's position as its id.
    let resp = ingest::source::http::client()
        .build()
        .unwrap()
        .get(format!("http://{}/api/feeds/tail/stream", t.addr))
        .send()
        .await
        .unwrap();
    let body = resp.bytes_stream().map_err(std::io::Error::other).boxed();
    let mut feed = Client {
        lines: FramedRead::new(StreamReader::new(body), LinesCodec::new()),
        sse: true,
        url: "/api/feeds/tail/stream".into(),
    };
    let e = feed.expect().await;
    assert_eq!(
        e.id.as_deref().map(str::to_string),
        e.data["position"].as_u64().map(|p| p.to_string()),
        "{e:?}"
    );
    // ... and the record's own fields written as /api/changes writes them (store::wire).
    assert_eq!(e.data["collection"], json!("events"), "{e:?}");
    assert_eq!(e.data["key"].as_str(), e.id.as_deref(), "{e:?}");
    assert!(e.data["doc"].is_object(), "{e:?}");
    let key = e.data["key"].as_str().unwrap().to_string();
    let same = t.json(&format!("/api/events/{key}")).await;
    assert_eq!(e.data["doc"], same["doc"], "the same document either way");

    // /api/rollups in pages of 3: no key twice, in order, the Link header to the next page.
    // The pipeline runs on meanwhile and may add a language: the pages hold every key that
    // existed before the first page and none that did not exist after the last.
    let all_keys = |v: Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|d| d["_id"].as_str().unwrap().to_string())
            .collect()
    };
    let before = all_keys(t.json("/api/rollups?prefix=lang:&limit=10000").await);
    let client = ingest::source::http::client().build().unwrap();
    let mut next = Some("/api/rollups?prefix=lang:&limit=3".to_string());
    let mut keys: Vec<String> = Vec::new();
    while let Some(path) = next.take() {
        let resp = client
            .get(format!("http://{}{path}", t.addr))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200, "{path}");
        next = resp
            .headers()
            .get("link")
            .and_then(|v| v.to_str().ok())
            .and_then(|l| l.strip_prefix('<'))
            .and_then(|l| l.split_once(">; rel=\"next\""))
            .map(|(u, _)| u.to_string());
        let page: Vec<Value> = serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
        assert!(page.len() <= 3);
        keys.extend(page.iter().map(|d| d["_id"].as_str().unwrap().to_string()));
        assert!(keys.len() < 1000, "pages end");
    }
    let after = all_keys(t.json("/api/rollups?prefix=lang:&limit=10000").await);
    assert!(before.len() > 3, "several languages: {before:?}");
    assert!(
        keys.windows(2).all(|w| w[0] < w[1]),
        "in order, no key twice: {keys:?}"
    );
    assert!(
        before.iter().all(|k| keys.contains(k)) && keys.iter().all(|k| after.contains(k)),
        "the pages together are the whole prefix: {keys:?}, before {before:?}, after {after:?}"
    );
    let (status, body) = t.get("/api/rollups?limit=0").await;
    assert_eq!(status, 400, "{body}");

    // The page's files, with the types browsers require.
    for (path, ctype) in [
        ("/", "text/html; charset=utf-8"),
        ("/assets/app.js", "text/javascript; charset=utf-8"),
        ("/assets/sse.js", "text/javascript; charset=utf-8"),
        (
            "/assets/vendor/uPlot.iife.min.js",
            "text/javascript; charset=utf-8",
        ),
        ("/assets/style.css", "text/css; charset=utf-8"),
        ("/assets/vendor/uPlot.min.css", "text/css; charset=utf-8"),
    ] {
        let resp = client
            .get(format!("http://{}{path}", t.addr))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200, "{path}");
        assert_eq!(
            resp.headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok()),
            Some(ctype),
            "{path}"
        );
        assert!(!resp.bytes().await.unwrap().is_empty(), "{path}");
    }
    let (status, _) = t.get("/assets/../Cargo.toml").await;
    assert_eq!(status, 404);
}

/// Applies a live answer's events to `groups` (by `_id`): a snapshot replaces them all, a
/// change replaces or removes one; until an event carries the id `until`. Returns the kinds of
/// the events applied.
async fn apply_live(
    client: &mut Client,
    groups: &mut BTreeMap<String, Value>,
    until: &str,
) -> Vec<String> {
    let mut kinds = Vec::new();
    loop {
        let ev = client.expect().await;
        kinds.push(ev.kind.clone());
        match ev.kind.as_str() {
            "snapshot" => {
                groups.clear();
                for d in ev.data["docs"].as_array().unwrap() {
                    groups.insert(d["_id"].to_string(), d.clone());
                }
            }
            "change" => {
                let key = ev.data["_id"].to_string();
                match &ev.data["doc"] {
                    Value::Null => groups.remove(&key),
                    d => groups.insert(key, d.clone()),
                };
            }
            other => panic!("a live answer sent {other}: {ev:?}"),
        }
        if ev.id.as_deref() == Some(until) {
            return kinds;
        }
    }
}

async fn ask(t: &Tailrace, pipeline: Value) -> Vec<Value> {
    let body = json!({"collection": "events", "pipeline": pipeline}).to_string();
    let resp = ingest::source::http::client()
        .build()
        .unwrap()
        .post(format!("http://{}/api/aggregate", t.addr))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let answer: Value = serde_json::from_str(&resp.text().await.unwrap()).unwrap();
    answer["docs"].as_array().unwrap().clone()
}

/// The window now, as a live answer's id names it (`<newest>.<oldest>`), and the groups a
/// query from scratch answers over it.
async fn from_scratch(t: &Tailrace, group: &Value) -> (String, BTreeMap<String, Value>) {
    let bounds = ask(
        t,
        json!([{"$group": {"_id": null, "lo": {"$min": "$_id"}, "hi": {"$max": "$_id"}}}]),
    )
    .await;
    let (hi, lo) = (&bounds[0]["hi"], &bounds[0]["lo"]);
    let id = format!("{hi}.{lo}");
    // Over exactly that window, whatever arrives meanwhile.
    let window = json!({"$match": {"_id": {"$gte": lo, "$lte": hi}}});
    let groups = ask(t, json!([window, group]))
        .await
        .into_iter()
        .map(|d| (d["_id"].to_string(), d))
        .collect();
    (id, groups)
}

/// Appends `n` events to the file a `file` source follows, numbered from `from`.
fn append_events(path: &std::path::Path, from: u64, n: u64) {
    let langs = ["ja", "en", "ar", "🌍", "und", "pt"];
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    for i in from..from + n {
        let e = json!({"id": i, "lang": langs[(i * i % 6) as usize], "user": {"followers_count": (i * 7919 % 1000) as f64 / 7.0}});
        writeln!(f, "{e}").unwrap();
    }
}

/// A live `$group` over a capped window: the groups a client holds after applying the events
/// up to the window's id equal a query from scratch, as documents arrive and as they are
/// evicted. A client that reconnects with its last id gets the changes since, with no new
/// snapshot, across a crash and restart too, while the window it covered is still stored; once part of
/// it was evicted, a new snapshot. A pipeline that cannot be kept live is a 400 naming its
/// stage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_group_equals_a_query_from_scratch_across_reconnects() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("events.ndjson");
    append_events(&file, 0, 1_000);
    let sources = format!(
        r#"[{{ name = "f", kind = "file", path = "{}", follow = true }}]"#,
        file.display()
    );
    let env = [
        ("TAILRACE_SOURCES", sources.as_str()),
        ("TAILRACE_STORE__EVENTS__MAX_DOCS", "3000"),
    ];
    let data = dir.path().join("data");
    let mut t = Tailrace::start(&data, &env).await;
    written(&t, 1_000).await;

    let group = json!({"$group": {"_id": "$lang", "n": {"$sum": 1}, "first": {"$first": "$id"}, "followers": {"$avg": "$user.followers_count"}}});
    let path = format!(
        "/api/aggregate?live=true&collection=events&pipeline={}",
        encode(&json!([{"$match": {"id": {"$gte": 0}}}, group]).to_string())
    );
    let mut groups = BTreeMap::new();
    let mut client = open_at(&t, &path, true, None).await;
    let (id, want) = from_scratch(&t, &group).await;
    assert_eq!(
        apply_live(&mut client, &mut groups, &id).await,
        ["snapshot"]
    );
    assert_eq!(groups, want, "at {id}");
    let only_changes = |kinds: &[String]| kinds.iter().all(|k| k == "change");

    // Reconnected with the last id: changes only, from where it was.
    drop(client);
    append_events(&file, 1_000, 500);
    written(&t, 1_500).await;
    let mut client = open_at(&t, &path, true, Some(&id)).await;
    let (id, want) = from_scratch(&t, &group).await;
    let kinds = apply_live(&mut client, &mut groups, &id).await;
    assert!(only_changes(&kinds), "{kinds:?}");
    assert_eq!(groups, want, "after a reconnect, at {id}");

    // Across a crash too: SIGKILL, events appended meanwhile, a restart.
    drop(client);
    t.signal("KILL");
    t.wait_exit(Duration::from_secs(15)).await;
    append_events(&file, 1_500, 500);
    let mut t = Tailrace::start(&data, &env).await;
    written(&t, 500).await;
    let mut client = open_at(&t, &path, true, Some(&id)).await;
    let (id, want) = from_scratch(&t, &group).await;
    let kinds = apply_live(&mut client, &mut groups, &id).await;
    assert!(only_changes(&kinds), "{kinds:?}");
    assert_eq!(groups, want, "after a crash and a restart, at {id}");

    // A thousand past the window's bound: the oldest thousand leave it, and their groups move.
    append_events(&file, 2_000, 2_000);
    written(&t, 2_500).await;
    let (id, want) = from_scratch(&t, &group).await;
    assert!(id.ends_with(".1001"), "{id}");
    let kinds = apply_live(&mut client, &mut groups, &id).await;
    assert!(kinds.len() >= 6 && only_changes(&kinds), "{kinds:?}");
    assert_eq!(groups, want, "at {id}, after evictions");

    // Gone for longer than the window it held stays stored: a new snapshot.
    drop(client);
    append_events(&file, 4_000, 100);
    written(&t, 2_600).await;
    let mut client = open_at(&t, &path, true, Some(&id)).await;
    let (id, want) = from_scratch(&t, &group).await;
    assert_eq!(
        apply_live(&mut client, &mut groups, &id).await,
        ["snapshot"]
    );
    assert_eq!(groups, want, "at {id}, after a snapshot");
    drop(client);

    // Only a $group after at most one $match is kept live.
    let sorted = encode(&json!([group, {"$sort": {"n": -1}}]).to_string());
    let (status, body) = t
        .get(&format!("/api/aggregate?live=true&pipeline={sorted}"))
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("[1].$sort"), "{body}");
    t.stop().await;
}
