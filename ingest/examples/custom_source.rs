//! A complete custom source, and a `main` that runs the tailrace pipeline with it through the
//! library alone (no HTTP server, no CLI: `ingest` is the only tailrace crate it needs).
//!
//! The source polls a JSON API that answers with an array of events carrying an `id` —
//! GitHub's public events by default, a live stream of pushes, issues and stars — and hands
//! each new event over. It shows what a source has to do: produce a `Stream` of `Raw`
//! records, never end while it has more to give, handle its own failures, and never stop the
//! pipeline over one bad record. And how a polling client behaves towards the service:
//!
//! - it asks once per interval, whatever the answer held (an answer full of new events does
//!   not mean "ask again now": the next answer would mostly repeat it);
//! - it waits longer when the service says so: `X-Poll-Interval` (seconds, GitHub's way of
//!   saying how often to poll), `Retry-After` (seconds or a date), and, for GitHub's rate
//!   limit, `X-RateLimit-Remaining: 0` with `X-RateLimit-Reset` (when the window resets);
//! - refused (403, 429) or failing (5xx, no answer) without being told how long to wait, it
//!   backs off: waits double from twice the interval, up to an hour;
//! - it sends `If-None-Match` with the last `ETag`, so an unchanged answer costs the service
//!   (and, on GitHub, the rate limit) nothing.
//!
//! ```text
//! cargo run --release --example custom_source                       # GitHub's public events
//! cargo run --release --example custom_source -- http://127.0.0.1:8080/events 5
//! ```
//!
//! The arguments are the URL and the interval in seconds (default 60: an unauthenticated
//! GitHub client gets 60 requests an hour). Everything else is the normal pipeline: the
//! configuration (`TAILRACE_*` variables, or `TAILRACE_CONFIG=my.toml`), the store and the
//! feeds. Configured `[[sources]]` run beside this one (`TAILRACE_SOURCES='[]'` for this one
//! alone). Ctrl-C stops it in order.

use std::collections::{HashSet, VecDeque};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use futures::stream::BoxStream;
use ingest::config::Config;
use ingest::pipeline::Pipeline;
use ingest::source::{Raw, Source};
use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::Value;
use store::backoff::Backoff;

/// The longest this source ever waits between two requests when backing off on its own.
const MAX_BACKOFF: Duration = Duration::from_secs(3600);

/// Polls a URL that answers with a JSON array of objects carrying an `id`; hands over the ones
/// not seen before, oldest first.
pub struct PollingSource {
    /// The source's name (metrics label, stored with each event).
    pub name: String,
    /// What it polls.
    pub url: String,
    /// The shortest time between two requests.
    pub every: Duration,
}

impl Source for PollingSource {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> &str {
        "polling"
    }

    fn records(self: Box<Self>) -> BoxStream<'static, Raw> {
        async_stream::stream! {
            // Every reqwest client in a tailrace process is built through this builder: it
            // installs the TLS provider once.
            let client = match ingest::source::http::client()
                .user_agent(ingest::source::USER_AGENT)
                .timeout(Duration::from_secs(30))
                .build()
            {
                Ok(c) => c,
                Err(e) => {
                    tracing::error!(source = %self.name, error = %e, "cannot build an HTTP client; this source ends");
                    return;
                }
            };
            let mut seen = Seen::default();
            let mut etag: Option<String> = None;
            let mut backoff = Backoff::new(self.every.saturating_mul(2), MAX_BACKOFF);
            loop {
                let mut req = client.get(&self.url).header("accept", "application/json");
                if let Some(tag) = &etag {
                    req = req.header("if-none-match", tag.as_str());
                }
                let (new, wait) = match req.send().await {
                    Ok(resp) => {
                        let (status, headers) = (resp.status(), resp.headers().clone());
                        if status.is_success() {
                            etag = header(&headers, "etag").map(str::to_owned);
                        }
                        let body = if status.is_success() { resp.bytes().await.ok() } else { None };
                        let new = body.map(|b| seen.new_records(&b)).unwrap_or_default();
                        (new, next_wait(status, &headers, self.every, &mut backoff, SystemTime::now()))
                    }
                    Err(e) => {
                        let wait = backoff.next_wait();
                        tracing::warn!(source = %self.name, error = %e, retry_in = ?wait, "cannot reach the service");
                        (Vec::new(), wait)
                    }
                };
                for record in new {
                    yield record;
                }
                tokio::time::sleep(wait).await;
            }
        }
        .boxed()
    }
}

/// How long to wait before the next request, after an answer with `status` and `headers`.
pub fn next_wait(
    status: StatusCode,
    headers: &HeaderMap,
    every: Duration,
    backoff: &mut Backoff,
    now: SystemTime,
) -> Duration {
    let told = told_to_wait(headers, now);
    if status.is_success() || status == StatusCode::NOT_MODIFIED {
        backoff.reset();
        return told.map_or(every, |t| t.max(every));
    }
    let refused = matches!(
        status,
        StatusCode::FORBIDDEN | StatusCode::TOO_MANY_REQUESTS
    );
    if refused || status.is_server_error() {
        let wait = told.unwrap_or_else(|| backoff.next_wait()).max(every);
        tracing::warn!(%status, retry_in = ?wait, "the service refused or failed; waiting");
        return wait;
    }
    // Another answer (404, 401...): nothing to back off from, but no reason to hurry either.
    tracing::warn!(%status, "unexpected answer");
    told.map_or(every, |t| t.max(every))
}

/// What the service asked for: `Retry-After`, `X-Poll-Interval`, or the end of an exhausted
/// rate-limit window — the longest of them.
fn told_to_wait(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let retry_after =
        header(headers, "retry-after").and_then(|v| ingest::source::http::retry_after(v, now));
    let poll_interval = header(headers, "x-poll-interval")
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let exhausted = header(headers, "x-ratelimit-remaining").map(str::trim) == Some("0");
    let reset = header(headers, "x-ratelimit-reset")
        .filter(|_| exhausted)
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|at| {
            let now = now.duration_since(UNIX_EPOCH).unwrap_or_default();
            Duration::from_secs(at).saturating_sub(now)
        });
    [retry_after, poll_interval, reset]
        .into_iter()
        .flatten()
        .max()
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// The ids handed over recently (bounded: the API only ever shows the newest few hundred).
#[derive(Default)]
struct Seen {
    ids: HashSet<String>,
    order: VecDeque<String>,
}

impl Seen {
    /// The records of an answer not handed over before, oldest first (the answer lists the
    /// newest first). An answer that is not a JSON array is one record as it came: a dead
    /// letter, not a crash.
    fn new_records(&mut self, body: &[u8]) -> Vec<Raw> {
        match serde_json::from_slice::<Value>(body) {
            Ok(Value::Array(items)) => items
                .into_iter()
                .rev()
                .filter(|item| self.insert(item))
                .map(Raw::Json)
                .collect(),
            _ => vec![Raw::Bytes(body.to_vec())],
        }
    }

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
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TAILRACE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "https://api.github.com/events".to_owned());
    let every = args.next().and_then(|s| s.parse().ok()).unwrap_or(60);
    let config = Config::load(None)?;
    let mine = PollingSource {
        name: "polling".into(),
        url,
        every: Duration::from_secs(every),
    };
    let mut running = Pipeline::build(config, vec![Box::new(mine)])
        .await?
        .start()
        .await?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = running.finished() => {}
    }
    let report = running.stop().await;
    if report.is_clean() {
        Ok(())
    } else {
        Err(report.problems.join("; ").into())
    }
}
