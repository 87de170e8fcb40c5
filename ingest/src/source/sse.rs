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
//! value removed, `:` comments ignored, `id:` without NUL sets the last event id, `retry:`
//! digits set the reconnection time, a blank line dispatches), with tailrace's choices:
//! - every event's data is one record, whatever its `event:` type;
//! - an event with an `event:` or `data:` field but empty data is `Raw::Invalid {reason:
//!   "empty_event"}` (the standard drops it silently; we count it); a block of only `id:` /
//!   `retry:` fields sets those and is not an event;
//! - an event cut off by the end of the stream is `Raw::Invalid {reason: RejectReason::Truncated}` (the
//!   standard drops it);
//! - line endings are `\n` or `\r\n` (a bare `\r` is not a line ending here);
//! - an `id:` holding a control character other than tab is ignored like one holding NUL: it
//!   could not be sent back as the `Last-Event-ID` header.

use std::time::Duration;

use super::framing::{Frame, PREFIX_BYTES};
use super::{Raw, RejectReason};

/// Assembles events from lines; remembers the last event id and the server's `retry:`.
#[derive(Debug, Clone)]
pub struct SseAssembler {
    max_event: usize,
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

    /// The id of the last dispatched event (for `Last-Event-ID` on reconnect).
    pub fn last_event_id(&self) -> Option<&str> {
        self.last_event_id.as_deref()
    }

    /// The reconnection time the server asked for with `retry:`.
    pub fn retry(&self) -> Option<Duration> {
        self.retry
    }

    /// Feeds one frame; returns the record of an event it completes.
    pub fn push(&mut self, frame: Frame) -> Option<Raw> {
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
    pub fn finish(&mut self) -> Option<Raw> {
        let had_event = self.is_event && (!self.data.is_empty() || self.too_large);
        let bytes = std::mem::take(&mut self.data);
        self.reset();
        had_event.then(|| Raw::Invalid {
            bytes: bytes[..bytes.len().min(PREFIX_BYTES)].to_vec(),
            reason: RejectReason::Truncated,
        })
    }

    fn reset(&mut self) {
        self.data.clear();
        self.is_event = false;
        self.pending = false;
        self.too_large = false;
    }

    fn line(&mut self, mut line: Vec<u8>) -> Option<Raw> {
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

    fn dispatch(&mut self) -> Option<Raw> {
        if !self.pending {
            return None;
        }
        self.last_event_id = self.id.clone();
        let is_event = self.is_event;
        let too_large = self.too_large;
        let mut data = std::mem::take(&mut self.data);
        self.reset();
        if !is_event {
            return None;
        }
        if too_large {
            return Some(Raw::Invalid {
                bytes: data,
                reason: RejectReason::TooLarge,
            });
        }
        if data.last() == Some(&b'\n') {
            data.pop();
        }
        if data.iter().all(u8::is_ascii_whitespace) {
            return Some(Raw::Invalid {
                bytes: data,
                reason: RejectReason::EmptyEvent,
            });
        }
        Some(Raw::Bytes(data))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::framing::{LineFramer, frame_chunks};
    use super::*;

    fn events(max: usize, input: &[u8]) -> (Vec<Raw>, SseAssembler) {
        let mut a = SseAssembler::new(max, None);
        let frames = frame_chunks(&mut LineFramer::new(max), [input]);
        let mut out: Vec<Raw> = frames.into_iter().filter_map(|f| a.push(f)).collect();
        out.extend(a.finish());
        (out, a)
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
            "\u{feff}id: 1\r\ndata: {\"a\":1}\r\n\r\nretry: 2500\n\nid: 2\nevent: tweet\ndata: {\"b\":2}\n\nid: 3\ndata: {\"c\""
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
        let (got, a) = events(1000, b"event: ping\n\ndata:\n\nid: 9\n\ndata: {}\n\n");
        assert_eq!(
            got,
            vec![
                Raw::Invalid {
                    bytes: vec![],
                    reason: RejectReason::EmptyEvent
                },
                Raw::Invalid {
                    bytes: vec![],
                    reason: RejectReason::EmptyEvent
                },
                bytes("{}")
            ]
        );
        assert_eq!(a.last_event_id(), Some("9"));
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
