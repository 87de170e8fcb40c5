//! `tailrace bench SCENARIO`: the classic MongoDB / RethinkDB / MySQL experiments, re-run on
//! tailrace's own write and read paths, on whichever engine the config selects.
//!
//! Every scenario prints a table, writes `<out>/<scenario>.json` and SVG plots (latency per
//! iteration with the mean as a line, and a latency CDF), and measures in the same run the
//! physical floor it is bounded by, so its figures are also given as ratios to that floor:
//! absolute times drift on a shared machine, ratios to a floor measured a second earlier
//! much less.
//!
//! | scenario | what | floor |
//! |---|---|---|
//! | [`writes`] | one-document `append` per durability level | `fdatasync` of a 512-byte append |
//! | [`reads`] | `get` by position, warm and cold | — (the OS page cache is dropped for cold) |
//! | [`notify`] | write acknowledgment → consumer holds the event, per feed kind | cross-thread task wake |
//! | [`insert`] | 100,000 events through the real [`Ingester`](ingest::ingester::Ingester) | `fdatasync` |
//! | [`update`] | `$inc` of a random key, 1..32 clients | — |
//! | [`outbox`] | "the 20 newest of a sender" through the HTTP API, 1..300 clients | loopback round trip |
//! | [`catchup`] | each feed kind resuming 1,000,000 events behind its checkpoint | — |
//! | [`replay`] | 60,000 tweets from a file through the real binary, hashtags of growing cardinality | — |
//! | [`query`] | aggregation pipelines over 1,000,000 stored events | — |
//!
//! Layout: [`args`] (the command line), [`measure`] (samples and their summary),
//! [`floors`], [`machine`] (what the results were measured on), [`report`] (tables, JSON,
//! published references), [`plot`] (SVG), [`check`] (the `--quick` well-formedness check),
//! [`dataset`] (`--dataset small|realistic`), [`observe`] (the real feeds run beside a
//! scenario and watched: lag, notification latency, catch-up), [`handed`] (what a scenario
//! hands to the pipeline), and one file per scenario. The engine is opened only through
//! [`pipeline::open_store`](ingest::pipeline::open_store) and used only through the store
//! contract, so the same scenarios run on every engine; `insert` and `catchup` run the
//! library's own [`Pipeline`](ingest::pipeline::Pipeline).

pub mod args;
pub mod catchup;
pub mod changes_client;
pub mod check;
pub mod dataset;
pub mod floors;
pub mod handed;
pub mod insert;
pub mod machine;
pub mod measure;
pub mod notify;
pub mod observe;
pub mod outbox;
pub mod plot;
pub mod query;
pub mod reads;
pub mod replay;
pub mod report;
pub mod update;
pub mod writes;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use store::{Store, StoreError};

pub use args::{BenchArgs, Scenario};

use ingest::config::{Config, Engine};
use ingest::pipeline::{self, PipelineError};
use report::Report;

/// What can stop a benchmark.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The store failed.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// The engine could not be opened.
    #[error("{0}")]
    Open(#[from] PipelineError),
    /// A file or socket operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// Why it failed.
        source: std::io::Error,
    },
    /// The results could not be encoded.
    #[error("encoding results: {0}")]
    Json(#[from] serde_json::Error),
    /// A plot could not be drawn.
    #[error("plot {path}: {message}")]
    Plot {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// A scenario could not run as asked (bad sizes, a failed HTTP server, a stuck feed).
    #[error("{0}")]
    Scenario(String),
    /// `--quick`: the output is not well-formed.
    #[error("bench output is not well-formed: {0}")]
    Check(String),
}

/// Shorthand for an I/O error with context.
pub(crate) fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> BenchError {
    let context = context.into();
    move |source| BenchError::Io { context, source }
}

/// Result of a benchmark step.
pub type Result<T, E = BenchError> = std::result::Result<T, E>;

/// What every scenario shares: the config (engine, durability), the sizes asked for, where
/// results go, where the embedded engine's data lives.
pub struct Bench {
    /// The configuration, with `--engine` / `--uri` applied.
    pub config: Config,
    /// The command line.
    pub args: BenchArgs,
    /// The results directory.
    pub out: PathBuf,
    /// Parent of each scenario's data directory (embedded engine) and of the disk probes.
    pub data_root: PathBuf,
    /// Removes `data_root` when the run ends, when it is a temporary directory.
    _temp: Option<tempfile::TempDir>,
    /// When the run started (Unix seconds): part of each scenario's MongoDB database name.
    run: u64,
}

impl Bench {
    /// Prepares a run: applies the engine options, creates the results and data directories.
    pub fn new(mut config: Config, args: BenchArgs) -> Result<Bench> {
        // Another engine than the config's starts from that engine's defaults.
        if let Some(name) = &args.engine
            && name != config.store.engine.name()
        {
            config.store.engine = Engine::named(name)
                .ok_or_else(|| BenchError::Scenario(format!("--engine {name}: no such engine")))?;
        }
        if let Some(uri) = &args.uri {
            config
                .store
                .engine
                .set("uri", uri.clone().into())
                .map_err(|e| BenchError::Scenario(format!("--uri: {e}")))?;
        }
        let out = args.out.clone();
        std::fs::create_dir_all(&out).map_err(io_err(format!("creating {}", out.display())))?;
        let (data_root, temp) = match &args.data {
            Some(dir) => {
                std::fs::create_dir_all(dir)
                    .map_err(io_err(format!("creating {}", dir.display())))?;
                let t = tempfile::Builder::new()
                    .prefix("tailrace-bench-")
                    .tempdir_in(dir)
                    .map_err(io_err(format!("creating a directory in {}", dir.display())))?;
                (t.path().to_path_buf(), Some(t))
            }
            None => {
                let t = tempfile::Builder::new()
                    .prefix("tailrace-bench-")
                    .tempdir()
                    .map_err(io_err("creating a temporary directory"))?;
                (t.path().to_path_buf(), Some(t))
            }
        };
        Ok(Bench {
            config,
            args,
            out,
            data_root,
            _temp: temp,
            run: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        })
    }

    /// The engine's name (`embedded`, `mongodb`).
    pub fn engine_name(&self) -> &'static str {
        self.config.store.engine.name()
    }

    /// Whether the engine writes to a local directory (floors on the local disk mean
    /// something next to it).
    pub fn local_disk(&self) -> bool {
        self.config.store.engine.settings().data_dir().is_some()
    }

    /// The data directory of one scenario's store (fresh: nothing from an earlier scenario).
    pub fn data_dir(&self, name: &str) -> PathBuf {
        self.data_root.join(name)
    }

    /// Opens the configured engine for a scenario, through the pipeline's one place that
    /// chooses engines. The embedded engine gets a fresh directory per `name`.
    pub async fn open_store(&self, name: &str) -> Result<Arc<dyn Store>> {
        Ok(pipeline::open_store(&self.store_config(name)).await?)
    }

    /// The config a scenario's store is opened with: the embedded engine in a fresh
    /// directory, MongoDB in a database of the scenario's and this run's own
    /// (`<database>_<name>_<unix seconds>`), so no scenario finds what an earlier one, or an
    /// earlier run on the same server, wrote: a source's sequence and rollups would continue
    /// from it.
    pub fn store_config(&self, name: &str) -> Config {
        let mut c = self.config.clone();
        c.store
            .engine
            .settings_mut()
            .use_scratch(&self.data_dir(name));
        c.store.database = format!(
            "{}_{}_{}",
            c.store.database,
            name.replace(['-', '.'], "_"),
            self.run
        );
        c
    }

    /// `--iterations`, or the scenario's default (tiny under `--quick`).
    pub fn iterations(&self, default: usize, quick: usize) -> usize {
        self.args
            .iterations
            .unwrap_or(if self.args.quick { quick } else { default })
            .max(1)
    }

    /// `--docs`, or the scenario's default (tiny under `--quick`).
    pub fn docs(&self, default: u64, quick: u64) -> u64 {
        self.args
            .docs
            .unwrap_or(if self.args.quick { quick } else { default })
            .max(1)
    }

    /// `--duration`, or the scenario's default (short under `--quick`).
    pub fn duration(&self, default: Duration, quick: Duration) -> Duration {
        self.args
            .duration
            .unwrap_or(if self.args.quick { quick } else { default })
    }

    /// `--concurrency`, or the scenario's default levels (fewer under `--quick`).
    pub fn concurrency(&self, default: &[usize], quick: &[usize]) -> Vec<usize> {
        let mut levels = self
            .args
            .concurrency
            .clone()
            .unwrap_or_else(|| if self.args.quick { quick } else { default }.to_vec());
        levels.retain(|c| *c > 0);
        if levels.is_empty() {
            levels.push(1);
        }
        levels
    }

    /// A progress bar on stderr for `len` steps; hidden under `--quick` and when stderr is not
    /// a terminal (CI logs get the tables, not redraws).
    pub fn progress(&self, len: u64, what: &str) -> ProgressBar {
        let pb = if self.args.quick {
            ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::hidden())
        } else {
            ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr())
        };
        if let Ok(style) = ProgressStyle::with_template(
            "  {msg:<34} [{bar:30}] {pos:>9}/{len:<9} {per_sec:>12} eta {eta}",
        ) {
            pb.set_style(style.progress_chars("=> "));
        }
        pb.set_message(what.to_string());
        pb
    }
}

/// Runs the scenario(s) asked for, prints their tables, writes JSON and plots into `--out`,
/// and under `--quick` checks that everything written is well-formed.
pub async fn run(config: Config, args: BenchArgs) -> Result<()> {
    let scenarios = args.scenario.expand();
    let bench = Bench::new(config, args)?;
    eprintln!(
        "tailrace bench {} — engine {}, durability {}, dataset {}, {} build, results in {}{}",
        scenarios
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        bench.engine_name(),
        bench.config.store.durability.as_str(),
        bench.args.dataset.as_str(),
        machine::build_profile(),
        bench.out.display(),
        if bench.args.quick {
            " (--quick: tiny sizes, a well-formedness check, not a measurement)"
        } else {
            ""
        },
    );
    let mut written = Vec::new();
    for scenario in scenarios {
        let started = Instant::now();
        let report = match scenario {
            Scenario::Writes => writes::run(&bench).await?,
            Scenario::Reads => reads::run(&bench).await?,
            Scenario::Notify => notify::run(&bench).await?,
            Scenario::Insert => insert::run(&bench).await?,
            Scenario::Update => update::run(&bench).await?,
            Scenario::Outbox => outbox::run(&bench).await?,
            Scenario::Catchup => catchup::run(&bench).await?,
            Scenario::Replay => replay::run(&bench).await?,
            Scenario::Query => query::run(&bench).await?,
            Scenario::All => continue,
        };
        let path = report.write(&bench.out)?;
        println!(
            "  → {} and {} plot(s) in {} ({:.1} s)\n",
            path.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            report.plots.len(),
            bench.out.display(),
            started.elapsed().as_secs_f64()
        );
        written.push(report);
    }
    if bench.args.quick {
        for report in &written {
            check::report_files(&bench.out, &report.scenario)?;
        }
        println!(
            "--quick: {} scenario(s) wrote well-formed JSON and plots",
            written.len()
        );
    }
    Ok(())
}

/// Removes a directory tree, ignoring a missing one (a scenario's data after it ran).
pub(crate) fn remove_dir(path: &Path) {
    if let Err(e) = std::fs::remove_dir_all(path)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        // A bench run has no metrics endpoint: its problems are for the terminal.
        tracing::warn!(path = %path.display(), error = %e, "could not remove bench data");
    }
}

/// Microseconds since the Unix epoch, with sub-microsecond precision (for latencies measured
/// against the engine's commit stamps).
pub(crate) fn wall_us() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as f64 / 1e3)
        .unwrap_or(0.0)
}

/// A `Report` under construction gets the shared facts (machine, engine, build) here.
pub(crate) fn new_report(bench: &Bench, scenario: Scenario, title: &str) -> Report {
    Report::new(bench, scenario.as_str(), title)
}
