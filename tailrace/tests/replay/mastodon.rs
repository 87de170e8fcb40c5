//! A Mastodon server's streaming API, public timeline, as its documentation describes it
//! (docs.joinmastodon.org, "streaming" methods and the Status entity):
//! - `GET /api/v1/streaming/public` with `Authorization: Bearer <token>` (401 without);
//! - server-sent events: `event: update` with a Status as data, `event: delete` with the
//!   bare id of a deleted status, `event: status.update` with an edited Status; `:thump`
//!   comment heartbeats; no `id:` (the stream cannot be resumed: it is live);
//! - a Status: string ids, HTML `content`, `account` (with `acct`, `display_name` in any
//!   script, `followers_count`), `tags` as `{name, url}` objects, `media_attachments` with
//!   `meta`, custom `emojis`, `language` (or null).
//!
//! Here the stream is "live" but loses nothing between connections: each connection continues
//! where the previous one stopped (a real server would not replay what was missed).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Response, StatusCode};
use serde_json::{Value, json};

use super::{Rng, Served, TEXTS, long_text};

/// What the stream carries, in order.
#[derive(Clone, Debug)]
pub enum Item {
    /// `event: update`: a new status.
    Update(Value),
    /// `event: delete`: the id of a deleted status.
    Delete(String),
    /// `event: status.update`: an edited status.
    Edit(Value),
}

const TAGS: &[&str] = &[
    "rust",
    "Fediverse",
    "photography",
    "東京",
    "caturday",
    "MastoArt",
    "café",
];
const ACCOUNTS: &[(&str, &str)] = &[
    ("Gargron", "Eugen Rochko"),
    ("alice@example.social", "Alice 🌈"),
    ("山田@mstdn.jp", "山田太郎"),
    ("user@mastodon.online", "Юлия"),
    ("news@press.example", "News Bot 🤖"),
    ("rtl@toot.example", "سارا"),
];

/// Status `i` (ids increase, as Mastodon's snowflakes do).
pub fn status(i: usize, rng: &mut Rng) -> Value {
    let id = (113_270_115_826_048_975u64 + i as u64 * 65_536).to_string();
    let (acct, name) = if rng.chance(0.5) {
        let (a, n) = rng.pick(ACCOUNTS);
        (a.to_string(), n.to_string())
    } else {
        let n = rng.long_tail(500_000);
        (
            format!("user{n}@instance{}.example", n % 97),
            format!("User {n} ✨"),
        )
    };
    let mut text = rng.pick(TEXTS).to_string();
    if i.is_multiple_of(83) {
        text = long_text(rng, 5_000);
    }
    let tags: Vec<Value> = (0..rng.long_tail(4))
        .map(|_| {
            let t = rng.pick(TAGS);
            json!({"name": t.to_lowercase(), "url": format!("https://mastodon.social/tags/{t}")})
        })
        .collect();
    let followers = rng.long_tail(3_000_000);
    let language = if rng.chance(0.15) {
        Value::Null
    } else {
        json!(*rng.pick(&["en", "de", "ja", "fr", "es", "fa", "he", "pt"]))
    };
    let media: Vec<Value> = if rng.chance(0.2) {
        vec![json!({
            "id": format!("{}", 22_345_792u64 + i as u64), "type": "image",
            "url": "https://files.mastodon.social/media_attachments/original/photo.jpg",
            "preview_url": "https://files.mastodon.social/media_attachments/small/photo.jpg",
            "meta": {"original": {"width": 640, "height": 480, "size": "640x480", "aspect": 1.3333333333333333},
                     "focus": {"x": -0.42, "y": 0.69}},
            "description": rng.pick(TEXTS), "blurhash": "UFBWY:8_0Jxv4mx]t8t64.%M-:IUWGWAt6M}",
        })]
    } else {
        vec![]
    };
    json!({
        "id": id,
        "created_at": "2024-05-01T12:00:00.000Z",
        "in_reply_to_id": null,
        "in_reply_to_account_id": null,
        "sensitive": rng.chance(0.05),
        "spoiler_text": "",
        "visibility": "public",
        "language": language,
        "uri": format!("https://mastodon.social/users/x/statuses/{id}"),
        "url": format!("https://mastodon.social/@x/{id}"),
        "replies_count": 0,
        "reblogs_count": 0,
        "favourites_count": 0,
        "edited_at": null,
        "content": format!("<p>{}</p>", text.replace('&', "&amp;").replace('<', "&lt;")),
        "reblog": null,
        "application": {"name": "Web", "website": null},
        "account": {
            "id": format!("{}", 109_000_000_000u64 + followers as u64),
            "username": acct.split('@').next().unwrap_or(&acct),
            "acct": acct,
            "display_name": name,
            "locked": false, "bot": acct.starts_with("news"), "discoverable": true, "group": false,
            "created_at": "2022-11-05T00:00:00.000Z",
            "note": "<p>Hello 👋</p>",
            "followers_count": followers,
            "following_count": rng.below(5000),
            "statuses_count": rng.long_tail(100_000),
            "emojis": [{"shortcode": "blobcat", "url": "https://files.mastodon.social/custom_emojis/blobcat.png",
                        "static_url": "https://files.mastodon.social/custom_emojis/blobcat.png", "visible_in_picker": true}],
            "fields": [{"name": "Web", "value": "<a href=\"https://example.org\">example.org</a>", "verified_at": null}],
        },
        "media_attachments": media,
        "mentions": [],
        "tags": tags,
        "emojis": [],
        "card": null,
        "poll": null,
    })
}

/// The stream: `n` new statuses (`update`), with deletes of earlier ones and edits between.
pub fn items(n: usize) -> Vec<Item> {
    let mut rng = Rng::new(0x3a57_0d00);
    let mut out = Vec::new();
    let mut ids: Vec<String> = Vec::new();
    for i in 0..n {
        let s = status(i, &mut rng);
        ids.push(s["id"].as_str().unwrap().to_owned());
        out.push(Item::Update(s.clone()));
        if rng.chance(0.08) {
            out.push(Item::Delete(ids[rng.below(ids.len())].clone()));
        }
        if rng.chance(0.03) {
            let mut edited = s;
            edited["edited_at"] = json!("2024-05-01T12:01:00.000Z");
            out.push(Item::Edit(edited));
        }
    }
    out
}

/// The replay server.
pub struct Server {
    /// What it served: the `update` statuses in `events`, connections, refusals.
    pub served: Arc<Served>,
    /// Its address.
    pub addr: SocketAddr,
    /// Deletes and edits sent.
    pub others: Arc<std::sync::Mutex<(usize, usize)>>,
}

struct Inner {
    items: Vec<Item>,
    token: String,
    per_connection: Box<dyn Fn(usize) -> usize + Send + Sync>,
    served: Arc<Served>,
    others: Arc<std::sync::Mutex<(usize, usize)>>,
    /// The next item, and the number of connections so far.
    cursor: std::sync::Mutex<(usize, usize)>,
}

impl Server {
    /// Serves `items` to clients presenting `Bearer <token>`; connection `k` closes after
    /// `per_connection(k)` items; the one that reaches the end stays open.
    pub async fn start(
        items: Vec<Item>,
        token: &str,
        per_connection: impl Fn(usize) -> usize + Send + Sync + 'static,
    ) -> Server {
        let served = Arc::new(Served::default());
        let others = Arc::new(std::sync::Mutex::new((0, 0)));
        let inner = Arc::new(Inner {
            items,
            token: token.to_owned(),
            per_connection: Box::new(per_connection),
            served: served.clone(),
            others: others.clone(),
            cursor: std::sync::Mutex::new((0, 0)),
        });
        let app = axum::Router::new()
            .route("/api/v1/streaming/public", axum::routing::get(stream))
            .with_state(inner);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Server {
            served,
            addr,
            others,
        }
    }
}

async fn stream(State(s): State<Arc<Inner>>, headers: HeaderMap) -> Response<Body> {
    let auth = headers.get("authorization").and_then(|v| v.to_str().ok());
    if auth != Some(&format!("Bearer {}", s.token)) {
        s.served
            .refused
            .lock()
            .unwrap()
            .push(format!("authorization {:?}", auth.map(|a| a.len())));
        return Response::builder()
            .status(StatusCode::UNAUTHORIZED)
            .header("content-type", "application/json")
            .body(Body::from("{\"error\":\"Missing access token\"}"))
            .unwrap();
    }
    let (from, k) = {
        let c = s.cursor.lock().unwrap();
        (c.0, c.1)
    };
    let until = (from + (s.per_connection)(k)).min(s.items.len());
    {
        let mut c = s.cursor.lock().unwrap();
        *c = (until, k + 1);
    }
    s.served
        .connection(format!("connection {k}: items {from}..{until}"));
    let body = async_stream::stream! {
        yield Ok::<_, std::convert::Infallible>(Bytes::from_static(b":)\n\n"));
        for (j, item) in s.items[from..until].iter().enumerate() {
            if j % 50 == 49 {
                yield Ok(Bytes::from_static(b":thump\n\n"));
            }
            let text = match item {
                Item::Update(v) => {
                    s.served.sent(v);
                    format!("event: update\ndata: {v}\n\n")
                }
                Item::Delete(id) => {
                    s.others.lock().unwrap().0 += 1;
                    format!("event: delete\ndata: {id}\n\n")
                }
                Item::Edit(v) => {
                    s.others.lock().unwrap().1 += 1;
                    format!("event: status.update\ndata: {v}\n\n")
                }
            };
            yield Ok(Bytes::from(text));
        }
        if until == s.items.len() {
            futures::future::pending::<()>().await;
        }
    };
    Response::builder()
        .status(200)
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(body))
        .unwrap()
}
