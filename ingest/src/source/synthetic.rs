//! A synthetic tweet-like stream: Poisson arrivals at a mean rate, occasional bursts, seeded
//! for reproducibility. The default source, so `cargo run` shows a live pipeline at once.
//!
//! Two vocabularies (`vocabulary = "..."`):
//! - `realistic` (the default): the [`realistic`](super::realistic) generator — hashtags and
//!   users drawn from Zipf laws over millions of distinct values (`hashtags`, `users`), texts
//!   of tweet-like lengths in twenty-one languages and their scripts, emoji, RTL, combining
//!   marks. What a real stream stresses (index and top-k cardinality, Unicode) is stressed.
//! - `small`: 24 hashtags, 5,000 users named `user<N>`, English-like words (the [`Generator`]
//!   below): a stream whose values are easy to read and to query by hand.
//!
//! Both write the same fields (`id`, `id_str`, `created_at`, `user {id, screen_name,
//! followers_count}`, `lang`, `text`, `hashtags`, `retweet_count`, sometimes `coordinates`).
//! With a `seed`, the events and their arrival gaps are the same on every run.

use std::time::{Duration, SystemTime};

use futures::stream::{BoxStream, StreamExt};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde_json::{Value, json};
use tokio::time::Instant;

use serde::{Deserialize, Serialize};

use super::realistic::{MAX_VOCABULARY, Realistic, Shape};
use super::{BuildContext, Raw, Source, SourceError, SourceSettings};
use crate::config::problems::Problems;

/// Which words, hashtags and users a synthetic stream draws from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Vocabulary {
    /// Long-tailed hashtags and users, many scripts: the shape of a real sample stream.
    #[default]
    Realistic,
    /// 24 hashtags, 5,000 `user<N>` accounts, English-like words.
    Small,
}

impl Vocabulary {
    /// The name used in the config file.
    pub fn as_str(self) -> &'static str {
        match self {
            Vocabulary::Realistic => "realistic",
            Vocabulary::Small => "small",
        }
    }
}

const LANGS: [(&str, u32); 8] = [
    ("en", 50),
    ("ja", 15),
    ("es", 10),
    ("pt", 7),
    ("ar", 5),
    ("ko", 4),
    ("fr", 4),
    ("und", 5),
];
const HASHTAGS: [&str; 24] = [
    "rust",
    "mongodb",
    "realtime",
    "news",
    "music",
    "sports",
    "tech",
    "ai",
    "data",
    "weather",
    "travel",
    "food",
    "gaming",
    "science",
    "art",
    "health",
    "movies",
    "crypto",
    "books",
    "photography",
    "nature",
    "fashion",
    "football",
    "space",
];
const WORDS: [&str; 32] = [
    "the", "stream", "is", "live", "now", "what", "a", "day", "for", "data", "events", "fast",
    "store", "every", "one", "moment", "watch", "this", "new", "update", "just", "saw", "great",
    "match", "love", "today", "check", "out", "big", "news", "here", "wow",
];
const USERS: u64 = 5000;

/// Settings of the synthetic source (`kind = "synthetic"`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyntheticConfig {
    /// Mean events per second outside bursts (required).
    pub rate_per_sec: f64,
    /// Random seed, for a reproducible stream; absent = random.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Chance per second that a burst starts (0..=1).
    #[serde(default = "default_burst_probability")]
    pub burst_probability: f64,
    /// The rate is multiplied by this during a burst (>= 1).
    #[serde(default = "default_burst_multiplier")]
    pub burst_multiplier: f64,
    /// How long a burst lasts, in seconds (>= 1).
    #[serde(default = "default_burst_secs")]
    pub burst_secs: u64,
    /// `realistic` (long tails, many scripts; the default) or `small` (a few dozen hashtags
    /// and words).
    #[serde(default)]
    pub vocabulary: Vocabulary,
    /// `realistic` only: distinct hashtags (Zipf-distributed); absent = 2,000,000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hashtags: Option<u64>,
    /// `realistic` only: distinct users (Zipf-distributed activity); absent = 5,000,000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub users: Option<u64>,
}

fn default_burst_probability() -> f64 {
    0.01
}
fn default_burst_multiplier() -> f64 {
    5.0
}
fn default_burst_secs() -> u64 {
    3
}

impl SyntheticConfig {
    /// A stream at `rate_per_sec`, random seed, default bursts.
    pub fn at(rate_per_sec: f64) -> Self {
        SyntheticConfig {
            rate_per_sec,
            seed: None,
            burst_probability: default_burst_probability(),
            burst_multiplier: default_burst_multiplier(),
            burst_secs: default_burst_secs(),
            vocabulary: Vocabulary::default(),
            hashtags: None,
            users: None,
        }
    }

    /// The realistic generator's shape with this source's sizes.
    fn shape(&self) -> Shape {
        let mut shape = Shape::default();
        if let Some(n) = self.hashtags {
            shape.hashtags = n;
        }
        if let Some(n) = self.users {
            shape.users = n;
        }
        shape
    }
}

impl SourceSettings for SyntheticConfig {
    fn validate(&self, at: &str, p: &mut Problems) {
        if !(self.rate_per_sec.is_finite() && self.rate_per_sec > 0.0) {
            p.push(
                format!("{at}.rate_per_sec"),
                format!("must be > 0 (got {})", self.rate_per_sec),
            );
        }
        if !(0.0..=1.0).contains(&self.burst_probability) {
            p.push(
                format!("{at}.burst_probability"),
                format!("must be in 0..=1 (got {})", self.burst_probability),
            );
        }
        if !(self.burst_multiplier.is_finite() && self.burst_multiplier >= 1.0) {
            p.push(
                format!("{at}.burst_multiplier"),
                format!("must be >= 1 (got {})", self.burst_multiplier),
            );
        }
        p.at_least(&format!("{at}.burst_secs"), self.burst_secs, 1);
        for (key, value) in [("hashtags", self.hashtags), ("users", self.users)] {
            let Some(n) = value else { continue };
            if self.vocabulary != Vocabulary::Realistic {
                p.push(
                    format!("{at}.{key}"),
                    "only for vocabulary = \"realistic\" (the small vocabulary has fixed sizes)",
                );
            } else if !(1..=MAX_VOCABULARY).contains(&n) {
                p.push(
                    format!("{at}.{key}"),
                    format!("must be in 1..={MAX_VOCABULARY} (got {n})"),
                );
            }
        }
    }

    fn build(&self, name: &str, _: &BuildContext) -> Result<Box<dyn Source>, SourceError> {
        Ok(Box::new(Synthetic::new(name, self.clone())))
    }

    fn describe(&self) -> String {
        match self.vocabulary {
            Vocabulary::Realistic => format!("{}/s", self.rate_per_sec),
            Vocabulary::Small => format!("{}/s, small vocabulary", self.rate_per_sec),
        }
    }
}

/// The synthetic source.
pub struct Synthetic {
    name: String,
    options: SyntheticConfig,
}

impl Synthetic {
    /// A synthetic source with these settings.
    pub fn new(name: impl Into<String>, options: SyntheticConfig) -> Self {
        Synthetic {
            name: name.into(),
            options,
        }
    }
}

impl Source for Synthetic {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> &str {
        "synthetic"
    }

    fn records(self: Box<Self>) -> BoxStream<'static, Raw> {
        let o = self.options;
        let seed = o.seed.unwrap_or_else(rand::random);
        let events = Events::new(seed, &o);
        let state = (events, Instant::now(), Pacer::new(o));
        futures::stream::unfold(state, |(mut events, mut next, mut pacer)| async move {
            // Poisson arrivals: exponential gaps. When behind schedule (a slow consumer, a
            // high rate), events go out without sleeping until the schedule is met again.
            next += pacer.gap(events.pace_rng(), next);
            if next > Instant::now() {
                tokio::time::sleep_until(next).await;
            }
            let event = events.next();
            Some((Raw::Json(event), (events, next, pacer)))
        })
        .boxed()
    }
}

/// The events of a synthetic stream, from the configured vocabulary, and the random source of
/// its arrival gaps (so one seed fixes both).
enum Events {
    /// The small generator draws the gaps from its own random stream (as it always has, so a
    /// seeded small stream is what it was).
    Small(Generator),
    /// The realistic generator keeps its random stream to itself (its events depend only on
    /// the seed and the shape); the gaps come from a second stream derived from the seed.
    Realistic(Box<Realistic>, StdRng),
}

impl Events {
    fn new(seed: u64, o: &SyntheticConfig) -> Self {
        match o.vocabulary {
            Vocabulary::Small => Events::Small(Generator::new(seed)),
            Vocabulary::Realistic => Events::Realistic(
                Box::new(Realistic::new(seed, o.shape())),
                // Any fixed odd constant decorrelates the two streams of one seed.
                StdRng::seed_from_u64(seed ^ 0x9e37_79b9_7f4a_7c15),
            ),
        }
    }

    fn pace_rng(&mut self) -> &mut StdRng {
        match self {
            Events::Small(g) => &mut g.rng,
            Events::Realistic(_, rng) => rng,
        }
    }

    fn next(&mut self) -> Value {
        match self {
            Events::Small(g) => g.event(),
            Events::Realistic(r, _) => {
                let created = humantime::format_rfc3339_millis(SystemTime::now()).to_string();
                r.event(&created)
            }
        }
    }
}

/// Arrival times: exponential gaps at the current rate, with bursts.
struct Pacer {
    o: SyntheticConfig,
    second: Option<Instant>,
    burst_until: Option<Instant>,
}

impl Pacer {
    fn new(o: SyntheticConfig) -> Self {
        Pacer {
            o,
            second: None,
            burst_until: None,
        }
    }

    fn gap(&mut self, rng: &mut StdRng, now: Instant) -> Duration {
        // Roll for a burst once per second of schedule time.
        if self
            .second
            .is_none_or(|s| now >= s + Duration::from_secs(1))
        {
            self.second = Some(now);
            if self.burst_until.is_none_or(|b| now >= b)
                && rng.random::<f64>() < self.o.burst_probability
            {
                self.burst_until = Some(now + Duration::from_secs(self.o.burst_secs));
            }
        }
        let bursting = self.burst_until.is_some_and(|b| now < b);
        let rate = self.o.rate_per_sec
            * if bursting {
                self.o.burst_multiplier
            } else {
                1.0
            };
        let u: f64 = rng.random::<f64>();
        // 1 - u is in (0, 1], so the logarithm is finite.
        Duration::from_secs_f64((-(1.0 - u).ln() / rate).min(60.0))
    }
}

/// Tweet-like documents from a seeded generator.
pub struct Generator {
    rng: StdRng,
    next_id: u64,
}

impl Generator {
    /// A generator whose output depends only on `seed`.
    pub fn new(seed: u64) -> Self {
        Generator {
            rng: StdRng::seed_from_u64(seed),
            next_id: 1_700_000_000_000_000_000 + seed % 1_000_000,
        }
    }

    fn weighted<'a>(&mut self, items: &'a [(&'a str, u32)]) -> &'a str {
        let total: u32 = items.iter().map(|(_, w)| w).sum();
        let mut pick = self.rng.random_range(0..total);
        for (item, w) in items {
            if pick < *w {
                return item;
            }
            pick -= w;
        }
        items[0].0
    }

    /// The next document.
    pub fn event(&mut self) -> Value {
        self.next_id += self.rng.random_range(1..1000);
        let id = self.next_id;
        // Zipf-like: a few users and hashtags are far more active than the rest.
        let user = (USERS as f64 * self.rng.random::<f64>().powi(3)) as u64 + 1;
        let followers = (10f64.powf(1.0 + 5.0 * (1.0 - user as f64 / USERS as f64).powi(4))) as u64
            + self.rng.random_range(0..100);
        let n_tags = [0, 0, 1, 1, 1, 2, 2, 3][self.rng.random_range(0..8usize)];
        let tags: Vec<&str> = (0..n_tags)
            .map(|_| HASHTAGS[(HASHTAGS.len() as f64 * self.rng.random::<f64>().powi(2)) as usize])
            .collect();
        let n_words = self.rng.random_range(4..16);
        let mut text: Vec<String> = (0..n_words)
            .map(|_| WORDS[self.rng.random_range(0..WORDS.len())].to_string())
            .collect();
        text.extend(tags.iter().map(|t| format!("#{t}")));
        let lang = self.weighted(&LANGS);
        let retweets = (self.rng.random::<f64>().powi(4) * 500.0) as u64;
        let created = humantime::format_rfc3339_millis(SystemTime::now()).to_string();
        let mut doc = json!({
            "id": id,
            "id_str": id.to_string(),
            "created_at": created,
            "user": {
                "id": user,
                "screen_name": format!("user{user}"),
                "followers_count": followers,
            },
            "lang": lang,
            "text": text.join(" "),
            "hashtags": tags,
            "retweet_count": retweets,
        });
        if self.rng.random::<f64>() < 0.05 {
            let lon = self.rng.random_range(-180.0..180.0f64);
            let lat = self.rng.random_range(-80.0..80.0f64);
            doc["coordinates"] = json!({"type": "Point", "coordinates": [lon, lat]});
        }
        doc
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_documents_apart_from_the_clock() {
        let strip = |mut v: Value| {
            v.as_object_mut().unwrap().remove("created_at");
            v
        };
        let (mut a, mut b) = (Generator::new(7), Generator::new(7));
        for _ in 0..50 {
            assert_eq!(strip(a.event()), strip(b.event()));
        }
        let mut c = Generator::new(8);
        assert_ne!(
            strip(Generator::new(7).event()),
            strip(c.event()),
            "another seed, another stream"
        );
    }

    #[test]
    fn documents_have_the_tweet_fields() {
        let mut g = Generator::new(1);
        let mut with_coordinates = 0;
        let mut prev = 0;
        for _ in 0..2000 {
            let e = g.event();
            let id = e["id"].as_u64().unwrap();
            assert!(id > prev, "ids increase");
            prev = id;
            assert!(
                e["user"]["screen_name"]
                    .as_str()
                    .unwrap()
                    .starts_with("user")
            );
            assert!(e["user"]["followers_count"].as_u64().is_some());
            assert!(e["hashtags"].as_array().unwrap().len() <= 3);
            assert!(e["lang"].is_string() && e["text"].is_string() && e["retweet_count"].is_u64());
            assert!(e["created_at"].as_str().unwrap().ends_with('Z'));
            with_coordinates += e.get("coordinates").is_some() as u32;
        }
        assert!(
            (40..=160).contains(&with_coordinates),
            "about 5% carry coordinates: {with_coordinates}"
        );
    }

    #[test]
    fn gaps_average_to_the_configured_rate() {
        let o = SyntheticConfig {
            rate_per_sec: 70.0,
            seed: None,
            burst_probability: 0.0,
            burst_multiplier: 1.0,
            burst_secs: 1,
            ..SyntheticConfig::at(70.0)
        };
        let mut p = Pacer::new(o);
        let mut rng = StdRng::seed_from_u64(3);
        let mut t = Instant::now();
        let n = 20_000;
        let start = t;
        for _ in 0..n {
            t += p.gap(&mut rng, t);
        }
        let rate = n as f64 / (t - start).as_secs_f64();
        // 20,000 exponential gaps: the mean is within ~2% (5 sigma ≈ 3.5%) of 1/70 s.
        assert!((rate - 70.0).abs() < 70.0 * 0.035, "measured rate {rate}");
    }

    #[test]
    fn bursts_raise_the_rate() {
        let o = SyntheticConfig {
            rate_per_sec: 70.0,
            seed: None,
            burst_probability: 1.0,
            burst_multiplier: 5.0,
            burst_secs: 3600,
            ..SyntheticConfig::at(70.0)
        };
        let mut p = Pacer::new(o);
        let mut rng = StdRng::seed_from_u64(3);
        let mut t = Instant::now();
        let start = t;
        for _ in 0..20_000 {
            t += p.gap(&mut rng, t);
        }
        let rate = 20_000.0 / (t - start).as_secs_f64();
        assert!((rate - 350.0).abs() < 350.0 * 0.035, "burst rate {rate}");
    }

    /// The first `n` events of a seeded source's stream (the generator, without pacing).
    fn first_events(o: &SyntheticConfig, n: usize) -> Vec<Value> {
        let mut events = Events::new(o.seed.unwrap(), o);
        (0..n)
            .map(|_| {
                let mut e = events.next();
                e.as_object_mut().unwrap().remove("created_at");
                e
            })
            .collect()
    }

    #[test]
    fn the_default_vocabulary_is_realistic_and_seeded_streams_repeat() {
        let mut o = SyntheticConfig::at(70.0);
        assert_eq!(o.vocabulary, Vocabulary::Realistic, "realistic by default");
        o.seed = Some(42);
        let a = first_events(&o, 300);
        assert_eq!(a, first_events(&o, 300), "same seed, same events");
        let mut other = o.clone();
        other.seed = Some(43);
        assert_ne!(a, first_events(&other, 300), "another seed, other events");
        // The realistic generator's output, through the source, unchanged.
        let mut direct = Realistic::new(42, Shape::default());
        let mut want = direct.event("t");
        want.as_object_mut().unwrap().remove("created_at");
        assert_eq!(
            a[0], want,
            "the source hands over the realistic generator's events"
        );
        // Long tails and many scripts, as the issue asks of the default stream.
        let names: std::collections::BTreeSet<&str> = a
            .iter()
            .map(|e| e["user"]["screen_name"].as_str().unwrap())
            .collect();
        assert!(
            names.len() > 250,
            "300 events of a 5,000,000-user stream come from hundreds of users: {}",
            names.len()
        );
        assert!(
            a.iter().any(|e| !e["text"].as_str().unwrap().is_ascii()),
            "non-ASCII texts"
        );
        assert!(
            a.iter()
                .all(|e| e["hashtags"].is_array() && e["retweet_count"].is_u64())
        );
    }

    #[test]
    fn the_small_vocabulary_is_the_old_generator() {
        let mut o = SyntheticConfig::at(70.0);
        o.vocabulary = Vocabulary::Small;
        o.seed = Some(7);
        let mut g = Generator::new(7);
        let want: Vec<Value> = (0..50)
            .map(|_| {
                let mut e = g.event();
                e.as_object_mut().unwrap().remove("created_at");
                e
            })
            .collect();
        assert_eq!(first_events(&o, 50), want);
        for e in &want {
            for tag in e["hashtags"].as_array().unwrap() {
                assert!(
                    HASHTAGS.contains(&tag.as_str().unwrap()),
                    "small hashtags come from the fixed list: {tag}"
                );
            }
        }
    }

    #[test]
    fn sizes_shape_the_realistic_vocabulary() {
        let mut o = SyntheticConfig::at(70.0);
        o.seed = Some(1);
        o.hashtags = Some(3);
        o.users = Some(2);
        let events = first_events(&o, 500);
        let users: std::collections::BTreeSet<&str> = events
            .iter()
            .map(|e| e["user"]["screen_name"].as_str().unwrap())
            .collect();
        let tags: std::collections::BTreeSet<&str> = events
            .iter()
            .flat_map(|e| e["hashtags"].as_array().unwrap())
            .map(|t| t.as_str().unwrap())
            .collect();
        assert_eq!(users.len(), 2, "users = 2: {users:?}");
        assert!(
            !tags.is_empty() && tags.len() <= 3,
            "hashtags = 3: {tags:?}"
        );
    }

    #[test]
    fn sizes_are_checked() {
        let problems = |o: &SyntheticConfig| {
            let mut p = Problems::default();
            o.validate("sources[0]", &mut p);
            format!("{p:?}")
        };
        let mut o = SyntheticConfig::at(70.0);
        o.hashtags = Some(0);
        let found = problems(&o);
        assert!(
            found.contains("sources[0].hashtags") && found.contains("must be in 1..="),
            "{found}"
        );
        o.hashtags = Some(10);
        o.vocabulary = Vocabulary::Small;
        let found = problems(&o);
        assert!(
            found.contains("sources[0].hashtags") && found.contains("only for vocabulary"),
            "{found}"
        );
        o.vocabulary = Vocabulary::Realistic;
        assert_eq!(problems(&o), format!("{:?}", Problems::default()), "valid");
    }
}
