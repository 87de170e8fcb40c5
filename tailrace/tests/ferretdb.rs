//! The MongoDB engine end to end, through the real binary, on a real MongoDB wire-protocol
//! server: FerretDB on SQLite, which each test starts for itself from `TAILRACE_FERRETDB_BIN`
//! (`scripts/ferretdb.sh bin` builds it and prints the path; `.ci/run` sets it). Without it the
//! tests print a notice and pass locally; under `CI` they fail. With
//! `TAILRACE_FERRETDB_POSTGRESQL` (a PostgreSQL server's URL, as
//! `TAILRACE_FERRETDB_BACKEND=postgresql scripts/ferretdb.sh postgresql` prints it) each server
//! runs on PostgreSQL instead, in a database of its own copied from `tailrace_template`.
//!
//! What FerretDB lacks (change streams, transactions, documents as sent, capped bounds kept at
//! every insert, MongoDB's filter semantics) the engine's probe finds at startup; these tests
//! check that the pipeline then does what it promises on such a server: feeds of kind
//! `tailable` and `oplog`, refusals that say why, dead letters that keep what the server
//! refuses, and nothing lost or doubled across a SIGKILL of tailrace or of the server.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::Tailrace;
use futures::TryStreamExt;
use mongodb::bson::{Bson, Document as BsonDoc, doc};
use serde_json::{Value, json};

/// A FerretDB server of one test: its own port and SQLite directory (or PostgreSQL database).
struct Ferret {
    /// `Some(URL of its database)` on PostgreSQL.
    postgresql: Option<String>,
    child: Option<Child>,
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    uri: String,
}

/// The server binary, or `None` (after a notice) where it is not installed, outside CI.
fn ferretdb_bin() -> Option<PathBuf> {
    match std::env::var_os("TAILRACE_FERRETDB_BIN") {
        Some(p) => Some(p.into()),
        None if std::env::var_os("CI").is_some() => panic!(
            "TAILRACE_FERRETDB_BIN is not set under CI (.ci/run builds FerretDB with \
             scripts/ferretdb.sh and sets it)"
        ),
        None => {
            eprintln!(
                "notice: TAILRACE_FERRETDB_BIN is not set (scripts/ferretdb.sh bin prints it): \
                 the FerretDB end-to-end test did not run"
            );
            None
        }
    }
}

/// One test at a time: each runs a server and the pipeline, and on two cores side by side
/// they slow each other into their timeouts.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

impl Ferret {
    /// Starts a server; with `oplog`, creates `local.oplog.rs` (FerretDB writes one only once
    /// it exists).
    async fn start(oplog: bool) -> Option<Ferret> {
        let bin = ferretdb_bin()?;
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let postgresql = std::env::var("TAILRACE_FERRETDB_POSTGRESQL")
            .ok()
            .filter(|u| !u.is_empty())
            .map(|server| {
                let name = format!("e2e_{}_{port}", std::process::id());
                let created = Command::new("psql")
                    .args([
                        &format!("{server}/tailrace_template"),
                        "--no-psqlrc",
                        "--quiet",
                        "--command",
                        &format!("CREATE DATABASE {name} TEMPLATE tailrace_template"),
                    ])
                    .status()
                    .unwrap_or_else(|e| panic!("psql (TAILRACE_FERRETDB_POSTGRESQL is set): {e}"));
                assert!(created.success(), "CREATE DATABASE {name} on {server}");
                format!("{server}/{name}")
            });
        let mut f = Ferret {
            postgresql,
            child: None,
            dir: tempfile::tempdir().unwrap(),
            bin,
            port,
            uri: format!(
                "mongodb://127.0.0.1:{port}/?directConnection=true&serverSelectionTimeoutMS=5000"
            ),
        };
        f.spawn().await;
        if oplog {
            f.client()
                .database("local")
                .create_collection("oplog.rs")
                .capped(true)
                .size(64 << 20)
                .max(20_000)
                .await
                .unwrap();
        }
        Some(f)
    }

    async fn spawn(&mut self) {
        let data = self.dir.path().join("data");
        let state = self.dir.path().join("state");
        std::fs::create_dir_all(&data).unwrap();
        std::fs::create_dir_all(&state).unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("log"))
            .unwrap();
        let backend = match &self.postgresql {
            Some(url) => [
                "--handler=postgresql".to_string(),
                format!("--postgresql-url={url}"),
            ],
            None => [
                "--handler=sqlite".to_string(),
                format!("--sqlite-url=file:{}/", data.display()),
            ],
        };
        let child = Command::new(&self.bin)
            .args(backend)
            .args([
                &format!("--listen-addr=127.0.0.1:{}", self.port),
                &format!("--state-dir={}", state.display()),
                "--repl-set-name=rs0",
                "--debug-addr=-",
                "--telemetry=disable",
                "--log-level=warn",
                "--test-capped-cleanup-interval=0",
            ])
            .env("DO_NOT_TRACK", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", self.bin.display()));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ping = self
                .client()
                .database("admin")
                .run_command(doc! {"ping": 1})
                .await;
            if ping.is_ok() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "FerretDB did not answer ping within 30 s: {ping:?}\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn client(&self) -> mongodb::Client {
        let options = mongodb::options::ClientOptions::builder()
            .hosts(vec![mongodb::options::ServerAddress::Tcp {
                host: "127.0.0.1".into(),
                port: Some(self.port),
            }])
            .direct_connection(true)
            .server_selection_timeout(Duration::from_secs(3))
            .build();
        mongodb::Client::with_options(options).unwrap()
    }

    /// SIGKILL: the server gets no chance to finish anything.
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port and files.
    async fn restart(&mut self) {
        self.kill();
        self.spawn().await;
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }
}

impl Drop for Ferret {
    fn drop(&mut self) {
        if std::thread::panicking()
            && let Some(child) = &self.child
        {
            // SIGQUIT: the Go runtime writes every goroutine's stack to the log, which shows
            // where a server that stopped answering waits.
            let _ = Command::new("kill")
                .args(["-QUIT", &child.id().to_string()])
                .status();
            std::thread::sleep(Duration::from_millis(500));
        }
        self.kill();
        if std::thread::panicking() {
            // The server's side of a failure, for a CI log to explain it alone.
            let log = self.log();
            let tail: Vec<&str> = log.lines().rev().take(400).collect();
            eprintln!("--- FerretDB log (last lines) ---");
            for line in tail.into_iter().rev() {
                eprintln!("{line}");
            }
            eprintln!("---------------------------------");
        }
    }
}

/// A fresh database name per run.
fn database() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("tailrace_e2e_{}_{nanos}", std::process::id())
}

/// A tailable feed on `events` and an oplog feed on the `source:` summaries: what works on a
/// server without change streams.
const FEEDS: &str = r#"[{ name = "tail", kind = "tailable", collection = "events" }, { name = "oplog", kind = "oplog", collections = ["rollups"], filter = { ops = ["insert", "update"], key_prefix = "source:" } }]"#;

fn mongo_env(f: &Ferret, db: &str, sources: &str, feeds: &str) -> Vec<(String, String)> {
    vec![
        ("TAILRACE_STORE__ENGINE".into(), "mongodb".into()),
        ("TAILRACE_STORE__URI".into(), f.uri.clone()),
        ("TAILRACE_STORE__DATABASE".into(), db.into()),
        ("TAILRACE_SOURCES".into(), sources.into()),
        ("TAILRACE_FEEDS".into(), feeds.into()),
        (
            "TAILRACE_STATS__CHECKPOINT_INTERVAL_MS".into(),
            "500".into(),
        ),
        // FerretDB on SQLite takes seconds per write when writers queue for its one write
        // lock (a busy machine makes it worse): a stop gets the time it needs.
        (
            "TAILRACE_INGEST__STOP_FLUSH_TIMEOUT_SECS".into(),
            "60".into(),
        ),
        (
            "TAILRACE_INGEST__STOP_CHECKPOINT_TIMEOUT_SECS".into(),
            "60".into(),
        ),
    ]
}

fn pairs(env: &[(String, String)]) -> Vec<(&str, &str)> {
    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// Runs the binary until it exits by itself (a refused startup); its status and stderr.
fn run_to_exit(env: &[(String, String)]) -> (std::process::ExitStatus, String) {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tailrace"));
    cmd.arg("run")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("TAILRACE_")) {
        cmd.env_remove(k);
    }
    cmd.envs(common::env_with(dir.path(), env));
    let mut child = cmd.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if child.try_wait().unwrap().is_some() {
            let out = child.wait_with_output().unwrap();
            return (
                out.status,
                String::from_utf8_lossy(&out.stderr).into_owned(),
            );
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "tailrace did not exit within 60 s; stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every document of a collection, in `_id` (position) order, as JSON.
async fn all_docs(f: &Ferret, db: &str, collection: &str) -> Vec<Value> {
    let coll = f.client().database(db).collection::<BsonDoc>(collection);
    let docs: Vec<BsonDoc> = coll
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

/// Per source, the stored sequence numbers of `events`, in position order.
fn seqs_by_source(events: &[Value]) -> BTreeMap<String, Vec<u64>> {
    let mut out: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for e in events {
        let stamp = &e["_tailrace"];
        if let (Some(s), Some(n)) = (stamp["source"].as_str(), stamp["seq"].as_u64()) {
            out.entry(s.to_string()).or_default().push(n);
        }
    }
    out
}

/// Sequence numbers must be 1..=n, in order, each once.
fn assert_contiguous(what: &str, seqs: &[u64]) {
    let expected: Vec<u64> = (1..=seqs.len() as u64).collect();
    if seqs != expected.as_slice() {
        let first_bad = seqs
            .iter()
            .zip(&expected)
            .position(|(a, b)| a != b)
            .unwrap_or(seqs.len().min(expected.len()));
        panic!(
            "{what}: sequence numbers are not 1..={} in order, each once: first difference at \
             index {first_bad}: {:?}",
            seqs.len(),
            &seqs[first_bad.saturating_sub(3)..(first_bad + 3).min(seqs.len())]
        );
    }
}

/// A file of odd lines: events with keys as the world sends them, nested arrays, every
/// script, and lines that are not events at all. Line `n` carries `"line": n` first.
fn odd_lines() -> Vec<(String, &'static str)> {
    vec![
        (
            r#"{"line":1,"lang":"ja","text":"東京で桜が咲いた 🌸","user":{"screen_name":"sakura"}}"#.into(),
            "plain",
        ),
        (
            r#"{"line":2,"$schema":"/mediawiki/recentchange/1.0.0","meta":{"domain":"en.wikipedia.org"}}"#
                .into(),
            "dollar",
        ),
        (
            r#"{"line":3,"meta.dt":"2024-06-11T09:15:00Z","text":"نص عربي"}"#.into(),
            "dotted",
        ),
        (
            r#"{"line":4,"geo":{"type":"Polygon","coordinates":[[[0.0,0.0],[1.0,0.0],[1.0,1.0]]]}}"#
                .into(),
            "nested",
        ),
        (r#"{"line":5, this is not JSON"#.into(), "invalid"),
        (
            r#"{"line":6,"nested":{"$inc":{"n":1},"a.b":{"c":"ü"}},"text":"Ελληνικά"}"#.into(),
            "dollar",
        ),
        (
            r#"{"line":7,"lang":"hi","text":"नमस्ते दुनिया","user":{"screen_name":"sakura"}}"#.into(),
            "plain",
        ),
    ]
}

/// The line number of a dead letter's raw bytes: the `line` of the event (a store-refused
/// one is kept as the stamped document), or the number a broken line starts with.
fn letter_line(raw: &str) -> Option<u64> {
    if let Ok(v) = serde_json::from_str::<Value>(raw) {
        return v["line"].as_u64();
    }
    let rest = raw.strip_prefix(r#"{"line":"#)?;
    rest.chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .ok()
}

/// Per source, the sequence numbers stored: of events (in position order) and of the
/// events the store refused (kept as dead letters with their stamp), sorted.
fn all_seqs(events: &[Value], letters: &[Value]) -> BTreeMap<String, Vec<u64>> {
    let mut out = seqs_by_source(events);
    for l in letters
        .iter()
        .filter(|l| l["reason"] == json!("store_rejected"))
    {
        let stamped: Value =
            serde_json::from_str(l["raw"].as_str().unwrap_or("")).unwrap_or_default();
        if let (Some(s), Some(n)) = (
            stamped["_tailrace"]["source"].as_str(),
            stamped["_tailrace"]["seq"].as_u64(),
        ) {
            out.entry(s.to_string()).or_default().push(n);
        }
    }
    for seqs in out.values_mut() {
        seqs.sort_unstable();
    }
    out
}

/// Reads NDJSON lines of `/api/changes` until `n` events came (or 30 s passed).
async fn changes_ndjson(t: &Tailrace, query: &str, n: usize) -> (u16, Vec<Value>) {
    let url = format!("http://{}/api/changes?{query}", t.addr);
    let client = ingest::source::http::client().build().unwrap();
    let resp = client
        .get(&url)
        .header("Accept", "application/x-ndjson")
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    if status != 200 {
        let body = resp.text().await.unwrap_or_default();
        return (status, vec![json!({"body": body})]);
    }
    let mut out = Vec::new();
    let mut buf = String::new();
    let mut body = resp.bytes_stream();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while out.len() < n {
        let chunk = tokio::time::timeout_at(deadline, futures::StreamExt::next(&mut body))
            .await
            .unwrap_or_else(|_| panic!("{url}: {} of {n} events within 30 s", out.len()))
            .expect("the stream stays open")
            .unwrap();
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(i) = buf.find('\n') {
            let line: String = buf.drain(..=i).collect();
            if let Ok(v) = serde_json::from_str::<Value>(line.trim())
                && v.get("doc").is_some()
            {
                out.push(v);
            }
        }
    }
    (status, out)
}

/// The pipeline on FerretDB, defaults but for the feeds: events are stored and reach the
/// tailable feed and the oplog feed, `latest` answers from the index, rollups count, odd lines
/// end as events or dead letters (each once, with the server's reason where it refused them),
/// `/api/changes` filters a capped collection and refuses a keyed one with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pipeline_runs_on_ferretdb() {
    let _serial = SERIAL.lock().await;
    let Some(f) = Ferret::start(true).await else {
        return;
    };
    let db = database();
    let dir = tempfile::tempdir().unwrap();
    let odd = dir.path().join("odd.ndjson");
    {
        let mut file = std::fs::File::create(&odd).unwrap();
        for (line, _) in odd_lines() {
            writeln!(file, "{line}").unwrap();
        }
    }
    let sources = format!(
        r#"[{{ name = "sample", kind = "synthetic", rate_per_sec = 10.0, seed = 7 }}, {{ name = "odd", kind = "file", path = "{}", follow = true }}]"#,
        odd.display()
    );
    let env = mongo_env(&f, &db, &sources, FEEDS);
    let mut t = Tailrace::start(dir.path(), &pairs(&env)).await;
    t.wait_until("100 events written", Duration::from_secs(90), async |t| {
        t.json("/api/status").await["ingest"]["written"].as_u64() >= Some(100)
    })
    .await;

    let status = t.json("/api/status").await;
    let caps = &status["info"]["capabilities"];
    assert_eq!(
        caps["change_streams"]["supported"],
        json!(false),
        "FerretDB has no change streams: {caps}"
    );
    assert!(
        t.stderr().contains("lacks"),
        "the banner names what the server lacks\n{}",
        t.report()
    );

    // Both feeds get events, and miss or double none.
    t.wait_until(
        "both feeds processed events",
        Duration::from_secs(90),
        async |t| {
            let m = t.metrics().await;
            ["tail", "oplog"]
                .iter()
                .all(|feed| m.sum("tailrace_feed_events_total", &[("feed", feed)]) > 30.0)
        },
    )
    .await;
    let m = t.metrics().await;
    // An event the server refused is a dead letter with its sequence number: a feed counts
    // that number refused, not missing. Nothing is missing.
    let refused = m.sum(
        "tailrace_events_rejected_total",
        &[("reason", "store_rejected")],
    );
    assert!(refused > 0.0, "the server refused events\n{}", t.report());
    for feed in ["tail", "oplog"] {
        assert_eq!(
            m.sum("tailrace_feed_missing_events_total", &[("feed", feed)]),
            0.0,
            "{feed}: missing\n{}",
            t.report()
        );
        assert_eq!(
            m.sum("tailrace_feed_refused_events_total", &[("feed", feed)]),
            refused,
            "{feed}: refused, as many as the server refused\n{}",
            t.report()
        );
        assert_eq!(
            m.sum("tailrace_feed_duplicate_events_total", &[("feed", feed)]),
            0.0,
            "{feed}: duplicates\n{}",
            t.report()
        );
    }
    assert!(
        m.sum(
            "tailrace_notification_latency_seconds_count",
            &[("feed", "tail"), ("engine", "mongodb")]
        ) > 0.0,
        "the tailable feed's notification latency is measured"
    );
    assert_eq!(
        m.one(
            "tailrace_store_capability",
            &[("capability", "change_streams")]
        ),
        Some(0.0)
    );

    // Each synthetic event's place is stored as the server's types: the stamp's `geo` with
    // doubles (an integer would be an Int64, a query on `lon` ranges still matching, but the
    // stamp promises doubles) and a country string.
    let placed: Vec<BsonDoc> = f
        .client()
        .database(&db)
        .collection::<BsonDoc>("events")
        .find(doc! {"_tailrace.geo.precision": {"$in": ["point", "language"]}})
        .limit(20)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert!(
        !placed.is_empty(),
        "placed events are stored\n{}",
        t.report()
    );
    for d in &placed {
        let geo = d
            .get_document("_tailrace")
            .unwrap()
            .get_document("geo")
            .unwrap();
        assert!(
            geo.get_f64("lon").is_ok() && geo.get_f64("lat").is_ok(),
            "lon and lat are doubles: {geo}"
        );
        if geo.get_str("precision").ok() == Some("language") {
            assert_eq!(geo.get_str("country").ok().map(str::len), Some(2), "{geo}");
        }
    }
    assert!(
        m.sum("tailrace_events_geo_total", &[("precision", "language")]) > 0.0,
        "synthetic events are placed by their language"
    );

    // `latest` by an indexed field, newest first.
    let latest = t
        .json("/api/events/latest?field=user.screen_name&value=sakura")
        .await;
    let found = latest.as_array().cloned().unwrap_or_default();
    assert_eq!(found.len(), 2, "the odd file's two sakura events: {latest}");
    for e in &found {
        assert_eq!(e["doc"]["user"]["screen_name"], json!("sakura"), "{e}");
    }
    assert!(
        found[0]["position"].as_u64() > found[1]["position"].as_u64(),
        "newest first: {latest}"
    );

    // Rollups count per value.
    let rollups = t.json("/api/rollups?prefix=lang:&limit=100").await;
    assert!(
        rollups.to_string().contains("lang:"),
        "rollups by language: {rollups}"
    );

    // A question over the rollups, on a server without snapshot reads: the keys read as
    // they are, with none of the engine's own fields.
    let body = json!({"collection": "rollups", "pipeline": [
        {"$match": {"_id": {"$gte": "lang:", "$lt": "lang;"}}},
        {"$sort": {"_id": 1}},
    ]});
    let (code, answer) = t.post_json("/api/aggregate", &body.to_string()).await;
    assert_eq!(code, 200, "{answer}");
    let docs = answer["docs"].as_array().cloned().unwrap_or_default();
    assert!(!docs.is_empty(), "rollups by language: {answer}");
    for d in &docs {
        assert!(
            d["_id"].as_str().is_some_and(|k| k.starts_with("lang:")),
            "{d}"
        );
        assert!(
            d.as_object()
                .unwrap()
                .keys()
                .all(|k| !k.starts_with("_tailrace_")),
            "no engine field: {d}"
        );
    }

    // A capped collection followed with a filter; a keyed one refused with the reason.
    let (code, ja) = changes_ndjson(
        &t,
        "collection=events&include_initial=true&initial_limit=5&filter=%7B%22lang%22%3A%22ja%22%7D",
        3,
    )
    .await;
    assert_eq!(code, 200, "{ja:?}");
    for e in &ja {
        assert_eq!(e["doc"]["lang"], json!("ja"), "{e}");
    }
    let (code, body) = t.get("/api/changes?collection=rollups").await;
    assert_eq!(code, 501, "{body}");
    assert!(
        body.contains("change streams") && body.contains("events, dead_letters"),
        "{body}"
    );

    // The oplog feed polls FerretDB's oplog, a scan of it each time: let it catch up, so the
    // stop's checkpoint deadline holds.
    let written = t.json("/api/status").await["ingest"]["written"]
        .as_f64()
        .unwrap_or(f64::MAX);
    t.wait_until(
        "the oplog feed caught up with the events written so far",
        Duration::from_secs(180),
        async |t| {
            t.metrics()
                .await
                .sum("tailrace_feed_events_total", &[("feed", "oplog")])
                >= written
        },
    )
    .await;
    stop_cleanly(&mut t).await;

    // Every odd line once: an event (stored as sent) or a dead letter with its reason.
    let events = all_docs(&f, &db, "events").await;
    let letters = all_docs(&f, &db, "dead_letters").await;
    let as_sent = caps["documents_as_sent"]["supported"] == json!(true);
    for (n, (line, kind)) in odd_lines().into_iter().enumerate() {
        let n = n as u64 + 1;
        let stored: Vec<&Value> = events.iter().filter(|e| e["line"] == json!(n)).collect();
        let dead: Vec<&Value> = letters
            .iter()
            .filter(|l| l["raw"].as_str().and_then(letter_line) == Some(n))
            .collect();
        assert_eq!(
            stored.len() + dead.len(),
            1,
            "line {n} ({kind}) is kept exactly once: events {stored:?}, dead letters {dead:?}"
        );
        let sent: Option<Value> = serde_json::from_str(&line).ok();
        match (kind, as_sent) {
            ("invalid", _) => assert_eq!(dead.len(), 1, "line {n}: not JSON"),
            ("plain", _) | (_, true) => {
                // Stored with its keys as sent (the stamp and the engine's _id added).
                let mut doc = stored
                    .first()
                    .unwrap_or_else(|| panic!("line {n} ({kind}) stored"))
                    .as_object()
                    .cloned()
                    .unwrap();
                doc.remove("_id");
                doc.remove("_tailrace");
                assert_eq!(Some(Value::Object(doc)), sent, "line {n} round-trips");
            }
            (_, false) => {
                let letter = dead
                    .first()
                    .unwrap_or_else(|| panic!("line {n} ({kind}) kept as a dead letter"));
                assert_eq!(letter["reason"], json!("store_rejected"), "{letter}");
                assert!(
                    letter["detail"].as_str().is_some_and(|d| !d.is_empty()),
                    "the server's reason is kept: {letter}"
                );
            }
        }
    }
    let seqs = all_seqs(&events, &letters);
    assert_contiguous("sample", &seqs["sample"]);
}

/// A feed the server cannot serve stops the startup with the reason and the alternatives,
/// at once, instead of a feed that retries forever and stays empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feeds_the_server_cannot_serve_are_refused_at_startup() {
    let _serial = SERIAL.lock().await;
    let Some(with_oplog) = Ferret::start(true).await else {
        return;
    };
    let sources = r#"[{ name = "sample", kind = "synthetic", rate_per_sec = 10.0 }]"#;
    let changes = r#"[{ name = "changes", kind = "changes", collections = ["rollups"] }]"#;
    let env = mongo_env(&with_oplog, &database(), sources, changes);
    let (status, stderr) = run_to_exit(&env);
    assert_eq!(status.code(), Some(2), "a startup error exits 2\n{stderr}");
    assert!(
        stderr.contains("needs change streams")
            && stderr.contains("FailedToParse")
            && stderr.contains("read from this server's local.oplog.rs"),
        "names the capability, quotes the server and names the oplog kind:\n{stderr}"
    );
    drop(with_oplog);

    let Some(without) = Ferret::start(false).await else {
        return;
    };
    let oplog = r#"[{ name = "audit", kind = "oplog", collections = ["rollups"] }]"#;
    let env = mongo_env(&without, &database(), sources, oplog);
    let (status, stderr) = run_to_exit(&env);
    assert_eq!(status.code(), Some(2), "a startup error exits 2\n{stderr}");
    assert!(
        stderr.contains("needs an oplog") && stderr.contains("oplog.rs"),
        "says how to enable the oplog:\n{stderr}"
    );
}

/// SIGKILL of tailrace during ingestion, several times, then a clean run: per source the
/// sequence numbers are 1..=n with no hole and none twice, at least every acknowledged one is
/// stored, the replayed file's lines are each stored once (an event or a dead letter),
/// in order, the next run continuing at the stored offset, and the tail feed counts the
/// numbers of the events the server refused as refused, none as missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_cycles_lose_and_double_nothing_on_ferretdb() {
    let _serial = SERIAL.lock().await;
    let Some(f) = Ferret::start(false).await else {
        return;
    };
    let db = database();
    let dir = tempfile::tempdir().unwrap();
    let replay = dir.path().join("replay.ndjson");
    let lines = 600_u64;
    {
        let mut file = std::fs::File::create(&replay).unwrap();
        for n in 1..=lines {
            match n % 25 {
                // Not JSON: a dead letter.
                7 => writeln!(file, r#"{{"line":{n}, broken"#).unwrap(),
                // A `$`-prefixed key: an event on MongoDB 5.0+, a dead letter on FerretDB.
                23 => writeln!(file, r#"{{"line":{n},"$kind":"edit","text":"ключ"}}"#).unwrap(),
                _ => writeln!(
                    file,
                    r#"{{"line":{n},"lang":"en","text":"event {n} 🌍","user":{{"screen_name":"u{}"}}}}"#,
                    n % 97
                )
                .unwrap(),
            }
        }
    }
    let sources = format!(
        r#"[{{ name = "replay", kind = "file", path = "{}", pace = "rate", rate_per_sec = 60.0 }}, {{ name = "stream", kind = "synthetic", rate_per_sec = 40.0, seed = 3 }}]"#,
        replay.display()
    );
    let feeds = r#"[{ name = "tail", kind = "tailable", collection = "events" }]"#;
    let env = mongo_env(&f, &db, &sources, feeds);
    let mut acked: BTreeMap<String, u64> = BTreeMap::new();
    let kill_after = [300_u64, 1_500, 150, 2_500];
    for (cycle, wait_ms) in kill_after.iter().enumerate() {
        let t = Tailrace::start(dir.path(), &pairs(&env)).await;
        t.wait_until("writes flow", Duration::from_secs(60), async |t| {
            t.json("/api/status").await["ingest"]["written"].as_u64() > Some(0)
        })
        .await;
        tokio::time::sleep(Duration::from_millis(*wait_ms)).await;
        let m = t.metrics().await;
        for source in ["replay", "stream"] {
            let a = m
                .one("tailrace_source_last_acked_seq", &[("source", source)])
                .unwrap_or(0.0) as u64;
            acked.insert(source.into(), a);
        }
        t.signal("KILL");
        drop(t);
        let events = all_docs(&f, &db, "events").await;
        let letters = all_docs(&f, &db, "dead_letters").await;
        for (source, seqs) in seqs_by_source(&events) {
            assert!(
                seqs.windows(2).all(|w| w[0] < w[1]),
                "cycle {cycle}, {source}: events in sequence order, each once"
            );
        }
        let seqs = all_seqs(&events, &letters);
        for (source, a) in &acked {
            let stored = seqs.get(source).cloned().unwrap_or_default();
            assert_contiguous(&format!("cycle {cycle}, {source}"), &stored);
            assert!(
                stored.len() as u64 >= *a,
                "cycle {cycle}, {source}: {} stored, {a} acknowledged before the kill",
                stored.len()
            );
        }
        let k = replay_prefix(&events, &letters, &format!("cycle {cycle}"));
        eprintln!("cycle {cycle}: killed after {wait_ms} ms; replay lines stored 1..={k}");
    }
    // A last run lets the replay finish, then stops cleanly.
    let mut t = Tailrace::start(dir.path(), &pairs(&env)).await;
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        // Counted only: the two collections read one after the other while the pipeline
        // writes are no snapshot; the whole check follows the stop.
        let events = all_docs(&f, &db, "events").await;
        let letters = all_docs(&f, &db, "dead_letters").await;
        let replayed = |v: &[Value], line: &dyn Fn(&Value) -> Option<u64>| {
            v.iter()
                .filter(|d| {
                    d.get("_tailrace")
                        .map_or(d["source"] == json!("replay"), |s| {
                            s["source"] == json!("replay")
                        })
                })
                .filter_map(line)
                .count()
        };
        let stored = replayed(&events, &|e| e["line"].as_u64())
            + replayed(&letters, &|l| l["raw"].as_str().and_then(letter_line));
        if stored as u64 >= lines {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the replay did not finish\n{}",
            t.report()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    stop_cleanly(&mut t).await;
    let events = all_docs(&f, &db, "events").await;
    let letters = all_docs(&f, &db, "dead_letters").await;
    assert_eq!(
        replay_prefix(&events, &letters, "after the clean stop"),
        lines,
        "every line once"
    );
    for (source, seqs) in all_seqs(&events, &letters) {
        assert_contiguous(&format!("after the clean stop, {source}"), &seqs);
    }
    // The feed's audit across the kills: the numbers of the events the server refused (kept
    // as dead letters) are refused, not missing, and nothing else is missing.
    let refused = letters
        .iter()
        .filter(|l| l["reason"] == json!("store_rejected") && l["seq"].is_u64())
        .count() as u64;
    assert!(refused > 0, "the server refused the `$kind` lines");
    let stats = all_docs(&f, &db, "stats").await;
    let tail = stats
        .iter()
        .find(|d| d["_id"] == json!("tail"))
        .expect("the tail feed's statistics");
    let audit = &tail["stats"];
    assert_eq!(
        (audit["missing"].as_u64(), audit["refused"].as_u64()),
        (Some(0), Some(refused)),
        "the tail feed's missing and refused numbers: {tail}"
    );
}

/// SIGTERM and a clean exit (0). A stop on a slow server takes longer than on the embedded
/// engine (the writer's flush, the feeds' checkpoints, the client's shutdown, each bounded).
async fn stop_cleanly(t: &mut Tailrace) {
    t.signal("TERM");
    // The longest flush a test allows (100 s), then the checkpoints.
    let status = t.wait_exit(Duration::from_secs(180)).await;
    assert!(
        status.success(),
        "SIGTERM exits 0, got {status}\n{}",
        t.report()
    );
}

/// The replay's lines over events and dead letters: each once, together exactly 1..=k.
fn replay_prefix(events: &[Value], letters: &[Value], what: &str) -> u64 {
    let mut lines: Vec<u64> = events
        .iter()
        .filter(|e| e["_tailrace"]["source"] == json!("replay"))
        .filter_map(|e| e["line"].as_u64())
        .chain(
            letters
                .iter()
                .filter(|l| l["source"] == json!("replay"))
                .filter_map(|l| l["raw"].as_str().and_then(letter_line)),
        )
        .collect();
    lines.sort_unstable();
    let expected: Vec<u64> = (1..=lines.len() as u64).collect();
    if lines != expected {
        let first_bad = lines
            .iter()
            .zip(&expected)
            .position(|(a, b)| a != b)
            .unwrap_or(0);
        let around = |v: &[Value], f: &dyn Fn(&Value) -> Option<u64>| -> Vec<u64> {
            v.iter()
                .filter_map(f)
                .filter(|n| n.abs_diff(expected[first_bad]) < 6)
                .collect()
        };
        panic!(
            "{what}: the replay's stored lines are not 1..=k, each once: around line {}, \
             events hold {:?} and dead letters {:?}",
            expected[first_bad],
            around(events, &|e| (e["_tailrace"]["source"] == json!("replay"))
                .then(|| e["line"].as_u64())
                .flatten()),
            around(letters, &|l| l["raw"].as_str().and_then(letter_line)),
        );
    }
    lines.len() as u64
}

/// The server killed (SIGKILL) and started again under ingestion: tailrace reports it
/// (`/readyz` 503, `tailrace_store_writable` 0), keeps the sources waiting, reconnects by
/// itself, and resumes with nothing lost or doubled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_under_ingestion_loses_and_doubles_nothing() {
    let _serial = SERIAL.lock().await;
    let Some(mut f) = Ferret::start(false).await else {
        return;
    };
    let db = database();
    let dir = tempfile::tempdir().unwrap();
    // FerretDB on SQLite, restarted under 40 events/s on a busy machine, answered every
    // request in 1 to 9 s for over a minute (its debug log, in a run that failed here): the
    // outage's backlog and the tail's re-reads (no `$gt` pushdown there) outran it, and the
    // stop's flush ran out of time. What this test asks is that nothing is lost or doubled
    // across the restart, so it asks half that rate and lets the stop wait longer.
    let sources = r#"[{ name = "sample", kind = "synthetic", rate_per_sec = 20.0, seed = 9 }]"#;
    let feeds = r#"[{ name = "tail", kind = "tailable", collection = "events" }]"#;
    let mut env = mongo_env(&f, &db, sources, feeds);
    env.push((
        "TAILRACE_INGEST__STOP_FLUSH_TIMEOUT_SECS".into(),
        "100".into(),
    ));
    let mut t = Tailrace::start(dir.path(), &pairs(&env)).await;
    t.wait_until("100 events written", Duration::from_secs(60), async |t| {
        t.json("/api/status").await["ingest"]["written"].as_u64() >= Some(100)
    })
    .await;

    f.kill();
    t.wait_until(
        "/readyz answers 503 and the store is unwritable",
        Duration::from_secs(60),
        async |t| {
            t.get("/readyz").await.0 == 503
                && t.metrics().await.one("tailrace_store_writable", &[]) == Some(0.0)
        },
    )
    .await;
    let (_, why) = t.get("/readyz").await;
    assert!(!why.is_empty(), "/readyz says why");
    let before = t.json("/api/status").await["ingest"]["written"]
        .as_u64()
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;

    f.restart().await;
    t.wait_until(
        "/readyz answers 200 again and writes resume",
        Duration::from_secs(90),
        async |t| {
            t.get("/readyz").await.0 == 200
                && t.json("/api/status").await["ingest"]["written"].as_u64() > Some(before + 100)
        },
    )
    .await;
    assert_eq!(
        t.metrics().await.one("tailrace_store_writable", &[]),
        Some(1.0)
    );
    let feed_seen = |m: &common::Metrics| m.sum("tailrace_feed_events_total", &[("feed", "tail")]);
    let seen = feed_seen(&t.metrics().await);
    t.wait_until(
        "the tailable feed follows again",
        Duration::from_secs(60),
        async |t| feed_seen(&t.metrics().await) > seen + 50.0,
    )
    .await;
    stop_cleanly(&mut t).await;

    let events = all_docs(&f, &db, "events").await;
    let seqs = seqs_by_source(&events);
    if seqs["sample"]
        .iter()
        .copied()
        .ne(1..=seqs["sample"].len() as u64)
    {
        // What tailrace retried, split or warned about, for a CI log to explain it alone.
        eprintln!("{}", t.report());
    }
    assert_contiguous("sample, across the server's restart", &seqs["sample"]);
    let m_missing = seqs["sample"].len();
    assert!(
        m_missing as u64 > before,
        "writes continued after the restart"
    );
    // The source's summary counts each stored event once: a rollups update whose reply was
    // lost with the server is sent again, and must not count twice.
    let rollups = all_docs(&f, &db, "rollups").await;
    let summary = rollups
        .iter()
        .find(|d| d["_id"] == "source:sample")
        .expect("the source's summary");
    if summary["count"].as_u64() != Some(m_missing as u64) {
        eprintln!("{}", t.report());
    }
    assert_eq!(
        summary["count"].as_u64(),
        Some(m_missing as u64),
        "the summary's count against the events stored: {summary}"
    );
}
