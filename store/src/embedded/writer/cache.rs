//! Keyed documents as the writer last wrote them, and the keys the staged maps hold.

use std::sync::Arc;

use crate::Document;

/// A keyed document as the writer last knows it: the document, its JSON and its write time.
#[derive(Clone)]
pub(crate) struct Kv {
    /// Shared with the changes that carry it and the cache: a hot key's document is copied
    /// once per update (to change it), not once per place it goes.
    pub doc: Arc<Document>,
    pub json: Arc<str>,
    pub ts: i64,
}

/// Documents of keyed collections as last written: an update of a hot key (a source's
/// summary, updated on every event; a common hashtag's counter) then needs no read and no
/// parse. The writer is the only writer, so the cache is exact.
///
/// On a long tail most keys are written once or a few times and would push the hot ones out
/// of a cache that keeps whatever was written last. `quick_cache`'s CLOCK-Pro admits a new key
/// into a small cold section; only a key written again while there, or again after it left
/// (remembered by its hash), takes a place among the hot ones.
pub(super) struct KvCache {
    pub(super) docs: quick_cache::unsync::Cache<KvKey, Kv, KvWeight, hashbrown::DefaultHashBuilder>,
}

impl KvCache {
    /// Bytes the cached entries may take, as [`KvWeight`] counts them: several hundred
    /// counters of a long-tail field beside the summaries. At 70 events/s the cache fills
    /// and stays full, so its bytes count against the memory target there
    /// (docs/BENCHMARKS.md, "Targets").
    const BYTES: u64 = 512 * 1024;

    pub(super) fn new() -> Self {
        let docs = quick_cache::unsync::Cache::with(
            usize::try_from(Self::BYTES / 900).unwrap_or(1024),
            Self::BYTES,
            KvWeight,
            hashbrown::DefaultHashBuilder::default(),
            quick_cache::unsync::DefaultLifecycle::default(),
        );
        Self { docs }
    }

    pub(super) fn get(&self, coll: &str, key: &str) -> Option<&Kv> {
        self.docs.get(&KvRef(coll, key))
    }

    pub(super) fn put(&mut self, coll: &str, key: &str, kv: Kv) {
        match self.docs.get_mut(&KvRef(coll, key)) {
            // The weight may change with the document; `RefMut` accounts for it when dropped.
            Some(mut cached) => *cached = kv,
            None => self.docs.insert((coll.to_owned(), key.to_owned()), kv),
        }
    }

    pub(super) fn remove(&mut self, coll: &str, key: &str) {
        self.docs.remove(&KvRef(coll, key));
    }
}

/// A cached keyed document's weight: about the bytes it holds. Its decoded form takes a few
/// times its JSON, and at least a node of a `BTreeMap` (~640 bytes, allocated even for a
/// counter's one field); then its key and its JSON.
#[derive(Clone)]
pub(super) struct KvWeight;

impl quick_cache::Weighter<KvKey, Kv> for KvWeight {
    fn weight(&self, key: &KvKey, kv: &Kv) -> u64 {
        (key.0.len() + key.1.len() + 4 * kv.json.len() + 768) as u64
    }
}

/// Maps of the writer's per-key work (several lookups for every update): hashbrown's
/// default hasher (foldhash, seeded per process), faster than SipHash on these short keys.
pub(super) type KvHashMap<K, V> = hashbrown::HashMap<K, V>;

/// A keyed document's place, (collection, key), as the staged maps hold it.
pub(super) type KvKey = (String, String);

/// A [`KvKey`] borrowed, to look one up without building it: it hashes as the tuple does
/// (`derive(Hash)` hashes the fields in order, as a tuple hashes its elements). The filter of
/// stored keys hashes keys as this too.
#[derive(Hash)]
pub(crate) struct KvRef<'a>(pub &'a str, pub &'a str);

impl hashbrown::Equivalent<KvKey> for KvRef<'_> {
    fn equivalent(&self, k: &KvKey) -> bool {
        self.0 == k.0 && self.1 == k.1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(json: &str) -> Kv {
        Kv {
            doc: Arc::new(serde_json::from_str(json).expect("a test document")),
            json: Arc::from(json),
            ts: 0,
        }
    }

    /// What the writer does with a key it updates: read it (from the cache when there) and
    /// write it back.
    fn update(cache: &mut KvCache, coll: &str, key: &str, json: &str) -> bool {
        let hit = cache.get(coll, key).is_some();
        cache.put(coll, key, kv(json));
        hit
    }

    /// On a long tail (every event a new hashtag, as at 10^7 distinct values) the keys written
    /// on every event stay cached, and the cache stays within its bytes; a key written twice
    /// in a row is found the second time.
    #[test]
    fn a_long_tail_leaves_the_hot_keys_cached() {
        let mut cache = KvCache::new();
        let hot = ["source:a", "lang:en", "hashtags:東京"];
        let mut misses = 0;
        for i in 0..100_000 {
            for k in hot {
                if !update(&mut cache, "rollups", k, &format!(r#"{{"count":{i}}}"#)) {
                    misses += 1;
                }
            }
            let tail = format!("hashtags:tag{i}");
            assert!(!update(&mut cache, "rollups", &tail, r#"{"count":1}"#));
            assert!(update(&mut cache, "rollups", &tail, r#"{"count":2}"#));
            assert!(cache.docs.weight() <= KvCache::BYTES);
        }
        assert_eq!(misses, hot.len(), "only each hot key's first update misses");
        let json = |k| cache.get("rollups", k).map(|kv| kv.json.to_string());
        assert_eq!(json("lang:en").as_deref(), Some(r#"{"count":99999}"#));
        // An entry replaced by a smaller document weighs less: the bound counts what is held.
        let before = cache.docs.weight();
        cache.put("rollups", "lang:en", kv(r#"{"c":1}"#));
        assert!(cache.docs.weight() < before);
        cache.remove("rollups", "lang:en");
        assert!(cache.get("rollups", "lang:en").is_none());
        // Large documents count by their size, not as one entry each.
        let big = format!(r#"{{"text":"{}"}}"#, "x".repeat(64 * 1024));
        for i in 0..64 {
            cache.put("docs", &format!("doc{i}"), kv(&big));
            assert!(cache.docs.weight() <= KvCache::BYTES);
        }
        let held = (0..64)
            .filter(|i| {
                cache
                    .docs
                    .peek(&KvRef("docs", &format!("doc{i}")))
                    .is_some()
            })
            .count();
        assert!(
            held as u64 * 4 * big.len() as u64 <= KvCache::BYTES,
            "{held} documents of 64 KiB held"
        );
    }
}
