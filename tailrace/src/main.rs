//! The `tailrace` binary: parse the command line, load the config, install telemetry and
//! signal handling, call the library, map errors to exit codes. Nothing else.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use ingest::config::Config;
use tokio_util::sync::CancellationToken;

/// mimalloc, tuned in `main` (see `tailrace::allocator`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// What `tailrace --help` says first.
const ABOUT: &str = "tailrace reads live streams of JSON events (HTTP, server-sent events, \
WebSocket, files, programs), stores them with the durability you choose (embedded, or MongoDB), \
and computes rolling statistics (rates, Bollinger bands, top-k) on every event through tailable \
cursors and change feeds, served as Prometheus metrics, a JSON API, change streams and a live page.";

/// The common commands, after the options.
const COMMON: &str = "\
Common commands:
  tailrace                          run the pipeline with the defaults: a synthetic stream at
                                    70 events/s, stored in ./data; the live page on
                                    http://127.0.0.1:9750/
  tailrace --config my.toml         run with your configuration (config/tailrace.toml lists
                                    every key; any key also as TAILRACE_<SECTION>__<KEY>)
  tailrace check-config             check a configuration and print it with the defaults
  tailrace tail changes             print what a running pipeline's feed sees, live
  tailrace query '[{\"$sortByCount\": \"$lang\"}]'
                                    ask the stored window a question (MongoDB's pipelines)
  tailrace dead-letters             list the rejected records, by source and reason
  tailrace bench insert             measure this machine (docs/BENCHMARKS.md)

Logs go to stderr: TAILRACE_LOG=debug for more, --log-format json for a log shipper.";

#[derive(Parser)]
#[command(version, about = "tailrace: a realtime event ingestion pipeline", long_about = ABOUT, after_help = COMMON)]
struct Cli {
    /// Configuration file (TOML). Without it, built-in defaults; every key can also come from
    /// TAILRACE_* variables (TAILRACE_STORE__ENGINE=mongodb).
    #[arg(long, short, global = true, env = "TAILRACE_CONFIG")]
    config: Option<PathBuf>,
    /// How log lines are written to stderr: `text` for people (coloured only on a terminal),
    /// `json` (one object per line) for log shippers.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "TAILRACE_LOG_FORMAT")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Option<Command>,
}

/// `--log-format`.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    /// Human-readable lines; ANSI colours only when stderr is a terminal and NO_COLOR is unset.
    Text,
    /// One JSON object per line (timestamp, level, target, fields), for log shippers.
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the pipeline (the default).
    Run,
    /// Print what a feed of a running pipeline holds, or (--collection) the changes of a
    /// collection, live, one JSON document per line; reconnects and resumes exactly.
    #[command(group(clap::ArgGroup::new("what").required(true).args(["feed", "collection"])))]
    Tail {
        /// The feed's name (see the `feeds` line at startup, or /api/feeds).
        feed: Option<String>,
        /// Follow a collection instead (events, dead_letters, rollups, stats, trends) through
        /// /api/changes.
        #[arg(long)]
        collection: Option<String>,
        /// Only documents matching this filter, in MongoDB query syntax, e.g. '{"lang":"ja"}'.
        #[arg(long, requires = "collection")]
        filter: Option<String>,
        /// Only these kinds of change (keyed collections): insert,update,replace,delete.
        #[arg(long, requires = "collection")]
        ops: Option<String>,
        /// First the current matching documents (events: the newest --initial-limit), then
        /// the changes, with no gap and no duplicate between them.
        #[arg(long, requires = "collection")]
        include_initial: bool,
        /// How many current documents --include-initial prints (events, dead_letters).
        #[arg(long, requires = "include_initial")]
        initial_limit: Option<usize>,
        /// Print each key's changes at most once per this many milliseconds (the latest).
        #[arg(long, requires = "collection", value_name = "MS")]
        squash: Option<u64>,
        /// Start exactly after this id (printed with every line).
        #[arg(long, requires = "collection", value_name = "ID")]
        resume_after: Option<String>,
        /// The running pipeline's address (default: http.listen of the config).
        #[arg(long)]
        url: Option<String>,
    },
    /// Ask a running pipeline a question in MongoDB's aggregation language, over the stored
    /// window of a collection, e.g.
    /// '[{"$group": {"_id": "$lang", "n": {"$sum": 1}}}, {"$sort": {"n": -1}}]'.
    Query {
        /// The pipeline: a JSON array of stages.
        pipeline: String,
        /// The collection: events, dead_letters, rollups, stats or trends.
        #[arg(long, default_value = "events")]
        collection: String,
        /// How the answer is printed.
        #[arg(long, value_enum, default_value_t = tailrace::query::Format::Table)]
        format: tailrace::query::Format,
        /// The running pipeline's address (default: http.listen of the config).
        #[arg(long)]
        url: Option<String>,
    },
    /// Check the configuration and print it with defaults filled in (secrets redacted).
    CheckConfig,
    /// List the dead letters (rejected records) by source and reason; `replay` submits them
    /// again once the cause is fixed. Run it while the pipeline is stopped.
    DeadLetters {
        #[command(subcommand)]
        action: Option<DeadLettersAction>,
        /// Only the dead letters of this source.
        #[arg(long, global = true)]
        source: Option<String>,
        /// Only those rejected for this reason (malformed_json, too_large, invalid_utf8, ...).
        #[arg(long, global = true)]
        reason: Option<String>,
        /// How many of the newest to show.
        #[arg(long, default_value_t = 10)]
        limit: usize,
    },
    /// Measure this machine and engine: writes, reads, notify, insert, update, outbox, catchup,
    /// replay (or all); prints tables, writes JSON and SVG plots (see docs/BENCHMARKS.md).
    Bench(bench::BenchArgs),
}

#[derive(Subcommand)]
enum DeadLettersAction {
    /// Submit them again through the same validation: those that pass become events and leave
    /// the list; the others stay.
    Replay {
        /// Only report what would happen; write nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

fn main() -> ExitCode {
    tailrace::allocator::tune();
    let cli = Cli::parse();
    // `bench` prints tables: only warnings in between, unless TAILRACE_LOG asks for more.
    let default_filter = match cli.command {
        Some(Command::Bench(_)) => "warn",
        _ => "info",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("TAILRACE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    // At trace level tungstenite logs the whole upgrade request, header values (tokens) and
    // query included: never below debug, whatever TAILRACE_LOG asks.
    let filter = match "tungstenite::handshake=debug".parse() {
        Ok(directive) => filter.add_directive(directive),
        Err(_) => filter,
    };
    init_logs(cli.log_format, filter);
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_start(tailrace::priority::lower_this_thread)
        .build()
        .context("starting the async runtime")
        .and_then(|rt| rt.block_on(run(cli)));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // It ran but did not stop cleanly; each problem was logged, saying what was lost.
        Err(e) if is_unclean(&e) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            ExitCode::from(2)
        }
    }
}

/// Installs the log subscriber: JSON lines, or text with colour only where a person reads it
/// (a terminal, and no `NO_COLOR`): a file or a pipe gets no escape codes.
fn init_logs(format: LogFormat, filter: tracing_subscriber::EnvFilter) {
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => {
            logs.json().init();
            tailrace::status::banner_as_log();
        }
        LogFormat::Text => {
            let colour = std::io::stderr().is_terminal()
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
            logs.with_ansi(colour).init();
        }
    }
}

/// The error and its causes on one line, each said once: most of tailrace's errors already
/// name their cause in their own message ("store: data directory … is in use …"), which
/// `{:#}` would repeat after it.
fn one_line(e: &anyhow::Error) -> String {
    let mut out = e.to_string();
    for cause in e.chain().skip(1) {
        let cause = cause.to_string();
        if !out.contains(&cause) {
            out.push_str(": ");
            out.push_str(&cause);
        }
    }
    out
}

fn is_unclean(e: &anyhow::Error) -> bool {
    matches!(
        e.downcast_ref::<tailrace::run::RunError>(),
        Some(tailrace::run::RunError::Unclean { .. })
    )
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    // A config error is one line naming the key and the fix; no backtrace noise.
    let config = Config::load(cli.config.as_deref()).map_err(|e| anyhow::anyhow!("{e}"))?;
    // From the main thread, which may run on every core: queries get theirs, the rest stay
    // the pipeline's.
    store::query::use_cores(config.http.query_cores);
    match cli.command.unwrap_or(Command::Run) {
        Command::CheckConfig => {
            let text = toml::to_string_pretty(&config.redacted()).context("printing the config")?;
            println!("# configuration is valid\n{text}");
            Ok(())
        }
        Command::Run => {
            let engine = config.store.engine.name();
            let metrics = tailrace::exporter::install(engine).map_err(anyhow::Error::msg)?;
            let shutdown = CancellationToken::new();
            tokio::spawn(tailrace::run::cancel_on_signal(shutdown.clone()));
            tailrace::run::run(config, metrics, Vec::new(), shutdown).await?;
            Ok(())
        }
        Command::Bench(args) => Ok(bench::run(config, args).await?),
        Command::DeadLetters {
            action,
            source,
            reason,
            limit,
        } => {
            let filter = tailrace::dead_letters::Filter { source, reason };
            match action {
                None => print!(
                    "{}",
                    tailrace::dead_letters::list(&config, &filter, limit).await?
                ),
                Some(DeadLettersAction::Replay { dry_run }) => print!(
                    "{}",
                    tailrace::dead_letters::replay(&config, &filter, dry_run).await?
                ),
            }
            Ok(())
        }
        Command::Tail {
            feed,
            collection,
            filter,
            ops,
            include_initial,
            initial_limit,
            squash,
            resume_after,
            url,
        } => {
            let base = url.unwrap_or_else(|| format!("http://{}", config.http.listen));
            match (collection, feed) {
                (Some(collection), _) => {
                    let args = tailrace::tail::ChangesArgs {
                        collection,
                        filter,
                        ops,
                        include_initial,
                        initial_limit,
                        squash_ms: squash,
                        resume_after,
                    };
                    tailrace::tail::tail_changes(&base, &args).await
                }
                (None, Some(feed)) => tailrace::tail::tail(&base, &feed).await,
                (None, None) => anyhow::bail!("name a feed, or a collection with --collection"),
            }
        }
        Command::Query {
            pipeline,
            collection,
            format,
            url,
        } => {
            let base = url.unwrap_or_else(|| format!("http://{}", config.http.listen));
            tailrace::query::query(&base, &collection, &pipeline, format).await
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A cause already in the message is not said again; one that is not, is.
    #[test]
    fn an_error_says_each_cause_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("store: {0}")]
        struct Wraps(#[source] std::io::Error);
        let locked = std::io::Error::other("data directory d is in use");
        let e = anyhow::Error::new(Wraps(locked));
        assert_eq!(one_line(&e), "store: data directory d is in use");
        let e = anyhow::Error::new(std::io::Error::other("disk full")).context("writing");
        assert_eq!(one_line(&e), "writing: disk full");
    }
}
