//! How `/api/changes` writes one event: as a server-sent event (the default) or as one line of
//! NDJSON (`Accept: application/x-ndjson`). Both carry the same three things: the event's type
//! (`initial`, `change`, `state`, `gap`, `error`), its id when it has one, and a JSON object.
//!
//! ```text
//! SSE:     id: 42\nevent: change\ndata: {"op":"insert","collection":"events","key":"42",...}\n\n
//! NDJSON:  {"type":"change","id":"42","op":"insert","collection":"events","key":"42",...}\n
//! ```

use bytes::{Bytes, BytesMut};
use serde_json::{Map, Value};

/// The media type of NDJSON streams.
pub const NDJSON: &str = "application/x-ndjson";
/// The media type of server-sent events.
pub const SSE: &str = "text/event-stream";

/// How a stream is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Server-sent events: what browsers' `EventSource` (and the live page) read.
    Sse,
    /// One JSON object per line, for `curl | jq` and programs.
    Ndjson,
}

impl Format {
    /// NDJSON when the `Accept` header asks for it, else server-sent events.
    pub fn from_accept(accept: Option<&str>) -> Format {
        match accept {
            Some(a) if a.split(',').any(|t| t.trim().starts_with(NDJSON)) => Format::Ndjson,
            _ => Format::Sse,
        }
    }

    /// The response's `Content-Type`.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Sse => "text/event-stream",
            Format::Ndjson => "application/x-ndjson",
        }
    }
}

/// One event of a stream.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    /// `initial`, `change`, `state`, `gap` or `error`.
    pub kind: &'static str,
    /// What a client resumes after; `None` for events that are no place to resume from.
    pub id: Option<String>,
    /// The payload (always a JSON object).
    pub data: Map<String, Value>,
}

impl Event {
    /// An event without an id.
    pub fn new(kind: &'static str, data: Map<String, Value>) -> Self {
        Event {
            kind,
            id: None,
            data,
        }
    }

    /// The same event with an id.
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// The event as bytes on the wire.
    pub fn encode(&self, format: Format) -> Bytes {
        let mut out = BytesMut::new();
        self.encode_into(format, &mut out);
        out.freeze()
    }

    /// Appends the event as bytes on the wire to `out` (several events make one write).
    pub fn encode_into(&self, format: Format, out: &mut BytesMut) {
        // Serialized straight from the map: no copy of the document.
        let data = serde_json::to_string(&self.data).unwrap_or_else(|_| "{}".to_string());
        match format {
            Format::Sse => {
                out.reserve(data.len() + 64);
                if let Some(id) = self.id.as_deref().and_then(clean_id) {
                    out.extend_from_slice(b"id: ");
                    out.extend_from_slice(id.as_bytes());
                    out.extend_from_slice(b"\n");
                }
                out.extend_from_slice(b"event: ");
                out.extend_from_slice(self.kind.as_bytes());
                // serde_json escapes every line break inside strings: the data is one line.
                out.extend_from_slice(b"\ndata: ");
                out.extend_from_slice(data.as_bytes());
                out.extend_from_slice(b"\n\n");
            }
            Format::Ndjson => {
                // `{"type":..,"id":..,` then the data object's members.
                let mut head = serde_json::Map::new();
                head.insert("type".into(), Value::from(self.kind));
                if let Some(id) = &self.id {
                    head.insert("id".into(), Value::from(id.as_str()));
                }
                let head = Value::Object(head).to_string();
                out.reserve(head.len() + data.len() + 2);
                out.extend_from_slice(&head.as_bytes()[..head.len() - 1]);
                let members = &data[1..data.len() - 1];
                if !members.is_empty() {
                    out.extend_from_slice(b",");
                    out.extend_from_slice(members.as_bytes());
                }
                out.extend_from_slice(b"}\n");
            }
        }
    }
}

/// What a stream sends when it has nothing to say for a while, so proxies and clients know
/// it is alive: a comment (SSE) or an empty line (NDJSON). When the stream has read past
/// entries its filter skipped, `id` moves the client's resume point there without an event:
/// an SSE block with only an `id:` line sets the last event id and dispatches nothing (the
/// WHATWG rules); NDJSON gets a `{"type":"checkpoint","id":..}` line.
pub fn keep_alive(format: Format, id: Option<&str>) -> Bytes {
    match (format, id.and_then(clean_id)) {
        (Format::Sse, Some(id)) => Bytes::from(format!("id: {id}\n\n")),
        (Format::Sse, None) => Bytes::from_static(b": keep-alive\n\n"),
        (Format::Ndjson, Some(id)) => {
            let mut line = serde_json::json!({"type": "checkpoint", "id": id}).to_string();
            line.push('\n');
            Bytes::from(line)
        }
        (Format::Ndjson, None) => Bytes::from_static(b"\n"),
    }
}

/// An id that fits on an SSE `id:` line: no line break and no NUL (which make a browser
/// ignore the id). Every id tailrace makes qualifies; this guards against an engine's token.
fn clean_id(id: &str) -> Option<&str> {
    (!id.contains(['\n', '\r', '\0'])).then_some(id)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn data(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn sse_frames_carry_id_type_and_one_line_of_data() {
        let e = Event::new(
            "change",
            data(json!({"key": "1", "doc": {"text": "two\nlines 🦀 \u{2028}"}})),
        )
        .with_id("17");
        let text = String::from_utf8(e.encode(Format::Sse).to_vec()).unwrap();
        assert!(
            text.starts_with("id: 17\nevent: change\ndata: {"),
            "{text:?}"
        );
        assert!(text.ends_with("}\n\n"), "{text:?}");
        assert_eq!(
            text.matches('\n').count(),
            4,
            "a line break inside the data is escaped, never raw: {text:?}"
        );
        let payload = text.lines().nth(2).unwrap().strip_prefix("data: ").unwrap();
        assert_eq!(
            serde_json::from_str::<Value>(payload).unwrap()["doc"]["text"],
            json!("two\nlines 🦀 \u{2028}")
        );
    }

    #[test]
    fn ndjson_lines_hold_type_and_id_beside_the_data() {
        let e = Event::new("state", data(json!({"state": "ready"}))).with_id("t:9");
        let line = e.encode(Format::Ndjson);
        assert!(line.ends_with(b"\n"));
        let v: Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(v, json!({"type": "state", "id": "t:9", "state": "ready"}));
        let no_id = Event::new("gap", data(json!({"missed": 3}))).encode(Format::Ndjson);
        assert_eq!(
            serde_json::from_slice::<Value>(&no_id).unwrap(),
            json!({"type": "gap", "missed": 3})
        );
    }

    #[test]
    fn an_id_that_would_break_the_frame_is_left_out() {
        let e = Event::new("change", Map::new()).with_id("a\nb");
        let text = String::from_utf8(e.encode(Format::Sse).to_vec()).unwrap();
        assert_eq!(text, "event: change\ndata: {}\n\n");
        assert_eq!(
            &keep_alive(Format::Sse, Some("x\r")).to_vec(),
            b": keep-alive\n\n"
        );
    }

    #[test]
    fn keep_alives_move_the_resume_point_without_an_event() {
        assert_eq!(&keep_alive(Format::Sse, None)[..], b": keep-alive\n\n");
        assert_eq!(&keep_alive(Format::Sse, Some("55"))[..], b"id: 55\n\n");
        assert_eq!(&keep_alive(Format::Ndjson, None)[..], b"\n");
        assert_eq!(
            serde_json::from_slice::<Value>(&keep_alive(Format::Ndjson, Some("55"))).unwrap(),
            json!({"type": "checkpoint", "id": "55"})
        );
    }

    #[test]
    fn accept_picks_the_format() {
        assert_eq!(Format::from_accept(None), Format::Sse);
        assert_eq!(Format::from_accept(Some("text/event-stream")), Format::Sse);
        assert_eq!(Format::from_accept(Some("*/*")), Format::Sse);
        assert_eq!(
            Format::from_accept(Some("application/json, application/x-ndjson;q=0.9")),
            Format::Ndjson
        );
    }
}
