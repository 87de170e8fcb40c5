//! `tailrace tail`: a running pipeline's feed or collection, printed live, one JSON document per
//! line (like RethinkDB's `changes()` in a shell).
//!
//! - `tailrace tail <feed>` prints what a configured feed holds (`/api/feeds/<feed>/stream`).
//! - `tailrace tail --collection events --filter '{"lang":"ja"}' --include-initial` follows a
//!   collection through `/api/changes`: one NDJSON line per `initial` or `change` event on
//!   stdout (with its `id`), states and gaps on stderr. When the connection drops it reconnects
//!   with backoff and resumes exactly after the last id it printed; `--resume-after <id>` starts
//!   there.

use std::time::Duration;

use anyhow::Context;
use futures::{StreamExt, TryStreamExt};
use serde_json::Value;
use store::backoff::Backoff;
use tokio_util::codec::{FramedRead, LinesCodec};
use tokio_util::io::StreamReader;

/// The longest line accepted from the server (a document is at most a few MB).
const MAX_LINE: usize = 64 * 1024 * 1024;

/// Prints a running feed's events as they arrive (like RethinkDB's `changes()` in a shell).
pub async fn tail(base: &str, feed: &str) -> anyhow::Result<()> {
    use eventsource_stream::Eventsource;
    let url = format!("{}/api/feeds/{feed}/stream", base.trim_end_matches('/'));
    let client = ingest::source::http::client()
        .build()
        .context("building the HTTP client")?;
    let resp = client.get(&url).send().await.with_context(|| {
        format!("connecting to {url}: is `tailrace run` running there? (--url sets the address)")
    })?;
    if !resp.status().is_success() {
        let status = resp.status();
        let body = resp.text().await.unwrap_or_default();
        anyhow::bail!("{url}: {status}: {}", body.trim());
    }
    eprintln!("tailing feed {feed} at {base} (Ctrl-C to stop)");
    let mut events = resp.bytes_stream().eventsource();
    while let Some(ev) = events.next().await {
        let ev = ev.with_context(|| format!("reading {url}"))?;
        match ev.event.as_str() {
            "lagged" => eprintln!("(too slow: {} events skipped)", ev.data),
            _ => {
                if !emit(&ev.data)? {
                    return Ok(());
                }
            }
        }
    }
    anyhow::bail!("the pipeline at {base} closed the stream (stopped?)")
}

/// What `tailrace tail --collection` asks `/api/changes` for.
#[derive(Clone, Debug, Default)]
pub struct ChangesArgs {
    /// `events`, `dead_letters`, `rollups` or `stats`.
    pub collection: String,
    /// A MongoDB-syntax filter (JSON text).
    pub filter: Option<String>,
    /// `insert,update,replace,delete` (keyed collections).
    pub ops: Option<String>,
    /// The current matching documents first.
    pub include_initial: bool,
    /// How many (capped collections).
    pub initial_limit: Option<usize>,
    /// Coalesce each key's changes within this many milliseconds.
    pub squash_ms: Option<u64>,
    /// Start exactly after this id.
    pub resume_after: Option<String>,
}

impl ChangesArgs {
    /// The request's query string (without `resume_after`, which changes per connection).
    fn query(&self) -> String {
        let mut q = form_urlencoded::Serializer::new(String::new());
        q.append_pair("collection", &self.collection);
        if let Some(f) = &self.filter {
            q.append_pair("filter", f);
        }
        if let Some(ops) = &self.ops {
            q.append_pair("ops", ops);
        }
        if self.include_initial {
            q.append_pair("include_initial", "true");
        }
        if let Some(n) = self.initial_limit {
            q.append_pair("initial_limit", &n.to_string());
        }
        if let Some(ms) = self.squash_ms {
            q.append_pair("squash", &ms.to_string());
        }
        q.finish()
    }
}

/// How one connection ended.
enum Ended {
    /// The connection dropped or the server closed it: reconnect after the last id.
    Dropped(String),
    /// Whatever reads our output is gone (`tailrace tail ... | head`): stop quietly.
    ReaderGone,
}

/// Prints one line on stdout; `false` when the reader of stdout is gone (a closed pipe), which
/// ends the command quietly instead of panicking as `println!` would.
fn emit(line: &str) -> anyhow::Result<bool> {
    use std::io::Write;
    match writeln!(std::io::stdout().lock(), "{line}") {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(e).context("writing to standard output"),
    }
}

/// Follows a collection through `/api/changes` until Ctrl-C, reconnecting after drops and
/// resuming exactly after the last id printed. A refusal (4xx: a bad filter, an id the server
/// does not know) ends it with the server's message.
pub async fn tail_changes(base: &str, args: &ChangesArgs) -> anyhow::Result<()> {
    let client = ingest::source::http::client()
        .build()
        .context("building the HTTP client")?;
    let url = format!(
        "{}/api/changes?{}",
        base.trim_end_matches('/'),
        args.query()
    );
    let mut last_id = args.resume_after.clone();
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
    let mut first = true;
    loop {
        let mut request = client.get(&url).header("accept", "application/x-ndjson");
        if let Some(id) = &last_id {
            request = request.header("last-event-id", id.as_str());
        }
        let ended = match request.send().await {
            Err(e) if first => {
                return Err(e).with_context(|| {
                    format!(
                        "connecting to {url}: is `tailrace run` running there? (--url sets the \
                         address)"
                    )
                });
            }
            Err(e) => Ended::Dropped(e.to_string()),
            Ok(resp) if resp.status().is_client_error() => {
                let status = resp.status();
                let body = resp.text().await.unwrap_or_default();
                let message = serde_json::from_str::<Value>(&body)
                    .ok()
                    .and_then(|v| v["error"].as_str().map(str::to_string))
                    .unwrap_or(body);
                anyhow::bail!("{status}: {}", message.trim());
            }
            Ok(resp) if !resp.status().is_success() => {
                let status = resp.status();
                let body = resp.text().await.unwrap_or_default();
                Ended::Dropped(format!("{status}: {}", body.trim()))
            }
            Ok(resp) => {
                if first {
                    eprintln!(
                        "following {} at {base} (Ctrl-C to stop; each line's id resumes with \
                         --resume-after)",
                        args.collection
                    );
                }
                backoff.reset();
                read_lines(resp, &mut last_id).await?
            }
        };
        first = false;
        let why = match ended {
            Ended::Dropped(why) => why,
            Ended::ReaderGone => return Ok(()),
        };
        let wait = backoff.next_wait();
        eprintln!(
            "(disconnected: {why}; reconnecting in {:.1} s{})",
            wait.as_secs_f64(),
            last_id
                .as_deref()
                .map(|id| format!(" after id {id}"))
                .unwrap_or_default()
        );
        tokio::time::sleep(wait).await;
    }
}

/// Prints one connection's lines; returns how it ended, or the server's `error` event.
async fn read_lines(
    resp: reqwest::Response,
    last_id: &mut Option<String>,
) -> anyhow::Result<Ended> {
    let body = resp.bytes_stream().map_err(std::io::Error::other);
    let mut lines = FramedRead::new(
        StreamReader::new(body),
        LinesCodec::new_with_max_length(MAX_LINE),
    );
    while let Some(line) = lines.next().await {
        let line = match line {
            Ok(l) => l,
            Err(e) => return Ok(Ended::Dropped(e.to_string())),
        };
        if line.trim().is_empty() {
            continue; // a keep-alive
        }
        let v: Value = match serde_json::from_str(&line) {
            Ok(v) => v,
            Err(e) => {
                eprintln!("(not JSON, skipped: {e})");
                continue;
            }
        };
        if let Some(id) = v["id"].as_str() {
            *last_id = Some(id.to_string());
        }
        match v["type"].as_str() {
            Some("initial" | "change") => {
                if !emit(&line)? {
                    return Ok(Ended::ReaderGone);
                }
            }
            Some("error") => anyhow::bail!(
                "the server ended the stream: {}",
                v["error"].as_str().unwrap_or("(no message)")
            ),
            Some("checkpoint") => {}
            _ => eprintln!("{line}"),
        }
    }
    Ok(Ended::Dropped("the server closed the stream".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_names_what_was_asked_encoded() {
        let args = ChangesArgs {
            collection: "events".into(),
            filter: Some(r#"{"lang":"ja","n":{"$gte":10}}"#.into()),
            include_initial: true,
            squash_ms: Some(500),
            ..ChangesArgs::default()
        };
        assert_eq!(
            args.query(),
            "collection=events&filter=%7B%22lang%22%3A%22ja%22%2C%22n%22%3A%7B%22%24gte%22%3A10%7D%7D&include_initial=true&squash=500"
        );
    }
}
