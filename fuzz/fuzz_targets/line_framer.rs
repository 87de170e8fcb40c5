//! The line framer (`ingest::source::framing::LineFramer`) and its NDJSON mapping.
//!
//! Input: a byte for the line limit, up to 3 read sizes, then the stream. Properties:
//! - no frame is longer than the limit (a too-long line's prefix neither), nor than
//!   `PREFIX_BYTES` for a too-long line;
//! - the frames account for every input byte: walking the input, each line is there followed
//!   by its `\n` / `\r\n`, each too-long line starts with its prefix and really was over the
//!   limit (the rest, up to its newline, is what was dropped), a partial last line is the rest;
//!   nothing is skipped, nothing is left over;
//! - the frames do not depend on how the stream was split into reads;
//! - the buffer never holds more than the limit, one byte of slack and one read;
//! - `ndjson` keeps each line's bytes as they are and drops only blank lines.
#![no_main]

use bytes::BytesMut;
use ingest::source::Raw;
use ingest::source::framing::{Frame, LineFramer, PREFIX_BYTES, frame_chunks, ndjson};
use libfuzzer_sys::fuzz_target;
use tailrace_fuzz::{Knobs, chunks};
use tokio_util::codec::Decoder;

fuzz_target!(|input: &[u8]| {
    let mut knobs = Knobs::new(input);
    let max = knobs.limit(1 << 16);
    let reads = knobs.reads();
    let data = knobs.rest();

    // Framed read by read, watching the buffer.
    let mut framer = LineFramer::new(max);
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    for chunk in chunks(data, &reads) {
        buf.extend_from_slice(chunk);
        while let Some(f) = framer.decode(&mut buf).expect("the framer never fails") {
            frames.push(f);
        }
        assert!(
            buf.len() <= max + 1 + chunk.len(),
            "buffer holds {} bytes: over limit {max} + 1 + read {}",
            buf.len(),
            chunk.len()
        );
    }
    while let Some(f) = framer.decode_eof(&mut buf).expect("the framer never fails") {
        frames.push(f);
    }
    assert!(
        buf.is_empty(),
        "{} bytes left in the buffer at the end",
        buf.len()
    );

    // The same stream in one read gives the same frames.
    let whole = frame_chunks(&mut LineFramer::new(max), [data]);
    assert_eq!(frames, whole, "frames depend on the reads {reads:?}");

    // Every byte accounted for, in order.
    let mut at = 0;
    for (i, f) in frames.iter().enumerate() {
        let rest = &data[at..];
        match f {
            Frame::Line(line) => {
                assert!(
                    line.len() <= max,
                    "frame {i}: line of {} bytes over limit {max}",
                    line.len()
                );
                assert!(
                    rest.starts_with(line),
                    "frame {i}: line is not the next input bytes"
                );
                let after = &rest[line.len()..];
                let ending = if after.starts_with(b"\n") {
                    1
                } else if after.starts_with(b"\r\n") {
                    2
                } else {
                    panic!(
                        "frame {i}: line not followed by its newline: {:?}",
                        &after[..after.len().min(4)]
                    );
                };
                at += line.len() + ending;
            }
            Frame::TooLong(prefix) => {
                assert!(
                    prefix.len() <= max.min(PREFIX_BYTES),
                    "frame {i}: prefix of {} bytes (limit {max})",
                    prefix.len()
                );
                assert!(
                    rest.starts_with(prefix),
                    "frame {i}: prefix is not the next input bytes"
                );
                let line_end = rest.iter().position(|&b| b == b'\n');
                let content = &rest[..line_end.unwrap_or(rest.len())];
                let content = content.strip_suffix(b"\r").unwrap_or(content);
                assert!(
                    content.len() > max,
                    "frame {i}: reported too long, but the line has {} bytes (limit {max})",
                    content.len()
                );
                assert_eq!(
                    prefix.len(),
                    content.len().min(max).min(PREFIX_BYTES),
                    "frame {i}: prefix shorter than it could be"
                );
                at += line_end.map_or(rest.len(), |e| e + 1);
            }
            Frame::Partial(tail) => {
                assert_eq!(
                    i,
                    frames.len() - 1,
                    "frame {i}: a partial line before the end"
                );
                assert!(
                    !rest.contains(&b'\n'),
                    "frame {i}: partial line but a newline follows"
                );
                assert!(
                    tail.len() <= max,
                    "frame {i}: last line of {} bytes over limit {max}",
                    tail.len()
                );
                let expected = rest.strip_suffix(b"\r").unwrap_or(rest);
                assert_eq!(
                    tail.as_slice(),
                    expected,
                    "frame {i}: partial line is not the rest"
                );
                at = data.len();
            }
        }
    }
    assert_eq!(
        at,
        data.len(),
        "{} input bytes not accounted for by any frame",
        data.len() - at
    );

    // NDJSON keeps the bytes, drops only blank lines.
    for f in frames {
        let (bytes, blank) = match &f {
            Frame::Line(b) | Frame::Partial(b) | Frame::TooLong(b) => {
                (b.clone(), b.iter().all(u8::is_ascii_whitespace))
            }
        };
        match ndjson(f.clone()) {
            None => assert!(blank && !matches!(f, Frame::TooLong(_)), "{f:?} dropped"),
            Some(Raw::Bytes(b)) | Some(Raw::Invalid { bytes: b, .. }) => {
                assert_eq!(b, bytes, "ndjson changed the bytes of {f:?}")
            }
            Some(Raw::Json(_)) => panic!("ndjson parsed {f:?} itself"),
        }
    }
});
