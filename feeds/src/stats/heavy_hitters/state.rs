//! What a [`HeavyHitters`] saves in a checkpoint: its closed seconds as buckets of counters
//! and its settings, and the checks that a state read back is one it could have written.

use std::collections::HashSet;
use std::fmt;
use std::hash::{BuildHasher, RandomState};

use serde::ser::SerializeStruct;
use serde::{Deserialize, Serialize, Serializer};

use super::{HeavyHitters, Live, MAX_KEY_BYTES, StateError};

/// One closed second: its Space-Saving counters, frozen. Saved as [`BucketForm`].
#[derive(Deserialize, Clone)]
#[serde(try_from = "BucketForm")]
pub(super) struct Bucket {
    /// Whole second since the Unix epoch.
    pub(super) sec: i64,
    /// Smallest count ever replaced in this second (0 if none): an upper
    /// bound on the count of any key without a counter here.
    pub(super) floor: u64,
    /// `(key, count, error)`, in the order the live summary had them
    /// (count descending).
    pub(super) counters: Vec<(String, u64, u64)>,
    /// The hash of each key (same order), so merging the seconds in `top`
    /// never hashes a string. Not serialized: the hasher is seeded per
    /// process, and a restore recomputes them.
    #[serde(skip)]
    pub(super) hashes: Vec<u64>,
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
pub(super) fn serialize_form<'a, S, I>(
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

/// The serialized form, checked by `TryFrom` before it becomes a
/// [`HeavyHitters`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct State {
    pub(super) k: usize,
    pub(super) window_secs: u64,
    pub(super) capacity: usize,
    pub(super) closed: Vec<Bucket>,
    pub(super) live: Option<Bucket>,
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
