//! Test harness: runs the real `tailrace` binary and reads its real HTTP endpoints.
//!
//! Every wait is bounded; a failure message carries the command, the data directory and the
//! child's stderr, so a CI log alone explains it.

#![allow(dead_code, clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

// The exposition parser is shared with the library's source tests (ingest/tests/common):
// one copy, included by path (relative to this directory).
#[path = "../../../ingest/tests/common/metrics.rs"]
mod metrics;
pub use metrics::Metrics;

/// How long the binary may take to start (a debug build on a loaded 2-core machine).
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A running `tailrace run`.
pub struct Tailrace {
    child: Option<Child>,
    /// The bound HTTP address (parsed from the startup banner).
    pub addr: SocketAddr,
    /// The data directory.
    pub data: PathBuf,
    stderr: Arc<Mutex<Vec<String>>>,
    command: String,
}

/// The environment every test run gets: its own data directory, a free port, a fast status line.
pub fn base_env(data: &Path) -> Vec<(String, String)> {
    vec![
        ("TAILRACE_STORE__PATH".into(), data.display().to_string()),
        ("TAILRACE_HTTP__LISTEN".into(), "127.0.0.1:0".into()),
        ("TAILRACE_LOG__STATUS_INTERVAL_SECS".into(), "1".into()),
        ("TAILRACE_LOG".into(), "info".into()),
    ]
}

/// `base_env(data)` plus `extra` (later entries win). With another engine than the embedded
/// one, without the data directory: `store.path` is a key of the embedded engine only, and a
/// key of another engine is refused.
pub fn env_with(data: &Path, extra: &[(String, String)]) -> Vec<(String, String)> {
    let other_engine = extra
        .iter()
        .any(|(k, v)| k == "TAILRACE_STORE__ENGINE" && v != "embedded");
    let mut env = base_env(data);
    if other_engine {
        env.retain(|(k, _)| k != "TAILRACE_STORE__PATH");
    }
    env.extend(extra.iter().cloned());
    env
}

impl Tailrace {
    /// Starts the binary with `base_env(data)` plus `extra` (later entries win), and waits
    /// until `/readyz` answers 200.
    pub async fn start(data: &Path, extra: &[(&str, &str)]) -> Tailrace {
        Self::start_with(data, extra, &["run"]).await
    }

    /// Like [`Tailrace::start`] with explicit arguments.
    pub async fn start_with(data: &Path, extra: &[(&str, &str)], args: &[&str]) -> Tailrace {
        let bin = env!("CARGO_BIN_EXE_tailrace");
        let extra: Vec<(String, String)> = extra
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let env = env_with(data, &extra);
        let mut cmd = Command::new(bin);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // A developer's own TAILRACE_* settings must not leak into tests.
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("TAILRACE_")) {
            cmd.env_remove(k);
        }
        cmd.envs(env.iter().map(|(k, v)| (k, v)));
        let command = format!(
            "{} {} {}",
            env.iter()
                .map(|(k, v)| format!("{k}={v:?}"))
                .collect::<Vec<_>>()
                .join(" "),
            bin,
            args.join(" ")
        );
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {command}: {e}"));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel::<SocketAddr>();
        {
            let pipe = child.stderr.take().unwrap();
            let lines = stderr.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    if let Some(rest) = line.trim().strip_prefix("metrics     http://")
                        && let Some(addr) = rest.strip_suffix("/metrics")
                        && let Ok(addr) = addr.parse()
                    {
                        let _ = tx.send(addr);
                    }
                    lines.lock().unwrap().push(line);
                }
            });
        }
        let mut run = Tailrace {
            child: Some(child),
            addr: "127.0.0.1:1".parse().unwrap(),
            data: data.into(),
            stderr,
            command,
        };
        let addr = tokio::task::spawn_blocking(move || rx.recv_timeout(START_TIMEOUT))
            .await
            .unwrap();
        match addr {
            Ok(a) => run.addr = a,
            Err(_) => panic!(
                "no startup banner within {START_TIMEOUT:?}\n{}",
                run.report()
            ),
        }
        run.wait_until("/readyz answers 200", START_TIMEOUT, async |t| {
            t.get("/readyz").await.0 == 200
        })
        .await;
        run
    }

    /// The command, data directory and stderr so far, for failure messages.
    pub fn report(&self) -> String {
        format!(
            "command: {}\ndata: {}\n--- stderr ---\n{}\n--------------",
            self.command,
            self.data.display(),
            self.stderr.lock().unwrap().join("\n")
        )
    }

    /// The child's stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().join("\n")
    }

    /// GET `path`; (status, body). Status 0 when the request failed.
    pub async fn get(&self, path: &str) -> (u16, String) {
        let url = format!("http://{}{}", self.addr, path);
        // Through `ingest`'s builder: reqwest is built without a default TLS provider.
        let req = ingest::source::http::client()
            .build()
            .unwrap()
            .get(&url)
            .timeout(Duration::from_secs(10))
            .send();
        match req.await {
            Ok(r) => {
                let status = r.status().as_u16();
                (status, r.text().await.unwrap_or_default())
            }
            Err(_) => (0, String::new()),
        }
    }

    /// POST `body` (JSON text) to `path`; (status, the answer as JSON, or as a JSON string
    /// when it is not JSON).
    pub async fn post_json(&self, path: &str, body: &str) -> (u16, serde_json::Value) {
        let resp = ingest::source::http::client()
            .build()
            .unwrap()
            .post(format!("http://{}{}", self.addr, path))
            .header("content-type", "application/json")
            .body(body.to_owned())
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
        )
    }

    /// GET a JSON document (panics with the report on failure).
    pub async fn json(&self, path: &str) -> serde_json::Value {
        let (status, body) = self.get(path).await;
        assert_eq!(
            status,
            200,
            "GET {path} -> {status} {body}\n{}",
            self.report()
        );
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: not JSON ({e}): {body}"))
    }

    /// Scrapes `/metrics`.
    pub async fn metrics(&self) -> Metrics {
        let (status, body) = self.get("/metrics").await;
        assert_eq!(status, 200, "GET /metrics -> {status}\n{}", self.report());
        Metrics::parse(&body)
    }

    /// Polls `check` (every 100 ms) until it holds or `timeout` passes (then panics with the report).
    pub async fn wait_until<F>(&self, what: &str, timeout: Duration, mut check: F)
    where
        F: AsyncFnMut(&Tailrace) -> bool,
    {
        let deadline = Instant::now() + timeout;
        loop {
            if check(self).await {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "timed out after {timeout:?} waiting until {what}\n{}",
                self.report()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// Sends a signal by name (`TERM`, `INT`, `KILL`).
    pub fn signal(&self, name: &str) {
        let pid = self.child.as_ref().unwrap().id().to_string();
        let ok = Command::new("kill")
            .args([&format!("-{name}"), &pid])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{name} {pid} failed");
    }

    /// Waits for the process to exit (panics with the report after `timeout`).
    pub async fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                // Let the reader thread collect the last lines.
                tokio::time::sleep(Duration::from_millis(100)).await;
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "process did not exit within {timeout:?}\n{}",
                self.report()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGTERM, then waits for a clean exit (status 0).
    pub async fn stop(&mut self) {
        self.signal("TERM");
        let status = self.wait_exit(Duration::from_secs(15)).await;
        assert!(
            status.success(),
            "SIGTERM should exit 0, got {status}\n{}",
            self.report()
        );
    }
}

impl Drop for Tailrace {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take()
            && c.try_wait().ok().flatten().is_none()
        {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
