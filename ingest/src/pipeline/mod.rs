//! The pipeline, composed: [`Pipeline::build`] opens the store and its collections, builds
//! the configured sources (and the ones given), the ingester and the feeds;
//! [`Pipeline::start`] starts them; the [`Running`] handle's [`Running::stop`] stops them in
//! the one order that loses nothing acknowledged and says what was lost, if anything.
//!
//! ```no_run
//! # async fn demo(my_source: Box<dyn ingest::source::Source>) -> Result<(), ingest::pipeline::PipelineError> {
//! let config = ingest::config::Config::default();
//! let mut running = ingest::pipeline::Pipeline::build(config, vec![my_source]).await?.start().await?;
//! running.finished().await; // every source ended and the ingester wrote the last batch
//! let report = running.stop().await;
//! assert!(report.is_clean(), "{:?}", report.problems);
//! # Ok(()) }
//! ```
//!
//! What it is not: the HTTP server, the status line or signal handling; the `tailrace`
//! application adds those around a [`Running`] pipeline.
//!
//! Layout: this file builds (`open_feeds`: the one place feeds are opened), starts and stops;
//! [`parts`] reads what the pipeline is made of from the configuration (the engine, the
//! collections, the ingester's options); `hand_over` runs the hop from a source to the
//! ingester; [`stop`] holds the stop's steps and deadlines.

mod hand_over;
pub mod parts;
pub mod stop;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use feeds::{Feed, FeedHandle, FeedObserver, FeedSpec};
use store::{Durability, Store};
use tokio::sync::mpsc;
use tokio::task::{JoinError, JoinHandle};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::ingester::{self, Handed, IngestStats, Ingester, StoreHealth, WriteObserver};
use crate::live;
use crate::source::{self, Source};

pub use parts::{
    Collections, PipelineError, data_location, dead_letters_spec, events_spec, ingest_options,
    open_store,
};

/// A pipeline built from its configuration, ready to start.
pub struct Pipeline {
    config: Config,
    store: Arc<dyn Store>,
    /// Whether [`Running::stop`] closes the store (it does when the pipeline opened it).
    owns_store: bool,
    collections: Collections,
    sources: Vec<Box<dyn Source>>,
    feeds: Vec<Feed>,
    handles: Arc<Vec<FeedHandle>>,
    stats: Arc<IngestStats>,
    health: Arc<StoreHealth>,
    ready: Arc<AtomicBool>,
    observers: Vec<Arc<dyn WriteObserver>>,
}

impl Pipeline {
    /// Opens the configured store and builds the pipeline on it; `custom` sources run beside
    /// the configured ones.
    pub async fn build(
        config: Config,
        custom: Vec<Box<dyn Source>>,
    ) -> Result<Pipeline, PipelineError> {
        let store = open_store(&config).await?;
        // What the server lacks, once, before anything relies on it.
        crate::telemetry::StoreCapabilities {
            capabilities: &store.capabilities(),
            durability: config.store.durability,
        }
        .emit();
        let mut pipeline = Pipeline::build_on(store, config, custom).await?;
        pipeline.owns_store = true;
        Ok(pipeline)
    }

    /// Builds the pipeline on a store opened by the caller, who closes it after the stop
    /// (several pipelines can then run in turn on one store, as `tailrace bench` does).
    pub async fn build_on(
        store: Arc<dyn Store>,
        config: Config,
        custom: Vec<Box<dyn Source>>,
    ) -> Result<Pipeline, PipelineError> {
        let collections = Collections::open(store.as_ref(), &config).await?;
        let mut sources = source::build(&config.sources, config.ingest.max_event_bytes as usize)?;
        sources.extend(custom);
        let feeds = open_feeds(&store, &config, &collections).await?;
        let handles = Arc::new(feeds.iter().map(Feed::handle).collect());
        let stats = Arc::new(IngestStats {
            write_latency_us: std::sync::Mutex::new(
                hdrhistogram::Histogram::new_with_bounds(1, 60_000_000, 2).ok(),
            ),
            ..IngestStats::default()
        });
        Ok(Pipeline {
            config,
            store,
            owns_store: false,
            collections,
            sources,
            feeds,
            handles,
            stats,
            health: Arc::new(StoreHealth::new()),
            ready: Arc::new(AtomicBool::new(false)),
            observers: Vec::new(),
        })
    }

    /// Tells `observer` of every batch the ingester writes.
    pub fn observe_writes(&mut self, observer: Arc<dyn WriteObserver>) {
        self.observers.push(observer);
    }

    /// Tells `observer` of every entry the feed named `feed` takes; false when there is no
    /// such feed.
    pub fn observe_feed(&mut self, feed: &str, observer: Arc<dyn FeedObserver>) -> bool {
        match self.feeds.iter_mut().find(|f| f.handle().name == feed) {
            Some(f) => {
                f.observe(observer);
                true
            }
            None => false,
        }
    }

    /// The configuration it was built from.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The collections it writes and reads.
    pub fn collections(&self) -> &Collections {
        &self.collections
    }

    /// The sources, configured ones first.
    pub fn sources(&self) -> &[Box<dyn Source>] {
        &self.sources
    }

    /// The feeds' handles, in configuration order.
    pub fn feeds(&self) -> &Arc<Vec<FeedHandle>> {
        &self.handles
    }

    /// The ingester's counters.
    pub fn ingest_stats(&self) -> &Arc<IngestStats> {
        &self.stats
    }

    /// Whether the store takes writes.
    pub fn health(&self) -> &Arc<StoreHealth> {
        &self.health
    }

    /// True from the moment every part has started until the stop begins (`/readyz`).
    pub fn ready(&self) -> &Arc<AtomicBool> {
        &self.ready
    }

    /// Starts it: the feeds first (so they see every write), the `ingest` statistics
    /// document and the rollup retention, the ingester, and the sources, each resuming right
    /// after its newest stored record.
    pub async fn start(self) -> Result<Running, PipelineError> {
        let Pipeline {
            config: c,
            store,
            owns_store,
            collections,
            mut sources,
            feeds,
            handles,
            stats,
            health,
            ready,
            mut observers,
        } = self;
        let feed_stop = CancellationToken::new();
        let feed_tasks = feeds
            .into_iter()
            .map(|f| (f.handle().name, tokio::spawn(f.run(feed_stop.clone()))))
            .collect();
        let background = background(&c, &collections, &stats, &mut observers, &feed_stop);
        let mut options = ingest_options(&c);
        for s in &sources {
            if !options.geo.contains_key(s.name())
                && let Some(geo) = s.geo()
            {
                options.geo.insert(s.name().to_owned(), geo);
            }
        }
        let ingester = Ingester {
            events: collections.events.clone(),
            dead_letters: collections.dead_letters.clone(),
            rollups: collections.rollups.clone(),
            options,
            engine: store.engine(),
            stats: stats.clone(),
            health: health.clone(),
            observer: Some(Arc::new(Observers(observers))),
        };
        resume(&ingester, &mut sources).await?;
        let (tx, rx) = mpsc::channel::<Handed>(c.ingest.queue_capacity);
        let ingest_task = tokio::spawn(ingester.run(rx));
        let source_stop = CancellationToken::new();
        let source_tasks = sources
            .into_iter()
            .map(|s| {
                let name = s.name().to_owned();
                let task = hand_over::spawn(s, tx.clone(), stats.clone(), source_stop.clone());
                (name, task)
            })
            .collect();
        drop(tx);
        ready.store(true, Ordering::Release);
        Ok(Running {
            store,
            owns_store,
            collections,
            handles,
            stats,
            health,
            ready,
            source_stop,
            source_tasks,
            ingest_task: Some(ingest_task),
            ingest_done: None,
            feed_stop,
            feed_tasks,
            flush_within: Duration::from_secs(c.ingest.stop_flush_timeout_secs),
            checkpoint_within: Duration::from_secs(c.ingest.stop_checkpoint_timeout_secs),
            background,
        })
    }
}

/// The tasks that run beside the feeds and stop with them: the `ingest` statistics document
/// (fed by a write observer added to `observers`) and the rollup retention.
fn background(
    c: &Config,
    collections: &Collections,
    stats: &Arc<IngestStats>,
    observers: &mut Vec<Arc<dyn WriteObserver>>,
    stop: &CancellationToken,
) -> Vec<(&'static str, JoinHandle<()>)> {
    let write_times = Arc::new(live::WriteTimes::default());
    observers.push(write_times.clone());
    let live = tokio::spawn(live::publish(
        collections.stats.clone(),
        stats.clone(),
        write_times,
        c.store.durability,
        stop.clone(),
    ));
    let retention = tokio::spawn(ingester::retention::sweep_rollups(
        collections.rollups.clone(),
        c.ingest.rollup_fields.clone(),
        Duration::from_secs(c.ingest.rollup_idle_ttl_secs),
        c.store.durability,
        stop.clone(),
    ));
    vec![
        ("rollup retention", retention),
        ("the ingest statistics writer", live),
    ]
}

/// Each resumable source continues right after its newest stored record; each source's
/// rollup summary is brought up to its events now, whether or not it hands over anything more.
async fn resume(ingester: &Ingester, sources: &mut [Box<dyn Source>]) -> Result<(), PipelineError> {
    for s in sources {
        if let Some(position) = ingester.stored_position(s.name()).await? {
            tracing::info!(source = %s.name(), position = %position, "source resumes after its stored position");
            s.resume(&position);
        }
        ingester.catch_up_rollups(s.name()).await?;
    }
    Ok(())
}

/// The configured feeds, each over what its kind reads, its checkpoint loaded: the one place
/// feeds are opened.
async fn open_feeds(
    store: &Arc<dyn Store>,
    config: &Config,
    collections: &Collections,
) -> Result<Vec<Feed>, PipelineError> {
    let mut feeds = Vec::with_capacity(config.feeds.len());
    for f in &config.feeds {
        let reader = f
            .kind
            .settings()
            .reader(&|name| collections.capped(name))
            .map_err(|message| PipelineError::FeedKind {
                feed: f.name.clone(),
                message,
            })?;
        let spec = FeedSpec {
            name: f.name.clone(),
            reader,
            stats: config.stats.clone(),
        };
        let mut feed = Feed::new(spec, store.clone()).await?;
        // An event the store refused is a dead letter with its sequence number: a gap of
        // those is not a loss.
        feed.refusals_from(collections.dead_letters.clone());
        feeds.push(feed);
    }
    Ok(feeds)
}

/// Several write observers as one.
struct Observers(Vec<Arc<dyn WriteObserver>>);

impl WriteObserver for Observers {
    fn events_written(&self, events: usize, durability: Durability, latency: Duration) {
        for o in &self.0 {
            o.events_written(events, durability, latency);
        }
    }
}

/// A running pipeline. Dropping it without [`Running::stop`] leaves its tasks running.
pub struct Running {
    store: Arc<dyn Store>,
    owns_store: bool,
    collections: Collections,
    handles: Arc<Vec<FeedHandle>>,
    stats: Arc<IngestStats>,
    health: Arc<StoreHealth>,
    ready: Arc<AtomicBool>,
    source_stop: CancellationToken,
    source_tasks: Vec<(String, JoinHandle<()>)>,
    /// The ingester, until [`Running::finished`] saw it end.
    ingest_task: Option<JoinHandle<()>>,
    /// How the ingester ended, once it has.
    ingest_done: Option<Result<(), JoinError>>,
    feed_stop: CancellationToken,
    feed_tasks: Vec<(String, JoinHandle<()>)>,
    /// How long the stop lets the ingester flush, and the feeds checkpoint.
    flush_within: Duration,
    checkpoint_within: Duration,
    /// Tasks that run until the feeds stop (the `ingest` document, rollup retention).
    background: Vec<(&'static str, JoinHandle<()>)>,
}

/// What a stop could not do, each saying what it cost.
#[derive(Debug, Default)]
pub struct StopReport {
    /// One sentence per problem: what went wrong and what was lost; empty for a clean stop.
    pub problems: Vec<String>,
}

impl StopReport {
    /// Nothing went wrong: everything acknowledged is stored and every feed checkpointed.
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

impl Running {
    /// Resolves once every source has ended and the ingester has written the last batch (a
    /// pipeline of endless sources never does). Cancel-safe: use it in a `select!` beside a
    /// shutdown signal, then call [`Running::stop`].
    pub async fn finished(&mut self) {
        if let Some(task) = &mut self.ingest_task {
            let done = task.await;
            self.ingest_task = None;
            self.ingest_done = Some(done);
        }
    }

    /// Stops, in order: the sources stop; the ingester writes what is queued (at most
    /// `ingest.stop_flush_timeout_secs`); every feed drains and checkpoints, all at once (at
    /// most `ingest.stop_checkpoint_timeout_secs`); the background writers end; the store
    /// closes (when the
    /// pipeline opened it). Logs and returns what could not be done.
    pub async fn stop(mut self) -> StopReport {
        let mut problems = Vec::new();
        match &self.ingest_done {
            Some(Ok(())) => tracing::info!("every source ended; stopping"),
            Some(Err(e)) => problems.push(stop::task_failed("the ingester", e)),
            None => tracing::info!(
                "stopping: sources first, then the writer flushes, then feeds checkpoint"
            ),
        }
        self.ready.store(false, Ordering::Release);
        self.source_stop.cancel();
        stop::sources(self.source_tasks, &mut problems).await;
        if let Some(task) = self.ingest_task.take() {
            stop::flush(task, self.flush_within, &self.stats, &mut problems).await;
        }
        self.feed_stop.cancel();
        problems.extend(stop::feeds(self.feed_tasks, self.checkpoint_within).await);
        for (what, task) in self.background {
            if let Err(e) = task.await {
                problems.push(stop::task_failed(what, &e));
            }
        }
        if self.owns_store
            && let Err(e) = self.store.close().await
        {
            problems.push(format!(
                "closing the store failed ({e}): writes queued after the flush may be lost"
            ));
        }
        if problems.is_empty() {
            tracing::info!("stopped cleanly");
        } else {
            // Logged, not counted: the stop is the pipeline's last act (a process exits right
            // after, before any scrape), and the StopReport carries each problem to the caller.
            for p in &problems {
                tracing::error!("{p}");
            }
        }
        StopReport { problems }
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The collections it writes and reads.
    pub fn collections(&self) -> &Collections {
        &self.collections
    }

    /// The feeds' handles, in configuration order.
    pub fn feeds(&self) -> &Arc<Vec<FeedHandle>> {
        &self.handles
    }

    /// The ingester's counters.
    pub fn ingest_stats(&self) -> &Arc<IngestStats> {
        &self.stats
    }

    /// Whether the store takes writes.
    pub fn health(&self) -> &Arc<StoreHealth> {
        &self.health
    }
}
