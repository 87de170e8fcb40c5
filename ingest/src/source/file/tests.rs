//! Unit tests of `file.rs`.

use super::*;
use crate::source::RejectReason;
use std::io::Write;

const T: Duration = Duration::from_secs(10);

fn source(path: PathBuf, pacing: Pacing, follow: bool) -> BoxStream<'static, Raw> {
    Box::new(FileSource::new(
        "f",
        FileOptions {
            path,
            pacing,
            follow,
            max_line: 1000,
            start: None,
        },
    ))
    .records()
}

#[test]
fn event_times() {
    let raw = |s: &str| Raw::Bytes(s.as_bytes().to_vec());
    assert_eq!(event_time(&raw(r#"{"t": 12.5}"#), "t"), Some(12.5));
    assert_eq!(
        event_time(&raw(r#"{"a": {"t": 1700000000123}}"#), "a.t"),
        Some(1_700_000_000.123)
    );
    assert_eq!(
        event_time(&raw(r#"{"t": "2024-01-01T00:00:01Z"}"#), "t"),
        Some(1_704_067_201.0)
    );
    assert_eq!(event_time(&raw(r#"{"t": "yesterday"}"#), "t"), None);
    assert_eq!(event_time(&raw("not json"), "t"), None);
}

#[tokio::test]
async fn reads_plain_and_gzip_files_to_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let text = b"{\"a\":1}\nbad\n{\"a\":2}";
    let plain = dir.path().join("e.ndjson");
    std::fs::write(&plain, text).unwrap();
    let gz = dir.path().join("e.ndjson.gz");
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(&text[..8]).unwrap();
    let mut bytes = enc.finish().unwrap();
    // A second gzip member, as `cat a.gz b.gz` makes.
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(&text[8..]).unwrap();
    bytes.extend(enc.finish().unwrap());
    std::fs::write(&gz, bytes).unwrap();
    for path in [plain, gz] {
        let got: Vec<Raw> =
            tokio::time::timeout(T, source(path.clone(), Pacing::Fast, false).collect())
                .await
                .unwrap();
        assert_eq!(
            got,
            vec![
                Raw::Bytes(b"{\"a\":1}".to_vec()),
                Raw::Bytes(b"bad".to_vec()),
                Raw::Bytes(b"{\"a\":2}".to_vec())
            ],
            "{}",
            path.display()
        );
    }
}

#[tokio::test]
async fn a_missing_file_ends_the_source() {
    let got: Vec<Raw> = tokio::time::timeout(
        T,
        source("/nonexistent/x.ndjson".into(), Pacing::Fast, false).collect(),
    )
    .await
    .unwrap();
    assert!(got.is_empty());
}

#[tokio::test(start_paused = true)]
async fn rate_pacing_spaces_events() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e.ndjson");
    std::fs::write(&path, "{}\n".repeat(11)).unwrap();
    let start = Instant::now();
    let got: Vec<Raw> = source(path, Pacing::Rate(10.0), false).collect().await;
    assert_eq!(got.len(), 11);
    let took = start.elapsed();
    assert!(
        (Duration::from_millis(999)..Duration::from_millis(1100)).contains(&took),
        "11 events at 10/s take 1 s of (paused) time, took {took:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn timestamp_pacing_follows_the_recorded_gaps_scaled_by_speed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e.ndjson");
    std::fs::write(&path, "{\"t\":100}\n{\"t\":104}\n{\"x\":1}\n{\"t\":110}\n").unwrap();
    let start = Instant::now();
    let pacing = Pacing::Timestamps {
        field: "t".into(),
        speed: 2.0,
    };
    let got: Vec<Raw> = source(path, pacing, false).collect().await;
    assert_eq!(
        got.len(),
        4,
        "an event without a time is not delayed or dropped"
    );
    let took = start.elapsed();
    assert!(
        (Duration::from_millis(4999)..Duration::from_millis(5100)).contains(&took),
        "10 s of recorded time at speed 2 take 5 s, took {took:?}"
    );
}

#[tokio::test]
async fn follow_reads_appended_lines_and_survives_truncation() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("live.ndjson");
    std::fs::write(&path, "{\"n\":1}\n{\"n\":").unwrap();
    let mut s = source(path.clone(), Pacing::Fast, true);
    let next = async |s: &mut BoxStream<'static, Raw>| {
        tokio::time::timeout(T, s.next()).await.unwrap().unwrap()
    };
    assert_eq!(next(&mut s).await, Raw::Bytes(b"{\"n\":1}".to_vec()));
    // The unterminated line waits for the rest.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    f.write_all(b"2}\n{\"n\":3}\n").unwrap();
    assert_eq!(next(&mut s).await, Raw::Bytes(b"{\"n\":2}".to_vec()));
    assert_eq!(next(&mut s).await, Raw::Bytes(b"{\"n\":3}".to_vec()));
    // Truncated and rewritten: read from the start again.
    std::fs::write(&path, "{\"n\":9}\n").unwrap();
    assert_eq!(next(&mut s).await, Raw::Bytes(b"{\"n\":9}".to_vec()));
}

async fn positioned(o: FileOptions) -> Vec<Positioned> {
    let mut s = Box::new(FileSource::new("f", o)).positioned();
    let mut out = Vec::new();
    while let Some(p) = tokio::time::timeout(T, s.next()).await.unwrap() {
        out.push(p);
    }
    out
}

fn options(path: PathBuf) -> FileOptions {
    FileOptions {
        path,
        pacing: Pacing::Fast,
        follow: false,
        max_line: 64,
        start: None,
    }
}

#[tokio::test]
async fn a_resumed_file_continues_exactly_after_the_stored_position() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e.ndjson");
    let long = "x".repeat(100);
    let body = format!(
        "{{\"n\":1,\"t\":\"東京 🦀\"}}\r\n\n{{\"n\":2}}\n{{\"n\":\"{long}\"}}\n{{\"n\":3,\"$schema\":\"x\"}}\nnot json\n{{\"n\":4}}"
    );
    std::fs::write(&path, &body).unwrap();
    let all = positioned(options(path.clone())).await;
    assert_eq!(all.len(), 6, "{all:?}");
    // Resume after each record in turn: the rest is exactly what followed it.
    for k in 0..all.len() {
        let Some(p) = &all[k].position else {
            continue;
        };
        let mut s = FileSource::new("f", options(path.clone()));
        s.resume(p);
        let rest = positioned(s.options.clone()).await;
        let raws: Vec<&Raw> = rest.iter().map(|p| &p.raw).collect();
        let expected: Vec<&Raw> = all[k + 1..].iter().map(|p| &p.raw).collect();
        assert_eq!(raws, expected, "resumed after record {k}");
    }
    let last = all.last().unwrap().position.as_ref().unwrap();
    assert_eq!(
        last["offset"],
        serde_json::json!(body.len()),
        "the last position is the end of the file"
    );
    // Another file at the path (replaced): read from its start.
    let stored = all[2].position.clone().unwrap();
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, "{\"n\":9}\n").unwrap();
    let mut s = FileSource::new("f", options(path.clone()));
    s.resume(&stored);
    let fresh = positioned(s.options.clone()).await;
    let new_file_id = (
        fresh[0].position.as_ref().unwrap()["ino"].clone(),
        stored["ino"].clone(),
    );
    if new_file_id.0 != new_file_id.1 {
        assert_eq!(
            fresh.len(),
            1,
            "a replaced file is read from its start: {fresh:?}"
        );
    }
}

/// Lines 1 and 3 and the last are over the limit by far more than one read, so the
/// framer reports each before its end has been read; the last has no newline.
fn long_lines_body() -> String {
    let long = format!("{{\"blob\":\"{}\"}}", "🦀 big document ".repeat(20_000));
    format!("{{\"n\":1}}\n{long}\n{{\"n\":2}}\n{long}\r\n{long}\n{{\"n\":3}}\n{long}")
}

fn is_long(records: &[Positioned]) -> Vec<bool> {
    records
        .iter()
        .map(|p| {
            matches!(
                p.raw,
                Raw::Invalid {
                    reason: RejectReason::TooLarge,
                    ..
                }
            )
        })
        .collect()
}

/// Before: an over-long line whose end came in a later read was handed over without a
/// position. When it was the newest stored record (the file's last line, or a stop right
/// after it), every restart resumed before it and stored its dead letter again.
#[tokio::test]
async fn an_over_long_line_is_handed_over_with_the_position_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("long.ndjson");
    let body = long_lines_body();
    std::fs::write(&path, &body).unwrap();
    let all = positioned(options(path.clone())).await;
    assert_eq!(
        is_long(&all),
        [false, true, false, true, true, false, true],
        "the records, over-long ones included, in order"
    );
    for (k, record) in all.iter().enumerate() {
        let p = record
            .position
            .as_ref()
            .unwrap_or_else(|| panic!("record {k} has a position"));
        let mut s = FileSource::new("f", options(path.clone()));
        s.resume(p);
        let rest = positioned(s.options.clone()).await;
        assert_eq!(
            is_long(&rest),
            is_long(&all[k + 1..]),
            "resumed after record {k}: exactly what followed it"
        );
    }
    assert_eq!(
        all.last().unwrap().position.as_ref().unwrap()["offset"],
        serde_json::json!(body.len()),
        "the last record, an over-long line without a newline, ends at the end of the file"
    );
}

#[tokio::test]
async fn a_followed_file_hands_an_over_long_line_over_once_its_end_arrives() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("long.ndjson");
    let body = long_lines_body();
    std::fs::write(&path, &body).unwrap();
    let mut o = options(path.clone());
    o.follow = true;
    let mut s = Box::new(FileSource::new("f", o)).positioned();
    let mut seen = Vec::new();
    for _ in 0..6 {
        seen.push(tokio::time::timeout(T, s.next()).await.unwrap().unwrap());
    }
    assert_eq!(is_long(&seen), [false, true, false, true, true, false]);
    assert!(
        seen.iter().all(|p| p.position.is_some()),
        "every record has a position: {:?}",
        seen.iter().map(|p| &p.position).collect::<Vec<_>>()
    );
    // The last line's end is not there yet: it waits for it.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    f.write_all(b"\n").unwrap();
    let last = tokio::time::timeout(T, s.next()).await.unwrap().unwrap();
    assert_eq!(is_long(std::slice::from_ref(&last)), [true]);
    assert_eq!(
        last.position.unwrap()["offset"],
        serde_json::json!(body.len() + 1),
        "handed over with the position after its newline"
    );
}

#[tokio::test]
async fn a_resumed_gz_file_is_decompressed_up_to_the_stored_position() {
    use flate2::write::GzEncoder;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e.ndjson.gz");
    let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::default());
    for n in 0..50 {
        writeln!(gz, "{{\"n\":{n},\"t\":\"مرحبا\"}}").unwrap();
    }
    std::fs::write(&path, gz.finish().unwrap()).unwrap();
    let all = positioned(options(path.clone())).await;
    assert_eq!(all.len(), 50);
    let mut s = FileSource::new("f", options(path.clone()));
    s.resume(all[29].position.as_ref().unwrap());
    let rest = positioned(s.options.clone()).await;
    assert_eq!(rest.len(), 20, "records 30..50");
    assert_eq!(rest[0].raw, all[30].raw);
}
