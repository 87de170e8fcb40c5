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
mod tests;
