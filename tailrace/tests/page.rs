//! The live page in headless Chromium against the real binary: `server/static-dev/check_page.mjs`
//! loads `/` from a running pipeline (the default synthetic source, 70 events/s) and checks, as
//! a person would see it, that every chart has data and advances within 2 s, that the newest
//! events are listed (bounded, newest first, as text), that the filter box narrows the list and
//! shows the server's 400 for a bad filter, that both streams resume exactly after a dropped
//! connection, that reconnecting adds no listeners, and that the console stays free of errors.
//! A second run checks the live map (`--map-fixture`) against a binary whose only source
//! follows a file the check appends events with known places to: land drawn offline, dots
//! within 1 px of their projected position, the legend equal to `/metrics`, click-to-filter,
//! replay. `/api/geo`, where the map starts its counts, is checked without a browser.
//!
//! Needs `node`, `playwright-core` (npm; `.ci/run` installs it into `target/ci-node`, or set
//! `PLAYWRIGHT_DIR` to a directory whose `node_modules` holds it) and Chromium
//! (`/usr/bin/chromium`, Debian's `chromium`, or `CHROMIUM=/path`). Without them this prints a
//! notice and passes, except under `CI`, where it fails. The screenshots are kept as artifacts:
//! `target/page.png` and `target/page-dark.png`.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::Tailrace;

/// The whole check takes ~15 s; a loaded CI machine gets ample room.
const CHECK_TIMEOUT: Duration = Duration::from_secs(240);

/// One browser at a time: two Chromiums and two binaries on a 2-core machine would make the
/// page's timed checks (a chart advances within 2 s) measure the contention.
static BROWSER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Where each event of a followed file finds its place (every rule, as for Twitter's stream).
const GEO_RULES: &str = r#"geo = { point = "coordinates", place = "place.bounding_box", country = "place.country_code", language = "lang" }"#;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The build's target directory (where the screenshots are kept).
fn target_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| workspace().join("target"))
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

/// node, the directory holding `node_modules/playwright-core`, and Chromium; or `None` (with
/// a notice) outside CI when one is missing.
fn tools() -> Option<(PathBuf, PathBuf, PathBuf)> {
    let node = on_path("node");
    let pw_dir = std::env::var_os("PLAYWRIGHT_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join("ci-node"));
    let playwright = pw_dir
        .join("node_modules/playwright-core/package.json")
        .is_file()
        .then_some(pw_dir.clone());
    let chromium = std::env::var_os("CHROMIUM")
        .map(PathBuf::from)
        .or_else(|| Some(PathBuf::from("/usr/bin/chromium")))
        .filter(|p| p.is_file());
    match (node, playwright, chromium) {
        (Some(n), Some(p), Some(c)) => Some((n, p, c)),
        (n, p, c) => {
            let missing: Vec<String> = [
                n.is_none().then(|| "node".to_string()),
                p.is_none().then(|| {
                    format!(
                        "playwright-core in {} (npm install --prefix {0} playwright-core@1.65.1)",
                        pw_dir.display()
                    )
                }),
                c.is_none()
                    .then(|| "chromium (apt-get install chromium)".to_string()),
            ]
            .into_iter()
            .flatten()
            .collect();
            assert!(
                std::env::var_os("CI").is_none(),
                "the page check needs {}; .ci/run installs them (under CI this is a failure, not a skip)",
                missing.join(", ")
            );
            eprintln!(
                "NOTICE: skipping the page check in Chromium: missing {}",
                missing.join(", ")
            );
            None
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_page_works_in_chromium_against_the_real_binary() {
    let Some((node, pw_dir, chromium)) = tools() else {
        return;
    };
    let _one = BROWSER.lock().await;
    let dir = tempfile::tempdir().unwrap();
    // The synthetic stream with more frequent bursts than the default, from a seed whose first
    // burst after a calm window comes early: the page must mark its breakout.
    let sources = r#"[{ name = "sample", kind = "synthetic", rate_per_sec = 70.0, seed = 3, burst_probability = 0.04, burst_multiplier = 8.0, burst_secs = 4 }]"#;
    let t = Tailrace::start(dir.path(), &[("TAILRACE_SOURCES", sources)]).await;
    let shot = target_dir().join("page.png");
    run_check(&node, &pw_dir, &chromium, &t, &shot, &[]).await;
}

/// Runs `check_page.mjs` against `t` with `extra` arguments; fails with its output unless every
/// check passed and `shot` was written.
async fn run_check(
    node: &Path,
    pw_dir: &Path,
    chromium: &Path,
    t: &Tailrace,
    shot: &Path,
    extra: &[&std::ffi::OsStr],
) {
    let script = workspace().join("server/static-dev/check_page.mjs");
    let child = tokio::process::Command::new(node)
        .arg(&script)
        .arg(format!("http://{}", t.addr))
        .arg(shot)
        .args(extra)
        .current_dir(pw_dir)
        .env("CHROMIUM", chromium)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let out = tokio::time::timeout(CHECK_TIMEOUT, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("check_page.mjs did not finish within {CHECK_TIMEOUT:?}"))
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "check_page.mjs failed ({}):\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}\n{}",
        out.status,
        t.report()
    );
    assert!(
        stdout.contains("passed: ") && shot.is_file(),
        "every check passed and the screenshot {} was written:\n{stdout}",
        shot.display()
    );
}

/// A binary whose only source, `places`, follows `file` (created empty) with every geo rule.
async fn with_places(dir: &Path, file: &Path) -> Tailrace {
    std::fs::write(file, "").unwrap();
    let sources = format!(
        r#"[{{ name = "places", kind = "file", path = "{}", follow = true, {GEO_RULES} }}]"#,
        file.display()
    );
    Tailrace::start(dir, &[("TAILRACE_SOURCES", &sources)]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_map_works_offline_in_chromium() {
    let Some((node, pw_dir, chromium)) = tools() else {
        return;
    };
    let _one = BROWSER.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let fixture = dir.path().join("places.ndjson");
    let t = with_places(&dir.path().join("data"), &fixture).await;
    let shot = target_dir().join("page-map-check.png");
    run_check(
        &node,
        &pw_dir,
        &chromium,
        &t,
        &shot,
        &["--map-fixture".as_ref(), fixture.as_os_str()],
    )
    .await;
}

/// `/api/geo` is what `/metrics` counted, with the newest sequence number of each source it
/// includes: here, once the source is quiet, the newest stored event's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_geo_is_the_metrics_counts_at_a_sequence_number() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("places.ndjson");
    let t = with_places(&dir.path().join("data"), &file).await;
    let empty = t.json("/api/geo").await;
    assert_eq!(
        empty,
        serde_json::json!({
            "precision": {"point": 0, "place": 0, "country": 0, "language": 0, "none": 0},
            "country": {},
            "seq": {},
        }),
        "nothing counted yet"
    );
    let lines = [
        r#"{"coordinates": {"type": "Point", "coordinates": [139.69, 35.69]}, "place": {"country_code": "JP"}}"#,
        r#"{"coordinates": {"type": "Point", "coordinates": [-140, 10]}}"#,
        r#"{"place": {"country_code": "BR"}}"#,
        r#"{"place": {"country_code": "BR"}}"#,
        r#"{"lang": "fr"}"#,
        r#"{"text": "nowhere"}"#,
    ];
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    t.wait_until("every line is stored", Duration::from_secs(30), async |t| {
        t.json("/api/status").await["ingest"]["written"].as_u64() == Some(lines.len() as u64)
    })
    .await;
    let geo = t.json("/api/geo").await;
    let newest = t.json("/api/events?limit=1").await;
    let seq = &newest[0]["doc"]["_tailrace"]["seq"];
    assert!(
        seq.is_u64(),
        "the newest event has a sequence number: {newest}"
    );
    assert_eq!(
        geo,
        serde_json::json!({
            "precision": {"point": 2, "place": 0, "country": 2, "language": 1, "none": 1},
            "country": {"BR": 2, "FR": 1, "JP": 1, "none": 2},
            "seq": {"places": seq},
        }),
        "the counts of the six lines, at the newest one's sequence number"
    );
    let m = t.metrics().await;
    for (precision, n) in geo["precision"].as_object().unwrap() {
        assert_eq!(
            m.sum("tailrace_events_geo_total", &[("precision", precision)]),
            n.as_f64().unwrap(),
            "/metrics and /api/geo agree on {precision}"
        );
    }
    for (country, n) in geo["country"].as_object().unwrap() {
        assert_eq!(
            m.sum("tailrace_events_geo_country_total", &[("country", country)]),
            n.as_f64().unwrap(),
            "/metrics and /api/geo agree on {country}"
        );
    }
}
