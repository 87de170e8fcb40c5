//! The whole pipeline in one process: store → sources → ingester → feeds, plus the HTTP
//! server and the status line; and the shutdown order that loses nothing:
//! sources stop → the ingester flushes → feeds drain and checkpoint (all at once, under one
//! deadline) → the store closes. A stop that could not flush, a feed that could not
//! checkpoint in time, or a task that panicked is reported as [`RunError::Unclean`], naming
//! what was lost; "stopped cleanly" is printed only when none of that happened.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use feeds::{Feed, FeedHandle, FeedSpec};
use futures::StreamExt;
use ingest::config::Config;
use ingest::ingester::{Handed, IngestStats, Ingester, StoreHealth};
use ingest::live;
use ingest::pipeline::{
    RunError, data_location, dead_letters_spec, events_spec, feed_source, ingest_options,
    open_store,
};
use ingest::source::{self, Source};
use ingest::telemetry as t;
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::json;
use server::{AppState, StreamLimits};
use tokio::sync::mpsc;
use tokio::task::{JoinError, JoinHandle};
use tokio_util::sync::CancellationToken;

use crate::status;

/// How long the ingester may take to write what is queued when the pipeline stops.
const FLUSH_DEADLINE: Duration = Duration::from_secs(10);
/// How long the feeds together may take to drain and checkpoint when the pipeline stops.
const FEEDS_DEADLINE: Duration = Duration::from_secs(5);

/// Runs the pipeline until `shutdown` is cancelled (or every source has ended), then stops it
/// in order. `custom` sources run beside the configured ones.
pub async fn run(
    c: Config,
    metrics: PrometheusHandle,
    custom: Vec<Box<dyn Source>>,
    shutdown: CancellationToken,
) -> Result<(), RunError> {
    let store = open_store(&c).await?;
    let d = c.store.durability;
    let events = store.capped("events", &events_spec(&c)).await?;
    let dead_spec = dead_letters_spec(&c);
    let dead_letters = store.capped("dead_letters", &dead_spec).await?;
    let rollups = store.keyed("rollups").await?;
    let stats_docs = store.keyed("stats").await?;

    let listener = tokio::net::TcpListener::bind(c.http.listen)
        .await
        .map_err(|source| RunError::Bind {
            addr: c.http.listen,
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| RunError::Bind {
        addr: c.http.listen,
        source,
    })?;

    let mut sources = source::build(&c.sources, c.ingest.max_event_bytes as usize)?;
    sources.extend(custom);

    let mut feeds = Vec::new();
    let mut handles: Vec<FeedHandle> = Vec::new();
    for f in &c.feeds {
        let spec = FeedSpec {
            name: f.name.clone(),
            source: feed_source(f, &events, &dead_letters),
            stats: c.stats.clone(),
        };
        let feed = Feed::new(spec, store.clone()).await?;
        handles.push(feed.handle());
        feeds.push(feed);
    }
    let handles = Arc::new(handles);

    let ingest_stats = Arc::new(IngestStats {
        write_latency_us: std::sync::Mutex::new(
            hdrhistogram::Histogram::new_with_bounds(1, 60_000_000, 2).ok(),
        ),
        ..IngestStats::default()
    });
    let ready = Arc::new(AtomicBool::new(false));
    let health = Arc::new(StoreHealth::new());
    let info = json!({
        "version": env!("CARGO_PKG_VERSION"),
        "engine": store.engine(),
        "durability": d.as_str(),
        "data": data_location(&c),
        "sources": sources.iter().map(|s| json!({"name": s.name(), "kind": s.kind()})).collect::<Vec<_>>(),
        "feeds": handles.iter().map(|f| json!({"name": f.name, "kind": f.kind.as_str()})).collect::<Vec<_>>(),
        "listen": addr.to_string(),
    });
    status::banner(&c, &info, addr, &sources, &handles);

    // HTTP first, so /healthz answers while the rest starts.
    let http_stop = CancellationToken::new();
    let app = server::router(AppState {
        metrics: metrics.clone(),
        feeds: handles.clone(),
        store: store.clone(),
        events: events.clone(),
        dead_letters: dead_letters.clone(),
        rollups: rollups.clone(),
        stats: stats_docs.clone(),
        ingest: ingest_stats.clone(),
        ready: ready.clone(),
        health: health.clone(),
        info: Arc::new(info),
        streams: StreamLimits::new(
            c.http.max_streams,
            Duration::from_millis(c.http.stream_stall_timeout_ms),
        ),
    });
    let http_task = {
        let stop = http_stop.clone();
        // Nagle off: a change stream writes one small event at a time, and each must leave
        // at once rather than wait for the previous one's (delayed) acknowledgment.
        let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
            let _ = tcp.set_nodelay(true);
        });
        tokio::spawn(async move {
            let serve = axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned());
            if let Err(e) = serve.await {
                tracing::error!(error = %e, "http server failed");
            }
        })
    };
    let upkeep = {
        let (m, stop) = (metrics.clone(), http_stop.clone());
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_secs(5));
            let mut process = crate::exporter::Process::new();
            loop {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = every.tick() => {
                        m.run_upkeep();
                        process.collect();
                    }
                }
            }
        })
    };

    let feed_stop = CancellationToken::new();
    let feed_tasks: Vec<(String, JoinHandle<()>)> = feeds
        .into_iter()
        .map(|f| {
            let name = f.handle().name;
            (name, tokio::spawn(f.run(feed_stop.clone())))
        })
        .collect();

    // The `ingest` statistics document (the live page's write latency and counters), written
    // until the feeds stop: before the store closes.
    let write_times = Arc::new(live::WriteTimes::default());
    let live_task = tokio::spawn(live::publish(
        stats_docs,
        ingest_stats.clone(),
        write_times.clone(),
        d,
        feed_stop.clone(),
    ));

    let (tx, rx) = mpsc::channel::<Handed>(c.ingest.queue_capacity);
    let rollups_for_retention = rollups.clone();
    let ingester = Ingester {
        events: Arc::new(live::TimedEvents::new(events.clone(), write_times)),
        dead_letters,
        rollups,
        options: ingest_options(&c),
        engine: store.engine(),
        stats: ingest_stats.clone(),
        health: health.clone(),
    };
    // Each resumable source continues right after its newest stored record; its rollup
    // summary is brought up to its events now, whether or not it hands over anything more.
    for s in &mut sources {
        if let Some(position) = ingester.stored_position(s.name()).await? {
            tracing::info!(source = %s.name(), position = %position, "source resumes after its stored position");
            s.resume(&position);
        }
        ingester.catch_up_rollups(s.name()).await?;
    }
    let ingest_task = tokio::spawn(ingester.run(rx));
    let retention_task = tokio::spawn(ingest::ingester::retention::sweep_rollups(
        rollups_for_retention,
        c.ingest.rollup_fields.clone(),
        Duration::from_secs(c.ingest.rollup_idle_ttl_secs),
        d,
        feed_stop.clone(),
    ));

    let source_stop = CancellationToken::new();
    let source_tasks: Vec<(String, JoinHandle<()>)> = sources
        .into_iter()
        .map(|s| {
            let name = s.name().to_owned();
            let task = spawn_source(s, tx.clone(), ingest_stats.clone(), source_stop.clone());
            (name, task)
        })
        .collect();
    drop(tx);
    ready.store(true, Ordering::Release);

    let status_task = tokio::spawn(status::every(
        Duration::from_secs(c.log.status_interval_secs),
        handles.clone(),
        ingest_stats.clone(),
        http_stop.clone(),
    ));

    // Run until asked to stop, or until every source ended (the ingester then finishes).
    let mut ingest_task = ingest_task;
    let ingest_done = tokio::select! {
        _ = shutdown.cancelled() => None,
        done = &mut ingest_task => Some(done),
    };
    let mut problems: Vec<String> = Vec::new();
    match &ingest_done {
        Some(Ok(())) => tracing::info!("every source ended; stopping"),
        Some(Err(e)) => problems.push(task_failed("the ingester", e)),
        None => tracing::info!(
            "stopping: sources first, then the writer flushes, then feeds checkpoint"
        ),
    }
    ready.store(false, Ordering::Release);
    source_stop.cancel();
    for (name, task) in source_tasks {
        if let Err(e) = task.await {
            problems.push(task_failed(&format!("source {name}"), &e));
        }
    }
    if ingest_done.is_none() {
        match tokio::time::timeout(FLUSH_DEADLINE, &mut ingest_task).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => problems.push(task_failed("the ingester", &e)),
            Err(_) => {
                ingest_task.abort();
                let queued = ingest_stats.queue_depth.load(Ordering::Relaxed).max(0);
                problems.push(format!(
                    "the ingester did not flush within {} s: the batch being written and {queued} queued records are lost (not acknowledged to any source)",
                    FLUSH_DEADLINE.as_secs()
                ));
            }
        }
    }
    feed_stop.cancel();
    problems.extend(stop_feeds(feed_tasks).await);
    if let Err(e) = retention_task.await {
        problems.push(task_failed("rollup retention", &e));
    }
    if let Err(e) = live_task.await {
        problems.push(task_failed("the ingest statistics writer", &e));
    }
    if let Err(e) = store.close().await {
        problems.push(format!(
            "closing the store failed ({e}): writes queued after the flush may be lost"
        ));
    }
    http_stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(2), http_task).await;
    let _ = upkeep.await;
    let _ = status_task.await;
    if problems.is_empty() {
        tracing::info!("stopped cleanly");
        Ok(())
    } else {
        for p in &problems {
            tracing::error!("{p}");
        }
        Err(RunError::Unclean { problems })
    }
}

/// Waits for every feed to drain and checkpoint, all at once, under one deadline; aborts the
/// ones still running at the deadline. Returns what went wrong.
async fn stop_feeds(tasks: Vec<(String, JoinHandle<()>)>) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + FEEDS_DEADLINE;
    let waits = tasks.into_iter().map(|(name, mut task)| async move {
        match tokio::time::timeout_at(deadline, &mut task).await {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(task_failed(&format!("feed {name}"), &e)),
            Err(_) => {
                task.abort();
                Some(format!(
                    "feed {name} did not checkpoint within {} s and was stopped: it resumes from its previous checkpoint (events since are processed again, not lost)",
                    FEEDS_DEADLINE.as_secs()
                ))
            }
        }
    });
    futures::future::join_all(waits)
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// A task that ended by panicking (or was cancelled), in words.
fn task_failed(what: &str, e: &JoinError) -> String {
    if e.is_panic() {
        format!("{what} panicked (see the panic message above)")
    } else {
        format!("{what} was cancelled")
    }
}

/// What `tailrace run` does, for a program of your own: installs the metrics recorder (once per
/// process), runs the pipeline with `custom` sources beside the configured ones, and stops it
/// in order on Ctrl-C / SIGTERM, or when every source has ended.
///
/// ```no_run
/// # async fn demo(my_source: Box<dyn ingest::source::Source>) -> Result<(), ingest::pipeline::RunError> {
/// let config = ingest::config::Config::load(None).map_err(|e| ingest::pipeline::RunError::Telemetry(e.to_string()))?;
/// tailrace::run::run_with_sources(config, vec![my_source]).await
/// # }
/// ```
pub async fn run_with_sources(c: Config, custom: Vec<Box<dyn Source>>) -> Result<(), RunError> {
    let metrics = crate::exporter::install(c.store.engine.as_str()).map_err(RunError::Telemetry)?;
    let shutdown = CancellationToken::new();
    tokio::spawn(cancel_on_signal(shutdown.clone()));
    run(c, metrics, custom, shutdown).await
}

/// Cancels `token` on SIGINT or SIGTERM (Ctrl-C elsewhere).
pub async fn cancel_on_signal(token: CancellationToken) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            tracing::error!("cannot install signal handlers");
            return;
        };
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = int.recv() => tracing::info!("SIGINT received"),
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
    token.cancel();
}

fn spawn_source(
    source: Box<dyn Source>,
    tx: mpsc::Sender<Handed>,
    stats: Arc<IngestStats>,
    stop: CancellationToken,
) -> JoinHandle<()> {
    let name: Arc<str> = Arc::from(source.name());
    let read = t::register_source(&name);
    tokio::spawn(async move {
        let mut records = source.positioned();
        let mut last_us = 0i64;
        loop {
            let record = tokio::select! {
                _ = stop.cancelled() => break,
                r = records.next() => match r {
                    Some(record) => record,
                    None => {
                        tracing::info!(source = %name, "source ended");
                        break;
                    }
                },
            };
            read.increment(1);
            // Strictly increasing per source, so "the later of two records" is well defined
            // (recovery compares an event's and a dead letter's hand-over times).
            last_us = store::clock::now_us().max(last_us + 1);
            let handed = Handed {
                source: name.clone(),
                raw: record.raw,
                received_us: last_us,
                position: record.position,
            };
            stats.queue_depth.fetch_add(1, Ordering::Relaxed);
            tokio::select! {
                _ = stop.cancelled() => break,
                sent = tx.send(handed) => if sent.is_err() { break },
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds stop together under one deadline: a panicked feed and one that never stops are
    /// both reported, the stuck one is aborted, and the whole wait takes one deadline, not one
    /// per feed.
    #[tokio::test(start_paused = true)]
    async fn feeds_stop_together_and_failures_are_named() {
        let quick = tokio::spawn(async {});
        let panics = tokio::spawn(async { panic!("boom") });
        let stuck = tokio::spawn(std::future::pending::<()>());
        let stuck2 = tokio::spawn(std::future::pending::<()>());
        let started = tokio::time::Instant::now();
        let problems = stop_feeds(vec![
            ("quick".into(), quick),
            ("panics".into(), panics),
            ("stuck".into(), stuck),
            ("stuck2".into(), stuck2),
        ])
        .await;
        assert_eq!(
            started.elapsed(),
            FEEDS_DEADLINE,
            "two stuck feeds cost one deadline, not two"
        );
        assert_eq!(problems.len(), 3, "{problems:#?}");
        assert!(
            problems[0].starts_with("feed panics panicked"),
            "{problems:#?}"
        );
        assert!(
            problems[1].starts_with("feed stuck did not checkpoint within 5 s"),
            "{problems:#?}"
        );
        assert!(
            problems[2].starts_with("feed stuck2 did not checkpoint"),
            "{problems:#?}"
        );
    }
}
