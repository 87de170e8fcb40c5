//! The maintenance thread: what happens off the commit's path.
//!
//! - **Flush**: a sealed memtable of the tree is written to a table, then the tree compacts
//!   (leveled) what is due. Both are sequential writes, amortised over every commit since the
//!   last flush; a key written a thousand times meanwhile (a source's summary) is written once.
//! - **Index files**: a finished segment's index goes to its `.idx` file, and the values of
//!   its indexed fields to its `.val` file ([`super::values`]).
//! - **Values files due**: a finished segment without a values file (a store from before them,
//!   a crash between its two files, a field added to the indexes) gets one, a segment at a
//!   time while nothing else is asked, so queries by its fields read it from the file again.
//! - **Release**: the oldest segment goes once nothing needs it — its capped documents
//!   evicted, its changes past the history the change log keeps, its keyed writes in the
//!   tree's tables. A segment kept only for a few documents of a slowly evicted collection
//!   (dead letters among millions of events) has those documents moved into the tree first
//!   (a spill), so it does not hold a whole segment of the journal, nor every segment after
//!   it ([`SPILL_SHARE`], [`SPILL_BEHIND`]).

use crate::telemetry::Problem;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use super::catalog::Catalog;
use super::format::{Entry, Header};
use super::fs::Fs;
use super::journal::{self, SegmentScan};
use super::state::{SegIndex, SegSummary, Shared};
use super::tree::Tree;
use super::writer::Op;
use crate::{Durability, Result};

/// How often the thread looks for segments to release when nothing else wakes it.
const CHECK_EVERY: Duration = Duration::from_secs(5);
/// Between two values files written for segments that lack one: a store of a million events
/// (about 125 segments) gets them in well under a minute, and the thread stays mostly idle
/// meanwhile, for the pipeline's work.
const VALUES_PAUSE: Duration = Duration::from_millis(50);
/// A collection's documents in a segment are moved into the tree (to release the segment)
/// when they take at most this share of it...
const SPILL_SHARE: u64 = 4;
/// ...or when the journal after the segment holds this many times what the collection
/// retains in all: its documents are evicted so slowly (dead letters among millions of
/// events) that keeping the segment would keep every segment after it too. So the journal
/// holds at most about this many times what its capped collections retain, whatever their
/// pace; a collection that keeps pace with the journal (the events) never meets it, and its
/// oldest segment waits for its eviction, which is near.
const SPILL_BEHIND: u64 = 4;

pub(crate) enum Task {
    Flush,
    WriteIndex {
        path: PathBuf,
        summary: SegSummary,
        entries: Arc<Vec<(u64, u64)>>,
        /// Each capped collection's indexed fields, whose values go to the values file.
        indexes: HashMap<String, Vec<String>>,
    },
    /// Look for segments to release now (and, again, for segments without a values file).
    Check,
    /// Write one values file due ([`Maint::values_due`]).
    WriteValues,
}

/// Finished segments whose values file is due.
#[derive(Default)]
pub(crate) struct ValuesDue {
    /// Oldest first; `None` until the next look.
    due: Option<VecDeque<u64>>,
    /// Whether a look has read every file: the first does (a damaged file is written again),
    /// later ones only look for missing files.
    looked: bool,
    /// Segments whose file could not be written: not tried again until the next open.
    failed: HashSet<u64>,
}

/// Sequence numbers readers hold (snapshots): the tree keeps the versions they see.
#[derive(Default)]
pub(crate) struct Snapshots {
    held: Mutex<BTreeMap<u64, usize>>,
}

impl Snapshots {
    pub fn hold(self: &Arc<Self>, seqno: u64) -> Hold {
        if let Ok(mut h) = self.held.lock() {
            *h.entry(seqno).or_default() += 1;
        }
        Hold {
            snapshots: self.clone(),
            seqno,
        }
    }

    /// Versions older than this that are shadowed may go.
    pub fn gc_below(&self, visible: u64) -> u64 {
        self.held
            .lock()
            .ok()
            .and_then(|h| h.keys().next().copied())
            .map_or(visible, |s| s.min(visible))
    }
}

/// A held snapshot; released when dropped.
pub(crate) struct Hold {
    snapshots: Arc<Snapshots>,
    seqno: u64,
}

impl Drop for Hold {
    fn drop(&mut self) {
        if let Ok(mut h) = self.snapshots.held.lock()
            && let Some(n) = h.get_mut(&self.seqno)
        {
            *n -= 1;
            if *n == 0 {
                h.remove(&self.seqno);
            }
        }
    }
}

/// What the thread works on.
pub(crate) struct Maint {
    pub fs: Arc<dyn Fs>,
    pub dir: PathBuf,
    pub tree: Arc<Tree>,
    pub shared: Arc<RwLock<Shared>>,
    pub catalog: Arc<Mutex<Catalog>>,
    pub snapshots: Arc<Snapshots>,
    pub rotate_asked: Arc<AtomicBool>,
    pub oplog_max: u64,
    /// Hands an operation to the writer and waits for it; `false` once the store is closed.
    pub submit: Box<dyn Fn(Op, Durability) -> bool + Send>,
    /// The segment whose documents were moved into the tree, and the sequence number the
    /// tree's tables must reach before it goes.
    pub spilled: Option<(u64, u64)>,
    pub values: ValuesDue,
}

pub(crate) fn run(mut m: Maint, rx: Receiver<Task>) {
    loop {
        let due = m.values_due();
        let task = match rx.recv_timeout(if due { VALUES_PAUSE } else { CHECK_EVERY }) {
            Ok(t) => t,
            Err(RecvTimeoutError::Timeout) if due => Task::WriteValues,
            Err(RecvTimeoutError::Timeout) => Task::Check,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        if let Err(e) = m.run_task(task) {
            Problem {
                error_type: "maintenance",
                detail: &format!("storage maintenance failed ({e}); it is tried again later"),
            }
            .warn();
            continue;
        }
        if let Err(e) = m.release() {
            Problem {
                error_type: "maintenance",
                detail: &format!(
                    "could not release a journal segment ({e}); it is tried again later"
                ),
            }
            .warn();
        }
    }
}

impl Maint {
    /// Does one task (a release is separate: [`Maint::release`]).
    pub(crate) fn run_task(&mut self, task: Task) -> Result<()> {
        match task {
            Task::Flush => self.flush(),
            Task::WriteIndex {
                path,
                summary,
                entries,
                indexes,
            } => self.write_index(path, &summary, &entries, &indexes),
            Task::Check => {
                if self.values.due.as_ref().is_some_and(VecDeque::is_empty) {
                    self.values.due = None;
                }
                Ok(())
            }
            Task::WriteValues => self.write_values_due(),
        }
    }

    /// Whether a values file is due, or the next look for one is.
    pub(crate) fn values_due(&self) -> bool {
        self.values.due.as_ref().is_none_or(|d| !d.is_empty())
    }

    /// Writes the oldest values file due, after looking for them when no look is current.
    fn write_values_due(&mut self) -> Result<()> {
        let indexes: HashMap<String, Vec<String>> = {
            let catalog = self.catalog.lock().map_err(super::lock_err)?;
            catalog
                .collections
                .iter()
                .filter(|(_, c)| c.kind == super::catalog::Kind::Capped && !c.indexes.is_empty())
                .map(|(n, c)| (n.clone(), c.indexes.clone()))
                .collect()
        };
        if self.values.due.is_none() {
            let due = self.look_for_values(&indexes)?;
            if !due.is_empty() {
                tracing::info!(
                    segments = due.len(),
                    "writing the values files of finished journal segments that have none; queries by an indexed field read those segments' documents until then"
                );
            }
            self.values.looked = true;
            self.values.due = Some(due);
        }
        let Some(seq) = self.values.due.as_mut().and_then(VecDeque::pop_front) else {
            return Ok(());
        };
        let found = {
            let shared = self.shared.read().map_err(super::lock_err)?;
            shared.segments.get(&seq).and_then(|i| match &i.index {
                SegIndex::File { path, .. } => Some((path.clone(), i.end, i.last_lsn)),
                _ => None,
            })
        };
        // Released meanwhile, or not finished: nothing to write.
        let Some((idx, end, last_lsn)) = found else {
            return Ok(());
        };
        let summary = SegSummary {
            seq,
            end,
            last_lsn,
            ..SegSummary::default()
        };
        let written = self.write_values(&idx, &summary, &indexes);
        if !written {
            self.values.failed.insert(seq);
        }
        if self.values.due.as_ref().is_some_and(VecDeque::is_empty) {
            tracing::debug!("every finished journal segment has its values file");
        }
        Ok(())
    }

    /// Finished segments holding an indexed capped collection whose values file is missing
    /// (at the first look also: damaged, or made for other contents), oldest first.
    fn look_for_values(&self, indexes: &HashMap<String, Vec<String>>) -> Result<VecDeque<u64>> {
        if indexes.is_empty() {
            return Ok(VecDeque::new());
        }
        let candidates: Vec<(u64, PathBuf, super::values::Tie)> = {
            let shared = self.shared.read().map_err(super::lock_err)?;
            shared
                .segments
                .iter()
                .filter(|(seq, i)| {
                    matches!(i.index, SegIndex::File { .. })
                        && i.colls.keys().any(|c| indexes.contains_key(c))
                        && !self.values.failed.contains(seq)
                })
                .filter_map(|(seq, i)| match &i.index {
                    SegIndex::File { path, .. } => path.parent().map(|jdir| {
                        let tie = super::values::Tie {
                            seq: *seq,
                            end: i.end,
                            last_lsn: i.last_lsn,
                        };
                        (*seq, super::values::path(jdir, *seq), tie)
                    }),
                    _ => None,
                })
                .collect()
        };
        Ok(candidates
            .into_iter()
            .filter(|(_, path, tie)| {
                if self.values.looked {
                    !self.fs.exists(path)
                } else {
                    !super::values::holds(&*self.fs, path, *tie)
                }
            })
            .map(|(seq, _, _)| seq)
            .collect())
    }

    pub(crate) fn flush(&self) -> Result<()> {
        let gc = self.snapshots.gc_below(self.tree.visible());
        self.tree.flush_and_compact(gc)
    }

    pub(crate) fn write_index(
        &self,
        path: PathBuf,
        summary: &SegSummary,
        entries: &[(u64, u64)],
        indexes: &HashMap<String, Vec<String>>,
    ) -> Result<()> {
        super::state::write_index_file(&*self.fs, &path, summary, entries)?;
        let _ = self.write_values(&path, summary, indexes);
        let mut shared = self.shared.write().map_err(super::lock_err)?;
        if let Some(info) = shared.segments.get_mut(&summary.seq)
            && matches!(info.index, SegIndex::Sealed(_))
        {
            info.index = SegIndex::File {
                path,
                entries: entries.len() as u64,
            };
        }
        Ok(())
    }

    /// Writes a finished segment's values file: its documents are read once more, for the
    /// values of the indexed fields (the writer keeps only their hashes); says whether it did.
    /// The file is tied to what the read found, and written only when that is what `summary`
    /// (readers' knowledge of the segment) says the segment holds.
    fn write_values(
        &self,
        idx: &Path,
        summary: &SegSummary,
        indexes: &HashMap<String, Vec<String>>,
    ) -> bool {
        if !indexes.values().any(|f| !f.is_empty()) {
            return false;
        }
        let seg = match self.shared.read() {
            Ok(shared) => shared.segments.get(&summary.seq).map(|i| i.seg.clone()),
            Err(_) => None,
        };
        let (Some(seg), Some(jdir)) = (seg, idx.parent()) else {
            return false;
        };
        match super::recover::scan_segment(&seg, None, indexes) {
            Ok(scanned)
                if scanned.summary.end == summary.end
                    && scanned.summary.last_lsn == summary.last_lsn =>
            {
                super::recover::write_values(&*self.fs, jdir, &scanned.summary, scanned.values)
            }
            Ok(_) => {
                tracing::warn!(
                    segment = summary.seq,
                    "a journal segment read for its values file ended elsewhere than recorded; queries read its documents instead"
                );
                false
            }
            Err(e) => {
                tracing::warn!(error = %e, segment = summary.seq, "could not read a journal segment for its values file; queries read its documents instead");
                false
            }
        }
    }

    /// Releases the oldest segments nothing needs any more (see the module's doc).
    pub(crate) fn release(&mut self) -> Result<()> {
        loop {
            let (seq, last_lsn, end, colls, changes_end) = {
                let shared = self.shared.read().map_err(super::lock_err)?;
                let mut it = shared.segments.iter();
                let Some((seq, info)) = it.next() else {
                    return Ok(());
                };
                // The segment being written stays.
                if it.next().is_none() {
                    return Ok(());
                }
                (
                    *seq,
                    info.last_lsn,
                    info.end,
                    info.colls.clone(),
                    info.changes.1,
                )
            };
            // The change log's history.
            let (change_oldest, _) = self.change_bounds()?;
            if changes_end > change_oldest {
                return Ok(());
            }
            // Capped documents still retained: moved into the tree when few, else the segment
            // stays until they are evicted.
            let mut needed = last_lsn;
            if self.spilled.is_none_or(|(s, _)| s != seq) {
                let mut spill: Vec<(String, u64, u64)> = Vec::new();
                let mut worth = true;
                {
                    let shared = self.shared.read().map_err(super::lock_err)?;
                    let behind: u64 = shared.segments.range(seq + 1..).map(|(_, i)| i.end).sum();
                    for (name, sc) in &colls {
                        let Some(v) = shared.capped.get(name) else {
                            continue;
                        };
                        let from = sc.first.max(v.oldest).max(v.journal_from);
                        if from < sc.end {
                            let live = (sc.end - from).saturating_mul(v.bytes / v.count.max(1));
                            worth &= live <= end / SPILL_SHARE
                                || behind > v.bytes.saturating_mul(SPILL_BEHIND);
                            spill.push((name.clone(), from, sc.end));
                        }
                    }
                }
                if !spill.is_empty() {
                    if !worth {
                        return Ok(());
                    }
                    if !self.spill(seq, &spill)? {
                        return Ok(());
                    }
                    // The spill was synced: readers see it, and the tree's tables must reach it.
                    self.spilled = Some((seq, self.tree.shown_lsn()));
                }
            }
            if let Some((s, at)) = self.spilled
                && s == seq
            {
                needed = needed.max(at);
            }
            // The tree's tables must hold the segment's keyed writes (and what was spilled).
            let persisted = self.tree.persisted_lsn();
            if persisted < needed {
                self.rotate_asked.store(true, Ordering::Release);
                // The writer seals the memtable after this empty commit and queues its
                // flush; this runs again after it.
                let _ = (self.submit)(Op::Barrier, Durability::Acknowledged);
                return Ok(());
            }
            self.drop_segment(seq, &colls)?;
            self.spilled = None;
        }
    }

    fn change_bounds(&self) -> Result<(u64, u64)> {
        let shared = self.shared.read().map_err(super::lock_err)?;
        let next = shared.change_next;
        Ok((
            shared
                .change_first
                .max(next.saturating_sub(self.oplog_max))
                .max(1),
            next,
        ))
    }

    /// Moves the retained documents `[from, to)` of each listed collection, held in segment
    /// `seq`, into the tree (through the writer, so its sequence numbers stay the journal's).
    fn spill(&self, seq: u64, ranges: &[(String, u64, u64)]) -> Result<bool> {
        let (seg, end) = {
            let shared = self.shared.read().map_err(super::lock_err)?;
            let Some(info) = shared.segments.get(&seq) else {
                return Ok(false);
            };
            (info.seg.clone(), info.end)
        };
        let mut docs: HashMap<String, Vec<(u64, i64, Vec<u8>)>> = HashMap::new();
        let mut scan = SegmentScan::new(&seg, 0, end);
        while let Some((_, bytes)) = scan.next_raw()? {
            let h = Header::parse(bytes)?;
            for (si, s) in h.sections.iter().enumerate() {
                let Some((_, from, to)) = ranges.iter().find(|r| r.0 == s.coll) else {
                    continue;
                };
                let base = h.section_entry(si);
                let lo = s.first;
                let hi = lo + s.count as u64;
                if hi <= *from || lo >= *to {
                    continue;
                }
                let (e_lo, e_hi) = (
                    base + (from.max(&lo) - lo) as u32,
                    base + ((*to).min(hi) - lo) as u32,
                );
                for (bi, _) in h.blocks_for(e_lo, e_hi) {
                    let data = h.block(bytes, bi)?;
                    for e in h.entries(bi, &data) {
                        let (index, entry) = e?;
                        if index < e_lo || index >= e_hi {
                            continue;
                        }
                        if let Entry::Doc(json) = entry {
                            docs.entry(s.coll.clone()).or_default().push((
                                lo + (index - base) as u64,
                                h.ts,
                                json.to_vec(),
                            ));
                        }
                    }
                }
            }
        }
        for (coll, docs) in docs {
            // Synced, so readers (and `Tree::visible`, which the release waits for the
            // tables to reach) see it before the segment goes.
            if !(self.submit)(Op::Spill { coll, docs }, Durability::Journaled) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Forgets segment `seq`: the catalog first (so a crash after it skips the segment at the
    /// next open), then the tables the readers use, then the files.
    fn drop_segment(
        &self,
        seq: u64,
        colls: &BTreeMap<String, super::state::SegColl>,
    ) -> Result<()> {
        let jdir = self.dir.join(journal::DIR);
        {
            let mut shared = self.shared.write().map_err(super::lock_err)?;
            let next_seg_first_lsn = shared
                .segments
                .range(seq + 1..)
                .next()
                .map(|(_, i)| i.first_lsn);
            let mut catalog = self.catalog.lock().map_err(super::lock_err)?;
            let mut updated = catalog.clone();
            updated.first_segment = seq + 1;
            if let Some(l) = next_seg_first_lsn {
                updated.next_lsn = updated.next_lsn.max(l);
            }
            updated.next_change = shared.change_next;
            updated.first_change = shared
                .segments
                .range(seq + 1..)
                .map(|(_, i)| i)
                .find(|i| i.changes.1 > i.changes.0)
                .map_or(shared.change_next, |i| i.changes.0);
            for (name, v) in &shared.capped {
                if let Some(c) = updated.collections.get_mut(name) {
                    c.next_pos = v.next;
                    c.oldest_pos = v.oldest;
                    let from = colls
                        .get(name)
                        .map_or(v.journal_from, |sc| sc.end.max(v.journal_from));
                    c.journal_from = from;
                }
            }
            updated.save(&*self.fs, &self.dir)?;
            *catalog = updated;
            for (name, sc) in colls {
                if let Some(v) = shared.capped.get_mut(name) {
                    v.journal_from = v.journal_from.max(sc.end);
                    v.seeks.retain(|s| s.seq != seq);
                }
            }
            for v in shared.capped.values_mut() {
                v.seeks.retain(|s| s.seq != seq);
            }
            shared.change_seeks.retain(|s| s.seq != seq);
            shared.segments.remove(&seq);
            let first_change = shared
                .segments
                .values()
                .find(|i| i.changes.1 > i.changes.0)
                .map_or(shared.change_next, |i| i.changes.0);
            shared.change_first = first_change;
        }
        let _ = self.fs.remove(&journal::segment_path(&jdir, seq));
        let _ = self.fs.remove(&journal::index_path(&jdir, seq));
        let _ = self.fs.remove(&super::values::path(&jdir, seq));
        tracing::debug!(segment = seq, "journal segment released");
        Ok(())
    }
}
