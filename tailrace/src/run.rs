//! `tailrace run`: the library's pipeline ([`ingest::pipeline`]) with what the application
//! adds around it — the HTTP server (first, so `/healthz` answers while the rest starts),
//! the startup block and the status line, the metrics upkeep, and signals. The pipeline's
//! own stop decides what was lost; this adds nothing to lose.

use std::net::SocketAddr;
use std::time::Duration;

use ingest::config::Config;
use ingest::pipeline::{Pipeline, PipelineError, data_location};
use ingest::source::Source;
use ingest::telemetry as t;
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::{Value, json};
use server::{AppState, StreamLimits};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::status;

/// What can stop `tailrace run`.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The pipeline could not be built or started.
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    /// The HTTP port could not be bound.
    #[error(
        "http.listen = {addr}: cannot listen ({source}); is another tailrace running? choose another port with TAILRACE_HTTP__LISTEN"
    )]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The metrics recorder could not be installed (one per process).
    #[error("metrics: {0}")]
    Telemetry(String),
    /// The pipeline ran, but did not stop cleanly: each problem says what was lost.
    #[error("stopped uncleanly: {}", .problems.join("; "))]
    Unclean {
        /// What went wrong during the stop, and what it cost.
        problems: Vec<String>,
    },
}

/// Runs the pipeline with the HTTP server and the status line until `shutdown` is cancelled
/// or every source has ended, then stops it in order. `custom` sources run beside the
/// configured ones.
pub async fn run(
    c: Config,
    metrics: PrometheusHandle,
    custom: Vec<Box<dyn Source>>,
    shutdown: CancellationToken,
) -> Result<(), RunError> {
    let pipeline = Pipeline::build(c.clone(), custom).await?;
    let bind_error = |source| RunError::Bind {
        addr: c.http.listen,
        source,
    };
    let listener = TcpListener::bind(c.http.listen).await.map_err(bind_error)?;
    let addr = listener.local_addr().map_err(bind_error)?;
    let info = info(&c, &pipeline, addr);
    status::banner(&c, &info, addr, pipeline.sources(), pipeline.feeds());
    let http_stop = CancellationToken::new();
    let limits = StreamLimits::new(
        c.http.max_streams,
        Duration::from_millis(c.http.stream_stall_timeout_ms),
    );
    let state = AppState::for_pipeline(&pipeline, metrics.clone(), info, limits);
    let http = serve(listener, state, http_stop.clone());
    let upkeep = tokio::spawn(upkeep(metrics, http_stop.clone()));
    let status = tokio::spawn(status::every(
        Duration::from_secs(c.log.status_interval_secs),
        pipeline.feeds().clone(),
        pipeline.ingest_stats().clone(),
        http_stop.clone(),
    ));

    let mut running = pipeline.start().await?;
    tokio::select! {
        _ = shutdown.cancelled() => {}
        _ = running.finished() => {}
    }
    let report = running.stop().await;
    http_stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(2), http).await;
    let _ = upkeep.await;
    let _ = status.await;
    if report.is_clean() {
        Ok(())
    } else {
        Err(RunError::Unclean {
            problems: report.problems,
        })
    }
}

/// What `/api/status` says about this process.
fn info(c: &Config, p: &Pipeline, addr: SocketAddr) -> Value {
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "engine": p.store().engine(),
        "capabilities": p.store().capabilities(),
        "durability": c.store.durability.as_str(),
        "data": data_location(c),
        "sources": p.sources().iter().map(|s| json!({"name": s.name(), "kind": s.kind()})).collect::<Vec<_>>(),
        "feeds": p.feeds().iter().map(|f| json!({"name": f.name, "kind": f.kind})).collect::<Vec<_>>(),
        "listen": addr.to_string(),
    })
}

/// Serves the HTTP API until `stop`.
fn serve(listener: TcpListener, state: AppState, stop: CancellationToken) -> JoinHandle<()> {
    // Nagle off: a change stream writes one small event at a time, and each must leave at
    // once rather than wait for the previous one's (delayed) acknowledgment.
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let app = server::router(state);
    tokio::spawn(async move {
        let serve = axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned());
        if let Err(e) = serve.await {
            t::Problem {
                component: "http",
                error_type: "serve",
                detail: &format!("the HTTP server failed: {e}"),
            }
            .error();
        }
    })
}

/// The exporter's upkeep and the process metrics, every 5 s until `stop`.
async fn upkeep(metrics: PrometheusHandle, stop: CancellationToken) {
    let mut every = tokio::time::interval(Duration::from_secs(5));
    let mut process = crate::exporter::Process::new();
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = every.tick() => {
                metrics.run_upkeep();
                process.collect();
            }
        }
    }
}

/// What `tailrace run` does, for a program of your own that wants the HTTP server and the
/// status line too: installs the metrics recorder (once per process), runs the pipeline with
/// `custom` sources beside the configured ones, and stops it in order on Ctrl-C / SIGTERM,
/// or when every source has ended. (The library alone: [`ingest::pipeline::Pipeline`].)
pub async fn run_with_sources(c: Config, custom: Vec<Box<dyn Source>>) -> Result<(), RunError> {
    let metrics = crate::exporter::install(c.store.engine.name()).map_err(RunError::Telemetry)?;
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
            t::Problem {
                component: "signals",
                error_type: "setup",
                detail: "cannot install signal handlers: Ctrl-C and SIGTERM will not stop the pipeline in order",
            }
            .error();
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
