//! A read tap under tungstenite that keeps what tungstenite throws away when it rejects a
//! message.
//!
//! tungstenite turns three kinds of bad input into errors that end the connection, and none of
//! them carries the offending bytes: a text message that is not UTF-8 (`Error::Utf8` holds only
//! a description), a frame or message over the size limit (`Error::Capacity`, raised on the
//! frame header, before the payload is read: that is what bounds memory), and a connection
//! that ends inside a message. A dead letter without its bytes tells the operator nothing, so
//! [`Tap`] sits between the transport (TCP or TLS) and tungstenite, sees every byte tungstenite
//! reads, and [`Tracker`] follows the frame structure just far enough to keep, for the message
//! in progress, its first [`PREFIX_BYTES`] bytes, its size, and whether it is still valid UTF-8.
//!
//! The tracker applies tungstenite's own checks in tungstenite's order (frame size at the
//! header; message size, then UTF-8, when a frame is complete), so the first message it finds
//! bad is the one tungstenite rejects; the caller still checks that the kinds agree. It reads
//! ahead of tungstenite (a read can hold several frames), which does not matter: tungstenite
//! stops at the first bad message, and the tracker stops looking there too.
//!
//! Cost: a few branches per frame, a copy of at most [`PREFIX_BYTES`] per message, and a
//! second UTF-8 validation of text payloads (std's, at memory speed). Memory: one prefix.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::source::framing::PREFIX_BYTES;

/// What the tracker found wrong with the message tungstenite is about to reject (or was
/// reading when the connection ended).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    /// A frame or message over the limit: its announced (frame) or reached (message) size.
    TooLarge {
        /// Bytes, as tungstenite counts them.
        size: u64,
        /// The first bytes of the message that came before the limit was hit.
        prefix: Vec<u8>,
    },
    /// A text message that is not UTF-8: its first bytes.
    InvalidUtf8(Vec<u8>),
    /// A data message the connection ended inside: its first bytes.
    Cut(Vec<u8>),
}

/// The data message being read.
#[derive(Debug, Default)]
struct Msg {
    text: bool,
    /// Payload bytes announced so far (frame headers of its fragments).
    len: u64,
    prefix: Vec<u8>,
    /// The start of a UTF-8 character split between chunks (at most 3 bytes).
    carry: Vec<u8>,
    invalid_utf8: bool,
}

#[derive(Debug)]
enum Phase {
    /// In the HTTP response to the upgrade: `matched` bytes of `\r\n\r\n` seen.
    Http { matched: usize },
    /// In a frame header: `have` bytes of it.
    Header { buf: [u8; 14], have: usize },
    /// In a payload: `left` bytes to go.
    Payload { left: u64, data: bool, fin: bool },
    /// Something tungstenite will refuse (a protocol error, or the finding): stop following.
    Done,
}

/// Follows the frames of a server's byte stream (see the module doc).
#[derive(Debug)]
pub(super) struct Tracker {
    /// tungstenite's `max_frame_size` and `max_message_size` (the same value).
    limit: u64,
    phase: Phase,
    msg: Option<Msg>,
    /// Set on the first bad message; its prefix keeps filling while its bytes arrive.
    bad: Option<Bad>,
}

#[derive(Debug, Clone, Copy)]
enum Bad {
    TooLarge(u64),
    /// A frame over the limit that belongs to no message (a ping, pong or close, or a frame
    /// tungstenite would refuse anyway): tungstenite refuses it on its header like a data
    /// frame, but there are no message bytes to keep for it.
    FrameTooLarge(u64),
    InvalidUtf8,
}

impl Tracker {
    /// A tracker for a connection whose frames and messages may be at most `limit` bytes.
    pub(super) fn new(limit: usize) -> Self {
        Tracker {
            limit: limit as u64,
            phase: Phase::Http { matched: 0 },
            msg: None,
            bad: None,
        }
    }

    /// Bytes as they were read, in order.
    pub(super) fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            match &mut self.phase {
                Phase::Done => return,
                Phase::Http { matched } => {
                    const END: &[u8; 4] = b"\r\n\r\n";
                    let mut m = *matched;
                    let mut used = bytes.len();
                    for (i, &b) in bytes.iter().enumerate() {
                        m = if b == END[m] {
                            m + 1
                        } else {
                            usize::from(b == b'\r')
                        };
                        if m == END.len() {
                            used = i + 1;
                            break;
                        }
                    }
                    bytes = &bytes[used..];
                    self.phase = if m == END.len() {
                        Phase::Header {
                            buf: [0; 14],
                            have: 0,
                        }
                    } else {
                        Phase::Http { matched: m }
                    };
                }
                Phase::Header { buf, have } => {
                    let need = header_len(&buf[..*have]);
                    let take = (need - *have).min(bytes.len());
                    buf[*have..*have + take].copy_from_slice(&bytes[..take]);
                    *have += take;
                    bytes = &bytes[take..];
                    let n = *have;
                    if n == header_len(&buf[..n]) {
                        let header = *buf;
                        self.header(&header[..n]);
                    }
                }
                Phase::Payload { left, data, fin } => {
                    let take = usize::try_from(*left)
                        .unwrap_or(usize::MAX)
                        .min(bytes.len());
                    let (data, fin) = (*data, *fin);
                    *left -= take as u64;
                    let done = *left == 0;
                    if data {
                        self.payload(&bytes[..take]);
                    }
                    bytes = &bytes[take..];
                    if done {
                        self.frame_done(data, fin);
                    }
                }
            }
        }
    }

    /// A complete frame header.
    fn header(&mut self, h: &[u8]) {
        let (b0, b1) = (h[0], h[1]);
        let fin = b0 & 0x80 != 0;
        let rsv = b0 & 0x70 != 0;
        let opcode = b0 & 0x0f;
        let masked = b1 & 0x80 != 0;
        let len = match b1 & 0x7f {
            126 => u64::from(u16::from_be_bytes([h[2], h[3]])),
            127 => u64::from_be_bytes([h[2], h[3], h[4], h[5], h[6], h[7], h[8], h[9]]),
            n => u64::from(n),
        };
        let data = opcode <= 2;
        // tungstenite fails the connection on these before looking at any payload; among
        // them control frames that are fragmented or over 125 bytes (RFC 6455, 5.5).
        let refused = rsv
            || masked
            || (3..=7).contains(&opcode)
            || opcode > 10
            || (!data && (!fin || len > 125));
        // A continuation without a start, or a new message inside one.
        let misplaced = data && matches!((opcode, self.msg.is_some()), (0, false) | (1 | 2, true));
        // tungstenite's frame limit comes first, on every frame's header: before the reserved
        // bits, the mask and the opcode are looked at, and for pings and pongs too (both found
        // by fuzzing). Such a frame belongs to no message, so no message bytes are kept.
        if len > self.limit && (!data || refused || misplaced) {
            self.bad = Some(Bad::FrameTooLarge(len));
            self.phase = Phase::Done;
            return;
        }
        // After a close frame tungstenite reads nothing more as data.
        if refused || misplaced || opcode == 8 {
            self.phase = Phase::Done;
            return;
        }
        if data {
            if opcode != 0 {
                self.msg = Some(Msg {
                    text: opcode == 1,
                    ..Msg::default()
                });
            }
            if let Some(msg) = &mut self.msg {
                // tungstenite: the frame limit on the header; the message limit on the sum.
                let total = msg.len.saturating_add(len);
                msg.len = total;
                if len > self.limit {
                    self.bad = Some(Bad::TooLarge(len));
                } else if total > self.limit {
                    self.bad = Some(Bad::TooLarge(total));
                }
            }
        }
        self.phase = Phase::Payload {
            left: len,
            data,
            fin,
        };
        if len == 0 {
            self.frame_done(data, fin);
        }
    }

    fn payload(&mut self, bytes: &[u8]) {
        let Some(msg) = &mut self.msg else {
            return;
        };
        let room = PREFIX_BYTES.saturating_sub(msg.prefix.len());
        msg.prefix
            .extend_from_slice(&bytes[..room.min(bytes.len())]);
        if self.bad.is_some() {
            // Only the prefix of the bad message is still wanted.
            if msg.prefix.len() >= PREFIX_BYTES {
                self.phase = Phase::Done;
            }
            return;
        }
        if msg.text && !msg.invalid_utf8 {
            msg.invalid_utf8 = !utf8_step(&mut msg.carry, bytes);
        }
    }

    fn frame_done(&mut self, data: bool, fin: bool) {
        if self.bad.is_some() {
            self.phase = Phase::Done;
            return;
        }
        if data && let Some(msg) = &self.msg {
            if msg.text && (msg.invalid_utf8 || (fin && !msg.carry.is_empty())) {
                self.bad = Some(Bad::InvalidUtf8);
                self.phase = Phase::Done;
                return;
            }
            if fin {
                self.msg = None;
            }
        }
        self.phase = Phase::Header {
            buf: [0; 14],
            have: 0,
        };
    }

    /// What is wrong with the message tungstenite rejected, once.
    pub(super) fn take_bad(&mut self) -> Option<Finding> {
        let bad = self.bad.take()?;
        let prefix = self.msg.take().map(|m| m.prefix).unwrap_or_default();
        self.phase = Phase::Done;
        Some(match bad {
            Bad::TooLarge(size) => Finding::TooLarge { size, prefix },
            Bad::FrameTooLarge(size) => Finding::TooLarge {
                size,
                prefix: Vec::new(),
            },
            Bad::InvalidUtf8 => Finding::InvalidUtf8(prefix),
        })
    }

    /// The data message in progress when the connection ended, once (`None` when it ended
    /// between messages).
    pub(super) fn take_cut(&mut self) -> Option<Finding> {
        if self.bad.is_some() {
            return None;
        }
        let msg = self.msg.take()?;
        self.phase = Phase::Done;
        Some(Finding::Cut(msg.prefix))
    }

    /// An oversized message was found and its prefix is not complete yet.
    pub(super) fn wants_prefix(&self) -> bool {
        matches!(self.bad, Some(Bad::TooLarge(_))) && !matches!(self.phase, Phase::Done)
    }

    /// Whether the stream stopped inside a frame or a fragmented message.
    pub(super) fn mid_frame(&self) -> bool {
        self.msg.is_some()
            || matches!(
                self.phase,
                Phase::Payload { .. } | Phase::Header { have: 1.., .. }
            )
    }
}

/// Bytes of the frame header whose first bytes are `h` (as far as they tell).
fn header_len(h: &[u8]) -> usize {
    if h.len() < 2 {
        return 2;
    }
    let ext = match h[1] & 0x7f {
        126 => 2,
        127 => 8,
        _ => 0,
    };
    let mask = if h[1] & 0x80 != 0 { 4 } else { 0 };
    2 + ext + mask
}

/// Validates the next chunk of a UTF-8 stream; `carry` holds a character split between
/// chunks. False when the bytes cannot be UTF-8.
fn utf8_step(carry: &mut Vec<u8>, mut bytes: &[u8]) -> bool {
    if !carry.is_empty() {
        let width = match carry[0] {
            0xc2..=0xdf => 2,
            0xe0..=0xef => 3,
            0xf0..=0xf4 => 4,
            _ => return false,
        };
        let take = (width - carry.len()).min(bytes.len());
        carry.extend_from_slice(&bytes[..take]);
        bytes = &bytes[take..];
        if carry.len() < width {
            // Still incomplete, but what is there must be a valid start.
            return matches!(std::str::from_utf8(carry), Err(e) if e.error_len().is_none());
        }
        if std::str::from_utf8(carry).is_err() {
            return false;
        }
        carry.clear();
    }
    match std::str::from_utf8(bytes) {
        Ok(_) => true,
        Err(e) if e.error_len().is_none() => {
            carry.extend_from_slice(&bytes[e.valid_up_to()..]);
            true
        }
        Err(_) => false,
    }
}

/// A transport whose reads are followed by a [`Tracker`]; writes pass through.
#[derive(Debug)]
pub(super) struct Tap<S> {
    inner: S,
    /// Follows what tungstenite reads.
    pub(super) tracker: Tracker,
}

impl<S> Tap<S> {
    /// Taps `inner`, whose frames and messages may be at most `limit` bytes.
    pub(super) fn new(inner: S, limit: usize) -> Self {
        Tap {
            inner,
            tracker: Tracker::new(limit),
        }
    }
}

impl<S: AsyncRead + Unpin> Tap<S> {
    /// After tungstenite refused an oversized message on its header: reads on, past
    /// tungstenite (the connection is dropped anyway), until the tracker holds the message's
    /// first [`PREFIX_BYTES`], the stream ends, or `within` passes. Reads at most a prefix and
    /// one chunk more.
    pub(super) async fn fill_prefix(&mut self, within: std::time::Duration) {
        use tokio::io::AsyncReadExt;
        let mut scratch = vec![0u8; PREFIX_BYTES];
        let _ = tokio::time::timeout(within, async {
            while self.tracker.wants_prefix() {
                match self.read(&mut scratch).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        })
        .await;
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Tap<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &polled {
            this.tracker.feed(&buf.filled()[before..]);
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tap<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const HTTP: &[u8] = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n";

    /// A server frame (unmasked).
    fn frame(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![if fin { 0x80 } else { 0 } | opcode];
        match payload.len() {
            n if n < 126 => f.push(n as u8),
            n if n <= 0xffff => {
                f.push(126);
                f.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                f.push(127);
                f.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        f.extend_from_slice(payload);
        f
    }

    /// Feeds `stream` in chunks of `chunk` bytes (every split point gets exercised).
    fn tracked(limit: usize, stream: &[u8], chunk: usize) -> Tracker {
        let mut t = Tracker::new(limit);
        for c in stream.chunks(chunk) {
            t.feed(c);
        }
        t
    }

    fn every_chunking(limit: usize, stream: &[u8], check: impl Fn(&mut Tracker, usize)) {
        for chunk in [1, 2, 3, 7, 64, stream.len().max(1)] {
            let mut t = tracked(limit, stream, chunk);
            check(&mut t, chunk);
        }
    }

    #[test]
    fn good_messages_leave_nothing_behind() {
        let mut s = HTTP.to_vec();
        s.extend(frame(true, 1, "{\"t\":\"日本語 🦀 مرحبا\"}".as_bytes()));
        s.extend(frame(true, 9, b"ping"));
        s.extend(frame(false, 1, "{\"a\":\"é".as_bytes()));
        s.extend(frame(true, 10, b""));
        s.extend(frame(true, 0, "€\"}".as_bytes()));
        s.extend(frame(true, 2, &[0xff, 0xfe]));
        every_chunking(1000, &s, |t, chunk| {
            assert_eq!(t.take_bad(), None, "chunk {chunk}: nothing is bad");
            assert_eq!(t.take_cut(), None, "chunk {chunk}: nothing is in progress");
            assert!(!t.mid_frame(), "chunk {chunk}: ended between frames");
        });
    }

    #[test]
    fn a_character_split_across_fragments_is_valid() {
        let crab = "🦀".as_bytes();
        let mut s = HTTP.to_vec();
        s.extend(frame(false, 1, &crab[..1]));
        s.extend(frame(false, 0, &crab[1..3]));
        s.extend(frame(true, 0, &crab[3..]));
        every_chunking(100, &s, |t, chunk| {
            assert_eq!(t.take_bad(), None, "chunk {chunk}");
        });
    }

    #[test]
    fn invalid_utf8_keeps_the_message_bytes() {
        let bad = b"{\"bad\":\"\xff\"}";
        let mut s = HTTP.to_vec();
        s.extend(frame(true, 1, b"{\"ok\":1}"));
        s.extend(frame(true, 1, bad));
        s.extend(frame(true, 1, b"{\"after\":1}"));
        every_chunking(100, &s, |t, chunk| {
            assert_eq!(
                t.take_bad(),
                Some(Finding::InvalidUtf8(bad.to_vec())),
                "chunk {chunk}"
            );
        });
        // A message ending inside a character.
        let mut s = HTTP.to_vec();
        s.extend(frame(true, 1, &"a€".as_bytes()[..3]));
        every_chunking(100, &s, |t, chunk| {
            assert!(
                matches!(t.take_bad(), Some(Finding::InvalidUtf8(_))),
                "chunk {chunk}"
            );
        });
    }

    #[test]
    fn an_oversized_frame_is_found_on_its_header_with_the_prefix_that_came() {
        let big = vec![b'x'; 10_000];
        let mut s = HTTP.to_vec();
        s.extend(frame(true, 1, b"{\"ok\":1}"));
        s.extend(frame(true, 1, &big));
        every_chunking(5000, &s, |t, chunk| {
            let Some(Finding::TooLarge { size, prefix }) = t.take_bad() else {
                panic!("chunk {chunk}: expected too large");
            };
            assert_eq!(size, 10_000);
            assert_eq!(prefix, vec![b'x'; PREFIX_BYTES], "chunk {chunk}");
        });
        // Only the header arrived: found, with an empty prefix.
        let mut s = HTTP.to_vec();
        s.extend(&frame(true, 1, &big)[..4]);
        let mut t = tracked(5000, &s, 3);
        assert_eq!(
            t.take_bad(),
            Some(Finding::TooLarge {
                size: 10_000,
                prefix: vec![]
            })
        );
    }

    #[test]
    fn a_fragmented_message_over_the_limit_is_found_by_its_sum() {
        let mut s = HTTP.to_vec();
        s.extend(frame(false, 1, &[b'a'; 60]));
        s.extend(frame(true, 0, &[b'b'; 60]));
        every_chunking(100, &s, |t, chunk| {
            let Some(Finding::TooLarge { size, prefix }) = t.take_bad() else {
                panic!("chunk {chunk}: expected too large");
            };
            assert_eq!(size, 120);
            assert_eq!(&prefix[..60], &[b'a'; 60][..], "chunk {chunk}");
        });
    }

    #[test]
    fn an_oversized_control_or_refused_frame_is_found_too_with_no_message_bytes() {
        // Found by the websocket_frames fuzz target: tungstenite checks the frame limit on
        // every frame's header, pings and pongs included, before anything else; the tap saw
        // only valid data frames.
        let mut s = HTTP.to_vec();
        s.extend(frame(false, 1, b"{\"a\":"));
        s.extend(frame(true, 9, &[b'p'; 36]));
        every_chunking(11, &s, |t, chunk| {
            assert_eq!(
                t.take_bad(),
                Some(Finding::TooLarge {
                    size: 36,
                    prefix: vec![]
                }),
                "chunk {chunk}: a 36-byte ping over a limit of 11, inside a text message"
            );
            assert!(!t.wants_prefix(), "chunk {chunk}: no prefix to wait for");
        });
        // Over the limit and refused anyway (reserved bits, a mask from the server):
        // tungstenite checks the size first.
        for (b0, b1) in [(0xe0, 0x60), (0x81, 0xe0)] {
            let mut s = HTTP.to_vec();
            s.extend([b0, b1, 1, 2, 3, 4]);
            every_chunking(11, &s, |t, chunk| {
                assert_eq!(
                    t.take_bad(),
                    Some(Finding::TooLarge {
                        size: 0x60,
                        prefix: vec![]
                    }),
                    "chunk {chunk}: header {b0:#x} {b1:#x}"
                );
            });
        }
        // Within the limit, a ping is nothing.
        let mut s = HTTP.to_vec();
        s.extend(frame(true, 9, &[b'p'; 11]));
        every_chunking(11, &s, |t, chunk| {
            assert_eq!(t.take_bad(), None, "chunk {chunk}");
        });
    }

    #[test]
    fn tracking_stops_where_tungstenite_stops() {
        // Found by the websocket_frames fuzz target: after a control frame tungstenite refuses
        // (fragmented, or over 125 bytes) or a close, the tap went on adding the next frames'
        // bytes to the message in progress, so a cut message kept bytes that were not its own.
        for stop in [
            frame(false, 9, b"ping"),
            frame(true, 9, &[b'p'; 126]),
            frame(true, 8, b""),
        ] {
            let mut s = HTTP.to_vec();
            s.extend(frame(false, 1, b"{\"a\":"));
            s.extend(&stop);
            s.extend(frame(false, 0, b"\"more\""));
            every_chunking(1000, &s, |t, chunk| {
                assert_eq!(
                    t.take_cut(),
                    Some(Finding::Cut(b"{\"a\":".to_vec())),
                    "chunk {chunk}: after {:?}",
                    &stop[..2]
                );
            });
        }
    }

    #[test]
    fn a_message_cut_by_the_end_of_the_stream() {
        let mut s = HTTP.to_vec();
        s.extend(frame(true, 1, b"{\"ok\":1}"));
        let whole = frame(true, 1, b"{\"cut\":\"here\"}");
        s.extend(&whole[..8]);
        every_chunking(100, &s, |t, chunk| {
            assert!(t.mid_frame(), "chunk {chunk}");
            assert_eq!(
                t.take_cut(),
                Some(Finding::Cut(b"{\"cut\"".to_vec())),
                "chunk {chunk}"
            );
        });
        // Ended inside a header: mid-frame, but no message to report.
        let mut s = HTTP.to_vec();
        s.push(0x81);
        let mut t = tracked(100, &s, 1);
        assert!(t.mid_frame());
        assert_eq!(t.take_cut(), None);
    }

    #[test]
    fn protocol_errors_stop_the_tracking() {
        // A masked frame from a server: tungstenite refuses it; nothing to report after.
        let mut s = HTTP.to_vec();
        s.extend([0x81, 0x82, 1, 2, 3, 4, 0xfe, 0xff]);
        s.extend(frame(true, 1, b"\xff"));
        let mut t = tracked(100, &s, 5);
        assert_eq!(t.take_bad(), None);
    }
}
