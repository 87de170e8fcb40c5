//! The `file`, `stdin` and `command` sources end to end, through the real `tailrace` binary:
//! every bad-input class is counted, dead-lettered with its reason and raw bytes, and the good
//! events around it all arrive; a finite source ends the run cleanly after flushing; the
//! `dead-letters` command lists and replays.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::Tailrace;
use futures::StreamExt;
use serde_json::{Value, json};
use store::embedded::{EmbeddedOptions, EmbeddedStore};
use store::{CappedSpec, Start, Store};

const EXIT: Duration = Duration::from_secs(60);

/// Every bad-input class a line-based source can meet, between good events.
fn bad_input() -> (Vec<u8>, Vec<(&'static str, Vec<u8>)>) {
    let mut deep = json!(1);
    for _ in 0..101 {
        deep = json!({ "d": deep });
    }
    let bad: Vec<(&str, Vec<u8>)> = vec![
        ("malformed_json", b"{\"n\": 1,".to_vec()),
        ("not_object", b"[1, 2, 3]".to_vec()),
        ("invalid_utf8", b"{\"text\": \"\xff\xfe\"}".to_vec()),
        (
            "too_large",
            format!("{{\"pad\": \"{}\"}}", "x".repeat(5000)).into_bytes(),
        ),
        // `$`-prefixed and dotted keys are events; what no engine can store is not: a NUL in
        // a key, and a key of 255 period-separated parts (MongoDB refuses it).
        ("invalid_key", b"{\"nul\\u0000key\": 1}".to_vec()),
        (
            "invalid_key",
            format!("{{\"a\": {{\"{}\": 1}}}}", vec!["p"; 255].join(".")).into_bytes(),
        ),
        ("too_deep", serde_json::to_vec(&deep).unwrap()),
    ];
    let mut text = Vec::new();
    let mut n = 0;
    let mut good = |text: &mut Vec<u8>| {
        n += 1;
        writeln!(text, "{{\"good\": {n}, \"user\": {{\"id\": {n}}}}}").unwrap();
    };
    good(&mut text);
    for (_, line) in &bad {
        text.extend_from_slice(line);
        text.push(b'\n');
        good(&mut text);
    }
    // A truncated last line.
    text.extend_from_slice(b"{\"good\": 99, \"cut");
    let mut all = bad;
    all.push(("truncated", b"{\"good\": 99, \"cut".to_vec()));
    (text, all)
}

/// Everything in a capped collection of the store at `dir` (the binary must have stopped).
async fn read_capped(dir: &Path, name: &str) -> Vec<Value> {
    let store = EmbeddedStore::open(dir, EmbeddedOptions::default())
        .unwrap_or_else(|e| panic!("opening the store in {}: {e}", dir.display()));
    let spec = CappedSpec {
        max_docs: 100_000,
        max_bytes: 64 << 20,
        indexes: vec![],
    };
    let c = store.capped(name, &spec).await.unwrap();
    let mut out = Vec::new();
    if let Some(store::Bounds { newest, .. }) = c.bounds().await.unwrap() {
        let mut tail = c.tail(Start::Oldest);
        while let Some(r) = tokio::time::timeout(EXIT, tail.next()).await.unwrap() {
            let r = r.unwrap();
            out.push(Value::Object(std::sync::Arc::unwrap_or_clone(r.doc)));
            if r.position >= newest {
                break;
            }
        }
    }
    store.close().await.unwrap();
    out
}

fn good_numbers(events: &[Value]) -> Vec<u64> {
    events.iter().filter_map(|e| e["good"].as_u64()).collect()
}

/// Runs `tailrace <args>` to completion with the test environment; (status, stdout, stderr).
fn run_cli(data: &Path, env: &[(&str, &str)], args: &[&str]) -> (bool, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tailrace"));
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("TAILRACE_")) {
        cmd.env_remove(k);
    }
    cmd.envs(common::base_env(data))
        .envs(env.iter().copied())
        .args(args)
        .stdin(Stdio::null());
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn a_file_with_every_kind_of_bad_line_is_ingested_around_them() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let file = dir.path().join("events.ndjson");
    let (text, bad) = bad_input();
    std::fs::write(&file, &text).unwrap();
    // A program that never writes keeps the run alive while the metrics are read.
    let sources = format!(
        "[{{ name = \"f\", kind = \"file\", path = \"{}\" }}, \
          {{ name = \"idle\", kind = \"command\", program = \"sleep\", args = [\"600\"], restart = false }}]",
        file.display()
    );
    // max_event_bytes 4096: the 5000-byte line is too large for the framer.
    let env = [
        ("TAILRACE_SOURCES", sources.as_str()),
        ("TAILRACE_INGEST__MAX_EVENT_BYTES", "4096"),
    ];
    let mut t = Tailrace::start(&data, &env).await;
    t.wait_until("every line is counted", EXIT, async |t| {
        let m = t.metrics().await;
        m.sum("tailrace_events_rejected_total", &[("source", "f")]) >= bad.len() as f64
    })
    .await;
    let m = t.metrics().await;
    for reason in [
        "malformed_json",
        "not_object",
        "invalid_utf8",
        "too_large",
        "too_deep",
        "truncated",
    ] {
        assert_eq!(
            m.one(
                "tailrace_events_rejected_total",
                &[("source", "f"), ("reason", reason)]
            ),
            Some(1.0),
            "one {reason} rejection\n{}",
            t.report()
        );
    }
    assert_eq!(
        m.one(
            "tailrace_events_rejected_total",
            &[("source", "f"), ("reason", "invalid_key")]
        ),
        Some(2.0)
    );
    t.stop().await;

    let events = read_capped(&data, "events").await;
    assert_eq!(
        good_numbers(&events),
        (1..=8).collect::<Vec<_>>(),
        "every good event arrives, in order"
    );
    let dead = read_capped(&data, "dead_letters").await;
    let got: Vec<(&str, &str)> = dead
        .iter()
        .map(|d| (d["reason"].as_str().unwrap(), d["raw"].as_str().unwrap()))
        .collect();
    assert_eq!(got.len(), bad.len(), "{dead:#?}");
    for ((reason, raw), (want_reason, want_raw)) in got.iter().zip(&bad) {
        assert_eq!(reason, want_reason);
        assert_eq!(d_source(&dead, reason), "f");
        if *reason == "too_large" {
            // Only a prefix was ever held: the framer's limit.
            assert_eq!(raw.len(), 4096);
            assert!(want_raw.starts_with(raw.as_bytes()));
        } else {
            assert_eq!(
                *raw,
                String::from_utf8_lossy(want_raw),
                "raw bytes of {reason}"
            );
        }
    }
}

#[tokio::test]
async fn a_finite_file_alone_ends_the_run_after_flushing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let file = dir.path().join("events.ndjson");
    let lines: String = (1..=500).map(|n| format!("{{\"good\": {n}}}\n")).collect();
    std::fs::write(&file, lines).unwrap();
    let sources = format!(
        "[{{ name = \"f\", kind = \"file\", path = \"{}\" }}]",
        file.display()
    );
    let run = tokio::task::spawn_blocking(move || {
        let env = [("TAILRACE_SOURCES", sources.as_str())];
        run_cli(&data, &env, &["run"])
    });
    let (ok, _, stderr) = tokio::time::timeout(EXIT, run).await.unwrap().unwrap();
    assert!(ok, "{stderr}");
    assert!(stderr.contains("every source ended"), "{stderr}");
    assert!(stderr.contains("stopped cleanly"), "{stderr}");
    let data = dir.path().join("data");
    assert_eq!(
        good_numbers(&read_capped(&data, "events").await),
        (1..=500).collect::<Vec<_>>(),
        "everything read was flushed before the exit"
    );
}

fn d_source<'a>(dead: &'a [Value], reason: &str) -> &'a str {
    dead.iter()
        .find(|d| d["reason"] == reason)
        .and_then(|d| d["source"].as_str())
        .unwrap_or("")
}

#[tokio::test]
async fn stdin_ends_the_run_cleanly_and_dead_letters_replay_after_a_limit_is_raised() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let big = format!("{{\"good\": 3, \"pad\": \"{}\"}}", "y".repeat(300));
    let input = format!("{{\"good\": 1}}\n{{\"good\": 2}}\n{big}\nnot json\n{{\"good\": 4}}\n");
    let sources = "[{ name = \"pipe\", kind = \"stdin\" }]";
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tailrace"));
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("TAILRACE_")) {
        cmd.env_remove(k);
    }
    let mut child = cmd
        .envs(common::base_env(&data))
        .env("TAILRACE_SOURCES", sources)
        // 300 bytes of padding: over this limit for the validator, not for the dead letter.
        .env("TAILRACE_INGEST__MAX_EVENT_BYTES", "200")
        .arg("run")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap(); // dropped here: end of input
    let out = tokio::time::timeout(
        EXIT,
        tokio::task::spawn_blocking(move || child.wait_with_output()),
    )
    .await
    .unwrap()
    .unwrap()
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("end of standard input"), "{stderr}");
    assert_eq!(
        good_numbers(&read_capped(&data, "events").await),
        vec![1, 2, 4]
    );

    // Listing: by source and reason.
    let (ok, listing, err) = run_cli(&data, &[("TAILRACE_SOURCES", sources)], &["dead-letters"]);
    assert!(ok, "{err}");
    assert!(listing.starts_with("2 dead letters"), "{listing}");
    assert!(listing.contains("pipe    malformed_json    1"), "{listing}");
    assert!(listing.contains("pipe    too_large         1"), "{listing}");
    let (ok, only, _) = run_cli(
        &data,
        &[("TAILRACE_SOURCES", sources)],
        &["dead-letters", "--reason", "too_large"],
    );
    assert!(ok && only.starts_with("1 dead letters"), "{only}");

    // Replay with the limit raised: the large one passes, the malformed one stays.
    let env = [
        ("TAILRACE_SOURCES", sources),
        ("TAILRACE_INGEST__MAX_EVENT_BYTES", "4096"),
    ];
    let (ok, dry, err) = run_cli(&data, &env, &["dead-letters", "replay", "--dry-run"]);
    assert!(ok, "{err}");
    assert!(dry.starts_with("would replay 1 of 2"), "{dry}");
    let (ok, report, err) = run_cli(&data, &env, &["dead-letters", "replay"]);
    assert!(ok, "{err}");
    assert!(report.starts_with("replayed 1 of 2"), "{report}");
    assert!(
        report.contains("1 still rejected: malformed_json"),
        "{report}"
    );
    let events = read_capped(&data, "events").await;
    assert_eq!(good_numbers(&events), vec![1, 2, 4, 3]);
    assert_eq!(
        events[3]["_tailrace"]["seq"],
        json!(4),
        "the replayed event continues its source's sequence"
    );
    let (ok, after, _) = run_cli(&data, &env, &["dead-letters"]);
    assert!(
        ok && after.starts_with("1 dead letters (2 retained, 1 already replayed)"),
        "{after}"
    );
    let (_, again, _) = run_cli(&data, &env, &["dead-letters", "replay"]);
    assert!(
        again.starts_with("replayed 0 of 1"),
        "replayed letters are not replayed twice: {again}"
    );
}

#[tokio::test]
async fn a_command_source_is_restarted_and_its_stderr_logged() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let script = "echo '{\"from\": \"sh\"}'; echo 'warming up' >&2; echo 'oops'";
    let sources = format!(
        "[{{ name = \"cmd\", kind = \"command\", program = \"sh\", args = [\"-c\", \"{}\"], reconnect_max_ms = 200 }}]",
        script.replace('\\', "\\\\").replace('"', "\\\"")
    );
    let mut t = Tailrace::start(&data, &[("TAILRACE_SOURCES", &sources)]).await;
    t.wait_until("the program ran three times", EXIT, async |t| {
        let m = t.metrics().await;
        m.sum(
            "tailrace_source_reconnects_total",
            &[("source", "cmd"), ("reason", "exited")],
        ) >= 2.0
            && m.sum("tailrace_source_events_total", &[("source", "cmd")]) >= 6.0
    })
    .await;
    let m = t.metrics().await;
    assert!(
        m.sum(
            "tailrace_events_rejected_total",
            &[("source", "cmd"), ("reason", "malformed_json")]
        ) >= 3.0,
        "each run's bad line is a dead letter\n{}",
        t.report()
    );
    assert!(t.stderr().contains("stderr: warming up"), "{}", t.report());
    t.stop().await;
    let events = read_capped(&data, "events").await;
    assert!(events.len() >= 3 && events.iter().all(|e| e["from"] == "sh"));
}

#[tokio::test]
async fn a_missing_program_or_unset_header_variable_is_reported_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let sources = "[{ name = \"web\", kind = \"http\", url = \"http://127.0.0.1:9/\", headers = { Authorization = \"Bearer ${TAILRACE_TEST_UNSET_TOKEN}\" } }]";
    let (ok, _, err) = run_cli(&data, &[("TAILRACE_SOURCES", sources)], &["run"]);
    assert!(!ok);
    assert!(
        err.contains(
            "sources[0] (web): headers.Authorization: environment variable TAILRACE_TEST_UNSET_TOKEN is not set"
        ),
        "{err}"
    );
}

/// One ordinary event of a public stream whose hashtag is 22,000 × `İ` (44,000 bytes; 66,000
/// lowercased, as rollup keys are): under `max_event_bytes`, so it is an event like any other.
/// Its counter key is shortened (the store's keyed state asserts keys under 64 KiB), the run
/// ends cleanly with every line stored, and the data directory opens again.
#[tokio::test]
async fn an_event_with_a_huge_hashtag_is_stored_and_counted_and_the_store_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let file = dir.path().join("events.ndjson");
    let huge = "İ".repeat(22_000);
    let mut lines = String::new();
    for n in 1..=200u64 {
        let tag = if n == 101 {
            huge.clone()
        } else {
            format!("tag{}", n % 7)
        };
        lines.push_str(&json!({"good": n, "lang": "tr", "hashtags": [tag]}).to_string());
        lines.push('\n');
    }
    std::fs::write(&file, lines).unwrap();
    let sources = format!(
        "[{{ name = \"f\", kind = \"file\", path = \"{}\" }}]",
        file.display()
    );
    let env = [
        ("TAILRACE_SOURCES", sources.as_str()),
        ("TAILRACE_INGEST__ROLLUP_FIELDS", "[\"lang\", \"hashtags\"]"),
    ];
    for run in 0..2 {
        let (data, env) = (data.clone(), env.map(|(k, v)| (k, v.to_string())));
        let (ok, _, stderr) = tokio::time::timeout(
            EXIT,
            tokio::task::spawn_blocking(move || {
                let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
                run_cli(&data, &env, &["run"])
            }),
        )
        .await
        .unwrap()
        .unwrap();
        assert!(ok, "run {run} exits 0:\n{stderr}");
        assert!(stderr.contains("stopped cleanly"), "run {run}:\n{stderr}");
    }
    assert_eq!(
        good_numbers(&read_capped(&data, "events").await),
        (1..=200).collect::<Vec<_>>(),
        "every line is an event, the long one included"
    );
    let store = EmbeddedStore::open(&data, EmbeddedOptions::default()).unwrap();
    let rollups = store.keyed("rollups").await.unwrap();
    let counters = rollups.scan("hashtags:").await.unwrap();
    let long: Vec<_> = counters
        .iter()
        .filter(|c| c.key.starts_with("hashtags:i̇i̇"))
        .collect();
    assert_eq!(long.len(), 1, "the long hashtag has one counter");
    assert!(long[0].key.len() <= 512, "{} bytes", long[0].key.len());
    assert_eq!(long[0].doc["count"], json!(1));
    let lang = rollups.get("lang:tr").await.unwrap().unwrap();
    assert_eq!(
        lang["count"],
        json!(200),
        "the second run read nothing again"
    );
    store.close().await.unwrap();
}
