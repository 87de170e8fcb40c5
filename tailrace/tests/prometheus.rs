//! A real Prometheus scraping the real pipeline with `config/prometheus.yml` (only the target
//! and the intervals rewritten), then every PromQL expression of every Grafana panel evaluated
//! through Prometheus's HTTP API: each must return data. Also promtool: `check config`,
//! `check rules`, `test rules` (config/alerts_test.yml) and `check metrics` on a real scrape.
//!
//! Needs `prometheus` and `promtool` (Debian's `prometheus` package; `.ci/run` installs it).
//! Without them this prints a notice and passes, except under `CI`, where it fails.

#![allow(clippy::unwrap_used)]

mod common;
mod dashboard;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::Tailrace;
use dashboard::{read, workspace};
use serde_json::Value;
use serde_yaml::Value as Yaml;

/// The scrape interval of the test (the repo's config says 5 s; 1 s gets data sooner).
const SCRAPE: &str = "1s";
/// What Grafana makes of `$__rate_interval` with a 1 s scrape interval: max(4 × scrape,
/// `$__interval` + scrape) = 4 s; one more second so every window holds at least 4 samples.
const RATE_INTERVAL: &str = "5s";
/// `$__interval` for a 15-minute view at ~1000 px is about 1 s; 2 s here.
const INTERVAL: &str = "2s";

/// `prometheus` and `promtool`, or None (with a notice) outside CI when they are missing.
fn tools() -> Option<(PathBuf, PathBuf)> {
    let find = |name: &str| {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(name))
                .find(|p| p.is_file())
        })
    };
    match (find("prometheus"), find("promtool")) {
        (Some(server), Some(tool)) => Some((server, tool)),
        _ => {
            assert!(
                std::env::var_os("CI").is_none(),
                "prometheus/promtool not found in PATH: .ci/run installs Debian's `prometheus` (under CI this is a failure, not a skip)"
            );
            eprintln!(
                "NOTICE: skipping the Prometheus test: no prometheus/promtool in PATH (apt-get install prometheus)"
            );
            None
        }
    }
}

/// Runs promtool; panics with its output unless it succeeds. Returns stdout.
fn promtool(tool: &Path, args: &[&str], stdin: Option<&str>) -> String {
    let mut cmd = Command::new(tool);
    cmd.args(args)
        .current_dir(workspace())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
    let mut child = cmd.spawn().unwrap();
    if let Some(input) = stdin {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "promtool {} failed ({}):\n{stdout}\n{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// A Prometheus server of the test, killed when dropped.
struct Prometheus {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// GET /api/v1/... → the `data` member (panics on an error answer).
    async fn api(&self, path: &str, query: &[(&str, &str)]) -> Value {
        dashboard::prometheus_api(&format!("http://{}", self.addr), path, query).await
    }
}

/// A free port on the loopback interface (released before Prometheus binds it).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// config/prometheus.yml with the target rewritten to `target` and the intervals to 1 s;
/// alerts.yml beside it (rule_files are relative to the config file).
fn test_config(dir: &Path, target: SocketAddr) -> PathBuf {
    let mut cfg: Yaml = serde_yaml::from_str(&read("config/prometheus.yml")).unwrap();
    for key in ["scrape_interval", "evaluation_interval", "scrape_timeout"] {
        cfg["global"][key] = Yaml::String(SCRAPE.into());
    }
    let mut rewritten = 0;
    for job in cfg["scrape_configs"].as_sequence_mut().unwrap() {
        for sc in job["static_configs"].as_sequence_mut().unwrap() {
            for t in sc["targets"].as_sequence_mut().unwrap() {
                assert_eq!(
                    t.as_str(),
                    Some("tailrace:9750"),
                    "the repo's config scrapes the compose service"
                );
                *t = Yaml::String(target.to_string());
                rewritten += 1;
            }
        }
    }
    assert_eq!(rewritten, 1, "one target in config/prometheus.yml");
    for rule in cfg["rule_files"].as_sequence().unwrap() {
        let rule = rule.as_str().unwrap();
        std::fs::copy(workspace().join("config").join(rule), dir.join(rule)).unwrap();
    }
    let path = dir.join("prometheus.yml");
    std::fs::write(&path, serde_yaml::to_string(&cfg).unwrap()).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_panel_has_data_in_a_real_prometheus() {
    let Some((server, tool)) = tools() else {
        return;
    };

    // promtool on the repo's files, as they are.
    promtool(&tool, &["check", "config", "config/prometheus.yml"], None);
    promtool(&tool, &["check", "rules", "config/alerts.yml"], None);
    promtool(&tool, &["test", "rules", "config/alerts_test.yml"], None);

    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("tailrace");
    let mut t = Tailrace::start(&data, dashboard::PIPELINE_ENV).await;
    let started = Instant::now();

    let prom_dir = dir.path().join("prometheus");
    std::fs::create_dir_all(&prom_dir).unwrap();
    let config = test_config(&prom_dir, t.addr);
    let config_arg = config.display().to_string();
    promtool(&tool, &["check", "config", &config_arg], None);

    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let log = prom_dir.join("prometheus.log");
    let child = Command::new(&server)
        .arg(format!("--config.file={config_arg}"))
        .arg(format!(
            "--storage.tsdb.path={}",
            prom_dir.join("tsdb").display()
        ))
        .arg(format!("--web.listen-address={addr}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let prom = Prometheus { child, addr, log };

    // Up: Prometheus answers, loaded the rules, and scrapes the target successfully.
    wait(
        &prom,
        &t,
        "the tailrace target is up",
        Duration::from_secs(60),
        async || {
            let Ok(resp) = reqwest::Client::new()
                .get(format!("http://{addr}/api/v1/targets"))
                .timeout(Duration::from_secs(2))
                .send()
                .await
            else {
                return false;
            };
            let Ok(body) = resp
                .text()
                .await
                .map(|t| serde_json::from_str::<Value>(&t).unwrap_or_default())
            else {
                return false;
            };
            body["data"]["activeTargets"]
                .as_array()
                .is_some_and(|ts| ts.iter().any(|t| t["health"] == "up"))
        },
    )
    .await;
    let rules = prom.api("rules", &[]).await;
    let loaded: usize = rules["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["rules"].as_array().unwrap().len())
        .sum();
    assert_eq!(
        loaded,
        dashboard::alert_exprs().len(),
        "Prometheus loaded every alert rule: {rules}"
    );

    // promtool check metrics on a real scrape: no finding beyond the known ones.
    let (status, body) = t.get("/metrics").await;
    assert_eq!(status, 200);
    check_metrics(&tool, &body);

    // Every expression of every panel (and every template variable's values) returns data.
    // Polled: rate() needs two samples in its window, histogram_quantile a few scrapes, and
    // some series appear only with the first rejected record or process-metrics collection.
    let deadline = Instant::now() + Duration::from_secs(90);
    let evaluated = loop {
        let range = format!("{}s", started.elapsed().as_secs().max(10));
        let (evaluated, empty) = dashboard::panels_without_data(
            &format!("http://{}", prom.addr),
            &[
                ("__rate_interval", RATE_INTERVAL),
                ("__interval", INTERVAL),
                ("__range", &range),
            ],
        )
        .await;
        if empty.is_empty() {
            break evaluated;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {evaluated} panel expressions have no data (no series, or only NaN):\n  {}\n{}\n--- prometheus log ---\n{}",
            empty.len(),
            empty.join("\n  "),
            t.report(),
            prom.log()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    assert!(evaluated >= 20, "evaluated {evaluated} expressions");
    eprintln!(
        "every one of {evaluated} panel expressions returned data after {:.1} s",
        started.elapsed().as_secs_f64()
    );
    drop(prom);
    t.stop().await;
}

/// Findings of `promtool check metrics` accepted for now, each with why. Keep this empty.
const KNOWN_LINT: &[(&str, &str)] = &[];

/// `promtool check metrics` on an exposition: fails on any finding not in [`KNOWN_LINT`].
fn check_metrics(tool: &Path, exposition: &str) {
    use std::io::Write;
    let mut child = Command::new(tool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(exposition.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let unexpected: Vec<&str> = report
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter(|l| {
            !KNOWN_LINT
                .iter()
                .any(|(name, finding)| l.starts_with(name) && l.contains(finding))
        })
        .collect();
    assert!(
        unexpected.is_empty(),
        "promtool check metrics ({}) on a real scrape:\n  {}",
        out.status,
        unexpected.join("\n  ")
    );
    // Exit 3 means lint findings only (all known, checked above); anything else is an error.
    assert!(
        out.status.success() || out.status.code() == Some(3),
        "promtool check metrics failed ({}): {report}",
        out.status
    );
}

/// Polls `check` every 250 ms until it holds; panics with both logs after `timeout`.
async fn wait<F>(prom: &Prometheus, t: &Tailrace, what: &str, timeout: Duration, mut check: F)
where
    F: AsyncFnMut() -> bool,
{
    let deadline = Instant::now() + timeout;
    while !check().await {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting until {what}\n{}\n--- prometheus log ---\n{}",
            t.report(),
            prom.log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[test]
fn rewritten_config_keeps_everything_but_target_and_intervals() {
    let dir = tempfile::tempdir().unwrap();
    let path = test_config(dir.path(), "127.0.0.1:1234".parse().unwrap());
    let got: Yaml = serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut want: Yaml = serde_yaml::from_str(&read("config/prometheus.yml")).unwrap();
    for key in ["scrape_interval", "evaluation_interval", "scrape_timeout"] {
        want["global"][key] = Yaml::String(SCRAPE.into());
    }
    want["scrape_configs"][0]["static_configs"][0]["targets"][0] =
        Yaml::String("127.0.0.1:1234".into());
    assert_eq!(got, want);
    assert!(dir.path().join("alerts.yml").is_file());
}
