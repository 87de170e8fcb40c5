//! `tailrace tail`: a running pipeline's feed, printed live, one JSON document per line (like
//! RethinkDB's `changes()` in a shell).

use anyhow::Context;
use futures::StreamExt;

/// Prints a running feed's events as they arrive (like RethinkDB's `changes()` in a shell).
pub async fn tail(base: &str, feed: &str) -> anyhow::Result<()> {
    use eventsource_stream::Eventsource;
    let url = format!("{}/api/feeds/{feed}/stream", base.trim_end_matches('/'));
    let client = crate::source::http::client()
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
            _ => println!("{}", ev.data),
        }
    }
    anyhow::bail!("the pipeline at {base} closed the stream (stopped?)")
}
