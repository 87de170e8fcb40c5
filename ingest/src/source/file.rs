//! The `file` source: an NDJSON file (`.gz` decoded on the fly, multi-member like `zcat`)
//! replayed as fast as the pipeline accepts it, at a fixed rate, or at the pace of the events'
//! own timestamps scaled by a speed factor; with `follow`, lines appended later are read too,
//! like `tail -F`.
//!
//! Without `follow` the source ends at the end of the file (and the pipeline stops once every
//! source has ended). A file that cannot be opened is logged and ends the source; with
//! `follow` it is waited for.
//!
//! Following wakes on the file system's change notifications (inotify via `notify`), not a
//! sleep loop; a 5 s re-check remains as a safety net for file systems that send none (NFS).
//! An unterminated last line is held back while following (more may come); a file that
//! shrinks (truncated) or is replaced (rotated) is read again from its start.
//!
//! **Resumable**: each record carries the file's identity (device and inode) and the byte
//! offset just past its line ([`FilePosition`]); the ingester stores it with the event, and
//! a restarted pipeline continues at the stored offset of the same file (a `.gz` file is
//! decompressed up to it). A different file at the path (rotated, replaced) or one shorter
//! than the offset is read from its start, and the log says so.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::{Duration, UNIX_EPOCH};

use async_compression::tokio::bufread::GzipDecoder;
use bytes::BytesMut;
use futures::stream::{BoxStream, Stream, StreamExt};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, BufReader};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::codec::{Decoder, FramedRead};

use serde::{Deserialize, Serialize};
use tokio::io::AsyncSeekExt;

use super::framing::{self, LineFramer};
use super::{BuildContext, Positioned, Raw, Source, SourceError, SourceSettings};
use crate::config::problems::Problems;
use crate::telemetry as t;

/// How fast a file source replays its events (`pace`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Pace {
    /// As fast as the pipeline accepts them.
    #[default]
    Fast,
    /// At `rate_per_sec`.
    Rate,
    /// Following the gaps between the events' own timestamps.
    Timestamps,
}

fn default_timestamp_field() -> String {
    "created_at".to_owned()
}
fn default_speed() -> f64 {
    1.0
}

/// Settings of a file source (`kind = "file"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// The newline-delimited JSON file to replay (required); `.gz` is decompressed.
    pub path: PathBuf,
    /// Replay speed: fast (the default), rate or timestamps.
    #[serde(default)]
    pub pace: Pace,
    /// With pace = "rate" (required there): events per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_per_sec: Option<f64>,
    /// With pace = "timestamps": the field (dotted path) holding each event's time, an RFC
    /// 3339 string or a number of seconds (milliseconds when above 10^11) since the epoch.
    /// Events without it are not delayed.
    #[serde(default = "default_timestamp_field")]
    pub timestamp_field: String,
    /// With pace = "timestamps": replay this many times faster than recorded.
    #[serde(default = "default_speed")]
    pub speed: f64,
    /// At the end, wait for appended lines like `tail -f` (the source never ends; a truncated
    /// or replaced file is read again from its start).
    #[serde(default)]
    pub follow: bool,
}

impl FileConfig {
    /// A fast replay of `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        FileConfig {
            path: path.into(),
            pace: Pace::Fast,
            rate_per_sec: None,
            timestamp_field: default_timestamp_field(),
            speed: default_speed(),
            follow: false,
        }
    }
}

impl SourceSettings for FileConfig {
    fn validate(&self, at: &str, p: &mut Problems) {
        if self.path.as_os_str().is_empty() {
            p.push(format!("{at}.path"), "must not be empty");
        }
        let gz = self.path.extension().is_some_and(|e| e == "gz");
        if gz && self.follow {
            p.push(
                format!("{at}.follow"),
                "a .gz file cannot be followed (it is compressed as a whole); set follow = false",
            );
        }
        match (self.pace, self.rate_per_sec) {
            (Pace::Rate, None) => p.push(
                format!("{at}.rate_per_sec"),
                "required for kind = \"file\" with pace = \"rate\"",
            ),
            (Pace::Rate, Some(r)) if !(r.is_finite() && r > 0.0) => p.push(
                format!("{at}.rate_per_sec"),
                format!("must be > 0 (got {r})"),
            ),
            (Pace::Fast | Pace::Timestamps, Some(_)) => {
                p.push(format!("{at}.rate_per_sec"), "only for pace = \"rate\"")
            }
            _ => {}
        }
        if self.pace == Pace::Timestamps {
            p.field_path(&format!("{at}.timestamp_field"), &self.timestamp_field);
        }
        if !(self.speed.is_finite() && self.speed > 0.0) {
            p.push(
                format!("{at}.speed"),
                format!("must be > 0 (got {})", self.speed),
            );
        }
    }

    fn build(&self, name: &str, ctx: &BuildContext) -> Result<Box<dyn Source>, SourceError> {
        let pacing = match self.pace {
            Pace::Fast => Pacing::Fast,
            Pace::Rate => Pacing::Rate(self.rate_per_sec.unwrap_or(1.0)),
            Pace::Timestamps => Pacing::Timestamps {
                field: self.timestamp_field.clone(),
                speed: self.speed,
            },
        };
        let o = FileOptions {
            path: self.path.clone(),
            pacing,
            follow: self.follow,
            max_line: ctx.max_line,
            start: None,
        };
        Ok(Box::new(FileSource::new(name, o)))
    }

    fn describe(&self) -> String {
        self.path.display().to_string()
    }
}

/// How fast events are replayed.
#[derive(Clone, Debug, PartialEq)]
pub enum Pacing {
    /// As fast as the pipeline accepts them.
    Fast,
    /// At this many events per second.
    Rate(f64),
    /// Keeping the gaps between the events' times (at `field`), divided by `speed`.
    Timestamps {
        /// Dotted path of the time field.
        field: String,
        /// Replay speed factor (2 = twice as fast as recorded).
        speed: f64,
    },
}

/// Settings of a file source.
#[derive(Clone, Debug)]
pub struct FileOptions {
    /// The NDJSON file (`.gz`: gzip-compressed).
    pub path: PathBuf,
    /// Replay pace.
    pub pacing: Pacing,
    /// Keep reading appended lines.
    pub follow: bool,
    /// Longest line in bytes.
    pub max_line: usize,
    /// Where to continue (set by [`Source::resume`]); `None`: from the start.
    pub start: Option<FilePosition>,
}

/// Where a file source stands: the file (device and inode, so a rotated or replaced file is
/// recognised) and the byte offset just past the last line handed over (of the decompressed
/// stream for a `.gz` file).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilePosition {
    /// The file's device.
    pub dev: u64,
    /// The file's inode.
    pub ino: u64,
    /// Bytes read up to the end of the last line handed over.
    pub offset: u64,
}

impl FilePosition {
    fn at(id: (u64, u64), offset: u64) -> Option<serde_json::Value> {
        serde_json::to_value(FilePosition {
            dev: id.0,
            ino: id.1,
            offset,
        })
        .ok()
    }
}

/// An over-long line reported before its end was read, held until the framer knows where it
/// ended, so it is handed over with the position after it: without one, a restart would
/// resume before it and store it again (and again at every restart when it is the file's last
/// line). Offsets are the framer's, from where reading started.
#[derive(Default)]
struct HeldLine(Option<Raw>);

impl HeldLine {
    /// The held line with the offset after it, once the framer has read its end.
    fn released(&mut self, framer: &mut LineFramer) -> Option<(Raw, u64)> {
        let end = framer.take_long_line_end()?;
        Some((self.0.take()?, end))
    }

    /// A frame's record with the offset after it, or `None` while its line goes on (held).
    fn frame(&mut self, framer: &LineFramer, raw: Raw) -> Option<(Raw, u64)> {
        if framer.at_line_start() {
            Some((raw, framer.consumed()))
        } else {
            self.0 = Some(raw);
            None
        }
    }

    /// At the end of the input: the held line, with the offset after it if its end was read.
    fn finish(&mut self, framer: &mut LineFramer) -> Option<(Raw, Option<u64>)> {
        let raw = self.0.take()?;
        Some((raw, framer.take_long_line_end()))
    }
}

/// The file source.
pub struct FileSource {
    name: String,
    options: FileOptions,
}

impl FileSource {
    /// A file source.
    pub fn new(name: impl Into<String>, options: FileOptions) -> Self {
        FileSource {
            name: name.into(),
            options,
        }
    }
}

impl Source for FileSource {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> &str {
        "file"
    }

    fn records(self: Box<Self>) -> BoxStream<'static, Raw> {
        self.positioned().map(|p| p.raw).boxed()
    }

    fn positioned(self: Box<Self>) -> BoxStream<'static, Positioned> {
        let FileSource { name, options } = *self;
        let pacing = options.pacing.clone();
        let lines = if options.follow {
            follow(name.clone(), options).boxed()
        } else {
            once(name.clone(), options).boxed()
        };
        paced(lines, pacing).boxed()
    }

    fn resume(&mut self, position: &serde_json::Value) {
        match FilePosition::deserialize(position) {
            Ok(p) => self.options.start = Some(p),
            Err(e) => t::SourceProblem {
                source: &self.name,
                error_type: t::SourceErrorType::ResumePosition,
                detail: format!(
                    "the stored position is not a file position ({e}); reading from the start"
                ),
                ends: false,
            }
            .emit(),
        }
    }
}

/// Where to start reading `file` (identity `id`) given the stored position: its offset when
/// it is the same file and long enough, else 0 (said in the log).
fn start_offset(name: &str, o: &FileOptions, id: (u64, u64), len: u64, gz: bool) -> u64 {
    let Some(p) = o.start else {
        return 0;
    };
    if (p.dev, p.ino) != id {
        tracing::info!(source = %name, path = %o.path.display(), "the stored position is of another file (rotated or replaced); reading this one from the start");
        return 0;
    }
    if !gz && p.offset > len {
        t::SourceProblem { source: name, error_type: t::SourceErrorType::ResumePosition, detail: format!("{}: the file ({len} bytes) is shorter than the stored position ({}): truncated; reading it from the start", o.path.display(), p.offset), ends: false }.emit();
        return 0;
    }
    tracing::info!(source = %name, path = %o.path.display(), offset = p.offset, "continuing after the stored position");
    p.offset
}

fn is_gz(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "gz")
}

/// The whole file once (from the stored position, if any).
fn once(name: String, o: FileOptions) -> impl Stream<Item = Positioned> + Send + 'static {
    async_stream::stream! {
        let mut file = match tokio::fs::File::open(&o.path).await {
            Ok(f) => f,
            Err(e) => {
                t::SourceProblem { source: &name, error_type: t::SourceErrorType::Io, detail: format!("{}: cannot open the file: {e}", o.path.display()), ends: true }.emit();
                return;
            }
        };
        let meta = file.metadata().await.ok();
        let id = meta.as_ref().map(identity).unwrap_or((0, 0));
        let len = meta.as_ref().map_or(0, |m| m.len());
        let gz = is_gz(&o.path);
        let start = start_offset(&name, &o, id, len, gz);
        if start > 0 && !gz && let Err(e) = file.seek(std::io::SeekFrom::Start(start)).await {
            t::SourceProblem { source: &name, error_type: t::SourceErrorType::Io, detail: format!("{}: cannot seek to the stored position: {e}", o.path.display()), ends: true }.emit();
            return;
        }
        tracing::info!(source = %name, path = %o.path.display(), "replaying");
        let mut reader: Pin<Box<dyn AsyncRead + Send>> = if gz {
            let mut gz = GzipDecoder::new(BufReader::new(file));
            gz.multiple_members(true);
            Box::pin(gz)
        } else {
            Box::pin(file)
        };
        if start > 0 && gz {
            // A compressed stream cannot seek: decompress up to the position.
            let skipped = tokio::io::copy(&mut (&mut reader).take(start), &mut tokio::io::sink()).await;
            if !matches!(skipped, Ok(n) if n == start) {
                t::SourceProblem { source: &name, error_type: t::SourceErrorType::ResumePosition, detail: format!("{}: the file ends before the stored position", o.path.display()), ends: true }.emit();
                return;
            }
        }
        let mut frames = FramedRead::new(reader, LineFramer::new(o.max_line));
        let mut n: u64 = 0;
        let mut held = HeldLine::default();
        while let Some(frame) = frames.next().await {
            let frame = match frame {
                Ok(f) => f,
                Err(e) => {
                    t::SourceProblem { source: &name, error_type: t::SourceErrorType::Io, detail: format!("{}: read failed: {e}", o.path.display()), ends: true }.emit();
                    break;
                }
            };
            if let Some((raw, end)) = held.released(frames.decoder_mut()) {
                n += 1;
                yield Positioned { raw, position: FilePosition::at(id, start + end) };
            }
            let Some(raw) = framing::ndjson(frame) else { continue };
            if let Some((raw, end)) = held.frame(frames.decoder(), raw) {
                n += 1;
                yield Positioned { raw, position: FilePosition::at(id, start + end) };
            }
        }
        // The file ended inside an over-long line (or reading failed there: no position).
        if let Some((raw, end)) = held.finish(frames.decoder_mut()) {
            n += 1;
            yield Positioned { raw, position: end.and_then(|end| FilePosition::at(id, start + end)) };
        }
        tracing::info!(source = %name, path = %o.path.display(), records = n, "end of file");
    }
}

/// Identity of the file behind a path (to notice rotation).
#[cfg(unix)]
fn identity(m: &std::fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (m.dev(), m.ino())
}

#[cfg(not(unix))]
fn identity(_: &std::fs::Metadata) -> (u64, u64) {
    (0, 0)
}

/// A watcher that sends `()` on any change in the file's directory; `None` when the platform
/// offers none (then the safety-net re-check alone drives reading).
fn watch(name: &str, path: &Path) -> (Option<notify::RecommendedWatcher>, mpsc::Receiver<()>) {
    use notify::Watcher;
    let (tx, rx) = mpsc::channel(1);
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_path_buf();
    let watcher = notify::recommended_watcher(move |_event: notify::Result<notify::Event>| {
        // A full channel already holds a wake-up: nothing is lost.
        let _ = tx.try_send(());
    })
    .and_then(|mut w| {
        w.watch(&dir, notify::RecursiveMode::NonRecursive)?;
        Ok(w)
    });
    match watcher {
        Ok(w) => (Some(w), rx),
        Err(e) => {
            t::SourceProblem {
                source: name,
                error_type: t::SourceErrorType::Watch,
                detail: format!("no file change notifications ({e}); re-checking every 5 s"),
                ends: false,
            }
            .emit();
            (None, rx)
        }
    }
}

/// Waits for a change notification, or the safety-net interval; without a watcher (its
/// sender is gone, so `recv` would return at once) just the interval.
async fn wait_for_change(changed: &mut mpsc::Receiver<()>, watching: bool) {
    const SAFETY_NET: Duration = Duration::from_secs(5);
    if watching {
        let _ = tokio::time::timeout(SAFETY_NET, changed.recv()).await;
    } else {
        tokio::time::sleep(SAFETY_NET).await;
    }
}

/// Reads lines as they are appended, forever.
fn follow(name: String, mut o: FileOptions) -> impl Stream<Item = Positioned> + Send + 'static {
    async_stream::stream! {
        let (watcher, mut changed) = watch(&name, &o.path);
        let mut waiting_logged = false;
        loop {
            // Open (or wait for) the file.
            let (mut file, id, len) = match tokio::fs::File::open(&o.path).await {
                Ok(f) => {
                    let meta = f.metadata().await.ok();
                    let id = meta.as_ref().map(identity);
                    (f, id, meta.map_or(0, |m| m.len()))
                }
                Err(e) => {
                    if !waiting_logged {
                        t::SourceProblem { source: &name, error_type: t::SourceErrorType::Io, detail: format!("{}: cannot open the file yet ({e}); waiting for it", o.path.display()), ends: false }.emit();
                        waiting_logged = true;
                    }
                    wait_for_change(&mut changed, watcher.is_some()).await;
                    continue;
                }
            };
            waiting_logged = false;
            let fid = id.unwrap_or((0, 0));
            // The stored position applies to the first file opened only.
            let start = start_offset(&name, &o, fid, len, false);
            o.start = None;
            if start > 0 && let Err(e) = file.seek(std::io::SeekFrom::Start(start)).await {
                t::SourceProblem { source: &name, error_type: t::SourceErrorType::Io, detail: format!("{}: cannot seek to the stored position ({e}); reading from the start", o.path.display()), ends: false }.emit();
            }
            tracing::info!(source = %name, path = %o.path.display(), "following");
            let mut framer = LineFramer::new(o.max_line);
            let mut buf = BytesMut::with_capacity(64 * 1024);
            let mut offset: u64 = start;
            let at = |end: u64| FilePosition::at(fid, start + end);
            let mut held = HeldLine::default();
            'read: loop {
                match file.read_buf(&mut buf).await {
                    Ok(0) => {
                        // At the end for now: was the file truncated or replaced?
                        let now = tokio::fs::metadata(&o.path).await;
                        let reopen = match &now {
                            Ok(m) => m.len() < offset || Some(identity(m)) != id,
                            Err(_) => false, // removed: keep reading the old one until a new one appears
                        };
                        if reopen {
                            // Whatever the old file left unterminated is cut off.
                            while let Ok(Some(f)) = framer.decode_eof(&mut buf) {
                                if let Some((raw, end)) = held.released(&mut framer) {
                                    yield Positioned { raw, position: at(end) };
                                }
                                let Some(raw) = framing::ndjson(f) else { continue };
                                if let Some((raw, end)) = held.frame(&framer, raw) {
                                    yield Positioned { raw, position: at(end) };
                                }
                            }
                            if let Some((raw, end)) = held.finish(&mut framer) {
                                yield Positioned { raw, position: end.and_then(at) };
                            }
                            tracing::info!(source = %name, path = %o.path.display(), "file truncated or replaced; reading it from the start");
                            break 'read;
                        }
                        wait_for_change(&mut changed, watcher.is_some()).await;
                    }
                    Ok(n) => {
                        offset += n as u64;
                        while let Ok(Some(f)) = framer.decode(&mut buf) {
                            if let Some((raw, end)) = held.released(&mut framer) {
                                yield Positioned { raw, position: at(end) };
                            }
                            let Some(raw) = framing::ndjson(f) else { continue };
                            if let Some((raw, end)) = held.frame(&framer, raw) {
                                yield Positioned { raw, position: at(end) };
                            }
                        }
                        // Its end may have come without a complete line after it.
                        if let Some((raw, end)) = held.released(&mut framer) {
                            yield Positioned { raw, position: at(end) };
                        }
                    }
                    Err(e) => {
                        t::SourceProblem { source: &name, error_type: t::SourceErrorType::Io, detail: format!("{}: read failed ({e}); reopening", o.path.display()), ends: false }.emit();
                        wait_for_change(&mut changed, watcher.is_some()).await;
                        break 'read;
                    }
                }
            }
        }
    }
}

/// Applies `pacing` to a stream of records.
fn paced(
    records: impl Stream<Item = Positioned> + Send + 'static,
    pacing: Pacing,
) -> impl Stream<Item = Positioned> + Send + 'static {
    async_stream::stream! {
        let mut records = std::pin::pin!(records);
        let start = Instant::now();
        let mut n: u64 = 0;
        // (first event time in seconds, when it was handed over)
        let mut origin: Option<(f64, Instant)> = None;
        while let Some(record) = records.next().await {
            match &pacing {
                Pacing::Fast => {}
                Pacing::Rate(rate) => {
                    let due = start + Duration::from_secs_f64(n as f64 / rate);
                    n += 1;
                    tokio::time::sleep_until(due).await;
                }
                Pacing::Timestamps { field, speed } => {
                    if let Some(at) = event_time(&record.raw, field) {
                        match origin {
                            None => origin = Some((at, Instant::now())),
                            Some((t0, w0)) => {
                                let offset = ((at - t0) / speed).clamp(0.0, 1e9);
                                tokio::time::sleep_until(w0 + Duration::from_secs_f64(offset)).await;
                            }
                        }
                    }
                }
            }
            yield record;
        }
    }
}

/// The time of an event, in seconds since the epoch: an RFC 3339 string, or a number of
/// seconds (milliseconds when above 10^11).
pub fn event_time(raw: &Raw, field: &str) -> Option<f64> {
    let parsed;
    let doc = match raw {
        Raw::Json(v) => v,
        Raw::Bytes(b) => {
            parsed = serde_json::from_slice::<Value>(b).ok()?;
            &parsed
        }
        Raw::Invalid { .. } => return None,
    };
    let mut v = doc;
    for part in field.split('.') {
        v = v.get(part)?;
    }
    match v {
        Value::Number(n) => {
            let x = n.as_f64()?;
            Some(if x.abs() > 1e11 { x / 1000.0 } else { x })
        }
        Value::String(s) => {
            let t = humantime::parse_rfc3339_weak(s).ok()?;
            let d = t.duration_since(UNIX_EPOCH).ok()?;
            Some(d.as_secs_f64())
        }
        _ => None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
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
}
