//! Bluesky Jetstream, as its README describes it (github.com/bluesky-social/jetstream):
//! - `GET /subscribe?wantedCollections=app.bsky.feed.post[&cursor=<time_us>]` upgraded to a
//!   WebSocket; one JSON event per text frame;
//! - events: `{"did", "time_us", "kind": "commit", "commit": {"rev", "operation", "collection",
//!   "rkey", "record", "cid"}}` (a delete has no record and no cid), and `identity` / `account`
//!   events, which every subscriber gets whatever its `wantedCollections`;
//! - records are lexicon objects: `$type` at every level (`app.bsky.feed.post`,
//!   `app.bsky.richtext.facet#tag`, `app.bsky.embed.images`, `blob`), blob references as
//!   `{"$link": <cid>}`;
//! - `cursor` replays from that `time_us` *inclusively* (the README advises resuming from the
//!   last `time_us` processed, minus a margin): a resuming client sees events it already has.
//!
//! Here events are paired on one `time_us`, so a close can fall inside a tie.

use std::net::SocketAddr;
use std::sync::Arc;

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use super::{Rng, Served, TEXTS, long_text};

/// `time_us` of event 0.
const T0_US: u64 = 1_725_911_162_000_000;

/// The `time_us` of event `i`: two events per microsecond stamp.
pub fn time_us(i: usize) -> u64 {
    T0_US + (i as u64 / 2) * 1_250
}

fn did(rng: &mut Rng) -> String {
    // A long tail of authors: a few post a lot.
    format!(
        "did:plc:{:024x}",
        rng.long_tail(2_000_000) as u128 * 0x9e37_79b9
    )
}

fn cid(rng: &mut Rng) -> String {
    format!(
        "bafyrei{:052x}",
        rng.next_u64() as u128 * rng.next_u64() as u128
    )[..59]
        .to_owned()
}

/// Event `i`: mostly new posts (in many scripts, with facets, images, videos, replies), some
/// deletes, identity and account events; every 89th post is long (~3,000 characters, the
/// post limit, plus a big alt text).
pub fn event(i: usize) -> Value {
    let mut rng = Rng::new(0x1e75_0000 + i as u64);
    let did = did(&mut rng);
    let t = time_us(i);
    let roll = rng.below(100);
    if roll < 3 {
        return json!({
            "did": did, "time_us": t, "kind": "identity",
            "identity": {"did": did, "handle": format!("user{}.bsky.social", rng.below(1_000_000)),
                         "seq": 1_409_753_013u64 + i as u64, "time": "2024-09-09T19:46:02.102Z"},
        });
    }
    if roll < 5 {
        let active = rng.chance(0.7);
        let mut account = json!({"active": active, "did": did, "seq": 1_409_753_013u64 + i as u64,
                                 "time": "2024-09-09T19:46:02.102Z"});
        if !active {
            account["status"] = json!(*rng.pick(&["deactivated", "takendown", "suspended"]));
        }
        return json!({"did": did, "time_us": t, "kind": "account", "account": account});
    }
    let rkey = format!("3l3qo2vuowo{:x}", i);
    let rev = format!("3l3qo2vut{:05}", i);
    if roll < 12 {
        return json!({
            "did": did, "time_us": t, "kind": "commit",
            "commit": {"rev": rev, "operation": "delete", "collection": "app.bsky.feed.post", "rkey": rkey},
        });
    }
    let mut text = rng.pick(TEXTS).to_string();
    if i.is_multiple_of(89) {
        text = long_text(&mut rng, 3_000);
    }
    let langs = json!([*rng.pick(&[
        "en", "ja", "pt", "de", "ko", "es", "fr", "fa", "he", "th", "zh"
    ])]);
    let mut record = json!({
        "$type": "app.bsky.feed.post",
        "createdAt": "2024-09-09T19:46:02.102Z",
        "langs": langs,
        "text": text,
    });
    if rng.chance(0.3) {
        let tag = rng.pick(&["rust", "bluesky", "東京", "art", "nba"]);
        record["facets"] = json!([{
            "$type": "app.bsky.richtext.facet",
            "features": [{"$type": "app.bsky.richtext.facet#tag", "tag": tag}],
            "index": {"byteStart": 0, "byteEnd": 5},
        }]);
    }
    match rng.below(10) {
        0 | 1 => {
            let alt = if i.is_multiple_of(89) {
                long_text(&mut rng, 2_000)
            } else {
                String::new()
            };
            record["embed"] = json!({
                "$type": "app.bsky.embed.images",
                "images": [{
                    "alt": alt,
                    "aspectRatio": {"height": 1000, "width": 750},
                    "image": {"$type": "blob", "ref": {"$link": cid(&mut rng)},
                              "mimeType": "image/jpeg", "size": 200_000 + rng.below(800_000)},
                }],
            });
        }
        2 => {
            record["embed"] = json!({
                "$type": "app.bsky.embed.video",
                "aspectRatio": {"height": 1920, "width": 1080},
                "video": {"$type": "blob", "ref": {"$link": cid(&mut rng)},
                          "mimeType": "video/mp4", "size": 1_000_000 + rng.long_tail(90_000_000)},
            });
        }
        _ => {}
    }
    if rng.chance(0.4) {
        let parent = json!({"cid": cid(&mut rng), "uri": format!("at://{did}/app.bsky.feed.post/3l3p{}", rng.below(99999))});
        record["reply"] = json!({"parent": parent.clone(), "root": parent});
    }
    json!({
        "did": did, "time_us": t, "kind": "commit",
        "commit": {"rev": rev, "operation": "create", "collection": "app.bsky.feed.post",
                   "rkey": rkey, "record": record, "cid": cid(&mut rng)},
    })
}

/// The replay server.
pub struct Server {
    /// What it served (replays included).
    pub served: Arc<Served>,
    /// Its address.
    pub addr: SocketAddr,
    /// The request URI of every upgrade.
    pub uris: Arc<std::sync::Mutex<Vec<String>>>,
}

impl Server {
    /// Serves `n` events; connection `k` closes (a close frame, code 1001 "going away") after
    /// `per_connection(k)` events; the one that reaches the end stays open.
    // The upgrade callback's error type is tungstenite's `ErrorResponse`, not ours to shrink.
    #[allow(clippy::result_large_err)]
    pub async fn start(
        n: usize,
        per_connection: impl Fn(usize) -> usize + Send + Sync + 'static,
    ) -> Server {
        let served = Arc::new(Served::default());
        let uris = Arc::new(std::sync::Mutex::new(Vec::new()));
        let events: Arc<Vec<(u64, String, Value)>> = Arc::new(
            (0..n)
                .map(|i| {
                    let e = event(i);
                    (time_us(i), e.to_string(), e)
                })
                .collect(),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let per_connection = Arc::new(per_connection);
        let (s, u) = (served.clone(), uris.clone());
        tokio::spawn(async move {
            let mut k = 0;
            while let Ok((tcp, _)) = listener.accept().await {
                let (events, served, uris, per) =
                    (events.clone(), s.clone(), u.clone(), per_connection.clone());
                tokio::spawn(async move {
                    let mut uri = String::new();
                    let ws = tokio_tungstenite::accept_hdr_async(
                        tcp,
                        |req: &Request, resp: Response| {
                            uri = req.uri().to_string();
                            Ok(resp)
                        },
                    )
                    .await;
                    let Ok(mut ws) = ws else { return };
                    uris.lock().unwrap().push(uri.clone());
                    let cursor = uri
                        .split_once('?')
                        .map(|(_, q)| q)
                        .unwrap_or("")
                        .split('&')
                        .find_map(|p| p.strip_prefix("cursor="))
                        .and_then(|c| c.parse::<u64>().ok());
                    let from = match cursor {
                        Some(c) => events
                            .iter()
                            .position(|(t, _, _)| *t >= c)
                            .unwrap_or(events.len()),
                        None => 0,
                    };
                    let until = (from + per(k)).min(events.len());
                    served.connection(format!("connection {k}: {uri}: events {from}..{until}"));
                    for (_, text, e) in &events[from..until] {
                        served.sent(e);
                        if ws.send(Message::text(text.clone())).await.is_err() {
                            return;
                        }
                    }
                    if until == events.len() {
                        // Live: nothing new; keep reading (answers pings) until the client leaves.
                        while let Some(Ok(_)) = ws.next().await {}
                    } else {
                        let _ = ws
                            .close(Some(CloseFrame {
                                code: CloseCode::Away,
                                reason: "rotating".into(),
                            }))
                            .await;
                        while let Some(Ok(_)) = ws.next().await {}
                    }
                });
                k += 1;
            }
        });
        Server { served, addr, uris }
    }
}
