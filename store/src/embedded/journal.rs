//! The journal: numbered segment files of records (`format`), written at the tail only.
//!
//! A segment's space is allocated ahead of its tail, [`ALLOC_STEP`] at a time (`fallocate`),
//! so a commit rarely grows a file: it writes its record into space the file already has and
//! syncs it. A full disk shows when that space runs out (a transient error: the write is
//! tried again), never halfway through a record. Where the
//! filesystem allows it (not tmpfs), the journal is written with `O_DIRECT`: a commit then
//! writes exactly its padded record, where a buffered write would dirty, and have written
//! back, at least a whole 4 KiB page of the page cache (the kernel counts it so in
//! `write_bytes`), however small the record. Reads go through the page cache, on a handle of
//! their own.
//!
//! The end of the journal is the first place in the last segment that does not hold a whole
//! record with a good checksum and the next record number: zeros (space allocated but not
//! yet written) or a record cut short by a crash. Nothing after it was acknowledged: a commit
//! is acknowledged only once its write returned (and, for `journaled`, its sync).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::format::{self, FIXED, Header};
use super::fs::{Fs, FsFile, Open};
use crate::{Result, StoreError};

/// The journal's directory inside the data directory.
pub(crate) const DIR: &str = "journal";
/// Space allocated to a segment at a time.
pub(crate) const ALLOC_STEP: u64 = 1 << 20;
/// The most a scan reads at once (recovery, catch-up: long sequential reads).
const SCAN_CHUNK: usize = 1 << 20;
/// A scan's first read. A point read (`get`, `latest`) starts at a seek point at most
/// `SEEK_EVERY` before its record, so it seldom needs more, and reading a whole
/// [`SCAN_CHUNK`] for it copied a megabyte per document; a long scan doubles its reads up to
/// [`SCAN_CHUNK`].
const FIRST_CHUNK: usize = 64 << 10;

/// Counters of what the journal did, for tests, the bench and the closing note of a change.
#[derive(Debug, Default)]
pub struct IoStats {
    /// Records written.
    pub records: AtomicU64,
    /// Bytes written to the journal, padding included.
    pub bytes: AtomicU64,
    /// `fdatasync` calls on journal segments.
    pub syncs: AtomicU64,
    /// Whether the journal is written with `O_DIRECT`.
    pub direct: std::sync::atomic::AtomicBool,
}

/// A snapshot of [`IoStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoCounts {
    /// Records written (one per commit).
    pub records: u64,
    /// Bytes written to the journal, padding included.
    pub bytes: u64,
    /// `fdatasync` calls on journal segments.
    pub syncs: u64,
    /// Whether the journal is written with `O_DIRECT`.
    pub direct: bool,
}

impl IoStats {
    pub(crate) fn counts(&self) -> IoCounts {
        IoCounts {
            records: self.records.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            syncs: self.syncs.load(Ordering::Relaxed),
            direct: self.direct.load(Ordering::Relaxed),
        }
    }
}

pub(crate) fn segment_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:016x}.log"))
}

pub(crate) fn index_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:016x}.idx"))
}

/// The segment numbers in `dir`, in order.
pub(crate) fn list_segments(fs: &dyn Fs, dir: &Path) -> Result<Vec<u64>> {
    let mut out = Vec::new();
    let entries = fs.list(dir).map_err(|source| StoreError::Io {
        context: format!("listing {}", dir.display()),
        source,
    })?;
    for name in entries {
        if let Some(hex) = name.strip_suffix(".log")
            && let Ok(seq) = u64::from_str_radix(hex, 16)
        {
            out.push(seq);
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// An I/O error as the store reports it: a full disk (or quota) is transient, and says
/// "disk full" so an operator reading `/readyz` knows at once.
pub(crate) fn io_error(context: impl Into<String>, source: io::Error) -> StoreError {
    let context = context.into();
    if matches!(source.raw_os_error(), Some(28 | 122)) {
        return StoreError::Unavailable {
            engine: "embedded",
            message: format!("disk full: {context}: {source}"),
        };
    }
    StoreError::Io { context, source }
}

pub(crate) fn fsync_dir(fs: &dyn Fs, dir: &Path) -> Result<()> {
    fs.sync_dir(dir)
        .map_err(|e| io_error(format!("syncing directory {}", dir.display()), e))
}

/// Opens a segment for writing: with `O_DIRECT` when `direct` and the filesystem takes it.
fn open_for_writing(fs: &dyn Fs, path: &Path, direct: bool) -> io::Result<Arc<dyn FsFile>> {
    fs.open(
        path,
        Open::Write {
            create: false,
            truncate: false,
            direct,
        },
    )
}

/// A buffer whose data starts on a 4 KiB boundary, as `O_DIRECT` requires.
struct Aligned {
    raw: Vec<u8>,
}

impl Aligned {
    const ALIGN: usize = 4096;

    /// A slice of `len` bytes at an aligned address: `head`, then `data`, then zeros.
    fn stage(&mut self, head: &[u8], data: &[u8], len: usize) -> &[u8] {
        if self.raw.len() < len + Self::ALIGN {
            self.raw = vec![0; (len + Self::ALIGN).next_power_of_two()];
        }
        let start = self.raw.as_ptr().align_offset(Self::ALIGN);
        let out = &mut self.raw[start..start + len];
        out[..head.len()].copy_from_slice(head);
        out[head.len()..head.len() + data.len()].copy_from_slice(data);
        out[head.len() + data.len()..].fill(0);
        out
    }
}

/// The unit of every journal write: the larger of 4 KiB and what the device needs for
/// `O_DIRECT` (`STATX_DIOALIGN`: 512 on most disks, 4 KiB on 4Kn disks and dm-crypt).
///
/// Why whole 4 KiB blocks even where 512 bytes would do: most disks write 4 KiB physical
/// sectors ("512e" disks only address them in 512-byte blocks), so a 512-byte write is a
/// read-modify-write of a physical sector that may hold records synced before, and a power
/// cut during it can damage them. A write of a whole sector is atomic on the device (it
/// leaves the old sector or the new one): the last block's earlier records are written again
/// unchanged ([`Writer::carry`]), and either outcome holds them. Records themselves stay
/// packed on 512-byte boundaries, so the journal takes no more room; each commit writes at
/// least one block, which on such a disk it did anyway.
pub(crate) fn block_size(write_align: u64) -> u64 {
    write_align.max(4096)
}

/// A segment as readers use it.
#[derive(Debug)]
pub(crate) struct Segment {
    pub seq: u64,
    pub file: Arc<dyn FsFile>,
}

impl Segment {
    pub fn open(fs: &dyn Fs, dir: &Path, seq: u64) -> Result<Arc<Segment>> {
        let path = segment_path(dir, seq);
        let file = fs
            .open(&path, Open::Read)
            .map_err(|e| io_error(format!("opening {}", path.display()), e))?;
        Ok(Arc::new(Segment { seq, file }))
    }

    /// The file's length.
    pub fn len(&self) -> Result<u64> {
        self.file
            .size()
            .map_err(|e| io_error(format!("reading journal segment {:x}", self.seq), e))
    }

    /// Reads the record at `offset` whole.
    #[cfg(test)]
    pub fn read_record(&self, offset: u64) -> Result<Vec<u8>> {
        let mut head = [0u8; FIXED];
        self.read_at(&mut head, offset)?;
        let (_, total) = Header::peek(&head).ok_or_else(|| StoreError::Engine {
            engine: "embedded",
            message: format!(
                "journal segment {:x}: no record at offset {offset}",
                self.seq
            ),
        })?;
        let mut buf = vec![0u8; total];
        self.read_at(&mut buf, offset)?;
        Ok(buf)
    }

    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.file.read_at(buf, offset).map_err(|e| {
            io_error(
                format!("reading journal segment {:x} at {offset}", self.seq),
                e,
            )
        })
    }
}

/// Reads records one after the other from a segment, in large reads.
pub(crate) struct SegmentScan<'a> {
    seg: &'a Segment,
    buf: ScanBuf<'a>,
    /// How much of `buf` holds the file from `buf_at` on (it may be longer: a reused buffer
    /// is never shrunk, so it is zeroed only where it grows).
    filled: usize,
    /// File offset of `buf[0]`.
    buf_at: u64,
    /// Offset of the next record.
    pub at: u64,
    end: u64,
    /// What the next read takes at least.
    chunk: usize,
}

/// A scan's buffer: its own, or one a caller reuses from scan to scan (a query reads a
/// thousand documents per scan, and a new megabyte each time is zeroed and faulted in anew).
enum ScanBuf<'a> {
    Own(Vec<u8>),
    Lent(&'a mut Vec<u8>),
}

impl ScanBuf<'_> {
    fn vec(&mut self) -> &mut Vec<u8> {
        match self {
            ScanBuf::Own(v) => v,
            ScanBuf::Lent(v) => v,
        }
    }

    fn bytes(&self) -> &[u8] {
        match self {
            ScanBuf::Own(v) => v,
            ScanBuf::Lent(v) => v,
        }
    }
}

impl<'a> SegmentScan<'a> {
    /// Scans from `at` up to `end` (the segment's length, or the journal's tail).
    pub fn new(seg: &'a Segment, at: u64, end: u64) -> Self {
        Self::with(seg, at, end, ScanBuf::Own(Vec::new()))
    }

    /// [`SegmentScan::new`], reading into `buf` (whatever it holds is overwritten).
    pub fn in_buffer(seg: &'a Segment, at: u64, end: u64, buf: &'a mut Vec<u8>) -> Self {
        Self::with(seg, at, end, ScanBuf::Lent(buf))
    }

    fn with(seg: &'a Segment, at: u64, end: u64, buf: ScanBuf<'a>) -> Self {
        SegmentScan {
            seg,
            buf,
            filled: 0,
            buf_at: at,
            at,
            end,
            chunk: FIRST_CHUNK,
        }
    }

    /// Makes `buf` hold `[at, at + len)`; false when that passes `end`.
    fn fill(&mut self, len: usize) -> Result<bool> {
        if self.at + len as u64 > self.end {
            return Ok(false);
        }
        let have = self.buf_at + self.filled as u64;
        if self.at >= self.buf_at && self.at + len as u64 <= have {
            return Ok(true);
        }
        let want = len.max(self.chunk).min((self.end - self.at) as usize);
        self.chunk = (self.chunk * 2).min(SCAN_CHUNK);
        let buf = self.buf.vec();
        if buf.len() < want {
            buf.resize(want, 0);
        }
        self.seg.read_at(&mut buf[..want], self.at)?;
        self.filled = want;
        self.buf_at = self.at;
        Ok(true)
    }

    /// The next record whole: `Some((offset, bytes))`, `None` at the first place that holds no
    /// record (see [`Header::peek`]); whether what is there is a whole record with a good
    /// checksum is for the caller to check ([`format::check`]).
    pub fn next_raw(&mut self) -> Result<Option<(u64, &[u8])>> {
        if !self.fill(FIXED)? {
            return Ok(None);
        }
        let start = (self.at - self.buf_at) as usize;
        let Some((_, total)) = Header::peek(&self.buf.bytes()[start..start + FIXED]) else {
            return Ok(None);
        };
        if !self.fill(total)? {
            return Ok(None);
        }
        let start = (self.at - self.buf_at) as usize;
        let offset = self.at;
        self.at += format::padded(total) as u64;
        Ok(Some((offset, &self.buf.bytes()[start..start + total])))
    }
}

/// What [`scan_tail`] found at the end of a segment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TailState {
    /// Where the next record goes.
    pub end: u64,
    /// Whether bytes other than zeros lie at the end: a record cut short, or one whose
    /// checksum fails (a write the crash interrupted), or a stale record left past it.
    pub torn: bool,
    /// The checksum of the last whole record (0: none), which the next one names as its
    /// predecessor.
    pub last_crc: u32,
}

/// Whether `bytes` (what lies at the journal's end) are all zeros.
pub(crate) fn all_zero(bytes: &[u8]) -> bool {
    bytes.iter().all(|b| *b == 0)
}

/// The journal's writer: the tail of the last segment.
pub(crate) struct Writer {
    fs: Arc<dyn Fs>,
    dir: PathBuf,
    seq: u64,
    file: Arc<dyn FsFile>,
    direct: bool,
    /// The most this segment grows to (a record larger than that gets a segment of its own).
    capacity: u64,
    /// The bytes the file has allocated so far.
    allocated: u64,
    tail: u64,
    /// Whether the segment has writes not yet synced.
    dirty: bool,
    segment_bytes: u64,
    buf: Aligned,
    stats: Arc<IoStats>,
    /// What a write covers, whole: records start on [`format::ALIGN`] boundaries, but every write
    /// is of whole blocks of this size (see [`block_size`]).
    block: u64,
    /// The bytes of the last block before the tail, as written: the next write starts at
    /// the block's start and writes them again, unchanged.
    carry: Vec<u8>,
    /// The checksum of the last record written in this segment: the next names it.
    last_crc: u32,
    /// Where the last good sync left the journal: (segment, end).
    synced: (u64, u64),
    /// Set by a sync that failed: what the disk holds since the last good sync is unknown
    /// (Linux may have dropped those writes and will not say so again), so nothing more is
    /// written or synced.
    failed: Option<String>,
}

/// Where a record was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Written {
    pub seq: u64,
    pub offset: u64,
    /// The segment before this one was finished (the record is the first of `seq`).
    pub rolled: bool,
}

impl Writer {
    /// Continues segment `seq` at `tail`, or starts segment `seq` when it does not exist.
    pub fn open(
        fs: Arc<dyn Fs>,
        dir: &Path,
        seq: u64,
        tail: TailState,
        segment_bytes: u64,
        stats: Arc<IoStats>,
    ) -> Result<Writer> {
        let path = segment_path(dir, seq);
        if !fs.exists(&path) {
            create_segment(&*fs, dir, seq, ALLOC_STEP.min(segment_bytes))?;
        }
        let file = open_for_writing(&*fs, &path, true)
            .map_err(|e| io_error(format!("opening {}", path.display()), e))?;
        let allocated = file
            .size()
            .map_err(|e| io_error(format!("reading {}", path.display()), e))?;
        let direct = file.direct();
        stats.direct.store(direct, Ordering::Relaxed);
        let block = block_size(file.write_align());
        // The block the tail is in, as it is on the disk: written again with the next record.
        let mut carry = vec![0u8; (tail.end % block) as usize];
        if !carry.is_empty() {
            let from = tail.end - carry.len() as u64;
            fs.open(&path, Open::Read)
                .and_then(|f| f.read_at(&mut carry, from))
                .map_err(|e| io_error(format!("reading {}", path.display()), e))?;
        }
        // What an earlier run wrote may still be only in the page cache: durable from here
        // on, so that a sync failing later knows what the disk holds.
        file.sync_data().map_err(|e| {
            io_error(
                format!("syncing {} (the disk may be failing)", path.display()),
                e,
            )
        })?;
        Ok(Writer {
            fs,
            dir: dir.to_path_buf(),
            seq,
            file,
            direct,
            capacity: segment_bytes.max(allocated).next_multiple_of(block),
            allocated,
            tail: tail.end,
            block,
            carry,
            last_crc: tail.last_crc,
            synced: (seq, tail.end),
            dirty: false,
            segment_bytes,
            buf: Aligned { raw: Vec::new() },
            stats,
            failed: None,
        })
    }

    pub fn tail(&self) -> u64 {
        self.tail
    }

    /// The checksum of the last record written (see [`format::Header::prev`]).
    pub fn last_crc(&self) -> u32 {
        self.last_crc
    }

    /// Whether records were written since the last sync.
    pub fn dirty(&self) -> bool {
        self.dirty
    }

    /// Writes `record` at the tail, after starting a new segment if it does not fit in this
    /// one. On an error nothing is taken as written: the next record goes to the same place.
    pub fn append(&mut self, record: &[u8]) -> Result<Written> {
        self.check()?;
        let len = format::padded(record.len()) as u64;
        let mut rolled = false;
        if self.tail + len > self.capacity {
            self.roll(len)?;
            rolled = true;
        }
        // Whole blocks, from the start of the one the tail is in.
        let start = self.tail - self.carry.len() as u64;
        let end = (self.tail + len).next_multiple_of(self.block);
        if end > self.allocated {
            let to = end
                .max(self.allocated + ALLOC_STEP)
                .min(self.capacity.max(end));
            self.file
                .allocate(self.allocated, to)
                .map_err(|e| io_error(format!("allocating journal segment {:x}", self.seq), e))?;
            self.allocated = to;
        }
        let offset = self.tail;
        let staged = self.buf.stage(&self.carry, record, (end - start) as usize);
        self.file.write_at(staged, start).map_err(|e| {
            io_error(
                format!("writing journal segment {:x} at {offset}", self.seq),
                e,
            )
        })?;
        self.tail += len;
        let kept = (self.tail % self.block) as usize;
        let from = (self.tail - start) as usize - kept;
        self.carry.clear();
        self.carry.extend_from_slice(&staged[from..from + kept]);
        self.last_crc = u32::from_le_bytes([record[8], record[9], record[10], record[11]]);
        self.dirty = true;
        self.stats.records.fetch_add(1, Ordering::Relaxed);
        self.stats.bytes.fetch_add(end - start, Ordering::Relaxed);
        Ok(Written {
            seq: self.seq,
            offset,
            rolled,
        })
    }

    /// An error once a sync failed.
    fn check(&self) -> Result<()> {
        match &self.failed {
            None => Ok(()),
            Some(why) => Err(StoreError::Engine {
                engine: "embedded",
                message: format!("{why}; nothing more is written until tailrace restarts"),
            }),
        }
    }

    /// Stops all writing after a sync failed, and records it for the next open, which must
    /// not build on what may have been lost (best effort: the disk is failing).
    fn fail(&mut self, why: String) {
        self.failed = Some(why);
        let (segment, end) = self.synced;
        if let Err(again) = (SyncFailure { segment, end }).save(&*self.fs, &self.dir) {
            tracing::error!(
                "could not record the failed sync ({again}); at the next start, check the journal's end"
            );
        }
    }

    /// Whether a sync failed (see [`Writer::failed`]).
    pub fn sync_failed(&self) -> bool {
        self.failed.is_some()
    }

    /// Makes everything written so far durable.
    pub fn sync(&mut self) -> Result<()> {
        self.check()?;
        if !self.dirty {
            return Ok(());
        }
        if let Err(e) = self.file.sync_data() {
            self.fail(format!(
                "syncing journal segment {:x} failed ({e})",
                self.seq
            ));
            return Err(io_error(
                format!("syncing journal segment {:x}", self.seq),
                e,
            ));
        }
        self.synced = (self.seq, self.tail);
        self.stats.syncs.fetch_add(1, Ordering::Relaxed);
        self.dirty = false;
        Ok(())
    }

    /// Finishes this segment (synced, so an earlier segment never holds an unsynced write
    /// when a later one is synced) and starts the next, of at least `need` bytes.
    fn roll(&mut self, need: u64) -> Result<()> {
        self.sync()?;
        let next = self.seq + 1;
        let need = need.next_multiple_of(self.block);
        let size = ALLOC_STEP.min(self.segment_bytes).max(need);
        if let Err(e) = create_segment(&*self.fs, &self.dir, next, size) {
            // A full disk is waited out (the segment is made again at the next try); any
            // other error left a segment, or its name, the disk may not hold.
            if !matches!(e, StoreError::Unavailable { .. }) {
                self.fail(format!("making journal segment {next:x} failed ({e})"));
            }
            return Err(e);
        }
        let path = segment_path(&self.dir, next);
        let file = open_for_writing(&*self.fs, &path, self.direct)
            .map_err(|e| io_error(format!("opening {}", path.display()), e))?;
        self.direct = file.direct();
        self.block = block_size(file.write_align());
        self.carry.clear();
        self.file = file;
        self.seq = next;
        self.capacity = self.segment_bytes.max(need).next_multiple_of(self.block);
        self.allocated = size;
        self.tail = 0;
        Ok(())
    }
}

/// A sync of the journal that failed, recorded for the next open: the last segment and the
/// end of what was synced in it before.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SyncFailure {
    pub segment: u64,
    pub end: u64,
}

impl SyncFailure {
    const FILE: &'static str = "SYNC_FAILED";

    fn save(&self, fs: &dyn Fs, dir: &Path) -> Result<()> {
        let text = format!("{:x} {}\n", self.segment, self.end);
        super::fs::write_atomic(fs, &dir.join(Self::FILE), text.as_bytes())
            .map_err(|e| io_error("recording a failed sync", e))
    }

    /// The failure recorded in journal directory `dir`, if any.
    pub fn load(fs: &dyn Fs, dir: &Path) -> Option<SyncFailure> {
        let text = fs.read(&dir.join(Self::FILE)).ok()?;
        let text = String::from_utf8(text).ok()?;
        let mut parts = text.split_whitespace();
        Some(SyncFailure {
            segment: u64::from_str_radix(parts.next()?, 16).ok()?,
            end: parts.next()?.parse().ok()?,
        })
    }

    /// Forgets it (the journal was cut where it says, and synced).
    pub fn clear(fs: &dyn Fs, dir: &Path) -> Result<()> {
        fs.remove(&dir.join(Self::FILE))
            .map_err(|e| io_error("removing the record of a failed sync", e))?;
        fsync_dir(fs, dir)
    }
}

/// Writes zeros over segment `seq` from `from` to its end, and syncs them: what lies past
/// the journal's end (a record a crash cut, records written after one a crash dropped, what a
/// failed sync lost) is then never read as part of it.
pub(crate) fn zero_from(fs: &dyn Fs, dir: &Path, seq: u64, from: u64) -> Result<()> {
    let path = segment_path(dir, seq);
    let context = || format!("clearing the end of {}", path.display());
    let file = fs
        .open(
            &path,
            Open::Write {
                create: false,
                truncate: false,
                direct: false,
            },
        )
        .map_err(|e| io_error(context(), e))?;
    let len = file.size().map_err(|e| io_error(context(), e))?;
    let zeros = vec![0u8; 1 << 20];
    let mut at = from;
    while at < len {
        let n = ((len - at) as usize).min(zeros.len());
        file.write_at(&zeros[..n], at)
            .map_err(|e| io_error(context(), e))?;
        at += n as u64;
    }
    file.sync_data().map_err(|e| io_error(context(), e))
}

/// Creates segment `seq` with its first `size` bytes allocated, and makes its name durable. A
/// segment left half-made by a crash (or a full disk) is made again.
fn create_segment(fs: &dyn Fs, dir: &Path, seq: u64, size: u64) -> Result<()> {
    let path = segment_path(dir, seq);
    let made = (|| {
        let file = fs.open(
            &path,
            Open::Write {
                create: true,
                truncate: true,
                direct: false,
            },
        )?;
        file.allocate(0, size)?;
        file.sync_all()
    })();
    if let Err(e) = made {
        let _ = fs.remove(&path);
        return Err(io_error(
            format!("creating journal segment {}", path.display()),
            e,
        ));
    }
    fsync_dir(fs, dir)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::embedded::format::Builder;

    fn record(lsn: u64, text: &str) -> Vec<u8> {
        let mut b = Builder::new();
        b.section("e", lsn, lsn);
        b.doc(text.as_bytes());
        let mut out = Vec::new();
        b.finish(lsn, 0, 0, &mut out);
        out
    }

    #[test]
    fn records_roll_into_new_segments_and_scan_back_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let stats = Arc::new(IoStats::default());
        let fs = crate::embedded::fs::RealFs::shared();
        let mut w = Writer::open(
            fs.clone(),
            dir.path(),
            1,
            TailState::default(),
            8192,
            stats.clone(),
        )
        .unwrap();
        let mut at = Vec::new();
        for lsn in 1..=40 {
            let text = format!(
                "{{\"n\":{lsn},\"pad\":\"{}\"}}",
                "x".repeat(lsn as usize * 7)
            );
            let w = w.append(&record(lsn, &text)).unwrap();
            at.push(w);
            assert_eq!(w.offset % format::ALIGN as u64, 0);
        }
        w.sync().unwrap();
        assert!(at.last().unwrap().seq > 1, "several segments");
        assert_eq!(
            list_segments(&*fs, dir.path()).unwrap().len() as u64,
            at.last().unwrap().seq
        );
        let c = stats.counts();
        assert_eq!(c.records, 40);
        assert!(
            c.syncs >= at.last().unwrap().seq,
            "every finished segment is synced"
        );
        let mut lsn = 1;
        for seq in list_segments(&*fs, dir.path()).unwrap() {
            let seg = Segment::open(&*fs, dir.path(), seq).unwrap();
            let len = seg.len().unwrap();
            let mut scan = SegmentScan::new(&seg, 0, len);
            while let Some((offset, bytes)) = scan.next_raw().unwrap() {
                assert!(format::check(bytes));
                let h = Header::parse(bytes).unwrap();
                assert_eq!(h.lsn, lsn);
                assert_eq!(seg.read_record(offset).unwrap(), bytes);
                lsn += 1;
            }
        }
        assert_eq!(lsn, 41, "every record scanned once");
    }
}
