//! WebSocket frame handling: a server's bytes read through the `websocket` source's tap and
//! tungstenite (`ingest::source::websocket::replay`, which answers the upgrade in memory).
//!
//! Input: a byte for the frame/message limit, up to 3 read sizes, then the server's bytes
//! after its `101` answer. Properties:
//! - the handshake always succeeds, and nothing panics;
//! - the outcome (messages, why reading stopped, what the tap found, the records) does not
//!   depend on how the bytes were split into reads;
//! - the tap agrees with tungstenite: a message tungstenite refuses as too large is one the
//!   tap found too large, with the same size; one refused as not UTF-8 is one the tap found not
//!   UTF-8; the bytes the tap kept are the first bytes of that very message (the first data
//!   message tungstenite did not deliver), as many as came up to the frame it was refused on,
//!   at most `PREFIX_BYTES`;
//! - a message cut by the end of the bytes is reported only when the bytes ended inside one;
//! - every dead letter holds at most `PREFIX_BYTES`; a text message's records are its lines.
#![no_main]

use std::sync::OnceLock;

use ingest::source::framing::PREFIX_BYTES;
use ingest::source::websocket::replay::{Delivered, Finding, Replay, Stop, replay};
use ingest::source::{Raw, RejectReason};
use libfuzzer_sys::fuzz_target;
use tailrace_fuzz::Knobs;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a current-thread runtime")
    })
}

/// A frame as the bytes announce it.
struct RefFrame<'a> {
    fin: bool,
    /// tungstenite refuses it (after its size check): reserved bits or opcode, a mask (a
    /// server must not mask), a fragmented or over-125-byte control frame, a continuation
    /// without a start or a start inside a message. It is the last frame cut.
    refused: bool,
    opcode: u8,
    len: u64,
    /// The payload bytes present (fewer than `len` when the bytes end inside it).
    payload: &'a [u8],
}

/// Cuts the server's bytes into frames, naively, up to the first one tungstenite refuses or a
/// close (after which it reads nothing more).
fn ref_frames(mut s: &[u8]) -> Vec<RefFrame<'_>> {
    let mut out = Vec::new();
    let mut in_message = false;
    while s.len() >= 2 {
        let (b0, b1) = (s[0], s[1]);
        let ext = match b1 & 0x7f {
            126 => 2,
            127 => 8,
            _ => 0,
        };
        let mask = if b1 & 0x80 != 0 { 4 } else { 0 };
        let head = 2 + ext + mask;
        if s.len() < head {
            break;
        }
        let len = match ext {
            2 => u64::from(u16::from_be_bytes([s[2], s[3]])),
            8 => u64::from_be_bytes([s[2], s[3], s[4], s[5], s[6], s[7], s[8], s[9]]),
            _ => u64::from(b1 & 0x7f),
        };
        let (fin, opcode) = (b0 & 0x80 != 0, b0 & 0x0f);
        let data = opcode <= 2;
        let refused = b0 & 0x70 != 0
            || mask != 0
            || (3..=7).contains(&opcode)
            || opcode > 10
            || (!data && (!fin || len > 125))
            || (data && matches!((opcode, in_message), (0, false) | (1 | 2, true)));
        let body = &s[head..];
        let have = usize::try_from(len).unwrap_or(usize::MAX).min(body.len());
        out.push(RefFrame {
            fin,
            refused,
            opcode,
            len,
            payload: &body[..have],
        });
        if refused || opcode == 8 {
            break;
        }
        if data {
            in_message = !fin;
        }
        s = &body[have..];
    }
    out
}

/// The frames of the `n`th data message (0-based).
fn message<'a, 'b>(frames: &'b [RefFrame<'a>], n: usize) -> Vec<&'b RefFrame<'a>> {
    let mut seen = 0;
    let mut out = Vec::new();
    for f in frames.iter().filter(|f| !f.refused) {
        match f.opcode {
            1 | 2 => {
                if seen == n + 1 {
                    break;
                }
                seen += 1;
                if seen == n + 1 {
                    out.push(f);
                }
            }
            0 if seen == n + 1 => out.push(f),
            _ => {}
        }
    }
    out
}

fn cat(frames: &[&RefFrame<'_>]) -> Vec<u8> {
    frames
        .iter()
        .flat_map(|f| f.payload.iter().copied())
        .collect()
}

fn capped(mut v: Vec<u8>) -> Vec<u8> {
    v.truncate(PREFIX_BYTES);
    v
}

fuzz_target!(|input: &[u8]| {
    let mut knobs = Knobs::new(input);
    let limit = knobs.limit(1 << 20);
    let reads = knobs.reads();
    let server = knobs.rest();

    let r: Replay = runtime().block_on(replay(server, &reads, limit));
    assert!(
        !matches!(r.stop, Stop::Handshake(_)),
        "the canned upgrade was refused: {:?}",
        r.stop
    );
    if !reads.is_empty() {
        let whole = runtime().block_on(replay(server, &[], limit));
        assert_eq!(r, whole, "the outcome depends on the reads {reads:?}");
    }

    for (i, rec) in r.records.iter().enumerate() {
        if let Raw::Invalid { bytes, reason } = rec {
            assert!(
                bytes.len() <= PREFIX_BYTES,
                "record {i} ({}): {} bytes kept",
                reason.as_str(),
                bytes.len()
            );
        }
    }

    let data_delivered = r
        .delivered
        .iter()
        .filter(|d| !matches!(d, Delivered::Control))
        .count();
    let frames = ref_frames(server);
    let refused = message(&frames, data_delivered);
    match (&r.stop, &r.finding) {
        (Stop::TooLarge { size }, found) => {
            let Some(Finding::TooLarge {
                size: tap_size,
                prefix,
            }) = found
            else {
                panic!("tungstenite refused {size} bytes as too large; the tap found {found:?}");
            };
            assert_eq!(
                tap_size, size,
                "the tap and tungstenite disagree on the size"
            );
            // The first frame over the limit, or whose message's sum crosses it (everything
            // before it was delivered): a data frame keeps its message's bytes up to its end,
            // a control frame (ping, pong, close) none.
            // A data frame that tungstenite refuses anyway counts as no data.
            let mut expected = None;
            let mut start = 0;
            let mut total = 0u64;
            for (i, f) in frames.iter().enumerate() {
                let data = f.opcode <= 2 && !f.refused;
                if data {
                    if f.opcode != 0 {
                        start = i;
                        total = 0;
                    }
                    total = total.saturating_add(f.len);
                }
                if f.len > limit as u64 || (data && total > limit as u64) {
                    let bytes = if data {
                        let of_message: Vec<&RefFrame<'_>> = frames[start..=i]
                            .iter()
                            .filter(|f| f.opcode <= 2 && !f.refused)
                            .collect();
                        cat(&of_message)
                    } else {
                        Vec::new()
                    };
                    expected = Some(capped(bytes));
                    break;
                }
            }
            let expected = expected.expect("the bytes have a frame over the limit");
            assert_eq!(
                *prefix, expected,
                "the prefix is not the refused message's first bytes"
            );
        }
        (Stop::InvalidUtf8, None) => {
            // Not a text message: a close frame's reason, and no record for it.
            let last = frames.last().expect("a frame was refused");
            assert!(
                last.opcode == 8
                    && last.payload.len() > 2
                    && std::str::from_utf8(&last.payload[2..]).is_err(),
                "tungstenite refused a text as not UTF-8; the tap found nothing, and it is no close reason"
            );
            assert!(
                !r.records.iter().any(|rec| matches!(
                    rec,
                    Raw::Invalid {
                        reason: RejectReason::InvalidUtf8,
                        ..
                    }
                )),
                "a dead letter for a close reason: {:?}",
                r.records
            );
        }
        (Stop::InvalidUtf8, found) => {
            let Some(Finding::InvalidUtf8(bytes)) = found else {
                panic!("tungstenite refused a text as not UTF-8; the tap found {found:?}");
            };
            // The frame after which the text cannot be UTF-8 any more.
            let at = (0..refused.len()).find(|&k| {
                let so_far = cat(&refused[..=k]);
                match std::str::from_utf8(&so_far) {
                    Ok(_) => false,
                    Err(e) => e.error_len().is_some() || refused[k].fin,
                }
            });
            let at = at.expect("the refused text has a frame where it stops being UTF-8");
            assert_eq!(
                *bytes,
                capped(cat(&refused[..=at])),
                "the bytes kept are not the refused text's first bytes"
            );
        }
        (_, Some(Finding::Cut(bytes))) => {
            assert!(
                r.mid_frame,
                "a cut message reported, but the bytes ended between frames"
            );
            assert!(
                matches!(r.stop, Stop::Reset | Stop::Other(_)),
                "a cut message reported on {:?}",
                r.stop
            );
            assert_eq!(
                *bytes,
                capped(cat(&refused)),
                "the cut message's bytes are not its first bytes"
            );
        }
        (stop, Some(f)) => panic!("the tap found {f:?} but reading stopped on {stop:?}"),
        (_, None) => {}
    }

    // Each text message hands over its lines.
    let texts = r.delivered.iter().filter_map(|d| match d {
        Delivered::Text(t) => Some(t),
        _ => None,
    });
    let lines: usize = texts
        .map(|t| {
            assert!(
                std::str::from_utf8(t).is_ok(),
                "a text message delivered that is not UTF-8"
            );
            t.split(|&b| b == b'\n')
                .filter(|l| !l.iter().all(u8::is_ascii_whitespace))
                .count()
        })
        .sum();
    let line_records = r
        .records
        .iter()
        .filter(|rec| matches!(rec, Raw::Bytes(_)))
        .count();
    assert_eq!(
        line_records, lines,
        "the text messages' lines are not the records"
    );
});
