//! The `websocket` source against real local WebSocket servers (tokio-tungstenite's server side
//! on 127.0.0.1:0), each playing a script per connection: a Jetstream-like firehose that closes
//! every few hundred events and replays from `?cursor=` inclusively, a feed that waits for a
//! subscribe message, bad frames (binary, 10 MB, invalid UTF-8, cut mid-frame), stalls, a
//! server that never answers the upgrade, 401/403/429 answers, pings both ways, headers.
//!
//! No sleep synchronises anything: the tests wait on the server's connection counter, the
//! records, the captured log or the metrics, each under a timeout. The only sleeps are a
//! server's scripted quiet periods, which are the behaviour under test.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use common::{T, log_line, log_text, logs, metric, recorder};
use futures::stream::BoxStream;
use futures::{SinkExt, StreamExt};
use ingest::source::websocket::{Resume, WebSocketOptions, WebSocketSource};
use ingest::source::{Raw, RejectReason, Source, USER_AGENT};
use ingest::telemetry::DUPLICATES_DROPPED;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::{HeaderMap, StatusCode};
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

// ---------------------------------------------------------------------------------------
// A scripted server
// ---------------------------------------------------------------------------------------

/// What a server saw of one upgrade request.
#[derive(Clone, Debug)]
struct Seen {
    at: Instant,
    uri: String,
    headers: HeaderMap,
}

/// A server that runs `script(connection number, tcp, server)` for every accepted connection.
struct Server {
    /// Upgrade requests, in order.
    seen: Mutex<Vec<Seen>>,
    /// TCP connections accepted.
    accepted: watch::Sender<usize>,
    /// Free-form notes the scripts leave for the test (what they served, what they received).
    notes: Mutex<Vec<String>>,
}

type Ws = WebSocketStream<TcpStream>;

impl Server {
    async fn start<F, Fut>(script: F) -> (Arc<Server>, SocketAddr)
    where
        F: Fn(usize, TcpStream, Arc<Server>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        Self::start_on("127.0.0.1:0".parse().unwrap(), script).await
    }

    async fn start_on<F, Fut>(addr: SocketAddr, script: F) -> (Arc<Server>, SocketAddr)
    where
        F: Fn(usize, TcpStream, Arc<Server>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let server = Arc::new(Server {
            seen: Mutex::new(Vec::new()),
            accepted: watch::channel(0).0,
            notes: Mutex::new(Vec::new()),
        });
        let listener = TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let s = server.clone();
        tokio::spawn(async move {
            let mut n = 0;
            while let Ok((tcp, _)) = listener.accept().await {
                s.accepted.send_modify(|c| *c += 1);
                tokio::spawn(script(n, tcp, s.clone()));
                n += 1;
            }
        });
        (server, addr)
    }

    /// Completes the upgrade, recording the request.
    // The callback's error type is tungstenite's `ErrorResponse`, not ours to shrink.
    #[allow(clippy::result_large_err)]
    async fn accept(self: &Arc<Self>, tcp: TcpStream) -> Ws {
        let s = self.clone();
        tokio_tungstenite::accept_hdr_async(tcp, move |req: &Request, resp: Response| {
            s.record(req);
            Ok(resp)
        })
        .await
        .unwrap()
    }

    /// Answers the upgrade with an HTTP error instead.
    #[allow(clippy::result_large_err)]
    async fn refuse(
        self: &Arc<Self>,
        tcp: TcpStream,
        status: u16,
        headers: &[(&str, &str)],
        body: &str,
    ) {
        let s = self.clone();
        let mut err = ErrorResponse::new(Some(body.to_owned()));
        *err.status_mut() = StatusCode::from_u16(status).unwrap();
        for (k, v) in headers {
            let name = tokio_tungstenite::tungstenite::http::HeaderName::from_bytes(k.as_bytes());
            err.headers_mut().insert(name.unwrap(), v.parse().unwrap());
        }
        let r = tokio_tungstenite::accept_hdr_async(tcp, move |req: &Request, _: Response| {
            s.record(req);
            Err(err)
        })
        .await;
        assert!(r.is_err(), "the upgrade was refused");
    }

    fn record(&self, req: &Request) {
        self.seen.lock().unwrap().push(Seen {
            at: Instant::now(),
            uri: req.uri().to_string(),
            headers: req.headers().clone(),
        });
    }

    /// Waits until `n` TCP connections were accepted.
    async fn connections(&self, n: usize) {
        let mut rx = self.accepted.subscribe();
        tokio::time::timeout(T, rx.wait_for(|c| *c >= n))
            .await
            .unwrap_or_else(|_| panic!("{n} connections did not arrive within {T:?}"))
            .unwrap();
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn note(&self, s: impl Into<String>) {
        self.notes.lock().unwrap().push(s.into());
    }

    fn notes(&self) -> Vec<String> {
        self.notes.lock().unwrap().clone()
    }
}

/// Keeps a connection open, sending nothing and reading nothing.
async fn stall<S>(_keep: S) {
    futures::future::pending::<()>().await;
}

/// A server-to-client frame (unmasked), written raw to the socket: what tungstenite's own
/// sender would refuse to produce (invalid UTF-8 text, a frame cut short).
fn raw_frame_header(opcode: u8, len: usize) -> Vec<u8> {
    let mut f = vec![0x80 | opcode];
    if len < 126 {
        f.push(len as u8);
    } else if len <= 0xffff {
        f.push(126);
        f.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        f.push(127);
        f.extend_from_slice(&(len as u64).to_be_bytes());
    }
    f
}

fn raw_frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = raw_frame_header(opcode, payload.len());
    f.extend_from_slice(payload);
    f
}

async fn send_text(ws: &mut Ws, text: &str) {
    ws.send(Message::text(text)).await.unwrap();
}

async fn close(mut ws: Ws, why: &str) {
    let frame = CloseFrame {
        code: CloseCode::Normal,
        reason: why.into(),
    };
    let _ = ws.close(Some(frame)).await;
    // Reads until the client's reply ends the connection (bounded).
    let _ = tokio::time::timeout(T, async { while ws.next().await.is_some() {} }).await;
}

// ---------------------------------------------------------------------------------------
// Metrics
// ---------------------------------------------------------------------------------------

fn reconnects(source: &str, reason: &str) -> f64 {
    metric(
        "tailrace_source_reconnects_total",
        &[("source", source), ("reason", reason)],
    )
}

// ---------------------------------------------------------------------------------------
// The source
// ---------------------------------------------------------------------------------------

fn options(addr: SocketAddr, path: &str) -> WebSocketOptions {
    let mut o = WebSocketOptions::new(format!("ws://{addr}{path}"), 1 << 20);
    o.reconnect_min = Duration::from_millis(10);
    o.reconnect_max = Duration::from_millis(50);
    o.idle_timeout = Duration::from_secs(10);
    o.ping_interval = None;
    o
}

fn source(name: &str, o: WebSocketOptions) -> BoxStream<'static, Raw> {
    logs();
    recorder();
    assert_eq!(o.validate(), Ok(()), "test options are valid");
    let s = Box::new(WebSocketSource::new(name, o));
    assert_eq!(s.kind(), "websocket");
    s.records()
}

async fn take(s: &mut BoxStream<'static, Raw>, n: usize) -> Vec<Raw> {
    let mut out = Vec::new();
    for _ in 0..n {
        let next = tokio::time::timeout(T, s.next()).await.unwrap_or_else(|_| {
            panic!(
                "record {} of {n} did not come; got {:?}",
                out.len() + 1,
                out.iter().map(short).collect::<Vec<_>>()
            )
        });
        out.push(next.expect("the stream never ends"));
    }
    out
}

fn short(r: &Raw) -> String {
    match r {
        Raw::Bytes(b) => format!("Bytes({})", String::from_utf8_lossy(&b[..b.len().min(80)])),
        Raw::Invalid { bytes, reason } => format!(
            "Invalid({reason}, {} bytes: {})",
            bytes.len(),
            String::from_utf8_lossy(&bytes[..bytes.len().min(40)])
        ),
        Raw::Json(v) => format!("Json({v})"),
    }
}

fn bytes(s: &str) -> Raw {
    Raw::Bytes(s.as_bytes().to_vec())
}

// ---------------------------------------------------------------------------------------
// A Jetstream-like firehose
// ---------------------------------------------------------------------------------------

const TEXTS: [&str; 8] = [
    "今日は良い天気ですね 🌸",
    "שלום עולם! مرحبا بالعالم",
    "Привет, мир 👋🏽",
    "🦀🦀🦀 rustaceans unite",
    "नमस्ते दुनिया",
    "สวัสดีชาวโลก 🇹🇭",
    "a $dollar.dotted text with \"quotes\" and \\ backslash",
    "👨‍👩‍👧‍👦 family, 🏳️‍🌈 flag, e\u{301} combining",
];

/// Event `i`: groups of three share one `time_us` (so a reconnect lands inside a tie), texts in
/// many scripts, one big post in 97.
fn jetstream_event(i: usize) -> String {
    let time_us = 1_725_911_162_000_000u64 + (i as u64 / 3) * 1_250;
    let mut text = TEXTS[i % TEXTS.len()].to_owned();
    if i.is_multiple_of(97) {
        text = text.repeat(400); // ~10-20 KB
    }
    json!({
        "did": format!("did:plc:{:024x}", (i * 7919) % 1013),
        "time_us": time_us,
        "kind": "commit",
        "commit": {
            "rev": format!("3l3qo2vut{i:05}"),
            "operation": "create",
            "collection": "app.bsky.feed.post",
            "rkey": format!("3l3qo2vuowo2{i:x}"),
            "record": {
                "$type": "app.bsky.feed.post",
                "text": text,
                "createdAt": "2024-09-09T19:46:02.102Z",
                "langs": ["ja"],
                "facets.count": i % 5,
            },
            "cid": format!("bafyreidwaivazkwu67xztlmuobx35hs2lnfh3kolmgfmucldvhd3sgzcq{i}"),
        }
    })
    .to_string()
}

fn time_us(event: &str) -> u64 {
    serde_json::from_str::<Value>(event).unwrap()["time_us"]
        .as_u64()
        .unwrap()
}

fn query(uri: &str) -> HashMap<String, String> {
    let q = uri.split_once('?').map(|(_, q)| q).unwrap_or("");
    form_urlencoded::parse(q.as_bytes()).into_owned().collect()
}

#[tokio::test]
async fn jetstream_like_replay_across_server_closes_delivers_every_event_once() {
    const N: usize = 1000;
    let events: Arc<Vec<String>> = Arc::new((0..N).map(jetstream_event).collect());
    let evs = events.clone();
    // Connection k serves 250 + k events from the cursor (inclusive), then closes; the last
    // one reaches the end and stays open. So closes land on each position inside a tie.
    let (srv, addr) = Server::start(move |k, tcp, srv| {
        let events = evs.clone();
        async move {
            let mut ws = srv.accept(tcp).await;
            let uri = srv.seen()[k].uri.clone();
            let from = match query(&uri).get("cursor") {
                Some(c) => {
                    let c: u64 = c.parse().unwrap();
                    events
                        .iter()
                        .position(|e| time_us(e) >= c)
                        .unwrap_or(events.len())
                }
                None => 0,
            };
            let until = (from + 250 + k).min(events.len());
            for e in &events[from..until] {
                send_text(&mut ws, e).await;
            }
            srv.note(format!("{k} {from} {until}"));
            if until == events.len() {
                stall(ws).await;
            } else {
                close(ws, "rotating").await;
            }
        }
    })
    .await;
    let mut o = options(
        addr,
        "/subscribe?wantedCollections=app.bsky.feed.post&wantedDids=did:plc:a%2Bb",
    );
    o.resume = Some(Resume {
        field: "time_us".into(),
        param: "cursor".into(),
    });
    let mut s = source("jet", o);
    let got = take(&mut s, N).await;

    for (i, (raw, want)) in got.iter().zip(events.iter()).enumerate() {
        assert!(
            raw == &bytes(want),
            "event {i} handed over exactly once, in order, bytes untouched ($type kept): \
             expected {}, got {}",
            short(&bytes(want)),
            short(raw)
        );
    }
    // What the server served, connection by connection.
    let served: Vec<(usize, usize, usize)> = srv
        .notes()
        .iter()
        .map(|n| {
            let v: Vec<usize> = n.split(' ').map(|x| x.parse().unwrap()).collect();
            (v[0], v[1], v[2])
        })
        .collect();
    let closes = served.iter().filter(|(_, _, until)| *until < N).count();
    assert!(closes >= 3, "at least three server-side closes: {served:?}");
    let total: usize = served.iter().map(|(_, from, until)| until - from).sum();
    let dropped = metric(DUPLICATES_DROPPED, &[("source", "jet")]);
    assert_eq!(
        dropped as usize,
        total - N,
        "every replayed event that had been handed over is dropped and counted, nothing else \
         (served {total}, distinct {N}, per connection {served:?})"
    );
    assert!(
        dropped as usize > closes,
        "closes inside a tie replay more than one event: {dropped} for {closes} closes"
    );
    assert_eq!(reconnects("jet", "closed"), closes as f64);

    let seen = srv.seen();
    assert!(
        !query(&seen[0].uri).contains_key("cursor"),
        "first connection: no cursor"
    );
    for (k, req) in seen.iter().enumerate().skip(1) {
        let q = query(&req.uri);
        let (_, _, until_before) = served.iter().find(|(c, _, _)| *c == k - 1).unwrap();
        let last = time_us(&events[until_before - 1]);
        assert_eq!(
            q.get("cursor"),
            Some(&last.to_string()),
            "connection {k} resumes at the last event handed over: {}",
            req.uri
        );
        assert_eq!(q["wantedCollections"], "app.bsky.feed.post", "{}", req.uri);
        assert!(
            req.uri.contains("wantedDids=did:plc:a%2Bb"),
            "other parameters kept byte for byte: {}",
            req.uri
        );
    }
    log_line(&["jet", "the server closed the connection", "1000 rotating"]).await;
}

// ---------------------------------------------------------------------------------------
// Subscribe
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn the_subscribe_message_is_sent_after_every_reconnect() {
    const SUB: &str =
        r#"{"type":"subscribe","product_ids":["BTC-USD","ETH-€"],"note":"ティッカー 📈"}"#;
    let (srv, addr) = Server::start(|k, tcp, srv| async move {
        let mut ws = srv.accept(tcp).await;
        // Silent until told what to send.
        let first = tokio::time::timeout(T, ws.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        srv.note(format!("{k}:{}", first.to_text().unwrap()));
        for j in 0..2 {
            send_text(
                &mut ws,
                &format!("{{\"conn\":{k},\"j\":{j},\"price\":\"64 012.5\"}}"),
            )
            .await;
        }
        if k < 2 {
            close(ws, "bye").await;
        } else {
            stall(ws).await;
        }
    })
    .await;
    let mut o = options(addr, "/feed");
    o.subscribe = Some(SUB.into());
    let mut s = source("sub", o);
    let got = take(&mut s, 6).await;
    let want: Vec<Raw> = (0..3)
        .flat_map(|k| {
            (0..2).map(move |j| {
                bytes(&format!(
                    "{{\"conn\":{k},\"j\":{j},\"price\":\"64 012.5\"}}"
                ))
            })
        })
        .collect();
    assert_eq!(got, want);
    let mut notes = srv.notes();
    notes.sort();
    assert_eq!(
        notes,
        (0..3).map(|k| format!("{k}:{SUB}")).collect::<Vec<_>>(),
        "each connection's first message is the subscribe message"
    );
}

// ---------------------------------------------------------------------------------------
// Bad input
// ---------------------------------------------------------------------------------------

/// Bytes the server managed to write of the 10 MB frame before the source dropped it.
static WRITTEN_OF_BIG: OnceLock<(usize, usize)> = OnceLock::new();

#[tokio::test]
async fn bad_frames_become_dead_letters_and_reconnects() {
    const BIG: usize = 10 << 20;
    let (_srv, addr) = Server::start(|k, tcp, srv| async move {
        let mut ws = srv.accept(tcp).await;
        match k {
            0 => {
                send_text(&mut ws, "{\"n\":1}").await;
                ws.send(Message::binary(vec![0u8, 1, 2, 255]))
                    .await
                    .unwrap();
                send_text(&mut ws, "not json at all ✓ — «ok»").await;
                send_text(&mut ws, "{\"a\":1}\r\n\n   \n{\"b\":\"ß\"}\n").await;
                // Invalid UTF-8 in a text frame: only a raw write can send it.
                let frame = raw_frame(1, b"{\"bad\":\"\xff\xfe\"}");
                ws.get_mut().write_all(&frame).await.unwrap();
                stall(ws).await;
            }
            1 => {
                send_text(&mut ws, "{\"n\":2}").await;
                // A 10 MB text frame, streamed from a 64 KB buffer (the server holds no 10 MB).
                let tcp = ws.get_mut();
                tcp.write_all(&raw_frame_header(1, BIG)).await.unwrap();
                let mut chunk = vec![b'x'; 64 << 10];
                chunk[..8].copy_from_slice(b"{\"big\":\"");
                let mut written = 0;
                while written < BIG {
                    let n = chunk.len().min(BIG - written);
                    match tcp.write_all(&chunk[..n]).await {
                        Ok(()) => written += n,
                        Err(_) => break,
                    }
                    chunk[..8].copy_from_slice(b"xxxxxxxx");
                }
                let _ = WRITTEN_OF_BIG.set((written, BIG));
            }
            2 => {
                send_text(&mut ws, "{\"n\":3}").await;
                // A frame announcing 100 bytes, cut after 10 by a TCP close.
                let tcp = ws.get_mut();
                let mut cut = raw_frame_header(1, 100);
                cut.extend_from_slice(b"{\"cut\":\"ab");
                tcp.write_all(&cut).await.unwrap();
                tcp.shutdown().await.unwrap();
                let _ = tokio::time::timeout(T, async { while ws.next().await.is_some() {} }).await;
            }
            _ => {
                send_text(&mut ws, "{\"n\":4}").await;
                stall(ws).await;
            }
        }
    })
    .await;
    let mut o = options(addr, "/bad");
    o.max_frame = 64 << 10;
    let mut s = source("bad", o);
    let got = take(&mut s, 11).await;
    let mut big_prefix = b"{\"big\":\"".to_vec();
    big_prefix.resize(4096, b'x');
    let want = vec![
        bytes("{\"n\":1}"),
        Raw::Invalid {
            bytes: vec![0, 1, 2, 255],
            reason: RejectReason::BinaryFrame,
        },
        bytes("not json at all ✓ — «ok»"),
        bytes("{\"a\":1}"),
        bytes("{\"b\":\"ß\"}"),
        Raw::Invalid {
            bytes: b"{\"bad\":\"\xff\xfe\"}".to_vec(),
            reason: RejectReason::InvalidUtf8,
        },
        bytes("{\"n\":2}"),
        Raw::Invalid {
            bytes: big_prefix,
            reason: RejectReason::TooLarge,
        },
        bytes("{\"n\":3}"),
        Raw::Invalid {
            bytes: b"{\"cut\":\"ab".to_vec(),
            reason: RejectReason::Truncated,
        },
        bytes("{\"n\":4}"),
    ];
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            g == w,
            "record {i}: expected {}, got {}",
            short(w),
            short(g)
        );
    }
    assert_eq!(
        reconnects("bad", "read_error"),
        3.0,
        "invalid UTF-8, too large and the cut frame each end a connection"
    );
    let (written, total) = tokio::time::timeout(T, async {
        loop {
            if let Some(w) = WRITTEN_OF_BIG.get() {
                return *w;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap();
    assert!(
        written < total,
        "the source refused the 10 MB frame on its header and dropped the connection, so the \
         server could not write it all: wrote {written} of {total}"
    );
    log_line(&["bad", "10485760 bytes is over the limit of 65536"]).await;
    log_line(&["bad", "not UTF-8"]).await;
    log_line(&["bad", "cut inside a frame"]).await;
}

#[tokio::test]
async fn a_stalled_connection_is_dropped_after_the_idle_timeout() {
    let (srv, addr) = Server::start(|k, tcp, srv| async move {
        let mut ws = srv.accept(tcp).await;
        send_text(&mut ws, &format!("{{\"n\":{k}}}")).await;
        stall(ws).await;
    })
    .await;
    let mut o = options(addr, "/quiet");
    o.idle_timeout = Duration::from_millis(300);
    let mut s = source("stall", o);
    assert_eq!(
        take(&mut s, 2).await,
        vec![bytes("{\"n\":0}"), bytes("{\"n\":1}")]
    );
    let seen = srv.seen();
    let gap = seen[1].at - seen[0].at;
    assert!(
        gap >= Duration::from_millis(300),
        "reconnected only after the idle timeout: {gap:?}"
    );
    log_line(&["stall", "no frame for 300 ms"]).await;
    assert!(reconnects("stall", "idle_timeout") >= 1.0);
}

#[tokio::test]
async fn a_server_that_never_answers_the_upgrade_hits_the_connect_timeout() {
    let (srv, addr) = Server::start(|_, tcp, _| stall(tcp)).await;
    let mut o = options(addr, "/silent");
    o.connect_timeout = Duration::from_millis(200);
    let s = source("silent", o);
    let pending = tokio::spawn(async move {
        let mut s = s;
        s.next().await
    });
    srv.connections(2).await;
    log_line(&["silent", "no answer within 200 ms", "never connected yet"]).await;
    assert!(reconnects("silent", "connect_error") >= 1.0);
    assert!(
        !pending.is_finished(),
        "no record, and the stream did not end"
    );
    pending.abort();
}

#[tokio::test]
async fn refused_upgrades_are_logged_with_status_and_body_and_retry_after_is_honoured() {
    let (srv, addr) = Server::start(|k, tcp, srv| async move {
        match k {
            0 => {
                srv.refuse(tcp, 403, &[], "forbidden:\n  bad token 🙅")
                    .await
            }
            1 => {
                srv.refuse(tcp, 429, &[("retry-after", "1")], "slow down")
                    .await
            }
            _ => {
                let mut ws = srv.accept(tcp).await;
                send_text(&mut ws, "{\"ok\":true}").await;
                stall(ws).await;
            }
        }
    })
    .await;
    let mut s = source("refused", options(addr, "/r"));
    assert_eq!(take(&mut s, 1).await, vec![bytes("{\"ok\":true}")]);
    let seen = srv.seen();
    let backoff = seen[1].at - seen[0].at;
    let retry = seen[2].at - seen[1].at;
    assert!(
        backoff < Duration::from_millis(900),
        "a 403 without Retry-After waits the backoff: {backoff:?}"
    );
    assert!(
        retry >= Duration::from_millis(950),
        "Retry-After: 1 waits a second, not the 10 ms backoff: {retry:?}"
    );
    let line = log_line(&["refused", "403 Forbidden"]).await;
    assert!(
        line.contains("forbidden: bad token 🙅"),
        "a one-line body excerpt: {line}"
    );
    log_line(&[
        "refused",
        "429 Too Many Requests",
        "slow down",
        "reconnecting in 1.0 s",
    ])
    .await;
    assert_eq!(reconnects("refused", "http_status"), 2.0);
}

#[tokio::test]
async fn a_server_that_is_down_at_start_is_retried_until_it_is_up() {
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let s = source("down", options(addr, "/d"));
    let first = tokio::spawn(async move {
        let mut s = s;
        take(&mut s, 1).await
    });
    let line = log_line(&["down", "cannot connect", "never connected yet"]).await;
    assert!(line.contains("onnection refused"), "{line}");
    let (_srv, _) = Server::start_on(addr, |_, tcp, srv| async move {
        let mut ws = srv.accept(tcp).await;
        send_text(&mut ws, "{\"up\":1}").await;
        stall(ws).await;
    })
    .await;
    assert_eq!(
        tokio::time::timeout(T, first).await.unwrap().unwrap(),
        vec![bytes("{\"up\":1}")]
    );
}

// ---------------------------------------------------------------------------------------
// Keep-alive
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn server_pings_are_answered_with_pongs() {
    let (srv, addr) = Server::start(|_, tcp, srv| async move {
        let mut ws = srv.accept(tcp).await;
        ws.send(Message::Ping("hb-1 ❤".as_bytes().to_vec().into()))
            .await
            .unwrap();
        let pong = tokio::time::timeout(T, async {
            loop {
                match ws.next().await {
                    Some(Ok(Message::Pong(p))) => return p,
                    Some(Ok(_)) => continue,
                    other => panic!("no pong: {other:?}"),
                }
            }
        })
        .await
        .unwrap();
        srv.note(String::from_utf8(pong.to_vec()).unwrap());
        send_text(&mut ws, "{\"after\":\"pong\"}").await;
        stall(ws).await;
    })
    .await;
    let mut s = source("pinged", options(addr, "/p"));
    assert_eq!(take(&mut s, 1).await, vec![bytes("{\"after\":\"pong\"}")]);
    assert_eq!(
        srv.notes(),
        vec!["hb-1 ❤".to_owned()],
        "the pong echoes the ping"
    );
}

#[tokio::test]
async fn our_pings_keep_a_quiet_connection_alive_past_the_idle_timeout() {
    let quiet = Duration::from_millis(1200);
    let (srv, addr) = Server::start(move |_, tcp, srv| async move {
        let mut ws = srv.accept(tcp).await;
        let mut pings = 0;
        // Quiet for three idle timeouts, reading (so tungstenite answers each ping), then one
        // event.
        let until = tokio::time::sleep(quiet);
        tokio::pin!(until);
        loop {
            tokio::select! {
                m = ws.next() => match m {
                    Some(Ok(Message::Ping(_))) => pings += 1,
                    Some(Ok(_)) => {}
                    _ => { srv.note("the client went away"); return; }
                },
                _ = &mut until => break,
            }
        }
        srv.note(format!("pings {pings}"));
        send_text(&mut ws, "{\"still\":\"here\"}").await;
        stall(ws).await;
    })
    .await;
    let mut o = options(addr, "/q");
    o.idle_timeout = Duration::from_millis(400);
    o.ping_interval = Some(Duration::from_millis(100));
    let mut s = source("keepalive", o);
    assert_eq!(take(&mut s, 1).await, vec![bytes("{\"still\":\"here\"}")]);
    assert_eq!(
        srv.seen().len(),
        1,
        "one connection, kept: {:?}",
        srv.notes()
    );
    let notes = srv.notes();
    let pings: usize = notes[0].strip_prefix("pings ").unwrap().parse().unwrap();
    assert!(pings >= 3, "pings every 100 ms over 1.2 s: {pings}");
    assert_eq!(reconnects("keepalive", "idle_timeout"), 0.0);
}

// ---------------------------------------------------------------------------------------
// Headers
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn user_agent_by_default_replaced_when_configured_and_secrets_never_logged() {
    let script = |k: usize, tcp: TcpStream, srv: Arc<Server>| async move {
        if k == 0 {
            return srv.refuse(tcp, 401, &[], "who are you").await;
        }
        let mut ws = srv.accept(tcp).await;
        send_text(&mut ws, "{\"n\":1}").await;
        stall(ws).await;
    };
    // Default User-Agent.
    let (plain, addr) = Server::start(script).await;
    let mut s = source("plain-ua", options(addr, "/h"));
    assert_eq!(take(&mut s, 1).await, vec![bytes("{\"n\":1}")]);
    for seen in plain.seen() {
        assert_eq!(seen.headers["user-agent"], USER_AGENT);
    }
    assert!(USER_AGENT.starts_with(&format!(
        "tailrace/{} (+https://",
        env!("CARGO_PKG_VERSION")
    )));

    // Configured User-Agent, a secret header and a token in the query.
    let (custom, addr) = Server::start(script).await;
    let mut o = options(addr, "/h?access_token=q-71c3e&x=1");
    o.headers = vec![
        ("User-Agent".into(), "my-bot/2.0 (ops@example.org)".into()),
        ("Authorization".into(), "Bearer tok-93f2b".into()),
    ];
    let mut s = source("secret-ws", o);
    assert_eq!(take(&mut s, 1).await, vec![bytes("{\"n\":1}")]);
    for seen in custom.seen() {
        assert_eq!(seen.headers["user-agent"], "my-bot/2.0 (ops@example.org)");
        assert_eq!(seen.headers.get_all("user-agent").iter().count(), 1);
        assert_eq!(seen.headers["authorization"], "Bearer tok-93f2b");
        assert!(seen.uri.contains("access_token=q-71c3e"), "{}", seen.uri);
    }
    log_line(&["secret-ws", "401"]).await;
    log_line(&["secret-ws", "connected"]).await;
    let text = log_text();
    for secret in ["tok-93f2b", "q-71c3e"] {
        assert!(!text.contains(secret), "{secret} was logged:\n{text}");
    }
}

// ---------------------------------------------------------------------------------------
// Measurements (run alone, in release):
//   cargo test --release -p ingest --test sources_websocket -- --ignored --nocapture --test-threads 1
// ---------------------------------------------------------------------------------------

/// The process's peak resident set, in KiB (Linux).
fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run alone, in release"]
async fn measure_throughput_over_loopback() {
    const M: usize = 100_000;
    let events: Arc<Vec<String>> = Arc::new((0..M).map(jetstream_event).collect());
    let total_bytes: usize = events.iter().map(String::len).sum();
    for resume in [false, true] {
        let evs = events.clone();
        let (_srv, addr) = Server::start(move |_, tcp, srv| {
            let events = evs.clone();
            async move {
                let mut ws = srv.accept(tcp).await;
                for chunk in events.chunks(64) {
                    for e in chunk {
                        ws.feed(Message::text(e.as_str())).await.unwrap();
                    }
                    ws.flush().await.unwrap();
                }
                stall(ws).await;
            }
        })
        .await;
        let mut o = options(addr, "/firehose?wantedCollections=app.bsky.feed.post");
        if resume {
            o.resume = Some(Resume {
                field: "time_us".into(),
                param: "cursor".into(),
            });
        }
        let name = if resume {
            "measure-resume"
        } else {
            "measure-plain"
        };
        // Not `source()`: its trace-level log capture would format every message, and that
        // would be what is measured.
        recorder();
        let mut s = Box::new(WebSocketSource::new(name, o)).records();
        let started = Instant::now();
        let mut n = 0;
        while n < M {
            let r = tokio::time::timeout(Duration::from_secs(120), s.next())
                .await
                .unwrap()
                .unwrap();
            assert!(matches!(r, Raw::Bytes(_)), "{}", short(&r));
            n += 1;
        }
        let secs = started.elapsed().as_secs_f64();
        println!(
            "websocket source, {M} Jetstream-like events ({:.0} B mean), resume={resume}: \
             {:.3} s, {:.0} events/s, {:.1} MB/s",
            total_bytes as f64 / M as f64,
            secs,
            M as f64 / secs,
            total_bytes as f64 / secs / 1e6
        );
    }
}

#[tokio::test]
#[ignore = "a measurement: run alone (peak RSS is per process)"]
async fn measure_peak_memory_on_a_10_mb_frame() {
    const BIG: usize = 10 << 20;
    let before = peak_rss_kib().unwrap();
    let (_srv, addr) = Server::start(|k, tcp, srv| async move {
        let mut ws = srv.accept(tcp).await;
        if k > 0 {
            send_text(&mut ws, "{\"after\":1}").await;
            return stall(ws).await;
        }
        let tcp = ws.get_mut();
        tcp.write_all(&raw_frame_header(1, BIG)).await.unwrap();
        let chunk = vec![b'x'; 64 << 10];
        let mut written = 0;
        while written < BIG && tcp.write_all(&chunk).await.is_ok() {
            written += chunk.len();
        }
    })
    .await;
    let mut o = options(addr, "/big");
    o.max_frame = 64 << 10;
    let mut s = source("measure-big", o);
    let got = take(&mut s, 2).await;
    assert!(matches!(
        &got[0],
        Raw::Invalid {
            reason: RejectReason::TooLarge,
            ..
        }
    ));
    let after = peak_rss_kib().unwrap();
    println!(
        "10 MB frame against a 64 KB limit: peak RSS {before} KiB before, {after} KiB after \
         (+{} KiB)",
        after.saturating_sub(before)
    );
    assert!(
        after - before < 4096,
        "the frame was not buffered: +{} KiB",
        after - before
    );
}
