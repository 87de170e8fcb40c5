//! A server's byte stream read through the real [`Tap`] and tungstenite, without a network:
//! the entry point of the `websocket_frames` fuzz target (`fuzz/`), hidden from the docs.
//!
//! [`replay`] answers the upgrade request the way a server would (so tungstenite's own client
//! handshake runs, and the tap sees the HTTP response as on a real connection, in the same
//! read as the first frame bytes), then serves the given bytes in reads of the given sizes (a tap must not depend on where reads split),
//! and reads messages until tungstenite stops, as the source's loop does. What it reports is
//! what tungstenite said and what the tap found, side by side, so a caller can check that they
//! agree; and the records the source would hand over, made by the source's own helpers
//! (`lines`, `finding_record`) on the same arms as its loop.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::StreamExt;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_tungstenite::tungstenite::error::{CapacityError, ProtocolError};
use tokio_tungstenite::tungstenite::{self, Message};

pub use super::tap::Finding;
use super::tap::Tap;
use super::{PREFIX_BYTES, Raw, RejectReason, finding_record, lines, protocol_config, request};

/// The host of the upgrade request (never resolved: there is no network here).
const URL: &str = "ws://replay.invalid/stream";
/// Bound on reading the rest of an oversized message's prefix (the bytes are all in memory,
/// so this never expires; it is the source's bound, kept for the same code path).
const PREFIX_WAIT: Duration = Duration::from_secs(1);

/// A message tungstenite delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivered {
    /// A text message.
    Text(Vec<u8>),
    /// A binary message.
    Binary(Vec<u8>),
    /// A ping, a pong or a raw frame (not records).
    Control,
}

/// How reading stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// tungstenite refused the handshake (cannot happen with the canned answer: a bug).
    Handshake(String),
    /// tungstenite refused a frame or message over the limit, of this size.
    TooLarge {
        /// The size tungstenite reported (a frame's announced length, or a message's sum).
        size: u64,
    },
    /// tungstenite refused a text message that is not UTF-8.
    InvalidUtf8,
    /// The bytes ended without a close frame.
    Reset,
    /// The server sent a close frame.
    Closed,
    /// Any other error tungstenite raised (a protocol violation), as text.
    Other(String),
    /// tungstenite's stream ended.
    Ended,
}

/// What reading a server's bytes gave.
#[derive(Debug, Clone, PartialEq)]
pub struct Replay {
    /// The messages tungstenite delivered, in order.
    pub delivered: Vec<Delivered>,
    /// Why reading stopped.
    pub stop: Stop,
    /// What the tap found: for [`Stop::TooLarge`] and [`Stop::InvalidUtf8`], the message
    /// tungstenite refused; otherwise the data message the bytes ended inside, if any.
    pub finding: Option<Finding>,
    /// Whether the tap saw the bytes end inside a frame or a fragmented message (read before
    /// the finding is taken).
    pub mid_frame: bool,
    /// The records the source hands over for all this.
    pub records: Vec<Raw>,
}

/// Reads `server` (the bytes after the HTTP response, i.e. frames) through the tap and
/// tungstenite with frames and messages of at most `limit` bytes, in reads of the sizes in
/// `reads` (cycled; a zero is read as one byte; empty means one read of everything). The
/// first read also holds the whole HTTP answer before its bytes.
pub async fn replay(server: &[u8], reads: &[usize], limit: usize) -> Replay {
    let limit = limit.max(1);
    let mut out = Replay {
        delivered: Vec::new(),
        stop: Stop::Ended,
        finding: None,
        mid_frame: false,
        records: Vec::new(),
    };
    let wire = Wire {
        request: Vec::new(),
        answer: None,
        server: server.to_vec(),
        at: 0,
        reads: reads.to_vec(),
        read_no: 0,
    };
    let req = match request("replay", URL, &[]) {
        Ok(r) => r,
        Err(e) => {
            out.stop = Stop::Handshake(e.to_string());
            return out;
        }
    };
    let tapped = Tap::new(wire, limit);
    let mut ws = match tokio_tungstenite::client_async_with_config(
        req,
        tapped,
        Some(protocol_config(limit)),
    )
    .await
    {
        Ok((ws, _)) => ws,
        Err(e) => {
            out.stop = Stop::Handshake(e.to_string());
            return out;
        }
    };
    // The arms below are the source's loop (`run`), minus logging and reconnecting.
    loop {
        let message = match ws.next().await {
            None => {
                out.mid_frame = ws.get_ref().tracker.mid_frame();
                break;
            }
            Some(Ok(m)) => m,
            Some(Err(e)) => {
                let tap = ws.get_mut();
                if matches!(e, tungstenite::Error::Capacity(_)) {
                    tap.fill_prefix(PREFIX_WAIT).await;
                }
                let tracker = &mut tap.tracker;
                out.mid_frame = tracker.mid_frame();
                match e {
                    tungstenite::Error::Capacity(CapacityError::MessageTooLong {
                        size, ..
                    }) => {
                        out.stop = Stop::TooLarge { size: size as u64 };
                        out.finding = tracker.take_bad();
                        let found = out
                            .finding
                            .clone()
                            .filter(|f| matches!(f, Finding::TooLarge { .. }));
                        out.records
                            .push(finding_record(found, RejectReason::TooLarge));
                    }
                    tungstenite::Error::Utf8(_) => {
                        out.stop = Stop::InvalidUtf8;
                        out.finding = tracker.take_bad();
                        // No finding: a close frame's reason (not an event).
                        if let Some(found) = out
                            .finding
                            .clone()
                            .filter(|f| matches!(f, Finding::InvalidUtf8(_)))
                        {
                            out.records
                                .push(finding_record(Some(found), RejectReason::InvalidUtf8));
                        }
                    }
                    tungstenite::Error::Protocol(ProtocolError::ResetWithoutClosingHandshake)
                        if !tracker.mid_frame() =>
                    {
                        out.stop = Stop::Reset;
                    }
                    e => {
                        out.stop = match e {
                            tungstenite::Error::Protocol(
                                ProtocolError::ResetWithoutClosingHandshake,
                            ) => Stop::Reset,
                            e => Stop::Other(e.to_string()),
                        };
                        out.finding = tracker.take_cut();
                        if let Some(cut) = out.finding.clone() {
                            out.records
                                .push(finding_record(Some(cut), RejectReason::Truncated));
                        }
                    }
                }
                break;
            }
        };
        match message {
            Message::Text(text) => {
                out.records.extend(lines(text.as_bytes()));
                out.delivered
                    .push(Delivered::Text(text.as_bytes().to_vec()));
            }
            Message::Binary(bytes) => {
                let keep = bytes.len().min(PREFIX_BYTES);
                out.records.push(Raw::Invalid {
                    bytes: bytes[..keep].to_vec(),
                    reason: RejectReason::BinaryFrame,
                });
                out.delivered.push(Delivered::Binary(bytes.to_vec()));
            }
            Message::Close(_) => {
                out.stop = Stop::Closed;
                break;
            }
            Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => {
                out.delivered.push(Delivered::Control);
            }
        }
    }
    out
}

/// An in-memory server: answers the upgrade request it was written, then serves its bytes in
/// reads of the given sizes, then ends. Whatever the client writes afterwards (pongs, a close)
/// is dropped.
struct Wire {
    request: Vec<u8>,
    /// The HTTP answer and the server's bytes, once the request is complete.
    answer: Option<Vec<u8>>,
    server: Vec<u8>,
    at: usize,
    reads: Vec<usize>,
    read_no: usize,
}

impl Wire {
    /// The `101` answer to the request written so far (`None` while it is incomplete).
    fn answer(&self) -> Option<Vec<u8>> {
        let text = std::str::from_utf8(&self.request).ok()?;
        let head = text.split("\r\n\r\n").next()?;
        if !text.contains("\r\n\r\n") {
            return None;
        }
        let key = head.lines().find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("sec-websocket-key")
                .then(|| value.trim().to_owned())
        })?;
        let accept = tungstenite::handshake::derive_accept_key(key.as_bytes());
        let mut answer = format!(
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n"
        )
        .into_bytes();
        answer.extend_from_slice(&self.server);
        Some(answer)
    }
}

impl AsyncRead for Wire {
    fn poll_read(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.answer.is_none() {
            match this.answer() {
                Some(a) => this.answer = Some(a),
                None => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "read before the upgrade request was written",
                    )));
                }
            }
        }
        let Some(answer) = &this.answer else {
            return Poll::Ready(Ok(()));
        };
        let left = answer.len() - this.at;
        let mut size = if this.reads.is_empty() {
            left
        } else {
            this.reads[this.read_no % this.reads.len()].max(1)
        };
        if this.read_no == 0 {
            // The HTTP answer comes whole in the first read, with the first bytes after it:
            // tungstenite's handshake refuses an answer in many tiny reads ("attack attempt").
            size += answer.len() - this.server.len();
        }
        this.read_no += 1;
        let n = size.min(left).min(buf.remaining());
        buf.put_slice(&answer[this.at..this.at + n]);
        this.at += n;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Wire {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        bytes: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.answer.is_none() {
            this.request.extend_from_slice(bytes);
        }
        Poll::Ready(Ok(bytes.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn frame(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![if fin { 0x80 } else { 0 } | opcode];
        match payload.len() {
            n if n < 126 => f.push(n as u8),
            n => {
                f.push(126);
                f.extend_from_slice(&(n as u16).to_be_bytes());
            }
        }
        f.extend_from_slice(payload);
        f
    }

    async fn run(server: &[u8], reads: &[usize], limit: usize) -> Replay {
        tokio::time::timeout(Duration::from_secs(10), replay(server, reads, limit))
            .await
            .expect("a replay of bytes in memory finishes at once")
    }

    #[tokio::test]
    async fn messages_and_a_clean_reset_whatever_the_reads() {
        let mut s = frame(true, 1, "{\"t\":\"日本語 🦀\"}\n{\"u\":2}".as_bytes());
        s.extend(frame(true, 9, b"hi"));
        s.extend(frame(true, 2, b"\x00\x01"));
        for reads in [&[][..], &[1], &[3, 1, 7]] {
            let r = run(&s, reads, 1000).await;
            assert_eq!(
                r.delivered,
                vec![
                    Delivered::Text("{\"t\":\"日本語 🦀\"}\n{\"u\":2}".as_bytes().to_vec()),
                    Delivered::Control,
                    Delivered::Binary(vec![0, 1]),
                ],
                "reads {reads:?}"
            );
            assert_eq!(r.stop, Stop::Reset, "reads {reads:?}: the bytes just end");
            assert_eq!(r.finding, None, "reads {reads:?}");
            assert_eq!(r.records.len(), 3, "two lines and a binary frame: {r:?}");
        }
    }

    #[tokio::test]
    async fn refusals_come_with_the_taps_finding() {
        let s = frame(true, 1, b"{\"a\":\"\xff\"}");
        let r = run(&s, &[2], 1000).await;
        assert_eq!(r.stop, Stop::InvalidUtf8);
        assert_eq!(
            r.finding,
            Some(Finding::InvalidUtf8(b"{\"a\":\"\xff\"}".to_vec()))
        );
        let s = frame(true, 1, &[b'x'; 300]);
        let r = run(&s, &[5], 100).await;
        assert_eq!(r.stop, Stop::TooLarge { size: 300 });
        assert_eq!(
            r.finding,
            Some(Finding::TooLarge {
                size: 300,
                prefix: vec![b'x'; 300]
            }),
            "the prefix is read on past tungstenite"
        );
        // A close frame whose reason is not UTF-8: tungstenite says Utf8, but it is no event.
        let mut s = frame(true, 1, b"{}");
        s.extend(frame(true, 8, b"\x03\xe9bad \x90"));
        let r = run(&s, &[3], 100).await;
        assert_eq!(r.stop, Stop::InvalidUtf8);
        assert_eq!(r.finding, None);
        assert_eq!(
            r.records,
            vec![Raw::Bytes(b"{}".to_vec())],
            "no dead letter for a close reason"
        );
        let cut = &frame(true, 1, b"{\"cut\":1}")[..6];
        let r = run(cut, &[1], 100).await;
        assert_eq!(r.stop, Stop::Reset);
        assert!(r.mid_frame);
        assert_eq!(r.finding, Some(Finding::Cut(b"{\"cu".to_vec())));
    }
}
