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

use std::cmp::Reverse;
use std::collections::{HashSet, VecDeque};
use std::fmt;
use std::hash::{BuildHasher, RandomState};

use hashbrown::HashTable;

use serde::ser::SerializeStruct;
use serde::{Deserialize, Serialize, Serializer};

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

/// One closed second: its Space-Saving counters, frozen. Saved as [`BucketForm`].
#[derive(Deserialize, Clone)]
#[serde(try_from = "BucketForm")]
struct Bucket {
    /// Whole second since the Unix epoch.
    sec: i64,
    /// Smallest count ever replaced in this second (0 if none): an upper
    /// bound on the count of any key without a counter here.
    floor: u64,
    /// `(key, count, error)`, in the order the live summary had them
    /// (count descending).
    counters: Vec<(String, u64, u64)>,
    /// The hash of each key (same order), so merging the seconds in `top`
    /// never hashes a string. Not serialized: the hasher is seeded per
    /// process, and a restore recomputes them.
    #[serde(skip)]
    hashes: Vec<u64>,
}

/// A second as a checkpoint holds it: the counters as three parallel arrays rather than an
/// array of `[key, count, error]` triples, so the document holds no array inside an array
/// (servers that speak MongoDB's protocol without being MongoDB refuse those) and no key
/// becomes a field name (a hashtag may start with `$` or hold a dot).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BucketForm {
    sec: i64,
    floor: u64,
    keys: Vec<String>,
    counts: Vec<u64>,
    errors: Vec<u64>,
}

/// Writes a second in [`BucketForm`]'s shape straight from its counters, each column a
/// sequence serde collects as it goes: a checkpoint copies no key on its way out (with a
/// `BucketForm` in between, every key of the window was copied at every save).
fn serialize_form<'a, S, I>(
    s: S,
    sec: i64,
    floor: u64,
    counters: impl Fn() -> I,
) -> Result<S::Ok, S::Error>
where
    S: Serializer,
    I: Iterator<Item = (&'a str, u64, u64)>,
{
    /// One column of the counters, collected from a fresh pass over them.
    struct Column<F>(F);
    impl<F, J> Serialize for Column<F>
    where
        F: Fn() -> J,
        J: Iterator,
        J::Item: Serialize,
    {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.collect_seq((self.0)())
        }
    }
    let mut form = s.serialize_struct("BucketForm", 5)?;
    form.serialize_field("sec", &sec)?;
    form.serialize_field("floor", &floor)?;
    form.serialize_field("keys", &Column(|| counters().map(|(k, _, _)| k)))?;
    form.serialize_field("counts", &Column(|| counters().map(|(_, c, _)| c)))?;
    form.serialize_field("errors", &Column(|| counters().map(|(_, _, e)| e)))?;
    form.end()
}

impl Serialize for Bucket {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        serialize_form(s, self.sec, self.floor, || {
            self.counters.iter().map(|(k, c, e)| (k.as_str(), *c, *e))
        })
    }
}

impl TryFrom<BucketForm> for Bucket {
    type Error = String;

    fn try_from(f: BucketForm) -> Result<Self, String> {
        if f.keys.len() != f.counts.len() || f.keys.len() != f.errors.len() {
            return Err(format!(
                "second {}: {} keys, {} counts, {} errors",
                f.sec,
                f.keys.len(),
                f.counts.len(),
                f.errors.len()
            ));
        }
        let counters = f
            .keys
            .into_iter()
            .zip(f.counts)
            .zip(f.errors)
            .map(|((k, c), e)| (k, c, e))
            .collect();
        Ok(Bucket {
            sec: f.sec,
            floor: f.floor,
            counters,
            hashes: Vec::new(),
        })
    }
}

impl PartialEq for Bucket {
    /// The hashes follow from the keys and the (per-process) hasher.
    fn eq(&self, other: &Self) -> bool {
        self.sec == other.sec && self.floor == other.floor && self.counters == other.counters
    }
}

impl fmt::Debug for Bucket {
    /// Without the hashes, which say nothing to a reader.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bucket")
            .field("sec", &self.sec)
            .field("floor", &self.floor)
            .field("counters", &self.counters)
            .finish()
    }
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

/// The serialized form, checked by `TryFrom` before it becomes a
/// [`HeavyHitters`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct State {
    k: usize,
    window_secs: u64,
    capacity: usize,
    closed: Vec<Bucket>,
    live: Option<Bucket>,
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

impl TryFrom<State> for HeavyHitters {
    type Error = StateError;

    fn try_from(s: State) -> Result<Self, StateError> {
        if s.capacity == 0 || s.capacity > u32::MAX as usize {
            return Err(StateError::Capacity(s.capacity));
        }
        let mut previous: Option<i64> = None;
        for b in s.closed.iter().chain(&s.live) {
            if let Some(p) = previous
                && b.sec <= p
            {
                return Err(StateError::Order {
                    sec: b.sec,
                    previous: p,
                });
            }
            previous = Some(b.sec);
            check_bucket(b, s.capacity)?;
        }
        if let Some(live) = &s.live
            && live.counters.windows(2).any(|w| w[0].1 < w[1].1)
        {
            return Err(StateError::Counters { sec: live.sec });
        }
        let hasher = RandomState::new();
        let hash = |mut b: Bucket| {
            b.hashes = b
                .counters
                .iter()
                .map(|(key, _, _)| hasher.hash_one(key.as_str()))
                .collect();
            b
        };
        Ok(Self {
            k: s.k,
            window_secs: s.window_secs,
            capacity: s.capacity,
            closed: s.closed.into_iter().map(hash).collect(),
            live: s.live.map(|b| Live::from_bucket(hash(b))),
            hasher,
            fold_buf: String::new(),
        })
    }
}

/// Checks the invariants one second's counters must hold for the error bound
/// to be true.
fn check_bucket(b: &Bucket, capacity: usize) -> Result<(), StateError> {
    if b.counters.len() > capacity {
        return Err(StateError::TooManyCounters {
            sec: b.sec,
            counters: b.counters.len(),
            capacity,
        });
    }
    let mut seen = HashSet::with_capacity(b.counters.len());
    for (key, count, error) in &b.counters {
        if key.is_empty() || key.len() > MAX_KEY_BYTES || !seen.insert(key.as_str()) {
            return Err(StateError::Key {
                sec: b.sec,
                key: key.clone(),
            });
        }
        // A counter starts at 1 (or at floor + 1 over a replaced one) and
        // only grows; its error is the floor it replaced.
        if *count == 0 || *count < b.floor || *error >= *count || *error > b.floor {
            return Err(StateError::Counters { sec: b.sec });
        }
    }
    // A floor comes from a replacement, which only happens when full.
    if b.floor > 0 && b.counters.len() != capacity {
        return Err(StateError::Counters { sec: b.sec });
    }
    Ok(())
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
mod tests {
    use super::*;
    use crate::stats::topk::TopK;
    use rand::rngs::StdRng;
    use rand::{RngExt, SeedableRng};
    use rand_distr::{Distribution, Exp, Zipf};
    use std::collections::HashMap;
    use std::ops::Range;

    const S: i64 = 1_000_000;

    fn owned(v: &[(&str, u64)]) -> Vec<(String, u64)> {
        v.iter().map(|&(k, c)| (k.to_string(), c)).collect()
    }

    fn est(key: &str, count: u64, error: u64) -> Estimate {
        Estimate {
            key: key.to_string(),
            count,
            error,
        }
    }

    // ----- the behaviour `TopK` has, case by case -----

    #[test]
    fn orders_by_count_then_key() {
        let mut t = HeavyHitters::new(10, 60, DEFAULT_CAPACITY);
        // Counted by hand: c 5, a 3, b 3, d 1.
        t.record(0, ["c", "a", "b", "c", "d"]);
        t.record(S, ["b", "c", "a"]);
        t.record(2 * S, ["c", "a", "b", "c"]);
        assert_eq!(
            t.top(),
            owned(&[("c", 5), ("a", 3), ("b", 3), ("d", 1)]),
            "ties (a, b) must be ordered by key"
        );
        assert_eq!(t.error_bound(), 0, "under capacity the bound is 0");
        assert_eq!(t.window_keys(), 12, "keys recorded in the window");
    }

    #[test]
    fn truncates_to_k() {
        let mut t = HeavyHitters::new(2, 60, DEFAULT_CAPACITY);
        t.record(0, ["x", "y", "y", "z", "z", "z", "w"]);
        assert_eq!(t.top(), owned(&[("z", 3), ("y", 2)]), "k = 2");
        let mut none = HeavyHitters::new(0, 60, DEFAULT_CAPACITY);
        none.record(0, ["x"]);
        assert_eq!(none.top(), owned(&[]), "k = 0 reports nothing");
    }

    #[test]
    fn case_folds_keys() {
        let mut t = HeavyHitters::new(10, 60, DEFAULT_CAPACITY);
        // "ΟΔΟΣ" folds to "οδος" with a final sigma (ς), not to "οδοσ".
        t.record(
            0,
            [
                "Rust",
                "RUST",
                "rust",
                "Ünïcode",
                "üNÏCODE",
                "ΟΔΟΣ",
                "οδος",
                "οδοσ",
            ],
        );
        assert_eq!(
            t.top(),
            owned(&[("rust", 3), ("ünïcode", 2), ("οδος", 2), ("οδοσ", 1)]),
            "keys lowercased as str::to_lowercase does (final sigma included)"
        );
    }

    #[test]
    fn folding_into_a_reused_buffer_is_str_to_lowercase() {
        let cut = |s: String| {
            let mut end = s.len().min(MAX_KEY_BYTES);
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            s[..end].to_owned()
        };
        // The stems of every other test here, and the cases where lowering
        // changes a key's length or depends on its neighbours.
        let mut keys: Vec<String> = STEMS
            .iter()
            .chain(&[
                "Rust",
                "RUST",
                "タグ",
                "ΣΑΣ",
                "Σ",
                "aΣ",
                "Σa",
                "ΟΔΟΣ ΟΔΟΣ",
                "STRASSE",
                "ǅemal",
                "ǅ",
                "ΑΣ🦀",
                "ᾈ",
                "Ⅻ",
                "Ꭰ",
                "𐐀",
                "$Price",
                "user.Name",
                "Ünïcode",
            ])
            .map(|k| (*k).to_owned())
            .collect();
        keys.push(format!("{}Ä", "a".repeat(MAX_KEY_BYTES - 1)));
        keys.push("İ".repeat(MAX_KEY_BYTES));
        // Random strings over every Unicode scalar value, and over the cased
        // blocks where lowering changes length or needs context.
        let mut rng = StdRng::seed_from_u64(7);
        for _ in 0..20_000 {
            let len = rng.random_range(1..12);
            let k: String = (0..len)
                .map(|_| {
                    loop {
                        let c = if rng.random_bool(0.5) {
                            rng.random_range(0..=0x10FFFFu32)
                        } else {
                            rng.random_range(0x41..0x600u32)
                        };
                        if let Some(c) = char::from_u32(c) {
                            break c;
                        }
                    }
                })
                .collect();
            keys.push(k);
        }
        // One buffer for all, as the summary keeps it: nothing of a key may
        // leak into the next.
        let mut buf = String::new();
        for k in &keys {
            assert_eq!(fold_key(k, &mut buf), cut(k.to_lowercase()), "{k:?}");
        }
    }

    #[test]
    fn long_keys_are_cut_at_a_char_boundary() {
        // 255 ASCII bytes then a 4-byte crab: the cut cannot split the crab.
        let long = format!("{}🦀tail", "a".repeat(MAX_KEY_BYTES - 1));
        let mut buf = String::new();
        let folded = fold_key(&long, &mut buf);
        assert_eq!(
            folded,
            "a".repeat(MAX_KEY_BYTES - 1),
            "cut before the crab that straddles the limit"
        );
        let exact = "é".repeat(MAX_KEY_BYTES / 2);
        assert_eq!(
            fold_key(&exact, &mut String::new()),
            exact,
            "a key of exactly the limit is kept"
        );
        let mut t = HeavyHitters::new(10, 60, DEFAULT_CAPACITY);
        t.record(0, [long.as_str(), &long.to_uppercase()]);
        assert_eq!(
            t.top(),
            vec![("a".repeat(MAX_KEY_BYTES - 1), 2)],
            "both spellings fold and cut to one key"
        );
    }

    #[test]
    fn keys_expire_after_window() {
        let mut t = HeavyHitters::new(10, 60, DEFAULT_CAPACITY);
        t.record(0, ["old"]);
        t.record(30 * S, ["new"]);
        t.expire(59 * S + 999_999);
        assert_eq!(t.top(), owned(&[("new", 1), ("old", 1)]), "at 59.999 s");
        // Second 0 expires at second 60 (0 <= 60 - 60).
        t.expire(60 * S);
        assert_eq!(t.top(), owned(&[("new", 1)]), "at 60 s");
        t.expire(90 * S);
        assert_eq!(t.top(), owned(&[]), "at 90 s");
        assert_eq!(t.counters(), 0, "no counter left");
        assert_eq!(
            t,
            HeavyHitters::new(10, 60, DEFAULT_CAPACITY),
            "empty again"
        );
    }

    #[test]
    fn partial_expiry_keeps_remaining_counts() {
        let mut t = HeavyHitters::new(10, 10, DEFAULT_CAPACITY);
        t.record(0, ["a", "b"]);
        t.record(5 * S, ["a"]);
        t.expire(10 * S);
        assert_eq!(t.top(), owned(&[("a", 1)]), "b gone, a down to 1");
    }

    #[test]
    fn out_of_order_goes_into_newest_bucket() {
        let mut t = HeavyHitters::new(10, 60, DEFAULT_CAPACITY);
        t.record(100 * S, ["a"]);
        t.record(50 * S, ["b"]);
        // Had "b" gone into a bucket for second 50 it would expire at 110.
        t.expire(159 * S);
        assert_eq!(t.top(), owned(&[("a", 1), ("b", 1)]), "at 159 s");
        assert_eq!(t.closed.len(), 0, "one (live) second expected");
        t.expire(160 * S);
        assert_eq!(t.top(), owned(&[]), "at 160 s");
        // A record after everything expired starts afresh, even earlier.
        t.record(10 * S, ["c"]);
        assert_eq!(t.top(), owned(&[("c", 1)]), "after a full expiry");
    }

    #[test]
    fn record_keeps_state_bounded() {
        let mut t = HeavyHitters::new(10, 60, DEFAULT_CAPACITY);
        for s in 0..1_000 {
            t.record(s * S, ["tick"]);
        }
        assert_eq!(t.closed.len() + 1, 60, "seconds bounded by the window");
        assert_eq!(t.top(), owned(&[("tick", 60)]), "count in window");
    }

    #[test]
    fn empty_keys_change_nothing() {
        let mut t = HeavyHitters::new(10, 60, DEFAULT_CAPACITY);
        let fresh = t.clone();
        t.record(0, Vec::<&str>::new());
        t.record(0, [""]);
        assert_eq!(t, fresh, "no second for an event without keys");
        t.record(0, ["", "a"]);
        assert_eq!(t.top(), owned(&[("a", 1)]), "empty key skipped");
    }

    #[test]
    fn zero_window_keeps_nothing() {
        let mut t = HeavyHitters::new(10, 0, DEFAULT_CAPACITY);
        t.record(0, ["a"]);
        assert_eq!(t.top(), owned(&[]), "window 0 holds no whole second");
        assert_eq!(t.counters(), 0, "and keeps no counter");
        let mut big = HeavyHitters::new(10, u64::MAX, DEFAULT_CAPACITY);
        big.record(i64::MIN, ["a"]);
        big.record(i64::MAX, ["b"]);
        big.expire(i64::MAX);
        assert_eq!(
            big.top(),
            owned(&[("a", 1), ("b", 1)]),
            "huge window must not overflow"
        );
        assert_eq!(
            HeavyHitters::new(1, 1, 0).capacity(),
            1,
            "capacity 0 is clamped to 1"
        );
    }

    // ----- Space-Saving itself, on streams small enough to follow by hand -----

    #[test]
    fn replacement_by_hand() {
        let mut t = HeavyHitters::new(10, 60, 2);
        // a a b: two counters, exact. Then c replaces b (the smallest, 1):
        // c inherits 1 + 1 with error 1, and the second's floor becomes 1.
        t.record(0, ["a", "a", "b"]);
        assert_eq!(
            t.estimates(usize::MAX),
            vec![est("a", 2, 0), est("b", 1, 0)],
            "exact at capacity"
        );
        t.record(0, ["c"]);
        assert_eq!(
            t.estimates(usize::MAX),
            vec![est("a", 2, 0), est("c", 2, 1)],
            "c took b's counter"
        );
        assert_eq!(t.error_bound(), 1, "floor of the only second");
        // Next second, exact again: a 1. Window: a 3 (exact), c 2 + 0 in
        // second 1 (c has no counter there but that floor is 0).
        t.record(S, ["a"]);
        assert_eq!(
            t.estimates(usize::MAX),
            vec![est("a", 3, 0), est("c", 2, 1)],
            "merged over two seconds"
        );
        // Second 2: d d e, then f replaces e (1) -> floor 1 in second 2.
        t.record(2 * S, ["d", "d", "e", "f"]);
        // a: 3 + floor(second 2) = 4, error 1; c: 2 + 1 = 3, error 2;
        // d: 2 + floors of seconds 0 and 1 (1 + 0) = 3, error 1;
        // f: 2 (error 1) + 1 = 3, error 2.
        assert_eq!(
            t.estimates(usize::MAX),
            vec![
                est("a", 4, 1),
                est("c", 3, 2),
                est("d", 3, 1),
                est("f", 3, 2)
            ],
            "floors of the seconds without a counter are added"
        );
        assert_eq!(t.error_bound(), 2, "1 + 0 + 1");
        assert_eq!(t.window_keys(), 9, "keys recorded");
        assert_eq!(
            t.estimates(2),
            vec![est("a", 4, 1), est("c", 3, 2)],
            "n = 2"
        );
    }

    #[test]
    fn exact_up_to_capacity_then_bounded() {
        let m = 50;
        let mut t = HeavyHitters::new(m, 60, m);
        let keys: Vec<String> = (0..=m).map(|i| format!("k{i:02}")).collect();
        t.record(0, keys[..m].iter().map(String::as_str));
        t.record(0, ["k00"]);
        assert_eq!(t.error_bound(), 0, "m distinct keys fit exactly");
        assert_eq!(t.top()[0], ("k00".to_string(), 2), "exact count");
        t.record(0, [keys[m].as_str()]);
        assert_eq!(t.error_bound(), 1, "the (m+1)-th key replaces a count of 1");
        let top = t.estimates(usize::MAX);
        assert_eq!(top.len(), m, "still m counters");
        assert!(
            top.iter()
                .any(|e| e.key == keys[m] && e.count == 2 && e.error == 1),
            "the newcomer overestimated by its error: {top:?}"
        );
    }

    #[test]
    fn corrupt_states_are_refused() {
        let mut t = HeavyHitters::new(3, 60, 2);
        t.record(0, ["a", "a", "b"]);
        t.record(S, ["c", "d", "d", "e"]);
        let good = serde_json::to_value(&t).unwrap();
        let back: HeavyHitters = serde_json::from_value(good.clone()).unwrap();
        assert_eq!(back, t, "a valid state restores");

        type Corrupt = fn(&mut serde_json::Value);
        let cases: [(&str, Corrupt); 8] = [
            ("zero capacity", |v| v["capacity"] = 0.into()),
            ("duplicate key", |v| {
                v["closed"][0]["keys"][1] = "a".into();
            }),
            ("unsorted live counters", |v| {
                v["live"]["counts"][1] = 3.into();
            }),
            ("too many counters", |v| {
                let b = &mut v["closed"][0];
                for (field, value) in [
                    ("keys", serde_json::json!("z")),
                    ("counts", 1.into()),
                    ("errors", 0.into()),
                ] {
                    b[field].as_array_mut().unwrap().push(value);
                }
            }),
            ("seconds out of order", |v| v["live"]["sec"] = 0.into()),
            ("error not below count", |v| {
                v["closed"][0]["errors"][0] = 2.into();
            }),
            ("arrays of different lengths", |v| {
                v["closed"][0]["errors"].as_array_mut().unwrap().pop();
            }),
            ("unknown field", |v| v["extra"] = 1.into()),
        ];
        for (what, corrupt) in cases {
            let mut v = good.clone();
            corrupt(&mut v);
            let r = serde_json::from_value::<HeavyHitters>(v.clone());
            assert!(
                r.is_err(),
                "{what}: expected an error, restored {r:?} from {v}"
            );
        }
    }

    /// A checkpoint must be storable by any MongoDB-compatible server: no array directly
    /// inside an array, and no key of the stream (which may start with `$` or hold a dot)
    /// as a field name.
    #[test]
    fn the_saved_state_holds_no_nested_array_and_no_key_as_a_field_name() {
        let mut t = HeavyHitters::new(3, 60, 4);
        t.record(0, ["$price", "user.name", "a"]);
        t.record(S, ["$price", "b"]);
        let v = serde_json::to_value(&t).unwrap();
        fn check(v: &serde_json::Value, path: &str) {
            match v {
                serde_json::Value::Array(items) => {
                    for (i, item) in items.iter().enumerate() {
                        assert!(!item.is_array(), "{path}[{i}] is an array inside an array");
                        check(item, &format!("{path}[{i}]"));
                    }
                }
                serde_json::Value::Object(m) => {
                    for (k, item) in m {
                        assert!(
                            !k.starts_with('$') && !k.contains('.'),
                            "{path}: field name {k:?}"
                        );
                        check(item, &format!("{path}.{k}"));
                    }
                }
                _ => {}
            }
        }
        check(&v, "state");
        let back: HeavyHitters = serde_json::from_value(v).unwrap();
        assert_eq!(back, t);
    }

    // ----- long-tail streams against an exact reference -----

    /// Stems in many scripts, emoji, `$`-prefixed and dotted keys, so keys
    /// of every shape meet the folding, the hashing and the JSON escaping.
    const STEMS: [&str; 14] = [
        "rust",
        "Тег",
        "ΟΔΟΣ",
        "标签",
        "وسم",
        "टैग",
        "🦀",
        "👩🏽‍💻",
        "$price",
        "user.name.",
        "Straße",
        "İstanbul",
        "ทดสอบ",
        "\"q\\\u{1}",
    ];

    /// The name of the tag of Zipf rank `rank`; every 997th is longer than
    /// [`MAX_KEY_BYTES`], with the rank first so the cut keeps it distinct.
    fn tag(rank: u64) -> String {
        let stem = STEMS[(rank % STEMS.len() as u64) as usize];
        if rank.is_multiple_of(997) {
            format!("{rank}{}", "🦀x".repeat(60))
        } else {
            format!("{stem}{rank}")
        }
    }

    /// Exact sliding-window counts, the naive way: every key of every second.
    struct Exact {
        window_secs: u64,
        buckets: VecDeque<(i64, HashMap<String, u64>)>,
        totals: HashMap<String, u64>,
    }

    impl Exact {
        fn new(window_secs: u64) -> Self {
            Self {
                window_secs,
                buckets: VecDeque::new(),
                totals: HashMap::new(),
            }
        }

        fn record(&mut self, t_us: i64, keys: &[String]) {
            let keys: Vec<String> = keys
                .iter()
                .filter(|k| !k.is_empty())
                .map(|k| fold_key(k, &mut String::new()).to_owned())
                .collect();
            if keys.is_empty() {
                return;
            }
            let sec = t_us.div_euclid(S);
            if self.buckets.back().is_none_or(|(newest, _)| sec > *newest) {
                self.buckets.push_back((sec, HashMap::new()));
            }
            let (newest, bucket) = self.buckets.back_mut().unwrap();
            let newest = *newest;
            for k in keys {
                *bucket.entry(k.clone()).or_default() += 1;
                *self.totals.entry(k).or_default() += 1;
            }
            self.expire(newest * S);
        }

        fn expire(&mut self, now_us: i64) {
            let cutoff = i128::from(now_us.div_euclid(S)) - i128::from(self.window_secs);
            while self
                .buckets
                .front()
                .is_some_and(|(s, _)| i128::from(*s) <= cutoff)
            {
                let (_, b) = self.buckets.pop_front().unwrap();
                for (k, c) in b {
                    let t = self.totals.get_mut(&k).unwrap();
                    *t -= c;
                    if *t == 0 {
                        self.totals.remove(&k);
                    }
                }
            }
        }

        fn count(&self, key: &str) -> u64 {
            self.totals.get(key).copied().unwrap_or(0)
        }

        fn keys(&self) -> u64 {
            self.totals.values().sum()
        }

        /// Every key, by count descending then key.
        fn sorted(&self) -> Vec<Estimate> {
            let mut v: Vec<Estimate> = self.totals.iter().map(|(k, &c)| est(k, c, 0)).collect();
            v.sort_by(|a, b| (Reverse(a.count), &a.key).cmp(&(Reverse(b.count), &b.key)));
            v
        }
    }

    /// One event: its time and its raw (unfolded) tags.
    struct Event {
        t_us: i64,
        keys: Vec<String>,
    }

    /// A seeded stream of `secs` seconds: arrivals at `rate` per second,
    /// Poisson (with bursts and late, skewed clocks) or evenly spaced, tags
    /// drawn from Zipf(`distinct`, `s`), some upper-cased.
    struct Stream {
        rng: StdRng,
        zipf: Zipf<f64>,
        gap: Option<Exp<f64>>,
        step_us: f64,
        t: f64,
        end: f64,
        burst: u32,
    }

    impl Stream {
        fn new(seed: u64, rate: f64, poisson: bool, secs: u64, distinct: u64, s: f64) -> Self {
            Self {
                rng: StdRng::seed_from_u64(seed),
                zipf: Zipf::new(distinct as f64, s).unwrap(),
                gap: poisson.then(|| Exp::new(rate).unwrap()),
                step_us: 1e6 / rate,
                t: 1_700_000_000e6,
                end: 1_700_000_000e6 + secs as f64 * 1e6,
                burst: 0,
            }
        }
    }

    impl Iterator for Stream {
        type Item = Event;

        fn next(&mut self) -> Option<Event> {
            if self.burst > 0 {
                self.burst -= 1; // a burst: many events in the same instant
            } else if let Some(gap) = &self.gap {
                self.t += gap.sample(&mut self.rng) * 1e6;
                if self.rng.random::<f64>() < 0.002 {
                    self.burst = self.rng.random_range(50..400);
                }
            } else {
                self.t += self.step_us;
            }
            if self.t >= self.end {
                return None;
            }
            let mut t_us = self.t as i64;
            if self.gap.is_some() && self.rng.random::<f64>() < 0.02 {
                t_us -= self.rng.random_range(0..5 * S); // a late, skewed clock
            }
            let u: f64 = self.rng.random();
            let n = match u {
                u if u < 0.35 => 0,
                u if u < 0.75 => 1,
                u if u < 0.92 => 2,
                _ => self.rng.random_range(3..6),
            };
            let keys = (0..n)
                .map(|_| {
                    let rank = self.zipf.sample(&mut self.rng) as u64;
                    let t = tag(rank);
                    if self.rng.random::<f64>() < 0.25 {
                        t.to_uppercase()
                    } else {
                        t
                    }
                })
                .collect();
            Some(Event { t_us, keys })
        }
    }

    /// Checks (b), (c) and (d) of the brief at one instant.
    fn check_bound(hh: &HeavyHitters, exact: &Exact, all: &[Estimate], at: &str) -> u64 {
        let bound = hh.error_bound();
        let n = exact.keys();
        assert_eq!(hh.window_keys(), n, "{at}: keys in window");
        assert!(
            bound.saturating_mul(hh.capacity() as u64) <= n,
            "{at}: bound {bound} must be at most N/m = {n}/{}",
            hh.capacity()
        );
        // (b) every reported count within its error, and that within the bound.
        for e in all {
            let f = exact.count(&e.key);
            assert!(
                f <= e.count && e.count - f <= e.error && e.error <= bound,
                "{at}: {e:?} vs true count {f}, bound {bound}"
            );
        }
        // (c) every key above the bound is a candidate.
        let listed: HashSet<&str> = all.iter().map(|e| e.key.as_str()).collect();
        for (key, &f) in &exact.totals {
            assert!(
                f <= bound || listed.contains(key.as_str()),
                "{at}: {key:?} has {f} > bound {bound} but is not listed"
            );
        }
        // (d) top-k: a key ranked after, or left out for, another has a true
        // count at most `bound` above it (stronger than the 2·bound asked).
        let top = hh.top();
        let expected_top: Vec<(String, u64)> = all
            .iter()
            .take(hh.k)
            .map(|e| (e.key.clone(), e.count))
            .collect();
        assert_eq!(top, expected_top, "{at}: top() is the head of estimates()");
        let in_top: HashSet<&str> = top.iter().map(|(k, _)| k.as_str()).collect();
        for (i, (x, _)) in top.iter().enumerate() {
            let fx = exact.count(x);
            for (y, _) in &top[i + 1..] {
                let fy = exact.count(y);
                assert!(
                    fy <= fx + bound,
                    "{at}: {y:?} (true {fy}) ranked after {x:?} (true {fx}), bound {bound}"
                );
            }
        }
        if let Some((last, _)) = top.last().filter(|_| top.len() == hh.k) {
            let fl = exact.count(last);
            for (y, &fy) in &exact.totals {
                assert!(
                    in_top.contains(y.as_str()) || fy <= fl + bound,
                    "{at}: {y:?} (true {fy}) left out for {last:?} (true {fl}), bound {bound}"
                );
            }
        }
        bound
    }

    /// The ~70 events/s sample: Poisson arrivals with bursts, late clocks,
    /// Zipf(2·10^6, 1.1) tags: never more distinct keys per second than the
    /// capacity, so every answer must be exact, and equal to `TopK`'s.
    /// 5 minutes of stream (~21,000 events), checked every third second
    /// (each check sorts the whole window, slow in a debug build).
    #[test]
    fn exact_under_capacity_on_the_sample_rate() {
        let (k, window) = (10, 60);
        let mut hh = HeavyHitters::new(k, window, DEFAULT_CAPACITY);
        let mut topk = TopK::new(k, window);
        let mut exact = Exact::new(window);
        let mut last_sec = None;
        let (mut checks, mut max_keys) = (0, 0);
        for e in Stream::new(7, 70.0, true, 300, 2_000_000, 1.1) {
            hh.record(e.t_us, e.keys.iter().map(String::as_str));
            hh.expire(e.t_us);
            topk.record(e.t_us, e.keys.iter().map(String::as_str));
            topk.expire(e.t_us);
            exact.record(e.t_us, &e.keys);
            exact.expire(e.t_us);
            let sec = e.t_us.div_euclid(S);
            if last_sec.is_some_and(|l| sec < l + 3) {
                continue;
            }
            last_sec = Some(sec);
            let at = format!("second {sec}");
            let all = hh.estimates(usize::MAX);
            assert_eq!(hh.error_bound(), 0, "{at}: under capacity the bound is 0");
            assert_eq!(all, exact.sorted(), "{at}: every count exact");
            assert_eq!(hh.top(), topk.top(), "{at}: same answer as TopK");
            check_bound(&hh, &exact, &all, &at);
            checks += 1;
            max_keys = max_keys.max(exact.totals.len());
        }
        assert!(checks > 90, "checked {checks} seconds, expected > 90");
        assert!(
            max_keys > 1_000,
            "the window must hold a long tail of distinct keys, max seen {max_keys}"
        );
    }

    /// Flat out: 50,000 events/s (~53,000 keys/s), Zipf(2·10^6, 1.1), far
    /// more distinct keys per second than the capacity. Scaled to run in a
    /// few seconds in a debug build: a 5 s window (not 60) over 8 s, 400,000
    /// events, checked every second. Each second sees the production load,
    /// so each second's summary is in the production regime; the window
    /// only sums their floors.
    #[test]
    fn within_bound_flat_out() {
        let (k, window) = (10, 5);
        let mut hh = HeavyHitters::new(k, window, DEFAULT_CAPACITY);
        let mut exact = Exact::new(window);
        let mut last_sec = None;
        let mut bounds = Vec::new();
        for e in Stream::new(11, 50_000.0, false, 8, 2_000_000, 1.1) {
            hh.record(e.t_us, e.keys.iter().map(String::as_str));
            exact.record(e.t_us, &e.keys);
            let sec = e.t_us.div_euclid(S);
            if last_sec.is_some_and(|l| sec <= l) {
                continue;
            }
            last_sec = Some(sec);
            let all = hh.estimates(usize::MAX);
            bounds.push(check_bound(&hh, &exact, &all, &format!("second {sec}")));
        }
        assert!(bounds.len() >= 7, "checked {} seconds", bounds.len());
        let bound = *bounds.last().unwrap();
        let top = hh.top();
        assert!(
            bound > 0 && exact.totals.len() > 10 * DEFAULT_CAPACITY,
            "the stream must overflow the capacity: bound {bound}, {} keys",
            exact.totals.len()
        );
        assert!(
            top.len() == k && top[k - 1].1 > 2 * bound,
            "the top-{k} must stand clear of the bound {bound}: {top:?}"
        );
        // With counts this far apart the top-10 is exactly the true top-10.
        let truth: Vec<(String, u64)> = exact
            .sorted()
            .into_iter()
            .take(k)
            .map(|e| (e.key, e.count))
            .collect();
        let keys = |v: &[(String, u64)]| v.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>();
        assert_eq!(keys(&top), keys(&truth), "top-{k} keys vs the exact ones");
    }

    /// 10^6 distinct keys through a 10 s window at 20,000 keys/s: the
    /// checkpoint stays within `state_bound_bytes`, the counters within
    /// window × capacity, and the size stops growing once the window is full.
    #[test]
    fn state_size_is_bounded() {
        let (window, m) = (10, DEFAULT_CAPACITY);
        let mut hh = HeavyHitters::new(10, window, m);
        let per_sec = 20_000;
        let mut size_at_full = 0;
        let mut buf = Vec::with_capacity(8);
        for i in 0..1_000_000u64 {
            buf.clear();
            // Fixed-width ranks, so the sizes at two instants compare.
            let stem = STEMS[(i % STEMS.len() as u64) as usize];
            buf.push(format!("{stem}{i:07}"));
            let t = 1_700_000_000 * S + (i / per_sec) as i64 * S;
            hh.record(t, buf.iter().map(String::as_str));
            // The last key of a second, as at the end: a full window.
            if i == per_sec * (window + 1) - 1 {
                size_at_full = serde_json::to_vec(&hh).unwrap().len();
            }
        }
        let json = serde_json::to_vec(&hh).unwrap();
        assert!(
            hh.counters() <= window as usize * m,
            "counters {} > window × capacity",
            hh.counters()
        );
        assert!(
            (json.len() as u64) <= hh.state_bound_bytes(),
            "checkpoint {} bytes > documented bound {}",
            json.len(),
            hh.state_bound_bytes()
        );
        // Keys of the same shape, 39 windows later: within 2 %.
        assert!(
            json.len() as f64 <= size_at_full as f64 * 1.02,
            "checkpoint grew from {size_at_full} to {} bytes with more distinct keys",
            json.len()
        );

        // The worst case the bound is written for: every counter a key of
        // MAX_KEY_BYTES control characters (six JSON bytes each) and huge
        // counts, in a full window.
        let (window, m) = (3, 4);
        let mut worst = HeavyHitters::new(10, window, m);
        for s in 0..window as i64 {
            for i in 0..m {
                let key = format!("{i}{}", "\u{1}".repeat(MAX_KEY_BYTES));
                worst.record(s * S, [key.as_str()]);
            }
        }
        for c in worst.closed.iter_mut() {
            for counter in &mut c.counters {
                counter.1 = u64::MAX;
            }
        }
        let json = serde_json::to_vec(&worst).unwrap();
        assert!(
            (json.len() as u64) <= worst.state_bound_bytes(),
            "worst case {} bytes > bound {}",
            json.len(),
            worst.state_bound_bytes()
        );
        assert!(
            json.len() as u64 * 10 >= worst.state_bound_bytes() * 9,
            "bound {} should be tight (within 10 %) on the worst case, seen {}",
            worst.state_bound_bytes(),
            json.len()
        );
    }

    /// Restoring a checkpoint mid-stream continues exactly as the
    /// uninterrupted run, with replacements (small capacity) and late
    /// timestamps; two runs of the same input give byte-identical
    /// checkpoints although their hash maps are seeded differently.
    #[test]
    fn checkpoint_round_trip_matches_uninterrupted_run() {
        let events: Vec<Event> = Stream::new(3, 300.0, true, 60, 5_000, 1.05).collect();
        let half = events.len() / 2;
        // The bound after every event; the full answer after every 10th and
        // every event near the restore point (each answer merges every
        // second, which a debug build makes slow).
        let answer = |i: usize| i.is_multiple_of(10) || i.abs_diff(half) < 50;
        let run =
            |t: &mut HeavyHitters, range: Range<usize>| -> Vec<(u64, Option<Vec<Estimate>>)> {
                range
                    .map(|i| {
                        let e = &events[i];
                        t.record(e.t_us, e.keys.iter().map(String::as_str));
                        t.expire(e.t_us);
                        (t.error_bound(), answer(i).then(|| t.estimates(5)))
                    })
                    .collect()
            };
        let fresh = || HeavyHitters::new(5, 20, 24);
        let mut straight = fresh();
        let expected = run(&mut straight, 0..events.len());

        let mut first = fresh();
        let mut seen = run(&mut first, 0..half);
        let json = serde_json::to_string(&first).unwrap();
        let mut restored: HeavyHitters = serde_json::from_str(&json).unwrap();
        assert_eq!(restored, first, "restored state vs saved state");
        assert_eq!(
            serde_json::to_string(&restored).unwrap(),
            json,
            "re-serialized state vs saved JSON"
        );
        seen.extend(run(&mut restored, half..events.len()));
        assert_eq!(seen.len(), expected.len(), "number of answers");
        for (i, (s, e)) in seen.iter().zip(&expected).enumerate() {
            assert_eq!(s, e, "event {i}: restored run vs uninterrupted run");
        }
        assert_eq!(restored, straight, "final state");
        let final_json = serde_json::to_string(&straight).unwrap();
        assert_eq!(
            serde_json::to_string(&restored).unwrap(),
            final_json,
            "final checkpoints byte for byte"
        );
        let replaced = expected.iter().filter(|(b, _)| *b > 0).count();
        assert!(
            replaced > expected.len() / 2,
            "the stream must exercise replacements: bound > 0 after {replaced} of {} events",
            expected.len()
        );
        // The serialized form is the state, not a hash map's order: a run
        // with differently seeded hashers writes the same bytes.
        let mut again = fresh();
        for e in &events {
            again.record(e.t_us, e.keys.iter().map(String::as_str));
            again.expire(e.t_us);
        }
        assert_eq!(
            serde_json::to_string(&again).unwrap(),
            final_json,
            "two runs of the same input, byte for byte"
        );
    }
}
