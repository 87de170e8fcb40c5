//! Sources resume where they stopped, across restarts and crashes of the whole pipeline: the
//! position a source reports with each record is stored with the event it became (in the same
//! document, so in the same commit), and a restarted source continues right after the newest
//! stored one.
//!
//! Before: the file source read its file from the beginning again (every line stored twice,
//! under new sequence numbers) and the http source forgot its last event id.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use common::Tailrace;
use futures::StreamExt;
use serde_json::Value;
use store::embedded::{EmbeddedOptions, EmbeddedStore};
use store::{CappedSpec, Stamp, Start, Store};

/// Every stored event: (its `line` field, its stamp), in position order.
async fn stored(dir: &Path) -> Vec<(u64, Stamp)> {
    let store = EmbeddedStore::open(dir, EmbeddedOptions::default()).unwrap();
    let spec = CappedSpec {
        max_docs: 100_000,
        max_bytes: 67_108_864,
        indexes: vec![],
    };
    let events = store.capped("events", &spec).await.unwrap();
    let mut out = Vec::new();
    if let Some(b) = events.bounds().await.unwrap() {
        let mut tail = events.tail(Start::Oldest);
        while let Some(r) = tokio::time::timeout(Duration::from_secs(30), tail.next())
            .await
            .unwrap()
        {
            let r = r.unwrap();
            let line = r.doc.get("line").and_then(Value::as_u64).unwrap();
            out.push((line, Stamp::of(&r.doc).unwrap()));
            if r.position >= b.newest {
                break;
            }
        }
    }
    store.close().await.unwrap();
    out
}

fn acked(m: &common::Metrics, source: &str) -> u64 {
    m.one("tailrace_source_last_acked_seq", &[("source", source)])
        .unwrap_or(0.0) as u64
}

/// Asserts that `lines` holds each of 1..=n exactly once, in order, with sequence numbers
/// 1..=n (no hole, no repeat: nothing re-read, nothing skipped).
fn exactly_once(events: &[(u64, Stamp)], n: u64) {
    let lines: Vec<u64> = events.iter().map(|(l, _)| *l).collect();
    let seqs: Vec<u64> = events.iter().map(|(_, s)| s.seq).collect();
    let mut counts: BTreeMap<u64, u32> = BTreeMap::new();
    for l in &lines {
        *counts.entry(*l).or_default() += 1;
    }
    let twice: Vec<u64> = counts
        .iter()
        .filter(|(_, c)| **c > 1)
        .map(|(l, _)| *l)
        .collect();
    let missing: Vec<u64> = (1..=n).filter(|l| !counts.contains_key(l)).collect();
    assert!(
        twice.is_empty() && missing.is_empty(),
        "each line exactly once: {} stored twice (first {:?}), {} missing (first {:?})",
        twice.len(),
        twice.first(),
        missing.len(),
        missing.first()
    );
    assert_eq!(lines, (1..=n).collect::<Vec<_>>(), "in file order");
    assert_eq!(
        seqs,
        (1..=n).collect::<Vec<_>>(),
        "sequence numbers without hole"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_replay_killed_twice_stores_each_line_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let file = dir.path().join("replay.ndjson");
    let n: u64 = 30_000;
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&file).unwrap());
        for i in 1..=n {
            writeln!(
                f,
                r#"{{"line":{i},"text":"ligne {i} — 東京 🦀 مرحبا","タイトル":"ページ","ключ":{{"deep":[1,2]}}}}"#
            )
            .unwrap();
        }
    }
    let sources = format!(
        r#"[{{ name = "replay", kind = "file", path = "{}", pace = "rate", rate_per_sec = 4000.0 }}]"#,
        file.display()
    );
    let env = [
        ("TAILRACE_SOURCES", sources.as_str()),
        ("TAILRACE_STORE__DURABILITY", "journaled"),
    ];
    // Two crashes at different points, then a run to the end.
    for (round, at_least) in [(1, 2_000), (2, 12_000)] {
        let t = Tailrace::start(&data, &env).await;
        t.wait_until(
            &format!("round {round}: {at_least} events acknowledged"),
            Duration::from_secs(120),
            async |t| acked(&t.metrics().await, "replay") >= at_least,
        )
        .await;
        let before_kill = acked(&t.metrics().await, "replay");
        t.signal("KILL");
        drop(t);
        let now = stored(&data).await;
        assert!(
            now.len() as u64 >= before_kill,
            "round {round}: {before_kill} acknowledged before the kill, {} stored",
            now.len()
        );
        assert!(
            (now.len() as u64) < n,
            "round {round}: killed before the end ({} of {n})",
            now.len()
        );
    }
    let mut t = Tailrace::start(&data, &env).await;
    let status = t.wait_exit(Duration::from_secs(180)).await;
    assert!(
        status.success(),
        "the file ends, the pipeline stops cleanly\n{}",
        t.report()
    );
    assert!(
        t.stderr().contains("continuing after the stored position"),
        "the last run said where it continued\n{}",
        t.report()
    );
    let events = stored(&data).await;
    exactly_once(&events, n);
    let last = &events.last().unwrap().1;
    assert_eq!(
        last.position.as_ref().unwrap()["offset"],
        serde_json::json!(std::fs::metadata(&file).unwrap().len()),
        "the last event's position is the end of the file"
    );
}

/// An SSE server whose stream holds events 1..=`upto`, each `id: e<n>`; it answers a request
/// with `Last-Event-ID: e<k>` with the events after k, then holds the connection open.
mod sse_server {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use axum::Router;
    use axum::extract::State;
    use axum::http::HeaderMap;
    use axum::response::IntoResponse;
    use axum::routing::get;

    #[derive(Clone)]
    pub struct Server {
        pub upto: Arc<AtomicU64>,
        pub asked_after: Arc<std::sync::Mutex<Vec<Option<String>>>>,
    }

    async fn stream(State(s): State<Server>, headers: HeaderMap) -> impl IntoResponse {
        let after = headers
            .get("last-event-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        s.asked_after.lock().unwrap().push(after.clone());
        let from = after
            .as_deref()
            .and_then(|a| a.strip_prefix('e'))
            .and_then(|k| k.parse::<u64>().ok())
            .unwrap_or(0);
        let upto = s.upto.load(Ordering::Acquire);
        let mut body = String::from(":ok\n\n");
        for i in from + 1..=upto {
            body.push_str(&format!(
                "event: message\nid: e{i}\ndata: {{\"line\":{i},\"title\":\"Ł {i} 😀\"}}\n\n"
            ));
        }
        let head = futures::stream::once(async move { Ok::<_, std::io::Error>(body) });
        let held = futures::stream::pending();
        (
            [("content-type", "text/event-stream")],
            axum::body::Body::from_stream(futures::StreamExt::chain(head, held)),
        )
    }

    pub async fn start(server: Server) -> std::net::SocketAddr {
        let app = Router::new()
            .route("/stream", get(stream))
            .with_state(server);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        addr
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sse_source_restarted_asks_for_the_events_after_its_stored_id() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    let server = sse_server::Server {
        upto: Arc::new(AtomicU64::new(100)),
        asked_after: Arc::default(),
    };
    let addr = sse_server::start(server.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let sources = format!(
        r#"[{{ name = "wiki", kind = "http", format = "sse", url = "http://{addr}/stream" }}]"#
    );
    let env = [("TAILRACE_SOURCES", sources.as_str())];
    let mut t = Tailrace::start(dir.path(), &env).await;
    t.wait_until(
        "100 events acknowledged",
        Duration::from_secs(60),
        async |t| acked(&t.metrics().await, "wiki") >= 100,
    )
    .await;
    t.stop().await;
    // 100 more while it is down.
    server.upto.store(200, Ordering::Release);
    let mut t = Tailrace::start(dir.path(), &env).await;
    t.wait_until(
        "200 events acknowledged",
        Duration::from_secs(60),
        async |t| acked(&t.metrics().await, "wiki") >= 200,
    )
    .await;
    t.stop().await;
    let asked = server.asked_after.lock().unwrap().clone();
    assert_eq!(
        asked,
        [None, Some("e100".to_owned())],
        "the first run asked from the start, the restart after its stored id"
    );
    exactly_once(&stored(dir.path()).await, 200);
}
