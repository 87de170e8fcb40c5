//! Real public streams, replayed locally, through the real binary with the ready-made
//! configurations of `config/examples/` (only the source's URL pointed at the local server):
//! Wikimedia EventStreams (SSE), Bluesky Jetstream (WebSocket), a Mastodon public timeline
//! (SSE with a token). The servers (`replay/`) speak each service's documented wire format,
//! close streams on their own and expect the client to resume.
//!
//! For each stream: every served event is stored exactly once (or, replayed after a resume,
//! dropped and counted as a duplicate), byte-for-byte equal as JSON (`$schema`, `$type`,
//! `$link`, dotted keys, every script), in order, with sequence numbers 1..=n; none is
//! rejected; events of other SSE types are counted, not stored; `latest` on an indexed field
//! returns the newest of them; both feeds see every sequence number once.
//!
//! Measurements (release build, larger replays, ~4 server-side closes each):
//!   cargo test --release -p ingest --test real_streams -- --ignored --nocapture --test-threads 1
//! (`REPLAY_EVENTS=50000` to change the size, default 20000; `REPLAY_PER_CONNECTION=300` for a
//! server-side close every 300 events, default a quarter of them.)

#![allow(clippy::unwrap_used)]

mod common;
mod replay;

use std::path::Path;
use std::time::{Duration, Instant};

use common::Tailrace;
use futures::StreamExt;
use replay::{example_config, example_url, jetstream, local_url, mastodon, wikimedia};
use serde_json::Value;
use store::embedded::{EmbeddedOptions, EmbeddedStore};
use store::{CappedSpec, Start, Store};

/// How long the pipeline may take to store a replay (a debug build on a loaded machine).
const STORE_TIMEOUT: Duration = Duration::from_secs(120);
const T: Duration = Duration::from_secs(20);

/// The event without tailrace's stamp: what the server sent.
fn unstamped(doc: &Value) -> Value {
    let mut d = doc.clone();
    d.as_object_mut().unwrap().remove("_tailrace");
    d
}

/// A field by dotted path.
fn at<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(v, |v, p| v.get(p))
}

/// Waits until the pipeline has acknowledged `n` events of `source` (its sequence number),
/// polling `/metrics` every `every`; returns when that was seen.
async fn wait_stored(t: &Tailrace, source: &str, n: usize, every: Duration) -> Instant {
    let deadline = Instant::now() + STORE_TIMEOUT;
    loop {
        let m = t.metrics().await;
        let seq = m.sum("tailrace_source_last_acked_seq", &[("source", source)]);
        if seq as usize >= n {
            return Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "{source}: {seq} of {n} events stored after {STORE_TIMEOUT:?}\n{}",
            t.report()
        );
        tokio::time::sleep(every).await;
    }
}

/// What every replay must show in the metrics once `distinct` events are stored.
async fn check_metrics(t: &Tailrace, source: &str, distinct: usize, duplicates: usize) {
    let m = t.metrics().await;
    let seq = m.sum("tailrace_source_last_acked_seq", &[("source", source)]);
    assert_eq!(
        seq as usize,
        distinct,
        "{source}: sequence numbers 1..={distinct}: one per distinct event, none for a duplicate\n{}",
        t.report()
    );
    assert_eq!(
        m.sum("tailrace_events_rejected_total", &[("source", source)]),
        0.0,
        "{source}: nothing rejected\n{}",
        t.report()
    );
    assert_eq!(
        m.sum("tailrace_source_events_total", &[("source", source)]) as usize,
        distinct,
        "{source}: records handed over = distinct events (duplicates are dropped before)"
    );
    assert_eq!(
        m.sum(
            "tailrace_source_duplicates_dropped_total",
            &[("source", source)]
        ) as usize,
        duplicates,
        "{source}: every replayed event dropped and counted, nothing else"
    );
    // Each stored event counted once by the precision of its place; the example's stream is
    // placed by its language (its geo preset), and no event claims a country outside the
    // ISO codes.
    assert_eq!(
        m.sum("tailrace_events_geo_total", &[]) as usize,
        distinct,
        "{source}: every event counted once by precision\n{}",
        t.report()
    );
    assert!(
        m.sum("tailrace_events_geo_total", &[("precision", "language")]) > 0.0,
        "{source}: events placed by the language of its preset\n{}",
        t.report()
    );
    assert_eq!(
        m.sum("tailrace_events_geo_country_total", &[]) as usize,
        distinct,
        "{source}: every event counted once by country"
    );
    // Both feeds see every event once.
    t.wait_until(
        "both feeds processed every event",
        STORE_TIMEOUT,
        async |t| {
            let m = t.metrics().await;
            ["tail", "changes"]
                .iter()
                .all(|f| m.sum("tailrace_feed_events_total", &[("feed", f)]) as usize >= distinct)
        },
    )
    .await;
    let m = t.metrics().await;
    for feed in ["tail", "changes"] {
        for name in [
            "tailrace_feed_missing_events_total",
            "tailrace_feed_duplicate_events_total",
        ] {
            assert_eq!(
                m.sum(name, &[("feed", feed)]),
                0.0,
                "{feed}: {name} stays 0\n{}",
                t.report()
            );
        }
    }
}

/// `GET /api/events/latest?field=F&value=V&limit=20` returns the 20 newest served events
/// with that value, newest first, as served (the stamp aside).
async fn check_latest(t: &Tailrace, distinct: &[Value], field: &str, value: &Value) -> Value {
    check_latest_n(t, distinct, field, value, 2).await
}

/// [`check_latest`] for a value that at least `min` events have.
async fn check_latest_n(
    t: &Tailrace,
    distinct: &[Value],
    field: &str,
    value: &Value,
    min: usize,
) -> Value {
    let want: Vec<Value> = distinct
        .iter()
        .rev()
        .filter(|e| at(e, field) == Some(value))
        .take(20)
        .cloned()
        .collect();
    assert!(
        want.len() >= min,
        "pick a value with at least {min} events: {field} = {value} has {}",
        want.len()
    );
    let encoded: String = form_urlencoded::byte_serialize(value.to_string().as_bytes()).collect();
    let got = t
        .json(&format!(
            "/api/events/latest?field={field}&value={encoded}&limit=20"
        ))
        .await;
    let got: Vec<Value> = got
        .as_array()
        .unwrap()
        .iter()
        .map(|r| unstamped(&r["doc"]))
        .collect();
    assert_eq!(got.len(), want.len(), "latest({field} = {value}): count");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            g == w,
            "latest({field} = {value}) #{i}: expected {w}\n got {g}"
        );
    }
    got[0].clone()
}

/// Waits until the top-k of the `tail` feed publishes a count for `key` (once per checkpoint).
async fn wait_topk(t: &Tailrace, key: &str) {
    t.wait_until(&format!("the top-k counts {key:?}"), T, async |t| {
        let m = t.metrics().await;
        m.sum("tailrace_topk_events", &[("feed", "tail"), ("key", key)]) > 0.0
    })
    .await;
}

/// The most frequent value of `field` among `events` (ties: the first seen).
fn most_frequent(events: &[Value], field: &str) -> Value {
    let mut counts: Vec<(Value, usize)> = Vec::new();
    for e in events {
        if let Some(v) = at(e, field) {
            match counts.iter_mut().find(|(k, _)| k == v) {
                Some((_, c)) => *c += 1,
                None => counts.push((v.clone(), 1)),
            }
        }
    }
    counts.into_iter().max_by_key(|(_, c)| *c).unwrap().0
}

/// Stops the pipeline (SIGTERM, clean exit) and reads every stored event back from its data
/// directory; checks they are `distinct`, in order, each once, stamped 1..=n by `source`.
async fn check_stored(t: &mut Tailrace, dir: &Path, source: &str, distinct: &[Value]) {
    t.stop().await;
    let store = EmbeddedStore::open(dir, EmbeddedOptions::default()).unwrap();
    // The default bounds: opening does not evict anything.
    let spec = CappedSpec {
        max_docs: 100_000,
        max_bytes: 67_108_864,
        indexes: vec![],
    };
    let events = store.capped("events", &spec).await.unwrap();
    let mut tail = events.tail(Start::Oldest);
    for (i, want) in distinct.iter().enumerate() {
        let r = tokio::time::timeout(T, tail.next())
            .await
            .unwrap_or_else(|_| panic!("{source}: only {i} of {} events stored", distinct.len()))
            .unwrap()
            .unwrap();
        let doc = Value::Object(std::sync::Arc::unwrap_or_clone(r.doc));
        assert_eq!(
            doc["_tailrace"]["source"], source,
            "{source}: event {i} is stamped by its source"
        );
        assert_eq!(
            doc["_tailrace"]["seq"],
            (i + 1) as u64,
            "{source}: event {i} has sequence number {}",
            i + 1
        );
        let got = unstamped(&doc);
        assert!(
            &got == want,
            "{source}: stored event {i} differs from the one served:\n served {want}\n stored {got}"
        );
    }
    let extra = tokio::time::timeout(Duration::from_millis(200), tail.next()).await;
    assert!(
        extra.is_err(),
        "{source}: nothing stored beyond the {} distinct events: {:?}",
        distinct.len(),
        extra.ok().flatten().map(|r| r.map(|r| r.position))
    );
    drop(tail);
    store.close().await.unwrap();
}

/// A GET without tailrace (reqwest sends no User-Agent unless told): (status, body).
async fn plain_get(url: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let mut req = ingest::source::http::client().build().unwrap().get(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = tokio::time::timeout(T, req.send()).await.unwrap().unwrap();
    let status = resp.status().as_u16();
    let body = tokio::time::timeout(T, resp.text())
        .await
        .unwrap()
        .unwrap_or_default();
    (status, body)
}

/// The result of one replay, for the measurements.
struct Measured {
    stored: usize,
    served: usize,
    duplicates: usize,
    closes: usize,
    secs: f64,
    /// Share of the stored events by the precision of their place.
    placed: Vec<(&'static str, f64)>,
}

/// Each precision's share of the events counted in `tailrace_events_geo_total`.
async fn placed(t: &Tailrace) -> Vec<(&'static str, f64)> {
    let m = t.metrics().await;
    let all = m.sum("tailrace_events_geo_total", &[]).max(1.0);
    ["point", "place", "country", "language", "none"]
        .into_iter()
        .map(|p| {
            (
                p,
                m.sum("tailrace_events_geo_total", &[("precision", p)]) / all,
            )
        })
        .collect()
}

impl Measured {
    fn line(&self, stream: &str) -> String {
        format!(
            "{stream:<10} {:>7} stored  {:>9.0} events/s  ({:.2} s from the first event served to the last stored; {} served, {} duplicates dropped after {} server-side closes)",
            self.stored,
            self.stored as f64 / self.secs,
            self.secs,
            self.served,
            self.duplicates,
            self.closes
        ) + &format!(
            "\n{:<10} placed: {}",
            "",
            self.placed
                .iter()
                .map(|(p, share)| format!("{p} {:.1} %", share * 100.0))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}

// ---------------------------------------------------------------------------------------
// Wikimedia EventStreams
// ---------------------------------------------------------------------------------------

async fn wikimedia_replay(
    n: usize,
    per_connection: impl Fn(usize) -> usize + Send + Sync + 'static,
    full: bool,
) -> Measured {
    let srv = wikimedia::Server::start(n, per_connection).await;
    let url = local_url(&example_url("wikimedia"), srv.addr);
    // The server enforces Wikimedia's policy: no User-Agent, no stream.
    let (status, body) = plain_get(&url, &[]).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("user-agent"), "{body}");
    assert_eq!(srv.served.refused.lock().unwrap().len(), 1);

    let dir = tempfile::tempdir().unwrap();
    let config = example_config("wikimedia", &url, dir.path());
    let data = dir.path().join("data");
    let config = config.display().to_string();
    let mut t = Tailrace::start(&data, &[("TAILRACE_CONFIG", &config)]).await;
    let done = wait_stored(&t, "wikimedia", n, Duration::from_millis(20)).await;
    let secs = (done - srv.served.first_at.lock().unwrap().unwrap()).as_secs_f64();
    let served = srv.served.all();
    let closes = srv.served.connections.lock().unwrap().len() - 1;
    let measured = Measured {
        stored: n,
        served: served.len(),
        duplicates: 0,
        closes,
        secs,
        placed: placed(&t).await,
    };
    if !full {
        t.stop().await;
        return measured;
    }
    let distinct: Vec<Value> = (0..n).map(wikimedia::event).collect();
    assert_eq!(
        served,
        distinct,
        "the server served each event once: Last-Event-ID resumed exactly after the last one\n{}",
        srv.served.describe()
    );
    assert!(
        closes >= 3,
        "several server-side closes: {}",
        srv.served.describe()
    );
    assert_eq!(
        srv.served.refused.lock().unwrap().len(),
        1,
        "tailrace was never refused: it sends a User-Agent"
    );
    for line in srv.served.connections.lock().unwrap().iter() {
        assert!(
            line.contains("user-agent \"tailrace/"),
            "tailrace's own User-Agent: {line}"
        );
    }
    let resumes = srv.resumes.lock().unwrap().clone();
    assert_eq!(resumes.len(), closes, "every reconnect resumed");
    for (sent, previous_last) in &resumes {
        assert_eq!(
            sent, previous_last,
            "Last-Event-ID is the previous connection's last id, byte for byte"
        );
        assert!(sent.starts_with("[{\"topic\""), "a JSON array: {sent}");
    }
    check_metrics(&t, "wikimedia", n, 0).await;
    let m = t.metrics().await;
    let errors = (0..=closes).filter(|k| k % 3 == 2).count();
    assert_eq!(
        m.sum(
            "tailrace_source_events_skipped_total",
            &[("source", "wikimedia"), ("event", "error")]
        ) as usize,
        errors,
        "`event: error` reports are counted, not stored"
    );
    assert_eq!(
        m.sum(
            "tailrace_source_reconnects_total",
            &[("source", "wikimedia"), ("reason", "closed")]
        ) as usize,
        closes
    );
    let wiki = most_frequent(&distinct, "wiki");
    let newest = check_latest(&t, &distinct, "wiki", &wiki).await;
    assert_eq!(
        newest["$schema"], "/mediawiki/recentchange/1.0.0",
        "`$schema` survives the round trip"
    );
    assert!(newest["meta"]["dt"].is_string(), "meta.* kept: {newest}");
    check_latest(&t, &distinct, "type", &Value::from("new")).await;
    let user = most_frequent(&distinct, "user");
    check_latest(&t, &distinct, "user", &user).await;
    // The top-k of the example counts wikis.
    wait_topk(&t, wiki.as_str().unwrap()).await;
    check_stored(&mut t, &data, "wikimedia", &distinct).await;
    measured
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wikimedia_recentchange_through_the_binary() {
    wikimedia_replay(1200, |k| 280 + 37 * k, true).await;
}

// ---------------------------------------------------------------------------------------
// Bluesky Jetstream
// ---------------------------------------------------------------------------------------

async fn jetstream_replay(
    n: usize,
    per_connection: impl Fn(usize) -> usize + Send + Sync + 'static,
    full: bool,
) -> Measured {
    let srv = jetstream::Server::start(n, per_connection).await;
    let url = local_url(&example_url("bluesky"), srv.addr);
    let dir = tempfile::tempdir().unwrap();
    let config = example_config("bluesky", &url, dir.path());
    let data = dir.path().join("data");
    let config = config.display().to_string();
    let mut t = Tailrace::start(&data, &[("TAILRACE_CONFIG", &config)]).await;
    let done = wait_stored(&t, "bluesky", n, Duration::from_millis(20)).await;
    let secs = (done - srv.served.first_at.lock().unwrap().unwrap()).as_secs_f64();
    let served = srv.served.all();
    let closes = srv.served.connections.lock().unwrap().len() - 1;
    let measured = Measured {
        stored: n,
        served: served.len(),
        duplicates: served.len() - n,
        closes,
        secs,
        placed: placed(&t).await,
    };
    if !full {
        t.stop().await;
        return measured;
    }
    let distinct: Vec<Value> = (0..n).map(jetstream::event).collect();
    assert!(
        closes >= 3,
        "several server-side closes: {}",
        srv.served.describe()
    );
    assert!(
        served.len() > n,
        "closes inside a tie replay events the client already has: {}",
        srv.served.describe()
    );
    let uris = srv.uris.lock().unwrap().clone();
    assert!(
        !uris[0].contains("cursor="),
        "first connection: live, no cursor"
    );
    for (k, uri) in uris.iter().enumerate().skip(1) {
        assert!(
            uri.contains("wantedCollections=app.bsky.feed.post") && uri.contains("cursor="),
            "connection {k} keeps the query and resumes from a cursor: {uri}"
        );
    }
    check_metrics(&t, "bluesky", n, served.len() - n).await;
    let did = most_frequent(&distinct, "did");
    check_latest(&t, &distinct, "did", &did).await;
    let deleted = check_latest(&t, &distinct, "commit.operation", &Value::from("delete")).await;
    assert!(
        deleted["commit"]["record"].is_null(),
        "a delete has no record"
    );
    check_latest(&t, &distinct, "kind", &Value::from("identity")).await;
    let post = check_latest(&t, &distinct, "commit.operation", &Value::from("create")).await;
    assert_eq!(
        post["commit"]["record"]["$type"], "app.bsky.feed.post",
        "`$type` survives the round trip"
    );
    let links = distinct
        .iter()
        .filter(|e| at(e, "commit.record.embed.video.ref.$link").is_some())
        .count();
    assert!(links > 0, "the replay has `$link` blob references");
    // The top-k of the example counts languages.
    let lang = most_frequent(&distinct, "commit.record.langs");
    wait_topk(&t, lang[0].as_str().unwrap()).await;
    check_stored(&mut t, &data, "bluesky", &distinct).await;
    measured
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bluesky_jetstream_through_the_binary() {
    jetstream_replay(1200, |k| 251 + 40 * k, true).await;
}

// ---------------------------------------------------------------------------------------
// Mastodon
// ---------------------------------------------------------------------------------------

async fn mastodon_replay(
    n: usize,
    per_connection: impl Fn(usize) -> usize + Send + Sync + 'static,
    full: bool,
) -> Measured {
    let token = "t0ken-7f3a-secret";
    let items = mastodon::items(n);
    let srv = mastodon::Server::start(items.clone(), token, per_connection).await;
    let url = local_url(&example_url("mastodon"), srv.addr);
    // The server wants the token.
    let (status, body) = plain_get(&url, &[("user-agent", "test")]).await;
    assert_eq!(status, 401, "{body}");

    let dir = tempfile::tempdir().unwrap();
    let config = example_config("mastodon", &url, dir.path());
    let data = dir.path().join("data");
    let config = config.display().to_string();
    let mut t = Tailrace::start(
        &data,
        &[("TAILRACE_CONFIG", &config), ("MASTODON_TOKEN", token)],
    )
    .await;
    let done = wait_stored(&t, "mastodon", n, Duration::from_millis(20)).await;
    let secs = (done - srv.served.first_at.lock().unwrap().unwrap()).as_secs_f64();
    let served = srv.served.all();
    let closes = srv.served.connections.lock().unwrap().len() - 1;
    let measured = Measured {
        stored: n,
        served: served.len(),
        duplicates: 0,
        closes,
        secs,
        placed: placed(&t).await,
    };
    if !full {
        t.stop().await;
        return measured;
    }
    let distinct: Vec<Value> = items
        .iter()
        .filter_map(|i| match i {
            mastodon::Item::Update(v) => Some(v.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(served, distinct, "{}", srv.served.describe());
    assert!(
        closes >= 3,
        "several server-side closes: {}",
        srv.served.describe()
    );
    assert_eq!(
        srv.served.refused.lock().unwrap().len(),
        1,
        "tailrace always sent the token"
    );
    check_metrics(&t, "mastodon", n, 0).await;
    let (deletes, edits) = *srv.others.lock().unwrap();
    assert!(deletes > 0 && edits > 0, "the replay has deletes and edits");
    let m = t.metrics().await;
    let skipped = |event: &str| {
        m.sum(
            "tailrace_source_events_skipped_total",
            &[("source", "mastodon"), ("event", event)],
        ) as usize
    };
    assert_eq!(
        (skipped("delete"), skipped("status.update")),
        (deletes, edits),
        "deletes and edits are counted, not stored"
    );
    let acct = most_frequent(&distinct, "account.acct");
    check_latest(&t, &distinct, "account.acct", &acct).await;
    check_latest(&t, &distinct, "language", &Value::from("de")).await;
    let one = &distinct[n / 2];
    check_latest_n(&t, &distinct, "id", &one["id"], 1).await;
    // Top-k counts Mastodon's tag objects by name.
    wait_topk(&t, "rust").await;
    check_stored(&mut t, &data, "mastodon", &distinct).await;
    measured
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mastodon_public_timeline_through_the_binary() {
    mastodon_replay(1000, |k| 260 + 30 * k, true).await;
}

// ---------------------------------------------------------------------------------------
// Measurements
// ---------------------------------------------------------------------------------------

fn replay_events() -> usize {
    std::env::var("REPLAY_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000)
}

/// Ingest of each replay through the binary, with about four server-side closes each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run alone, in release (see the module doc)"]
async fn measure_replays() {
    let n = replay_events();
    // Events per connection before the server closes it: about four closes by default.
    let every = std::env::var("REPLAY_PER_CONNECTION")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(n / 4 + 1);
    let per = move |_k: usize| every;
    let w = wikimedia_replay(n, per, false).await;
    let j = jetstream_replay(n, per, false).await;
    let m = mastodon_replay(n, per, false).await;
    println!(
        "\nreplays of {n} events through the binary ({} build):",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
    for (name, r) in [("wikimedia", &w), ("bluesky", &j), ("mastodon", &m)] {
        println!("{}", r.line(name));
    }
}

// ---------------------------------------------------------------------------------------
// WebSocket bad input through the binary
// ---------------------------------------------------------------------------------------

/// Bad frames from a WebSocket server reach the binary's dead letters with their reasons;
/// the good events around them, `$`-prefixed keys included, are stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_bad_input_through_the_binary() {
    use futures::SinkExt;
    use tokio_tungstenite::tungstenite::Message;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        // One connection: the frames, then silence (kept open).
        let (tcp, _) = listener.accept().await.unwrap();
        let mut ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
        let frames = [
            Message::text(r#"{"n":1,"$type":"app.bsky.feed.post"}"#),
            Message::binary(vec![0x82, 0xa1, 0x6e, 0x01]),
            Message::text("not json at all"),
            Message::text("[1,2,3]"),
            Message::text(r#"{"n":2,"nul\u0000key":true}"#),
            Message::text("{\"n\":3,\"a.b\":{\"$c\":\"ok\"}}\n{\"n\":4}"),
        ];
        for f in frames {
            ws.send(f).await.unwrap();
        }
        futures::future::pending::<()>().await;
    });
    let dir = tempfile::tempdir().unwrap();
    let sources = format!(r#"[{{ name = "ws", kind = "websocket", url = "ws://{addr}/feed" }}]"#);
    let mut t = Tailrace::start(dir.path(), &[("TAILRACE_SOURCES", &sources)]).await;
    wait_stored(&t, "ws", 3, Duration::from_millis(100)).await;
    t.wait_until("four rejects", T, async |t| {
        let m = t.metrics().await;
        m.sum("tailrace_events_rejected_total", &[("source", "ws")]) >= 4.0
    })
    .await;
    let m = t.metrics().await;
    for reason in [
        "binary_frame",
        "malformed_json",
        "not_object",
        "invalid_key",
    ] {
        assert_eq!(
            m.sum(
                "tailrace_events_rejected_total",
                &[("source", "ws"), ("reason", reason)]
            ),
            1.0,
            "{reason}\n{}",
            t.report()
        );
    }
    let stored = t
        .json("/api/events/latest?field=_tailrace.source&value=ws&limit=10")
        .await;
    let got: Vec<Value> = stored
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .map(|r| unstamped(&r["doc"]))
        .collect();
    assert_eq!(
        got,
        [
            serde_json::json!({"n": 1, "$type": "app.bsky.feed.post"}),
            serde_json::json!({"n": 3, "a.b": {"$c": "ok"}}),
            serde_json::json!({"n": 4}),
        ],
        "the good events, as sent (NDJSON inside a frame splits into two)"
    );
    t.stop().await;
}
