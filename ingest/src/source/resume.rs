//! Resuming a stream from a cursor taken from its own events, shared by the `websocket` source
//! and the `http` source's NDJSON mode: `resume = { field, param }` names a field of each event
//! (a dotted path) and the query parameter that carries its value back on every (re)connect.
//!
//! - [`resume_url`] puts the cursor into the URL, keeping every other parameter byte for byte.
//! - [`resume_value`] reads the cursor from an event's bytes without building the document.
//! - [`Resumer`] keeps the cursor (the value of the last event handed over, or the stored one
//!   a restart starts from) and filters the replay after a (re)connect: a server that replays
//!   from the cursor *inclusively* sends again what was already handed over, and the source
//!   drops exactly the events it can prove it handed over: those whose value is below the
//!   cursor (the values are monotonic, which is what makes them a cursor), and those whose
//!   value equals the cursor and whose content is one it handed over with that value.
//!   Anything else is handed over: an event whose value is greater than the cursor is never
//!   dropped, and several events sharing one value are told apart by content. The first
//!   event past the cursor ends the replay window; from then on nothing is filtered, so a
//!   field that is not monotonic after all costs duplicates, not losses. Each source counts
//!   what it drops in `tailrace_source_duplicates_dropped_total{source}`.

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Events remembered with the last resume value, to tell a replayed one from a new one that
/// shares its value; past these bounds later ones are not remembered (they may come twice,
/// never go missing).
const MAX_TIES: usize = 256;
const MAX_TIE_BYTES: usize = 1 << 20;

/// Where a resumable stream keeps its cursor: a field of each event, sent back as a query
/// parameter on reconnect (`resume = { field = "time_us", param = "cursor" }`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resume {
    /// Dotted path of the cursor in each event (`time_us` for Jetstream, `meta.seq`).
    pub field: String,
    /// Query parameter that carries it back (`cursor` for Jetstream).
    pub param: String,
}

/// The cursor in a stored position (what a resumable source gave as the position of its
/// newest stored record): a string as is, a number as written; `None` for anything else.
pub fn stored_cursor(position: &Value) -> Option<String> {
    match position {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------
// The resume URL
// ---------------------------------------------------------------------------------------

/// `url` with the query parameter `param` set to `value`: an existing one is replaced in
/// place (and any repeat of it removed), every other parameter is kept byte for byte, and
/// `value` is form-encoded. The fragment, if any, is kept.
pub fn resume_url(url: &str, param: &str, value: &str) -> String {
    let (before_fragment, fragment) = match url.split_once('#') {
        Some((u, f)) => (u, Some(f)),
        None => (url, None),
    };
    let (base, query) = match before_fragment.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (before_fragment, None),
    };
    let ours = format!(
        "{}={}",
        form_urlencoded::byte_serialize(param.as_bytes()).collect::<String>(),
        form_urlencoded::byte_serialize(value.as_bytes()).collect::<String>()
    );
    let mut parts: Vec<&str> = Vec::new();
    let mut placed = false;
    for piece in query.into_iter().flat_map(|q| q.split('&')) {
        let is_ours = !piece.is_empty()
            && form_urlencoded::parse(piece.as_bytes())
                .next()
                .is_some_and(|(k, _)| k == param);
        if !is_ours {
            parts.push(piece);
        } else if !placed {
            parts.push(&ours);
            placed = true;
        }
    }
    if !placed {
        if parts.len() == 1 && parts[0].is_empty() {
            // `…?` with nothing after it.
            parts.clear();
        }
        parts.push(&ours);
    }
    let mut out = format!("{base}?{}", parts.join("&"));
    if let Some(f) = fragment {
        out.push('#');
        out.push_str(f);
    }
    out
}

// ---------------------------------------------------------------------------------------
// Resume values and duplicates
// ---------------------------------------------------------------------------------------

/// A cursor value: its text (what goes into the URL) and, when it reads as a number, the
/// number (what orders it).
#[derive(Clone, Debug, PartialEq)]
struct Cursor {
    text: String,
    num: Option<Num>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Num {
    Int(i128),
    Float(f64),
}

impl Cursor {
    fn new(text: String) -> Self {
        let num = if let Ok(i) = text.parse::<i128>() {
            Some(Num::Int(i))
        } else {
            text.parse::<f64>()
                .ok()
                .filter(|f| f.is_finite())
                .map(Num::Float)
        };
        Cursor { text, num }
    }

    /// Numbers by value; anything else only as equal or not (`None`: no order known).
    fn order(&self, other: &Cursor) -> Option<std::cmp::Ordering> {
        use std::cmp::Ordering::Equal;
        match (self.num, other.num) {
            (Some(Num::Int(a)), Some(Num::Int(b))) => Some(a.cmp(&b)),
            (Some(a), Some(b)) => as_f64(a).partial_cmp(&as_f64(b)),
            _ if self.text == other.text => Some(Equal),
            _ => None,
        }
    }
}

fn as_f64(n: Num) -> f64 {
    match n {
        Num::Int(i) => i as f64,
        Num::Float(f) => f,
    }
}

/// What to do with an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Hand it over.
    Hand,
    /// Already handed over: drop it (and count it).
    Duplicate,
}

/// The cursor and the replay filter of a resumable source (see the module doc).
#[derive(Debug)]
pub struct Resumer {
    path: Vec<String>,
    /// The value of the last event handed over that had one (or `start`).
    last: Option<Cursor>,
    /// The events handed over with `last` as their value (bounded).
    ties: Vec<Vec<u8>>,
    ties_bytes: usize,
    /// While replaying after a (re)connect: the cursor that was sent.
    replay: Option<Cursor>,
}

impl Resumer {
    /// Resumes from `field` (a dotted path), starting at `start` if given.
    pub fn new(field: &str, start: Option<String>) -> Self {
        Resumer {
            path: field.split('.').map(str::to_owned).collect(),
            last: start.map(Cursor::new),
            ties: Vec::new(),
            ties_bytes: 0,
            replay: None,
        }
    }

    /// The value of the last event handed over (or `start`): where the stream stands.
    pub fn position(&self) -> Option<&str> {
        self.last.as_ref().map(|c| c.text.as_str())
    }

    /// The cursor to send on the next connection, if any; opens the replay window.
    pub fn connecting(&mut self) -> Option<&str> {
        self.replay = self.last.clone();
        self.last.as_ref().map(|c| c.text.as_str())
    }

    /// The verdict on the next event (bytes as received), updating the cursor when it is
    /// handed over.
    pub fn admit(&mut self, event: &[u8]) -> Verdict {
        let Some(value) = resume_value(event, &self.path).map(Cursor::new) else {
            // No cursor in it (or not JSON): nothing to judge it by.
            return Verdict::Hand;
        };
        if let Some(sent) = &self.replay {
            match value.order(sent) {
                Some(std::cmp::Ordering::Less) => return Verdict::Duplicate,
                Some(std::cmp::Ordering::Equal) => {
                    if self.ties.iter().any(|t| same_event(t, event)) {
                        return Verdict::Duplicate;
                    }
                    // A new event sharing the cursor's value: hand it over, remember it.
                    self.tie(event);
                    return Verdict::Hand;
                }
                // Past the cursor: the replay is over; from here nothing is filtered.
                _ => self.replay = None,
            }
        }
        if self.last.as_ref().is_some_and(|l| l.text == value.text) {
            self.tie(event);
        } else {
            self.last = Some(value);
            self.ties.clear();
            self.ties_bytes = 0;
            self.tie(event);
        }
        Verdict::Hand
    }

    fn tie(&mut self, event: &[u8]) {
        if self.ties.len() < MAX_TIES && self.ties_bytes + event.len() <= MAX_TIE_BYTES {
            self.ties_bytes += event.len();
            self.ties.push(event.to_vec());
        }
    }
}

/// The same event: the same bytes, or (a server may re-serialize a replay) the same JSON.
fn same_event(a: &[u8], b: &[u8]) -> bool {
    a == b
        || matches!(
            (serde_json::from_slice::<Value>(a), serde_json::from_slice::<Value>(b)),
            (Ok(x), Ok(y)) if x == y
        )
}

/// The scalar at `path` in the JSON object `bytes`, as text (a number as written by
/// serde_json, a string as is); `None` when absent, not a scalar, or not JSON. Walks the
/// document without building it: other fields are skipped, not allocated.
pub fn resume_value(bytes: &[u8], path: &[String]) -> Option<String> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let found = PathSeed(path).deserialize(&mut de).ok()?;
    de.end().ok()?;
    found
}

struct PathSeed<'p>(&'p [String]);

impl<'de> DeserializeSeed<'de> for PathSeed<'_> {
    type Value = Option<String>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(PathVisitor(self.0))
    }
}

struct PathVisitor<'p>(&'p [String]);

impl PathVisitor<'_> {
    fn leaf(&self, text: impl FnOnce() -> String) -> Option<String> {
        self.0.is_empty().then(text)
    }
}

impl<'de> Visitor<'de> for PathVisitor<'_> {
    type Value = Option<String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = None;
        while let Some(is_next) = map.next_key_seed(KeyIs(self.0.first().map(String::as_str)))? {
            if is_next {
                // The last of duplicate keys wins, as in the stored document.
                found = map.next_value_seed(PathSeed(&self.0[1..]))?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }

    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(self.leaf(|| v.to_string()))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(self.leaf(|| v.to_string()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
        Ok(self.leaf(|| {
            serde_json::Number::from_f64(v).map_or_else(|| v.to_string(), |n| n.to_string())
        }))
    }

    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(self.leaf(|| v.to_owned()))
    }

    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

/// Deserializes an object key as "is it `want`?", without allocating it.
struct KeyIs<'p>(Option<&'p str>);

impl<'de> DeserializeSeed<'de> for KeyIs<'_> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeyIs<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E>(self, v: &str) -> Result<bool, E> {
        Ok(self.0 == Some(v))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn resume_url_replaces_the_parameter_and_keeps_the_rest_byte_for_byte() {
        let base = "wss://jetstream2.us-east.bsky.network/subscribe";
        assert_eq!(
            resume_url(
                &format!("{base}?wantedCollections=app.bsky.feed.post"),
                "cursor",
                "1725911162329308"
            ),
            format!("{base}?wantedCollections=app.bsky.feed.post&cursor=1725911162329308")
        );
        // Replaced in place, a repeat removed, the others untouched (even oddly encoded ones).
        assert_eq!(
            resume_url(
                "ws://h/s?a=1&cursor=5&b=x%3Ay+z&cursor=6&wantedDids=did:plc:abc#frag",
                "cursor",
                "7"
            ),
            "ws://h/s?a=1&cursor=7&b=x%3Ay+z&wantedDids=did:plc:abc#frag"
        );
        // No query, an empty query.
        assert_eq!(resume_url("ws://h/s", "c", "1"), "ws://h/s?c=1");
        assert_eq!(resume_url("ws://h/s?", "c", "1"), "ws://h/s?c=1");
        // An encoded key still matches; the value is form-encoded.
        assert_eq!(
            resume_url("ws://h/?my%20cursor=1&x=2", "my cursor", "a b&c=d/é"),
            "ws://h/?my+cursor=a+b%26c%3Dd%2F%C3%A9&x=2"
        );
        // A parameter whose name merely starts like ours is kept.
        assert_eq!(
            resume_url("ws://h/?cursorx=1", "cursor", "2"),
            "ws://h/?cursorx=1&cursor=2"
        );
    }

    #[test]
    fn resume_values_are_found_at_dotted_paths_without_building_the_document() {
        let path = |p: &str| p.split('.').map(str::to_owned).collect::<Vec<_>>();
        let ev = br#"{"did":"did:plc:x","time_us":1725911162329308,"commit":{"rev":"3l3qo2vutsw2b","record":{"$type":"app.bsky.feed.post","text":"\u65e5\u672c \ud83e\udd80"}},"f":1.5e3,"neg":-4,"s":"abc","n":null,"a":[1]}"#;
        assert_eq!(
            resume_value(ev, &path("time_us")).as_deref(),
            Some("1725911162329308")
        );
        assert_eq!(
            resume_value(ev, &path("commit.rev")).as_deref(),
            Some("3l3qo2vutsw2b")
        );
        assert_eq!(
            resume_value(ev, &path("commit.record.$type")).as_deref(),
            Some("app.bsky.feed.post")
        );
        assert_eq!(resume_value(ev, &path("f")).as_deref(), Some("1500.0"));
        assert_eq!(resume_value(ev, &path("neg")).as_deref(), Some("-4"));
        assert_eq!(resume_value(ev, &path("s")).as_deref(), Some("abc"));
        for absent in ["n", "a", "commit", "nope", "time_us.x", "commit.nope"] {
            assert_eq!(resume_value(ev, &path(absent)), None, "{absent}");
        }
        assert_eq!(resume_value(b"not json", &path("a")), None);
        assert_eq!(resume_value(b"{\"a\":1} trailing", &path("a")), None);
        assert_eq!(resume_value(b"[{\"a\":1}]", &path("a")), None);
        // An escaped key matches its unescaped name.
        assert_eq!(
            resume_value(br#"{"t\u0069me":9}"#, &path("time")).as_deref(),
            Some("9")
        );
    }

    fn ev(t: u64, n: u32) -> Vec<u8> {
        format!("{{\"time_us\":{t},\"n\":{n},\"text\":\"🦀 ж\"}}").into_bytes()
    }

    #[test]
    fn a_replay_drops_what_was_handed_over_and_nothing_else() {
        let mut r = Resumer::new("time_us", None);
        assert_eq!(r.connecting(), None, "no cursor before any event");
        // Three events share time 20; the connection drops after the second.
        for e in [ev(10, 1), ev(20, 2), ev(20, 3)] {
            assert_eq!(r.admit(&e), Verdict::Hand);
        }
        assert_eq!(r.connecting(), Some("20"));
        // The replay from 20 inclusive: 2 and 3 again, then 4 (same time, new), then later ones.
        let replay = [
            (ev(20, 2), Verdict::Duplicate),
            (ev(20, 3), Verdict::Duplicate),
            (ev(20, 4), Verdict::Hand),
            (ev(30, 5), Verdict::Hand),
            // After the window closed nothing is filtered, even a value that went back.
            (ev(25, 6), Verdict::Hand),
            (ev(30, 5), Verdict::Hand),
        ];
        for (e, want) in replay {
            assert_eq!(r.admit(&e), want, "{}", String::from_utf8_lossy(&e));
        }
        // Re-serialized by the server (other key order, spacing): still the same event.
        let mut r = Resumer::new("time_us", None);
        r.admit(br#"{"time_us":7,"a":1,"b":"x"}"#);
        r.connecting();
        assert_eq!(
            r.admit(br#"{ "b": "x", "a": 1, "time_us": 7 }"#),
            Verdict::Duplicate
        );
        // Below the cursor: replayed (a server that rounds its cursor down).
        assert_eq!(r.admit(br#"{"time_us":6}"#), Verdict::Duplicate);
        // Without the field: handed over, cursor unchanged.
        assert_eq!(r.admit(br#"{"kind":"identity"}"#), Verdict::Hand);
        assert_eq!(r.admit(b"not json"), Verdict::Hand);
        assert_eq!(r.connecting(), Some("7"));
    }

    #[test]
    fn a_start_cursor_drops_only_what_is_below_it() {
        let mut r = Resumer::new("time_us", Some("1725911162329308".into()));
        assert_eq!(r.connecting(), Some("1725911162329308"));
        assert_eq!(
            r.admit(&ev(1725911162329307, 1)),
            Verdict::Duplicate,
            "below the stored cursor"
        );
        assert_eq!(
            r.admit(&ev(1725911162329308, 2)),
            Verdict::Hand,
            "at the stored cursor: nothing proves it was stored, so it may come twice"
        );
        assert_eq!(r.admit(&ev(1725911162329309, 3)), Verdict::Hand);
        assert_eq!(r.connecting(), Some("1725911162329309"));
    }

    #[test]
    fn stored_positions_are_cursors_when_strings_or_numbers() {
        use serde_json::json;
        assert_eq!(
            stored_cursor(&json!("1725911162329308")).as_deref(),
            Some("1725911162329308")
        );
        assert_eq!(stored_cursor(&json!(42)).as_deref(), Some("42"));
        assert_eq!(stored_cursor(&json!(-1.5)).as_deref(), Some("-1.5"));
        for not in [json!(null), json!(true), json!([1]), json!({"offset": 3})] {
            assert_eq!(stored_cursor(&not), None, "{not}");
        }
    }

    #[test]
    fn string_cursors_are_compared_only_for_equality() {
        let mut r = Resumer::new("id", None);
        r.admit(br#"{"id":"b"}"#);
        r.connecting();
        assert_eq!(r.admit(br#"{"id":"b"}"#), Verdict::Duplicate);
        assert_eq!(
            r.admit(br#"{"id":"a"}"#),
            Verdict::Hand,
            "no order is assumed between strings"
        );
    }
}
