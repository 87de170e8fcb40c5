//! The `websocket` source: a long-lived WebSocket connection (`ws://` or `wss://`), one JSON
//! event per text frame (or several NDJSON lines in one frame), with reconnects, keep-alive,
//! an optional subscribe message, and resumption from a cursor taken from the events
//! themselves (Bluesky Jetstream's `?cursor=<time_us>`).
//!
//! One connection at a time, on tokio-tungstenite. Whatever goes wrong — no connection, an
//! HTTP answer instead of `101 Switching Protocols`, no answer to the upgrade within
//! `connect_timeout`, no frame within `idle_timeout`, a read error or a connection cut inside a
//! frame, the server closing — is logged in one line (status and a short body excerpt for HTTP
//! answers; never header values, never the URL's query), counted in
//! `tailrace_source_reconnects_total{source,reason}`, and followed by a reconnect after an
//! exponential backoff with jitter ([`Backoff`]; a `Retry-After` takes precedence). The stream
//! of records never ends and never fails.
//!
//! Records:
//! - a text frame is split into lines with the NDJSON rules (blank lines skipped); each line is
//!   a [`Raw::Bytes`] for the ingester to parse and validate (non-JSON text arrives there
//!   unchanged and becomes a `malformed_json` dead letter);
//! - a binary frame is `Raw::Invalid { reason: BinaryFrame }`;
//! - a frame or message over `max_frame` is `too_large`, with the prefix that had arrived when
//!   tungstenite refused it (tungstenite checks the size on the frame header, so the payload is
//!   never buffered beyond the limit); tungstenite cannot skip the rest of a frame, so the
//!   connection is dropped and reopened (`read_error`);
//! - a text frame that is not UTF-8 is `invalid_utf8`, with its bytes: tungstenite fails the
//!   connection on it (as RFC 6455 requires) without keeping the bytes, so a tap under it keeps
//!   them (`websocket/tap.rs`); the connection is reopened (`read_error`);
//! - a data message cut by the end of the connection is `truncated`, with what came of it;
//! - pings, pongs and close frames are not records. Pings are answered by tungstenite itself
//!   (it queues the pong and sends it on the next read, and this source is always reading).
//!
//! Resume and duplicates (see [`Resumer`]): with `resume = { field, param }`, every connection
//! after the first carries `param=<field of the last event handed over>` (the first one
//! carries `start` when set). A Jetstream-like server replays from the cursor *inclusively*,
//! so right after a reconnect the source drops, and counts in
//! `tailrace_source_duplicates_dropped_total{source}`, exactly the events it can prove it
//! already handed over: those whose value is below the cursor (the values are monotonic, which
//! is what makes them a cursor), and those whose value equals the cursor and whose content is
//! one it handed over with that value. Anything else is handed over: an event whose value is
//! greater than the cursor is never dropped, and several events sharing one value are told
//! apart by content. The first event past the cursor ends the replay window; from then on
//! nothing is filtered, so a field that is not monotonic after all costs duplicates, not
//! losses.
//!
//! TLS: rustls with the ring provider chosen explicitly in the `ClientConfig` (never
//! aws-lc-rs), and certificates checked by `rustls-platform-verifier`, the verifier reqwest
//! already uses for the `http` source: one root store mechanism in the process (the system's
//! CA store on Linux, so a corporate CA installed there works for both sources).
//!
//! What this source is not: it does not follow redirects (a 3xx is an `http_status`), does
//! not negotiate compression (`permessage-deflate`) or subprotocols, and does not speak
//! HTTP/2 WebSockets.

#[doc(hidden)]
pub mod replay;
mod tap;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use futures::SinkExt;
use futures::stream::{BoxStream, Stream, StreamExt};
use reqwest::Url;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use store::backoff::Backoff;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::error::{CapacityError, ProtocolError};
use tokio_tungstenite::tungstenite::http::{HeaderName, HeaderValue, header};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig as ProtocolConfig;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_util::either::Either;

use self::tap::{Finding, Tap};
use super::framing::{self, Frame, PREFIX_BYTES};
use super::http::{
    DEFAULT_CONNECT_TIMEOUT_MS, DEFAULT_IDLE_TIMEOUT_MS, DEFAULT_RECONNECT_MAX_MS,
    default_reconnect_max_ms, resolve_headers, validate_headers,
};
use super::resume::stored_cursor;
pub use super::resume::{Resume, Resumer, Verdict, resume_url, resume_value};
use super::{
    BuildContext, Positioned, Raw, RejectReason, Source, SourceError, SourceSettings, USER_AGENT,
};
use crate::config::problems::Problems;
use crate::config::redact::REDACTED;
use crate::config::redact::redact_url;
use crate::telemetry::{self as t, ReconnectReason};

/// Bytes of an error answer's body shown in the log.
const EXCERPT_BYTES: usize = 300;
/// The longest `Retry-After` honoured (a larger one is clamped).
const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);
/// How long a polite close (our close frame, the server's reply) may take.
const CLOSE_GRACE: Duration = Duration::from_secs(1);
/// How long to wait for the rest of an oversized message's prefix (it is usually there).
const PREFIX_WAIT: Duration = Duration::from_secs(1);

/// Settings of a websocket source. Plain fields, so a config table maps onto them one to one.
#[derive(Clone)]
pub struct WebSocketOptions {
    /// `ws://` or `wss://` endpoint, query included (e.g. Jetstream's `wantedCollections`).
    pub url: String,
    /// Extra headers on the upgrade request, values already resolved. Sent marked sensitive
    /// and never logged. A `User-Agent` here replaces [`USER_AGENT`].
    pub headers: Vec<(String, String)>,
    /// A text message sent right after every (re)connect: exchange feeds stay silent until
    /// they are told what to send.
    pub subscribe: Option<String>,
    /// Bound on TCP connect + TLS + the upgrade's answer.
    pub connect_timeout: Duration,
    /// No frame of any kind (pings and pongs count) for this long: the connection is stalled,
    /// dropped and reopened.
    pub idle_timeout: Duration,
    /// Send a ping this often (`None`: never). A server that answers keeps a quiet connection
    /// within `idle_timeout`, and the ping keeps proxies from timing it out.
    pub ping_interval: Option<Duration>,
    /// First wait before a reconnect (doubles on each failure, with jitter).
    pub reconnect_min: Duration,
    /// Longest wait before a reconnect.
    pub reconnect_max: Duration,
    /// Largest frame and message, in bytes; also tungstenite's limits, so a larger one is
    /// refused on its header instead of being buffered.
    pub max_frame: usize,
    /// Resume from a cursor taken from the events (see the module doc).
    pub resume: Option<Resume>,
    /// The cursor of the first connection (e.g. the last one stored before a restart).
    pub start: Option<String>,
}

impl fmt::Debug for WebSocketOptions {
    /// Header values and the URL's query may hold tokens: both are left out.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.headers.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("WebSocketOptions")
            .field("url", &super::http::url_for_logs(&self.url))
            .field("headers", &names)
            .field("subscribe", &self.subscribe.as_ref().map(|s| s.len()))
            .field("connect_timeout", &self.connect_timeout)
            .field("idle_timeout", &self.idle_timeout)
            .field("ping_interval", &self.ping_interval)
            .field("reconnect_min", &self.reconnect_min)
            .field("reconnect_max", &self.reconnect_max)
            .field("max_frame", &self.max_frame)
            .field("resume", &self.resume)
            .field("start", &self.start)
            .finish()
    }
}

impl WebSocketOptions {
    /// Options with the defaults: 10 s connect, 90 s idle (the `http` source's), a ping every
    /// 30 s, reconnects from 100 ms doubling to 30 s, no subscribe message, no resume.
    pub fn new(url: impl Into<String>, max_frame: usize) -> Self {
        WebSocketOptions {
            url: url.into(),
            headers: Vec::new(),
            subscribe: None,
            connect_timeout: Duration::from_millis(DEFAULT_CONNECT_TIMEOUT_MS),
            idle_timeout: Duration::from_millis(DEFAULT_IDLE_TIMEOUT_MS),
            ping_interval: Some(Duration::from_secs(30)),
            reconnect_min: Duration::from_millis(100),
            reconnect_max: Duration::from_millis(DEFAULT_RECONNECT_MAX_MS),
            max_frame,
            resume: None,
            start: None,
        }
    }

    /// Every problem that would keep the source from ever connecting, each with its key.
    pub fn validate(&self) -> Result<(), Vec<WebSocketError>> {
        let mut problems = Vec::new();
        if let Err(e) = Target::parse(&self.url) {
            problems.push(e);
        }
        for (name, value) in &self.headers {
            if HeaderName::from_bytes(name.as_bytes()).is_err()
                || HeaderValue::from_str(value).is_err()
            {
                problems.push(WebSocketError::Header { name: name.clone() });
            }
        }
        if let Some(r) = &self.resume
            && (r.param.is_empty() || r.field.is_empty() || r.field.split('.').any(str::is_empty))
        {
            problems.push(WebSocketError::Resume);
        }
        if self.idle_timeout.is_zero() || self.connect_timeout.is_zero() {
            problems.push(WebSocketError::Timeout);
        }
        if self.max_frame == 0 {
            problems.push(WebSocketError::MaxFrame);
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }
}

/// A setting the source cannot work with (found by [`WebSocketOptions::validate`]).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WebSocketError {
    /// The URL does not parse, or is not `ws://`/`wss://` with a host.
    #[error("url: {0}; expected ws://host[:port]/path?query or wss://…")]
    Url(String),
    /// A header name or value that HTTP cannot carry (the value is not echoed).
    #[error("headers.{name}: not a valid header name or value")]
    Header {
        /// The header's name.
        name: String,
    },
    /// An empty resume field, path segment or parameter.
    #[error("resume: field and param must be non-empty (field a dotted path like \"time_us\")")]
    Resume,
    /// A zero timeout would reconnect in a loop.
    #[error("connect_timeout and idle_timeout must be above zero")]
    Timeout,
    /// A zero frame limit would refuse everything.
    #[error("max_frame must be above zero")]
    MaxFrame,
}

fn default_ping_interval_ms() -> u64 {
    30_000
}
fn default_reconnect_min_ms() -> u64 {
    100
}
fn default_connect_timeout_ms() -> u64 {
    DEFAULT_CONNECT_TIMEOUT_MS
}
fn default_idle_timeout_ms() -> u64 {
    DEFAULT_IDLE_TIMEOUT_MS
}

/// Settings of a websocket source (`kind = "websocket"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebSocketConfig {
    /// The `ws://` or `wss://` endpoint, query included (required).
    pub url: String,
    /// Extra headers on the upgrade request; `${NAME}` is read from the environment, as for
    /// `http`. Redacted when printed. A `User-Agent` here replaces tailrace's own.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// A text message sent right after every (re)connect (exchange feeds need one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subscribe: Option<String>,
    /// Give up a connection attempt (TCP, TLS and the upgrade's answer) after this long (ms).
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// No frame of any kind for this long (ms) means a stalled connection: it is reopened.
    #[serde(default = "default_idle_timeout_ms")]
    pub idle_timeout_ms: u64,
    /// Send a ping this often (ms); 0 = never.
    #[serde(default = "default_ping_interval_ms")]
    pub ping_interval_ms: u64,
    /// The first wait before a reconnect (ms); waits double up to `reconnect_max_ms`, with
    /// jitter.
    #[serde(default = "default_reconnect_min_ms")]
    pub reconnect_min_ms: u64,
    /// The longest wait between reconnects (ms).
    #[serde(default = "default_reconnect_max_ms")]
    pub reconnect_max_ms: u64,
    /// Largest frame, in bytes; 0 (the default) = the ingester's `max_event_bytes`. Larger
    /// frames become `too_large` dead letters without being held whole in memory.
    #[serde(default)]
    pub max_frame_bytes: usize,
    /// Resume from a cursor: `{ field = "time_us", param = "cursor" }` puts the last event's
    /// `time_us` into the `cursor` query parameter of every reconnect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<Resume>,
}

impl WebSocketConfig {
    /// A websocket source of `url` with every other setting at its default.
    pub fn new(url: impl Into<String>) -> Self {
        WebSocketConfig {
            url: url.into(),
            headers: BTreeMap::new(),
            subscribe: None,
            connect_timeout_ms: default_connect_timeout_ms(),
            idle_timeout_ms: default_idle_timeout_ms(),
            ping_interval_ms: default_ping_interval_ms(),
            reconnect_min_ms: default_reconnect_min_ms(),
            reconnect_max_ms: default_reconnect_max_ms(),
            max_frame_bytes: 0,
            resume: None,
        }
    }

    fn options(&self, headers: Vec<(String, String)>, max_line: usize) -> WebSocketOptions {
        let max_frame = if self.max_frame_bytes == 0 {
            max_line
        } else {
            self.max_frame_bytes
        };
        let mut o = WebSocketOptions::new(self.url.clone(), max_frame);
        o.headers = headers;
        o.subscribe = self.subscribe.clone();
        o.connect_timeout = Duration::from_millis(self.connect_timeout_ms);
        o.idle_timeout = Duration::from_millis(self.idle_timeout_ms);
        o.ping_interval =
            (self.ping_interval_ms > 0).then(|| Duration::from_millis(self.ping_interval_ms));
        o.reconnect_min = Duration::from_millis(self.reconnect_min_ms);
        o.reconnect_max = Duration::from_millis(self.reconnect_max_ms);
        o.resume = self.resume.clone();
        o
    }
}

impl SourceSettings for WebSocketConfig {
    fn validate(&self, at: &str, p: &mut Problems) {
        validate_headers(at, &self.headers, p);
        // The header values are checked above (their `${VAR}` are resolved at start); here
        // the rest, as the source itself would refuse it.
        if let Err(problems) = self.options(Vec::new(), 1).validate() {
            for e in problems {
                let (key, message) = match &e {
                    WebSocketError::Url(_) => ("url", e.to_string()),
                    WebSocketError::Header { .. } => continue,
                    WebSocketError::Resume => ("resume", e.to_string()),
                    WebSocketError::Timeout => ("idle_timeout_ms", e.to_string()),
                    WebSocketError::MaxFrame => ("max_frame_bytes", e.to_string()),
                };
                let message = message
                    .split_once(": ")
                    .filter(|(k, _)| *k == key)
                    .map_or(message.clone(), |(_, m)| m.to_owned());
                p.push(format!("{at}.{key}"), message);
            }
        }
        p.at_least(&format!("{at}.reconnect_min_ms"), self.reconnect_min_ms, 1);
        if self.reconnect_max_ms < self.reconnect_min_ms {
            p.push(
                format!("{at}.reconnect_max_ms"),
                format!(
                    "must be >= reconnect_min_ms = {} (got {})",
                    self.reconnect_min_ms, self.reconnect_max_ms
                ),
            );
        }
        if let Some(r) = &self.resume {
            p.field_path(&format!("{at}.resume.field"), &r.field);
        }
    }

    fn build(&self, name: &str, ctx: &BuildContext) -> Result<Box<dyn Source>, SourceError> {
        let headers = resolve_headers(name, ctx, &self.headers)?;
        Ok(Box::new(WebSocketSource::new(
            name,
            self.options(headers, ctx.max_line),
        )))
    }

    fn describe(&self) -> String {
        super::http::url_for_logs(&self.url)
    }

    fn redact(&mut self) {
        self.url = redact_url(&self.url);
        for value in self.headers.values_mut() {
            *value = REDACTED.to_owned();
        }
    }
}

/// The websocket source.
pub struct WebSocketSource {
    name: String,
    options: WebSocketOptions,
}

impl WebSocketSource {
    /// A websocket source (check the options with [`WebSocketOptions::validate`] first: with an
    /// unusable URL the source logs why and yields nothing).
    pub fn new(name: impl Into<String>, options: WebSocketOptions) -> Self {
        WebSocketSource {
            name: name.into(),
            options,
        }
    }
}

impl Source for WebSocketSource {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> &str {
        "websocket"
    }

    fn records(self: Box<Self>) -> BoxStream<'static, Raw> {
        self.positioned().map(|p| p.raw).boxed()
    }

    /// With `resume` set, each record's position is the cursor (the resume field of the last
    /// event handed over).
    fn positioned(self: Box<Self>) -> BoxStream<'static, Positioned> {
        run(self.name, self.options).boxed()
    }

    /// The stored cursor becomes `start`: the first connection asks for the events from it.
    fn resume(&mut self, position: &Value) {
        if self.options.resume.is_none() {
            return;
        }
        match stored_cursor(position) {
            Some(c) => self.options.start = Some(c),
            None => t::SourceProblem {
                source: &self.name,
                error_type: t::SourceErrorType::ResumePosition,
                detail: "the stored position is not a cursor; connecting without one".into(),
                ends: false,
            }
            .emit(),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Connecting
// ---------------------------------------------------------------------------------------

/// Where to connect, from the URL.
#[derive(Debug)]
struct Target {
    host: String,
    port: u16,
    tls: bool,
}

impl Target {
    fn parse(url: &str) -> Result<Target, WebSocketError> {
        let u = Url::parse(url).map_err(|e| WebSocketError::Url(e.to_string()))?;
        let tls = match u.scheme() {
            "ws" => false,
            "wss" => true,
            other => return Err(WebSocketError::Url(format!("scheme {other:?}"))),
        };
        let host = match u.host_str() {
            // `[::1]` in a URL, `::1` to connect to.
            Some(h) if !h.is_empty() => h.trim_start_matches('[').trim_end_matches(']').to_owned(),
            _ => return Err(WebSocketError::Url("no host".into())),
        };
        let port = u
            .port_or_known_default()
            .unwrap_or(if tls { 443 } else { 80 });
        Ok(Target { host, port, tls })
    }
}

/// The transport under tungstenite: TCP, or TLS over TCP, tapped (see `tap`).
type Transport = Tap<Either<TcpStream, TlsStream<TcpStream>>>;
type Ws = WebSocketStream<Transport>;

/// Why a connection attempt failed.
#[derive(Debug, thiserror::Error)]
enum ConnectError {
    #[error("cannot connect: {0}")]
    Tcp(std::io::Error),
    #[error("TLS handshake failed: {0}")]
    Tls(std::io::Error),
    #[error("TLS setup failed: {0}")]
    TlsConfig(String),
    #[error("the WebSocket upgrade failed: {0}")]
    Upgrade(tungstenite::Error),
    #[error("the server answered {status} instead of switching protocols")]
    Status {
        status: tungstenite::http::StatusCode,
        retry_after: Option<Duration>,
        body: String,
    },
    #[error("no answer within {} ms", .0.as_millis())]
    Timeout(Duration),
}

/// The rustls client config of every wss connection: ring, explicitly (so the process's
/// default provider does not matter), and the platform verifier reqwest uses.
fn tls_config() -> Result<Arc<rustls::ClientConfig>, String> {
    static CONFIG: OnceLock<Result<Arc<rustls::ClientConfig>, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            use rustls_platform_verifier::BuilderVerifierExt;
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .and_then(|b| b.with_platform_verifier())
                .map(|b| Arc::new(b.with_no_client_auth()))
                .map_err(|e| e.to_string())
        })
        .clone()
}

/// tungstenite's limits: frames and messages of at most `max_frame` bytes (the tap applies
/// the same limit to find what tungstenite refuses).
fn protocol_config(max_frame: usize) -> ProtocolConfig {
    ProtocolConfig::default()
        .max_frame_size(Some(max_frame))
        .max_message_size(Some(max_frame))
}

/// TCP, TLS for `wss`, and the upgrade, all within `connect_timeout`.
async fn connect(
    target: &Target,
    request: tungstenite::handshake::client::Request,
    max_frame: usize,
    timeout: Duration,
) -> Result<Ws, ConnectError> {
    let attempt = async {
        let tcp = TcpStream::connect((target.host.as_str(), target.port))
            .await
            .map_err(ConnectError::Tcp)?;
        // Events are small and must not wait for Nagle.
        let _ = tcp.set_nodelay(true);
        let stream = if target.tls {
            let config = tls_config().map_err(ConnectError::TlsConfig)?;
            let name = rustls::pki_types::ServerName::try_from(target.host.clone())
                .map_err(|e| ConnectError::TlsConfig(e.to_string()))?;
            let tls = TlsConnector::from(config)
                .connect(name, tcp)
                .await
                .map_err(ConnectError::Tls)?;
            Either::Right(tls)
        } else {
            Either::Left(tcp)
        };
        let tapped = Tap::new(stream, max_frame);
        let config = protocol_config(max_frame);
        match tokio_tungstenite::client_async_with_config(request, tapped, Some(config)).await {
            Ok((ws, _response)) => Ok(ws),
            Err(tungstenite::Error::Http(resp)) => {
                let retry_after = resp
                    .headers()
                    .get(header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| super::http::retry_after(v, SystemTime::now()))
                    .map(|d| d.min(MAX_RETRY_AFTER));
                Err(ConnectError::Status {
                    status: resp.status(),
                    retry_after,
                    body: excerpt(resp.body().as_deref().unwrap_or_default()),
                })
            }
            Err(e) => Err(ConnectError::Upgrade(e)),
        }
    };
    match tokio::time::timeout(timeout, attempt).await {
        Ok(r) => r,
        Err(_) => Err(ConnectError::Timeout(timeout)),
    }
}

/// A short, single-line excerpt of an error body.
fn excerpt(body: &[u8]) -> String {
    let cut = body.len() > EXCERPT_BYTES;
    let text: String = String::from_utf8_lossy(&body[..body.len().min(EXCERPT_BYTES)])
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    if cut { format!("{text}…") } else { text }
}

/// The upgrade request: the URL (with the cursor), the default `User-Agent`, the headers
/// (sensitive).
fn request(
    source: &str,
    url: &str,
    headers: &[(String, String)],
) -> Result<tungstenite::handshake::client::Request, tungstenite::Error> {
    let mut req = url.into_client_request()?;
    let map = req.headers_mut();
    map.insert(header::USER_AGENT, HeaderValue::from_static(USER_AGENT));
    for (name, value) in headers {
        // Checked by `validate`; an invalid one is skipped (its value is never echoed).
        match (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            (Ok(n), Ok(mut v)) => {
                v.set_sensitive(true);
                map.insert(n, v);
            }
            _ => t::SourceProblem {
                source,
                error_type: t::SourceErrorType::Request,
                detail: format!("header {name:?}: invalid name or value; not sent"),
                ends: false,
            }
            .emit(),
        }
    }
    Ok(req)
}

// ---------------------------------------------------------------------------------------
// The loop
// ---------------------------------------------------------------------------------------

/// The lines of a text frame as records (NDJSON rules: blank lines skipped, `\r\n` allowed).
fn lines(text: &[u8]) -> impl Iterator<Item = Raw> + '_ {
    text.split(|&b| b == b'\n').filter_map(|line| {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        framing::ndjson(Frame::Line(line.to_vec()))
    })
}

/// A dead letter for what the tap found (or, if it disagrees, what tungstenite said).
fn finding_record(found: Option<Finding>, fallback: RejectReason) -> Raw {
    match found {
        Some(Finding::TooLarge { prefix, .. }) => Raw::Invalid {
            bytes: prefix,
            reason: RejectReason::TooLarge,
        },
        Some(Finding::InvalidUtf8(bytes)) => Raw::Invalid {
            bytes,
            reason: RejectReason::InvalidUtf8,
        },
        Some(Finding::Cut(bytes)) => Raw::Invalid {
            bytes,
            reason: RejectReason::Truncated,
        },
        None => Raw::Invalid {
            bytes: Vec::new(),
            reason: fallback,
        },
    }
}

fn run(name: String, o: WebSocketOptions) -> impl Stream<Item = Positioned> + Send + 'static {
    async_stream::stream! {
        let shown_url = super::http::url_for_logs(&o.url);
        let target = match Target::parse(&o.url) {
            Ok(t) => t,
            Err(e) => {
                t::SourceProblem {
                    source: &name,
                    error_type: t::SourceErrorType::Setup,
                    detail: format!("{shown_url}: {e}"),
                    ends: true,
                }
                .emit();
                return;
            }
        };
        let max_frame = o.max_frame.max(1);
        let connected = t::SourceLink::new(&name);
        let duplicates = t::duplicates_dropped(&name);
        let mut backoff = Backoff::new(o.reconnect_min, o.reconnect_max);
        let mut resumer = o.resume.as_ref().map(|r| (r.param.clone(), Resumer::new(&r.field, o.start.clone())));
        let mut ever_connected = false;
        let at = |resumer: &Option<(String, Resumer)>| {
            resumer
                .as_ref()
                .and_then(|(_, r)| r.position())
                .map(|c| Value::String(c.to_owned()))
        };
        loop {
            let url = match &mut resumer {
                Some((param, r)) => match r.connecting() {
                    Some(cursor) => resume_url(&o.url, param, cursor),
                    None => o.url.clone(),
                },
                None => o.url.clone(),
            };
            let (ended, detail, wait): (ReconnectReason, String, Option<Duration>) = match request(&name, &url, &o.headers) {
                Err(e) => {
                    // Not a transient failure, but the stream must not end: log, back off, retry.
                    (ReconnectReason::ConnectError, format!("cannot build the upgrade request: {e}"), None)
                }
                Ok(req) => match connect(&target, req, max_frame, o.connect_timeout).await {
                    Err(ConnectError::Status { status, retry_after, body }) => {
                        let detail = format!("the server refused the WebSocket upgrade: {status} {body}");
                        (ReconnectReason::HttpStatus, detail, retry_after)
                    }
                    Err(e) => {
                        let first = if ever_connected { "" } else { " (never connected yet: check the url and that the server is up)" };
                        (ReconnectReason::ConnectError, format!("cannot connect{first}: {e}"), None)
                    }
                    Ok(mut ws) => {
                        ever_connected = true;
                        connected.up();
                        tracing::info!(source = %name, url = %shown_url, "connected");
                        let mut healthy = false;
                        let mut unsubscribed = None;
                        if let Some(sub) = &o.subscribe
                            && let Err(e) = ws.send(Message::text(sub.as_str())).await
                        {
                            unsubscribed = Some(format!("cannot send the subscribe message: {e}"));
                        }
                        let mut ping = o.ping_interval.filter(|p| !p.is_zero()).map(|p| {
                            let mut i = tokio::time::interval_at(Instant::now() + p, p);
                            i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                            i
                        });
                        let mut deadline = Instant::now() + o.idle_timeout;
                        let ended = loop {
                            if let Some(detail) = unsubscribed.take() {
                                break (ReconnectReason::ReadError, detail);
                            }
                            let next = tokio::select! {
                                biased;
                                m = ws.next() => Some(m),
                                _ = tokio::time::sleep_until(deadline) => None,
                                _ = async { match &mut ping { Some(p) => { p.tick().await; } None => std::future::pending().await } } => {
                                    if let Err(e) = ws.send(Message::Ping(Default::default())).await {
                                        break (ReconnectReason::ReadError, format!("cannot send a ping: {e}"));
                                    }
                                    continue;
                                }
                            };
                            let message = match next {
                                None => {
                                    if let Some(cut) = ws.get_mut().tracker.take_cut() {
                                        yield Positioned { raw: finding_record(Some(cut), RejectReason::Truncated), position: at(&resumer) };
                                    }
                                    let detail = format!("no frame for {} ms: the connection is stalled", o.idle_timeout.as_millis());
                                    break (ReconnectReason::IdleTimeout, detail);
                                }
                                Some(None) => {
                                    break (ReconnectReason::Closed, "the connection ended".to_owned());
                                }
                                Some(Some(Ok(m))) => m,
                                Some(Some(Err(e))) => {
                                    let tap = ws.get_mut();
                                    if matches!(e, tungstenite::Error::Capacity(_)) {
                                        tap.fill_prefix(o.idle_timeout.min(PREFIX_WAIT)).await;
                                    }
                                    let tracker = &mut tap.tracker;
                                    let detail = match e {
                                        tungstenite::Error::Capacity(CapacityError::MessageTooLong { size, max_size }) => {
                                            let found = tracker.take_bad().filter(|f| matches!(f, Finding::TooLarge { .. }));
                                            yield Positioned { raw: finding_record(found, RejectReason::TooLarge), position: at(&resumer) };
                                            format!("a message of {size} bytes is over the limit of {max_size}; kept its first bytes as a dead letter (tungstenite cannot skip the rest of it)")
                                        }
                                        tungstenite::Error::Utf8(detail) => {
                                            // The tap finds every text message that is not UTF-8; what else
                                            // tungstenite refuses so is a close frame's reason: no event.
                                            match tracker.take_bad().filter(|f| matches!(f, Finding::InvalidUtf8(_))) {
                                                Some(found) => {
                                                    yield Positioned { raw: finding_record(Some(found), RejectReason::InvalidUtf8), position: at(&resumer) };
                                                    format!("a text message is not UTF-8 ({detail}); kept it as a dead letter (the protocol requires closing)")
                                                }
                                                None => "the server closed the connection with a reason that is not UTF-8".to_owned(),
                                            }
                                        }
                                        tungstenite::Error::Protocol(ProtocolError::ResetWithoutClosingHandshake) if !tracker.mid_frame() => {
                                            break (ReconnectReason::Closed, "the server closed the connection without a close frame".to_owned());
                                        }
                                        e => {
                                            if let Some(cut) = tracker.take_cut() {
                                                yield Positioned { raw: finding_record(Some(cut), RejectReason::Truncated), position: at(&resumer) };
                                            }
                                            let how = if matches!(e, tungstenite::Error::Protocol(ProtocolError::ResetWithoutClosingHandshake)) {
                                                "the connection was cut inside a frame".to_owned()
                                            } else {
                                                e.to_string()
                                            };
                                            format!("read failed: {how}")
                                        }
                                    };
                                    break (ReconnectReason::ReadError, detail);
                                }
                            };
                            match message {
                                Message::Text(text) => {
                                    for raw in lines(text.as_bytes()) {
                                        if let (Raw::Bytes(b), Some((_, r))) = (&raw, &mut resumer)
                                            && r.admit(b) == Verdict::Duplicate
                                        {
                                            duplicates.increment(1);
                                            continue;
                                        }
                                        yield Positioned { raw, position: at(&resumer) };
                                    }
                                }
                                Message::Binary(bytes) => {
                                    let keep = bytes.len().min(PREFIX_BYTES);
                                    yield Positioned { raw: Raw::Invalid { bytes: bytes[..keep].to_vec(), reason: RejectReason::BinaryFrame }, position: at(&resumer) };
                                }
                                Message::Close(frame) => {
                                    let why = frame.map(|f| {
                                        let reason: String = f.reason.chars().take(123).collect();
                                        format!("{} {}", u16::from(f.code), reason)
                                    }).unwrap_or_else(|| "no code".into());
                                    // Sends tungstenite's reply to the close and waits for the end.
                                    let _ = tokio::time::timeout(CLOSE_GRACE, ws.close(None)).await;
                                    break (ReconnectReason::Closed, format!("the server closed the connection ({})", why.trim_end()));
                                }
                                Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => {}
                            }
                            if !healthy {
                                // A frame that is not a close: the server works, so the next
                                // reconnect waits the shortest time again.
                                healthy = true;
                                backoff.reset();
                            }
                            // Time spent handing records over (backpressure) is not idleness.
                            deadline = Instant::now() + o.idle_timeout;
                        };
                        connected.down();
                        (ended.0, ended.1, None)
                    }
                },
            };
            let delay = wait.unwrap_or_else(|| backoff.next_wait());
            t::SourceReconnecting { source: &name, target: &shown_url, reason: ended, detail, delay }.emit();
            tokio::time::sleep(delay).await;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn text_frames_split_into_ndjson_lines() {
        let got: Vec<Raw> = lines(b"{\"a\":1}\r\n\n  \n{\"b\":2}\nnot json").collect();
        assert_eq!(
            got,
            vec![
                Raw::Bytes(b"{\"a\":1}".to_vec()),
                Raw::Bytes(b"{\"b\":2}".to_vec()),
                Raw::Bytes(b"not json".to_vec()),
            ]
        );
        assert_eq!(lines(b"").count(), 0);
    }

    #[test]
    fn options_are_validated_and_never_print_secrets() {
        let mut o = WebSocketOptions::new("wss://h.example/s?token=q-71c3e", 1000);
        assert_eq!(o.validate(), Ok(()));
        o.headers
            .push(("Authorization".into(), "Bearer tok-93f2b".into()));
        let shown = format!("{o:?}");
        assert!(
            !shown.contains("tok-93f2b") && !shown.contains("q-71c3e"),
            "{shown}"
        );
        o.url = "https://h.example/s".into();
        o.headers.push(("bad header".into(), "x".into()));
        o.resume = Some(Resume {
            field: "a..b".into(),
            param: "cursor".into(),
        });
        o.max_frame = 0;
        let problems = o.validate().unwrap_err();
        assert_eq!(problems.len(), 4, "{problems:?}");
        assert!(matches!(problems[0], WebSocketError::Url(_)));
    }

    #[test]
    fn the_tls_config_builds() {
        // The provider is ring by construction; `cargo tree -p ingest -i aws-lc-rs` proves no
        // other one is built. Here: the platform verifier initialises.
        assert!(tls_config().is_ok(), "{:?}", tls_config().err());
    }
}
