//! Unit tests of `realistic.rs`.

use std::collections::{HashMap, HashSet};
use std::sync::OnceLock;

use super::*;

const CREATED: &str = "2024-05-01T12:00:00.000Z";
/// Events of the distribution checks: enough for tails, small enough for a debug build.
const EVENTS: usize = 200_000;

fn strip_created(mut v: Value) -> Value {
    v.as_object_mut().unwrap().remove("created_at");
    v
}

#[test]
fn same_seed_same_events_other_seed_other_events() {
    let (mut a, mut b) = (
        Realistic::new(7, Shape::default()),
        Realistic::new(7, Shape::default()),
    );
    for i in 0..2_000 {
        let (x, y) = (a.event(CREATED), b.event("2030-01-01T00:00:00.000Z"));
        assert_eq!(
            strip_created(x),
            strip_created(y),
            "event {i} of two generators seeded 7 differ"
        );
    }
    let mut a = Realistic::new(7, Shape::default());
    let mut c = Realistic::new(8, Shape::default());
    let differ = (0..100)
        .filter(|_| a.event(CREATED)["text"] != c.event(CREATED)["text"])
        .count();
    assert_eq!(
        differ,
        100,
        "seeds 7 and 8 gave {} equal texts of 100",
        100 - differ
    );
}

/// Latin letters: Basic Latin to Latin Extended-B, IPA, combining diacritics (they go on
/// Latin letters here), Latin Extended Additional.
fn is_latin(c: char) -> bool {
    matches!(c as u32, 0..=0x2AF | 0x300..=0x36F | 0x1E00..=0x1EFF)
}

/// Code points only emoji sequences use in these texts.
fn is_emoji(c: char) -> bool {
    matches!(
        c as u32,
        0x1F000..=0x1FAFF | 0x2764 | 0x2728 | 0x263A | 0x20E3 | 0x2B1B
    )
}

fn is_combining(c: char) -> bool {
    matches!(
        c as u32,
        0x300..=0x36F
            | 0x5B0..=0x5C7
            | 0x64B..=0x652
            | 0x900..=0x903
            | 0x93A..=0x94F
            | 0xE31
            | 0xE34..=0xE3A
            | 0xE47..=0xE4E
    )
}

/// Features a text can hold: bit `i` of [`features`] is `FEATURES[i]`.
const FEATURES: [&str; 18] = [
    "hebrew",
    "arabic",
    "persian",
    "han",
    "kana",
    "hangul",
    "thai",
    "devanagari",
    "cyrillic",
    "greek",
    "zwj",
    "skin tone",
    "regional indicator",
    "tag sequence",
    "combining mark",
    "line break",
    "invisible",
    "emoji",
];

/// The features of [`FEATURES`] one character shows. (`matches!` on code points: range
/// methods are calls in a debug build, and this runs on every character of the sample.)
fn features(c: char) -> u32 {
    let bit = |on: bool, i: u32| u32::from(on) << i;
    let u = c as u32;
    bit(matches!(u, 0x5D0..=0x5EA), 0)
        | bit(matches!(u, 0x620..=0x64A), 1)
        | bit(matches!(c, 'پ' | 'چ' | 'ژ' | 'گ'), 2)
        | bit(matches!(u, 0x4E00..=0x9FFF), 3)
        | bit(matches!(u, 0x3041..=0x30FF), 4)
        | bit(matches!(u, 0xAC00..=0xD7A3), 5)
        | bit(matches!(u, 0xE01..=0xE5B), 6)
        | bit(matches!(u, 0x900..=0x97F), 7)
        | bit(matches!(u, 0x400..=0x4FF), 8)
        | bit(matches!(u, 0x370..=0x3FF), 9)
        | bit(u == 0x200D, 10)
        | bit(matches!(u, 0x1F3FB..=0x1F3FF), 11)
        | bit(matches!(u, 0x1F1E6..=0x1F1FF), 12)
        | bit(u == 0xE007F, 13)
        | bit(is_combining(c), 14)
        | bit(c == '\n', 15)
        | bit(matches!(u, 0x200B | 0x200E | 0x200F | 0xA0 | 0x3000), 16)
        | bit(is_emoji(c), 17)
}

/// One pass over a text: the features it holds (bits of [`FEATURES`]) and whether its
/// words — tokens that are not hashtags, mentions or links — hold a non-Latin letter.
fn scan(text: &str) -> (u32, bool) {
    let (mut bits, mut foreign) = (0u32, false);
    let mut token_start = true;
    let mut skip = false;
    for (i, c) in text.char_indices() {
        if c.is_ascii() {
            bits |= u32::from(c == '\n') << 15;
        } else {
            bits |= features(c);
        }
        if c.is_whitespace() || c == '\u{200B}' {
            token_start = true;
            continue;
        }
        if token_start {
            skip = c == '#' || c == '@' || text[i..].starts_with("https://");
            token_start = false;
        }
        foreign |= !skip && c.is_alphabetic() && !is_latin(c);
    }
    (bits, foreign)
}

/// What 200,000 default events look like, computed once for the tests that read it.
struct Sample {
    events: u64,
    tag_uses: u64,
    tags: HashMap<String, u64>,
    users: HashMap<String, u64>,
    /// Events whose words (not tags or mentions) hold a non-Latin letter.
    non_latin_words: u64,
    /// Latin-language events whose words hold a non-Latin letter (should be none).
    foreign_in_latin: Vec<String>,
    longest: usize,
    longest_text: String,
    at_most_10: u64,
    at_least_240: u64,
    /// Events holding each feature of [`FEATURES`], by name.
    present: HashMap<&'static str, u64>,
    /// Events with decomposed Latin (a base letter, then a combining acute or tilde).
    nfd: u64,
}

fn count(map: &mut HashMap<String, u64>, key: &str) {
    match map.get_mut(key) {
        Some(n) => *n += 1,
        None => {
            map.insert(key.to_owned(), 1);
        }
    }
}

fn sample() -> &'static Sample {
    static SAMPLE: OnceLock<Sample> = OnceLock::new();
    SAMPLE.get_or_init(|| {
        let mut g = Realistic::new(2024, Shape::default());
        let mut s = Sample {
            events: 0,
            tag_uses: 0,
            tags: HashMap::with_capacity(150_000),
            users: HashMap::with_capacity(200_000),
            non_latin_words: 0,
            foreign_in_latin: Vec::new(),
            longest: 0,
            longest_text: String::new(),
            at_most_10: 0,
            at_least_240: 0,
            present: HashMap::new(),
            nfd: 0,
        };
        let mut feature_events = [0u64; FEATURES.len()];
        for _ in 0..EVENTS {
            let e = g.event(CREATED);
            s.events += 1;
            for t in e["hashtags"].as_array().unwrap() {
                count(&mut s.tags, t.as_str().unwrap());
                s.tag_uses += 1;
            }
            count(&mut s.users, e["user"]["screen_name"].as_str().unwrap());
            let text = e["text"].as_str().unwrap();
            let n = text.chars().count();
            if n > s.longest {
                s.longest = n;
                s.longest_text = text.to_owned();
            }
            s.at_most_10 += u64::from(n <= 10);
            s.at_least_240 += u64::from(n >= 240);
            let (bits, foreign) = scan(text);
            for (bit, events) in feature_events.iter_mut().enumerate() {
                *events += u64::from(bits & (1 << bit) != 0);
            }
            s.non_latin_words += u64::from(foreign);
            let lang = e["lang"].as_str().unwrap();
            if foreign && tables::LANGS[lang_index(lang).unwrap()].script == Script::Latin {
                s.foreign_in_latin.push(text.to_owned());
            }
            if text.contains("e\u{301}") || text.contains("a\u{303}") || text.contains("a\u{301}") {
                s.nfd += 1;
            }
        }
        s.present = FEATURES.into_iter().zip(feature_events).collect();
        s
    })
}

/// Σ_{k=1..n} k^-s, smallest terms first for accuracy.
fn harmonic(n: u64, s: f64) -> f64 {
    (1..=n).rev().map(|k| (k as f64).powf(-s)).sum()
}

/// Expected distinct values among `draws` independent Zipf(n, s) draws:
/// Σ_k 1 - (1 - p_k)^draws.
fn expected_distinct(n: u64, s: f64, h: f64, draws: u64) -> f64 {
    (1..=n)
        .map(|k| {
            let p = (k as f64).powf(-s) / h;
            -((draws as f64) * (-p).ln_1p()).exp_m1()
        })
        .sum()
}

/// Least-squares slope of log(count) against log(rank), ranks 1..=max_rank taken at
/// geometric steps so that each decade weighs the same.
fn loglog_slope(counts: &HashMap<String, u64>, max_rank: usize) -> f64 {
    let mut sorted: Vec<u64> = counts.values().copied().collect();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    let mut points = Vec::new();
    let mut r = 1.0f64;
    let mut last = 0;
    while (r as usize) <= max_rank.min(sorted.len()) {
        let k = r as usize;
        if k != last {
            points.push(((k as f64).ln(), (sorted[k - 1] as f64).ln()));
            last = k;
        }
        r *= 1.15;
    }
    let n = points.len() as f64;
    let (mx, my) = (
        points.iter().map(|p| p.0).sum::<f64>() / n,
        points.iter().map(|p| p.1).sum::<f64>() / n,
    );
    let sxy: f64 = points.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    let sxx: f64 = points.iter().map(|(x, _)| (x - mx) * (x - mx)).sum();
    sxy / sxx
}

/// Checks a Zipf-drawn vocabulary against the law it was drawn from: the share of the
/// top value, the number of distinct values, the rank-frequency slope.
fn check_zipf(what: &str, counts: &HashMap<String, u64>, draws: u64, n: u64, s: f64) {
    let h = harmonic(n, s);
    let p1 = 1.0 / h;
    let top = *counts.values().max().unwrap() as f64 / draws as f64;
    let sigma = (p1 * (1.0 - p1) / draws as f64).sqrt();
    assert!(
        (top - p1).abs() < 5.0 * sigma,
        "{what}: the top value should take 1/H = {p1:.4} of {draws} draws (±{:.4}), took {top:.4}",
        5.0 * sigma
    );
    let distinct = counts.len() as f64;
    let expected = expected_distinct(n, s, h, draws);
    // The variance of a count of distinct values is below its mean.
    let tolerance = 5.0 * expected.sqrt();
    assert!(
        (distinct - expected).abs() < tolerance,
        "{what}: expected {expected:.0} ± {tolerance:.0} distinct among {draws} draws, saw {distinct}"
    );
    // Ranks whose expected count is at least 50, so sampling noise stays small.
    let max_rank = ((draws as f64 * p1 / 50.0).powf(1.0 / s)) as usize;
    let slope = loglog_slope(counts, max_rank);
    // Over seeds 1..=12 the slope stayed within 0.02 of -s for tags and users.
    assert!(
        (slope + s).abs() < 0.05,
        "{what}: rank-frequency slope over ranks 1..={max_rank} should be -{s} ± 0.05, was {slope:.3}"
    );
}

#[test]
fn hashtags_follow_the_configured_zipf_law() {
    let s = sample();
    let shape = Shape::default();
    assert!(
        s.tags.len() > 50_000,
        "a long tail: over 50,000 distinct hashtags in {} events, saw {}",
        s.events,
        s.tags.len()
    );
    let weights = &shape.tags_per_event;
    let mean_tags: f64 = weights
        .iter()
        .enumerate()
        .map(|(k, w)| k as f64 * w)
        .sum::<f64>()
        / weights.iter().sum::<f64>();
    let per_event = s.tag_uses as f64 / s.events as f64;
    assert!(
        (per_event - mean_tags).abs() < 0.02,
        "tags per event should average {mean_tags:.3}, averaged {per_event:.3}"
    );
    check_zipf(
        "hashtags",
        &s.tags,
        s.tag_uses,
        shape.hashtags,
        shape.hashtag_exponent,
    );
}

#[test]
fn authors_follow_the_configured_zipf_law() {
    let s = sample();
    let shape = Shape::default();
    assert!(
        s.users.len() > 50_000,
        "a long tail: over 50,000 distinct authors in {} events, saw {}",
        s.events,
        s.users.len()
    );
    check_zipf(
        "authors",
        &s.users,
        s.events,
        shape.users,
        shape.user_exponent,
    );
}

#[test]
fn texts_fit_a_tweet_and_mix_scripts_and_emoji_in_the_configured_shares() {
    let s = sample();
    let shape = Shape::default();
    assert!(
        s.longest <= MAX_TEXT_CHARS,
        "no text over 280 chars; the longest has {}: {:?}",
        s.longest,
        s.longest_text
    );
    assert!(
        s.at_most_10 > 0 && s.longest >= 270,
        "lengths from a few chars to the limit: {} texts of ≤ 10 chars, longest {}",
        s.at_most_10,
        s.longest
    );
    // Width-1 languages with words write at-limit texts of 250..=280 chars; the last word
    // that does not fit costs at most ~10.
    let total: f64 = shape.languages.iter().map(|(_, w)| w).sum();
    let wide_words: f64 = shape
        .languages
        .iter()
        .filter(|(code, _)| {
            let l = &tables::LANGS[lang_index(code).unwrap()];
            l.width == 1 && l.script != Script::None
        })
        .map(|(_, w)| w)
        .sum::<f64>()
        / total;
    let floor = 0.8 * shape.at_limit_share * wide_words * s.events as f64;
    assert!(
        s.at_least_240 as f64 > floor,
        "at least {floor:.0} texts of ≥ 240 chars (the at-limit share), saw {}",
        s.at_least_240
    );

    assert!(
        s.foreign_in_latin.is_empty(),
        "{} Latin-language texts have non-Latin words, e.g. {:?}",
        s.foreign_in_latin.len(),
        s.foreign_in_latin.first()
    );
    let non_latin: f64 = shape
        .languages
        .iter()
        .filter(|(code, _)| {
            !matches!(
                tables::LANGS[lang_index(code).unwrap()].script,
                Script::Latin | Script::None
            )
        })
        .map(|(_, w)| w)
        .sum::<f64>()
        / total;
    let share = s.non_latin_words as f64 / s.events as f64;
    let sigma = (non_latin * (1.0 - non_latin) / s.events as f64).sqrt();
    assert!(
        (share - non_latin).abs() < 5.0 * sigma,
        "{non_latin:.4} of events should have words in a non-Latin script (±{:.4}), saw {share:.4}",
        5.0 * sigma
    );

    let p = shape.emoji_share;
    let share = s.present["emoji"] as f64 / s.events as f64;
    let sigma = (p * (1.0 - p) / s.events as f64).sqrt();
    assert!(
        (share - p).abs() < 5.0 * sigma,
        "{p} of events should carry emoji (±{:.4}), saw {share:.4}",
        5.0 * sigma
    );

    for feature in FEATURES {
        let n = s.present[feature];
        assert!(
            n > 0,
            "some texts should hold {feature}; none of {} did",
            s.events
        );
    }
    assert!(
        s.nfd > 0,
        "some Latin texts should be decomposed (NFD); none were"
    );
}

/// Whether `#tag` occurs in `text` as a whole hashtag: what follows it cannot continue it.
fn tag_in_text(tag: &str, text: &str) -> bool {
    let needle = format!("#{tag}");
    text.match_indices(&needle).any(|(at, _)| {
        text[at + needle.len()..]
            .chars()
            .next()
            .is_none_or(|c| !(c == '_' || c.is_alphanumeric() || is_combining(c)))
    })
}

fn depth(v: &Value) -> usize {
    match v {
        Value::Object(m) => 1 + m.values().map(depth).max().unwrap_or(0),
        Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

fn keys_are_plain(v: &Value) -> Result<(), String> {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                if k.starts_with('$') || k.contains('.') {
                    return Err(k.clone());
                }
                keys_are_plain(v)?;
            }
            Ok(())
        }
        Value::Array(a) => a.iter().try_for_each(keys_are_plain),
        _ => Ok(()),
    }
}

#[test]
fn documents_keep_the_tweet_shape_and_survive_json() {
    let mut g = Realistic::new(99, Shape::default());
    let mut prev_id = 0;
    let mut by_name: HashMap<String, (u64, u64)> = HashMap::new();
    let mut names_by_id: HashMap<u64, String> = HashMap::new();
    let mut with_coordinates = 0;
    for i in 0..20_000 {
        let e = g.event(CREATED);
        let bytes = serde_json::to_vec(&e).unwrap();
        let mut back: Value = serde_json::from_slice(&bytes).unwrap();
        // serde_json's default float parser may be one ulp off (its `float_roundtrip`
        // feature is off): coordinates are compared within 1e-9 degrees, the rest exactly.
        let mut sent = e.clone();
        let (a, b) = (sent.as_object_mut().unwrap(), back.as_object_mut().unwrap());
        match (a.remove("coordinates"), b.remove("coordinates")) {
            (None, None) => {}
            (Some(x), Some(y)) => {
                for k in 0..2 {
                    let (x, y) = (
                        x["coordinates"][k].as_f64().unwrap(),
                        y["coordinates"][k].as_f64().unwrap(),
                    );
                    assert!(
                        (x - y).abs() < 1e-9,
                        "event {i}: coordinate {x} came back {y}"
                    );
                }
            }
            (x, y) => panic!("event {i}: coordinates {x:?} came back {y:?}"),
        }
        assert_eq!(back, sent, "event {i} changed through JSON");
        if let Err(key) = keys_are_plain(&e) {
            panic!("event {i} has key {key:?}, starting with $ or holding a dot");
        }
        assert!(depth(&e) <= 3, "event {i} nests {} deep: {e}", depth(&e));

        let id = e["id"].as_u64().unwrap();
        assert!(id > prev_id, "ids increase: {id} after {prev_id}");
        prev_id = id;
        assert_eq!(e["id_str"], id.to_string(), "id_str is id as text");
        assert_eq!(e["created_at"], CREATED, "created_at is stored as given");
        assert!(e["retweet_count"].as_u64().unwrap() <= 10_000_000);

        let user = &e["user"];
        let name = user["screen_name"].as_str().unwrap();
        let uid = user["id"].as_u64().unwrap();
        let followers = user["followers_count"].as_u64().unwrap();
        assert!(
            !name.is_empty()
                && name.len() <= MAX_SCREEN_NAME
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'),
            "screen names are Twitter's [A-Za-z0-9_]{{1,15}}: {name:?}"
        );
        assert!(uid < 1 << 63, "user ids fit a signed 64-bit integer: {uid}");
        let seen = by_name.entry(name.to_owned()).or_insert((uid, followers));
        assert_eq!(
            *seen,
            (uid, followers),
            "user {name} keeps its id and followers"
        );
        let seen = names_by_id.entry(uid).or_insert_with(|| name.to_owned());
        assert_eq!(seen, name, "user id {uid} keeps its name");

        let lang = e["lang"].as_str().unwrap();
        assert!(lang_index(lang).is_some(), "unknown lang {lang}");
        let text = e["text"].as_str().unwrap();
        assert!(!text.is_empty(), "event {i} has an empty text");
        assert!(
            text.chars().count() <= MAX_TEXT_CHARS,
            "{text:?} is over 280 chars"
        );
        let first = text.chars().next().unwrap();
        assert!(
            !is_combining(first),
            "a text does not start with a dangling combining mark: {text:?}"
        );
        for c in text.chars() {
            assert!(
                c == '\n'
                    || !(c.is_control() || matches!(c as u32, 0xFFFE | 0xFFFF | 0xFDD0..=0xFDEF)),
                "no control characters or noncharacters: U+{:04X} in {text:?}",
                c as u32
            );
        }
        for tag in e["hashtags"].as_array().unwrap() {
            let tag = tag.as_str().unwrap();
            assert!(
                tag_in_text(tag, text),
                "hashtag {tag:?} is in the text, ended by a non-word character: {text:?}"
            );
            assert!(
                !tag.is_empty()
                    && tag
                        .chars()
                        .all(|c| c == '_' || c.is_alphanumeric() || is_combining(c)),
                "hashtags hold letters, digits, marks and _ only: {tag:?}"
            );
        }
        if let Some(c) = e.get("coordinates") {
            with_coordinates += 1;
            assert_eq!(c["type"], "Point");
            let (lon, lat) = (
                c["coordinates"][0].as_f64().unwrap(),
                c["coordinates"][1].as_f64().unwrap(),
            );
            assert!(
                (-180.0..=180.0).contains(&lon) && (-90.0..=90.0).contains(&lat),
                "coordinates out of range: {c}"
            );
        }
    }
    // 2% of 20,000: 400 ± 5σ (σ ≈ 20).
    assert!(
        (300..=500).contains(&with_coordinates),
        "about 2% of events carry coordinates, saw {with_coordinates} of 20000"
    );
}

#[test]
fn names_and_ids_are_distinct_per_rank_even_ignoring_case() {
    let shape = Shape::default();
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(5);
    let ranks: Vec<u64> = (1..=60_000)
        .chain((0..30_000).map(|_| rng.random_range(1..=shape.hashtags)))
        .collect::<HashSet<u64>>()
        .into_iter()
        .collect();
    let tags: HashSet<String> = ranks.iter().map(|&r| hashtag(r).to_lowercase()).collect();
    assert_eq!(
        tags.len(),
        ranks.len(),
        "hashtags of distinct ranks collide (lowercased)"
    );
    let names: HashSet<String> = ranks
        .iter()
        .map(|&r| screen_name(r, shape.users).to_lowercase())
        .collect();
    assert_eq!(
        names.len(),
        ranks.len(),
        "screen names of distinct ranks collide"
    );
    let ids: HashSet<u64> = ranks.iter().map(|&r| user_id(r)).collect();
    assert_eq!(ids.len(), ranks.len(), "user ids of distinct ranks collide");
    for table in &TABLES.tags {
        let unique: HashSet<&Box<str>> = table.iter().collect();
        assert_eq!(
            unique.len(),
            table.len(),
            "a tag syllable table has duplicates"
        );
    }
    for word in tables::TAG_WORDS {
        let lower = word.to_lowercase();
        let cv = lower.len() % 2 == 0
            && lower.as_bytes().chunks(2).all(|p| {
                tables::LATIN_NAME_CONSONANTS.as_bytes().contains(&p[0]) && b"aeiou".contains(&p[1])
            });
        assert!(
            !cv,
            "tag word {word:?} reads as name syllables: tags could collide"
        );
    }
    // Frequent tags are short, as real ones are.
    let short = (1..=100)
        .filter(|&r| hashtag(r).chars().count() <= 6)
        .count();
    assert!(
        short >= 60,
        "most of the top 100 tags have ≤ 6 chars, {short} did"
    );
}

#[test]
fn a_shape_reports_every_problem_and_a_broken_one_still_generates() {
    assert_eq!(
        Shape::default().validate(),
        Ok(()),
        "the default shape is valid"
    );
    let broken = Shape {
        hashtags: 0,
        user_exponent: f64::NAN,
        emoji_share: 1.5,
        tags_per_event: vec![0.0, -1.0],
        languages: vec![("xx".into(), 1.0)],
        ..Shape::default()
    };
    let problems = broken.validate().unwrap_err();
    let fields: Vec<String> = problems
        .iter()
        .map(|p| match p {
            ShapeError::OutOfRange { field, .. } | ShapeError::Weights { field } => {
                (*field).to_owned()
            }
            ShapeError::UnknownLanguage { code, .. } => code.clone(),
        })
        .collect();
    assert_eq!(
        fields,
        [
            "hashtags",
            "user_exponent",
            "emoji_share",
            "tags_per_event",
            "xx"
        ],
        "every problem, in field order: {problems:?}"
    );
    let mut g = Realistic::new(1, broken);
    assert_eq!(g.shape().hashtags, 1, "hashtags clamped to 1");
    assert_eq!(
        g.shape().languages,
        Shape::default().languages,
        "unknown languages dropped"
    );
    for _ in 0..200 {
        let e = g.event(CREATED);
        assert!(e["text"].as_str().unwrap().chars().count() <= MAX_TEXT_CHARS);
    }

    // Everything at its maximum: 40 tags, 3 mentions, emoji, links, at-limit texts in
    // the widest scripts. Tags that cannot fit leave the text and the array together.
    let extreme = Shape {
        hashtags: 1 << 40,
        hashtag_exponent: 0.0,
        tags_per_event: [vec![0.0; 40], vec![1.0]].concat(),
        mentions_per_event: vec![0.0, 0.0, 0.0, 1.0],
        emoji_share: 1.0,
        url_share: 1.0,
        at_limit_share: 1.0,
        zalgo_share: 1.0,
        decomposed_share: 1.0,
        languages: vec![("hi".into(), 1.0), ("th".into(), 1.0), ("en".into(), 1.0)],
        ..Shape::default()
    };
    assert_eq!(extreme.validate(), Ok(()));
    let mut g = Realistic::new(3, extreme);
    for _ in 0..2_000 {
        let e = g.event(CREATED);
        let text = e["text"].as_str().unwrap();
        assert!(
            text.chars().count() <= MAX_TEXT_CHARS,
            "{} chars: {text:?}",
            text.chars().count()
        );
        let tags = e["hashtags"].as_array().unwrap();
        assert!(
            !tags.is_empty() && tags.len() < 40,
            "some of 40 tags fit, {} kept",
            tags.len()
        );
        for tag in tags {
            let tag = tag.as_str().unwrap();
            assert!(
                tag_in_text(tag, text),
                "hashtag {tag:?} is in the text: {text:?}"
            );
        }
    }
}

/// `cargo test --release -p ingest --lib realistic::tests::speed -- --ignored --nocapture`
#[test]
#[ignore = "a measurement: run it in release and read its output"]
fn speed() {
    use std::time::Instant;
    let n = 1_000_000;
    let mut g = Realistic::new(1, Shape::default());
    let start = Instant::now();
    let mut bytes = 0usize;
    let mut lengths = Vec::with_capacity(n);
    for _ in 0..n {
        let e = g.event(CREATED);
        lengths.push(e["text"].as_str().map_or(0, |t| t.chars().count()));
        bytes += std::hint::black_box(&e).as_object().map_or(0, |m| m.len());
    }
    let realistic = start.elapsed();
    let mut old = super::super::synthetic::Generator::new(1);
    let start = Instant::now();
    for _ in 0..n {
        bytes += std::hint::black_box(old.event())
            .as_object()
            .map_or(0, |m| m.len());
    }
    let small = start.elapsed();
    let json: usize = (0..10_000)
        .map(|_| serde_json::to_vec(&g.event(CREATED)).unwrap().len())
        .sum();
    lengths.sort_unstable();
    let q = |p: f64| lengths[((n as f64 - 1.0) * p) as usize];
    println!(
        "realistic: {:.0} ns/event; synthetic (small vocabulary): {:.0} ns/event ({n} events each, {bytes} fields)",
        realistic.as_nanos() as f64 / n as f64,
        small.as_nanos() as f64 / n as f64,
    );
    println!(
        "text chars p10 {} p50 {} p90 {} p99 {} max {}; JSON {:.0} bytes/event",
        q(0.1),
        q(0.5),
        q(0.9),
        q(0.99),
        q(1.0),
        json as f64 / 10_000.0
    );
}
