//! What a user sees: one short block at startup, then one status line every few seconds.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use feeds::FeedHandle;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use ingest::config::Config;
use ingest::ingester::IngestStats;
use ingest::source::Source;

/// Whether the startup block is one structured log line instead of text for people (set once
/// by the binary for `--log-format json`, like the log subscriber itself: process-wide).
static BANNER_AS_LOG: AtomicBool = AtomicBool::new(false);

/// Makes [`banner`] log one structured line (for log shippers) instead of printing a block.
pub fn banner_as_log() {
    BANNER_AS_LOG.store(true, Ordering::Relaxed);
}

/// Prints the startup block to stderr (logs go there too; stdout stays for data), or logs it
/// as one line after [`banner_as_log`].
pub fn banner(
    c: &Config,
    info: &Value,
    addr: SocketAddr,
    sources: &[Box<dyn Source>],
    feeds: &[FeedHandle],
) {
    let sources: Vec<String> = sources
        .iter()
        .map(|s| {
            let detail = c
                .sources
                .iter()
                .find(|sc| sc.name == s.name())
                .map(|sc| sc.settings().describe())
                .filter(|d| !d.is_empty())
                .map(|d| format!(", {d}"))
                .unwrap_or_default();
            format!("{} ({}{detail})", s.name(), s.kind())
        })
        .collect();
    let feeds_txt: Vec<String> = feeds
        .iter()
        .map(|f| format!("{} ({})", f.name, f.kind))
        .collect();
    let first_feed = feeds.first().map(|f| f.name.as_str()).unwrap_or("tail");
    // What the server lacks, by name (the reasons are in /api/status and the log).
    let lacks: Vec<&str> = info["capabilities"]
        .as_object()
        .map(|caps| {
            caps.iter()
                .filter(|(_, v)| v["supported"] == Value::Bool(false))
                .map(|(k, _)| k.as_str())
                .collect()
        })
        .unwrap_or_default();
    if BANNER_AS_LOG.load(Ordering::Relaxed) {
        tracing::info!(
            version = env!("CARGO_PKG_VERSION"),
            engine = info["engine"].as_str().unwrap_or("?"),
            data = info["data"].as_str().unwrap_or("?"),
            durability = %c.store.durability,
            sources = %sources.join(", "),
            feeds = %feeds_txt.join(", "),
            listen = %addr,
            lacks = %lacks.join(", "),
            "tailrace started"
        );
        return;
    }
    let lacks = if lacks.is_empty() {
        String::new()
    } else {
        format!(
            "  server      lacks {} (why: /api/status)\n",
            lacks.join(", ").replace('_', " ")
        )
    };
    eprintln!(
        "\ntailrace {version} — realtime event ingestion\n  \
         engine      {engine} — data in {data}\n  \
         durability  {durability}\n\
         {lacks}  \
         sources     {sources}\n  \
         feeds       {feeds}\n  \
         live page   http://{addr}/\n  \
         metrics     http://{addr}/metrics\n  \
         api         http://{addr}/api/status\n  \
         watch live  tailrace tail {first_feed}   (from a checkout: cargo run --release -- tail {first_feed})\n  \
         stop        Ctrl-C (flushes writes and checkpoints feeds)\n",
        version = env!("CARGO_PKG_VERSION"),
        engine = info["engine"].as_str().unwrap_or("?"),
        data = info["data"].as_str().unwrap_or("?"),
        durability = c.store.durability,
        sources = if sources.is_empty() {
            "none".to_string()
        } else {
            sources.join(", ")
        },
        feeds = if feeds_txt.is_empty() {
            "none".to_string()
        } else {
            feeds_txt.join(", ")
        },
    );
}

fn fmt_us(us: u64) -> String {
    if us >= 10_000 {
        format!("{:.0} ms", us as f64 / 1000.0)
    } else if us >= 1000 {
        format!("{:.1} ms", us as f64 / 1000.0)
    } else {
        format!("{us} µs")
    }
}

/// Logs a status line every `interval` until `stop` (0 disables).
pub async fn every(
    interval: Duration,
    feeds: Arc<Vec<FeedHandle>>,
    ingest: Arc<IngestStats>,
    stop: CancellationToken,
) {
    if interval.is_zero() {
        return;
    }
    let mut tick = tokio::time::interval(interval);
    tick.tick().await;
    let mut last = (Instant::now(), ingest.written.load(Ordering::Relaxed));
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let written = ingest.written.load(Ordering::Relaxed);
        let rate = (written - last.1) as f64 / last.0.elapsed().as_secs_f64().max(1e-3);
        last = (Instant::now(), written);
        let write = ingest
            .write_latency_us
            .lock()
            .ok()
            .and_then(|mut h| {
                let h = h.as_mut()?;
                let out = (!h.is_empty()).then(|| {
                    format!(
                        "p50 {} p99 {}",
                        fmt_us(h.value_at_quantile(0.5)),
                        fmt_us(h.value_at_quantile(0.99))
                    )
                });
                h.reset();
                out
            })
            .unwrap_or_else(|| "idle".into());
        let notify: Vec<String> = feeds
            .iter()
            .map(|f| match f.take_latency_p50_us() {
                Some((p50, _)) => format!("{} {}", f.name, fmt_us(p50)),
                None => format!("{} -", f.name),
            })
            .collect();
        let lag: Vec<String> = feeds
            .iter()
            .map(|f| {
                format!(
                    "{} {}",
                    f.name,
                    f.status().lag.map_or("?".into(), |l| l.to_string())
                )
            })
            .collect();
        tracing::info!(
            "ingest {rate:.1}/s (total {written}) · write {write} · notify p50 {} · lag {} · rejected {} · queue {}",
            notify.join(", "),
            lag.join(", "),
            ingest.rejected.load(Ordering::Relaxed),
            ingest.queue_depth.load(Ordering::Relaxed).max(0),
        );
    }
}
