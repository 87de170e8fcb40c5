//! The flagship use case end to end: a long-lived HTTP NDJSON stream read by the real binary.
//! Good events land and reach both feeds; bad lines are counted and dead-lettered; the
//! connection stays open and nothing is read twice.

#![allow(clippy::unwrap_used)]

mod common;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use common::Tailrace;
use futures::StreamExt;

const GOOD: usize = 200;

/// A stream of `GOOD` events and two bad lines, sent in small chunks (cut mid-line), then held
/// open without data, as a live stream between events. Counts connections.
async fn serve() -> (String, Arc<AtomicUsize>) {
    let connections = Arc::new(AtomicUsize::new(0));
    let seen = connections.clone();
    let app = Router::new().route(
        "/stream",
        get(move || {
            let n = seen.fetch_add(1, Ordering::SeqCst);
            async move {
                let mut body = Vec::new();
                if n == 0 {
                    for i in 0..GOOD {
                        body.extend(format!("{{\"id\": {i}, \"user\": {{\"screen_name\": \"u{}\"}}, \"hashtags\": [\"h{}\"], \"retweet_count\": {}}}\n", i % 7, i % 5, i % 11).into_bytes());
                        if i == 50 {
                            body.extend(b"{\"broken\": \n");
                        }
                        if i == 120 {
                            body.extend(b"[\"not\", \"an\", \"object\"]\n");
                        }
                    }
                }
                let chunks: Vec<Result<Vec<u8>, Infallible>> = body.chunks(37).map(|c| Ok(c.to_vec())).collect();
                Body::from_stream(futures::stream::iter(chunks).chain(futures::stream::pending()))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}/stream"), connections)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_ndjson_stream_reaches_the_store_and_both_feeds() {
    let (url, connections) = serve().await;
    let dir = tempfile::tempdir().unwrap();
    let sources = format!(r#"[{{ name = "net", kind = "http", url = "{url}" }}]"#);
    let mut t = Tailrace::start(dir.path(), &[("TAILRACE_SOURCES", &sources)]).await;
    t.wait_until(
        "every line read and both feeds caught up",
        Duration::from_secs(60),
        async |t| {
            let m = t.metrics().await;
            m.sum("tailrace_source_events_total", &[("source", "net")]) == (GOOD + 2) as f64
                && ["tail", "changes"]
                    .iter()
                    .all(|f| m.sum("tailrace_feed_events_total", &[("feed", f)]) == GOOD as f64)
        },
    )
    .await;
    let m = t.metrics().await;
    assert_eq!(
        m.sum(
            "tailrace_events_rejected_total",
            &[("source", "net"), ("reason", "malformed_json")]
        ),
        1.0
    );
    assert_eq!(
        m.sum(
            "tailrace_events_rejected_total",
            &[("source", "net"), ("reason", "not_object")]
        ),
        1.0
    );
    for feed in ["tail", "changes"] {
        assert_eq!(
            m.sum("tailrace_feed_missing_events_total", &[("feed", feed)]),
            0.0,
            "{feed}"
        );
        assert_eq!(
            m.sum("tailrace_feed_duplicate_events_total", &[("feed", feed)]),
            0.0,
            "{feed}"
        );
    }
    let latest = t
        .json("/api/events/latest?field=user.screen_name&value=u3&limit=3")
        .await;
    let ids: Vec<u64> = latest
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["doc"]["id"].as_u64().unwrap())
        .collect();
    assert_eq!(
        ids,
        vec![199, 192, 185],
        "the newest events of u3 (ids = 3 mod 7), newest first"
    );
    assert_eq!(
        connections.load(Ordering::SeqCst),
        1,
        "a live stream is held open, not re-requested"
    );
    t.stop().await;
}
