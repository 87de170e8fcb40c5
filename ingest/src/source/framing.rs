//! Line framing shared by every byte-stream source (http, file, stdin, command), and the
//! NDJSON mapping of lines to [`Raw`] records.
//!
//! [`LineFramer`] is a `tokio_util` [`Decoder`] over raw bytes (not `LinesCodec`: that one
//! turns invalid UTF-8 into a stream-ending error and drops the prefix of an over-long line,
//! and we need both as values). Its memory is bounded: it never holds more than `max_line`
//! bytes plus one read chunk. A line longer than `max_line` is reported once with a short
//! prefix, and the rest of it is discarded as it arrives, up to the next newline.
//!
//! NDJSON rules ([`ndjson`]): one JSON document per line; `\n` or `\r\n` ends a line; blank
//! lines are skipped; a line over the limit is `Raw::Invalid { reason: RejectReason::TooLarge }`; a last
//! line without its newline is kept when it parses as JSON (files often lack the final
//! newline) and is `Raw::Invalid { reason: RejectReason::Truncated }` otherwise (a stream cut mid-line).

use bytes::{Buf, BytesMut};
use futures::stream::{Stream, StreamExt};
use tokio::io::AsyncRead;
use tokio_util::codec::{Decoder, FramedRead};

use super::{Raw, RejectReason};
use crate::telemetry as t;

/// Bytes of an over-long line or event kept in its dead letter (the dead letter keeps at
/// most 4096 bytes anyway).
pub const PREFIX_BYTES: usize = 4096;

/// What the framer cuts a byte stream into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// A complete line, without its `\n` / `\r\n`.
    Line(Vec<u8>),
    /// A line longer than the limit: its first bytes (at most [`PREFIX_BYTES`]); the rest was
    /// discarded without being held in memory.
    TooLong(Vec<u8>),
    /// Bytes after the last newline when the stream ended.
    Partial(Vec<u8>),
}

/// Cuts bytes into lines of at most `max_line` bytes (see the module doc).
#[derive(Debug, Clone)]
pub struct LineFramer {
    max_line: usize,
    /// Inside an over-long line that was already reported: drop bytes up to the next `\n`.
    discarding: bool,
    /// Bytes of the buffer already searched for `\n` (so a slowly arriving line is scanned
    /// once, not once per chunk).
    scanned: usize,
    /// Bytes taken off the input so far (lines, their endings, discarded bytes): after a
    /// frame, the offset in the input right after it.
    consumed: u64,
    /// Where the last over-long line reported before its end was seen finally ended (the
    /// offset just past its `\n`, or the end of the input): the only place after it that a
    /// reader can resume from. Taken by [`LineFramer::take_long_line_end`].
    long_line_end: Option<u64>,
}

impl LineFramer {
    /// A framer for lines of at most `max_line` bytes (not counting the line ending).
    pub fn new(max_line: usize) -> Self {
        LineFramer {
            max_line: max_line.max(1),
            discarding: false,
            scanned: 0,
            consumed: 0,
            long_line_end: None,
        }
    }

    /// The limit.
    pub fn max_line(&self) -> usize {
        self.max_line
    }

    /// Bytes of input taken so far: right after a frame is returned, the offset just past
    /// it. Meaningful as a place to resume from only when [`LineFramer::at_line_start`].
    pub fn consumed(&self) -> u64 {
        self.consumed
    }

    /// Whether the input so far ends at a line boundary (false while the rest of an
    /// over-long line is still being discarded: resuming there would start mid-line).
    pub fn at_line_start(&self) -> bool {
        !self.discarding
    }

    /// Once the rest of an over-long line reported as [`Frame::TooLong`] mid-line has been
    /// discarded: the offset just past that line (its `\n`, or the end of the input), the
    /// position a reader resumes from to continue after it; `None` before, and after it was
    /// taken. A source that reports positions hands the over-long line over with this one
    /// (not with none: a restart would then read it again).
    pub fn take_long_line_end(&mut self) -> Option<u64> {
        self.long_line_end.take()
    }
}

fn strip_cr(mut line: Vec<u8>) -> Vec<u8> {
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    line
}

fn prefix(bytes: &[u8], max_line: usize) -> Vec<u8> {
    bytes[..bytes.len().min(PREFIX_BYTES).min(max_line)].to_vec()
}

impl Decoder for LineFramer {
    type Item = Frame;
    type Error = std::io::Error;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, std::io::Error> {
        loop {
            if self.discarding {
                match memchr(buf) {
                    Some(i) => {
                        buf.advance(i + 1);
                        self.consumed += i as u64 + 1;
                        self.discarding = false;
                        self.scanned = 0;
                        self.long_line_end = Some(self.consumed);
                        continue;
                    }
                    None => {
                        self.consumed += buf.len() as u64;
                        buf.clear();
                        return Ok(None);
                    }
                }
            }
            let from = self.scanned.min(buf.len());
            match memchr(&buf[from..]).map(|i| i + from) {
                Some(i) => {
                    self.scanned = 0;
                    self.consumed += i as u64 + 1;
                    // `\r\n`: the `\r` does not count against the limit.
                    let len = if i > 0 && buf[i - 1] == b'\r' {
                        i - 1
                    } else {
                        i
                    };
                    if len > self.max_line {
                        let p = prefix(buf, self.max_line);
                        buf.advance(i + 1);
                        return Ok(Some(Frame::TooLong(p)));
                    }
                    let line = buf.split_to(i + 1);
                    return Ok(Some(Frame::Line(strip_cr(line[..i].to_vec()))));
                }
                None => {
                    // One byte of slack for a `\r` that may precede the coming `\n`.
                    if buf.len() > self.max_line + 1 {
                        let p = prefix(buf, self.max_line);
                        self.consumed += buf.len() as u64;
                        buf.clear();
                        self.scanned = 0;
                        self.discarding = true;
                        return Ok(Some(Frame::TooLong(p)));
                    }
                    self.scanned = buf.len();
                    return Ok(None);
                }
            }
        }
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, std::io::Error> {
        if let Some(frame) = self.decode(buf)? {
            return Ok(Some(frame));
        }
        self.scanned = 0;
        if self.discarding {
            // The over-long last line was already reported.
            self.discarding = false;
            self.consumed += buf.len() as u64;
            buf.clear();
            self.long_line_end = Some(self.consumed);
            return Ok(None);
        }
        if buf.is_empty() {
            return Ok(None);
        }
        self.consumed += buf.len() as u64;
        let rest = strip_cr(buf.split().to_vec());
        // `decode` allowed one byte of slack for a `\r` that never came: the limit still holds.
        if rest.len() > self.max_line {
            return Ok(Some(Frame::TooLong(prefix(&rest, self.max_line))));
        }
        Ok(Some(Frame::Partial(rest)))
    }
}

fn memchr(haystack: &[u8]) -> Option<usize> {
    haystack.iter().position(|&b| b == b'\n')
}

fn is_blank(bytes: &[u8]) -> bool {
    bytes.iter().all(u8::is_ascii_whitespace)
}

/// The NDJSON record of a frame; `None` for a blank line.
pub fn ndjson(frame: Frame) -> Option<Raw> {
    match frame {
        Frame::Line(line) if is_blank(&line) => None,
        Frame::Line(line) => Some(Raw::Bytes(line)),
        Frame::TooLong(bytes) => Some(Raw::Invalid {
            bytes,
            reason: RejectReason::TooLarge,
        }),
        Frame::Partial(bytes) if is_blank(&bytes) => None,
        Frame::Partial(bytes) => {
            if serde_json::from_slice::<serde::de::IgnoredAny>(&bytes).is_ok() {
                Some(Raw::Bytes(bytes))
            } else {
                Some(Raw::Invalid {
                    bytes,
                    reason: RejectReason::Truncated,
                })
            }
        }
    }
}

/// NDJSON records read from `reader`, lines of at most `max_line` bytes. Ends at the end of
/// the input, or at the first read error (logged as `source`'s).
pub fn ndjson_records<R>(
    reader: R,
    max_line: usize,
    source: String,
) -> impl Stream<Item = Raw> + Send + 'static
where
    R: AsyncRead + Send + 'static,
{
    FramedRead::new(reader, LineFramer::new(max_line))
        .take_while(move |r| {
            let go = match r {
                Ok(_) => true,
                Err(e) => {
                    t::SourceProblem {
                        source: &source,
                        error_type: t::SourceErrorType::Io,
                        detail: format!("read failed: {e}"),
                        ends: true,
                    }
                    .emit();
                    false
                }
            };
            std::future::ready(go)
        })
        .filter_map(|r| std::future::ready(r.ok().and_then(ndjson)))
}

/// Frames all of `chunks` as one stream (for tests and the property test): what
/// [`FramedRead`] does, without I/O.
pub fn frame_chunks<'a>(
    framer: &mut LineFramer,
    chunks: impl IntoIterator<Item = &'a [u8]>,
) -> Vec<Frame> {
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    for chunk in chunks {
        buf.extend_from_slice(chunk);
        while let Ok(Some(f)) = framer.decode(&mut buf) {
            out.push(f);
        }
    }
    while let Ok(Some(f)) = framer.decode_eof(&mut buf) {
        out.push(f);
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn frames(max: usize, chunks: &[&[u8]]) -> Vec<Frame> {
        frame_chunks(&mut LineFramer::new(max), chunks.iter().copied())
    }

    fn line(s: &str) -> Frame {
        Frame::Line(s.as_bytes().to_vec())
    }

    #[test]
    fn splits_lines_across_chunks_and_strips_crlf() {
        let got = frames(100, &[b"{\"a\":1}\r\n{\"b\"", b":2}\n\n", b"{\"c\":3}\n"]);
        assert_eq!(
            got,
            vec![
                line("{\"a\":1}"),
                line("{\"b\":2}"),
                line(""),
                line("{\"c\":3}")
            ]
        );
    }

    #[test]
    fn multibyte_characters_split_between_chunks_stay_whole() {
        let text = "{\"t\":\"héllo 🦀\"}\n".as_bytes();
        // Cut inside the 4-byte crab and inside the é.
        let crab = text.iter().position(|&b| b == 0xf0).unwrap();
        let e = text.iter().position(|&b| b == 0xc3).unwrap();
        let got = frames(
            100,
            &[&text[..e + 1], &text[e + 1..crab + 2], &text[crab + 2..]],
        );
        assert_eq!(got, vec![line("{\"t\":\"héllo 🦀\"}")]);
    }

    #[test]
    fn over_long_line_is_reported_once_with_a_prefix_and_the_rest_discarded() {
        let long = [b'x'; 50];
        let got = frames(
            10,
            &[b"{\"a\":1}\n", &long[..20], &long[20..], b"yy\n{\"b\":2}\n"],
        );
        assert_eq!(
            got,
            vec![
                line("{\"a\":1}"),
                Frame::TooLong(vec![b'x'; 10]),
                line("{\"b\":2}")
            ]
        );
        // Over-long within one chunk, newline present.
        let got = frames(4, &[b"123456\nab\n"]);
        assert_eq!(got, vec![Frame::TooLong(b"1234".to_vec()), line("ab")]);
        // Exactly at the limit, with \r\n, is fine.
        assert_eq!(frames(4, &[b"1234\r\n"]), vec![line("1234")]);
    }

    #[test]
    fn the_end_of_an_over_long_line_is_known_once_its_rest_is_discarded() {
        let mut framer = LineFramer::new(10);
        let mut buf = BytesMut::new();
        let mut feed = |framer: &mut LineFramer, chunk: &[u8]| {
            buf.extend_from_slice(chunk);
            let mut out = Vec::new();
            while let Ok(Some(f)) = framer.decode(&mut buf) {
                out.push(f);
            }
            out
        };
        // `{"a":1}\n` (8 bytes), then 50 x and `yy\n` (53 bytes, ends at 61), then `{"b":2}\n`.
        assert_eq!(feed(&mut framer, b"{\"a\":1}\n").len(), 1);
        assert_eq!(framer.take_long_line_end(), None, "no over-long line yet");
        let got = feed(&mut framer, &[b'x'; 20]);
        assert!(matches!(got[..], [Frame::TooLong(_)]), "{got:?}");
        assert!(!framer.at_line_start());
        assert_eq!(framer.take_long_line_end(), None, "its end is not read yet");
        assert!(feed(&mut framer, &[b'x'; 30]).is_empty());
        assert!(feed(&mut framer, b"yy\n").is_empty());
        assert_eq!(
            framer.take_long_line_end(),
            Some(61),
            "just past its newline"
        );
        assert_eq!(framer.take_long_line_end(), None, "taken once");
        assert_eq!(feed(&mut framer, b"{\"b\":2}\n"), vec![line("{\"b\":2}")]);
        // An over-long line cut by the end of the input ends there.
        assert!(matches!(
            feed(&mut framer, &[b'z'; 12])[..],
            [Frame::TooLong(_)]
        ));
        assert_eq!(framer.decode_eof(&mut buf).unwrap(), None);
        assert_eq!(framer.take_long_line_end(), Some(81));
    }

    #[test]
    fn memory_stays_bounded_while_discarding() {
        let mut framer = LineFramer::new(16);
        let mut buf = BytesMut::new();
        let chunk = vec![b'z'; 1000];
        let mut reported = 0;
        for _ in 0..1000 {
            buf.extend_from_slice(&chunk);
            while let Some(f) = framer.decode(&mut buf).unwrap() {
                assert!(matches!(f, Frame::TooLong(_)));
                reported += 1;
            }
            assert!(
                buf.len() <= 16 + 1 + chunk.len(),
                "buffer grew to {}",
                buf.len()
            );
        }
        assert_eq!(reported, 1);
    }

    #[test]
    fn last_line_without_newline() {
        assert_eq!(
            frames(100, &[b"{\"a\":1}\n{\"b\":"]),
            vec![line("{\"a\":1}"), Frame::Partial(b"{\"b\":".to_vec())]
        );
        assert_eq!(
            ndjson(Frame::Partial(b"{\"b\":".to_vec())),
            Some(Raw::Invalid {
                bytes: b"{\"b\":".to_vec(),
                reason: RejectReason::Truncated
            })
        );
        assert_eq!(
            ndjson(Frame::Partial(b"{\"b\":2}".to_vec())),
            Some(Raw::Bytes(b"{\"b\":2}".to_vec())),
            "a complete document without its final newline is kept"
        );
        assert_eq!(ndjson(Frame::Partial(b"  ".to_vec())), None);
    }

    #[test]
    fn a_last_line_one_byte_over_the_limit_is_too_long() {
        // Found by the line_framer fuzz target: the byte of slack kept for a `\r` let a last
        // line without its newline through at max_line + 1 bytes.
        assert_eq!(
            frames(1, &[&[126, 255]]),
            vec![Frame::TooLong(vec![126])],
            "limit 1, last line of 2 bytes"
        );
        assert_eq!(
            frames(4, &[b"ab\n12345"]),
            vec![line("ab"), Frame::TooLong(b"1234".to_vec())]
        );
        // At the limit, with or without a `\r` before the end, it is a partial line.
        assert_eq!(
            frames(4, &[b"1234\r"]),
            vec![Frame::Partial(b"1234".to_vec())]
        );
        assert_eq!(
            frames(4, &[b"1234"]),
            vec![Frame::Partial(b"1234".to_vec())]
        );
    }

    #[test]
    fn ndjson_maps_every_frame() {
        assert_eq!(ndjson(line("   ")), None, "blank lines are skipped");
        assert_eq!(
            ndjson(Frame::Line(vec![b'"', 0xff, b'"'])),
            Some(Raw::Bytes(vec![b'"', 0xff, b'"'])),
            "invalid UTF-8 is kept as a value for the validator"
        );
        assert_eq!(
            ndjson(Frame::TooLong(b"ab".to_vec())),
            Some(Raw::Invalid {
                bytes: b"ab".to_vec(),
                reason: RejectReason::TooLarge
            })
        );
    }

    #[tokio::test]
    async fn ndjson_records_reads_an_async_reader() {
        let input: &[u8] = b"{\"a\":1}\nnot json\n{\"b\":2}";
        let got: Vec<Raw> = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            ndjson_records(input, 100, "t".into()).collect(),
        )
        .await
        .unwrap();
        assert_eq!(
            got,
            vec![
                Raw::Bytes(b"{\"a\":1}".to_vec()),
                Raw::Bytes(b"not json".to_vec()),
                Raw::Bytes(b"{\"b\":2}".to_vec()),
            ]
        );
    }

    #[test]
    fn consumed_counts_every_byte_and_says_where_lines_end() {
        let input: &[u8] =
            b"{\"a\":1}\r\n\n{\"b\":\"\xe6\x9d\xb1\"}\n0123456789012345678901234567\nlast";
        let mut framer = LineFramer::new(16);
        let mut buf = BytesMut::new();
        let mut ends = Vec::new();
        for chunk in input.chunks(5) {
            buf.extend_from_slice(chunk);
            while let Ok(Some(f)) = framer.decode(&mut buf) {
                ends.push((f, framer.consumed(), framer.at_line_start()));
            }
        }
        while let Ok(Some(f)) = framer.decode_eof(&mut buf) {
            ends.push((f, framer.consumed(), framer.at_line_start()));
        }
        let offsets: Vec<(u64, bool)> = ends.iter().map(|(_, o, s)| (*o, *s)).collect();
        // `{"a":1}\r\n` ends at 9; the blank line is a frame ending at 10; `{"b":"東"}\n` (東 is
        // 3 bytes) at 22; the over-long line is reported mid-line (not a place to resume), then `last`.
        assert_eq!(
            offsets[..3],
            [(9, true), (10, true), (22, true)],
            "{ends:?}"
        );
        assert!(matches!(ends[3].0, Frame::TooLong(_)), "{ends:?}");
        assert!(!ends[3].2, "mid-line after an over-long line's prefix");
        assert_eq!(
            *ends.last().unwrap(),
            (Frame::Partial(b"last".to_vec()), input.len() as u64, true),
            "every byte consumed at the end"
        );
    }
}
