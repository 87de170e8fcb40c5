//! The stack for real: `scripts/stack.sh up` runs docker-compose.yml's `ferretdb` profile
//! (PostgreSQL, FerretDB on it, the one-shot that waits for FerretDB, tailrace, Prometheus)
//! from images built on this machine, on its own Docker daemon, through the machine's override
//! (scripts/stack/compose.host.yml). Then, under the stream the users' file configures
//! (synthetic, 70 events/s):
//!
//! - nothing listens beyond loopback, no bridge network or `br-*`/`docker0` link exists;
//! - the pipeline writes at least 90 % of 70 events/s over at least 3 minutes, and FerretDB
//!   writes no oplog (the profile's default);
//! - FerretDB is killed (SIGKILL of its process) under ingestion and its restart policy brings
//!   it back; afterwards the tailable feed's completeness audit counts nothing missing or
//!   doubled, and the server holds every sequence number once, in order;
//! - Prometheus (the users' config/prometheus.yml) scrapes it, loads every alert rule, and
//!   every panel of every dashboard returns data (what `tests/prometheus.rs` checks against a
//!   test pipeline, here against the stack);
//! - `docker compose down` stops tailrace with exit 0 and "stopped cleanly" in its log, and
//!   `scripts/stack.sh down` leaves no daemon, container, listener or link behind.
//!
//! Past the stack's start, every failed property is collected and the test fails at the end
//! listing all of them: one run of several minutes reports everything it found.
//!
//! Needs root, Docker's daemon (Debian's docker.io), debootstrap, Go and cargo: minutes of
//! building when cold. So it is `#[ignore]`d in the ordinary test run, where any missing
//! prerequisite would fail it with scripts/stack.sh's message naming the fix. `.ci/run` runs it
//! beside the README's `cargo test` (its binary directly, with the tests' debug `tailrace` as
//! the image's binary through `TAILRACE_STACK_BINARY`), after preparing compose and the base
//! image in the background; by hand: `cargo test -p tailrace --test stack_up -- --ignored`
//! (a release build of `tailrace` unless `TAILRACE_STACK_BINARY` names a binary).

#![allow(clippy::unwrap_used)]

mod common;
mod dashboard;

use std::collections::BTreeMap;
use std::io::Read;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::Metrics;
use dashboard::workspace;
use futures::TryStreamExt;
use mongodb::bson::{Bson, Document as BsonDoc, doc};
use serde_json::Value;

/// The URLs `scripts/stack.sh up` prints (the services listen on the host's loopback).
const TAILRACE: &str = "http://127.0.0.1:9750";
const PROMETHEUS: &str = "http://127.0.0.1:9090";
const FERRETDB: &str = "mongodb://127.0.0.1:27017/?directConnection=true";
/// The compose service that runs tailrace in the ferretdb profile.
const TAILRACE_SERVICE: &str = "tailrace-ferretdb";
/// The stream docker-compose.yml configures (config/tailrace.toml's default source).
const SOURCE: &str = "sample";
const RATE_PER_SEC: f64 = 70.0;
/// How long the pipeline ingests before the checks (the server's kill included).
const INGEST_FOR: Duration = Duration::from_secs(180);
/// Grafana's `$__rate_interval` at the repo's 5 s scrape interval: max(4 × scrape,
/// `$__interval` + scrape) = 20 s; `$__interval` for a 15-minute view at ~1000 px ≈ 1 s → 5 s.
const RATE_INTERVAL: &str = "20s";
const INTERVAL: &str = "5s";

/// `scripts/stack.sh ARGS`, its output shown as it runs (so a CI log follows the build).
fn stack_sh(args: &[&str]) -> bool {
    eprintln!("$ scripts/stack.sh {}", args.join(" "));
    Command::new(workspace().join("scripts/stack.sh"))
        .args(args)
        .current_dir(workspace())
        .status()
        .unwrap_or_else(|e| panic!("running scripts/stack.sh {}: {e}", args.join(" ")))
        .success()
}

/// The variables under which `docker` reaches the stack's daemon (`scripts/stack.sh env`).
fn docker_env() -> Vec<(String, String)> {
    let out = run(Command::new(workspace().join("scripts/stack.sh")).arg("env"));
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .trim_start_matches("export ")
        .split_whitespace()
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap();
            (k.to_string(), v.to_string())
        })
        .collect()
}

/// Runs a command to its end; panics with its status and output unless it succeeds.
fn run(cmd: &mut Command) -> Output {
    let shown = format!("{cmd:?}");
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {shown}: {e}"));
    assert!(
        out.status.success(),
        "{shown} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn docker(env: &[(String, String)], args: &[&str]) -> String {
    let out = run(Command::new("docker")
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v))));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn compose(args: &[&str]) -> String {
    let out = run(Command::new(workspace().join("scripts/stack.sh"))
        .arg("compose")
        .args(args));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Takes the stack down when the test ends, however it ends: no daemon outlives a failure.
struct Down(bool);

impl Drop for Down {
    fn drop(&mut self) {
        if !self.0 {
            stack_sh(&["down"]);
        }
    }
}

async fn get(url: &str) -> Option<(u16, String)> {
    // Through `ingest`'s builder: reqwest is built without a default TLS provider.
    let resp = ingest::source::http::client()
        .build()
        .unwrap()
        .get(url)
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .ok()?;
    let status = resp.status().as_u16();
    Some((status, resp.text().await.ok()?))
}

async fn metrics() -> Metrics {
    let (status, body) = get(&format!("{TAILRACE}/metrics"))
        .await
        .expect("GET tailrace /metrics");
    assert_eq!(status, 200, "GET /metrics: {body}");
    Metrics::parse(&body)
}

async fn status() -> Value {
    let (_, body) = get(&format!("{TAILRACE}/api/status"))
        .await
        .expect("GET tailrace /api/status");
    serde_json::from_str(&body).unwrap()
}

/// The events tailrace has written (acknowledged by the server).
async fn written() -> u64 {
    status().await["ingest"]["written"].as_u64().unwrap()
}

/// Polls `check` every second until it holds; panics naming `what` after `timeout`.
async fn wait_until<F>(what: &str, timeout: Duration, mut check: F)
where
    F: AsyncFnMut() -> bool,
{
    let deadline = Instant::now() + timeout;
    while !check().await {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting until {what}\n--- tailrace log (last lines) ---\n{}",
            compose(&["logs", "--no-log-prefix", "--tail", "40", TAILRACE_SERVICE])
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Every TCP/UDP listener of the stack's processes is on loopback, and no bridge exists.
fn assert_loopback_only(env: &[(String, String)]) {
    let out = run(Command::new("ss").args(["-Hltunp"]));
    let text = String::from_utf8_lossy(&out.stdout);
    let ours = [
        "dockerd",
        "containerd",
        "postgres",
        "ferretdb",
        "prometheus",
        "tailrace",
        "docker-proxy",
    ];
    let wide: Vec<&str> = text
        .lines()
        .filter(|l| ours.iter().any(|p| l.contains(&format!("((\"{p}\""))))
        .filter(|l| {
            let local = l.split_whitespace().nth(4).unwrap_or("");
            !(local.starts_with("127.0.0.1:") || local.starts_with("[::1]:"))
        })
        .collect();
    assert!(
        wide.is_empty(),
        "the stack listens beyond loopback:\n  {}",
        wide.join("\n  ")
    );
    for port in ["9750", "9090", "27017", "5432"] {
        assert!(
            text.lines()
                .any(|l| l.contains(&format!("127.0.0.1:{port} "))),
            "nothing listens on 127.0.0.1:{port}:\n{text}"
        );
    }
    let bridges = docker(env, &["network", "ls", "--filter", "driver=bridge", "-q"]);
    assert!(bridges.is_empty(), "bridge networks exist: {bridges}");
    assert_no_bridge_links();
}

fn assert_no_bridge_links() {
    let out = run(Command::new("ip").args(["-o", "link", "show"]));
    let links: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            l.split(": ")
                .nth(1)
                .map(|n| n.split('@').next().unwrap().to_string())
        })
        .filter(|n| n.starts_with("br-") || n == "docker0" || n.starts_with("veth"))
        .collect();
    assert!(links.is_empty(), "bridge or veth links exist: {links:?}");
}

/// The host PID and restart count of a compose service's container.
fn container_state(env: &[(String, String)], id: &str) -> (u32, u64, bool) {
    let s = docker(
        env,
        &[
            "inspect",
            "--format",
            "{{.State.Pid}} {{.RestartCount}} {{.State.Running}}",
            id,
        ],
    );
    let mut w = s.split_whitespace();
    (
        w.next().unwrap().parse().unwrap(),
        w.next().unwrap().parse().unwrap(),
        w.next() == Some("true"),
    )
}

/// Every document of a collection of the stack's database, in `_id` (position) order.
async fn all_docs(client: &mongodb::Client, collection: &str) -> Vec<Value> {
    let docs: Vec<BsonDoc> = client
        .database("tailrace")
        .collection::<BsonDoc>(collection)
        .find(doc! {})
        .sort(doc! {"_id": 1})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    docs.into_iter()
        .map(|d| Bson::Document(d).into_relaxed_extjson())
        .collect()
}

/// Reads a child's stdout to its end on a thread (a `docker logs -f` or `docker wait`).
fn collect(mut child: Child) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut out = String::new();
        if let Some(mut s) = child.stdout.take() {
            let _ = s.read_to_string(&mut out);
        }
        if let Some(mut s) = child.stderr.take() {
            let _ = s.read_to_string(&mut out);
        }
        let _ = child.wait();
        out
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root, dockerd and minutes of building: .ci/run runs it with --ignored"]
async fn the_ferretdb_stack_runs_for_real() {
    let up_started = Instant::now();
    let mut down = Down(false);
    assert!(
        stack_sh(&["up"]),
        "scripts/stack.sh up failed (its output is above)"
    );
    eprintln!(
        "scripts/stack.sh up took {:.0} s",
        up_started.elapsed().as_secs_f64()
    );
    let env = docker_env();
    assert_loopback_only(&env);

    // Ingestion: the written count over INGEST_FOR, with FerretDB killed a third of the way in.
    let t0 = Instant::now();
    let written0 = written().await;
    tokio::time::sleep(INGEST_FOR / 3).await;

    let ferretdb = compose(&["ps", "-q", "ferretdb"]);
    let (pid, restarts, running) = container_state(&env, &ferretdb);
    assert!(running && pid > 0, "FerretDB runs before the kill");
    eprintln!(
        "SIGKILL FerretDB (host PID {pid}) after {:.0} s",
        t0.elapsed().as_secs_f64()
    );
    run(Command::new("kill").args(["-KILL", &pid.to_string()]));
    let t_kill = Instant::now();
    wait_until(
        "FerretDB's container restarted (restart: unless-stopped)",
        Duration::from_secs(60),
        async || {
            let (_, r, running) = container_state(&env, &ferretdb);
            r > restarts && running
        },
    )
    .await;
    let after_kill = written().await;
    wait_until(
        "tailrace writes again after FerretDB's restart",
        Duration::from_secs(120),
        async || {
            get(&format!("{TAILRACE}/readyz"))
                .await
                .is_some_and(|(s, _)| s == 200)
                && written().await > after_kill + 100
        },
    )
    .await;
    eprintln!(
        "writes resumed {:.0} s after the kill",
        t_kill.elapsed().as_secs_f64()
    );

    if let Some(rest) = INGEST_FOR.checked_sub(t0.elapsed()) {
        tokio::time::sleep(rest).await;
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let written1 = written().await;
    let rate = (written1 - written0) as f64 / elapsed;
    let st = status().await;
    eprintln!(
        "written {} events in {elapsed:.0} s: {rate:.1} events/s; status {}",
        written1 - written0,
        st
    );
    // From here on each check records what it found and the test goes on, so that one run
    // (minutes) reports every failed property, not only the first.
    let mut problems: Vec<String> = Vec::new();
    if rate < 0.9 * RATE_PER_SEC {
        problems.push(format!(
            "the pipeline wrote {rate:.1} events/s over {elapsed:.0} s (FerretDB's kill \
             included), below 90 % of the configured {RATE_PER_SEC}/s; queue depth {} (not \
             yet gathered into a batch); the tail feed read {} events, the ingester counted \
             {} written (an event is counted once its batch's rollups are written too, so a \
             feed far ahead means the rollups lag)",
            st["ingest"]["queue_depth"], st["feeds"][0]["events"], st["ingest"]["written"]
        ));
    }

    // The one-shot created no oplog (unless FERRETDB_OPLOG=true): FerretDB writes none, and
    // tailrace's probe finds none.
    let oplog_asked = std::env::var("FERRETDB_OPLOG").is_ok_and(|v| v == "true");
    if st["info"]["capabilities"]["oplog"]["supported"] != oplog_asked {
        problems.push(format!(
            "FerretDB's oplog: FERRETDB_OPLOG={oplog_asked}, but the probe found {}",
            st["info"]["capabilities"]["oplog"]
        ));
    }

    // Prometheus: the target is up, every alert rule loaded, every panel has data.
    let targets = dashboard::prometheus_api(PROMETHEUS, "targets", &[]).await;
    if !targets["activeTargets"]
        .as_array()
        .is_some_and(|ts| !ts.is_empty() && ts.iter().all(|t| t["health"] == "up"))
    {
        problems.push(format!("Prometheus does not scrape tailrace: {targets}"));
    }
    let rules = dashboard::prometheus_api(PROMETHEUS, "rules", &[]).await;
    let loaded: usize = rules["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["rules"].as_array().unwrap().len())
        .sum();
    if loaded != dashboard::alert_exprs().len() {
        problems.push(format!(
            "Prometheus loaded {loaded} of {} alert rules: {rules}",
            dashboard::alert_exprs().len()
        ));
    }
    let range = format!("{}s", t0.elapsed().as_secs());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (evaluated, empty) = dashboard::panels_without_data(
            PROMETHEUS,
            &[
                ("__rate_interval", RATE_INTERVAL),
                ("__interval", INTERVAL),
                ("__range", &range),
            ],
        )
        .await;
        if empty.is_empty() {
            eprintln!("every one of {evaluated} panel expressions returned data");
            break;
        }
        if Instant::now() > deadline {
            problems.push(format!(
                "{} of {evaluated} panel expressions have no data in the stack's Prometheus:\n  {}",
                empty.len(),
                empty.join("\n  ")
            ));
            break;
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }

    // The audit of the tailable feed, across the server's kill.
    let m = metrics().await;
    let audit = |name: &str| m.sum(name, &[("feed", "tail")]);
    let (missing, duplicates, seen) = (
        audit("tailrace_feed_missing_events_total"),
        audit("tailrace_feed_duplicate_events_total"),
        audit("tailrace_feed_events_total"),
    );
    eprintln!("tail feed audit: {seen} events, {missing} missing, {duplicates} duplicates");
    if (missing, duplicates) != (0.0, 0.0) {
        problems.push(format!(
            "the tailable feed's audit after FerretDB's kill and restart: {missing} missing, \
             {duplicates} duplicates"
        ));
    }
    if seen < (after_kill + 100) as f64 {
        problems.push(format!(
            "the tailable feed did not read past the kill: {seen} events, {after_kill} written \
             at the kill"
        ));
    }

    // `docker compose down` of tailrace: exit 0 and "stopped cleanly" in its log.
    let id = compose(&["ps", "-q", TAILRACE_SERVICE]);
    let watch = |args: &[&str]| {
        collect(
            Command::new("docker")
                .args(args)
                .envs(env.iter().map(|(k, v)| (k, v)))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        )
    };
    let log = watch(&["logs", "--follow", "--since", "0", &id]);
    let exit = watch(&["wait", &id]);
    let stop_started = Instant::now();
    compose(&["down", TAILRACE_SERVICE]);
    let exit = exit.join().unwrap();
    let log = log.join().unwrap();
    eprintln!(
        "docker compose down {TAILRACE_SERVICE}: exit {} after {:.0} s",
        exit.trim(),
        stop_started.elapsed().as_secs_f64()
    );
    let tail: Vec<&str> = log
        .lines()
        .rev()
        .take(30)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    if exit.trim() != "0" || !log.contains("stopped cleanly") {
        problems.push(format!(
            "docker compose down: tailrace exited {} (want 0 and \"stopped cleanly\" in its \
             log); its log ends:\n{}",
            exit.trim(),
            tail.join("\n")
        ));
    }

    // The server holds every event once, in order, and the source's summary counts each once.
    let client = mongodb::Client::with_uri_str(FERRETDB).await.unwrap();
    let events = all_docs(&client, "events").await;
    let mut seqs: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for e in &events {
        let stamp = &e["_tailrace"];
        if let (Some(s), Some(n)) = (stamp["source"].as_str(), stamp["seq"].as_u64()) {
            seqs.entry(s.to_string()).or_default().push(n);
        }
    }
    let got = seqs.remove(SOURCE).unwrap_or_default();
    eprintln!("the server holds {} events of {SOURCE}", got.len());
    if !seqs.is_empty() {
        problems.push(format!("events of other sources: {:?}", seqs.keys()));
    }
    if let Some(i) = got.iter().zip(1u64..).position(|(a, b)| *a != b) {
        problems.push(format!(
            "the server's events of {SOURCE} are not 1..={} in order, each once: first \
             difference at index {i}: {:?}",
            got.len(),
            &got[i.saturating_sub(3)..(i + 3).min(got.len())]
        ));
    }
    if (got.len() as u64) < written1 {
        problems.push(format!(
            "the server holds {} events; tailrace had written {written1}",
            got.len()
        ));
    }
    let rollups = all_docs(&client, "rollups").await;
    match rollups
        .iter()
        .find(|d| d["_id"] == format!("source:{SOURCE}"))
    {
        Some(summary) if summary["count"].as_u64() == Some(got.len() as u64) => {}
        other => problems.push(format!(
            "the source's summary does not count each of the {} stored events once: {other:?}",
            got.len()
        )),
    }
    drop(client);

    // The rest of the stack and the daemon: nothing is left.
    down.0 = true;
    assert!(
        stack_sh(&["down"]),
        "scripts/stack.sh down failed (its output is above)"
    );
    let out = run(Command::new("ss").args(["-Hltn"]));
    let text = String::from_utf8_lossy(&out.stdout);
    for port in ["9750", "9090", "27017", "5432"] {
        assert!(
            !text.lines().any(|l| l.contains(&format!(":{port} "))),
            "something still listens on port {port} after scripts/stack.sh down:\n{text}"
        );
    }
    assert_no_bridge_links();

    assert!(
        problems.is_empty(),
        "{} of the stack's properties failed:\n- {}\n(tailrace's status after {elapsed:.0} s of \
         ingestion: {st})",
        problems.len(),
        problems.join("\n- ")
    );
}
