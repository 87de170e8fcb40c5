//! Which keyed documents the tree may hold: a Bloom filter over every stored (collection, key),
//! so an update of a key the tree does not hold (on a long tail, most of them are new) is
//! answered without reading the tree. A read of an absent key searches the memtable's skip
//! list, takes the tree's version and asks every table's filter; the writer does it for every
//! new key, and every commit waits for the writer.
//!
//! The filter must hold every stored key: one it wrongly called absent would be written as new
//! (a counter starting again at 1). So it is only used once built, and built from the tree
//! itself, off the writer, in a thread of its own: the writer asks for a build, adds every key
//! it writes from then on to the filter being built (which the build shares with it), and
//! adopts the filter once built. Keys deleted since stay in the filter (a Bloom filter cannot
//! forget) and only cost a read; the filter is built again, sized for the keys the tree holds
//! then, once the keys added since the last build outgrow what it was sized for, so its
//! memory follows the keys the tree holds, not every key ever written.

use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError, sync_channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fastbloom::AtomicBloomFilter;

use super::tree::{self, Tree};
use super::writer::KvRef;
use crate::{Result, StoreError};

/// The share of "may hold" answers for absent keys the filter is sized for.
const FALSE_POSITIVES: f64 = 0.01;
/// The keys a filter built from `keys` keys is sized for: half as many again, so the keys may
/// grow by half before the next build. While a build runs the filter in use is kept too (the
/// writer asks it), so the margin sets the memory a build holds (a filter of the old size and
/// one of the new), against how often one runs; with twice as many, a build at 8 million keys
/// held 30 MB of filters.
fn capacity_for(keys: usize) -> usize {
    keys.saturating_add(keys / 2)
}
/// How long after a failed build (a read error) the next one may start.
const RETRY_AFTER: Duration = Duration::from_secs(10);

type Hasher = hashbrown::DefaultHashBuilder;
/// Atomic bits, so that the writer and a build can both add keys to a filter being built.
type Filter = AtomicBloomFilter<Hasher>;

fn filter(capacity: usize, hasher: Hasher) -> Filter {
    AtomicBloomFilter::with_false_pos(FALSE_POSITIVES)
        .hasher(hasher)
        .expected_items(capacity)
}

/// What a build reports (its filter is in [`Building::filter`]): how many keys it added to
/// the filter (those new to it) and how many the filter was sized for.
struct Built {
    keys: usize,
    capacity: usize,
}

pub(crate) struct KnownKeys {
    /// `None` until the first build is adopted: every read then goes to the tree.
    filter: Option<Filter>,
    /// Keys added to the filter, by its build and by the writer (counted when new to it: a
    /// false positive goes uncounted).
    held: usize,
    /// How many keys it was sized for.
    capacity: usize,
    /// The smallest capacity a build sizes for.
    min_capacity: usize,
    /// A build under way.
    building: Option<Building>,
    /// Every filter's hasher (seeded once): a key written during a build is hashed once for
    /// the filter in use and the one being built.
    hasher: Hasher,
    /// No build starts before this (after a failed one).
    not_before: Option<Instant>,
}

struct Building {
    answer: Receiver<Result<Built>>,
    /// The filter being built, once the build has sized it: the writer adds each key it
    /// writes to it directly. Kept aside as hashes until the adoption, those keys took 8 MB at
    /// the peak of a load of 10^7 keys (a million written during the last build, in a vector
    /// grown by doubling), next to the two filters.
    filter: Arc<OnceLock<Filter>>,
    /// The hashes of the keys written before the build sized its filter: only a first build,
    /// which counts the tree's keys before it knows the size, keeps any.
    since: Vec<u64>,
    /// Keys the writer added to the filter being built that were new to it.
    added: usize,
    /// Set when the writer goes (the store closes): the build stops.
    cancel: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl Drop for KnownKeys {
    /// A build reads the tree: it is over before the writer (and the store) is gone, so a store
    /// opened again on the same directory never shares it with a reader of the closed one.
    fn drop(&mut self) {
        if let Some(b) = self.building.take() {
            b.cancel.store(true, Ordering::Relaxed);
            let _ = b.thread.join();
        }
    }
}

impl KnownKeys {
    /// A filter sized for at least `min_capacity` keys; 0 never builds one (every read goes
    /// to the tree: the conversion of an earlier layout, which writes without reading).
    pub(crate) fn new(min_capacity: usize) -> Self {
        KnownKeys {
            filter: None,
            held: 0,
            capacity: 0,
            min_capacity,
            building: None,
            hasher: Hasher::default(),
            not_before: None,
        }
    }

    /// `false` only for a key the tree does not hold.
    pub(crate) fn may_hold(&self, coll: &str, key: &str) -> bool {
        self.filter
            .as_ref()
            .is_none_or(|f| f.contains(&KvRef(coll, key)))
    }

    /// A key the writer is writing into the tree.
    pub(crate) fn written(&mut self, coll: &str, key: &str) {
        if self.filter.is_none() && self.building.is_none() {
            return;
        }
        let h = self.hasher.hash_one(KvRef(coll, key));
        if let Some(f) = &mut self.filter
            && !f.insert_hash(h)
        {
            self.held += 1;
        }
        if let Some(b) = &mut self.building {
            match b.filter.get() {
                Some(f) => {
                    if !f.insert_hash(h) {
                        b.added += 1;
                    }
                }
                None => b.since.push(h),
            }
        }
    }

    /// Called by the writer between commits (every commit so far is in the tree): adopts a
    /// finished build, and starts one when there is none yet or the keys have outgrown the
    /// filter.
    pub(crate) fn tend(&mut self, tree: &Arc<Tree>) {
        if self.min_capacity == 0 {
            return;
        }
        if let Some(b) = &self.building {
            match b.answer.try_recv() {
                Err(TryRecvError::Empty) => return,
                Ok(Ok(built)) => {
                    let Some(b) = self.building.take() else {
                        return;
                    };
                    let _ = b.thread.join();
                    // The build's thread is over, so the writer holds the only reference.
                    let Some(f) = Arc::into_inner(b.filter).and_then(OnceLock::into_inner) else {
                        self.not_before = Some(Instant::now() + RETRY_AFTER);
                        return;
                    };
                    let mut held = built.keys + b.added;
                    for &h in &b.since {
                        if !f.insert_hash(h) {
                            held += 1;
                        }
                    }
                    self.capacity = built.capacity;
                    self.held = held;
                    self.filter = Some(f);
                }
                // The build failed (a read error, a thread that could not start): the filter in
                // use, if any, is still complete; try again later.
                Ok(Err(_)) | Err(TryRecvError::Disconnected) => {
                    if let Some(b) = self.building.take() {
                        let _ = b.thread.join();
                    }
                    self.not_before = Some(Instant::now() + RETRY_AFTER);
                    return;
                }
            }
        }
        if self.not_before.is_some_and(|t| Instant::now() < t) {
            return;
        }
        if self.filter.is_none() || self.held > self.capacity {
            self.start(tree);
        }
    }

    /// Starts a build of every key written before now. It reads the tree as it is when each
    /// page is read, not as of one sequence number: a key written meanwhile is recorded for it
    /// anyway, and one deleted meanwhile need not be held. (Read at one sequence number for
    /// seconds, the tree had to keep every version, and memtable, since: on a fast load of
    /// millions of keys, 100 MiB more; not kept, a read found no version and panicked.)
    fn start(&mut self, tree: &Arc<Tree>) {
        let seqno = Tree::LATEST;
        let tree = tree.clone();
        let min = self.min_capacity;
        // The keys the filter in use holds (deleted ones too) say how many the tree holds:
        // one read of the tree then. The first build counts them in a read of its own.
        let keys = self.filter.is_some().then_some(self.held);
        let hasher = self.hasher.clone();
        let cancel = Arc::new(AtomicBool::new(false));
        let filter = Arc::new(OnceLock::new());
        let (tx, answer) = sync_channel(1);
        let spawned = std::thread::Builder::new()
            .name("tailrace-keys".into())
            .spawn({
                let cancel = cancel.clone();
                let filter = filter.clone();
                move || {
                    let built = build(&tree, seqno, keys, min, hasher, &filter, &cancel);
                    // The writer takes the filter once the thread is over: its reference goes
                    // first.
                    drop(filter);
                    let _ = tx.send(built);
                }
            });
        // A thread that cannot start leaves the reads to the tree, as before.
        if let Ok(thread) = spawned {
            self.building = Some(Building {
                answer,
                filter,
                since: Vec::new(),
                added: 0,
                cancel,
                thread,
            });
        }
    }
}

/// Every keyed document's (collection, key) the tree holds at `seqno`, in a filter sized for
/// [`capacity_for`] their number (at least `min`): `expected` of them, or counted first. The
/// filter goes into `slot` as soon as it is sized, for the writer to add its keys to.
fn build(
    tree: &Tree,
    seqno: u64,
    expected: Option<usize>,
    min: usize,
    hasher: Hasher,
    slot: &OnceLock<Filter>,
    cancel: &AtomicBool,
) -> Result<Built> {
    let expected = match expected {
        Some(n) => n,
        None => {
            let mut n = 0usize;
            each_key(tree, seqno, cancel, |_, _| n += 1)?;
            n
        }
    };
    let capacity = capacity_for(expected).max(min);
    let f = slot.get_or_init(|| filter(capacity, hasher));
    let mut keys = 0usize;
    each_key(tree, seqno, cancel, |coll, key| {
        if !f.insert(&KvRef(coll, key)) {
            keys += 1;
        }
    })?;
    Ok(Built { keys, capacity })
}

fn each_key(
    tree: &Tree,
    seqno: u64,
    cancel: &AtomicBool,
    mut f: impl FnMut(&str, &str),
) -> Result<()> {
    let prefix = tree::DOC_PREFIX;
    let mut after: Option<Vec<u8>> = None;
    loop {
        if cancel.load(Ordering::Relaxed) {
            return Err(StoreError::Closed);
        }
        let page = tree.page_keys(prefix, after.as_deref(), 4096, seqno)?;
        for k in &page {
            if let Some((coll, key)) = tree::split_doc_key(k) {
                f(coll, key);
            }
        }
        match page.last() {
            Some(last) if page.len() == 4096 => after = Some(last.to_vec()),
            _ => return Ok(()),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_key_written_while_the_filter_is_built_is_held() {
        let dir = tempfile::tempdir().unwrap();
        let tree = Arc::new(Tree::open(dir.path()).unwrap());
        let put = |coll: &str, key: &str, seqno: u64| {
            tree.insert(tree::doc_key(coll, key), tree::value(0, b"{}"), seqno);
            tree.publish(seqno);
        };
        for i in 0..100u64 {
            put("rollups", &format!("hashtags:東京{i}"), i + 1);
        }
        let mut k = KnownKeys::new(8);
        assert!(
            k.may_hold("rollups", "anything"),
            "no filter yet: ask the tree"
        );
        k.tend(&tree);
        // Written after the build started (it may read it, or not): recorded for the build.
        put("rollups", "source:late", 200);
        k.written("rollups", "source:late");
        while k.filter.is_none() {
            std::thread::sleep(std::time::Duration::from_millis(1));
            k.tend(&tree);
        }
        for i in 0..100u64 {
            assert!(k.may_hold("rollups", &format!("hashtags:東京{i}")));
        }
        assert!(k.may_hold("rollups", "source:late"));
        // 100 keys, or 101 with the late one, each counted by whichever of the build and the
        // writer added it first; a false positive (at most 1 % of keys at capacity) goes
        // uncounted.
        assert!((98..=101).contains(&k.held), "{} held", k.held);
        assert!([150, 151].contains(&k.capacity), "sized for {}", k.capacity);
        let absent = (0..1000)
            .filter(|i| !k.may_hold("rollups", &format!("hashtags:other{i}")))
            .count();
        assert!(
            absent > 900,
            "only {absent} of 1000 absent keys called absent"
        );
        assert!(!k.may_hold("rollup", "shashtags:東京1"));
    }

    /// A build reads the tree for as long as it takes; flushes meanwhile make new versions of
    /// the tree and drop the old ones. The build reads the newest, so it always finds one (at
    /// one old sequence number it found none and panicked, and the filter was never built, on
    /// a store loading millions of keys).
    #[test]
    fn a_build_survives_flushes_that_drop_old_versions() {
        let dir = tempfile::tempdir().unwrap();
        let tree = Arc::new(Tree::open(dir.path()).unwrap());
        let mut lsn = 0;
        for i in 0..60_000u64 {
            lsn = i / 100 + 1;
            tree.insert(
                tree::doc_key("c", &format!("k{i}")),
                tree::value(0, b"{}"),
                lsn,
            );
        }
        tree.publish(lsn);
        let mut k = KnownKeys::new(8);
        k.tend(&tree);
        // Flushes, each a new version, as maintenance makes them while the build reads.
        for _ in 0..20 {
            lsn += 1;
            tree.insert(tree::checkpoint_key("f"), b"{}".to_vec(), lsn);
            tree.publish(lsn);
            assert!(tree.rotate());
            tree.flush_and_compact(tree.visible()).unwrap();
        }
        while k.building.is_some() {
            std::thread::sleep(std::time::Duration::from_millis(1));
            k.tend(&tree);
        }
        assert!(k.filter.is_some(), "the build finished");
        assert!((0..60_000).all(|i| k.may_hold("c", &format!("k{i}"))));
    }

    #[test]
    fn the_filter_is_built_again_when_its_keys_outgrow_it() {
        let dir = tempfile::tempdir().unwrap();
        let tree = Arc::new(Tree::open(dir.path()).unwrap());
        let mut k = KnownKeys::new(4);
        k.tend(&tree);
        while k.filter.is_none() {
            std::thread::sleep(std::time::Duration::from_millis(1));
            k.tend(&tree);
        }
        assert_eq!(k.capacity, 4);
        for i in 0..50u64 {
            let key = format!("k{i}");
            tree.insert(tree::doc_key("c", &key), tree::value(0, b"{}"), i + 1);
            tree.publish(i + 1);
            k.written("c", &key);
            k.tend(&tree);
        }
        while k.building.is_some() {
            std::thread::sleep(std::time::Duration::from_millis(1));
            k.tend(&tree);
        }
        assert!(k.capacity >= 50, "sized for {}", k.capacity);
        assert!(k.held <= 50 && k.held <= k.capacity, "{} held", k.held);
        assert!((0..50).all(|i| k.may_hold("c", &format!("k{i}"))));
    }
}
