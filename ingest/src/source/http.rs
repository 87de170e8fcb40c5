//! The `http` source: a long-lived streaming response, framed as NDJSON or server-sent events.
//!
//! One connection at a time. Whatever goes wrong — no connection, an HTTP error status, a
//! stalled stream, the server closing — is logged in one line (status and a short body excerpt
//! for HTTP errors; never the header values, never the URL's query or password), counted in
//! `tailrace_source_reconnects_total{source,reason}`, and followed by a reconnect after an
//! exponential backoff with jitter (100 ms doubling up to `reconnect_max_ms`; a `Retry-After`
//! of a 429/503 answer, or an SSE `retry:`, takes precedence). The stream of records never
//! ends and never fails: a bad record is a [`Raw`] value for the dead letters.
//!
//! - NDJSON: [`framing`](super::framing) rules; a line cut off by a dropped connection is
//!   `truncated`.
//! - NDJSON with `resume = { field, param }` (a server that takes a resume parameter, e.g.
//!   `?since=<seq>`): a record's position is the `field` of the newest event seen (see
//!   [`resume`](super::resume)); every request carries `param=<that value>` once one is known
//!   (the first one after a restart carries the stored one), and the events a server replays
//!   at or before it are dropped and counted in
//!   `tailrace_source_duplicates_dropped_total{source}`, as the `websocket` source does.
//! - SSE: [`sse`](super::sse) rules; the last event id is sent back, verbatim, as
//!   `Last-Event-ID` on every reconnect, so the server can resume. Only events whose type is
//!   in `events` (default `["message"]`: unnamed events) are records; the others are counted
//!   in `tailrace_source_events_skipped_total{source,event}` and dropped.
//! - Timeouts: `connect_timeout_ms` bounds the TCP/TLS connect; `idle_timeout_ms` bounds the
//!   wait for the response headers and for each chunk of the body (heartbeats count).
//! - gzip: `Accept-Encoding: gzip` is sent and a gzip body is decoded (reqwest's `gzip`).
//! - TLS: rustls with ring as the process's crypto provider, installed by [`client`]; every
//!   reqwest client in this crate must be built through it.

use std::collections::BTreeMap;
use std::sync::Once;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::stream::{BoxStream, Stream, StreamExt};
use reqwest::header::{self, HeaderMap, HeaderName, HeaderValue};
use serde::{Deserialize, Serialize};
use store::backoff::Backoff;
use tokio_util::codec::FramedRead;
use tokio_util::io::StreamReader;

use super::framing::{self, Frame, LineFramer};
use super::resume::{Resume, Resumer, Verdict, resume_url, stored_cursor};
use super::sse::{self, Dispatched, SseAssembler};
use super::{BuildContext, Positioned, Raw, Source, SourceError, SourceSettings, USER_AGENT};
use crate::config::interpolate;
use crate::config::problems::Problems;
use crate::config::problems::scheme_of;
use crate::config::redact::REDACTED;
use crate::config::redact::redact_url;
use crate::telemetry::{self as t, ReconnectReason};

/// Bytes of an error response's body shown in the log.
const EXCERPT_BYTES: usize = 300;
/// The longest `Retry-After` honoured (a larger one is clamped, and logged as such).
const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// Framing of an HTTP source's response body.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum HttpFormat {
    /// One JSON document per line.
    #[default]
    Ndjson,
    /// Server-sent events; each `data:` payload is one JSON document.
    Sse,
}

impl HttpFormat {
    /// The lowercase name used in the config file.
    pub fn as_str(self) -> &'static str {
        match self {
            HttpFormat::Ndjson => "ndjson",
            HttpFormat::Sse => "sse",
        }
    }
}

impl std::fmt::Display for HttpFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `connect_timeout_ms` when not given.
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 10_000;
/// `idle_timeout_ms` when not given.
pub const DEFAULT_IDLE_TIMEOUT_MS: u64 = 90_000;
/// `reconnect_max_ms` when not given (also the command source's).
pub const DEFAULT_RECONNECT_MAX_MS: u64 = 30_000;

fn default_connect_timeout_ms() -> u64 {
    DEFAULT_CONNECT_TIMEOUT_MS
}
fn default_idle_timeout_ms() -> u64 {
    DEFAULT_IDLE_TIMEOUT_MS
}
pub(super) fn default_reconnect_max_ms() -> u64 {
    DEFAULT_RECONNECT_MAX_MS
}
fn default_events() -> Vec<String> {
    vec![sse::DEFAULT_EVENT.to_owned()]
}

/// Settings of an http source (`kind = "http"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    /// The streaming endpoint, `http://` or `https://` (required).
    pub url: String,
    /// Body framing: ndjson (the default) or sse.
    #[serde(default)]
    pub format: HttpFormat,
    /// Extra request headers (e.g. authorization); redacted when printed. `${NAME}` in a
    /// value is replaced by the environment variable NAME when the source starts
    /// (`"Bearer ${API_TOKEN}"`); `$$` is a literal `$`. A `User-Agent` here replaces
    /// tailrace's own.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// Give up a connection attempt after this long (ms).
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// A connection that delivers no byte for this long (ms), heartbeats included, is
    /// stalled: it is dropped and reopened. Also bounds the wait for the response headers.
    #[serde(default = "default_idle_timeout_ms")]
    pub idle_timeout_ms: u64,
    /// The longest wait between reconnects (ms); waits double from 100 ms up to this, with
    /// jitter.
    #[serde(default = "default_reconnect_max_ms")]
    pub reconnect_max_ms: u64,
    /// `format = "sse"`: the event types that are records (`event:` names; `message` also
    /// stands for events without one). Events of other types are counted, not stored.
    #[serde(default = "default_events")]
    pub events: Vec<String>,
    /// `format = "ndjson"`: resume from a cursor in the events, for a server that takes one
    /// as a query parameter: `{ field = "seq", param = "since" }` sends the newest event's
    /// `seq` as `since=<seq>` on every reconnect and after a restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<Resume>,
}

impl HttpConfig {
    /// An http source of `url` with every other setting at its default.
    pub fn new(url: impl Into<String>) -> Self {
        HttpConfig {
            url: url.into(),
            format: HttpFormat::default(),
            headers: BTreeMap::new(),
            connect_timeout_ms: DEFAULT_CONNECT_TIMEOUT_MS,
            idle_timeout_ms: DEFAULT_IDLE_TIMEOUT_MS,
            reconnect_max_ms: DEFAULT_RECONNECT_MAX_MS,
            events: default_events(),
            resume: None,
        }
    }
}

/// Checks header names and values (shared by every source that sends headers).
pub(crate) fn validate_headers(at: &str, headers: &BTreeMap<String, String>, p: &mut Problems) {
    for (name, value) in headers {
        let token = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        if !token {
            p.push(
                format!("{at}.headers"),
                format!("{name:?} is not a header name"),
            );
        }
        if value.contains(['\r', '\n']) {
            p.push(
                format!("{at}.headers.{name}"),
                "must not contain line breaks",
            );
        }
        if let Err(e) = interpolate::check_env_refs(value) {
            p.push(format!("{at}.headers.{name}"), e);
        }
    }
}

/// Resolves `${VAR}` in header values (shared by every source that sends headers).
pub(crate) fn resolve_headers(
    name: &str,
    ctx: &BuildContext,
    headers: &BTreeMap<String, String>,
) -> Result<Vec<(String, String)>, SourceError> {
    headers
        .iter()
        .map(|(header, value)| {
            interpolate::interpolate_env(value, |v| std::env::var(v).ok())
                .map(|v| (header.clone(), v))
                .map_err(|message| SourceError::Setting {
                    index: ctx.index,
                    name: name.to_owned(),
                    key: format!("headers.{header}"),
                    message,
                })
        })
        .collect()
}

impl SourceSettings for HttpConfig {
    fn validate(&self, at: &str, p: &mut Problems) {
        if !(self.url.starts_with("http://") || self.url.starts_with("https://")) {
            p.push(
                format!("{at}.url"),
                format!(
                    "must start with http:// or https:// (got {})",
                    scheme_of(&self.url)
                ),
            );
        }
        validate_headers(at, &self.headers, p);
        p.at_least(
            &format!("{at}.connect_timeout_ms"),
            self.connect_timeout_ms,
            1,
        );
        p.at_least(&format!("{at}.idle_timeout_ms"), self.idle_timeout_ms, 1);
        p.at_least(
            &format!("{at}.reconnect_max_ms"),
            self.reconnect_max_ms,
            100,
        );
        validate_events(at, self.format, &self.events, p);
        if let Some(r) = &self.resume {
            validate_resume(at, self.format, r, p);
        }
    }

    fn build(&self, name: &str, ctx: &BuildContext) -> Result<Box<dyn Source>, SourceError> {
        let mut o = HttpOptions::new(self.url.clone(), self.format, ctx.max_line);
        o.headers = resolve_headers(name, ctx, &self.headers)?;
        o.connect_timeout = Duration::from_millis(self.connect_timeout_ms);
        o.idle_timeout = Duration::from_millis(self.idle_timeout_ms);
        o.reconnect_max = Duration::from_millis(self.reconnect_max_ms);
        o.events = self.events.clone();
        o.resume = self.resume.clone();
        Ok(Box::new(HttpSource::new(name, o)))
    }

    fn describe(&self) -> String {
        if self.format == HttpFormat::Sse && self.events != default_events() {
            return format!(
                "{} ({}), {}",
                self.format,
                self.events.join(", "),
                url_for_logs(&self.url)
            );
        }
        format!("{}, {}", self.format, url_for_logs(&self.url))
    }

    fn redact(&mut self) {
        self.url = redact_url(&self.url);
        for value in self.headers.values_mut() {
            *value = REDACTED.to_owned();
        }
    }
}

/// Checks `resume`: NDJSON only (SSE has its own), a field path and a parameter name.
fn validate_resume(at: &str, format: HttpFormat, r: &Resume, p: &mut Problems) {
    if format == HttpFormat::Sse {
        p.push(
            format!("{at}.resume"),
            "only for format = \"ndjson\" (SSE resumes by Last-Event-ID on its own)",
        );
        return;
    }
    p.field_path(&format!("{at}.resume.field"), &r.field);
    if r.param.is_empty() {
        p.push(
            format!("{at}.resume.param"),
            "must not be empty (the query parameter that carries the cursor, e.g. \"since\")",
        );
    }
}

/// Checks `events`: SSE only, at least one name, each a possible `event:` value.
fn validate_events(at: &str, format: HttpFormat, events: &[String], p: &mut Problems) {
    let key = format!("{at}.events");
    if format != HttpFormat::Sse {
        if events != default_events() {
            p.push(
                key,
                "only for format = \"sse\" (event names are an SSE notion)",
            );
        }
        return;
    }
    if events.is_empty() {
        p.push(
            key,
            "must name at least one event type (\"message\" for events without `event:`)",
        );
        return;
    }
    for (i, name) in events.iter().enumerate() {
        if name.is_empty() || name.contains(['\r', '\n', '\0']) || name.len() > 256 {
            p.push(
                format!("{key}[{i}]"),
                format!("{name:?} is not an event name (1-256 bytes, no line break or NUL)"),
            );
        } else if name.starts_with(' ') {
            p.push(
                format!("{key}[{i}]"),
                format!("{name:?}: a leading space is never part of a received event name"),
            );
        }
    }
}

/// A reqwest client builder whose TLS uses ring (installed once as the process's rustls
/// provider). Build every reqwest client of the process through this: with the
/// `rustls-no-provider` feature, a client built before a provider is installed panics.
pub fn client() -> reqwest::ClientBuilder {
    static PROVIDER: Once = Once::new();
    PROVIDER.call_once(|| {
        // Err means another provider was installed first (by the embedding program): keep it.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
    reqwest::Client::builder()
}

/// Settings of an http source.
#[derive(Clone, Debug)]
pub struct HttpOptions {
    /// The streaming endpoint.
    pub url: String,
    /// NDJSON or SSE.
    pub format: HttpFormat,
    /// Extra request headers, values already resolved (marked sensitive: never printed).
    pub headers: Vec<(String, String)>,
    /// Bound on the TCP/TLS connect.
    pub connect_timeout: Duration,
    /// Bound on the wait for response headers and for each body chunk.
    pub idle_timeout: Duration,
    /// First wait before a reconnect (doubles on each failure).
    pub reconnect_min: Duration,
    /// Longest wait before a reconnect.
    pub reconnect_max: Duration,
    /// Longest line (NDJSON) or event data (SSE), in bytes.
    pub max_line: usize,
    /// SSE: the event id to resume after (sent as `Last-Event-ID` on the first request).
    pub last_event_id: Option<String>,
    /// SSE: the event types that are records (default `["message"]`: unnamed events).
    pub events: Vec<String>,
    /// NDJSON: resume from a cursor taken from the events (see the module doc); ignored for
    /// SSE, which resumes by `Last-Event-ID`.
    pub resume: Option<Resume>,
    /// NDJSON with `resume`: the cursor of the first request (e.g. the one stored before a
    /// restart).
    pub start: Option<String>,
}

impl HttpOptions {
    /// Options with the defaults of `config`: 10 s connect, 90 s idle, 100 ms .. 30 s backoff.
    pub fn new(url: impl Into<String>, format: HttpFormat, max_line: usize) -> Self {
        HttpOptions {
            url: url.into(),
            format,
            headers: Vec::new(),
            connect_timeout: Duration::from_millis(DEFAULT_CONNECT_TIMEOUT_MS),
            idle_timeout: Duration::from_millis(DEFAULT_IDLE_TIMEOUT_MS),
            reconnect_min: Duration::from_millis(100),
            reconnect_max: Duration::from_millis(DEFAULT_RECONNECT_MAX_MS),
            max_line,
            last_event_id: None,
            events: default_events(),
            resume: None,
            start: None,
        }
    }
}

/// The http source.
pub struct HttpSource {
    name: String,
    options: HttpOptions,
}

impl HttpSource {
    /// An http source.
    pub fn new(name: impl Into<String>, options: HttpOptions) -> Self {
        HttpSource {
            name: name.into(),
            options,
        }
    }
}

impl Source for HttpSource {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> &str {
        "http"
    }

    fn records(self: Box<Self>) -> BoxStream<'static, Raw> {
        self.positioned().map(|p| p.raw).boxed()
    }

    fn positioned(self: Box<Self>) -> BoxStream<'static, Positioned> {
        run(self.name, self.options).boxed()
    }

    /// SSE: the stored position is the last event id; the first request sends it as
    /// `Last-Event-ID`, so the server continues after it. NDJSON with `resume`: the stored
    /// position is the cursor; the first request carries it in `param`. NDJSON without
    /// `resume` has no position.
    fn resume(&mut self, position: &serde_json::Value) {
        match (self.options.format, position.as_str()) {
            (HttpFormat::Sse, Some(id)) => self.options.last_event_id = Some(id.to_owned()),
            (HttpFormat::Sse, None) => t::SourceProblem {
                source: &self.name,
                error_type: t::SourceErrorType::ResumePosition,
                detail:
                    "the stored position is not an SSE event id; starting without Last-Event-ID"
                        .into(),
                ends: false,
            }
            .emit(),
            (HttpFormat::Ndjson, _) if self.options.resume.is_none() => {}
            (HttpFormat::Ndjson, _) => match stored_cursor(position) {
                Some(c) => self.options.start = Some(c),
                None => t::SourceProblem {
                    source: &self.name,
                    error_type: t::SourceErrorType::ResumePosition,
                    detail: "the stored position is not a cursor; connecting without one".into(),
                    ends: false,
                }
                .emit(),
            },
        }
    }
}

/// The URL without query, fragment or password: safe to log.
pub fn url_for_logs(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut u) => {
            u.set_query(None);
            u.set_fragment(None);
            if u.password().is_some() {
                let _ = u.set_password(Some(REDACTED));
            }
            u.to_string()
        }
        Err(_) => "<invalid url>".to_owned(),
    }
}

/// An error and its causes on one line, without the URL (logged separately, redacted).
fn chain(e: reqwest::Error) -> String {
    let e = e.without_url();
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        let s = c.to_string();
        if !text.contains(&s) {
            text.push_str(": ");
            text.push_str(&s);
        }
        cause = c.source();
    }
    text
}

/// Parses `Retry-After`: delay-seconds or an HTTP-date.
pub fn retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The body as a byte stream whose every chunk must come within `idle`; a stall is an
/// `io::ErrorKind::TimedOut` error.
fn idle_bounded(
    body: impl Stream<Item = reqwest::Result<Bytes>> + Send + Unpin + 'static,
    idle: Duration,
) -> impl Stream<Item = std::io::Result<Bytes>> + Send + 'static {
    futures::stream::unfold(Some(body), move |body| async move {
        let mut body = body?;
        match tokio::time::timeout(idle, body.next()).await {
            Ok(Some(Ok(chunk))) => Some((Ok(chunk), Some(body))),
            Ok(Some(Err(e))) => Some((Err(std::io::Error::other(chain(e))), None)),
            Ok(None) => None,
            Err(_) => Some((
                Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no data for {} ms", idle.as_millis()),
                )),
                None,
            )),
        }
    })
}

/// The request headers: tailrace's `User-Agent`, then the configured ones (which may replace
/// it); configured values are marked sensitive, so they are never printed.
pub(crate) fn header_map(source: &str, headers: &[(String, String)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    map.insert(header::USER_AGENT, HeaderValue::from_static(USER_AGENT));
    for (name, value) in headers {
        // Validated by the config; an invalid one is skipped (its value is never echoed).
        if let (Ok(n), Ok(mut v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            v.set_sensitive(true);
            map.insert(n, v);
        } else {
            t::SourceProblem {
                source,
                error_type: t::SourceErrorType::Request,
                detail: format!("header {name:?}: invalid name or value; not sent"),
                ends: false,
            }
            .emit();
        }
    }
    map
}

/// A short, single-line excerpt of an error body (bounded read).
async fn excerpt(resp: &mut reqwest::Response, idle: Duration) -> String {
    let mut body = Vec::new();
    let read = async {
        while body.len() < EXCERPT_BYTES {
            match resp.chunk().await {
                Ok(Some(c)) => body.extend_from_slice(&c),
                _ => break,
            }
        }
    };
    let _ = tokio::time::timeout(idle.min(Duration::from_secs(5)), read).await;
    let cut = body.len() > EXCERPT_BYTES;
    body.truncate(EXCERPT_BYTES);
    let text: String = String::from_utf8_lossy(&body)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    if cut { format!("{text}…") } else { text }
}

fn run(name: String, o: HttpOptions) -> impl Stream<Item = Positioned> + Send + 'static {
    async_stream::stream! {
        let shown_url = url_for_logs(&o.url);
        let client = match client()
            .connect_timeout(o.connect_timeout)
            .build()
        {
            Ok(c) => c,
            Err(e) => {
                t::SourceProblem {
                    source: &name,
                    error_type: t::SourceErrorType::Setup,
                    detail: format!("cannot build the HTTP client: {}", chain(e)),
                    ends: true,
                }
                .emit();
                return;
            }
        };
        let headers = header_map(&name, &o.headers);
        let connected = t::SourceLink::new(&name);
        let mut backoff = Backoff::new(o.reconnect_min, o.reconnect_max);
        let mut sse = SseAssembler::new(o.max_line, o.last_event_id.clone()).with_events(o.events.clone());
        let mut skipped = t::SkippedEvents::new(&name, &o.events);
        let mut cursor = Cursor::new(&name, &o);
        // An SSE record's position is the id of the event it came from (what a reconnect or a
        // restart sends back as Last-Event-ID); an NDJSON record's, with `resume`, the cursor.
        let at = |sse: &SseAssembler, cursor: &Option<Cursor>| match o.format {
            HttpFormat::Sse => sse.last_event_id().map(|id| serde_json::Value::String(id.to_owned())),
            HttpFormat::Ndjson => cursor.as_ref().and_then(Cursor::position),
        };
        let mut ever_connected = false;
        loop {
            let url = match &mut cursor {
                Some(c) => c.url(&o.url),
                None => o.url.clone(),
            };
            let mut req = client.get(&url).headers(headers.clone());
            match o.format {
                HttpFormat::Sse => {
                    req = req.header(header::ACCEPT, "text/event-stream").header(header::CACHE_CONTROL, "no-cache");
                    // from_bytes: an id may be any UTF-8 (from_str takes visible ASCII only).
                    if let Some(id) = sse.last_event_id()
                        && let Ok(v) = HeaderValue::from_bytes(id.as_bytes())
                    {
                        req = req.header("last-event-id", v);
                    }
                }
                HttpFormat::Ndjson => {
                    req = req.header(header::ACCEPT, "application/x-ndjson, application/jsonl, application/json;q=0.9, */*;q=0.5");
                }
            }
            let (ended, detail, wait): (ReconnectReason, String, Option<Duration>) = match tokio::time::timeout(o.idle_timeout, req.send()).await {
                Err(_) => {
                    let detail = format!("no response headers within {} ms", o.idle_timeout.as_millis());
                    (ReconnectReason::ConnectError, detail, None)
                }
                Ok(Err(e)) => {
                    let first = if ever_connected { "" } else { " (never connected yet: check the url and that the server is up)" };
                    (ReconnectReason::ConnectError, format!("cannot connect{first}: {}", chain(e)), None)
                }
                Ok(Ok(mut resp)) if !resp.status().is_success() => {
                    let status = resp.status();
                    let hint = resp
                        .headers()
                        .get(header::RETRY_AFTER)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| retry_after(v, SystemTime::now()))
                        .map(|d| d.min(MAX_RETRY_AFTER));
                    let body = excerpt(&mut resp, o.idle_timeout).await;
                    let detail = format!("the server answered with an error: {status} {body}");
                    (ReconnectReason::HttpStatus, detail, hint)
                }
                Ok(Ok(resp)) => {
                    ever_connected = true;
                    connected.up();
                    tracing::info!(source = %name, url = %shown_url, format = %o.format, "connected");
                    let body = idle_bounded(resp.bytes_stream(), o.idle_timeout);
                    let mut frames = FramedRead::new(StreamReader::new(body.boxed()), LineFramer::new(o.max_line));
                    let mut got_any = false;
                    let ended = loop {
                        match frames.next().await {
                            Some(Ok(frame)) => {
                                if let Some(raw) = to_raw(o.format, &mut sse, &mut skipped, frame) {
                                    if !got_any {
                                        got_any = true;
                                        backoff.reset();
                                    }
                                    if cursor.as_mut().is_none_or(|c| c.admit(&raw)) {
                                        yield Positioned { position: at(&sse, &cursor), raw };
                                    }
                                }
                            }
                            Some(Err(e)) => {
                                // What was buffered of a cut-off line is still reported.
                                let (decoder, buf) = (frames.decoder().clone(), frames.read_buffer_mut());
                                let mut decoder = decoder;
                                let mut rest = Vec::new();
                                while let Ok(Some(f)) = tokio_util::codec::Decoder::decode_eof(&mut decoder, buf) {
                                    rest.push(f);
                                }
                                for f in rest {
                                    if let Some(raw) = to_raw(o.format, &mut sse, &mut skipped, f)
                                        && cursor.as_mut().is_none_or(|c| c.admit(&raw))
                                    {
                                        yield Positioned { position: at(&sse, &cursor), raw };
                                    }
                                }
                                if let Some(raw) = sse_finish(o.format, &mut sse, &mut skipped) {
                                    yield Positioned { position: at(&sse, &cursor), raw };
                                }
                                if e.kind() == std::io::ErrorKind::TimedOut {
                                    break (ReconnectReason::IdleTimeout, format!("stream stalled: {e}"));
                                }
                                break (ReconnectReason::ReadError, format!("stream broke: {e}"));
                            }
                            None => {
                                if let Some(raw) = sse_finish(o.format, &mut sse, &mut skipped) {
                                    yield Positioned { position: at(&sse, &cursor), raw };
                                }
                                break (ReconnectReason::Closed, "the server closed the stream".to_owned());
                            }
                        }
                    };
                    connected.down();
                    (ended.0, ended.1, None)
                }
            };
            let delay = match (wait, sse.retry()) {
                (Some(server_says), _) => server_says,
                (None, Some(retry)) => backoff.next_from(retry),
                (None, None) => backoff.next_wait(),
            };
            t::SourceReconnecting { source: &name, target: &shown_url, reason: ended, detail, delay }.emit();
            tokio::time::sleep(delay).await;
        }
    }
}

/// NDJSON with `resume`: the cursor, the query parameter that carries it, and the count of
/// replayed events dropped.
struct Cursor {
    param: String,
    resumer: Resumer,
    duplicates: metrics::Counter,
}

impl Cursor {
    /// The cursor of an NDJSON source with `resume` (`None` otherwise), from `start` if set.
    fn new(name: &str, o: &HttpOptions) -> Option<Self> {
        let r = o
            .resume
            .as_ref()
            .filter(|_| o.format == HttpFormat::Ndjson)?;
        Some(Cursor {
            param: r.param.clone(),
            resumer: Resumer::new(&r.field, o.start.clone()),
            duplicates: t::duplicates_dropped(name),
        })
    }

    /// The URL of the next request: `url` with `param=<cursor>` once a cursor is known. Opens
    /// the replay window.
    fn url(&mut self, url: &str) -> String {
        match self.resumer.connecting() {
            Some(c) => resume_url(url, &self.param, c),
            None => url.to_owned(),
        }
    }

    /// Whether to hand `raw` over: not when it is a replayed event already handed over (it is
    /// counted instead).
    fn admit(&mut self, raw: &Raw) -> bool {
        if let Raw::Bytes(b) = raw
            && self.resumer.admit(b) == Verdict::Duplicate
        {
            self.duplicates.increment(1);
            return false;
        }
        true
    }

    /// Where the stream stands: the cursor, as a string (as the websocket source stores it).
    fn position(&self) -> Option<serde_json::Value> {
        self.resumer
            .position()
            .map(|c| serde_json::Value::String(c.to_owned()))
    }
}

fn to_raw(
    format: HttpFormat,
    sse: &mut SseAssembler,
    skipped: &mut t::SkippedEvents,
    frame: Frame,
) -> Option<Raw> {
    match format {
        HttpFormat::Ndjson => framing::ndjson(frame),
        HttpFormat::Sse => record(sse.push(frame)?, skipped),
    }
}

fn sse_finish(
    format: HttpFormat,
    sse: &mut SseAssembler,
    skipped: &mut t::SkippedEvents,
) -> Option<Raw> {
    match format {
        HttpFormat::Ndjson => None,
        HttpFormat::Sse => record(sse.finish()?, skipped),
    }
}

/// The record of a dispatched event; a skipped one is counted instead.
fn record(d: Dispatched, skipped: &mut t::SkippedEvents) -> Option<Raw> {
    match d {
        Dispatched::Record(raw) => Some(raw),
        Dispatched::Skipped { event } => {
            skipped.emit(&event);
            None
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_takes_seconds_or_a_date() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(retry_after("7", now), Some(Duration::from_secs(7)));
        let later = httpdate::fmt_http_date(now + Duration::from_secs(30));
        assert_eq!(retry_after(&later, now), Some(Duration::from_secs(30)));
        let earlier = httpdate::fmt_http_date(now - Duration::from_secs(30));
        assert_eq!(retry_after(&earlier, now), Some(Duration::ZERO));
        assert_eq!(retry_after("soon", now), None);
    }

    #[test]
    fn logged_urls_hide_query_and_password() {
        assert_eq!(
            url_for_logs("https://u:secret@example.com/s?token=abc#x"),
            "https://u:***@example.com/s"
        );
        assert_eq!(url_for_logs("nope"), "<invalid url>");
    }

    #[test]
    fn header_values_are_sensitive() {
        let map = header_map("s", &[("authorization".into(), "Bearer s3cret".into())]);
        let v = map.get("authorization").unwrap();
        assert!(v.is_sensitive());
        assert!(!format!("{map:?}").contains("s3cret"));
    }
}
