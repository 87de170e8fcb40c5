//! Unit tests of `heavy_hitters.rs`.

use super::*;
use crate::stats::topk::TopK;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, Exp, Zipf};
use std::collections::HashMap;
use std::collections::HashSet;
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
    let run = |t: &mut HeavyHitters, range: Range<usize>| -> Vec<(u64, Option<Vec<Estimate>>)> {
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
