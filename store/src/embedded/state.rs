//! What the engine knows about its journal, shared by the writer (which changes it) and the
//! readers (which look up where to read): the retained segments, each capped collection's
//! positions and where they lie, the change log's sequence numbers and where they lie, and
//! each segment's index of field values.
//!
//! Per segment, an index maps a hash of (collection, field, value) to positions: in memory
//! (sorted, plus a short unsorted tail) while the segment is written and until its index file
//! is, then in the segment's `.idx` file (entries sorted, looked up by binary search with
//! positioned reads), next to what recovery needs to know of the segment without reading it
//! (its record numbers, each collection's positions, their sizes and seek points).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

use super::format::Reader;
use super::fs::{Fs, Open};
use super::journal::{Segment, io_error};
use crate::{Result, StoreError};

/// A seek point: reading the journal forward from `(seq, off)` finds `pos` (a position of a
/// capped collection, or a change sequence number) and everything after it, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Seek {
    pub pos: u64,
    pub seq: u64,
    pub off: u64,
}

/// A seek point is added once the journal moved on this far since the last one (or to a new
/// segment): a read of one document reads at most about this much before it.
pub(crate) const SEEK_EVERY: u64 = 64 * 1024;

/// How many documents `sizes` holds, and their bytes: a capped collection's count and size,
/// from its per-position sizes (`u32::MAX` where a position holds no document).
pub(crate) fn retained<'a>(sizes: impl IntoIterator<Item = &'a u32>) -> (u64, u64) {
    sizes
        .into_iter()
        .filter(|s| **s != u32::MAX)
        .fold((0, 0), |(count, bytes), s| {
            (count + 1, bytes + u64::from(*s))
        })
}

/// The hash an index entry is kept under.
pub(crate) fn index_hash(coll: &str, field: &str, canonical: &[u8]) -> u64 {
    let mut h = hasher(coll, field);
    h.update(canonical);
    h.digest()
}

fn hasher(coll: &str, field: &str) -> xxhash_rust::xxh3::Xxh3 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(coll.as_bytes());
    h.update(&[0]);
    h.update(field.as_bytes());
    h.update(&[0]);
    h
}

/// [`index_hash`] of `v`'s [`canonical`] bytes, without building them (the writer hashes
/// every indexed field of every event).
pub(crate) fn value_hash(coll: &str, field: &str, v: Option<&Value>) -> Option<u64> {
    let mut h = hasher(coll, field);
    let mut fed = false;
    canonical_into(v, &mut |b| {
        fed = true;
        h.update(b);
    });
    fed.then(|| h.digest())
}

/// The bytes a value is indexed and compared by: strings, integers (whatever their JSON
/// spelling: `42` and `42.0` are one value), other numbers, booleans, and objects and
/// arrays as their JSON text; `None` for null or a missing field (never indexed, as no
/// `latest(field = null)` can match).
pub(crate) fn canonical(v: Option<&Value>) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let mut fed = false;
    canonical_into(v, &mut |b| {
        fed = true;
        out.extend_from_slice(b);
    });
    fed.then_some(out)
}

/// Feeds `v`'s canonical bytes to `put` (nothing for null or a missing field).
fn canonical_into(v: Option<&Value>, put: &mut dyn FnMut(&[u8])) {
    use std::io::Write;
    let mut digits = [0u8; 40];
    let mut number = |put: &mut dyn FnMut(&[u8]), args: std::fmt::Arguments<'_>| {
        let mut cur = std::io::Cursor::new(&mut digits[..]);
        if cur.write_fmt(args).is_ok() {
            let n = cur.position() as usize;
            put(&digits[..n]);
        }
    };
    match v {
        None | Some(Value::Null) => {}
        Some(Value::Bool(b)) => put(&[b'b', u8::from(*b)]),
        Some(Value::String(s)) => {
            put(b"s");
            put(s.as_bytes());
        }
        Some(Value::Number(n)) => {
            if let Some(i) = n.as_i64() {
                number(put, format_args!("i{i}"));
            } else if let Some(u) = n.as_u64() {
                number(put, format_args!("i{u}"));
            } else {
                let f = n.as_f64().unwrap_or(f64::NAN);
                if f.fract() == 0.0 && f.abs() < 9.2e18 {
                    number(put, format_args!("i{}", f as i64));
                } else {
                    put(b"f");
                    put(&f.to_bits().to_le_bytes());
                }
            }
        }
        Some(other) => {
            put(b"j");
            put(other.to_string().as_bytes());
        }
    }
}

/// A segment's index while it lives in memory: sorted runs, each at least twice the size of
/// the next (merged when not), and a short unsorted tail. An entry is copied O(log n) times
/// in all, and a lookup is a binary search per run.
#[derive(Debug, Default)]
pub(crate) struct MemIndex {
    runs: Vec<Vec<(u64, u64)>>,
    tail: Vec<(u64, u64)>,
}

impl MemIndex {
    /// Entries kept unsorted before they become a run.
    const TAIL: usize = 1024;

    pub fn push(&mut self, hash: u64, pos: u64) {
        self.tail.push((hash, pos));
        if self.tail.len() >= Self::TAIL {
            self.seal_tail();
        }
    }

    fn seal_tail(&mut self) {
        if self.tail.is_empty() {
            return;
        }
        let mut run = std::mem::take(&mut self.tail);
        run.sort_unstable();
        self.runs.push(run);
        while self.runs.len() >= 2 {
            let n = self.runs.len();
            if self.runs[n - 2].len() > 2 * self.runs[n - 1].len() {
                break;
            }
            let (b, a) = (self.runs.pop(), self.runs.pop());
            if let (Some(a), Some(b)) = (a, b) {
                self.runs.push(merge(a, b));
            }
        }
    }

    pub fn lookup(&self, hash: u64, out: &mut Vec<u64>) {
        for run in &self.runs {
            let start = run.partition_point(|e| e.0 < hash);
            out.extend(run[start..].iter().take_while(|e| e.0 == hash).map(|e| e.1));
        }
        out.extend(self.tail.iter().filter(|e| e.0 == hash).map(|e| e.1));
    }

    /// All entries, sorted.
    pub fn into_sorted(mut self) -> Vec<(u64, u64)> {
        self.seal_tail();
        let mut all = Vec::new();
        for run in self.runs {
            all = merge(all, run);
        }
        all
    }
}

/// Two sorted runs as one.
fn merge(a: Vec<(u64, u64)>, b: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    if a.is_empty() {
        return b;
    }
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut a, mut b) = (a.into_iter().peekable(), b.into_iter().peekable());
    loop {
        let next = match (a.peek(), b.peek()) {
            (Some(x), Some(y)) => {
                if x <= y {
                    a.next()
                } else {
                    b.next()
                }
            }
            (Some(_), None) => a.next(),
            (None, Some(_)) => b.next(),
            (None, None) => break,
        };
        out.extend(next);
    }
    out
}

/// Where a segment's index is.
#[derive(Debug)]
pub(crate) enum SegIndex {
    Memory(MemIndex),
    /// Frozen, waiting for its file to be written.
    Sealed(Arc<Vec<(u64, u64)>>),
    File {
        path: PathBuf,
        entries: u64,
    },
}

/// Byte offset of the first index entry in an index file.
const IDX_ENTRIES: u64 = 48;
const IDX_MAGIC: u32 = u32::from_le_bytes(*b"TIX1");

impl SegIndex {
    pub fn lookup(&self, fs: &dyn Fs, hash: u64, out: &mut Vec<u64>) -> Result<()> {
        match self {
            SegIndex::Memory(m) => m.lookup(hash, out),
            SegIndex::Sealed(v) => {
                let start = v.partition_point(|e| e.0 < hash);
                out.extend(v[start..].iter().take_while(|e| e.0 == hash).map(|e| e.1));
            }
            SegIndex::File { path, entries } => lookup_file(fs, path, *entries, hash, out)?,
        }
        Ok(())
    }
}

/// Binary search of an index file's entries by positioned reads.
fn lookup_file(
    fs: &dyn Fs,
    path: &Path,
    entries: u64,
    hash: u64,
    out: &mut Vec<u64>,
) -> Result<()> {
    let file = fs
        .open(path, Open::Read)
        .map_err(|e| io_error(format!("opening {}", path.display()), e))?;
    let read = |i: u64| -> Result<(u64, u64)> {
        let mut b = [0u8; 16];
        file.read_at(&mut b, IDX_ENTRIES + i * 16)
            .map_err(|e| io_error(format!("reading {}", path.display()), e))?;
        let mut r = Reader::new(&b);
        Ok((r.u64()?, r.u64()?))
    };
    let (mut lo, mut hi) = (0u64, entries);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if read(mid)?.0 < hash {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    let mut i = lo;
    while i < entries {
        let (h, pos) = read(i)?;
        if h != hash {
            break;
        }
        out.push(pos);
        i += 1;
    }
    Ok(())
}

/// One capped collection's documents in a segment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct SegColl {
    pub first: u64,
    /// One past the last position.
    pub end: u64,
    /// The collection's oldest retained position after the segment's last record of it.
    pub oldest_after: u64,
}

/// A retained segment.
#[derive(Debug)]
pub(crate) struct SegInfo {
    pub seg: Arc<Segment>,
    pub first_lsn: u64,
    /// 0 while it holds no record.
    pub last_lsn: u64,
    /// Where its records end.
    pub end: u64,
    /// Change sequence numbers `[first, end)` it holds.
    pub changes: (u64, u64),
    pub colls: BTreeMap<String, SegColl>,
    pub index: SegIndex,
}

/// What readers need to know of a capped collection.
#[derive(Debug, Default)]
pub(crate) struct CappedView {
    pub oldest: u64,
    pub next: u64,
    pub count: u64,
    pub bytes: u64,
    pub seeks: VecDeque<Seek>,
    /// Positions below it were moved into the tree when their segment was released.
    pub journal_from: u64,
}

impl CappedView {
    /// The seek point to start reading `pos` from: the last one at or before it.
    pub fn seek(&self, pos: u64) -> Option<Seek> {
        let i = self.seeks.partition_point(|s| s.pos <= pos);
        i.checked_sub(1).map(|i| self.seeks[i])
    }
}

/// Everything shared, behind one lock held briefly.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    pub segments: BTreeMap<u64, SegInfo>,
    pub capped: HashMap<String, CappedView>,
    /// The oldest change still in the journal, and the next sequence number.
    pub change_first: u64,
    pub change_next: u64,
    pub change_seeks: VecDeque<Seek>,
    /// What a snapshot reads as of: the tree's sequence number that makes the last commit
    /// visible, and the last change of that commit (0: none), set together.
    pub point: (u64, u64),
}

impl Shared {
    pub fn change_seek(&self, seq: u64) -> Option<Seek> {
        let i = self.change_seeks.partition_point(|s| s.pos <= seq);
        i.checked_sub(1).map(|i| self.change_seeks[i])
    }
}

/// What a segment's index file holds besides its entries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct SegSummary {
    pub seq: u64,
    pub first_lsn: u64,
    pub last_lsn: u64,
    pub end: u64,
    pub changes: (u64, u64),
    pub change_seeks: Vec<(u64, u64)>,
    pub colls: Vec<CollSummary>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct CollSummary {
    pub name: String,
    pub seg: SegColl,
    /// Seek points within the segment: (position, offset).
    pub seeks: Vec<(u64, u64)>,
    /// Sizes of the documents from `seg.first`; `u32::MAX` where no document was kept (a
    /// document evicted before its segment was finished, or no document at that position).
    pub sizes: Vec<u32>,
}

/// Writes a segment's index file (through a temporary file, synced, renamed).
pub(crate) fn write_index_file(
    fs: &dyn Fs,
    path: &Path,
    summary: &SegSummary,
    entries: &[(u64, u64)],
) -> Result<()> {
    let mut b = Vec::with_capacity(IDX_ENTRIES as usize + entries.len() * 16 + 4096);
    b.extend_from_slice(&IDX_MAGIC.to_le_bytes());
    b.extend_from_slice(&1u32.to_le_bytes());
    for v in [
        summary.seq,
        summary.first_lsn,
        summary.last_lsn,
        summary.end,
        entries.len() as u64,
    ] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    for (h, p) in entries {
        b.extend_from_slice(&h.to_le_bytes());
        b.extend_from_slice(&p.to_le_bytes());
    }
    b.extend_from_slice(&summary.changes.0.to_le_bytes());
    b.extend_from_slice(&summary.changes.1.to_le_bytes());
    b.extend_from_slice(&(summary.change_seeks.len() as u32).to_le_bytes());
    for (s, o) in &summary.change_seeks {
        b.extend_from_slice(&s.to_le_bytes());
        b.extend_from_slice(&o.to_le_bytes());
    }
    b.extend_from_slice(&(summary.colls.len() as u32).to_le_bytes());
    for c in &summary.colls {
        b.push(c.name.len() as u8);
        b.extend_from_slice(c.name.as_bytes());
        for v in [c.seg.first, c.seg.end, c.seg.oldest_after] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&(c.seeks.len() as u32).to_le_bytes());
        for (p, o) in &c.seeks {
            b.extend_from_slice(&p.to_le_bytes());
            b.extend_from_slice(&o.to_le_bytes());
        }
        b.extend_from_slice(&(c.sizes.len() as u32).to_le_bytes());
        for s in &c.sizes {
            b.extend_from_slice(&s.to_le_bytes());
        }
    }
    let crc = crc32fast::hash(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    super::fs::write_atomic(fs, path, &b)
        .map_err(|e| io_error(format!("writing {}", path.display()), e))
}

/// Reads a segment's index file: its summary and how many entries it has; `None` when it is
/// missing or damaged (then the segment is read again to rebuild it).
pub(crate) fn read_index_file(fs: &dyn Fs, path: &Path) -> Option<(SegSummary, u64)> {
    let b = fs.read(path).ok()?;
    if b.len() < IDX_ENTRIES as usize + 4 {
        return None;
    }
    let (body, crc) = b.split_at(b.len() - 4);
    if crc32fast::hash(body).to_le_bytes() != crc {
        return None;
    }
    let parse = || -> Result<(SegSummary, u64)> {
        let mut r = Reader::new(body);
        if r.u32()? != IDX_MAGIC || r.u32()? != 1 {
            return Err(StoreError::Invalid("index file".into()));
        }
        let mut s = SegSummary {
            seq: r.u64()?,
            first_lsn: r.u64()?,
            last_lsn: r.u64()?,
            end: r.u64()?,
            ..SegSummary::default()
        };
        let entries = r.u64()?;
        r.take(usize::try_from(entries * 16).map_err(|_| StoreError::Invalid("size".into()))?)?;
        s.changes = (r.u64()?, r.u64()?);
        for _ in 0..r.u32()? {
            s.change_seeks.push((r.u64()?, r.u64()?));
        }
        for _ in 0..r.u32()? {
            let name = r.str8()?.to_owned();
            let seg = SegColl {
                first: r.u64()?,
                end: r.u64()?,
                oldest_after: r.u64()?,
            };
            let mut seeks = Vec::new();
            for _ in 0..r.u32()? {
                seeks.push((r.u64()?, r.u64()?));
            }
            let n = r.u32()?;
            let mut sizes = Vec::with_capacity(n as usize);
            for _ in 0..n {
                sizes.push(r.u32()?);
            }
            s.colls.push(CollSummary {
                name,
                seg,
                seeks,
                sizes,
            });
        }
        Ok((s, entries))
    };
    parse().ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn canonical_values_agree_on_what_is_equal() {
        let c = |v: Value| canonical(Some(&v));
        assert_eq!(c(json!(42)), c(json!(42.0)));
        assert_ne!(c(json!(42)), c(json!("42")));
        assert_ne!(c(json!(true)), c(json!(1)));
        assert_ne!(c(json!(2.5)), c(json!(2)));
        assert_eq!(
            c(json!(u64::MAX)),
            Some(format!("i{}", u64::MAX).into_bytes())
        );
        assert_eq!(c(json!(null)), None);
        assert_eq!(canonical(None), None);
        assert_ne!(c(json!({"a": 1})), c(json!("{\"a\":1}")));
        for v in [
            json!("東京 🦀"),
            json!(42),
            json!(-7),
            json!(2.5),
            json!(u64::MAX),
            json!(true),
            json!([1, "a"]),
        ] {
            assert_eq!(
                value_hash("events", "f", Some(&v)),
                canonical(Some(&v)).map(|c| index_hash("events", "f", &c)),
                "{v}"
            );
        }
        assert_eq!(value_hash("events", "f", None), None);
    }

    #[test]
    fn memory_index_finds_every_entry_before_and_after_merging() {
        let mut m = MemIndex::default();
        for i in 0..10_000u64 {
            m.push(i % 7, i);
        }
        let mut out = Vec::new();
        m.lookup(3, &mut out);
        out.sort_unstable();
        let want: Vec<u64> = (0..10_000).filter(|i| i % 7 == 3).collect();
        assert_eq!(out, want);
        let sorted = m.into_sorted();
        assert!(sorted.windows(2).all(|w| w[0] <= w[1]));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.idx");
        let summary = SegSummary {
            seq: 3,
            first_lsn: 10,
            last_lsn: 20,
            end: 4096,
            changes: (5, 9),
            change_seeks: vec![(5, 0)],
            colls: vec![CollSummary {
                name: "events".into(),
                seg: SegColl {
                    first: 1,
                    end: 3,
                    oldest_after: 1,
                },
                seeks: vec![(1, 0)],
                sizes: vec![10, u32::MAX],
            }],
        };
        let fs = crate::embedded::fs::RealFs;
        write_index_file(&fs, &path, &summary, &sorted).unwrap();
        let (back, n) = read_index_file(&fs, &path).unwrap();
        assert_eq!(back, summary);
        assert_eq!(n, sorted.len() as u64);
        let mut found = Vec::new();
        lookup_file(&fs, &path, n, 3, &mut found).unwrap();
        found.sort_unstable();
        assert_eq!(found, want);
        let mut none = Vec::new();
        lookup_file(&fs, &path, n, 99, &mut none).unwrap();
        assert!(none.is_empty());
        std::fs::write(&path, b"garbage").unwrap();
        assert!(read_index_file(&fs, &path).is_none());
    }
}
