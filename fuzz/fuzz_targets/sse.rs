//! The SSE assembler (`ingest::source::sse::SseAssembler`) fed by the line framer, as the
//! `http` source runs them (`format = "sse"`: one limit for lines and events).
//!
//! Input: a byte for the limit, up to 3 read sizes, then the stream. Properties:
//! - an event handed over (`Raw::Bytes`) has data within the limit that is not blank, and
//!   never holds a line break the stream did not have between two `data:` lines (each of its
//!   lines is the value of one `data:` field of the input);
//! - a dead letter keeps at most `PREFIX_BYTES` (it goes into the store as it is);
//! - the last event id can be sent back as the `Last-Event-ID` header (no NUL, CR, LF or
//!   other control character but tab), and is the value of an `id:` field of the input;
//! - records, last event id and retry do not depend on how the stream was split into reads;
//! - a second assembler resuming from the first one's last event id (a reconnect) behaves the
//!   same on the same stream;
//! - choosing the event types (`events = ["update"]`) changes which events are records, not
//!   how the stream is cut into events: as many are dispatched, a record under both choices is
//!   the same record, and a skipped type's name keeps at most 256 characters.
#![no_main]

use ingest::source::Raw;
use ingest::source::framing::{LineFramer, PREFIX_BYTES, frame_chunks};
use ingest::source::sse::{Dispatched, SseAssembler};
use libfuzzer_sys::fuzz_target;
use tailrace_fuzz::{Knobs, chunks};

fn dispatch(
    max: usize,
    pieces: &[&[u8]],
    last_id: Option<String>,
    events: Option<Vec<String>>,
) -> (Vec<Dispatched>, SseAssembler) {
    let mut sse = SseAssembler::new(max, last_id);
    if let Some(events) = events {
        sse = sse.with_events(events);
    }
    let frames = frame_chunks(&mut LineFramer::new(max), pieces.iter().copied());
    let mut out: Vec<Dispatched> = frames.into_iter().filter_map(|f| sse.push(f)).collect();
    out.extend(sse.finish());
    (out, sse)
}

/// The records (events of the default type, `message`), as the `http` source ingests them.
fn assemble(max: usize, pieces: &[&[u8]], last_id: Option<String>) -> (Vec<Raw>, SseAssembler) {
    let (out, sse) = dispatch(max, pieces, last_id, None);
    let records = out
        .into_iter()
        .filter_map(|d| match d {
            Dispatched::Record(r) => Some(r),
            Dispatched::Skipped { .. } => None,
        })
        .collect();
    (records, sse)
}

fuzz_target!(|input: &[u8]| {
    let mut knobs = Knobs::new(input);
    let max = knobs.limit(1 << 16);
    let reads = knobs.reads();
    let data = knobs.rest();

    let (records, sse) = assemble(max, &chunks(data, &reads), None);
    let (whole, whole_sse) = assemble(max, &[data], None);
    assert_eq!(records, whole, "records depend on the reads {reads:?}");
    assert_eq!(
        sse.last_event_id(),
        whole_sse.last_event_id(),
        "id depends on the reads"
    );
    assert_eq!(sse.retry(), whole_sse.retry(), "retry depends on the reads");

    // The values of the input's fields, as a reader of the standard cuts them.
    let lines: Vec<&[u8]> = data
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
        .collect();
    let values = |field: &[u8]| -> Vec<Vec<u8>> {
        lines
            .iter()
            .filter_map(|l| {
                // A BOM may precede the first field.
                let l = l.strip_prefix("\u{feff}".as_bytes()).unwrap_or(l);
                let after = l.strip_prefix(field)?;
                if after.is_empty() {
                    // A field name alone: its value is empty.
                    return Some(Vec::new());
                }
                let v = after.strip_prefix(b":")?;
                Some(v.strip_prefix(b" ").unwrap_or(v).to_vec())
            })
            .collect()
    };

    let data_values = values(b"data");
    for (i, r) in records.iter().enumerate() {
        match r {
            Raw::Bytes(event) => {
                assert!(
                    event.len() <= max,
                    "record {i}: event of {} bytes over limit {max}",
                    event.len()
                );
                assert!(
                    !event.iter().all(u8::is_ascii_whitespace),
                    "record {i}: a blank event was handed over"
                );
                for line in event.split(|&b| b == b'\n') {
                    assert!(
                        data_values.iter().any(|v| v == line),
                        "record {i}: line {:?} is no data: value of the input",
                        String::from_utf8_lossy(line)
                    );
                }
            }
            Raw::Invalid { bytes, reason } => assert!(
                bytes.len() <= PREFIX_BYTES,
                "record {i}: dead letter ({}) keeps {} bytes, over {PREFIX_BYTES}",
                reason.as_str(),
                bytes.len()
            ),
            Raw::Json(_) => panic!("record {i}: the assembler parsed JSON itself"),
        }
    }

    if let Some(id) = sse.last_event_id() {
        // What an HTTP header value may hold (`http::HeaderValue::from_bytes`).
        assert!(
            id.bytes().all(|b| b == b'\t' || (b >= 0x20 && b != 0x7f)),
            "last event id {id:?} cannot be sent back as Last-Event-ID"
        );
        assert!(
            values(b"id").iter().any(|v| v == id.as_bytes()),
            "last event id {id:?} is no id: value of the input"
        );
    }

    // A reconnect resumes with the id; the same bytes give the same records.
    let resumed = sse.last_event_id().map(str::to_owned);
    let (again, again_sse) = assemble(max, &[data], resumed.clone());
    assert_eq!(again, records, "records depend on the id resumed from");
    assert_eq!(
        again_sse.last_event_id().map(str::to_owned),
        resumed,
        "the same stream after a resume ends on another id"
    );

    // Another choice of event types cuts the stream into the same events.
    let (default, _) = dispatch(max, &[data], None, None);
    let (named, _) = dispatch(max, &[data], None, Some(vec!["update".to_owned()]));
    assert_eq!(default.len(), named.len(), "the event types chosen change the events");
    for (i, (a, b)) in default.iter().zip(&named).enumerate() {
        match (a, b) {
            (Dispatched::Record(a), Dispatched::Record(b)) => {
                assert_eq!(a, b, "event {i}: the same event, another record")
            }
            (Dispatched::Skipped { event }, _) | (_, Dispatched::Skipped { event }) => assert!(
                event.chars().count() <= 256,
                "event {i}: a skipped type's name of {} characters",
                event.chars().count()
            ),
        }
    }
});
