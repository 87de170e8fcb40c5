//! Local replays of public streams, for `real_streams.rs`: for each service, a generator of
//! events shaped like its published schema and a server on 127.0.0.1:0 that speaks its wire
//! format, built from the service's public documentation (no network, nothing recorded):
//!
//! - [`wikimedia`]: EventStreams `recentchange` (`mediawiki/recentchange/1.0.0`) over SSE as
//!   KafkaSSE writes it: `:ok`, `event: message`, JSON-array ids, resume by `Last-Event-ID`,
//!   a server-side close every few hundred events, 403 without a `User-Agent`;
//! - [`jetstream`]: Bluesky Jetstream over WebSocket: `commit`/`identity`/`account` events,
//!   `$type` at every level, `cursor` replay (inclusive) after a server-side close;
//! - [`mastodon`]: the streaming API's public timeline over SSE: `update`, `delete` (a bare
//!   id), `status.update`, `:thump` heartbeats, a bearer token required.
//!
//! Each server records what it served (events, per connection) so a test can hold the
//! pipeline to "every served event stored exactly once, or counted as a duplicate".
//! Generators are deterministic ([`Rng`]), with the long tails and scripts of real data.

#![allow(dead_code, clippy::unwrap_used)]

pub mod jetstream;
pub mod mastodon;
pub mod wikimedia;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use serde_json::Value;
use tokio::sync::watch;

/// A small deterministic generator (SplitMix64): the fixtures are the same on every run and
/// platform, and need no dependency.
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// `true` with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// A rank in `0..n` with a long tail: rank r has probability about ∝ 1/(r+1) (Zipf-like),
    /// by inverting the log-uniform law.
    pub fn long_tail(&mut self, n: usize) -> usize {
        (((n as f64 + 1.0).powf(self.unit()) - 1.0) as usize).min(n - 1)
    }

    /// One element of `items`, long-tailed by position (the first ones are the common ones).
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.long_tail(items.len())]
    }
}

/// Short texts in many scripts, with the Unicode real posts carry: emoji with ZWJ and skin
/// tones, flags, RTL with marks, combining characters, CJK, quotes and backslashes, a text
/// that looks like a dotted `$` key.
pub const TEXTS: &[&str] = &[
    "Just shipped it 🚀 thanks everyone!",
    "今日は良い天気ですね 🌸 #東京",
    "שלום עולם! مرحبا بالعالم \u{200f}(RTL)",
    "Привет, мир 👋🏽 как дела?",
    "🦀🦀🦀 rustaceans unite",
    "नमस्ते दुनिया — हिन्दी में लिखा",
    "สวัสดีชาวโลก 🇹🇭",
    "a $dollar.dotted text with \"quotes\" and \\ backslash",
    "👨‍👩‍👧‍👦 family, 🏳️‍🌈 flag, e\u{301} combining, 🏴󠁧󠁢󠁥󠁮󠁧󠁿",
    "오늘 저녁 뭐 먹지? 🍜",
    "Ελληνικά: καλημέρα κόσμε",
    "中文测试：实时事件流 💬",
    "Z̴̡̢a̶̛l̷g̸o̵ ̷t̴e̷x̸t̷",
    "line one\nline two\ttabbed",
    "فارسی: سلام دنیا، می‌خواهم",
    "Ünïcödé façade naïve café résumé",
];

/// A long text (a few KB to tens of KB) built from [`TEXTS`], for big documents.
pub fn long_text(rng: &mut Rng, chars_at_least: usize) -> String {
    let mut s = String::new();
    while s.chars().count() < chars_at_least {
        let text: &&str = rng.pick(TEXTS);
        s.push_str(text);
        s.push(' ');
    }
    s
}

/// What a replay server served, shared with the test.
#[derive(Default)]
pub struct Served {
    /// Every event sent, in order, across connections (replays included).
    pub events: Mutex<Vec<Value>>,
    /// One line per connection: what it asked for and what it got, for failure messages.
    pub connections: Mutex<Vec<String>>,
    /// Requests refused (no User-Agent, no token), with why.
    pub refused: Mutex<Vec<String>>,
    /// The number of events sent so far (to wait on).
    pub count: watch::Sender<usize>,
    /// When the first event was sent (the start of a throughput measurement).
    pub first_at: Mutex<Option<Instant>>,
}

impl Served {
    /// Records an event as sent.
    pub fn sent(&self, event: &Value) {
        self.first_at
            .lock()
            .unwrap()
            .get_or_insert_with(Instant::now);
        self.events.lock().unwrap().push(event.clone());
        self.count.send_modify(|c| *c += 1);
    }

    /// Notes a connection.
    pub fn connection(&self, line: String) {
        self.connections.lock().unwrap().push(line);
    }

    /// Every event sent so far.
    pub fn all(&self) -> Vec<Value> {
        self.events.lock().unwrap().clone()
    }

    /// The connections so far, one per line.
    pub fn describe(&self) -> String {
        self.connections.lock().unwrap().join("\n")
    }
}

/// Writes `config/examples/<name>.toml` into `dir` with its source's URL pointed at `url`
/// (everything else as shipped: indexes, rollups, statistics, events, headers), and returns
/// the path. The data directory and the listen address come from the test's environment.
pub fn example_config(name: &str, url: &str, dir: &Path) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let path = root.join("config/examples").join(format!("{name}.toml"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let mut config: toml::Table = toml::from_str(&text).unwrap();
    let sources = config["sources"].as_array_mut().unwrap();
    let source = sources[0].as_table_mut().unwrap();
    source.insert("url".into(), toml::Value::String(url.to_owned()));
    let out = dir.join(format!("{name}.toml"));
    std::fs::write(&out, toml::to_string(&config).unwrap()).unwrap();
    out
}

/// The example's URL with its scheme (`https` → `http`, `wss` → `ws`), host and port replaced
/// by the local server's; path and query kept.
pub fn local_url(example: &str, addr: std::net::SocketAddr) -> String {
    let mut url = reqwest::Url::parse(example).unwrap();
    let scheme = match url.scheme() {
        "https" => "http",
        "wss" => "ws",
        other => other,
    }
    .to_owned();
    url.set_scheme(&scheme).unwrap();
    url.set_host(Some(&addr.ip().to_string())).unwrap();
    url.set_port(Some(addr.port())).unwrap();
    url.to_string()
}

/// The source URL of an example configuration.
pub fn example_url(name: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let text =
        std::fs::read_to_string(root.join("config/examples").join(format!("{name}.toml"))).unwrap();
    let config: toml::Table = toml::from_str(&text).unwrap();
    config["sources"][0]["url"].as_str().unwrap().to_owned()
}
