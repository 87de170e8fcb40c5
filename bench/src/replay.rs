//! `replay`: issue 10's table as a command. 60,000 tweet-shaped events (`--docs`) replayed
//! from a file through the **real binary** (`tailrace run`, a `file` source with
//! `pace = "fast"`), with the configuration in use otherwise unchanged (by default: the
//! embedded engine, journaled, the tailable and change feeds), for four hashtag shapes:
//!
//! | variant | hashtags of each event |
//! |---|---|
//! | no hashtags | none |
//! | 100 distinct | drawn uniformly from 100 values |
//! | 10,000,000 distinct | drawn uniformly from 10,000,000 values: nearly every tag is new |
//! | 10,000,000 distinct, top-k off | the same file, `stats.topk_field` set to a field no event has |
//!
//! The events are the synthetic tweets ([`Generator`]) with their hashtags (and the `#tags`
//! in their text) replaced; 0–3 per event as that generator draws them (mean 1.4), spelled
//! by [`realistic::hashtag`]. The binary runs until its source ends, then flushes, lets the
//! feeds drain (at most 2 s, as any stop) and exits. Then the scenario opens the store it
//! left and reads what happened: every event's hand-over and commit times (the ingest rate is
//! the events over the time from the first hand-over to the last commit), and each feed's
//! checkpoint (how many events it had processed when the binary stopped). The wall time from
//! starting the process to its exit gives the end-to-end rate, start-up and shutdown included,
//! and the process's CPU time (its user and system time as a reaped child) the CPU per event:
//! on a shared machine the steadier of the two measures of what a variant costs.
//!
//! The binary is this one, or `--binary`. It gets the configuration as a file written from
//! the one in use, with only the source, the data directory, the HTTP port (any free one)
//! and, for the last variant, `stats.topk_field` changed, and no `TAILRACE_*` variable but
//! `TAILRACE_LOG=warn`, so the file is exactly what runs. It always runs the embedded engine:
//! the scenario reads the data directory it leaves.

use std::collections::HashSet;
use std::io::{BufWriter, Write as _};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use futures::StreamExt;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde_json::json;
use store::{Stamp, Start};

use super::measure::{Samples, fmt_rate, fmt_us, thousands};
use super::plot::{self, Line};
use super::report::{Report, Series, Table, Target};
use super::{Bench, BenchError, Result, Scenario, io_err, new_report};
use ingest::config::{Config, Engine, SourceConfig, SourceKind};
use ingest::source::file::FileConfig;
use ingest::source::realistic;
use ingest::source::synthetic::Generator;
use store::embedded::EmbeddedSettings;

/// A field no event has: the top-k then counts nothing (issue 10's "top-k disabled").
const NO_FIELD: &str = "no_such_field";

/// One row of the table.
struct Variant {
    name: &'static str,
    /// Distinct values the hashtags are drawn from (`None`: events have none).
    vocabulary: Option<u64>,
    topk: bool,
}

const VARIANTS: [Variant; 4] = [
    Variant {
        name: "no hashtags",
        vocabulary: None,
        topk: true,
    },
    Variant {
        name: "100 distinct",
        vocabulary: Some(100),
        topk: true,
    },
    Variant {
        name: "10,000,000 distinct",
        vocabulary: Some(10_000_000),
        topk: true,
    },
    Variant {
        name: "10,000,000 distinct, top-k disabled",
        vocabulary: Some(10_000_000),
        topk: false,
    },
];

/// The figures issue 10 reports, measured before the top-k was replaced, as (variant,
/// events/s). The command that produced them was not recorded; this scenario is that
/// command now.
pub const BEFORE: [(&str, f64); 4] = [
    ("no hashtags", 20_170.0),
    ("100 distinct", 15_733.0),
    ("10,000,000 distinct", 372.0),
    ("10,000,000 distinct, top-k disabled", 12_089.0),
];

/// What one replay did.
struct Outcome {
    name: &'static str,
    distinct_tags: usize,
    tag_uses: u64,
    events: u64,
    /// First hand-over → last commit, seconds.
    ingest_secs: f64,
    /// Process start → exit, seconds.
    wall_secs: f64,
    /// The process's CPU time, user and system, seconds (`None` where `/proc` is not there).
    cpu_secs: Option<f64>,
    /// Hand-over → commit of each event, µs.
    write: Samples,
    /// (feed, events processed by the stop) per configured feed.
    processed: Vec<(String, u64)>,
}

impl Outcome {
    /// The ingest rate: events over first hand-over → last commit.
    fn rate(&self) -> f64 {
        self.events as f64 / self.ingest_secs.max(1e-9)
    }

    /// The process's CPU time per event, µs.
    fn cpu_us_per_event(&self) -> Option<f64> {
        self.cpu_secs.map(|c| 1e6 * c / self.events.max(1) as f64)
    }
}

/// Writes `n` tweets whose hashtags come from `vocabulary` to `path`; returns (distinct tags,
/// tag uses).
fn write_file(path: &Path, n: u64, vocabulary: Option<u64>) -> Result<(usize, u64)> {
    let file =
        std::fs::File::create(path).map_err(io_err(format!("creating {}", path.display())))?;
    let mut out = BufWriter::new(file);
    // The same events in every variant; only their hashtags differ.
    let mut g = Generator::new(61);
    let mut ranks = StdRng::seed_from_u64(62);
    let mut distinct = HashSet::new();
    let mut uses = 0u64;
    for _ in 0..n {
        let mut e = g.event();
        let count = e["hashtags"].as_array().map_or(0, Vec::len);
        let tags: Vec<String> = match vocabulary {
            None => Vec::new(),
            Some(v) => (0..count)
                .map(|_| realistic::hashtag(ranks.random_range(1..=v)))
                .collect(),
        };
        let words: Vec<&str> = e["text"]
            .as_str()
            .unwrap_or_default()
            .split(' ')
            .filter(|w| !w.starts_with('#'))
            .collect();
        let mut text = words.join(" ");
        for t in &tags {
            text.push_str(" #");
            text.push_str(t);
        }
        e["text"] = json!(text);
        uses += tags.len() as u64;
        for t in &tags {
            if !distinct.contains(t) {
                distinct.insert(t.clone());
            }
        }
        e["hashtags"] = json!(tags);
        serde_json::to_writer(&mut out, &e)?;
        out.write_all(b"\n")
            .map_err(io_err(format!("writing {}", path.display())))?;
    }
    out.flush()
        .map_err(io_err(format!("writing {}", path.display())))?;
    Ok((distinct.len(), uses))
}

/// The configuration the binary runs with: the one in use, with the replay's source, data
/// directory, a free port, the embedded engine and (maybe) no top-k field.
fn child_config(bench: &Bench, dir: &Path, events: &Path, topk: bool) -> Config {
    let mut c = bench.config.clone();
    // The embedded engine's settings only: a MongoDB URI may hold a password, not written.
    c.store.engine = Engine::Embedded(EmbeddedSettings::at(dir.join("data")));
    c.http.listen = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    c.sources = vec![SourceConfig {
        name: "replay".into(),
        kind: SourceKind::File(FileConfig::new(events)),
        geo: None,
    }];
    if !topk {
        c.stats.topk_field = NO_FIELD.into();
    }
    c
}

/// The last lines of a file, for an error message.
fn tail_of(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Runs `binary` on `config_path` until it exits; returns the wall time.
async fn run_binary(
    binary: &Path,
    config_path: &Path,
    dir: &Path,
    timeout: Duration,
) -> Result<(f64, Option<f64>)> {
    let stdout = std::fs::File::create(dir.join("stdout.log"))
        .map_err(io_err("creating the replay's stdout log"))?;
    let stderr_path = dir.join("stderr.log");
    let stderr =
        std::fs::File::create(&stderr_path).map_err(io_err("creating the replay's stderr log"))?;
    let mut cmd = tokio::process::Command::new(binary);
    cmd.arg("--config")
        .arg(config_path)
        .arg("run")
        .stdin(Stdio::null())
        .stdout(Stdio::from(stdout))
        .stderr(Stdio::from(stderr))
        .kill_on_drop(true);
    // The file is the whole configuration: no variable of this environment overrides it.
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("TAILRACE_") {
            cmd.env_remove(&key);
        }
    }
    cmd.env("TAILRACE_LOG", "warn");
    let cpu_before = children_cpu_secs();
    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(io_err(format!("starting {}", binary.display())))?;
    let status = match tokio::time::timeout(timeout, child.wait()).await {
        Ok(status) => status.map_err(io_err("waiting for the replay"))?,
        Err(_) => {
            let _ = child.kill().await;
            return Err(BenchError::Scenario(format!(
                "replay: {} had not finished after {} s; its log ends with:\n{}",
                binary.display(),
                timeout.as_secs(),
                tail_of(&stderr_path, 20)
            )));
        }
    };
    let wall = started.elapsed().as_secs_f64();
    // The child is reaped by now, so its times are in this process's children's times; no
    // other child runs meanwhile.
    let cpu = cpu_before
        .zip(children_cpu_secs())
        .map(|(before, after)| after - before);
    if !status.success() {
        return Err(BenchError::Scenario(format!(
            "replay: {} --config {} run exited with {status}; its log ends with:\n{}",
            binary.display(),
            config_path.display(),
            tail_of(&stderr_path, 20)
        )));
    }
    Ok((wall, cpu))
}

/// The CPU time, user and system, of this process's children that have exited and been
/// waited for (`cutime` + `cstime` of `/proc/self/stat`), seconds; clock-tick precision.
fn children_cpu_secs() -> Option<f64> {
    let stat = procfs::process::Process::myself().ok()?.stat().ok()?;
    let ticks = stat.cutime.max(0) + stat.cstime.max(0);
    Some(ticks as f64 / procfs::ticks_per_second() as f64)
}

/// Reads what the run left: every event's hand-over and commit times, each feed's checkpoint.
async fn read_back(config: &Config, n: u64) -> Result<(Samples, f64, Vec<(String, u64)>)> {
    let store = ingest::pipeline::open_store(config).await?;
    let events = store
        .capped("events", &ingest::pipeline::events_spec(config))
        .await?;
    let mut tail = events.tail(Start::Oldest);
    let mut write = Samples::with_capacity(n as usize);
    let (mut first_received, mut last_committed) = (i64::MAX, i64::MIN);
    for _ in 0..n {
        let record = match tokio::time::timeout(Duration::from_secs(10), tail.next()).await {
            Ok(Some(Ok(r))) => r,
            Ok(Some(Err(e))) => return Err(e.into()),
            Ok(None) | Err(_) => {
                return Err(BenchError::Scenario(format!(
                    "replay: the store holds {} of the {n} events replayed; the events collection evicted the rest or never got them (its bounds: store.events.max_docs = {}, store.events.max_bytes = {}; raise them for more events, e.g. TAILRACE_STORE__EVENTS__MAX_BYTES)",
                    write.len(),
                    config.store.events.max_docs,
                    config.store.events.max_bytes
                )));
            }
        };
        let received = Stamp::of(&record.doc).map(|s| s.received_us);
        if let (Some(r), Some(c)) = (received, record.committed_at_us) {
            first_received = first_received.min(r);
            last_committed = last_committed.max(c);
            write.push_us((c - r) as f64);
        }
    }
    drop(tail);
    let mut processed = Vec::new();
    for f in &config.feeds {
        let events = store
            .load_checkpoint(&f.name)
            .await?
            .and_then(|cp| cp.get("stats")?.get("events")?.as_u64())
            .unwrap_or(0);
        processed.push((f.name.clone(), events));
    }
    drop(events);
    store.close().await?;
    let secs = (last_committed - first_received) as f64 / 1e6;
    Ok((write, secs, processed))
}

/// The binary to run: `--binary`, or this process's own.
fn binary(bench: &Bench) -> Result<PathBuf> {
    match &bench.args.binary {
        Some(b) => Ok(b.clone()),
        None => std::env::current_exe().map_err(io_err("finding this program's path")),
    }
}

/// Runs the scenario.
pub async fn run(bench: &Bench) -> Result<Report> {
    let n = bench.docs(60_000, 300);
    let timeout = if bench.args.quick {
        Duration::from_secs(60)
    } else {
        Duration::from_secs(900)
    };
    let binary = binary(bench)?;
    let keep = bench.config.store.events.max_docs;
    if n > keep {
        return Err(BenchError::Scenario(format!(
            "replay: --docs {n} is more than the events collection keeps (store.events.max_docs = {keep}), so the run could not be read back; raise it, e.g. TAILRACE_STORE__EVENTS__MAX_DOCS={n}, with store.events.max_bytes to match"
        )));
    }
    let mut report = new_report(
        bench,
        Scenario::Replay,
        &format!(
            "{} tweets replayed from a file through `tailrace run` (file source, pace fast), hashtags from none to 10,000,000 distinct values",
            thousands(n)
        ),
    );
    report.params = json!({
        "events": n, "binary": binary.display().to_string(), "engine": "embedded",
        "durability": bench.config.store.durability.as_str(),
        "feeds": bench.config.feeds.iter().map(|f| json!({"name": f.name, "kind": f.kind()})).collect::<Vec<_>>(),
        "stats": bench.config.stats,
        "events_generator": "source::synthetic::Generator (0-3 hashtags per event), hashtags replaced by uniform draws spelled by source::realistic::hashtag",
        "topk_disabled_by": format!("stats.topk_field = {NO_FIELD:?}"),
    });
    let mut outcomes = Vec::new();
    for (i, v) in VARIANTS.iter().enumerate() {
        let dir = bench.data_dir(&format!("replay-{i}"));
        std::fs::create_dir_all(&dir).map_err(io_err(format!("creating {}", dir.display())))?;
        let file = dir.join("events.ndjson");
        let (distinct_tags, tag_uses) = write_file(&file, n, v.vocabulary)?;
        let config = child_config(bench, &dir, &file, v.topk);
        let config_path = dir.join("tailrace.toml");
        let text = toml::to_string(&config)
            .map_err(|e| BenchError::Scenario(format!("replay: writing the config: {e}")))?;
        std::fs::write(&config_path, text)
            .map_err(io_err(format!("writing {}", config_path.display())))?;
        eprintln!("  replay {}: {} events", v.name, thousands(n));
        let (wall_secs, cpu_secs) = run_binary(&binary, &config_path, &dir, timeout).await?;
        let (write, ingest_secs, processed) = read_back(&config, n).await?;
        super::remove_dir(&dir);
        outcomes.push(Outcome {
            name: v.name,
            distinct_tags,
            tag_uses,
            events: n,
            ingest_secs,
            wall_secs,
            cpu_secs,
            write,
            processed,
        });
    }

    for o in &outcomes {
        let rate = o.rate();
        let before = BEFORE.iter().find(|b| b.0 == o.name).map(|b| b.1);
        let behind: u64 = o
            .processed
            .iter()
            .map(|(_, p)| o.events.saturating_sub(*p))
            .sum();
        report.series.push(Series {
            name: o.name.into(),
            params: json!({"distinct_tags": o.distinct_tags, "tag_uses": o.tag_uses}),
            latency_us: o.write.summary(),
            ops: o.events,
            failures: behind,
            elapsed_secs: o.ingest_secs,
            throughput_per_sec: rate,
            extra: json!({
                "latency_is": "hand-over by the file source → commit, per event",
                "wall_secs": o.wall_secs,
                "end_to_end_per_sec": o.events as f64 / o.wall_secs.max(1e-9),
                "cpu_secs": o.cpu_secs,
                "cpu_us_per_event": o.cpu_us_per_event(),
                "feeds_processed": o.processed.iter().map(|(f, p)| json!({"feed": f, "events": p})).collect::<Vec<_>>(),
                "issue_10_before_per_sec": before,
                "failures_are": "events the feeds had not processed when the binary stopped (summed over feeds)",
            }),
            ..Series::default()
        });
    }
    let outcome = |name: &str| outcomes.iter().find(|o| o.name == name);
    let (on, off, none) = (
        outcome("10,000,000 distinct"),
        outcome("10,000,000 distinct, top-k disabled"),
        outcome("no hashtags"),
    );
    if let (Some(on), Some(off), Some(none)) = (on, off, none) {
        let on_vs_off = 100.0 * on.rate() / off.rate().max(1e-9);
        let on_vs_none = 100.0 * on.rate() / none.rate().max(1e-9);
        report.targets.push(Target::at_least(
            "10,000,000 distinct: top-k on ≥ 90 % of the rate with top-k off (the statistic costs little at any cardinality)",
            on_vs_off,
            90.0,
            "%",
        ));
        report.targets.push(Target::at_least(
            "10,000,000 distinct ≥ 50 % of the rate without hashtags (no high-cardinality cliff)",
            on_vs_none,
            50.0,
            "%",
        ));
    }
    if let (Some(on), Some(off)) = (
        on.and_then(Outcome::cpu_us_per_event),
        off.and_then(Outcome::cpu_us_per_event),
    ) {
        // The rate of a run this short moves with whatever else the machine does; the CPU it
        // took is the steadier measure of what the statistic costs.
        report.notes.push(format!(
            "10,000,000 distinct: CPU per event with top-k on is {:.0} % of top-k off ({on:.1} against {off:.1} µs, the whole process, start-up and shutdown included)",
            100.0 * on / off.max(1e-9)
        ));
    }
    for o in &outcomes {
        for (feed, p) in o.processed.iter().filter(|(_, p)| *p < o.events) {
            report.notes.push(format!(
                "{}: feed {feed} had processed {} of {} events when the binary stopped (it drains for at most 2 s)",
                o.name,
                thousands(*p),
                thousands(o.events)
            ));
        }
    }
    report.notes.push(
        "events/s is the ingest rate: events ÷ (last commit − first hand-over), from the stored stamps; end to end is events ÷ the process's wall time, start-up and shutdown included".into(),
    );

    let lines: Vec<Line<'_>> = outcomes
        .iter()
        .map(|o| Line {
            name: o.name.into(),
            values: o.write.as_slice(),
        })
        .collect();
    report.plots.extend(plot::latency_pair(
        &bench.out,
        "replay",
        "replay: hand-over → commit per event",
        &lines,
    )?);

    report.print_header();
    let mut t = Table::new(&[
        "hashtags drawn from",
        "distinct tags",
        "events",
        "events/s",
        "issue 10 before",
        "wall s",
        "end to end/s",
        "CPU µs/event",
        "write p50",
        "write p99",
        "feeds processed",
    ]);
    for (s, o) in report.series.iter().zip(&outcomes) {
        t.row(vec![
            o.name.into(),
            thousands(o.distinct_tags as u64),
            thousands(o.events),
            fmt_rate(s.throughput_per_sec),
            s.extra["issue_10_before_per_sec"]
                .as_f64()
                .map_or_else(|| "—".into(), fmt_rate),
            format!("{:.2}", o.wall_secs),
            fmt_rate(o.events as f64 / o.wall_secs.max(1e-9)),
            o.cpu_us_per_event()
                .map_or_else(|| "—".into(), |c| format!("{c:.1}")),
            fmt_us(s.latency_us.p50),
            fmt_us(s.latency_us.p99),
            o.processed
                .iter()
                .map(|(f, p)| format!("{f} {}", thousands(*p)))
                .collect::<Vec<_>>()
                .join(", "),
        ]);
    }
    t.print();
    report.print_footer();
    Ok(report)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn the_file_has_the_hashtags_asked_for() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("e.ndjson");
        let (distinct, uses) = write_file(&path, 2000, Some(100)).unwrap();
        assert_eq!(distinct, 100, "2,000 events draw every one of 100 tags");
        assert!(uses > 2000, "~1.4 tags per event, saw {uses} in 2,000");
        let text = std::fs::read_to_string(&path).unwrap();
        let first: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        for tag in first["hashtags"].as_array().unwrap() {
            let t = tag.as_str().unwrap();
            assert!(
                first["text"].as_str().unwrap().contains(&format!("#{t}")),
                "the text carries #{t}: {first}"
            );
        }
        let (distinct, uses) = write_file(&path, 2000, Some(10_000_000)).unwrap();
        assert!(
            distinct as u64 >= uses - 2,
            "10^7 values: every tag new (distinct {distinct} of {uses})"
        );
        let (distinct, uses) = write_file(&path, 500, None).unwrap();
        assert_eq!((distinct, uses), (0, 0));
        assert!(
            !std::fs::read_to_string(&path).unwrap().contains('#'),
            "no hashtag anywhere"
        );
    }
}
