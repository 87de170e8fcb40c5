//! The keyed state: one LSM tree (`lsm-tree`, fjall's engine, used without a journal of its
//! own) holding the keyed collections' documents, their write-time index, the feeds'
//! checkpoints and the capped documents moved out of released journal segments.
//!
//! The journal is the tree's log: every write carries the number of the journal record it
//! came from as its sequence number, and [`APPLIED`] (written just before a memtable is
//! sealed) says up to which record the tree's tables hold everything, so recovery replays the
//! records after it. Only the writer thread inserts, so a commit's writes never straddle two
//! memtables.
//!
//! Keys (collection names are `[a-z0-9_]`, so the zero byte ends them):
//! - `d <coll> 0 <key>` → write time (i64 LE, µs) + the document's JSON;
//! - `t <coll> 0 <bucket u64 BE> <key>` → nothing: the key was last written in that
//!   [`EXPIRE_BUCKET_US`]-wide bucket of time (moved when a write lands in another bucket), so
//!   `expire` finds idle keys oldest first without reading every key;
//! - `c <feed>` → a feed's checkpoint;
//! - `p <coll> 0 <position u64 BE>` → commit time + JSON of a capped document whose segment
//!   was released while it was still retained;
//! - [`APPLIED`] → the journal record number the tables are complete up to.

use std::path::Path;
use std::sync::Arc;

use lsm_tree::{AbstractTree, AnyTree, Guard, SeqNo, SequenceNumberCounter};

use crate::{Result, StoreError};

/// Width of the write-time index's buckets: a key written again within its bucket does not
/// move its index entry (a source's summary, written on every event, moves once a minute).
pub(crate) const EXPIRE_BUCKET_US: i64 = 60_000_000;
/// The marker of the journal record the tables are complete up to.
pub(crate) const APPLIED: &[u8] = b"m\0applied";
/// The block cache shared by reads of the tree's tables: small, as most reads of long-tail
/// keys miss anyway (the filter of stored keys skips most of them), and what it holds counts
/// in the process's resident memory: a slow stream's footprint is a target of its own.
const CACHE_BYTES: u64 = 1 << 20;
/// Sealed memtables the writer lets wait for their flush before it waits itself
/// ([`Tree::behind`]). A memtable holds about 2.3 times its counted bytes in memory (17,773
/// keys of a counter, 2 MiB counted, took 4.7 MB), so with the one filling, up to four are
/// about 19 MB on a flat-out load.
const MAX_SEALED: usize = 2;
/// Runs of level-0 tables the writer lets wait for their merge before it waits itself: well
/// past [`L0_TABLES`], where the merge starts.
const MAX_L0_RUNS: usize = 24;
/// Tables level 0 gathers before they are merged into level 1. On a long tail every table
/// overlaps all of level 1, so each merge rewrites it: fewer, larger merges write less.
const L0_TABLES: u8 = 8;

/// The size a merge cuts its output tables at (on disk, compressed; lsm-tree's default is
/// 64 MiB). A table being written holds its whole filter and index in memory until it is
/// finished: on a merge of millions of keys into 64 MiB tables, 17 MB of filter and 4 MB of
/// index (heaptrack, 4 million keys loaded flat out), the largest thing the process held.
const TABLE_BYTES: u64 = 16 << 20;

/// How the tree compacts (leveled, see [`L0_TABLES`]).
pub(crate) fn compaction()
-> std::sync::Arc<dyn lsm_tree::compaction::CompactionStrategy + Send + Sync> {
    std::sync::Arc::new(
        lsm_tree::compaction::Leveled::default()
            .with_l0_threshold(L0_TABLES)
            .with_table_target_size(TABLE_BYTES),
    )
}

pub(crate) fn tree_err(e: lsm_tree::Error) -> StoreError {
    match e {
        lsm_tree::Error::Io(source) => super::journal::io_error("keyed state", source),
        other => StoreError::Engine {
            engine: "embedded",
            message: format!("keyed state: {other:?}"),
        },
    }
}

/// The longest key the tree takes: `lsm-tree` asserts (panics) past it, on an insert and on a
/// range bound alike. Keys of keyed documents are bounded before they get here
/// ([`crate::MAX_KEY_BYTES`]); [`fits`] is for what was written before that bound (a journal
/// replayed at open, an earlier layout converted).
pub(crate) const TREE_KEY_MAX: usize = u16::MAX as usize;

/// Whether the tree keys of document `key` of `coll` (the document's and its write-time
/// index entry's, the longer) fit in the tree.
pub(crate) fn fits(coll: &str, key: &str) -> bool {
    time_prefix(coll).len() + 8 + key.len() <= TREE_KEY_MAX
}

/// The prefix of every keyed document's key.
pub(crate) const DOC_PREFIX: &[u8] = b"d";

/// The collection and key of a document key (`None` for a key that is not one).
pub(crate) fn split_doc_key(k: &[u8]) -> Option<(&str, &str)> {
    let rest = k.strip_prefix(DOC_PREFIX)?;
    let zero = rest.iter().position(|&b| b == 0)?;
    let coll = std::str::from_utf8(&rest[..zero]).ok()?;
    let key = std::str::from_utf8(&rest[zero + 1..]).ok()?;
    Some((coll, key))
}

pub(crate) fn doc_key(coll: &str, key: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(2 + coll.len() + key.len());
    k.push(b'd');
    k.extend_from_slice(coll.as_bytes());
    k.push(0);
    k.extend_from_slice(key.as_bytes());
    k
}

/// The prefix of every document key of `coll`.
pub(crate) fn doc_prefix(coll: &str) -> Vec<u8> {
    doc_key(coll, "")
}

pub(crate) fn bucket(ts: i64) -> u64 {
    (ts.max(0) / EXPIRE_BUCKET_US) as u64
}

pub(crate) fn time_key(coll: &str, bucket: u64, key: &str) -> Vec<u8> {
    let mut k = time_prefix(coll);
    k.extend_from_slice(&bucket.to_be_bytes());
    k.extend_from_slice(key.as_bytes());
    k
}

pub(crate) fn time_prefix(coll: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(2 + coll.len() + 8);
    k.push(b't');
    k.extend_from_slice(coll.as_bytes());
    k.push(0);
    k
}

pub(crate) fn checkpoint_key(feed: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + feed.len());
    k.push(b'c');
    k.extend_from_slice(feed.as_bytes());
    k
}

pub(crate) fn spill_key(coll: &str, pos: u64) -> Vec<u8> {
    let mut k = spill_prefix(coll);
    k.extend_from_slice(&pos.to_be_bytes());
    k
}

pub(crate) fn spill_prefix(coll: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(2 + coll.len() + 8);
    k.push(b'p');
    k.extend_from_slice(coll.as_bytes());
    k.push(0);
    k
}

/// A stored value: write time and JSON.
pub(crate) fn value(ts: i64, json: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(8 + json.len());
    v.extend_from_slice(&ts.to_le_bytes());
    v.extend_from_slice(json);
    v
}

/// Splits a stored value into write time and JSON.
pub(crate) fn split_value(v: &[u8]) -> Result<(i64, &[u8])> {
    if v.len() < 8 {
        return Err(StoreError::Engine {
            engine: "embedded",
            message: "keyed state: a value without its write time".into(),
        });
    }
    let mut ts = [0u8; 8];
    ts.copy_from_slice(&v[..8]);
    Ok((i64::from_le_bytes(ts), &v[8..]))
}

/// How far apart the tree's sequence numbers of two journal records lie: record `lsn`'s
/// writes carry `lsn << SEQNO_SHIFT`. The tree numbers its own versions (each flush,
/// compaction and memtable rotation makes one) from a counter of its own, and a read at
/// sequence number `s` uses the newest version numbered below `s`. Numbered from a counter
/// of their own, versions outran the records on a store with few, large commits: a read then
/// took a version older than the memtable holding what it looked for (missing it), or found
/// none (a panic). So a version made after record `n` is numbered between `n`'s writes and
/// `n + 1`'s ([`Tree::before_new_version`]): room for 2^20 versions between two records.
const SEQNO_SHIFT: u32 = 20;

/// The tree's sequence number of journal record `lsn`'s writes.
pub(crate) fn seqno(lsn: u64) -> SeqNo {
    lsn << SEQNO_SHIFT
}

/// The tree, and the sequence number reads see.
pub(crate) struct Tree {
    lsm: AnyTree,
    /// Reads see writes with a sequence number below this: past the last record shown to
    /// readers ([`Tree::publish`]).
    visible: SequenceNumberCounter,
    /// The tree's own counter, which numbers its versions (see [`SEQNO_SHIFT`]).
    versions: SequenceNumberCounter,
    /// The last record whose writes are in the tree (shown or not).
    written: std::sync::atomic::AtomicU64,
    /// Flushes done so far, and a wake-up for a writer waiting for one ([`Tree::stall`]).
    flushes: (std::sync::Mutex<u64>, std::sync::Condvar),
}

impl Tree {
    pub fn open(dir: &Path) -> Result<Tree> {
        let visible = SequenceNumberCounter::default();
        let versions = SequenceNumberCounter::default();
        // The tree raises the "visible" counter it is given past each version it makes: given
        // ours, it would show readers records not yet synced. It gets one of its own.
        let tree = lsm_tree::Config::new(dir, versions.clone(), SequenceNumberCounter::default())
            .use_cache(Arc::new(lsm_tree::Cache::with_capacity_bytes(CACHE_BYTES)))
            // Every level compressed (level 0 too: a flush writes LZ4 blocks).
            .data_block_compression_policy(lsm_tree::config::CompressionPolicy::all(
                lsm_tree::CompressionType::Lz4,
            ))
            // Index and filter blocks are partitioned at every level: a point read loads one
            // small partition of each through the bounded cache. A whole filter or index block
            // of a large table does not fit that cache, so an upsert of a new key (a miss that
            // asks every table) read and checksummed all of it again, and loading keys slowed
            // with the square of their number. Only the small top-level indexes stay in memory.
            .index_block_partitioning_policy(lsm_tree::config::PinningPolicy::all(true))
            .filter_block_partitioning_policy(lsm_tree::config::PinningPolicy::all(true))
            // Pinning applies to whole blocks only: tables written before their blocks were
            // partitioned, until compaction rewrites them (level 0's pinned, as then).
            .index_block_pinning_policy(lsm_tree::config::PinningPolicy::new([true, false]))
            .filter_block_pinning_policy(lsm_tree::config::PinningPolicy::new([true, false]))
            .open()
            .map_err(tree_err)?;
        Ok(Tree {
            lsm: tree,
            visible,
            versions,
            written: std::sync::atomic::AtomicU64::new(0),
            flushes: Default::default(),
        })
    }

    /// A sequence number past every write: a read at it sees the tree as it is, shown or not
    /// (the key filter's builds, which want every key).
    pub const LATEST: SeqNo = SeqNo::MAX >> 2;

    /// The sequence number reads see: past the newest record shown to readers.
    pub fn visible(&self) -> SeqNo {
        self.visible.get()
    }

    /// The newest record readers see.
    pub fn shown_lsn(&self) -> u64 {
        self.visible().saturating_sub(1) >> SEQNO_SHIFT
    }

    /// Makes the writes of record `lsn` (and before) visible to reads.
    pub fn publish(&self, lsn: u64) {
        self.visible.fetch_max(seqno(lsn) + 1);
    }

    /// The sequence number that reads everything records before `lsn` wrote, shown or not
    /// (the writer's own reads).
    pub fn before(lsn: u64) -> SeqNo {
        seqno(lsn)
    }

    /// Inserts `key` as written by record `lsn`.
    pub fn insert(
        &self,
        key: impl Into<lsm_tree::UserKey>,
        value: impl Into<lsm_tree::UserValue>,
        lsn: u64,
    ) {
        self.written
            .fetch_max(lsn, std::sync::atomic::Ordering::AcqRel);
        self.lsm.insert(key, value, seqno(lsn));
    }

    /// Removes `key` as record `lsn`.
    pub fn remove(&self, key: impl Into<lsm_tree::UserKey>, lsn: u64) {
        self.written
            .fetch_max(lsn, std::sync::atomic::Ordering::AcqRel);
        self.lsm.remove(key, seqno(lsn));
    }

    /// Numbers the next version of the tree after every record written so far (and before
    /// the next one's writes): called before anything that makes one.
    fn before_new_version(&self) {
        let written = self.written.load(std::sync::atomic::Ordering::Acquire);
        self.versions.fetch_max(seqno(written) + 1);
    }

    /// Bytes in the active memtable.
    pub fn memtable_bytes(&self) -> u64 {
        self.lsm.active_memtable().size()
    }

    /// Seals the active memtable (for a flush); whether there was anything to seal.
    pub fn rotate(&self) -> bool {
        self.before_new_version();
        self.lsm.rotate_memtable().is_some()
    }

    /// Writes sealed memtables to tables, then compacts what is due; versions older than
    /// `gc` (a sequence number) may be dropped.
    pub fn flush_and_compact(&self, gc: SeqNo) -> Result<()> {
        self.before_new_version();
        {
            let lock = self.lsm.get_flush_lock();
            self.lsm.flush(&lock, gc).map_err(tree_err)?;
        }
        self.before_new_version();
        let compacted = self.lsm.compact(compaction(), gc).map_err(tree_err);
        if let Ok(mut n) = self.flushes.0.lock() {
            *n += 1;
            self.flushes.1.notify_all();
        }
        compacted
    }

    /// Whether the writer must wait for maintenance before it adds more: sealed memtables
    /// waiting for their flush, or tables of level 0 waiting for their merge, past what is
    /// allowed. Memory (each sealed memtable is held until flushed) and the cost of a read
    /// (which asks every sealed memtable and every level-0 table) then stay bounded whatever
    /// the pace of writes; the writer waits, and its callers with it.
    pub fn behind(&self) -> bool {
        self.lsm.sealed_memtable_count() > MAX_SEALED || self.lsm.l0_run_count() > MAX_L0_RUNS
    }

    /// Waits (at most `limit`) for the next flush while [`Tree::behind`].
    pub fn stall(&self, limit: std::time::Duration) -> std::time::Duration {
        let started = std::time::Instant::now();
        let Ok(mut n) = self.flushes.0.lock() else {
            return started.elapsed();
        };
        while self.behind() && started.elapsed() < limit {
            let seen = *n;
            let left = limit.saturating_sub(started.elapsed());
            match self.flushes.1.wait_timeout_while(n, left, |n| *n == seen) {
                Ok((guard, _)) => n = guard,
                Err(_) => break,
            }
        }
        started.elapsed()
    }

    /// The newest record whose writes are all in the tree's tables.
    pub fn persisted_lsn(&self) -> u64 {
        self.lsm
            .get_highest_persisted_seqno()
            .map_or(0, |s| s >> SEQNO_SHIFT)
    }

    pub fn get(&self, key: &[u8]) -> Result<Option<lsm_tree::UserValue>> {
        self.get_at(key, self.visible())
    }

    pub fn get_at(&self, key: &[u8], seqno: SeqNo) -> Result<Option<lsm_tree::UserValue>> {
        self.lsm.get(key, seqno).map_err(tree_err)
    }

    /// The record number the tables are complete up to (0: none).
    pub fn applied(&self) -> Result<u64> {
        Ok(self
            .lsm
            .get(APPLIED, SeqNo::MAX >> 1)
            .map_err(tree_err)?
            .and_then(|v| {
                v.get(..8)
                    .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
            })
            .unwrap_or(0))
    }

    /// Up to `limit` keys that start with `prefix` and sort after `after` (or from the
    /// first), at `seqno`: [`Tree::page`] without the values.
    pub fn page_keys(
        &self,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
        seqno: SeqNo,
    ) -> Result<Vec<lsm_tree::UserKey>> {
        let mut out = Vec::new();
        for item in self.range_of(prefix, after, seqno) {
            if out.len() >= limit {
                break;
            }
            let k = item.key().map_err(tree_err)?;
            if !k.starts_with(prefix) {
                break;
            }
            out.push(k);
        }
        Ok(out)
    }

    /// The entries from `after` (excluded) or from the first that starts with `prefix`.
    fn range_of<'a>(
        &'a self,
        prefix: &'a [u8],
        after: Option<&'a [u8]>,
        seqno: SeqNo,
    ) -> Box<dyn Iterator<Item = lsm_tree::IterGuardImpl> + 'a> {
        match after {
            Some(after) => {
                let mut upper = prefix.to_vec();
                // Every key of the prefix sorts below the prefix followed by 0xff bytes (keys
                // are UTF-8, which never holds 0xff).
                upper.extend_from_slice(&[0xff; 4]);
                Box::new(self.lsm.range::<&[u8], _>(
                    (
                        std::ops::Bound::Excluded(after),
                        std::ops::Bound::Excluded(upper.as_slice()),
                    ),
                    seqno,
                    None,
                ))
            }
            None => Box::new(self.lsm.prefix(prefix, seqno, None)),
        }
    }

    /// Up to `limit` entries whose key starts with `prefix` and sorts after `after` (or from
    /// the first), at `seqno`.
    pub fn page(
        &self,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
        seqno: SeqNo,
    ) -> Result<Vec<(lsm_tree::UserKey, lsm_tree::UserValue)>> {
        let mut out = Vec::new();
        for item in self.range_of(prefix, after, seqno) {
            if out.len() >= limit {
                break;
            }
            let (k, v) = item.into_inner().map_err(tree_err)?;
            if !k.starts_with(prefix) {
                break;
            }
            out.push((k, v));
        }
        Ok(out)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// The tree's versions (one per memtable rotation, flush and compaction) outnumber the
    /// records on a store of few, large commits. A record's writes stay readable at its read
    /// point however many versions came before; making versions never shows readers a record
    /// not yet published (not yet synced).
    #[test]
    fn versions_neither_hide_records_nor_show_unpublished_ones() {
        let dir = tempfile::tempdir().unwrap();
        let tree = Tree::open(dir.path()).unwrap();
        let key = |i: u64| doc_key("c", &format!("k{i}"));
        tree.insert(key(1), value(0, b"{}"), 1);
        tree.publish(1);
        for _ in 0..5 {
            tree.insert(checkpoint_key("f"), b"{}".to_vec(), 1);
            assert!(tree.rotate());
            tree.flush_and_compact(tree.visible()).unwrap();
        }
        tree.insert(key(2), value(0, b"{}"), 2);
        tree.publish(2);
        assert!(
            tree.get(&key(2)).unwrap().is_some(),
            "a published record reads"
        );
        assert!(tree.get_at(&key(2), Tree::before(3)).unwrap().is_some());
        // Written, not published: versions made meanwhile do not show it.
        tree.insert(key(3), value(0, b"{}"), 3);
        for _ in 0..3 {
            tree.insert(checkpoint_key("g"), b"{}".to_vec(), 3);
            assert!(tree.rotate());
            tree.flush_and_compact(tree.visible()).unwrap();
        }
        assert!(tree.get(&key(3)).unwrap().is_none(), "not yet shown");
        assert!(tree.get_at(&key(3), Tree::before(4)).unwrap().is_some());
        assert_eq!(tree.persisted_lsn(), 3);
        tree.publish(3);
        assert!(tree.get(&key(3)).unwrap().is_some());
        assert!(tree.get(&key(1)).unwrap().is_some());
    }

    /// Sealed memtables past the bound make the writer wait, until a flush: it returns as
    /// soon as one is done, and waits no longer than its limit when none comes.
    #[test]
    fn a_writer_waits_for_flushes_when_sealed_memtables_pile_up() {
        let dir = tempfile::tempdir().unwrap();
        let tree = std::sync::Arc::new(Tree::open(dir.path()).unwrap());
        for lsn in 1..=(MAX_SEALED as u64 + 1) {
            tree.insert(checkpoint_key("f"), b"{}".to_vec(), lsn);
            assert!(tree.rotate());
        }
        assert!(tree.behind());
        let limit = std::time::Duration::from_millis(100);
        assert!(tree.stall(limit) >= limit, "no flush comes: the limit");
        let flusher = std::thread::spawn({
            let tree = tree.clone();
            move || {
                std::thread::sleep(std::time::Duration::from_millis(30));
                tree.flush_and_compact(tree.visible()).unwrap();
            }
        });
        let waited = tree.stall(std::time::Duration::from_secs(10));
        flusher.join().unwrap();
        assert!(
            waited < std::time::Duration::from_secs(5),
            "woken by the flush after {waited:?}"
        );
        assert!(!tree.behind());
    }
}
