//! The custom-source example (`examples/custom_source.rs`) against a local stand-in for a
//! polling API (GitHub's events): it asks once per interval whatever the answer held, waits
//! as long as `X-Poll-Interval`, `Retry-After` or an exhausted rate limit say, and backs off
//! when refused without being told for how long. The example's own code runs here, included
//! as a module; its `main` runs the same source through the library's pipeline.

#![allow(clippy::unwrap_used)]

#[allow(dead_code)]
#[path = "../examples/custom_source.rs"]
mod example;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use ingest::source::{Raw, Source};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// One scripted answer.
struct Answer {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: String,
}

impl Answer {
    fn ok(body: Value) -> Answer {
        Answer {
            status: 200,
            headers: vec![],
            body: body.to_string(),
        }
    }

    fn with(mut self, name: &'static str, value: impl ToString) -> Answer {
        self.headers.push((name, value.to_string()));
        self
    }
}

/// When each request arrived.
type Log = Arc<Mutex<Vec<Instant>>>;

/// A local HTTP/1.1 server answering request `n` (from 0) with `script(n)`; keeps connections
/// alive as a real API does.
async fn stand_in(script: impl Fn(usize) -> Answer + Send + Sync + 'static) -> (String, Log) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/events", listener.local_addr().unwrap());
    let log: Log = Arc::default();
    let script = Arc::new(script);
    let requests = log.clone();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let (log, script) = (requests.clone(), script.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match conn.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
                    buf.drain(..end);
                    let n = {
                        let mut log = log.lock().unwrap();
                        log.push(Instant::now());
                        log.len() - 1
                    };
                    let a = script(n);
                    let mut head = format!(
                        "HTTP/1.1 {} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
                        a.status,
                        a.body.len()
                    );
                    for (k, v) in &a.headers {
                        head.push_str(&format!("{k}: {v}\r\n"));
                    }
                    head.push_str("\r\n");
                    if conn.write_all(head.as_bytes()).await.is_err()
                        || conn.write_all(a.body.as_bytes()).await.is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    (url, log)
}

/// Runs the example's source on `url`, polling every `every`; its records arrive on the
/// receiver.
fn poll(url: String, every: Duration) -> mpsc::UnboundedReceiver<Raw> {
    let source = Box::new(example::PollingSource {
        name: "polling".into(),
        url,
        every,
    });
    let mut records = source.records();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(r) = records.next().await {
            if tx.send(r).is_err() {
                return;
            }
        }
    });
    rx
}

/// Waits (at most 20 s) until `n` requests arrived; returns the gaps between them.
async fn gaps(log: &Log, n: usize) -> Vec<Duration> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let arrived = log.lock().unwrap().clone();
        if arrived.len() >= n {
            return arrived[..n].windows(2).map(|w| w[1] - w[0]).collect();
        }
        assert!(
            Instant::now() < deadline,
            "{n} requests expected within 20 s, {} arrived",
            arrived.len()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Ten events per answer, the newest first, five of them new each time (the stand-in).
fn ten_five_new(n: usize) -> Value {
    json!(
        (0..10)
            .rev()
            .map(|i| json!({"id": n * 5 + i, "type": "PushEvent"}))
            .collect::<Vec<_>>()
    )
}

fn unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

#[tokio::test]
async fn polls_once_per_interval_however_much_was_new() {
    let every = Duration::from_millis(200);
    let (url, log) = stand_in(|n| Answer::ok(ten_five_new(n))).await;
    let mut records = poll(url, every);
    let gaps = gaps(&log, 6).await;
    for (i, g) in gaps.iter().enumerate() {
        assert!(
            *g >= every,
            "request {} came {g:?} after the one before, every answer held new events, interval {every:?}",
            i + 1
        );
    }
    // Each event once, oldest first: 10 from the first answer, 5 new from each later one.
    let mut ids = Vec::new();
    while ids.len() < 35 {
        let r = tokio::time::timeout(Duration::from_secs(5), records.recv())
            .await
            .unwrap()
            .unwrap();
        let Raw::Json(v) = r else {
            panic!("a JSON event, saw {r:?}")
        };
        ids.push(v["id"].as_u64().unwrap());
    }
    assert_eq!(
        ids,
        (0..35).collect::<Vec<_>>(),
        "each event once, in order"
    );
}

#[tokio::test]
async fn waits_as_long_as_x_poll_interval_says() {
    let every = Duration::from_millis(50);
    let (url, log) = stand_in(|n| Answer::ok(ten_five_new(n)).with("x-poll-interval", 1)).await;
    let _records = poll(url, every);
    for g in gaps(&log, 3).await {
        assert!(
            g >= Duration::from_secs(1),
            "X-Poll-Interval: 1 asks for a second between requests, saw {g:?}"
        );
    }
}

#[tokio::test]
async fn waits_as_long_as_retry_after_or_the_rate_limit_says() {
    let every = Duration::from_millis(50);
    let (url, log) = stand_in(|n| match n {
        0 => Answer {
            status: 429,
            headers: vec![("retry-after", "1".into())],
            body: "{\"message\": \"slow down\"}".into(),
        },
        1 => Answer::ok(ten_five_new(n))
            .with("x-ratelimit-remaining", 0)
            .with("x-ratelimit-reset", unix_secs() + 2),
        _ => Answer::ok(ten_five_new(n)),
    })
    .await;
    let _records = poll(url, every);
    let gaps = gaps(&log, 4).await;
    assert!(
        gaps[0] >= Duration::from_secs(1),
        "429 with Retry-After: 1, the next request came after {:?}",
        gaps[0]
    );
    assert!(
        gaps[1] >= Duration::from_secs(1),
        "the rate limit exhausted until the next second at least, the next request came after {:?}",
        gaps[1]
    );
    assert!(
        gaps[2] < Duration::from_millis(900),
        "with the limit back, the interval again ({every:?}), saw {:?}",
        gaps[2]
    );
}

#[tokio::test]
async fn backs_off_when_refused_without_being_told_how_long() {
    let every = Duration::from_millis(50);
    let (url, log) = stand_in(|n| {
        if n < 5 {
            Answer {
                status: 403,
                headers: vec![],
                body: "{\"message\": \"API rate limit exceeded\"}".into(),
            }
        } else {
            Answer::ok(ten_five_new(n))
        }
    })
    .await;
    let _records = poll(url, every);
    let gaps = gaps(&log, 7).await;
    let refused: Duration = gaps[..5].iter().sum();
    // Waits double from twice the interval, each at least half its step: 50 + 100 + 200 +
    // 400 + 800 ms at the least, where polling at the interval would take 250.
    assert!(
        refused >= Duration::from_millis(1550),
        "five refusals in a row: the waits after them add up to {refused:?} ({gaps:?})"
    );
    assert!(gaps[4] > gaps[0], "the waits grow, saw {gaps:?}");
    assert!(
        gaps[5] < Duration::from_millis(400),
        "after an answer the interval again ({every:?}), saw {gaps:?}"
    );
}

#[test]
fn an_http_date_retry_after_counts_from_now() {
    let now = SystemTime::now();
    let mut headers = reqwest::header::HeaderMap::new();
    let at = httpdate::fmt_http_date(now + Duration::from_secs(120));
    headers.insert("retry-after", at.parse().unwrap());
    let mut backoff = store::backoff::Backoff::new(Duration::from_secs(2), Duration::from_secs(60));
    let wait = example::next_wait(
        reqwest::StatusCode::SERVICE_UNAVAILABLE,
        &headers,
        Duration::from_secs(1),
        &mut backoff,
        now,
    );
    assert!(
        (Duration::from_secs(119)..=Duration::from_secs(120)).contains(&wait),
        "Retry-After two minutes from now, saw {wait:?}"
    );
}

/// The example's source through the library's pipeline alone (what its `main` does): the
/// events it hands over are stored, counted in its rollup and seen by the default feeds, and
/// the pipeline stops cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_through_the_library_pipeline() {
    let (url, _log) = stand_in(|n| Answer::ok(ten_five_new(n))).await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = ingest::config::Config::default();
    config.store.engine =
        ingest::config::Engine::Embedded(store::embedded::EmbeddedSettings::at(dir.path()));
    config.sources.clear();
    let source = example::PollingSource {
        name: "polling".into(),
        url,
        every: Duration::from_millis(100),
    };
    let pipeline = ingest::pipeline::Pipeline::build(config, vec![Box::new(source)])
        .await
        .unwrap();
    let rollups = pipeline.collections().rollups.clone();
    let feeds = pipeline.feeds().clone();
    let running = pipeline.start().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let summary = rollups.get("source:polling").await.unwrap();
        let counted = summary.and_then(|d| d["count"].as_u64()).unwrap_or(0);
        let held = feeds.iter().map(|f| f.status().events).min().unwrap_or(0);
        if counted >= 20 && held >= 20 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "20 events stored and held by both feeds within 30 s; counted {counted}, the slower feed held {held}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let report = running.stop().await;
    assert!(report.is_clean(), "a clean stop, saw {:?}", report.problems);
}

/// A source of two events, one with a GeoJSON point at `where`, which it says is where its
/// events come from ([`Source::geo`]).
struct Placed;

impl Source for Placed {
    fn name(&self) -> &str {
        "placed"
    }

    fn kind(&self) -> &str {
        "test"
    }

    fn records(self: Box<Self>) -> futures::stream::BoxStream<'static, Raw> {
        let events = vec![
            Raw::Json(json!({"n": 1, "where": {"type": "Point", "coordinates": [139.69, 35.69]}})),
            Raw::Json(json!({"n": 2})),
        ];
        futures::stream::iter(events).boxed()
    }

    fn geo(&self) -> Option<ingest::geo::GeoConfig> {
        Some(ingest::geo::GeoConfig {
            point: Some("where".into()),
            ..Default::default()
        })
    }
}

/// A source plugged in with `Pipeline::build` places its events by the rules it gives, as a
/// configured source by its `geo`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugged_in_source_places_its_events_by_its_own_rules() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = ingest::config::Config::default();
    config.store.engine =
        ingest::config::Engine::Embedded(store::embedded::EmbeddedSettings::at(dir.path()));
    config.sources.clear();
    let pipeline = ingest::pipeline::Pipeline::build(config, vec![Box::new(Placed)])
        .await
        .unwrap();
    let events = pipeline.collections().events.clone();
    let running = pipeline.start().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let docs = loop {
        let mut tail = events.tail(store::Start::Oldest);
        let mut docs = Vec::new();
        while docs.len() < 2 {
            match tokio::time::timeout(Duration::from_millis(200), tail.next()).await {
                Ok(Some(Ok(r))) => docs.push(r.doc),
                _ => break,
            }
        }
        if docs.len() == 2 {
            break docs;
        }
        assert!(Instant::now() < deadline, "both events stored within 30 s");
    };
    let report = running.stop().await;
    assert!(report.is_clean(), "a clean stop, saw {:?}", report.problems);
    let geo = |d: &store::Document| d["_tailrace"].get("geo").cloned();
    let placed = geo(&docs[0]).expect("the first event is placed");
    assert_eq!(placed["precision"], "point");
    assert_eq!(placed["country"], Value::Null);
    assert!(
        (placed["lon"].as_f64().unwrap() - 139.69).abs() < 1e-9,
        "{placed}"
    );
    assert_eq!(geo(&docs[1]), None, "the second has no point");
}
