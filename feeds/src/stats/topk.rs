//! Sliding-window top-k of string keys (hashtags).
//!
//! Counts are kept per whole second so the oldest second can be subtracted
//! when it leaves the window, and running totals make `top` independent of
//! the number of buckets.

use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::heavy_hitters::HeavyHitters;
use super::{Event, Registration, Statistic, StatsConfig, from_state, to_state};
use crate::telemetry as t;

/// Microseconds per second, the bucket width.
const US_PER_SEC: i64 = 1_000_000;

/// Most frequent keys over the last `window_secs` seconds.
///
/// Keys are case-folded to lowercase on the way in (hashtags are
/// case-insensitive: `#Rust` and `#rust` are the same tag), so `top` always
/// reports lowercase keys. Memory is bounded by the keys seen in the window:
/// at most `window_secs + 1` buckets are kept, since recording drops buckets
/// that fell out of the window relative to the newest one.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct TopK {
    k: usize,
    window_secs: u64,
    /// Per-second counts, oldest first, seconds strictly increasing.
    buckets: VecDeque<(i64, BTreeMap<String, u64>)>,
    /// Sum of all buckets per key; never holds a zero count.
    totals: BTreeMap<String, u64>,
}

impl TopK {
    /// Creates an empty tracker reporting at most `k` keys over the last
    /// `window_secs` seconds. With `window_secs` 0 every key expires as soon
    /// as it is recorded (the window holds no whole second).
    pub fn new(k: usize, window_secs: u64) -> Self {
        Self {
            k,
            window_secs,
            buckets: VecDeque::new(),
            totals: BTreeMap::new(),
        }
    }

    /// Counts every key once per occurrence at time `t_us` (microseconds
    /// since the Unix epoch).
    ///
    /// A timestamp earlier than the newest bucket (clock skew, replay) is
    /// counted into the newest bucket, as the rate series does, so buckets
    /// stay ordered and a closed past second is never reopened. Empty keys
    /// are skipped: they are extraction artifacts, not tags. A call with no
    /// (non-empty) keys changes nothing. Buckets already out of the window
    /// relative to the newest second are dropped here too, so memory stays
    /// bounded even between calls to [`TopK::expire`].
    pub fn record<'a>(&mut self, t_us: i64, keys: impl IntoIterator<Item = &'a str>) {
        let sec = t_us.div_euclid(US_PER_SEC);
        let mut keys = keys.into_iter().filter(|k| !k.is_empty()).peekable();
        if keys.peek().is_none() {
            return;
        }
        let needs_bucket = match self.buckets.back() {
            Some((newest, _)) => sec > *newest,
            None => true,
        };
        if needs_bucket {
            self.buckets.push_back((sec, BTreeMap::new()));
        }
        let Some((newest, bucket)) = self.buckets.back_mut() else {
            return; // unreachable: a bucket was just ensured
        };
        let newest = *newest;
        for key in keys {
            let key = key.to_lowercase();
            let c = bucket.entry(key.clone()).or_insert(0);
            *c = c.saturating_add(1);
            let t = self.totals.entry(key).or_insert(0);
            *t = t.saturating_add(1);
        }
        self.expire_before(newest);
    }

    /// Drops every bucket that is out of the window at `now_us`: the bucket
    /// for second `s` expires when `s <= now_sec - window_secs`.
    pub fn expire(&mut self, now_us: i64) {
        self.expire_before(now_us.div_euclid(US_PER_SEC));
    }

    /// At most `k` keys with their counts in the window, by count descending
    /// then key ascending, so ties come out in a stable, readable order.
    pub fn top(&self) -> Vec<(String, u64)> {
        let mut all: Vec<(&String, u64)> = self.totals.iter().map(|(k, &c)| (k, c)).collect();
        // Keys are unique, so the order is total and an unstable sort is
        // deterministic.
        all.sort_unstable_by_key(|&(key, c)| (Reverse(c), key));
        all.into_iter()
            .take(self.k)
            .map(|(key, c)| (key.clone(), c))
            .collect()
    }

    /// Removes buckets expired at second `now_sec` and subtracts them from
    /// the totals.
    fn expire_before(&mut self, now_sec: i64) {
        // i128 so a huge `window_secs` cannot overflow the cutoff.
        let cutoff = i128::from(now_sec) - i128::from(self.window_secs);
        while let Some((sec, _)) = self.buckets.front() {
            if i128::from(*sec) > cutoff {
                break;
            }
            let Some((_, bucket)) = self.buckets.pop_front() else {
                break;
            };
            for (key, count) in bucket {
                if let Some(t) = self.totals.get_mut(&key) {
                    *t = t.saturating_sub(count);
                    if *t == 0 {
                        // Zero entries would otherwise pile up forever.
                        self.totals.remove(&key);
                    }
                }
            }
        }
    }
}

/// The top-k statistic: the most frequent values of `topk_field` (a string, a number, an
/// object's `text` — tweet entities look like that — or an array of those) over a sliding
/// window. Snapshot field `top` (`[{"key": .., "count": ..}, ...]`: objects, so the `stats`
/// document holds no array inside an array, which some MongoDB-compatible servers refuse);
/// metric `tailrace_topk_events{key}`,
/// set to 0 for a key that left the top.
///
/// Counted by [`HeavyHitters`]: per-event cost and saved state do not grow with the number
/// of distinct values (exact while a second has at most `topk_capacity` distinct values,
/// within a stated bound beyond). [`TopK`] stays as the exact reference its tests and the
/// `topk` benchmark compare against.
pub struct TopKeys {
    feed: String,
    field: String,
    top: HeavyHitters,
    /// The keys published last time, so the ones that left the top are set to 0.
    published: Vec<String>,
}

impl TopKeys {
    /// The top `config.topk` values of `config.topk_field` over `config.topk_window_secs`.
    pub fn new(config: &StatsConfig, feed: &str) -> Self {
        TopKeys {
            feed: feed.to_string(),
            field: config.topk_field.clone(),
            top: HeavyHitters::new(config.topk, config.topk_window_secs, config.topk_capacity),
            published: Vec::new(),
        }
    }
}

/// A top-k key: a string, a number, or the `text` (Twitter's hashtag entities) or else the
/// `name` (Mastodon's tags, `{"name": "rust", "url": ..}`) of an object.
fn key_of(v: &Value) -> Option<&str> {
    match v {
        Value::String(s) => Some(s),
        Value::Object(o) => o
            .get("text")
            .and_then(Value::as_str)
            .or_else(|| o.get("name").and_then(Value::as_str)),
        _ => None,
    }
}

/// The keys a field's value counts as: each element of an array, or the value itself; strings,
/// numbers (as written) and entity objects ([`key_of`]); anything else counts as nothing.
pub(super) fn keys_of(v: Option<&Value>) -> Vec<Cow<'_, str>> {
    fn one(v: &Value) -> Option<Cow<'_, str>> {
        match v {
            Value::Number(n) => Some(Cow::Owned(n.to_string())),
            v => key_of(v).map(Cow::Borrowed),
        }
    }
    match v {
        Some(Value::Array(items)) => items.iter().filter_map(one).collect(),
        Some(v) => one(v).into_iter().collect(),
        None => Vec::new(),
    }
}

/// Built for every feed; reads `topk_field`.
pub const REGISTRATION: Registration = Registration {
    build: |c, feed| Box::new(TopKeys::new(c, feed)),
    reads: |c| vec![("topk_field", c.topk_field.clone())],
};

impl Statistic for TopKeys {
    fn name(&self) -> &'static str {
        "topk"
    }

    fn on_event(&mut self, e: &Event<'_>) {
        let keys = keys_of(store::update::get_path(e.doc, &self.field));
        self.top.record(e.t_us, keys.iter().map(|k| k.as_ref()));
        self.top.expire(e.t_us);
    }

    fn advance(&mut self, now_us: i64) {
        self.top.expire(now_us);
    }

    fn snapshot(&self, out: &mut Map<String, Value>) {
        let top: Vec<Value> = self
            .top
            .top()
            .into_iter()
            .map(|(key, count)| json!({"key": key, "count": count}))
            .collect();
        out.insert("top".into(), Value::Array(top));
    }

    fn publish(&mut self, figures: &Map<String, Value>) {
        // The list `snapshot` put there: merging the window's counters again would double
        // what a tick costs on a long tail.
        let top: Vec<(&str, f64)> = figures
            .get("top")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|e| Some((e.get("key")?.as_str()?, e.get("count")?.as_f64()?)))
            .collect();
        for gone in self
            .published
            .iter()
            .filter(|g| !top.iter().any(|(k, _)| k == g))
        {
            metrics::gauge!(t::TOPK, "feed" => self.feed.clone(), "key" => gone.clone()).set(0.0);
        }
        for &(k, n) in &top {
            metrics::gauge!(t::TOPK, "feed" => self.feed.clone(), "key" => k.to_string()).set(n);
        }
        self.published = top.into_iter().map(|(k, _)| k.to_string()).collect();
    }

    fn save(&self) -> Value {
        to_state(&self.top)
    }

    fn restore(&mut self, state: &Value) -> Result<(), String> {
        self.top = from_state(state)?;
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000;

    fn owned(v: &[(&str, u64)]) -> Vec<(String, u64)> {
        v.iter().map(|&(k, c)| (k.to_string(), c)).collect()
    }

    /// Totals must always equal the sum of the buckets, without zeros.
    fn assert_consistent(t: &TopK) {
        let mut sum: BTreeMap<String, u64> = BTreeMap::new();
        for (_, b) in &t.buckets {
            for (k, c) in b {
                *sum.entry(k.clone()).or_insert(0) += c;
            }
        }
        assert_eq!(t.totals, sum, "totals vs sum of buckets");
        assert!(
            t.totals.values().all(|&c| c > 0),
            "zero entries in totals: {:?}",
            t.totals
        );
    }

    #[test]
    fn orders_by_count_then_key() {
        let mut t = TopK::new(10, 60);
        // Counted by hand: c 5, a 3, b 3, d 1.
        t.record(0, ["c", "a", "b", "c", "d"]);
        t.record(S, ["b", "c", "a"]);
        t.record(2 * S, ["c", "a", "b", "c"]);
        assert_eq!(
            t.top(),
            owned(&[("c", 5), ("a", 3), ("b", 3), ("d", 1)]),
            "ties (a, b) must be ordered by key"
        );
        assert_consistent(&t);
    }

    #[test]
    fn truncates_to_k() {
        let mut t = TopK::new(2, 60);
        t.record(0, ["x", "y", "y", "z", "z", "z", "w"]);
        assert_eq!(t.top(), owned(&[("z", 3), ("y", 2)]), "k = 2");
        let mut none = TopK::new(0, 60);
        none.record(0, ["x"]);
        assert_eq!(none.top(), owned(&[]), "k = 0 reports nothing");
    }

    #[test]
    fn case_folds_keys() {
        let mut t = TopK::new(10, 60);
        t.record(0, ["Rust", "RUST", "rust", "Ünïcode", "üNÏCODE"]);
        assert_eq!(
            t.top(),
            owned(&[("rust", 3), ("ünïcode", 2)]),
            "keys must be lowercased and merged"
        );
    }

    #[test]
    fn keys_expire_after_window() {
        let mut t = TopK::new(10, 60);
        t.record(0, ["old"]);
        t.record(30 * S, ["new"]);
        t.expire(59 * S + 999_999);
        assert_eq!(t.top(), owned(&[("new", 1), ("old", 1)]), "at 59.999 s");
        // Bucket 0 expires at second 60 (0 <= 60 - 60).
        t.expire(60 * S);
        assert_eq!(t.top(), owned(&[("new", 1)]), "at 60 s");
        assert_consistent(&t);
        t.expire(90 * S);
        assert_eq!(t.top(), owned(&[]), "at 90 s");
        assert!(t.totals.is_empty(), "totals must be empty: {:?}", t.totals);
        assert!(t.buckets.is_empty(), "buckets must be empty");
    }

    #[test]
    fn partial_expiry_keeps_remaining_counts() {
        let mut t = TopK::new(10, 10);
        t.record(0, ["a", "b"]);
        t.record(5 * S, ["a"]);
        t.expire(10 * S);
        assert_eq!(t.top(), owned(&[("a", 1)]), "b gone, a down to 1");
        assert_consistent(&t);
    }

    #[test]
    fn out_of_order_goes_into_newest_bucket() {
        let mut t = TopK::new(10, 60);
        t.record(100 * S, ["a"]);
        t.record(50 * S, ["b"]);
        // Had "b" gone into a bucket for second 50 it would expire at 110.
        t.expire(159 * S);
        assert_eq!(t.top(), owned(&[("a", 1), ("b", 1)]), "at 159 s");
        assert_eq!(t.buckets.len(), 1, "one bucket expected");
        t.expire(160 * S);
        assert_eq!(t.top(), owned(&[]), "at 160 s");
    }

    #[test]
    fn record_keeps_state_bounded() {
        let mut t = TopK::new(10, 60);
        for s in 0..1_000 {
            t.record(s * S, ["tick"]);
        }
        assert_eq!(t.buckets.len(), 60, "buckets bounded by the window");
        assert_eq!(t.top(), owned(&[("tick", 60)]), "count in window");
        assert_consistent(&t);
    }

    #[test]
    fn empty_keys_change_nothing() {
        let mut t = TopK::new(10, 60);
        let fresh = t.clone();
        t.record(0, Vec::<&str>::new());
        t.record(0, [""]);
        assert_eq!(t, fresh, "no bucket for an event without keys");
        t.record(0, ["", "a"]);
        assert_eq!(t.top(), owned(&[("a", 1)]), "empty key skipped");
    }

    #[test]
    fn zero_window_keeps_nothing() {
        let mut t = TopK::new(10, 0);
        t.record(0, ["a"]);
        assert_eq!(t.top(), owned(&[]), "window 0 holds no whole second");
        let mut big = TopK::new(10, u64::MAX);
        big.record(i64::MIN, ["a"]);
        big.expire(i64::MAX);
        assert_eq!(
            big.top(),
            owned(&[("a", 1)]),
            "huge window must not overflow"
        );
    }

    #[test]
    fn checkpoint_round_trip_matches_uninterrupted_run() {
        let tags = ["Rust", "tokio", "serde", "RUST", "async", "Tokio"];
        let events: Vec<(i64, Vec<&str>)> = (0..300_i64)
            .map(|i| {
                // Skewed, bursty timestamps and a varying subset of tags.
                let t = i * 450_000 - (i % 4) * 2_000_000;
                let keys = (0..tags.len())
                    .filter(|j| !(i as usize + j).is_multiple_of(3) && (i as usize * j) % 5 != 1)
                    .map(|j| tags[j])
                    .collect();
                (t, keys)
            })
            .collect();
        let run = |t: &mut TopK, evs: &[(i64, Vec<&str>)]| -> Vec<Vec<(String, u64)>> {
            evs.iter()
                .map(|(ts, keys)| {
                    t.record(*ts, keys.iter().copied());
                    t.expire(*ts);
                    t.top()
                })
                .collect()
        };
        let mut straight = TopK::new(3, 20);
        let expected = run(&mut straight, &events);

        let mut first = TopK::new(3, 20);
        let mut seen = run(&mut first, &events[..150]);
        let json = serde_json::to_string(&first).unwrap();
        let mut restored: TopK = serde_json::from_str(&json).unwrap();
        assert_eq!(restored, first, "restored state vs saved state");
        seen.extend(run(&mut restored, &events[150..]));
        assert_eq!(seen, expected, "restored run vs uninterrupted run");
        assert_eq!(restored, straight, "final state");
        assert_consistent(&restored);
    }

    #[test]
    fn the_statistic_reads_strings_numbers_and_entity_texts() {
        let config = StatsConfig {
            topk_field: "entities.hashtags".into(),
            ..StatsConfig::default()
        };
        let mut stat = TopKeys::new(&config, "test");
        let doc = serde_json::json!({"entities": {"hashtags": ["A", {"text": "b"}, 5, null, {"no": "text"}]}});
        let doc = doc.as_object().unwrap();
        stat.on_event(&Event {
            t_us: 0,
            stamp: None,
            doc,
        });
        let single = serde_json::json!({"entities": {"hashtags": "東京"}});
        stat.on_event(&Event {
            t_us: 1,
            stamp: None,
            doc: single.as_object().unwrap(),
        });
        let mut out = Map::new();
        stat.snapshot(&mut out);
        assert_eq!(
            out["top"],
            json!([
                {"key": "5", "count": 1},
                {"key": "a", "count": 1},
                {"key": "b", "count": 1},
                {"key": "東京", "count": 1},
            ]),
            "every usable element counted once, case-folded"
        );
    }

    #[test]
    fn mastodon_tags_count_by_their_name() {
        let config = StatsConfig {
            topk_field: "tags".into(),
            ..StatsConfig::default()
        };
        let mut stat = TopKeys::new(&config, "test");
        let statuses = [
            json!({"tags": [
                {"name": "rust", "url": "https://mastodon.social/tags/rust"},
                {"name": "Fediverse", "url": "https://mastodon.social/tags/fediverse"},
            ]}),
            json!({"tags": [{"name": "rust", "url": "https://x/tags/rust"}, {"url": "no name"}]}),
            json!({"tags": [{"text": "wins", "name": "loses"}, {"name": 7}]}),
            json!({"tags": []}),
        ];
        for (i, s) in statuses.iter().enumerate() {
            stat.on_event(&Event {
                t_us: i as i64,
                stamp: None,
                doc: s.as_object().unwrap(),
            });
        }
        let mut out = Map::new();
        stat.snapshot(&mut out);
        assert_eq!(
            out["top"],
            json!([
                {"key": "rust", "count": 2},
                {"key": "fediverse", "count": 1},
                {"key": "wins", "count": 1},
            ]),
            "tags counted by name (case-folded); `text` first when both exist; no name, no key"
        );
    }
}
