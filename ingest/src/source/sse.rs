//! Server-sent events, assembled from the lines of a [`LineFramer`](super::framing::LineFramer).
//!
//! Why not `eventsource-stream` (which `tailrace tail` uses for our own well-formed stream):
//! as a source reading other people's servers it falls short in three ways that matter here.
//! Its UTF-8 layer keeps an invalid byte at the head of its buffer forever, so one bad byte
//! stalls the stream while the buffer grows without bound; it has no bound on a line or an
//! event; and it drops events without data silently. This assembler works on bytes, is
//! bounded by the framer and by `max_event` bytes of data, and turns each of those cases into
//! a value (`invalid_utf8` via the validator, `too_large`, `empty_event`).
//!
//! The rules are the HTML standard's (`data:` lines joined with `\n`, one leading space of a
//! value removed, `:` comments ignored, `id:` without NUL sets the last event id — kept
//! verbatim, so Wikimedia's JSON-array ids go back exactly as they came — `retry:` digits set
//! the reconnection time, a blank line dispatches, an event without `event:` (or with an empty
//! one) is of type `message`), with tailrace's choices:
//! - an event whose type is one of the accepted names ([`SseAssembler::with_events`]; by
//!   default only `message`, i.e. unnamed events) is a record; an event of any other type is
//!   [`Dispatched::Skipped`]: not a record and not a dead letter (Mastodon's `delete` carries a
//!   bare id, Wikimedia's `error` a server message), counted by the caller;
//! - an accepted event with an `event:` or `data:` field but empty data is `Raw::Invalid {reason:
//!   "empty_event"}` (the standard drops it silently; we count it); a block of only `id:` /
//!   `retry:` fields sets those and is not an event;
//! - an accepted event cut off by the end of the stream is `Raw::Invalid {reason:
//!   RejectReason::Truncated}` (the standard drops it);
//! - line endings are `\n` or `\r\n` (a bare `\r` is not a line ending here);
//! - an `id:` holding a control character other than tab is ignored like one holding NUL: it
//!   could not be sent back as the `Last-Event-ID` header.

use std::time::Duration;

use super::framing::{Frame, PREFIX_BYTES};
use super::{Raw, RejectReason};

/// The event type of events without an `event:` field (the HTML standard's default).
pub const DEFAULT_EVENT: &str = "message";
/// Bytes of an `event:` name kept: names are compared whole up to this length, and a longer
/// one (no service sends one) is reported by its prefix.
const MAX_EVENT_NAME: usize = 256;

/// What a blank line (or the end of the stream) completes.
#[derive(Debug, Clone, PartialEq)]
pub enum Dispatched {
    /// An event of an accepted type: its data as a record (or, as `Raw::Invalid`, why it is
    /// none: empty, too large, cut off).
    Record(Raw),
    /// An event of a type the source does not ingest: not a record and not a dead letter.
    Skipped {
        /// Its type, as sent (invalid UTF-8 replaced), at most 256 bytes.
        event: String,
    },
}

/// Assembles events from lines; remembers the last event id and the server's `retry:`.
#[derive(Debug, Clone)]
pub struct SseAssembler {
    max_event: usize,
    /// Event types that are records (`message` for unnamed events).
    accepted: Vec<String>,
    /// The `event:` value of the event being assembled (`None`: `message`).
    event_type: Option<Vec<u8>>,
    data: Vec<u8>,
    /// The event had a `data:` or `event:` field (so it is an event, even if its data is empty).
    is_event: bool,
    /// Fields other than comments were seen since the last dispatch.
    pending: bool,
    /// The event's data outgrew `max_event`: only a prefix is kept.
    too_large: bool,
    /// The id buffer: set by `id:`, committed to `last_event_id` on dispatch.
    id: Option<String>,
    last_event_id: Option<String>,
    retry: Option<Duration>,
    started: bool,
}

impl SseAssembler {
    /// An assembler for events of at most `max_event` bytes of data; `last_event_id` is the id
    /// a reconnect resumes after (kept across connections).
    pub fn new(max_event: usize, last_event_id: Option<String>) -> Self {
        SseAssembler {
            max_event,
            accepted: vec![DEFAULT_EVENT.to_owned()],
            event_type: None,
            data: Vec::new(),
            is_event: false,
            pending: false,
            too_large: false,
            id: last_event_id.clone(),
            last_event_id,
            retry: None,
            started: false,
        }
    }

    /// Only events of these types are records (`message` stands for unnamed events); the
    /// others are [`Dispatched::Skipped`]. The default is `["message"]`.
    pub fn with_events(mut self, accepted: Vec<String>) -> Self {
        self.accepted = accepted;
        self
    }

    /// The id of the last dispatched event (for `Last-Event-ID` on reconnect).
    pub fn last_event_id(&self) -> Option<&str> {
        self.last_event_id.as_deref()
    }

    /// The reconnection time the server asked for with `retry:`.
    pub fn retry(&self) -> Option<Duration> {
        self.retry
    }

    /// Feeds one frame; returns what it completes, if anything.
    pub fn push(&mut self, frame: Frame) -> Option<Dispatched> {
        match frame {
            Frame::Line(line) => self.line(line),
            Frame::TooLong(prefix) => {
                // A line over the framer's limit is part of some event: that event is too large.
                self.pending = true;
                self.is_event = true;
                self.too_large = true;
                // Keep the value, as for a data line that fits.
                let value = prefix
                    .strip_prefix(b"data:")
                    .map(|v| v.strip_prefix(b" ").unwrap_or(v))
                    .unwrap_or(&prefix);
                let room = PREFIX_BYTES.saturating_sub(self.data.len());
                self.data.extend_from_slice(&value[..value.len().min(room)]);
                None
            }
            Frame::Partial(line) => {
                // The stream ended inside an event: whatever it held is cut off.
                if !line.is_empty() {
                    self.line(line);
                }
                self.finish()
            }
        }
    }

    /// The end of the stream: an event that was not dispatched is truncated.
    pub fn finish(&mut self) -> Option<Dispatched> {
        let had_event = self.is_event && (!self.data.is_empty() || self.too_large);
        let skipped = self.skipped_type();
        let bytes = std::mem::take(&mut self.data);
        self.reset();
        if !had_event {
            return None;
        }
        Some(match skipped {
            Some(event) => Dispatched::Skipped { event },
            None => Dispatched::Record(Raw::Invalid {
                bytes: bytes[..bytes.len().min(PREFIX_BYTES)].to_vec(),
                reason: RejectReason::Truncated,
            }),
        })
    }

    fn reset(&mut self) {
        self.data.clear();
        self.event_type = None;
        self.is_event = false;
        self.pending = false;
        self.too_large = false;
    }

    /// The type of the event being assembled when it is not accepted, else `None`.
    fn skipped_type(&self) -> Option<String> {
        let name: &[u8] = match self.event_type.as_deref() {
            None | Some(b"") => DEFAULT_EVENT.as_bytes(),
            Some(name) => name,
        };
        if self.accepted.iter().any(|a| a.as_bytes() == name) {
            None
        } else {
            Some(String::from_utf8_lossy(name).into_owned())
        }
    }

    fn line(&mut self, mut line: Vec<u8>) -> Option<Dispatched> {
        if !self.started {
            self.started = true;
            if line.starts_with("\u{feff}".as_bytes()) {
                line.drain(..3);
            }
        }
        if line.is_empty() {
            return self.dispatch();
        }
        if line[0] == b':' {
            return None; // a comment (heartbeat)
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (&line[..], &[][..]),
        };
        match field {
            b"data" => {
                self.pending = true;
                self.is_event = true;
                if self.too_large {
                    return None;
                }
                if self.data.len() + value.len() + 1 > self.max_event {
                    self.too_large = true;
                    let room = PREFIX_BYTES.saturating_sub(self.data.len());
                    self.data.extend_from_slice(&value[..value.len().min(room)]);
                    self.data.truncate(PREFIX_BYTES);
                    return None;
                }
                self.data.extend_from_slice(value);
                self.data.push(b'\n');
            }
            b"event" => {
                self.pending = true;
                self.is_event = true;
                self.event_type = Some(value[..value.len().min(MAX_EVENT_NAME)].to_vec());
            }
            b"id" => {
                self.pending = true;
                // The standard ignores an id holding NUL. One holding any other control
                // character (a bare `\r`, which is no line ending here) could not be sent back
                // as `Last-Event-ID` either, and the reconnect would resume from now (a gap):
                // ignored too, the reconnect resumes after the previous id (found by fuzzing).
                let sendable = value
                    .iter()
                    .all(|&b| b == b'\t' || (b >= 0x20 && b != 0x7f));
                if sendable && let Ok(id) = std::str::from_utf8(value) {
                    self.id = Some(id.to_owned());
                }
            }
            b"retry" => {
                self.pending = true;
                if !value.is_empty()
                    && value.iter().all(u8::is_ascii_digit)
                    && let Some(ms) = std::str::from_utf8(value)
                        .ok()
                        .and_then(|v| v.parse::<u64>().ok())
                {
                    self.retry = Some(Duration::from_millis(ms));
                }
            }
            _ => {} // unknown fields are ignored
        }
        None
    }

    fn dispatch(&mut self) -> Option<Dispatched> {
        if !self.pending {
            return None;
        }
        self.last_event_id = self.id.clone();
        let is_event = self.is_event;
        let too_large = self.too_large;
        let skipped = self.skipped_type();
        let mut data = std::mem::take(&mut self.data);
        self.reset();
        if !is_event {
            return None;
        }
        if let Some(event) = skipped {
            return Some(Dispatched::Skipped { event });
        }
        if too_large {
            return Some(Dispatched::Record(Raw::Invalid {
                bytes: data,
                reason: RejectReason::TooLarge,
            }));
        }
        if data.last() == Some(&b'\n') {
            data.pop();
        }
        if data.iter().all(u8::is_ascii_whitespace) {
            return Some(Dispatched::Record(Raw::Invalid {
                bytes: data,
                reason: RejectReason::EmptyEvent,
            }));
        }
        Some(Dispatched::Record(Raw::Bytes(data)))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::framing::{LineFramer, frame_chunks};
    use super::*;

    /// Everything `a` dispatches from `input` (in one chunk), the end of the stream included.
    fn dispatched(
        mut a: SseAssembler,
        max: usize,
        input: &[u8],
    ) -> (Vec<Dispatched>, SseAssembler) {
        let frames = frame_chunks(&mut LineFramer::new(max), [input]);
        let mut out: Vec<Dispatched> = frames.into_iter().filter_map(|f| a.push(f)).collect();
        out.extend(a.finish());
        (out, a)
    }

    /// The records of `input` under the default names (asserting that none was skipped).
    fn events(max: usize, input: &[u8]) -> (Vec<Raw>, SseAssembler) {
        let (out, a) = dispatched(SseAssembler::new(max, None), max, input);
        let records = out
            .into_iter()
            .map(|d| match d {
                Dispatched::Record(r) => r,
                skipped => panic!("expected only records, got {skipped:?}"),
            })
            .collect();
        (records, a)
    }

    fn skipped(event: &str) -> Dispatched {
        Dispatched::Skipped {
            event: event.into(),
        }
    }

    fn record(s: &str) -> Dispatched {
        Dispatched::Record(bytes(s))
    }

    fn bytes(s: &str) -> Raw {
        Raw::Bytes(s.as_bytes().to_vec())
    }

    #[test]
    fn the_standards_examples() {
        let (got, _) = events(
            1000,
            b": comment\n\ndata: first\n\ndata: second, it\ndata: has two lines.\n\ndata:third\n\n",
        );
        assert_eq!(
            got,
            vec![
                bytes("first"),
                bytes("second, it\nhas two lines."),
                bytes("third")
            ]
        );
    }

    #[test]
    fn ids_retry_bom_and_crlf() {
        let (got, a) = events(
            1000,
            "\u{feff}id: 1\r\ndata: {\"a\":1}\r\n\r\nretry: 2500\n\nid: 2\nevent: message\ndata: {\"b\":2}\n\nid: 3\ndata: {\"c\""
                .as_bytes(),
        );
        assert_eq!(
            got,
            vec![
                bytes("{\"a\":1}"),
                bytes("{\"b\":2}"),
                Raw::Invalid {
                    bytes: b"{\"c\"\n".to_vec(),
                    reason: RejectReason::Truncated
                }
            ]
        );
        assert_eq!(
            a.last_event_id(),
            Some("2"),
            "an event cut off does not move the id"
        );
        assert_eq!(a.retry(), Some(Duration::from_millis(2500)));
    }

    #[test]
    fn empty_events_are_values_and_id_only_blocks_are_not_events() {
        let (got, a) = events(
            1000,
            b"event: message\n\ndata:\n\nevent:\ndata:  \n\nid: 9\n\ndata: {}\n\n",
        );
        let empty = Raw::Invalid {
            bytes: vec![],
            reason: RejectReason::EmptyEvent,
        };
        assert_eq!(
            got,
            vec![
                empty.clone(),
                empty,
                Raw::Invalid {
                    bytes: b" ".to_vec(),
                    reason: RejectReason::EmptyEvent
                },
                bytes("{}")
            ],
            "`event:` with an empty name is `message` too"
        );
        assert_eq!(a.last_event_id(), Some("9"));
    }

    /// Mastodon's streaming API: `update`, `delete` (a bare id as data), `status.update`, and
    /// `:thump` heartbeats; a source that asked for `update` gets only those, and learns the
    /// names of the others.
    #[test]
    fn named_events_only_the_accepted_ones_are_records() {
        let input = b":)\n\nevent: update\ndata: {\"id\":\"1\"}\n\n:thump\n\n\
            event: delete\ndata: 109846\n\nevent: status.update\ndata: {\"id\":\"1\"}\n\n\
            data: {\"unnamed\":1}\n\nevent: update\ndata: {\"id\":\"2\"}\n\n\
            event: delete\ndata:\n\nevent: ping\n\nevent: update\ndata: {\"id\":";
        let a = SseAssembler::new(1000, None).with_events(vec!["update".into()]);
        let (got, _) = dispatched(a, 1000, input);
        assert_eq!(
            got,
            vec![
                record("{\"id\":\"1\"}"),
                skipped("delete"),
                skipped("status.update"),
                skipped("message"),
                record("{\"id\":\"2\"}"),
                skipped("delete"),
                skipped("ping"),
                Dispatched::Record(Raw::Invalid {
                    bytes: b"{\"id\":\n".to_vec(),
                    reason: RejectReason::Truncated
                }),
            ],
            "an empty `delete` and a dataless `ping` are skipped, not empty_event dead letters"
        );
        // The default: unnamed events and `message`; every other name is skipped.
        let (got, _) = dispatched(SseAssembler::new(1000, None), 1000, input);
        let records = got
            .iter()
            .filter(|d| matches!(d, Dispatched::Record(_)))
            .collect::<Vec<_>>();
        assert_eq!(records, vec![&record("{\"unnamed\":1}")]);
        assert!(
            got.contains(&skipped("update")) && got.ends_with(&[skipped("update")]),
            "a cut-off event of a skipped name is skipped, not truncated: {got:?}"
        );
        // Several names, and names compared whole (no prefix match, case matters).
        let a = SseAssembler::new(1000, None)
            .with_events(vec!["message".into(), "status.update".into()]);
        let (got, _) = dispatched(
            a,
            1000,
            b"event: status\ndata: {}\n\nevent: Message\ndata: {}\n\nevent: status.update\ndata: {\"e\":1}\n\ndata: {\"m\":1}\n\n",
        );
        assert_eq!(
            got,
            vec![
                skipped("status"),
                skipped("Message"),
                record("{\"e\":1}"),
                record("{\"m\":1}")
            ]
        );
    }

    /// Wikimedia EventStreams (KafkaSSE): `:ok` first, then `event: message`, an `id:` that is
    /// a JSON array of per-partition positions, one-line JSON data; errors come as `event:
    /// error`. The id is kept byte for byte (spaces, key order, non-ASCII), skipped events move
    /// it too, and an id with a NUL is ignored as the standard says.
    #[test]
    fn json_array_ids_are_kept_verbatim_and_error_events_skipped() {
        let id1 = r#"[{"topic":"eqiad.mediawiki.recentchange","partition":0,"timestamp":1714564800123},{"topic":"codfw.mediawiki.recentchange","partition":0,"offset":-1}]"#;
        let id2 = r#"[ {"topic": "eqiad.mediawiki.recentchange", "partition":0, "offset": 5136683867, "note": "é"} ]"#;
        let input = format!(
            ":ok\n\nevent: message\nid: {id1}\ndata: {{\"$schema\":\"/mediawiki/recentchange/1.0.0\"}}\n\n\
             event: error\nid: {id2}\ndata: {{\"message\":\"consumer lag\"}}\n\n\
             id: bad\u{0}id\nevent: message\ndata: {{\"n\":2}}\n\n"
        );
        let (got, a) = dispatched(SseAssembler::new(1000, None), 1000, input.as_bytes());
        assert_eq!(
            got,
            vec![
                record("{\"$schema\":\"/mediawiki/recentchange/1.0.0\"}"),
                skipped("error"),
                record("{\"n\":2}")
            ]
        );
        assert_eq!(
            a.last_event_id(),
            Some(id2),
            "the id of the skipped error event, verbatim; the NUL id was ignored"
        );
    }

    #[test]
    fn retry_and_multi_line_data_and_comments_between_fields() {
        let (got, a) = events(
            1000,
            b"retry: 1500\ndata: {\"a\":\n: a comment inside the event\ndata:  [1,\ndata:2]}\nretry: x\nretry: 12s\n\n",
        );
        assert_eq!(
            got,
            vec![bytes("{\"a\":\n [1,\n2]}")],
            "data lines joined with \\n, one leading space removed, comments ignored"
        );
        assert_eq!(
            a.retry(),
            Some(Duration::from_millis(1500)),
            "`retry:` that is not all digits is ignored"
        );
    }

    #[test]
    fn a_very_long_event_name_is_reported_by_its_prefix() {
        let name = "n".repeat(600);
        let (got, _) = dispatched(
            SseAssembler::new(4000, None),
            4000,
            format!("event: {name}\ndata: {{}}\n\n").as_bytes(),
        );
        assert_eq!(got, vec![skipped(&name[..MAX_EVENT_NAME])]);
    }

    #[test]
    fn too_large_events_keep_a_prefix() {
        let mut input = b"data: ".to_vec();
        input.extend(vec![b'x'; 30]);
        input.extend(b"\ndata: more\n\ndata: {\"ok\":1}\n\n");
        // max 20: the first data line is over the framer's line limit too.
        let (got, _) = events(20, &input);
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(matches!(
            got[0],
            Raw::Invalid {
                reason: RejectReason::TooLarge,
                ..
            }
        ));
        assert_eq!(got[1], bytes("{\"ok\":1}"));
        // Many small data lines adding up past the limit.
        let (got, _) = events(20, b"data: 0123456789\ndata: 0123456789\n\ndata: {}\n\n");
        assert_eq!(
            got,
            vec![
                Raw::Invalid {
                    bytes: b"0123456789\n0123456789".to_vec(),
                    reason: RejectReason::TooLarge
                },
                bytes("{}")
            ]
        );
    }

    #[test]
    fn ids_that_cannot_go_back_as_a_header_are_ignored() {
        // Found by the sse fuzz target: an id with a bare \r (or another control character)
        // became the last event id, and the reconnect could not send it.
        let (got, a) = events(
            1000,
            "id: 東京-42\ndata: {}\n\nid: 1\r\x08x\ndata: {}\n\nid: a\x7fb\ndata: {}\n\n"
                .as_bytes(),
        );
        assert_eq!(got.len(), 3, "the events still count: {got:?}");
        assert_eq!(
            a.last_event_id(),
            Some("東京-42"),
            "the last id that can be sent back is kept (UTF-8 is fine)"
        );
        let (_, a) = events(1000, b"id: tab\there\ndata: {}\n\n");
        assert_eq!(
            a.last_event_id(),
            Some("tab\there"),
            "a tab is allowed in a header"
        );
    }

    #[test]
    fn invalid_utf8_is_kept_as_bytes_and_the_stream_goes_on() {
        let (got, _) = events(1000, b"data: {\"a\":\"\xff\"}\n\ndata: {\"b\":1}\n\n");
        assert_eq!(
            got,
            vec![Raw::Bytes(b"{\"a\":\"\xff\"}".to_vec()), bytes("{\"b\":1}")]
        );
    }
}
