//! Sliding-window top-k of string keys whose per-event cost and state do not
//! grow with the number of distinct keys.
//!
//! [`HeavyHitters`] has the observable API of [`TopK`](super::topk::TopK)
//! (`record`, `expire`, `top`, serde state for checkpoints) and its edge cases
//! (lowercase keys, empty keys skipped, late timestamps counted into the
//! newest second, `window_secs = 0` keeps nothing, ties ordered by key), but
//! keeps at most `capacity` counters per second instead of every key.
//!
//! # Algorithm: one Space-Saving summary per second, merged at query time
//!
//! Each whole second of the window has a *Space-Saving* summary (Metwally,
//! Agrawal, El Abbadi, "Efficient Computation of Frequent and Top-k Elements
//! in Data Streams", ICDT 2005) of at most `m = capacity` counters `(key,
//! count, error)`. A recorded key increments its counter; a new key takes a
//! free counter, or, when all `m` are in use, replaces the key of the counter
//! with the smallest count `c_min`, inheriting `c_min + 1` with error `c_min`.
//! The second's *floor* is the `c_min` of its latest replacement (0 if none):
//! no key without a counter occurred more than `floor` times in that second.
//! Seconds are what expire, so a whole summary leaves the window at once, as
//! in `TopK`. `top` merges the summaries of the window the way Space-Saving
//! summaries merge (Agarwal, Cormode, Huang, Phillips, Wei, Yi, "Mergeable
//! Summaries", PODS 2012): a key's count is the sum of its counters, plus the
//! floor of every second in which it has none.
//!
//! Why this and not something else:
//! - Space-Saving over Misra–Gries: the two are isomorphic (Agarwal et al.),
//!   but Space-Saving's counters are *over*estimates with a per-key error, so
//!   ranking by them reports every frequent key, and the sorted counters are
//!   directly the top-k;
//! - per-second summaries over a window-native algorithm (e.g. WCSS, Ben-Basat,
//!   Einziger, Friedman, Kassner, "Heavy Hitters in Streams and Sliding
//!   Windows", INFOCOM 2016): the window then expires exactly as `TopK`'s does
//!   (the same second granularity and late-timestamp rule), so under capacity
//!   the answer is `TopK`'s answer, not an approximation of the window;
//! - over Count-Min with a heap: its bound is probabilistic and collisions make
//!   it inexact even with few keys; Space-Saving is deterministic and exact
//!   until a second has more than `m` distinct keys.
//!
//! # Error bound
//!
//! Let the window hold seconds `b` with `N_b` recorded keys, `N = Σ N_b`, and
//! let `B = Σ_b floor_b` ([`HeavyHitters::error_bound`]). For every key `x`
//! with true window count `f(x)` and reported count `f̂(x)`:
//!
//! ```text
//! f(x) ≤ f̂(x) ≤ f(x) + error(x) ≤ f(x) + B,   B ≤ Σ_b ⌊N_b / m⌋ ≤ N / m
//! ```
//!
//! - every reported count overestimates by at most `B ≤ N/m` (and by at most
//!   the reported [`Estimate::error`] for that key);
//! - every key with `f(x) > B` has a counter in some second, so it is a
//!   candidate ([`HeavyHitters::estimates`] with `n = usize::MAX` lists it);
//! - in the order of `top`, a key `y` is ranked after (or left out in favour
//!   of) a key `x` only if `f(y) ≤ f(x) + B`;
//! - `B = 0`, and the answer is **exact**, while no second has had more than
//!   `m` distinct keys.
//!
//! Why `floor_b ≤ N_b/m`: a replacement happens only when all `m` counters are
//! in use; every recorded key adds exactly 1 to one counter, so the counters
//! sum to `N_b`, and the replaced one is the smallest. On skewed (Zipf)
//! streams the error is far smaller: Space-Saving's floor is at most
//! `N_b^res(j) / (m − j)`, where `N_b^res(j)` counts all but the `j` most
//! frequent keys (Berinde, Indyk, Cormode, Strauss, "Space-optimal Heavy
//! Hitters with Strong Error Bounds", TODS 2010).
//!
//! # Cost and state
//!
//! - `record`: one hash lookup and a binary search over the second's counters
//!   per key, O(log m), plus, once per second, moving the closed second out of
//!   the hash index (O(counters), paid for by the keys that created them);
//! - `top`: O(W · m) for W seconds in the window, independent of the number of
//!   distinct keys; meant to be called once per second, not per event;
//! - state: at most `W` seconds (those after `newest − W`) of at most `m`
//!   counters, each a key of at most [`MAX_KEY_BYTES`] bytes and two `u64`:
//!   [`HeavyHitters::state_bound_bytes`] is the JSON size this can reach.
//!   Keys longer than [`MAX_KEY_BYTES`] are cut at a character boundary; this
//!   is the one place where `TopK` (which keeps whole keys) differs, and it is
//!   what makes the checkpoint size a constant.
//!
//! `cargo bench -p feeds --bench topk` compares it with the exact `TopK` from
//! 10^2 to 10^7 distinct keys (figures: docs/BENCHMARKS.md, "Micro-benchmarks").
//! As `top` costs O(W · m), it is called once per publish tick
//! (`TopKeys::snapshot` and `::publish`), never per event.
//!
//! # Determinism
//!
//! The hash index is only ever looked up, never iterated; the counters of a
//! second live in an array sorted by count whose order decides which counter
//! is replaced, and that array is what is serialized, in order. A serde round
//! trip therefore continues exactly as if never stopped. `top` breaks ties by
//! key, so its output does not depend on hash order either.

mod state;

use std::cmp::Reverse;
use std::collections::VecDeque;
use std::fmt;
use std::hash::{BuildHasher, RandomState};

use hashbrown::HashTable;

use serde::{Deserialize, Serialize, Serializer};

use state::{Bucket, State, serialize_form};

/// Microseconds per second, the bucket width.
const US_PER_SEC: i64 = 1_000_000;

/// Counters per second when the caller has no reason to choose: exact up to
/// 1024 distinct keys per second (the ~70 events/s sample has a few hundred),
/// and at 50,000 keys/s over 60 s an overestimate of at most N/1024 ≈ 2,900.
pub const DEFAULT_CAPACITY: usize = 1024;

/// Longest key kept, in bytes of UTF-8; longer keys are cut at the last
/// character boundary at or before it. Hashtags are far shorter (a whole
/// tweet is 280 characters); the cap is what bounds the checkpoint in bytes.
pub const MAX_KEY_BYTES: usize = 256;

/// JSON bytes of one counter beyond its key: `["",` + two `u64` + `,],`.
const COUNTER_JSON_OVERHEAD: u64 = 48;

/// JSON bytes of one second beyond its counters: field names, a signed
/// second and a floor, brackets.
const BUCKET_JSON_OVERHEAD: u64 = 96;

/// JSON bytes of the struct beyond its seconds: field names, `k`, the window
/// and the capacity.
const STATE_JSON_OVERHEAD: u64 = 160;

/// serde_json writes an ASCII control character as `\u00XX`: six bytes for
/// one, the most any input byte can grow.
const JSON_ESCAPE_FACTOR: u64 = 6;

/// One key of the answer with how far its count can be off.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Estimate {
    /// The case-folded key.
    pub key: String,
    /// Occurrences in the window, never fewer than the true count.
    pub count: u64,
    /// How much `count` can exceed the true count: the true count is in
    /// `count - error ..= count`. 0 means exact.
    pub error: u64,
}

/// Why a serialized [`HeavyHitters`] state was refused: each variant is a
/// broken invariant that would make the error bound or the replacement order
/// wrong, so such a checkpoint is better discarded than continued.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum StateError {
    /// Capacity must be between 1 and `u32::MAX` counters per second.
    #[error("capacity {0} is out of range 1..=u32::MAX")]
    Capacity(usize),
    /// A second holds more counters than the capacity allows.
    #[error("second {sec} has {counters} counters, more than the capacity {capacity}")]
    TooManyCounters {
        /// The second of the offending bucket.
        sec: i64,
        /// Counters it holds.
        counters: usize,
        /// Counters allowed.
        capacity: usize,
    },
    /// Seconds must be strictly increasing, the newest last.
    #[error("second {sec} does not come after second {previous}")]
    Order {
        /// The second out of order.
        sec: i64,
        /// The second before it.
        previous: i64,
    },
    /// A key appears twice in one second, or is empty or too long.
    #[error("second {sec} has an invalid or duplicate key {key:?}")]
    Key {
        /// The second of the offending bucket.
        sec: i64,
        /// The key.
        key: String,
    },
    /// A counter is zero, below the floor, or has an error above its count,
    /// or the newest second's counters are not sorted by count descending, or
    /// a second has a floor without being full.
    #[error("second {sec} has inconsistent counters or floor")]
    Counters {
        /// The second of the offending bucket.
        sec: i64,
    },
}

/// Where a counter sits in the sorted array: its count and the slot of its
/// key. Kept apart from the key so the binary search reads one small array.
#[derive(Clone, Copy, Debug)]
struct Slot {
    count: u64,
    id: u32,
}

/// The key of a counter, its hash, its error and its position in the sorted
/// array.
#[derive(Clone, Debug)]
struct Meta {
    /// A `String`, not a `Box<str>`: a full summary replaces a key at nearly
    /// every new one on a long tail, and the replacement reuses this buffer.
    key: String,
    /// `HeavyHitters::hasher` applied to `key`, kept so that growing the
    /// index, removing a replaced key and merging in `top` never hash a
    /// string again.
    hash: u64,
    error: u64,
    pos: u32,
}

/// The Space-Saving summary of the newest second, the only one that changes.
///
/// `slots` is sorted by count descending, so the counter to replace is the
/// last one, and an increment keeps the order by first swapping the counter
/// with the first one of equal count (found by binary search): the
/// Stream-Summary of Metwally et al. as a flat array.
#[derive(Clone)]
struct Live {
    sec: i64,
    /// Same meaning as [`Bucket::floor`].
    floor: u64,
    /// Counters by count descending; this order is serialized.
    slots: Vec<Slot>,
    /// Keys by slot id (`Slot::id`), which never moves.
    meta: Vec<Meta>,
    /// Slot ids, found by the hash of their key. A table of ids rather than
    /// a map from key so each key is stored (and hashed) once. Looked up
    /// only, never iterated, so its order cannot leak into results or
    /// checkpoints.
    index: HashTable<u32>,
}

impl Live {
    fn new(sec: i64) -> Self {
        Self {
            sec,
            floor: 0,
            slots: Vec::new(),
            meta: Vec::new(),
            index: HashTable::new(),
        }
    }

    /// Counts one occurrence of an already folded key whose hash is `hash`.
    fn add(&mut self, key: &str, hash: u64, capacity: usize) {
        let Self {
            meta, index, slots, ..
        } = self;
        let is_key = |id: &u32| meta.get(*id as usize).is_some_and(|m| &*m.key == key);
        if let Some(&id) = index.find(hash, is_key) {
            self.bump(id);
            return;
        }
        let rehash = |id: &u32| meta.get(*id as usize).map_or(0, |m| m.hash);
        if slots.len() < capacity {
            let (Ok(id), Ok(pos)) = (u32::try_from(meta.len()), u32::try_from(slots.len())) else {
                return; // unreachable: capacity is at most u32::MAX
            };
            index.insert_unique(hash, id, rehash);
            meta.push(Meta {
                key: key.into(),
                hash,
                error: 0,
                pos,
            });
            // Count 0 is below every other counter, so the new slot at the
            // end keeps the order, and bump moves it into place.
            slots.push(Slot { count: 0, id });
            self.bump(id);
            return;
        }
        // Full: the last slot has the smallest count; its key gives way.
        let Some(&Slot { count: min, id }) = slots.last() else {
            return; // unreachable: capacity is at least 1
        };
        let old_hash = meta.get(id as usize).map_or(0, |m| m.hash);
        if let Ok(entry) = index.find_entry(old_hash, |&i| i == id) {
            entry.remove();
        }
        index.insert_unique(hash, id, rehash);
        if let Some(m) = meta.get_mut(id as usize) {
            m.key.clear();
            m.key.push_str(key);
            m.hash = hash;
            m.error = min;
        }
        self.floor = min;
        self.bump(id);
    }

    /// Adds one to the counter of slot id `id`, keeping `slots` sorted by
    /// count descending.
    fn bump(&mut self, id: u32) {
        let Some(p) = self.meta.get(id as usize).map(|m| m.pos as usize) else {
            return;
        };
        let Some(count) = self.slots.get(p).map(|s| s.count) else {
            return;
        };
        // First slot with this count: the counters before it are larger.
        let q = self.slots[..p].partition_point(|s| s.count > count);
        if q != p {
            self.slots.swap(p, q);
            let moved = self.slots[p].id as usize;
            if let Some(m) = self.meta.get_mut(moved) {
                m.pos = p as u32;
            }
            if let Some(m) = self.meta.get_mut(id as usize) {
                m.pos = q as u32;
            }
        }
        self.slots[q].count = count.saturating_add(1);
    }

    /// `(key, count, error)` of every counter, in slot order.
    fn counters(&self) -> impl Iterator<Item = (&str, u64, u64)> + '_ {
        self.hashed()
            .map(|(key, _, count, error)| (key, count, error))
    }

    /// `(key, hash, count, error)` of every counter, in slot order.
    fn hashed(&self) -> impl Iterator<Item = (&str, u64, u64, u64)> + '_ {
        self.slots.iter().filter_map(|s| {
            self.meta
                .get(s.id as usize)
                .map(|m| (&*m.key, m.hash, s.count, m.error))
        })
    }

    /// Freezes this second into a bucket and starts second `sec` empty,
    /// keeping the allocations of the arrays and the index.
    fn close_into(&mut self, sec: i64) -> Bucket {
        let mut meta = std::mem::take(&mut self.meta);
        let mut counters = Vec::with_capacity(self.slots.len());
        let mut hashes = Vec::with_capacity(self.slots.len());
        for s in &self.slots {
            if let Some(m) = meta.get_mut(s.id as usize) {
                let mut key = std::mem::take(&mut m.key);
                // Grown by longer keys it replaced: the closed second keeps only what it holds.
                key.shrink_to_fit();
                counters.push((key, s.count, m.error));
                hashes.push(m.hash);
            }
        }
        let bucket = Bucket {
            sec: self.sec,
            floor: self.floor,
            counters,
            hashes,
        };
        meta.clear();
        self.meta = meta;
        self.slots.clear();
        self.index.clear();
        self.sec = sec;
        self.floor = 0;
        bucket
    }

    /// Rebuilds a live summary from its serialized form, which must already
    /// be validated (sorted, unique keys, within capacity) and hashed.
    fn from_bucket(b: Bucket) -> Self {
        let mut live = Live::new(b.sec);
        live.floor = b.floor;
        live.slots.reserve(b.counters.len());
        live.meta.reserve(b.counters.len());
        for (i, ((key, count, error), hash)) in b.counters.into_iter().zip(b.hashes).enumerate() {
            let Ok(id) = u32::try_from(i) else {
                break; // unreachable: validated against the capacity
            };
            let meta = &live.meta;
            live.index.insert_unique(hash, id, |i: &u32| {
                meta.get(*i as usize).map_or(0, |m| m.hash)
            });
            live.meta.push(Meta {
                key,
                hash,
                error,
                pos: id,
            });
            live.slots.push(Slot { count, id });
        }
        live
    }
}

impl PartialEq for Live {
    /// Equal when the counters are equal in slot order: slot ids and the
    /// index are bookkeeping that a restore renumbers without changing any
    /// future result.
    fn eq(&self, other: &Self) -> bool {
        self.sec == other.sec
            && self.floor == other.floor
            && self.slots.len() == other.slots.len()
            && self.counters().eq(other.counters())
    }
}

impl fmt::Debug for Live {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Live")
            .field("sec", &self.sec)
            .field("floor", &self.floor)
            .field("counters", &self.counters().collect::<Vec<_>>())
            .finish()
    }
}

/// Serializes the live second exactly like a [`Bucket`], counters in slot
/// order, so a checkpoint has one shape for every second and restores the
/// replacement order.
impl Serialize for Live {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        serialize_form(s, self.sec, self.floor, || self.counters())
    }
}

/// Most frequent keys over the last `window_secs` seconds, in state bounded
/// by `window_secs × capacity` counters whatever the number of distinct keys.
///
/// See the [module documentation](self) for the algorithm and its error
/// bound. Keys are case-folded to lowercase on the way in, as in `TopK`.
#[derive(Serialize, Deserialize, Clone, Debug)]
#[serde(try_from = "State")]
pub struct HeavyHitters {
    k: usize,
    window_secs: u64,
    /// Counters per second (`m`).
    capacity: usize,
    /// Closed seconds, oldest first, seconds strictly increasing and all
    /// before `live`.
    closed: VecDeque<Bucket>,
    /// The newest second, which receives every record (late timestamps
    /// included). `None` only when nothing is in the window, in which case
    /// `closed` is empty too.
    live: Option<Live>,
    /// Hashes every key once, on the way in; the hash then follows the key
    /// from the live second into its closed bucket and into `top`. SipHash
    /// with random keys: hashtags are untrusted input, and a fixed hash would
    /// let a sender collide them into long probe sequences. Per process, so
    /// not serialized.
    #[serde(skip)]
    hasher: RandomState,
    /// Where a key that changes when folded is folded, reused from key to key.
    #[serde(skip)]
    fold_buf: String,
}

impl PartialEq for HeavyHitters {
    /// Equal state, whatever the hasher's seed.
    fn eq(&self, other: &Self) -> bool {
        self.k == other.k
            && self.window_secs == other.window_secs
            && self.capacity == other.capacity
            && self.closed == other.closed
            && self.live == other.live
    }
}

impl HeavyHitters {
    /// Creates an empty tracker reporting at most `k` keys over the last
    /// `window_secs` seconds with `capacity` counters per second (clamped to
    /// `1..=u32::MAX`; [`DEFAULT_CAPACITY`] if in doubt). Counts are exact
    /// while no second has more than `capacity` distinct keys. With
    /// `window_secs` 0 every key expires as soon as it is recorded.
    pub fn new(k: usize, window_secs: u64, capacity: usize) -> Self {
        Self {
            k,
            window_secs,
            capacity: capacity.clamp(1, u32::MAX as usize),
            closed: VecDeque::new(),
            live: None,
            hasher: RandomState::new(),
            fold_buf: String::new(),
        }
    }

    /// Counts every key once per occurrence at time `t_us` (microseconds
    /// since the Unix epoch), in O(log capacity) per key.
    ///
    /// As in `TopK`: a timestamp earlier than the newest second is counted
    /// into the newest second; empty keys are skipped; a call with no
    /// non-empty key changes nothing; seconds out of the window relative to
    /// the newest are dropped here too.
    pub fn record<'a>(&mut self, t_us: i64, keys: impl IntoIterator<Item = &'a str>) {
        let sec = t_us.div_euclid(US_PER_SEC);
        let mut keys = keys.into_iter().filter(|k| !k.is_empty()).peekable();
        if keys.peek().is_none() {
            return;
        }
        let live = match &mut self.live {
            Some(live) if sec <= live.sec => live,
            Some(live) => {
                self.closed.push_back(live.close_into(sec));
                live
            }
            None => self.live.insert(Live::new(sec)),
        };
        for key in keys {
            let key = fold_key(key, &mut self.fold_buf);
            live.add(key, self.hasher.hash_one(key), self.capacity);
        }
        let newest = live.sec;
        self.expire_before(newest);
    }

    /// Drops every second that is out of the window at `now_us`: the second
    /// `s` expires when `s <= now_sec - window_secs`.
    pub fn expire(&mut self, now_us: i64) {
        self.expire_before(now_us.div_euclid(US_PER_SEC));
    }

    /// At most `k` keys with their counts in the window, by count descending
    /// then key ascending. Exact under capacity; otherwise every count is at
    /// most [`HeavyHitters::error_bound`] above the true one. Costs what
    /// [`HeavyHitters::estimates`] costs: once per second, not per event.
    pub fn top(&self) -> Vec<(String, u64)> {
        self.estimates(self.k)
            .into_iter()
            .map(|e| (e.key, e.count))
            .collect()
    }

    /// The `n` best candidates, in the order of [`HeavyHitters::top`], each
    /// with how far its count can be off. With `n = usize::MAX` this lists
    /// every key that has a counter in some second of the window, which
    /// includes every key whose true count exceeds the error bound.
    ///
    /// Costs O(W · m log) for W seconds of m counters: call it once per
    /// second, not per event.
    pub fn estimates(&self, n: usize) -> Vec<Estimate> {
        if n == 0 {
            return Vec::new();
        }
        let bound = self.error_bound();
        // Per key: sum of its counters, sum of their errors, and the sum of
        // the floors of the seconds where it has a counter, so the floors of
        // the other seconds are `bound - covered`.
        struct Sum<'a> {
            key: &'a str,
            hash: u64,
            count: u64,
            error: u64,
            covered: u64,
        }
        let mut sums: Vec<Sum<'_>> = Vec::with_capacity(self.counters());
        // Indices into `sums` by the keys' precomputed hashes: the merge
        // compares a key only when its hash matches.
        let mut table: HashTable<usize> = HashTable::with_capacity(self.counters());
        let closed = self.closed.iter().flat_map(|b| {
            b.counters
                .iter()
                .zip(&b.hashes)
                .map(move |((key, count, error), &hash)| {
                    (key.as_str(), hash, *count, *error, b.floor)
                })
        });
        let live = self
            .live
            .iter()
            .flat_map(|l| l.hashed().map(move |(k, h, c, e)| (k, h, c, e, l.floor)));
        for (key, hash, count, error, floor) in closed.chain(live) {
            let found = table
                .find(hash, |&i| {
                    sums.get(i).is_some_and(|s| s.hash == hash && s.key == key)
                })
                .copied();
            match found.and_then(|i| sums.get_mut(i)) {
                Some(s) => {
                    s.count = s.count.saturating_add(count);
                    s.error = s.error.saturating_add(error);
                    s.covered = s.covered.saturating_add(floor);
                }
                None => {
                    table.insert_unique(hash, sums.len(), |&i| sums.get(i).map_or(0, |s| s.hash));
                    sums.push(Sum {
                        key,
                        hash,
                        count,
                        error,
                        covered: floor,
                    });
                }
            }
        }
        // From here on the order is `sums`' (first appearance), and the sort
        // key is total (keys are unique): nothing depends on hash order.
        let mut all: Vec<(u64, u64, &str)> = sums
            .into_iter()
            .map(|s| {
                let missing = bound.saturating_sub(s.covered);
                (
                    s.count.saturating_add(missing),
                    s.error.saturating_add(missing),
                    s.key,
                )
            })
            .collect();
        let order = |a: &(u64, u64, &str), b: &(u64, u64, &str)| {
            (Reverse(a.0), a.2).cmp(&(Reverse(b.0), b.2))
        };
        if n < all.len() {
            all.select_nth_unstable_by(n - 1, order);
            all.truncate(n);
        }
        all.sort_unstable_by(order);
        all.into_iter()
            .map(|(count, error, key)| Estimate {
                key: key.to_string(),
                count,
                error,
            })
            .collect()
    }

    /// The most any count reported now can exceed the true count: the sum
    /// of the floors of the seconds in the window, at most N/m for N keys
    /// recorded in the window. 0 means every count is exact.
    pub fn error_bound(&self) -> u64 {
        self.closed
            .iter()
            .map(|b| b.floor)
            .chain(self.live.iter().map(|l| l.floor))
            .fold(0, u64::saturating_add)
    }

    /// Keys recorded in the window (N), empty keys excluded.
    pub fn window_keys(&self) -> u64 {
        let closed = self
            .closed
            .iter()
            .flat_map(|b| b.counters.iter().map(|c| c.1));
        let live = self
            .live
            .iter()
            .flat_map(|l| l.slots.iter().map(|s| s.count));
        // Every recorded key adds 1 to exactly one counter and a replaced
        // counter keeps its count, so the counters sum to the keys recorded.
        closed.chain(live).fold(0, u64::saturating_add)
    }

    /// Counters per second (m).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Counters held now, over all seconds: at most `window_secs × capacity`.
    pub fn counters(&self) -> usize {
        self.closed.iter().map(|b| b.counters.len()).sum::<usize>()
            + self.live.as_ref().map_or(0, |l| l.slots.len())
    }

    /// The most bytes `serde_json` can write for this state, whatever the
    /// keys: `window_secs` seconds of `capacity` counters, each key at most
    /// [`MAX_KEY_BYTES`] bytes, each byte escaped to at most six. With the
    /// defaults (60 s, 1024 counters) that is 97 MB, reached only by keys of
    /// 256 control characters; ordinary hashtags of 10 bytes give 1.3 MB, of
    /// 20 bytes about 2 MB. Saturates for huge windows.
    pub fn state_bound_bytes(&self) -> u64 {
        let per_counter = (MAX_KEY_BYTES as u64)
            .saturating_mul(JSON_ESCAPE_FACTOR)
            .saturating_add(COUNTER_JSON_OVERHEAD);
        let per_bucket = (self.capacity as u64)
            .saturating_mul(per_counter)
            .saturating_add(BUCKET_JSON_OVERHEAD);
        self.window_secs
            .max(1)
            .saturating_mul(per_bucket)
            .saturating_add(STATE_JSON_OVERHEAD)
    }

    /// Removes the seconds expired at second `now_sec`.
    fn expire_before(&mut self, now_sec: i64) {
        // i128 so a huge `window_secs` cannot overflow the cutoff.
        let cutoff = i128::from(now_sec) - i128::from(self.window_secs);
        while self
            .closed
            .front()
            .is_some_and(|b| i128::from(b.sec) <= cutoff)
        {
            self.closed.pop_front();
        }
        // Closed seconds are all older than the live one, so when it goes
        // they are gone already.
        if self
            .live
            .as_ref()
            .is_some_and(|l| i128::from(l.sec) <= cutoff)
        {
            self.live = None;
        }
    }
}

/// Case-folds a key as `TopK` does (`str::to_lowercase`) and cuts it to
/// [`MAX_KEY_BYTES`] at a character boundary. A key that folds to itself,
/// lowercase ASCII or a script without case (CJK, Arabic, Devanagari, emoji),
/// is borrowed; any other is folded into `buf`, so a long tail of new keys
/// does not allocate one string each.
fn fold_key<'a>(key: &'a str, buf: &'a mut String) -> &'a str {
    let folded: &str = if key.is_ascii() {
        if key.bytes().any(|b| b.is_ascii_uppercase()) {
            buf.clear();
            buf.push_str(key);
            buf.make_ascii_lowercase();
            buf
        } else {
            key
        }
    } else if key.chars().all(folds_to_itself) {
        key
    } else if key.contains('\u{3a3}') {
        // A capital sigma lowers to ς or σ by what surrounds it: std's rule.
        *buf = key.to_lowercase();
        buf
    } else {
        // Without a capital sigma, str::to_lowercase lowers char by char.
        buf.clear();
        buf.extend(key.chars().flat_map(char::to_lowercase));
        buf
    };
    let mut end = folded.len().min(MAX_KEY_BYTES);
    while !folded.is_char_boundary(end) {
        end -= 1;
    }
    &folded[..end]
}

/// Whether `c` lowers to itself alone.
fn folds_to_itself(c: char) -> bool {
    let mut lower = c.to_lowercase();
    lower.next() == Some(c) && lower.next().is_none()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
