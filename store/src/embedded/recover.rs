//! Opening a data directory: the catalog, the retained segments (from their index files, or
//! read again where one is missing or damaged), the end of the journal (the first place
//! without a whole, checksummed record), and the tree brought up to the journal's last
//! record.

use crate::telemetry::Problem;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use super::catalog::{self, Catalog};
use super::format::{self, Entry, Header};
use super::fs::Fs;
use super::journal::{self, IoStats, Segment, SegmentScan, TailState};
use super::state::{
    self, CappedView, CollSummary, MemIndex, SEEK_EVERY, Seek, SegColl, SegIndex, SegInfo,
    SegSummary, Shared,
};

use super::tree::{self, Tree};
use super::values;
use crate::{ChangeOp, Result, StoreError, update};

/// The keyed state's directory inside the data directory.
pub(crate) const TREE_DIR: &str = "keyed";

fn damaged(what: String) -> StoreError {
    StoreError::Engine {
        engine: "embedded",
        message: what,
    }
}

/// What recovery found of a capped collection: oldest and next positions, the sizes of
/// `[oldest, next)`, the last seek point.
pub(crate) type RecoveredCapped = (u64, u64, VecDeque<u32>, Option<(u64, u64)>);

/// What recovery hands the writer.
pub(crate) struct Recovered {
    pub fs: Arc<dyn Fs>,
    pub dir: PathBuf,
    pub journal: journal::Writer,
    pub lsn: u64,
    pub change_next: u64,
    pub tree: Arc<Tree>,
    pub shared: Arc<RwLock<Shared>>,
    pub catalog: Arc<Mutex<Catalog>>,
    /// Per capped collection: oldest, next, sizes of `[oldest, next)`, last seek.
    pub capped: HashMap<String, RecoveredCapped>,
    pub last_change_seek: Option<(u64, u64)>,
}

/// What a scan of one segment found.
#[derive(Default)]
pub(crate) struct Scanned {
    pub summary: SegSummary,
    pub index: MemIndex,
    /// The indexed fields' values, for the segment's values file once it is finished.
    pub values: values::Gather,
    pub tail: TailState,
}

/// Reads a segment's records from its start: calls `each` with every whole record (offset,
/// header, bytes), stops at the first place that holds none. `next_lsn` is the record number
/// the first record must have (`None`: whatever it is); a record that breaks the sequence
/// ends the scan like a torn one.
pub(crate) fn scan_records(
    seg: &Segment,
    next_lsn: Option<u64>,
    mut each: impl FnMut(u64, &Header, &[u8]) -> Result<()>,
) -> Result<TailState> {
    scan_records_to(seg, next_lsn, u64::MAX, &mut each)
}

/// [`scan_records`] up to offset `limit` (what lies beyond is taken for a torn tail).
fn scan_records_to(
    seg: &Segment,
    next_lsn: Option<u64>,
    limit: u64,
    mut each: impl FnMut(u64, &Header, &[u8]) -> Result<()>,
) -> Result<TailState> {
    let len = seg.len()?;
    let scan_end = len.min(limit);
    let mut scan = SegmentScan::new(seg, 0, scan_end);
    let mut expect = next_lsn;
    let mut last_crc: Option<u32> = None;
    loop {
        let at = scan.at;
        let Some((offset, bytes)) = scan.next_raw()? else {
            // Zeros, or something that is no record header, or a record cut short.
            return Ok(TailState {
                end: at,
                torn: !tail_is_zero(seg, at, len)?,
                last_crc: last_crc.unwrap_or(0),
            });
        };
        let good = format::check(bytes);
        let header = if good {
            Header::parse(bytes).ok()
        } else {
            None
        };
        // The next number, and (past a segment's first record) the checksum of the record
        // before it: a whole record that names another predecessor is a stale one, left past
        // a tail a crash cut (records written before chaining name none).
        let follows = |h: &Header| {
            expect.is_none_or(|e| h.lsn == e)
                && (h.prev == 0 || last_crc.is_none_or(|c| c == h.prev))
        };
        let Some(header) = header.filter(follows) else {
            return Ok(TailState {
                end: offset,
                torn: true,
                last_crc: last_crc.unwrap_or(0),
            });
        };
        expect = Some(header.lsn + 1);
        last_crc = Some(u32::from_le_bytes([
            bytes[8], bytes[9], bytes[10], bytes[11],
        ]));
        each(offset, &header, bytes)?;
    }
}

/// Whether the journal holds only zeros from `at` to `len` (what a crash mid-write leaves is
/// not zeros; nor are records written after one a crash dropped).
fn tail_is_zero(seg: &Segment, at: u64, len: u64) -> Result<bool> {
    let mut buf = vec![0u8; 1 << 20];
    let mut from = at;
    while from < len {
        let n = ((len - from) as usize).min(buf.len());
        seg.read_at(&mut buf[..n], from)?;
        if !journal::all_zero(&buf[..n]) {
            return Ok(false);
        }
        from += n as u64;
    }
    Ok(true)
}

/// Reads a segment whole: its summary, its index entries for the collections' indexed fields
/// (`indexes`), and where its records end.
pub(crate) fn scan_segment(
    seg: &Segment,
    next_lsn: Option<u64>,
    indexes: &HashMap<String, Vec<String>>,
) -> Result<Scanned> {
    scan_segment_to(seg, next_lsn, indexes, u64::MAX)
}

/// [`scan_segment`] up to offset `limit`.
fn scan_segment_to(
    seg: &Segment,
    next_lsn: Option<u64>,
    indexes: &HashMap<String, Vec<String>>,
    limit: u64,
) -> Result<Scanned> {
    let mut out = Scanned::default();
    out.summary.seq = seg.seq;
    let mut colls: BTreeMap<String, CollSummary> = BTreeMap::new();
    let mut last_seek: HashMap<String, u64> = HashMap::new();
    let mut last_change_seek: Option<u64> = None;
    let tail = scan_records_to(seg, next_lsn, limit, |offset, h, bytes| {
        if out.summary.first_lsn == 0 {
            out.summary.first_lsn = h.lsn;
        }
        out.summary.last_lsn = h.lsn;
        if h.change_count > 0 {
            if out.summary.changes.0 == out.summary.changes.1 {
                out.summary.changes = (h.change_first, h.change_first);
            }
            out.summary.changes.1 = h.change_first + h.change_count as u64;
            if last_change_seek.is_none_or(|o| offset >= o + SEEK_EVERY) {
                last_change_seek = Some(offset);
                out.summary.change_seeks.push((h.change_first, offset));
            }
        }
        if h.sections.is_empty() {
            return Ok(());
        }
        // Each document's size, and its index entries.
        let docs = h.docs();
        let mut sizes: Vec<u32> = Vec::with_capacity(docs as usize);
        let mut jsons: Vec<Vec<u8>> = Vec::new();
        let want_docs = h
            .sections
            .iter()
            .any(|s| indexes.get(&s.coll).is_some_and(|f| !f.is_empty()));
        for (i, _) in h.blocks_for(0, docs) {
            let data = h.block(bytes, i)?;
            for e in h.entries(i, &data) {
                let (index, entry) = e?;
                if index >= docs {
                    break;
                }
                if let Entry::Doc(json) = entry {
                    sizes.push(json.len() as u32);
                    if want_docs {
                        jsons.push(json.to_vec());
                    }
                }
            }
        }
        let mut at = 0usize;
        for s in &h.sections {
            let c = colls.entry(s.coll.clone()).or_insert_with(|| CollSummary {
                name: s.coll.clone(),
                seg: SegColl {
                    first: s.first,
                    end: s.first,
                    oldest_after: s.oldest_after,
                },
                ..CollSummary::default()
            });
            // A gap of positions (none should exist) is recorded as positions without a
            // document.
            while c.seg.first + (c.sizes.len() as u64) < s.first {
                c.sizes.push(u32::MAX);
            }
            c.seg.end = s.first + s.count as u64;
            c.seg.oldest_after = s.oldest_after;
            let due = last_seek
                .get(&s.coll)
                .is_none_or(|o| offset >= o + SEEK_EVERY);
            if due {
                last_seek.insert(s.coll.clone(), offset);
                c.seeks.push((s.first, offset));
            }
            let fields = indexes.get(&s.coll);
            for k in 0..s.count as usize {
                c.sizes.push(sizes.get(at + k).copied().unwrap_or(u32::MAX));
                if let Some(fields) = fields
                    && let Some(json) = jsons.get(at + k)
                {
                    let doc = format::parse_doc(json)?;
                    for f in fields {
                        if let Some(h) = state::value_hash(&s.coll, f, update::get_path(&doc, f)) {
                            out.index.push(h, s.first + k as u64);
                        }
                    }
                    out.values.add(&s.coll, fields, s.first + k as u64, &doc);
                }
            }
            at += s.count as usize;
        }
        Ok(())
    })?;
    out.summary.end = tail.end;
    out.summary.colls = colls.into_values().collect();
    out.tail = tail;
    Ok(out)
}

/// Writes a finished segment's values file from what a read of it gathered, and says whether
/// it did. A failure is logged and costs only speed: a query reads the documents the file
/// would have summarized.
pub(crate) fn write_values(
    fs: &dyn Fs,
    jdir: &Path,
    summary: &SegSummary,
    gathered: values::Gather,
) -> bool {
    let tie = values::Tie {
        seq: summary.seq,
        end: summary.end,
        last_lsn: summary.last_lsn,
    };
    let path = values::path(jdir, summary.seq);
    match values::write(fs, &path, tie, &gathered.finish()) {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(error = %e, segment = summary.seq, "could not write a journal segment's values file; queries read its documents instead");
            false
        }
    }
}

/// Per capped collection, what recovery gathers.
#[derive(Default)]
struct CappedAcc {
    oldest: u64,
    next: u64,
    journal_from: u64,
    /// Sizes from `base`.
    base: u64,
    sizes: Vec<u32>,
    seeks: VecDeque<Seek>,
    last_seek: Option<(u64, u64)>,
}

impl CappedAcc {
    fn add(&mut self, seq: u64, c: &CollSummary) {
        if self.sizes.is_empty() {
            self.base = c.seg.first;
        }
        while self.base + (self.sizes.len() as u64) < c.seg.first {
            self.sizes.push(u32::MAX);
        }
        let skip = (self.base + self.sizes.len() as u64).saturating_sub(c.seg.first) as usize;
        self.sizes.extend(c.sizes.iter().skip(skip));
        self.next = self.next.max(c.seg.end);
        self.oldest = c.seg.oldest_after.max(self.oldest);
        for (pos, off) in &c.seeks {
            self.seeks.push_back(Seek {
                pos: *pos,
                seq,
                off: *off,
            });
            self.last_seek = Some((seq, *off));
        }
    }
}

/// Opens (creating when absent) the engine's files in `dir`.
pub(crate) fn open(
    fs: Arc<dyn Fs>,
    dir: &Path,
    segment_bytes: u64,
    stats: Arc<IoStats>,
) -> Result<Recovered> {
    let jdir = dir.join(journal::DIR);
    if !fs.exists(&jdir) {
        fs.create_dir_all(&jdir)
            .map_err(|e| journal::io_error(format!("creating {}", jdir.display()), e))?;
        // Its name durable before anything is written in it.
        journal::fsync_dir(&*fs, dir)?;
    }
    let catalog = match Catalog::load(&*fs, dir)? {
        Some(c) => c,
        None => {
            let c = Catalog::default();
            c.save(&*fs, dir)?;
            c
        }
    };
    let tree = Arc::new(Tree::open(&dir.join(TREE_DIR))?);

    let mut segs = journal::list_segments(&*fs, &jdir)?;
    // Segments below the catalog's first were released (their deletion may not have
    // finished before a crash).
    for seq in segs.iter().filter(|s| **s < catalog.first_segment) {
        let _ = fs.remove(&journal::segment_path(&jdir, *seq));
        let _ = fs.remove(&journal::index_path(&jdir, *seq));
        let _ = fs.remove(&values::path(&jdir, *seq));
    }
    segs.retain(|s| *s >= catalog.first_segment);

    let indexes: HashMap<String, Vec<String>> = catalog
        .collections
        .iter()
        .filter(|(_, c)| c.kind == catalog::Kind::Capped)
        .map(|(n, c)| (n.clone(), c.indexes.clone()))
        .collect();
    let mut capped: HashMap<String, CappedAcc> = catalog
        .collections
        .iter()
        .filter(|(_, c)| c.kind == catalog::Kind::Capped)
        .map(|(n, c)| {
            (
                n.clone(),
                CappedAcc {
                    oldest: c.oldest_pos.max(1),
                    next: c.next_pos.max(1),
                    journal_from: c.journal_from.max(1),
                    ..CappedAcc::default()
                },
            )
        })
        .collect();
    let mut shared = Shared {
        change_first: catalog.first_change,
        change_next: catalog.next_change,
        ..Shared::default()
    };
    let mut next_lsn = catalog.next_lsn;
    let mut last_change_seek = None;
    let (mut tail_seq, mut tail) = (catalog.first_segment, TailState::default());
    // A sync that failed: what was written after the last good one may still be read back
    // (Linux keeps the pages it could not write) but is not on the disk. Nothing past it
    // was ever shown or answered `journaled`; it is cut off here, before it is built on.
    let failed = journal::SyncFailure::load(&*fs, &jdir);
    if let Some(f) = &failed {
        Problem {
            error_type: "sync_failed",
            detail: &format!(
                "a journal sync failed before the last stop: segment {:x} is cut at offset {}, the last one synced; what was written after it was never synced and is dropped",
                f.segment, f.end
            ),
        }
        .warn();
        for seq in segs.iter().filter(|s| **s > f.segment) {
            let _ = fs.remove(&journal::segment_path(&jdir, *seq));
            let _ = fs.remove(&journal::index_path(&jdir, *seq));
            let _ = fs.remove(&values::path(&jdir, *seq));
        }
        segs.retain(|s| *s <= f.segment);
    }
    let n = segs.len();
    for (i, seq) in segs.iter().copied().enumerate() {
        let seg = Segment::open(&*fs, &jdir, seq)?;
        let last = i + 1 == n;
        let idx_path = journal::index_path(&jdir, seq);
        let from_file = if last {
            // The segment being written has no values file: one left here was made for other
            // contents (see `values`).
            let _ = fs.remove(&values::path(&jdir, seq));
            None
        } else {
            // An index file that gives a segment with records no first record number was
            // written by a release that did not number a segment recovered empty (see below):
            // read the segment again.
            state::read_index_file(&*fs, &idx_path)
                .filter(|(s, _)| s.seq == seq && (s.last_lsn == 0 || s.first_lsn != 0))
        };
        let (summary, index) = match from_file {
            Some((summary, entries)) => (
                summary,
                SegIndex::File {
                    path: idx_path,
                    entries,
                },
            ),
            None => {
                let limit = failed
                    .as_ref()
                    .filter(|f| f.segment == seq)
                    .map_or(u64::MAX, |f| f.end);
                let scanned = scan_segment_to(&seg, None, &indexes, limit)?;
                if scanned.tail.torn && !last {
                    return Err(damaged(format!(
                        "journal segment {} is damaged at offset {} (a finished segment holds only whole records)",
                        journal::segment_path(&jdir, seq).display(),
                        scanned.tail.end
                    )));
                }
                if last {
                    tail = scanned.tail;
                    if scanned.tail.torn || limit != u64::MAX {
                        tracing::info!(
                            segment = seq,
                            offset = scanned.tail.end,
                            "the journal ends with a write the last stop interrupted; it was never acknowledged and is ignored"
                        );
                        // Zeros from the end on: a stale record past it must never be read
                        // as the journal's next one once new records are written before it.
                        journal::zero_from(&*fs, &jdir, seq, scanned.tail.end)?;
                        tail.torn = false;
                    }
                    (scanned.summary, SegIndex::Memory(scanned.index))
                } else {
                    let entries = scanned.index.into_sorted();
                    let _ = write_values(&*fs, &jdir, &scanned.summary, scanned.values);
                    if let Err(e) =
                        state::write_index_file(&*fs, &idx_path, &scanned.summary, &entries)
                    {
                        Problem {
                            error_type: "index_file",
                            detail: &format!("could not write a journal segment's index file ({e}); it is kept in memory"),
                        }
                        .warn();
                        (scanned.summary, SegIndex::Sealed(Arc::new(entries)))
                    } else {
                        let count = entries.len() as u64;
                        (
                            scanned.summary,
                            SegIndex::File {
                                path: idx_path,
                                entries: count,
                            },
                        )
                    }
                }
            }
        };
        if summary.last_lsn != 0 {
            if summary.first_lsn < next_lsn && i == 0 {
                // Records the catalog already counted (it was written after them): fine.
            } else if summary.first_lsn != next_lsn && i > 0 {
                return Err(damaged(format!(
                    "journal segment {seq:x} starts at record {} where {next_lsn} was expected",
                    summary.first_lsn
                )));
            }
            next_lsn = summary.last_lsn + 1;
        }
        for c in &summary.colls {
            if let Some(acc) = capped.get_mut(&c.name) {
                acc.add(seq, c);
            }
        }
        if summary.changes.1 > summary.changes.0 {
            if shared.change_seeks.is_empty() {
                // The first segment that holds changes: the oldest one still in the journal.
                shared.change_first = summary.changes.0;
            }
            for (s, off) in &summary.change_seeks {
                shared.change_seeks.push_back(Seek {
                    pos: *s,
                    seq,
                    off: *off,
                });
                last_change_seek = Some((seq, *off));
            }
            shared.change_next = shared.change_next.max(summary.changes.1);
        }
        let colls = summary
            .colls
            .iter()
            .map(|c| (c.name.clone(), c.seg.clone()))
            .collect();
        shared.segments.insert(
            seq,
            SegInfo {
                seg,
                // A segment without a whole record (a crash right after a roll made it): its
                // first record is the next one written.
                first_lsn: if summary.last_lsn == 0 {
                    next_lsn
                } else {
                    summary.first_lsn
                },
                last_lsn: summary.last_lsn,
                end: summary.end,
                changes: summary.changes,
                colls,
                index,
            },
        );
        tail_seq = seq;
    }
    if shared.change_seeks.is_empty() {
        shared.change_first = shared.change_next;
    }

    // Capped collections: sizes from the oldest retained position (spilled ones from the tree).
    let mut writer_capped = HashMap::new();
    for (name, acc) in capped {
        let oldest = acc.oldest;
        let mut sizes: VecDeque<u32> = VecDeque::new();
        // Spilled documents: positions [oldest, journal_from).
        if oldest < acc.journal_from {
            let prefix = tree::spill_prefix(&name);
            for (k, v) in tree.page(&prefix, None, usize::MAX, tree.visible().max(u64::MAX >> 2))? {
                let mut b = [0u8; 8];
                b.copy_from_slice(&k[prefix.len()..prefix.len() + 8]);
                let pos = u64::from_be_bytes(b);
                if pos < oldest || pos >= acc.journal_from {
                    continue;
                }
                while oldest + (sizes.len() as u64) < pos {
                    sizes.push_back(u32::MAX);
                }
                sizes.push_back((v.len().saturating_sub(8)) as u32);
            }
        }
        while oldest + (sizes.len() as u64) < acc.journal_from.max(oldest) {
            sizes.push_back(u32::MAX);
        }
        let from = oldest.max(acc.journal_from);
        if !acc.sizes.is_empty() {
            let skip = from.saturating_sub(acc.base) as usize;
            while oldest + (sizes.len() as u64) < acc.base.max(from) {
                sizes.push_back(u32::MAX);
            }
            sizes.extend(acc.sizes.iter().skip(skip));
        }
        let next = acc.next.max(oldest + sizes.len() as u64);
        while oldest + (sizes.len() as u64) < next {
            sizes.push_back(u32::MAX);
        }
        let (count, bytes) = state::retained(&sizes);
        shared.capped.insert(
            name.clone(),
            CappedView {
                oldest,
                next,
                count,
                bytes,
                seeks: acc.seeks,
                journal_from: acc.journal_from,
            },
        );
        writer_capped.insert(name, (oldest, next, sizes, acc.last_seek));
    }

    // The tree: replay what the journal holds after the record its tables are complete to.
    let applied = tree.applied()?;
    replay(&shared, &tree, applied)?;
    tree.publish(next_lsn.saturating_sub(1));

    let journal = journal::Writer::open(fs.clone(), &jdir, tail_seq, tail, segment_bytes, stats)?;
    if failed.is_some() {
        journal::SyncFailure::clear(&*fs, &jdir)?;
    }
    if !shared.segments.contains_key(&tail_seq) {
        let seg = Segment::open(&*fs, &jdir, tail_seq)?;
        shared.segments.insert(
            tail_seq,
            SegInfo {
                seg,
                first_lsn: next_lsn,
                last_lsn: 0,
                end: 0,
                changes: (shared.change_next, shared.change_next),
                colls: BTreeMap::new(),
                index: SegIndex::Memory(MemIndex::default()),
            },
        );
    }
    Ok(Recovered {
        fs,
        dir: dir.to_path_buf(),
        journal,
        lsn: next_lsn,
        change_next: shared.change_next,
        tree,
        shared: Arc::new(RwLock::new(shared)),
        catalog: Arc::new(Mutex::new(catalog)),
        capped: writer_capped,
        last_change_seek,
    })
}

/// Applies to the tree what the records after `applied` changed: keyed documents (with their
/// write-time index) and checkpoints.
fn replay(shared: &Shared, tree: &Tree, applied: u64) -> Result<()> {
    let mut replayed = 0u64;
    for info in shared.segments.values() {
        if info.last_lsn <= applied {
            continue;
        }
        scan_records(&info.seg, None, |_, h, bytes| {
            if h.lsn <= applied || (h.change_count == 0 && h.checkpoints == 0) {
                return Ok(());
            }
            let docs = h.docs();
            for (i, _) in h.blocks_for(docs, u32::MAX) {
                let data = h.block(bytes, i)?;
                for e in h.entries(i, &data) {
                    match e?.1 {
                        Entry::Change(c) => apply_change(tree, h.lsn, h.ts, &c)?,
                        Entry::Checkpoint { feed, body } => {
                            tree.insert(tree::checkpoint_key(feed), body.to_vec(), h.lsn);
                        }
                        Entry::Doc(_) => {}
                    }
                }
            }
            tree.publish(h.lsn);
            replayed += 1;
            Ok(())
        })?;
    }
    if replayed > 0 {
        tracing::debug!(records = replayed, "keyed state replayed from the journal");
    }
    Ok(())
}

fn apply_change(tree: &Tree, lsn: u64, ts: i64, c: &format::ChangeEntry<'_>) -> Result<()> {
    if !tree::fits(c.coll, c.key) {
        // Written by a release that did not bound keys (its writer then panicked on it): the
        // tree cannot hold it, and every start would panic on it too. The change stays in the
        // change log; the keyed state goes without it.
        Problem {
            error_type: "key_too_long",
            detail: &format!(
                "record {lsn}: a change of {}/{:?}… has a key of {} bytes, more than the keyed state holds; the document is left out",
                c.coll,
                c.key.chars().take(24).collect::<String>(),
                c.key.len()
            ),
        }
        .warn();
        return Ok(());
    }
    let dk = tree::doc_key(c.coll, c.key);
    let old_ts = match tree.get(&dk)? {
        Some(v) => Some(tree::split_value(&v)?.0),
        None => None,
    };
    let new_ts = (c.op != ChangeOp::Delete).then_some(ts);
    if let Some(o) = old_ts
        && new_ts.is_none_or(|n| tree::bucket(n) != tree::bucket(o))
    {
        tree.remove(tree::time_key(c.coll, tree::bucket(o), c.key), lsn);
    }
    match (new_ts, c.after) {
        (Some(n), Some(after)) => {
            if old_ts.is_none_or(|o| tree::bucket(o) != tree::bucket(n)) {
                tree.insert(
                    tree::time_key(c.coll, tree::bucket(n), c.key),
                    Vec::new(),
                    lsn,
                );
            }
            tree.insert(dk, tree::value(n, after), lsn);
        }
        _ => {
            tree.remove(dk, lsn);
        }
    }
    // Visible to the next change's read of the same key.
    tree.publish(lsn);
    Ok(())
}

/// The summary of a finished segment for its index file.
pub(crate) fn summarize(
    shared: &Shared,
    seq: u64,
    sizes: &HashMap<String, (u64, Vec<u32>)>,
) -> Option<SegSummary> {
    let info = shared.segments.get(&seq)?;
    let mut colls = Vec::new();
    for (name, sc) in &info.colls {
        let seeks = shared
            .capped
            .get(name)
            .map(|v| {
                v.seeks
                    .iter()
                    .filter(|s| s.seq == seq)
                    .map(|s| (s.pos, s.off))
                    .collect()
            })
            .unwrap_or_default();
        let mut out = Vec::with_capacity((sc.end - sc.first) as usize);
        if let Some((oldest, all)) = sizes.get(name) {
            for pos in sc.first..sc.end {
                out.push(if pos < *oldest {
                    u32::MAX
                } else {
                    all.get((pos - oldest) as usize)
                        .copied()
                        .unwrap_or(u32::MAX)
                });
            }
        }
        colls.push(CollSummary {
            name: name.clone(),
            seg: sc.clone(),
            seeks,
            sizes: out,
        });
    }
    let change_seeks = shared
        .change_seeks
        .iter()
        .filter(|s| s.seq == seq)
        .map(|s| (s.pos, s.off))
        .collect();
    Some(SegSummary {
        seq,
        first_lsn: info.first_lsn,
        last_lsn: info.last_lsn,
        end: info.end,
        changes: info.changes,
        change_seeks,
        colls,
    })
}

/// Indexes `fields` of `coll`'s retained documents (a field added to an existing
/// collection's indexes), in every segment that holds some.
pub(crate) fn backfill_index(
    fs: &dyn Fs,
    jdir: &Path,
    shared: &RwLock<Shared>,
    _tree: &Tree,
    coll: &str,
    fields: &[String],
) -> Result<()> {
    let segs: Vec<(u64, Arc<Segment>)> = {
        let s = shared.read().map_err(|_| damaged("lock".into()))?;
        s.segments
            .iter()
            .filter(|(_, i)| i.colls.contains_key(coll))
            .map(|(k, i)| (*k, i.seg.clone()))
            .collect()
    };
    let only: HashMap<String, Vec<String>> = [(coll.to_owned(), fields.to_vec())].into();
    for (seq, seg) in segs {
        let scanned = scan_segment(&seg, None, &only)?;
        let added = scanned.index.into_sorted();
        let mut s = shared.write().map_err(|_| damaged("lock".into()))?;
        let Some(info) = s.segments.get_mut(&seq) else {
            continue;
        };
        match &mut info.index {
            SegIndex::Memory(m) => {
                for (h, p) in added {
                    m.push(h, p);
                }
            }
            SegIndex::Sealed(v) => {
                let mut all: Vec<(u64, u64)> = v.as_ref().clone();
                all.extend(added);
                all.sort_unstable();
                *v = Arc::new(all);
            }
            SegIndex::File { path, entries } => {
                let (summary, _) = state::read_index_file(fs, path)
                    .ok_or_else(|| damaged(format!("{} is damaged", path.display())))?;
                let mut all = read_all_entries(fs, path, *entries)?;
                all.extend(added);
                all.sort_unstable();
                state::write_index_file(fs, path, &summary, &all)?;
                *entries = all.len() as u64;
                // Its values file has no summary of the new fields: the maintenance thread
                // writes it again (`maint`, values files due).
                let _ = fs.remove(&values::path(jdir, seq));
            }
        }
    }
    Ok(())
}

fn read_all_entries(fs: &dyn Fs, path: &Path, entries: u64) -> Result<Vec<(u64, u64)>> {
    let b = fs
        .read(path)
        .map_err(|e| journal::io_error(format!("reading {}", path.display()), e))?;
    let mut r = format::Reader::new(&b);
    r.take(48)?;
    let mut out = Vec::with_capacity(entries as usize);
    for _ in 0..entries {
        out.push((r.u64()?, r.u64()?));
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use crate::embedded::EmbeddedStore;
    use crate::embedded::writer::Kv;
    use crate::{ChangeOp, Durability, KeyUpdate, Store, Update};
    use std::sync::Arc;

    /// A journal written by a release that did not bound keys holds a change whose key the
    /// tree cannot hold (its writer panicked on it right after writing the record). Such a
    /// directory opens: the change is left out of the keyed state, everything else is there.
    #[tokio::test]
    async fn a_journal_holding_a_key_the_tree_cannot_hold_opens() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path(), Default::default()).unwrap();
        let k = store.keyed("rollups").await.unwrap();
        k.update(
            vec![KeyUpdate::new("lang:tr", Update::inc("count", 1))],
            Durability::Journaled,
        )
        .await
        .unwrap();
        let long = format!("hashtags:{}", "i̇".repeat(22_000));
        assert!(long.len() > super::tree::TREE_KEY_MAX);
        let next = store
            .newest_change()
            .await
            .unwrap()
            .unwrap()
            .0
            .parse::<u64>()
            .unwrap()
            + 1;
        let doc: crate::Document = serde_json::from_str(r#"{"count":1}"#).unwrap();
        let after = Kv {
            json: Arc::from(r#"{"count":1}"#),
            doc: Arc::new(doc),
            ts: 1,
        };
        let change = (
            ChangeOp::Insert,
            "rollups".to_owned(),
            long,
            None,
            Some(after),
        );
        store
            .inner
            .cell
            .with(|w| w.import_changes(next, 1, vec![change]))
            .unwrap()
            .unwrap();
        k.update(
            vec![KeyUpdate::new("lang:tr", Update::inc("count", 1))],
            Durability::Journaled,
        )
        .await
        .unwrap();
        store.close().await.unwrap();
        for _ in 0..2 {
            let store = EmbeddedStore::open(dir.path(), Default::default()).unwrap();
            let k = store.keyed("rollups").await.unwrap();
            assert_eq!(
                k.get("lang:tr").await.unwrap().unwrap()["count"],
                serde_json::json!(2)
            );
            assert!(k.scan("hashtags:").await.unwrap().is_empty());
            store.close().await.unwrap();
        }
    }
}
