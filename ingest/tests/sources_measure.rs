//! Measurements of the http source (ignored by default; they print numbers, they assert only
//! that the work completed):
//!
//! ```text
//! cargo test --release -p ingest --test sources_measure -- --ignored --nocapture --test-threads 1
//! ```
//!
//! - sustained rate: a local server pushes tweet-like NDJSON as fast as it can; the real http
//!   source, the real ingester (batches of 256, journaled) and the embedded store take it;
//! - reconnect time: the server goes away and comes back on the same port; how long from the
//!   server listening again to the first record delivered.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use ingest::ingester::{Handed, IngestOptions, IngestStats, Ingester};
use ingest::source::Source;
use ingest::source::http::HttpFormat;
use ingest::source::http::{HttpOptions, HttpSource};
use ingest::source::synthetic::Generator;
use store::embedded::{EmbeddedOptions, EmbeddedStore};
use store::{CappedSpec, Durability, Start, Store};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

const EVENTS: usize = 200_000;

/// Serves one connection: an NDJSON body in chunked encoding, then closes.
async fn serve_once(listener: &TcpListener, body: &[u8], chunk: usize) {
    let (mut sock, _) = listener.accept().await.unwrap();
    let mut req = [0u8; 4096];
    let _ = sock.read(&mut req).await.unwrap();
    sock.write_all(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\ntransfer-encoding: chunked\r\n\r\n",
    )
    .await
    .unwrap();
    for part in body.chunks(chunk) {
        let mut framed = format!("{:x}\r\n", part.len()).into_bytes();
        framed.extend_from_slice(part);
        framed.extend_from_slice(b"\r\n");
        if sock.write_all(&framed).await.is_err() {
            return;
        }
    }
    let _ = sock.write_all(b"0\r\n\r\n").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run it with --ignored --nocapture, in release"]
async fn http_source_sustained_rate_into_the_embedded_store() {
    let mut g = Generator::new(7);
    let mut body = Vec::new();
    for _ in 0..EVENTS {
        serde_json::to_writer(&mut body, &g.event()).unwrap();
        body.push(b'\n');
    }
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let bytes = body.len();
    tokio::spawn(async move {
        serve_once(&listener, &body, 64 * 1024).await;
        // Then keep the next connection open and quiet.
        let (_sock, _) = listener.accept().await.unwrap();
        futures::future::pending::<()>().await;
    });

    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).unwrap();
    let spec = CappedSpec {
        max_docs: 1_000_000,
        max_bytes: 1 << 30,
        indexes: vec!["_tailrace.source".into(), "user.id".into()],
    };
    let events = store.capped("events", &spec).await.unwrap();
    let ingester = Ingester {
        events: events.clone(),
        dead_letters: store
            .capped(
                "dead_letters",
                &CappedSpec {
                    indexes: vec!["source".into(), "reason".into()],
                    ..spec.clone()
                },
            )
            .await
            .unwrap(),
        rollups: store.keyed("rollups").await.unwrap(),
        options: IngestOptions {
            batch_max_events: 256,
            batch_max_wait: Duration::from_millis(5),
            max_event_bytes: 65536,
            rollup_fields: vec!["lang".into(), "hashtags".into()],
            summary_fields: vec!["retweet_count".into(), "hashtags".into()],
            durability: Durability::Journaled,
            geo: Default::default(),
        },
        engine: "embedded",
        stats: Arc::new(IngestStats::default()),
        health: Default::default(),
        observer: None,
    };
    let (tx, rx) = mpsc::channel::<Handed>(4096);
    tokio::spawn(ingester.run(rx));
    let source = HttpSource::new(
        "bench",
        HttpOptions::new(format!("http://{addr}/"), HttpFormat::Ndjson, 65536),
    );
    let mut records = Box::new(source).records();
    let start = Instant::now();
    tokio::spawn(async move {
        while let Some(raw) = records.next().await {
            let h = Handed {
                source: Arc::from("bench"),
                raw,
                received_us: 0,
                position: None,
            };
            if tx.send(h).await.is_err() {
                break;
            }
        }
    });
    let mut tail = events.tail(Start::Oldest);
    let mut n = 0;
    while n < EVENTS {
        tokio::time::timeout(Duration::from_secs(120), tail.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        n += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "http → ingester → embedded (journaled, rollups on): {EVENTS} events, {:.1} MB, in {secs:.2} s = {:.0} events/s ({:.1} MB/s)",
        bytes as f64 / 1e6,
        EVENTS as f64 / secs,
        bytes as f64 / 1e6 / secs
    );
    store.close().await.unwrap();
}

/// Serves `{"n":i}` on each connection and closes it at once.
async fn one_line(listener: &TcpListener, i: u32) {
    serve_once(listener, format!("{{\"n\":{i}}}\n").as_bytes(), 1024).await;
}

#[tokio::test]
#[ignore = "a measurement: run it with --ignored --nocapture, in release"]
async fn http_source_reconnect_time_after_a_server_restart() {
    let addr: SocketAddr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    // Default options: backoff from 100 ms, jitter, up to 30 s.
    let source = HttpSource::new(
        "restart",
        HttpOptions::new(format!("http://{addr}/"), HttpFormat::Ndjson, 65536),
    );
    let mut records = Box::new(source).records();
    for down_ms in [0u64, 500, 2000, 5000] {
        let mut samples = Vec::new();
        for round in 0..5u32 {
            // The server is down for `down_ms`, then listens and answers.
            let server = tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(down_ms)).await;
                let listener = TcpListener::bind(addr).await.unwrap();
                let up = Instant::now();
                one_line(&listener, round).await;
                up
            });
            let raw = tokio::time::timeout(Duration::from_secs(60), records.next())
                .await
                .unwrap()
                .unwrap();
            let got = Instant::now();
            let up = server.await.unwrap();
            assert_eq!(
                raw,
                ingest::source::Raw::Bytes(format!("{{\"n\":{round}}}").into_bytes())
            );
            samples.push(got.duration_since(up).as_secs_f64() * 1000.0);
        }
        samples.sort_by(f64::total_cmp);
        println!(
            "server down {down_ms:>4} ms: first record {:.0} ms (median of 5; min {:.0}, max {:.0}) after it listens again",
            samples[2], samples[0], samples[4]
        );
    }
}
