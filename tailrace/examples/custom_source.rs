//! A complete custom source, and a `main` that runs the tailrace pipeline with it.
//!
//! The source polls a public JSON API — GitHub's public events, a live stream of pushes,
//! issues and stars — and hands each new event over. It shows what a source has to do:
//! produce a `Stream` of `Raw` records, never end while it has more to give, handle its own
//! failures (log, back off, try again) and never stop the pipeline over one bad record.
//!
//! ```text
//! cargo run --release --example custom_source
//! TAILRACE_HTTP__LISTEN=127.0.0.1:9800 cargo run --example custom_source -- https://api.github.com/events
//! ```
//!
//! Everything else is the normal pipeline: the configuration (`TAILRACE_*` variables, or
//! `TAILRACE_CONFIG=my.toml`), the store, the feeds, /metrics and the status line. Configured
//! `[[sources]]` run beside this one (set `TAILRACE_SOURCES='[]'` for this one alone).

use std::collections::{HashSet, VecDeque};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use ingest::config::Config;
use ingest::source::{Raw, Source};
use serde_json::Value;

/// Polls a URL that answers with a JSON array of objects carrying an `id`; hands over the ones
/// not seen before, oldest first.
struct PollingSource {
    name: String,
    url: String,
    every: Duration,
}

impl Source for PollingSource {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> &str {
        "github-events"
    }

    fn records(self: Box<Self>) -> BoxStream<'static, Raw> {
        // Every reqwest client in a tailrace process is built through this builder: it
        // installs the TLS provider once.
        let client = ingest::source::http::client()
            .user_agent("tailrace-example")
            .timeout(Duration::from_secs(30))
            .build();
        let state = (
            client,
            self,
            Seen::default(),
            VecDeque::<Raw>::new(),
            None::<String>,
        );
        futures::stream::unfold(state, |(client, me, mut seen, mut queue, mut etag)| async move {
            let client = match client {
                Ok(c) => c,
                Err(e) => {
                    tracing::error!(source = %me.name, error = %e, "cannot build an HTTP client");
                    return None; // ends this source; the pipeline goes on
                }
            };
            while queue.is_empty() {
                let mut req = client.get(&me.url).header("accept", "application/json");
                if let Some(tag) = &etag {
                    req = req.header("if-none-match", tag.as_str());
                }
                match req.send().await {
                    Ok(resp) if resp.status() == reqwest::StatusCode::NOT_MODIFIED => {}
                    Ok(resp) if resp.status().is_success() => {
                        etag = resp
                            .headers()
                            .get("etag")
                            .and_then(|v| v.to_str().ok())
                            .map(str::to_owned);
                        match resp.bytes().await {
                            // Newest first in the answer: hand them over oldest first.
                            Ok(body) => match serde_json::from_slice::<Value>(&body) {
                                Ok(Value::Array(items)) => {
                                    for item in items.into_iter().rev() {
                                        if seen.insert(&item) {
                                            queue.push_back(Raw::Json(item));
                                        }
                                    }
                                }
                                // Not what we expected: a dead letter, not a crash.
                                _ => queue.push_back(Raw::Bytes(body.to_vec())),
                            },
                            Err(e) => tracing::warn!(source = %me.name, error = %e, "reading the answer failed"),
                        }
                    }
                    Ok(resp) => {
                        tracing::warn!(source = %me.name, status = %resp.status(), "the API answered with an error")
                    }
                    Err(e) => tracing::warn!(source = %me.name, error = %e, "cannot reach the API"),
                }
                if queue.is_empty() {
                    tokio::time::sleep(me.every).await; // the polling interval
                }
            }
            let next = queue.pop_front()?;
            Some((next, (Ok(client), me, seen, queue, etag)))
        })
        .boxed()
    }
}

/// The ids handed over recently (bounded: the API only ever shows the newest few hundred).
#[derive(Default)]
struct Seen {
    ids: HashSet<String>,
    order: VecDeque<String>,
}

impl Seen {
    /// Whether `item` is new (and remembers it). Items without an id are always new.
    fn insert(&mut self, item: &Value) -> bool {
        let Some(id) = item.get("id").map(|v| v.to_string()) else {
            return true;
        };
        if !self.ids.insert(id.clone()) {
            return false;
        }
        self.order.push_back(id);
        if self.order.len() > 10_000
            && let Some(old) = self.order.pop_front()
        {
            self.ids.remove(&old);
        }
        true
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TAILRACE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "https://api.github.com/events".to_owned());
    let config = Config::load(None).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mine = PollingSource {
        name: "github".into(),
        url,
        // Unauthenticated clients get 60 requests an hour.
        every: Duration::from_secs(60),
    };
    tailrace::run::run_with_sources(config, vec![Box::new(mine)]).await?;
    Ok(())
}
