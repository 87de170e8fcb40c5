//! Wikimedia EventStreams, `recentchange`, as KafkaSSE serves it.
//!
//! From the public documentation (wikitech "Event Platform/EventStreams", the
//! `mediawiki/recentchange/1.0.0` schema, KafkaSSE's README and `SSEResponse`):
//! - `GET /v2/stream/recentchange` answers `text/event-stream`; the body starts with `:ok`;
//! - each change is `event: message`, `id: <JSON array of {topic, partition, timestamp |
//!   offset}>` (one entry per datacenter topic; the timestamp is the Kafka timestamp of the
//!   message plus one, so resuming from it starts after it), and `data: <one-line JSON>`;
//! - a reconnect sends the last id back as `Last-Event-ID`; the server resumes there;
//! - the server closes streams on its own (every few minutes in production; here every few
//!   hundred events), sometimes after an `event: error`;
//! - requests without a `User-Agent` are refused with 403 (Wikimedia's User-Agent policy).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Response, StatusCode};
use serde_json::{Value, json};

use super::{Rng, Served, TEXTS, long_text};

/// The eqiad topic, the one the replay's messages come from.
const TOPIC: &str = "eqiad.mediawiki.recentchange";
/// Kafka timestamp (ms) of event 0.
const T0_MS: u64 = 1_714_564_800_000;

/// Wikis, the busiest first (database name, domain); events pick them long-tailed, and a
/// long tail of small wikis follows.
const WIKIS: &[(&str, &str)] = &[
    ("wikidatawiki", "www.wikidata.org"),
    ("commonswiki", "commons.wikimedia.org"),
    ("enwiki", "en.wikipedia.org"),
    ("dewiki", "de.wikipedia.org"),
    ("frwiki", "fr.wikipedia.org"),
    ("jawiki", "ja.wikipedia.org"),
    ("ruwiki", "ru.wikipedia.org"),
    ("eswiki", "es.wikipedia.org"),
    ("zhwiki", "zh.wikipedia.org"),
    ("arwiki", "ar.wikipedia.org"),
    ("hewiki", "he.wikipedia.org"),
    ("fawiki", "fa.wikipedia.org"),
    ("kowiki", "ko.wikipedia.org"),
    ("hiwiki", "hi.wikipedia.org"),
    ("thwiki", "th.wikipedia.org"),
    ("elwiktionary", "el.wiktionary.org"),
    ("enwikisource", "en.wikisource.org"),
    ("metawiki", "meta.wikimedia.org"),
];

const USERS: &[&str] = &[
    "InternetArchiveBot",
    "Cewbot",
    "Example",
    "山田太郎",
    "Алексей Петров",
    "محمد",
    "דוד",
    "Ἀριστοτέλης",
    "Émilie Dupont",
    "🦊 Fox",
    "$money",
    "dot.user",
    "192.0.2.44",
    "2001:db8::1f",
];

const TITLES: &[&str] = &[
    "Main Page",
    "東京都",
    "Москва",
    "القاهرة",
    "ירושלים",
    "File:Example 🌸.jpg",
    "Category:1990s births",
    "Talk:$100 bill",
    "Ω-3 fatty acid",
    "กรุงเทพมหานคร",
    "User:Example/sandbox",
];

/// Event `i` of the replay: an edit, a page creation, a log action or a categorization, with
/// the recentchange schema's fields. Every 97th is a big log event (~30 KB of `log_params`).
pub fn event(i: usize) -> Value {
    let mut rng = Rng::new(0x57ed_0000 + i as u64);
    let (wiki, domain) = if rng.chance(0.9) {
        let (w, d) = rng.pick(WIKIS);
        (w.to_string(), d.to_string())
    } else {
        // The long tail: ~300 small wikis.
        let n = rng.long_tail(300);
        (format!("x{n}wiktionary"), format!("x{n}.wiktionary.org"))
    };
    let user = if rng.chance(0.5) {
        rng.pick(USERS).to_string()
    } else {
        format!("Editor{}", rng.long_tail(100_000))
    };
    let title = if wiki == "wikidatawiki" {
        format!("Q{}", 1 + rng.long_tail(120_000_000))
    } else if rng.chance(0.5) {
        rng.pick(TITLES).to_string()
    } else {
        format!("{} {}", rng.pick(TITLES), rng.long_tail(10_000))
    };
    let ts_ms = T0_MS + i as u64 * 7;
    let kind = if i.is_multiple_of(97) {
        "log"
    } else {
        *rng.pick(&["edit", "edit", "new", "log", "categorize"])
    };
    let namespace = match kind {
        "categorize" => 14,
        _ if title.starts_with("File:") => 6,
        _ if title.starts_with("Talk:") => 1,
        _ => 0,
    };
    let server = format!("https://{domain}");
    let comment = format!("/* {} */ {}", rng.pick(TITLES), rng.pick(TEXTS));
    let mut e = json!({
        "$schema": "/mediawiki/recentchange/1.0.0",
        "meta": {
            "uri": format!("{server}/wiki/{}", title.replace(' ', "_")),
            "request_id": format!("{:016x}-{:04x}", rng.next_u64(), i),
            "id": format!("{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}", rng.next_u64() as u32, i & 0xffff, i & 0xfff, rng.below(4096), rng.next_u64() & 0xffff_ffff_ffff),
            "dt": humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ts_ms)).to_string(),
            "domain": domain,
            "stream": "mediawiki.recentchange",
            "topic": TOPIC,
            "partition": 0,
            "offset": 5_136_683_866u64 + i as u64,
        },
        "id": 1_754_871_325u64 + i as u64,
        "type": kind,
        "namespace": namespace,
        "title": title,
        "title_url": format!("{server}/wiki/{}", title.replace(' ', "_")),
        "comment": comment,
        "timestamp": ts_ms / 1000,
        "user": user,
        "bot": user.ends_with("Bot") || user == "Cewbot",
        "server_url": server,
        "server_name": domain,
        "server_script_path": "/w",
        "wiki": wiki,
        "parsedcomment": format!("<span dir=\"auto\"><span class=\"autocomment\">{}</span></span>", rng.pick(TEXTS)),
    });
    match kind {
        "edit" | "new" => {
            let new_len = 200 + rng.long_tail(400_000) as u64;
            let rev = 1_200_000_000u64 + i as u64;
            e["minor"] = json!(rng.chance(0.3));
            e["patrolled"] = json!(rng.chance(0.6));
            if kind == "edit" {
                let old_len =
                    new_len.saturating_sub(rng.below(2_000) as u64) + rng.below(500) as u64;
                e["length"] = json!({"old": old_len, "new": new_len});
                e["revision"] = json!({"old": rev - 1 - rng.below(1000) as u64, "new": rev});
                e["notify_url"] =
                    json!(format!("{server}/w/index.php?diff={rev}&oldid={}", rev - 1));
            } else {
                e["length"] = json!({"new": new_len});
                e["revision"] = json!({"new": rev});
            }
        }
        "log" => {
            e["log_id"] = json!(160_000_000u64 + i as u64);
            e["log_type"] = json!(*rng.pick(&["upload", "move", "delete", "block", "newusers"]));
            e["log_action"] = json!(*rng.pick(&["upload", "move", "delete", "block", "create"]));
            e["log_action_comment"] = json!(rng.pick(TEXTS));
            // `log_params` is free-form: keys as MediaWiki's log formatters write them, a
            // dotted one, and (every 97th event) a big one.
            let mut params = json!({
                "4::target": rng.pick(TITLES),
                "5::noredir": "0",
                "img_sha1": format!("{:040x}", rng.next_u64()),
                "img_timestamp": "20240501120000",
                "key.with.dots": {"$nested": true},
            });
            if i.is_multiple_of(97) {
                params["summary"] = json!(long_text(&mut rng, 10_000));
            }
            e["log_params"] = params;
        }
        _ => {}
    }
    e
}

/// The `id:` KafkaSSE writes after event `i` (timestamp + 1: resume after it). Byte for byte
/// as JSON.stringify writes it.
pub fn id_after(i: usize) -> String {
    let ts = T0_MS + i as u64 * 7 + 1;
    format!(
        r#"[{{"topic":"{TOPIC}","partition":0,"timestamp":{ts}}},{{"topic":"codfw.mediawiki.recentchange","partition":0,"offset":-1}}]"#
    )
}

/// The first event at or after the `Last-Event-ID` a client sent (KafkaSSE assigns the
/// partition at the offset for that timestamp: the first message with a timestamp >= it).
fn resume_index(last_event_id: &str) -> Result<usize, String> {
    let v: Value = serde_json::from_str(last_event_id).map_err(|e| format!("not JSON: {e}"))?;
    let ts = v
        .as_array()
        .and_then(|a| a.iter().find(|p| p["topic"] == TOPIC))
        .and_then(|p| p["timestamp"].as_u64())
        .ok_or("no timestamp for the eqiad topic")?;
    Ok(ts.saturating_sub(T0_MS).div_ceil(7) as usize)
}

/// The replay server.
pub struct Server {
    /// What it served.
    pub served: Arc<Served>,
    /// Its address.
    pub addr: SocketAddr,
    /// Every `Last-Event-ID` received, and the id the previous connection ended with.
    pub resumes: Arc<std::sync::Mutex<Vec<(String, String)>>>,
}

struct Inner {
    events: Vec<Value>,
    /// Connection `k` serves this many events, then closes.
    per_connection: Box<dyn Fn(usize) -> usize + Send + Sync>,
    served: Arc<Served>,
    resumes: Arc<std::sync::Mutex<Vec<(String, String)>>>,
    /// The id the last connection sent last, and the number of connections so far.
    last: std::sync::Mutex<(Option<String>, usize)>,
}

impl Server {
    /// Serves `n` events; connection `k` closes after `per_connection(k)` of them (after an
    /// `event: error` on every third connection); after the last event it stays open.
    pub async fn start(
        n: usize,
        per_connection: impl Fn(usize) -> usize + Send + Sync + 'static,
    ) -> Server {
        let served = Arc::new(Served::default());
        let resumes = Arc::new(std::sync::Mutex::new(Vec::new()));
        let inner = Arc::new(Inner {
            events: (0..n).map(event).collect(),
            per_connection: Box::new(per_connection),
            served: served.clone(),
            resumes: resumes.clone(),
            last: std::sync::Mutex::new((None, 0)),
        });
        let app = axum::Router::new()
            .route("/v2/stream/recentchange", axum::routing::get(stream))
            .with_state(inner);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Server {
            served,
            addr,
            resumes,
        }
    }
}

async fn stream(State(s): State<Arc<Inner>>, headers: HeaderMap) -> Response<Body> {
    let Some(ua) = headers.get("user-agent").and_then(|v| v.to_str().ok()) else {
        s.served
            .refused
            .lock()
            .unwrap()
            .push("no User-Agent".into());
        // The policy's answer, as Wikimedia's edge gives it.
        return Response::builder()
            .status(StatusCode::FORBIDDEN)
            .header("content-type", "text/plain")
            .body(Body::from(
                "Please set a user-agent and respect our robot policy https://w.wiki/4wJS. See also T400119.\n",
            ))
            .unwrap();
    };
    let ua = ua.to_owned();
    let last_id = headers
        .get("last-event-id")
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let (k, previous) = {
        let mut last = s.last.lock().unwrap();
        last.1 += 1;
        (last.1 - 1, last.0.clone())
    };
    let from = match &last_id {
        Some(id) => {
            s.resumes
                .lock()
                .unwrap()
                .push((id.clone(), previous.unwrap_or_default()));
            match resume_index(id) {
                Ok(i) => i,
                Err(e) => {
                    return Response::builder()
                        .status(StatusCode::BAD_REQUEST)
                        .body(Body::from(format!(
                            "{{\"message\":\"Invalid Last-Event-ID: {e}\"}}"
                        )))
                        .unwrap();
                }
            }
        }
        None => 0,
    };
    let until = (from + (s.per_connection)(k)).min(s.events.len());
    s.served.connection(format!(
        "connection {k}: user-agent {ua:?}, last-event-id {last_id:?}: events {from}..{until}"
    ));
    let body = async_stream::stream! {
        yield Ok::<_, std::convert::Infallible>(Bytes::from_static(b":ok\n\n"));
        for i in from..until {
            let e = &s.events[i];
            let id = id_after(i);
            s.served.sent(e);
            s.last.lock().unwrap().0 = Some(id.clone());
            yield Ok(Bytes::from(format!("event: message\nid: {id}\ndata: {e}\n\n")));
        }
        if until == s.events.len() {
            // Live: nothing new for now; the connection stays open.
            futures::future::pending::<()>().await;
        } else if k % 3 == 2 {
            let id = s.last.lock().unwrap().0.clone().unwrap_or_default();
            yield Ok(Bytes::from(format!(
                "event: error\nid: {id}\ndata: {{\"message\":\"KafkaSSE: consumer rebalanced\",\"name\":\"KafkaSSE\"}}\n\n"
            )));
        }
    };
    Response::builder()
        .status(200)
        .header("content-type", "text/event-stream; charset=utf-8")
        .header("cache-control", "no-cache")
        .body(Body::from_stream(body))
        .unwrap()
}
