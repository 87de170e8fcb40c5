//! Property tests of the line framer and the validator: arbitrary bytes, cut into arbitrary
//! chunks, never panic, never depend on where the chunks were cut, and never lose a valid line.

#![allow(clippy::unwrap_used)]

use ingest::ingester::validate;
use ingest::source::Raw;
use ingest::source::framing::{LineFramer, frame_chunks, ndjson};
use ingest::source::sse::{Dispatched, SseAssembler};
use proptest::prelude::*;

const MAX: usize = 64;

/// One line of input: a small valid event, or arbitrary bytes without a newline.
fn line() -> impl Strategy<Value = (bool, Vec<u8>)> {
    prop_oneof![
        (0u32..1000, "[a-z]{0,12}").prop_map(|(n, s)| {
            (
                true,
                serde_json::to_vec(&serde_json::json!({"n": n, "s": s})).unwrap(),
            )
        }),
        proptest::collection::vec(
            any::<u8>().prop_filter("no newline", |b| *b != b'\n'),
            0..100
        )
        .prop_map(|b| (false, b)),
    ]
}

/// Cuts `bytes` at the given (sorted, deduplicated) offsets.
fn cut(bytes: &[u8], mut at: Vec<usize>) -> Vec<&[u8]> {
    at.retain(|a| *a < bytes.len());
    at.sort_unstable();
    at.dedup();
    let mut out = Vec::new();
    let mut from = 0;
    for a in at {
        out.push(&bytes[from..a]);
        from = a;
    }
    out.push(&bytes[from..]);
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_bytes_in_arbitrary_chunks(
        bytes in proptest::collection::vec(any::<u8>(), 0..600),
        cuts in proptest::collection::vec(0usize..600, 0..20),
    ) {
        let whole = frame_chunks(&mut LineFramer::new(MAX), [&bytes[..]]);
        let chunked = frame_chunks(&mut LineFramer::new(MAX), cut(&bytes, cuts.clone()));
        prop_assert_eq!(&whole, &chunked, "chunking changes nothing");
        for frame in chunked {
            if let Some(raw) = ndjson(frame.clone()) {
                // Never panics, whatever it is.
                let _ = validate(raw, MAX);
            }
        }
        // SSE over the same bytes does not panic either, and stays bounded.
        let mut sse = SseAssembler::new(MAX, None);
        for frame in frame_chunks(&mut LineFramer::new(MAX), cut(&bytes, cuts)) {
            if let Some(Dispatched::Record(Raw::Bytes(b) | Raw::Invalid { bytes: b, .. })) = sse.push(frame) {
                prop_assert!(b.len() <= MAX.max(4096));
            }
        }
        let _ = sse.finish();
    }

    #[test]
    fn every_valid_line_arrives_in_order(
        lines in proptest::collection::vec(line(), 0..40),
        cuts in proptest::collection::vec(0usize..4000, 0..30),
        crlf in any::<bool>(),
    ) {
        let mut bytes = Vec::new();
        for (_, l) in &lines {
            bytes.extend_from_slice(l);
            bytes.extend_from_slice(if crlf { b"\r\n" } else { b"\n" });
        }
        let expected: Vec<serde_json::Value> = lines
            .iter()
            .filter(|(valid, l)| *valid && l.len() <= MAX)
            .map(|(_, l)| serde_json::from_slice(l).unwrap())
            .collect();
        let got: Vec<serde_json::Value> = frame_chunks(&mut LineFramer::new(MAX), cut(&bytes, cuts))
            .into_iter()
            .filter_map(ndjson)
            .filter_map(|raw| validate(raw, MAX).ok())
            .map(serde_json::Value::Object)
            .collect();
        // Arbitrary bytes may happen to be valid events too: the valid lines must appear, in
        // order, as a subsequence.
        let mut rest = got.iter();
        for want in &expected {
            prop_assert!(rest.any(|g| g == want), "{} missing from {:?}", want, got);
        }
    }
}
