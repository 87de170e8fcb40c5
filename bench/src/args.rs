//! The `tailrace bench` command line. Defined here, not in `main.rs`, so the binary stays a
//! parser that calls [`super::run`], and tests can build the same arguments.

use std::path::PathBuf;
use std::time::Duration;

pub use super::dataset::Dataset;

/// Arguments of `tailrace bench`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// What to measure: writes, reads, notify, insert, update, outbox, catchup, replay, query,
    /// or all of them.
    #[arg(value_enum)]
    pub scenario: Scenario,
    /// Directory for the JSON results and SVG plots (created if missing).
    #[arg(long, default_value = "bench-results")]
    pub out: PathBuf,
    /// Storage engine, one of the store's registered engines (default: store.engine of the
    /// config, i.e. embedded).
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(store::Engine::NAMES))]
    pub engine: Option<String>,
    /// Connection string of an engine that has one (`uri`: mongodb); default: the config's.
    #[arg(long)]
    pub uri: Option<String>,
    /// Embedded engine: put the data (and the fdatasync probe) on the disk of this directory;
    /// default: a temporary directory. A fresh subdirectory is used and removed afterwards.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Documents loaded or inserted (reads, insert, update, outbox; catchup: events behind;
    /// replay: events per file).
    #[arg(long)]
    pub docs: Option<u64>,
    /// Timed operations per series (writes, reads, floors).
    #[arg(long)]
    pub iterations: Option<usize>,
    /// Concurrent clients, comma-separated levels (update: 1,2,4,8,16,32; outbox:
    /// 1,10,50,100,300; notify: writers at the highest rate).
    #[arg(long, value_delimiter = ',')]
    pub concurrency: Option<Vec<usize>>,
    /// Time per measured run (notify per rate, update and outbox per level), e.g. 5s, 500ms.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub duration: Option<Duration>,
    /// Outbox: each simulated user waits about this long between requests (0.5-1.5×, random),
    /// as the original's 300 users did (250 req/s at 0.26 s mean response means ~1 s of think
    /// time). A closed-loop run with no think time follows in any case.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub think: Option<Duration>,
    /// What insert, catchup and notify's flat-out runs write: realistic (long-tail hashtags
    /// over 2,000,000 values and users over 5,000,000, every script and emoji) or small (the
    /// original synthetic tweets: 24 hashtags, 5,000 users).
    #[arg(long, value_enum, default_value_t = Dataset::Realistic)]
    pub dataset: Dataset,
    /// Replay: the tailrace binary to run (default: this one).
    #[arg(long)]
    pub binary: Option<PathBuf>,
    /// Every size tiny, then check that the JSON and plots written are well-formed (for CI;
    /// the numbers mean nothing).
    #[arg(long)]
    pub quick: bool,
    /// insert: hand the events over without place rules. By default they are placed as the
    /// synthetic stream's are (its GeoJSON point, else its language), as `tailrace run`
    /// places the realistic stream; a run with and one without, in one sitting, say what
    /// placing costs.
    #[arg(long)]
    pub unplaced: bool,
}

impl BenchArgs {
    /// Arguments for `scenario` with every size at its default.
    pub fn new(scenario: Scenario, out: impl Into<PathBuf>) -> BenchArgs {
        BenchArgs {
            scenario,
            out: out.into(),
            engine: None,
            uri: None,
            data: None,
            docs: None,
            iterations: None,
            concurrency: None,
            duration: None,
            think: None,
            dataset: Dataset::Realistic,
            binary: None,
            quick: false,
            unplaced: false,
        }
    }
}

/// A benchmark scenario.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// Single-document writes per durability level (MongoDB 2.6 / RethinkDB 2.0).
    Writes,
    /// Reads by position, warm and cold.
    Reads,
    /// Notification latency per feed kind at 70 events/s and at the highest rate.
    Notify,
    /// 100,000 events through the real ingester: random/static content, single/batched.
    Insert,
    /// `$inc` of a random document among many, 1..32 clients.
    Update,
    /// "The 20 newest messages of a sender" through the HTTP API, 1..300 clients.
    Outbox,
    /// Each feed kind resuming 1,000,000 events behind its checkpoint: its catch-up rate.
    Catchup,
    /// 60,000 tweets replayed from a file through the real binary, hashtags of growing
    /// cardinality (issue 10's table).
    Replay,
    /// Aggregation pipelines over 1,000,000 stored events: counts by language over a time
    /// range, events per minute, top hashtags, distinct values.
    Query,
    /// Every scenario, one after the other.
    All,
}

impl Scenario {
    /// Every runnable scenario, in the order `all` runs them.
    pub const EACH: [Scenario; 9] = [
        Scenario::Writes,
        Scenario::Reads,
        Scenario::Notify,
        Scenario::Insert,
        Scenario::Update,
        Scenario::Outbox,
        Scenario::Catchup,
        Scenario::Replay,
        Scenario::Query,
    ];

    /// The lowercase name (file names, JSON).
    pub fn as_str(self) -> &'static str {
        match self {
            Scenario::Writes => "writes",
            Scenario::Reads => "reads",
            Scenario::Notify => "notify",
            Scenario::Insert => "insert",
            Scenario::Update => "update",
            Scenario::Outbox => "outbox",
            Scenario::Catchup => "catchup",
            Scenario::Replay => "replay",
            Scenario::Query => "query",
            Scenario::All => "all",
        }
    }

    /// The scenarios this one stands for (`all` → each).
    pub fn expand(self) -> Vec<Scenario> {
        match self {
            Scenario::All => Scenario::EACH.to_vec(),
            s => vec![s],
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use ingest::config::{Config, Engine};
    use store::mongo::MongoSettings;

    use super::BenchArgs;
    use crate::Bench;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn bench(args: &[&str]) -> crate::Result<Bench> {
        let out = tempfile::tempdir().map_err(crate::io_err("a temporary directory"))?;
        let out = out.path().join("out");
        let mut argv = vec!["bench", "writes", "--out", out.to_str().unwrap_or_default()];
        argv.extend(args);
        let cli =
            Cli::try_parse_from(argv).map_err(|e| crate::BenchError::Scenario(e.to_string()))?;
        Bench::new(Config::default(), cli.bench)
    }

    /// `--engine` takes the names the store registers, and `--uri` is a key of an engine's
    /// own settings: set where the engine has it, refused where it does not.
    #[test]
    fn engine_and_uri_go_through_the_engines_settings() {
        let b = bench(&["--engine", "mongodb", "--uri", "mongodb://h:1/"])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            b.config.store.engine,
            Engine::Mongodb(MongoSettings::at("mongodb://h:1/"))
        );
        assert!(!b.local_disk());
        let b = bench(&[]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(b.engine_name(), "embedded");
        assert!(b.local_disk());
        let e = bench(&["--uri", "mongodb://h:1/"])
            .err()
            .map(|e| e.to_string());
        assert!(
            e.as_deref()
                .is_some_and(|e| e.contains("--uri: engine embedded has no key uri")),
            "{e:?}"
        );
        let e = bench(&["--engine", "postgres"])
            .err()
            .map(|e| e.to_string());
        assert!(
            e.as_deref()
                .is_some_and(|e| e.contains("embedded") && e.contains("mongodb")),
            "the engines are listed: {e:?}"
        );
    }
}
