//! Shared by `stack.rs` and `prometheus.rs`: the Grafana dashboards and alert rules of the repo,
//! their PromQL, Grafana's variables substituted, and the metric names each expression reads;
//! plus the pipeline configuration under which every panel has data on the embedded engine.

#![allow(dead_code, clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::Value;

/// The workspace root (the parent of `tailrace/`).
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Reads a file of the repository (panics naming it).
pub fn read(rel: &str) -> String {
    let path = workspace().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// Environment for a pipeline under which every panel of the dashboards has data on the
/// embedded engine:
/// - the three feed kinds the latency panels compare (`tail`, `changes`, `oplog`), as
///   docker-compose.yml runs them on MongoDB (the oplog feed reads the embedded op log);
/// - a short Bollinger period, so the bands exist within seconds;
/// - `max_event_bytes` below the size of many synthetic events (about 250 to 400 bytes), so
///   that real records are rejected as `too_large` and the rejected-events panel has data.
pub const PIPELINE_ENV: &[(&str, &str)] = &[
    (
        "TAILRACE_FEEDS",
        r#"[{name="tail", kind="tailable", collection="events"},
            {name="changes", kind="changes", collections=["rollups"], filter={ops=["insert", "update"], key_prefix="source:"}},
            {name="oplog", kind="oplog", collections=["rollups"], filter={ops=["insert", "update"], key_prefix="source:"}}]"#,
    ),
    ("TAILRACE_STATS__PERIOD", "3"),
    ("TAILRACE_INGEST__MAX_EVENT_BYTES", "300"),
];

/// The uid of the provisioned Prometheus datasource (grafana/provisioning/datasources).
pub fn provisioned_uid() -> String {
    let y: serde_yaml::Value =
        serde_yaml::from_str(&read("grafana/provisioning/datasources/prometheus.yml")).unwrap();
    let sources = y["datasources"].as_sequence().unwrap();
    assert_eq!(sources.len(), 1, "one provisioned datasource");
    assert_eq!(sources[0]["type"].as_str(), Some("prometheus"));
    sources[0]["uid"].as_str().unwrap().to_string()
}

/// Every dashboard JSON under grafana/dashboards, parsed.
pub fn dashboards() -> Vec<(PathBuf, Value)> {
    let dir = workspace().join("grafana/dashboards");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            let text = std::fs::read_to_string(&path).unwrap();
            let json: Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{}: not JSON: {e}", path.display()));
            out.push((path, json));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(!out.is_empty(), "no dashboard in {}", dir.display());
    out
}

/// Every panel of a dashboard, rows and the panels inside collapsed rows included.
pub fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in dashboard["panels"].as_array().into_iter().flatten() {
        out.push(p);
        for inner in p["panels"].as_array().into_iter().flatten() {
            out.push(inner);
        }
    }
    out
}

/// One PromQL expression of a panel.
#[derive(Debug, Clone)]
pub struct Query {
    /// `dashboard file / panel id "title" / refId`, for messages.
    pub place: String,
    /// As written in the JSON.
    pub expr: String,
    /// Whether the panel asks for an instant query.
    pub instant: bool,
}

/// Every PromQL expression of every panel.
pub fn queries(path: &Path, dashboard: &Value) -> Vec<Query> {
    let file = path.file_name().unwrap().to_string_lossy().to_string();
    let mut out = Vec::new();
    for p in panels(dashboard) {
        for t in p["targets"].as_array().into_iter().flatten() {
            out.push(Query {
                place: format!(
                    "{file} / panel {} {:?} / {}",
                    p["id"],
                    p["title"].as_str().unwrap_or(""),
                    t["refId"].as_str().unwrap_or("?")
                ),
                expr: t["expr"].as_str().unwrap_or("").to_string(),
                instant: t["instant"].as_bool().unwrap_or(false),
            });
        }
    }
    out
}

/// The template variables of a dashboard with their current (default) values.
pub fn variables(dashboard: &Value) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for v in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let name = v["name"].as_str().unwrap().to_string();
        let value = match &v["current"]["value"] {
            Value::String(s) => s.clone(),
            other => panic!("variable {name}: current.value should be one string, is {other}"),
        };
        out.insert(name, value);
    }
    out
}

/// Replaces Grafana's variables: the built-ins by the given durations, the dashboard's own by
/// `vars`. Panics if a `$` is left (an unknown variable would reach Prometheus as text).
pub fn substitute(
    expr: &str,
    builtins: &[(&str, &str)],
    vars: &BTreeMap<String, String>,
) -> String {
    let mut all: Vec<(String, String)> = builtins
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .chain(vars.iter().map(|(k, v)| (k.clone(), v.clone())))
        .collect();
    // Longest names first, so `$__range` does not eat the start of `$__range_s`.
    all.sort_by_key(|(k, _)| std::cmp::Reverse(k.len()));
    let mut out = expr.to_string();
    for (k, v) in &all {
        out = out
            .replace(&format!("${{{k}}}"), v)
            .replace(&format!("${k}"), v);
    }
    assert!(
        !out.contains('$'),
        "unknown variable left in {expr:?} after substitution: {out:?}"
    );
    out
}

/// Aggregation operators and keywords: identifiers that are not metric names.
const NOT_METRICS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "atan2",
    "inf",
    "nan",
];

/// The metric names an expression reads (a small PromQL lexer: strings, label matchers, ranges
/// and grouping label lists are skipped; identifiers followed by `(` are functions).
pub fn metric_names(expr: &str) -> BTreeSet<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut out = BTreeSet::new();
    let mut i = 0;
    let mut skip_label_list = false;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' | '\'' | '`' => {
                i += 1;
                while i < chars.len() && chars[i] != c {
                    if chars[i] == '\\' {
                        i += 1;
                    }
                    i += 1;
                }
                i += 1;
            }
            '{' | '[' => {
                let close = if c == '{' { '}' } else { ']' };
                while i < chars.len() && chars[i] != close {
                    if chars[i] == '"' {
                        i += 1;
                        while i < chars.len() && chars[i] != '"' {
                            if chars[i] == '\\' {
                                i += 1;
                            }
                            i += 1;
                        }
                    }
                    i += 1;
                }
                i += 1;
            }
            '(' if skip_label_list => {
                while i < chars.len() && chars[i] != ')' {
                    i += 1;
                }
                i += 1;
                skip_label_list = false;
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let start = i;
                while i < chars.len()
                    && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
                {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let mut j = i;
                while j < chars.len() && chars[j].is_whitespace() {
                    j += 1;
                }
                let call = j < chars.len() && chars[j] == '(';
                if matches!(
                    word.as_str(),
                    "by" | "without" | "on" | "ignoring" | "group_left" | "group_right"
                ) {
                    skip_label_list = true;
                } else if !call && !NOT_METRICS.contains(&word.to_lowercase().as_str()) {
                    out.insert(word);
                }
            }
            c if c.is_ascii_digit() || c == '.' => {
                // A number or a duration (5m, 1.5e3): never a name.
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                    i += 1;
                }
            }
            _ => i += 1,
        }
    }
    out
}

/// GET `{prometheus}/api/v1/{path}` with `query` → the answer's `data` (panics, naming the URL,
/// on a transport error or an error answer).
pub async fn prometheus_api(prometheus: &str, path: &str, query: &[(&str, &str)]) -> Value {
    let params: Vec<String> = query
        .iter()
        .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
        .collect();
    let url = format!("{prometheus}/api/v1/{path}?{}", params.join("&"));
    // Through `ingest`'s builder: reqwest is built without a default TLS provider.
    let resp = ingest::source::http::client()
        .build()
        .unwrap()
        .get(&url)
        .timeout(std::time::Duration::from_secs(10))
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let text = resp.text().await.unwrap();
    let body: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("GET {url}: not JSON ({e}): {text}"));
    assert_eq!(body["status"], "success", "GET {url} {query:?}: {body}");
    body["data"].clone()
}

/// Percent-encodes a query-string component (everything but RFC 3986's unreserved bytes).
pub fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Evaluates every panel expression of every dashboard (Grafana's built-in variables replaced
/// by `builtins`, the dashboard's own by their defaults) and every template variable through
/// the Prometheus at `prometheus` (a base URL). Returns how many expressions were evaluated and
/// a line for each one without data (no series, or only NaN) and each variable whose values
/// lack its default.
pub async fn panels_without_data(
    prometheus: &str,
    builtins: &[(&str, &str)],
) -> (usize, Vec<String>) {
    let mut empty = Vec::new();
    let mut evaluated = 0;
    for (path, d) in dashboards() {
        let vars = variables(&d);
        for (name, value) in &vars {
            let v = d["templating"]["list"]
                .as_array()
                .unwrap()
                .iter()
                .find(|v| v["name"] == name.as_str())
                .unwrap();
            let def = v["query"]["query"].as_str().unwrap();
            let inner = def
                .strip_prefix("label_values(")
                .and_then(|s| s.strip_suffix(')'))
                .unwrap_or_else(|| panic!("variable {name}: unsupported query {def}"));
            let (metric, label) = inner.split_once(',').unwrap();
            let values = prometheus_api(
                prometheus,
                &format!("label/{}/values", label.trim()),
                &[("match[]", metric.trim())],
            )
            .await;
            if !values
                .as_array()
                .unwrap()
                .iter()
                .any(|v| v == value.as_str())
            {
                empty.push(format!(
                    "variable {name}: {def} = {values}, lacks its default {value:?}"
                ));
            }
        }
        for q in queries(&path, &d) {
            let expr = substitute(&q.expr, builtins, &vars);
            let result = prometheus_api(prometheus, "query", &[("query", &expr)]).await;
            evaluated += 1;
            let samples = result["result"].as_array().cloned().unwrap_or_default();
            let finite = samples.iter().any(|s| {
                s["value"][1]
                    .as_str()
                    .and_then(|v| v.parse::<f64>().ok())
                    .is_some_and(f64::is_finite)
            });
            if !finite {
                empty.push(format!("{}: {expr}\n      -> {result}", q.place));
            }
        }
    }
    (evaluated, empty)
}

/// Every `expr` of the alert rules in config/alerts.yml, with the alert's name.
pub fn alert_exprs() -> Vec<(String, String)> {
    let y: serde_yaml::Value = serde_yaml::from_str(&read("config/alerts.yml")).unwrap();
    let mut out = Vec::new();
    for g in y["groups"].as_sequence().unwrap() {
        for r in g["rules"].as_sequence().unwrap() {
            let name = r["alert"]
                .as_str()
                .or(r["record"].as_str())
                .unwrap()
                .to_string();
            out.push((name, r["expr"].as_str().unwrap().to_string()));
        }
    }
    out
}

#[test]
fn extracts_metric_names_from_promql() {
    let names = |e: &str| metric_names(e).into_iter().collect::<Vec<_>>();
    assert_eq!(
        names(
            "histogram_quantile(0.99, sum by (le, durability) (rate(tailrace_write_latency_seconds_bucket{collection=\"events\"}[$__rate_interval])))"
        ),
        ["tailrace_write_latency_seconds_bucket"]
    );
    assert_eq!(
        names("topk(10, tailrace_topk_events{feed=\"$feed\"} > 0)"),
        ["tailrace_topk_events"]
    );
    assert_eq!(
        names(
            "sum by (source) (rate(a_total[5m])) / sum by (source) (rate(b_total[5m])) > 0.05 and on (instance) up{job=\"x\"} == 1 unless c offset 5m"
        ),
        ["a_total", "b_total", "c", "up"]
    );
    assert_eq!(
        names("max(x:recorded:rate5m) or vector(0)"),
        ["x:recorded:rate5m"]
    );
}

#[test]
fn substitutes_grafana_variables() {
    let vars = BTreeMap::from([("feed".to_string(), "tail".to_string())]);
    assert_eq!(
        substitute(
            "rate(x{feed=\"$feed\"}[$__rate_interval]) + rate(y{f=\"${feed}\"}[$__range])",
            &[("__rate_interval", "5s"), ("__range", "1m")],
            &vars
        ),
        "rate(x{feed=\"tail\"}[5s]) + rate(y{f=\"tail\"}[1m])"
    );
}
