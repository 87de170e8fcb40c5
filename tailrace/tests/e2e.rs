//! End to end: the real binary, its real `/metrics`, its real API.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::Tailrace;

/// The default pipeline ingests at about the configured rate, and both feeds show write and
/// notification latency, Bollinger bands and complete sequences.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_pipeline_exposes_its_metrics() {
    let dir = tempfile::tempdir().unwrap();
    // A short Bollinger period so the rate bands are defined within seconds.
    let mut t = Tailrace::start(dir.path(), &[("TAILRACE_STATS__PERIOD", "3")]).await;
    let first = t.metrics().await;
    // Incident counters exist at zero from the start on a healthy pipeline, so panels and
    // alerts see 0, not "No data".
    for reason in [
        "malformed_json",
        "too_large",
        "invalid_key",
        "store_rejected",
    ] {
        assert_eq!(
            first.one(
                "tailrace_events_rejected_total",
                &[("source", "sample"), ("reason", reason)]
            ),
            Some(0.0),
            "rejections for {reason} at zero\n{}",
            t.report()
        );
    }
    for feed in ["tail", "changes"] {
        for reason in ["position_lost", "history_lost", "cursor_died", "error"] {
            assert_eq!(
                first.one(
                    "tailrace_feed_restarts_total",
                    &[("feed", feed), ("reason", reason)]
                ),
                Some(0.0),
                "{feed} restarts for {reason} at zero"
            );
        }
    }
    let started = std::time::Instant::now();
    let events_at =
        |m: &common::Metrics| m.sum("tailrace_source_events_total", &[("source", "sample")]);
    t.wait_until(
        "the rate bands of both feeds exist",
        Duration::from_secs(30),
        async |t| {
            let m = t.metrics().await;
            ["tail", "changes"].iter().all(|f| {
                m.one(
                    "tailrace_bollinger",
                    &[("feed", f), ("series", "rate"), ("band", "upper")],
                )
                .is_some()
            })
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let m = t.metrics().await;
    let secs = started.elapsed().as_secs_f64();
    let rate = (events_at(&m) - events_at(&first)) / secs;
    // Poisson arrivals at 70/s with bursts (5x for 3 s, 1% chance per second): over a few
    // seconds the mean stays within a wide band, up to the burst rate (350/s) when a burst
    // covers the window; a broken pacer is far outside it.
    assert!(
        (35.0..=450.0).contains(&rate),
        "ingest rate {rate:.1}/s over {secs:.1} s\n{}",
        t.report()
    );

    let written = m.sum(
        "tailrace_write_latency_seconds_count",
        &[
            ("collection", "events"),
            ("engine", "embedded"),
            ("durability", "journaled"),
        ],
    );
    assert!(
        written > 0.0,
        "write latency histogram of events is populated\n{}",
        t.report()
    );
    assert!(
        !m.find(
            "tailrace_write_latency_seconds_bucket",
            &[("collection", "events"), ("le", "0.0001")]
        )
        .is_empty(),
        "write latency is a real histogram with fine buckets"
    );
    for feed in ["tail", "changes"] {
        let n = m.sum(
            "tailrace_notification_latency_seconds_count",
            &[("feed", feed), ("engine", "embedded")],
        );
        assert!(
            n > 0.0,
            "notification latency of feed {feed} is populated\n{}",
            t.report()
        );
        let e2e = m.sum(
            "tailrace_end_to_end_latency_seconds_count",
            &[("feed", feed)],
        );
        assert!(e2e > 0.0, "end-to-end latency of feed {feed} is populated");
        for series in ["rate", "value"] {
            let band = |b: &str| {
                m.one(
                    "tailrace_bollinger",
                    &[("feed", feed), ("series", series), ("band", b)],
                )
            };
            let (u, mid, l) = (band("upper"), band("middle"), band("lower"));
            let (u, mid, l) = (u.unwrap(), mid.unwrap(), l.unwrap());
            assert!(
                u >= mid && mid >= l,
                "{feed}/{series}: upper {u} >= middle {mid} >= lower {l}"
            );
        }
        assert!(
            m.one("tailrace_rate_events_per_second", &[("feed", feed)])
                .is_some()
        );
        assert_eq!(
            m.sum("tailrace_feed_missing_events_total", &[("feed", feed)]),
            0.0,
            "{feed}: no missing sequence numbers"
        );
        assert_eq!(
            m.sum("tailrace_feed_duplicate_events_total", &[("feed", feed)]),
            0.0,
            "{feed}: no duplicates"
        );
    }
    for (name, ty) in [
        ("tailrace_write_latency_seconds", "histogram"),
        ("tailrace_notification_latency_seconds", "histogram"),
        ("tailrace_source_events_total", "counter"),
        ("tailrace_feed_lag_events", "gauge"),
    ] {
        assert_eq!(
            m.types.get(name).map(String::as_str),
            Some(ty),
            "{name} is a {ty}"
        );
        assert!(
            m.help.get(name).is_some_and(|h| !h.is_empty()),
            "{name} has a description"
        );
    }

    let status = t.json("/api/status").await;
    assert_eq!(status["info"]["engine"], "embedded");
    assert!(status["ingest"]["written"].as_u64().unwrap() > 0);
    let feeds = t.json("/api/feeds").await;
    assert_eq!(feeds.as_array().unwrap().len(), 2);
    assert!(
        feeds[0]["stats"]["events"].as_u64().unwrap() > 0,
        "feed status carries statistics: {feeds}"
    );
    let top = t.json("/api/rollups?prefix=hashtags:").await;
    assert!(
        !top.as_array().unwrap().is_empty(),
        "hashtag counters exist"
    );
    // The outbox query: the newest events of one user, through the index.
    let user = t.json("/api/events/1").await["doc"]["user"]["screen_name"]
        .as_str()
        .unwrap()
        .to_string();
    let latest = t
        .json(&format!(
            "/api/events/latest?field=user.screen_name&value={user}&limit=5"
        ))
        .await;
    let latest = latest.as_array().unwrap();
    assert!(
        !latest.is_empty()
            && latest
                .iter()
                .all(|r| r["doc"]["user"]["screen_name"] == user.as_str())
    );
    let (code, body) = t.get("/api/events/latest?field=text&value=x").await;
    assert_eq!(code, 400, "unindexed field is a client error: {body}");
    t.stop().await;
}

/// `check-config` prints the effective config; a bad key is a one-line error naming it.
#[test]
fn check_config_names_bad_keys() {
    let bin = env!("CARGO_BIN_EXE_tailrace");
    let ok = std::process::Command::new(bin)
        .arg("check-config")
        .env_remove("TAILRACE_CONFIG")
        .output()
        .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(String::from_utf8_lossy(&ok.stdout).contains("durability = \"journaled\""));
    let bad = std::process::Command::new(bin)
        .arg("check-config")
        .env("TAILRACE_STORE__DURABILITY", "fast")
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(
        err.contains("store.durability") && err.contains("journaled"),
        "names the key and the allowed values: {err}"
    );
}

/// `tailrace tail FEED` prints what the feed holds, live, one JSON document per line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_prints_a_feed_live() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let mut t = Tailrace::start(dir.path(), &[]).await;
    let url = format!("http://{}", t.addr);
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tailrace"))
        .args(["tail", "changes", "--url", &url])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let lines = tokio::task::spawn_blocking(move || {
        std::io::BufReader::new(stdout)
            .lines()
            .take(3)
            .collect::<Result<Vec<_>, _>>()
    });
    let lines = tokio::time::timeout(Duration::from_secs(30), lines).await;
    let _ = child.kill();
    let _ = child.wait();
    let lines = lines.expect("three lines within 30 s").unwrap().unwrap();
    for line in &lines {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert_eq!(v["feed"], "changes");
        assert_eq!(v["collection"], "rollups");
        assert!(
            v["key"].as_str().unwrap().starts_with("source:"),
            "the changes feed's filter: {line}"
        );
        assert!(
            v["doc"]["_tailrace"]["seq"].is_u64(),
            "the post-image carries the event's stamp: {line}"
        );
    }
    // `tailrace tail ... | head -1`: the reader goes away and tail ends quietly (exit 0, no
    // panic on the closed pipe), for a feed and for a collection.
    for args in [
        vec!["tail", "tail", "--url", &url],
        vec!["tail", "--collection", "events", "--url", &url],
    ] {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tailrace"))
            .args(&args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let first = tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            std::io::BufReader::new(stdout)
                .read_line(&mut line)
                .map(|_| line)
            // The reader (and the pipe's read end) is dropped here.
        });
        let first = tokio::time::timeout(Duration::from_secs(30), first)
            .await
            .expect("a line within 30 s")
            .unwrap()
            .unwrap();
        assert!(first.starts_with('{'), "{args:?}: {first}");
        let out = tokio::task::spawn_blocking(move || child.wait_with_output());
        let out = tokio::time::timeout(Duration::from_secs(30), out)
            .await
            .unwrap_or_else(|_| panic!("{args:?} did not end after its reader went away"))
            .unwrap()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    // An unknown feed is a clear error.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tailrace"))
        .args(["tail", "nope", "--url", &url])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no feed \\\"nope\\\"") || err.contains("no feed"),
        "names the problem: {err}"
    );
    t.stop().await;
}

/// A source far faster than the store waits: the queue never grows past its bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_source_meets_backpressure_not_unbounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    let sources = r#"[{ name = "flood", kind = "synthetic", rate_per_sec = 1000000.0, seed = 1 }]"#;
    let mut t = Tailrace::start(
        dir.path(),
        &[
            ("TAILRACE_SOURCES", sources),
            ("TAILRACE_INGEST__QUEUE_CAPACITY", "256"),
            ("TAILRACE_INGEST__BATCH_MAX_EVENTS", "64"),
        ],
    )
    .await;
    let mut max_depth = 0.0f64;
    let mut read = 0.0;
    for _ in 0..20 {
        let m = t.metrics().await;
        max_depth = max_depth.max(m.one("tailrace_ingest_queue_depth", &[]).unwrap_or(0.0));
        read = m.sum("tailrace_source_events_total", &[("source", "flood")]);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // One record per source may be in hand beyond the channel's capacity.
    assert!(
        max_depth <= 256.0 + 1.0,
        "queue depth {max_depth} exceeds its bound 256"
    );
    assert!(read > 1000.0, "the source did run ({read} read)");
    let status = t.json("/api/status").await;
    let written = status["ingest"]["written"].as_f64().unwrap();
    // Between the source and the store: the queue, then the ingester's two stages — one batch
    // being prepared (or waiting to be handed over), one in the hand-over channel (capacity 1),
    // one being written.
    assert!(
        read - written <= 256.0 + 3.0 * 64.0 + 1.0,
        "read {read} vs written {written}: only the queue and three batches in between"
    );
    t.stop().await;
}
