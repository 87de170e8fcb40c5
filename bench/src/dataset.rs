//! What the write scenarios write: `--dataset small` or `--dataset realistic` (the default).
//!
//! - **small** is the original synthetic stream ([`Generator`]): 24 hashtags, 5,000 users,
//!   ASCII words, ~350-byte events. Every distinct value is seen within the first second, so
//!   the statistics, rollups and indexes stay tiny: the numbers published before the
//!   realistic dataset existed were measured on it.
//! - **realistic** is [`Realistic`] with its default [`Shape`]: hashtags Zipf-distributed
//!   over 2,000,000 values and users over 5,000,000 (most values are seen once, as in a real
//!   sample stream), twenty-one languages in their scripts, emoji, tweet-sized texts. What
//!   the top-k, the rollups (one key per distinct hashtag) and the indexes cost on real data
//!   shows only on this one.
//!
//! Both are seeded: a scenario writes the same events on every run.

use std::time::SystemTime;

use rand::SeedableRng;
use rand::rngs::Xoshiro256PlusPlus;
use rand_distr::{Distribution, Zipf};
use serde_json::{Value, json};
use store::Document;

use ingest::source::realistic::{self, Realistic, Shape};
use ingest::source::synthetic::Generator;

/// `--dataset`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Dataset {
    /// The original synthetic tweets: 24 hashtags, 5,000 users, ASCII words.
    Small,
    /// Long tails: Zipf hashtags over 2,000,000 and users over 5,000,000, every script.
    #[default]
    Realistic,
}

impl Dataset {
    /// The lowercase name (JSON, file names).
    pub fn as_str(self) -> &'static str {
        match self {
            Dataset::Small => "small",
            Dataset::Realistic => "realistic",
        }
    }

    /// What it is, for a report's parameters.
    pub fn describe(self) -> Value {
        match self {
            Dataset::Small => json!({
                "name": "small", "generator": "source::synthetic::Generator",
                "hashtags": 24, "users": 5000,
            }),
            Dataset::Realistic => {
                let s = Shape::default();
                json!({
                    "name": "realistic", "generator": "source::realistic::Realistic (default shape)",
                    "hashtags": s.hashtags, "hashtag_exponent": s.hashtag_exponent,
                    "users": s.users, "user_exponent": s.user_exponent,
                })
            }
        }
    }
}

/// A seeded stream of events (and of rollup-like keys) from one dataset.
pub struct Docs {
    inner: Inner,
}

// Both generators are boxed: they carry their random state and pickers (hundreds of bytes).
enum Inner {
    Small(Box<Generator>),
    Realistic(Box<Realistic>, Tags),
}

/// Hashtag ranks drawn by the realistic shape's law, for keys without a whole event.
struct Tags {
    rng: Xoshiro256PlusPlus,
    law: Option<Zipf<f64>>,
}

impl Docs {
    /// The stream of `dataset` whose output depends only on `seed`.
    pub fn new(dataset: Dataset, seed: u64) -> Docs {
        let inner = match dataset {
            Dataset::Small => Inner::Small(Box::new(Generator::new(seed))),
            Dataset::Realistic => {
                let shape = Shape::default();
                let tags = Tags {
                    rng: Xoshiro256PlusPlus::seed_from_u64(seed ^ 0x7A65),
                    law: Zipf::new(shape.hashtags as f64, shape.hashtag_exponent).ok(),
                };
                Inner::Realistic(Box::new(Realistic::new(seed, shape)), tags)
            }
        };
        Docs { inner }
    }

    /// The next event, as a source would hand it over (no stamp).
    pub fn event(&mut self) -> Value {
        match &mut self.inner {
            Inner::Small(g) => g.event(),
            Inner::Realistic(r, _) => {
                // Formatted per event, as the small generator does, so both pay the same.
                let now = humantime::format_rfc3339_millis(SystemTime::now()).to_string();
                r.event(&now)
            }
        }
    }

    /// The next event with an ingest stamp of source `bench` and sequence `seq`, as the
    /// ingester would store it (for scenarios that write to a collection directly).
    pub fn stamped(&mut self, seq: u64) -> Document {
        let mut v = self.event();
        v[store::STAMP_FIELD] =
            json!({"source": "bench", "seq": seq, "received_us": 0, "ingested_us": 0});
        match v {
            Value::Object(d) => d,
            _ => Document::new(),
        }
    }

    /// A key of a keyed collection for write `seq`: small cycles through 1,000 keys; realistic
    /// is `hashtags:<tag>` with the tag drawn by the realistic hashtag law (what the rollups
    /// write: most keys new, a few hot).
    pub fn key(&mut self, seq: u64) -> String {
        match &mut self.inner {
            Inner::Small(_) => format!("k{}", seq % 1000),
            Inner::Realistic(_, tags) => {
                let rank = tags
                    .law
                    .as_ref()
                    .map_or(1, |z| z.sample(&mut tags.rng) as u64)
                    .max(1);
                format!("hashtags:{}", realistic::hashtag(rank))
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn realistic_keys_have_a_long_tail_and_small_keys_do_not() {
        let mut realistic = Docs::new(Dataset::Realistic, 1);
        let mut small = Docs::new(Dataset::Small, 1);
        let n = 20_000;
        let r: HashSet<String> = (0..n).map(|i| realistic.key(i)).collect();
        let s: HashSet<String> = (0..n).map(|i| small.key(i)).collect();
        // Zipf(1) over 2,000,000: about half of 20,000 draws are distinct values.
        assert!(
            r.len() > n as usize / 3,
            "realistic keys: expected a long tail (> {} distinct of {n}), saw {}",
            n / 3,
            r.len()
        );
        assert_eq!(s.len(), 1000, "small keys cycle through 1,000");
    }

    #[test]
    fn each_dataset_writes_tweets_with_hashtags() {
        for dataset in [Dataset::Small, Dataset::Realistic] {
            let mut docs = Docs::new(dataset, 7);
            let doc = docs.stamped(42);
            assert!(
                doc.get("hashtags").is_some_and(Value::is_array),
                "{}: hashtags is an array in {doc:?}",
                dataset.as_str()
            );
            assert_eq!(
                doc["_tailrace"]["seq"],
                json!(42),
                "{}: the stamp carries the sequence number",
                dataset.as_str()
            );
        }
    }
}
