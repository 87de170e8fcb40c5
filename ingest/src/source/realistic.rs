//! A tweet-like stream with the shape of a real one: long-tailed vocabularies, many scripts,
//! emoji, tweet-sized texts. Pure, seeded and fast, so tests and benchmarks can draw millions
//! of events that stress what real data stresses.
//!
//! What real social streams look like, and what this generator reproduces:
//! - **Long tails.** Hashtags and active users follow Zipf laws over millions of distinct
//!   values ([`Shape::hashtags`], [`Shape::users`]): a few are everywhere, most appear once.
//!   Ranks are drawn by rejection-inversion (Hörmann & Derflinger 1996, via
//!   [`rand_distr::Zipf`]) in O(1) expected time, and names are *spelled from the rank*
//!   ([`hashtag`], [`screen_name`], [`user_id`]), so memory does not grow with the vocabulary.
//! - **Many scripts.** Twenty-one `lang` values with roughly the weights of a 2020s sample
//!   stream; each writes in its script: Latin with diacritics, CJK, Hangul, Arabic, Persian,
//!   Urdu and Hebrew (right to left), Cyrillic, Greek, Thai (no spaces), Devanagari. Hashtags
//!   come in several scripts too (`#東京`, `#كورة`-like), whatever the tweet's language.
//! - **Unicode's hard cases.** Emoji with skin tones, ZWJ sequences (👩‍💻, families, 🏳️‍🌈),
//!   flags, keycaps and a tag sequence (🏴󠁧󠁢󠁥󠁮󠁧󠁿); combining marks (Thai and Devanagari vowel
//!   signs, harakat, niqqud, a share of Latin texts in decomposed form, rare "zalgo" stacks);
//!   zero-width and direction marks; the ZWNJ inside Persian words; line breaks; `&amp;`.
//! - **Tweet-sized texts.** Lengths are log-normal (median ~45 characters) plus a pile-up at
//!   the 280 limit; CJK and Hangul tweets hold half as many characters (Twitter counts them
//!   double). Every text has at most [`MAX_TEXT_CHARS`] Unicode scalar values (`char`s).
//!
//! Documents have the shape of [`super::synthetic::Generator`]'s (`id`, `id_str`,
//! `created_at`, `user {id, screen_name, followers_count}`, `lang`, `text`, `hashtags`,
//! `retweet_count`, sometimes `coordinates`), so indexes, top-k and rollups work unchanged.
//! Every hashtag of `hashtags` appears in `text` as `#tag`. The same user rank always has
//! the same screen name, id and follower count. No key starts with `$` or contains `.`.
//!
//! What it is not: a language model. Words beyond each language's few dozen most frequent
//! ones are pronounceable syllable strings in the right script, Zipf-distributed, not words.
//!
//! ```
//! use ingest::source::realistic::{Realistic, Shape};
//!
//! let mut generator = Realistic::new(42, Shape::default());
//! let event = generator.event("2024-05-01T12:00:00.000Z");
//! assert!(event["text"].as_str().is_some_and(|t| t.chars().count() <= 280));
//! ```

mod tables;

use std::f64::consts::TAU;
use std::fmt::Write as _;
use std::sync::LazyLock;

use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, StandardNormal, Zipf};
use serde_json::{Map, Value, json};
use unicode_normalization::UnicodeNormalization;

use tables::{Cores, Emoji, Lang, Script, Spec};

/// Twitter's limit, counted here in Unicode scalar values (`str::chars`), never exceeded.
/// (Twitter weighs CJK characters and emoji double; this generator halves CJK and Hangul
/// texts' lengths instead, so their character counts look like real ones.)
pub const MAX_TEXT_CHARS: usize = 280;

/// The largest vocabulary [`Shape::hashtags`] and [`Shape::users`] may have. Names are
/// spelled from ranks and ids are bijections of them; 2^40 keeps screen names within
/// Twitter's 15 characters and ids below 2^63 (a BSON `long`).
pub const MAX_VOCABULARY: u64 = 1 << 40;

/// `https://t.co/` and ten characters: every link in a tweet is shortened to this length.
const URL_CHARS: usize = 23;
/// A non-`und` text keeps at least this many characters of words, whatever else it holds.
const MIN_WORD_CHARS: usize = 3;
/// Twitter's screen-name limit.
const MAX_SCREEN_NAME: usize = 15;

/// The knobs of the stream, with defaults that look like a real sample stream.
///
/// Invalid values (see [`Shape::validate`]) are not rejected by [`Realistic::new`]: it uses
/// the nearest valid value, or the default where there is none (a NaN, all-zero weights), so
/// a generator always runs. Call `validate` first to report them instead.
#[derive(Clone, Debug, PartialEq)]
pub struct Shape {
    /// Distinct hashtags, 1..=[`MAX_VOCABULARY`]. Default 2,000,000.
    pub hashtags: u64,
    /// Zipf exponent `s` of hashtag ranks: rank `k` is drawn with probability ∝ `k^-s`.
    /// Default 1.0 (Zipf's law): with 2,000,000 tags the top one is 1/H ≈ 6.6% of all tag
    /// uses (H = Σ k^-s ≈ 15.09), and 200,000 events show ~105,000 distinct tags.
    pub hashtag_exponent: f64,
    /// Distinct users (authors and mentioned accounts), 1..=[`MAX_VOCABULARY`].
    /// Default 5,000,000.
    pub users: u64,
    /// Zipf exponent of user activity. Default 0.8: the most active account writes ~1% of
    /// the stream (H ≈ 104.9), and 200,000 events come from ~147,000 distinct users.
    pub user_exponent: f64,
    /// Distinct words per language (the few dozen most frequent are real words).
    /// Default 100,000.
    pub words: u64,
    /// Zipf exponent of word ranks. Default 1.0.
    pub word_exponent: f64,
    /// Weights of 0, 1, 2, ... hashtags per event. Default 30, 30, 18, 10, 5, 3, 1.5, 1, 0.75,
    /// 0.5, 0.25 (mean ~1.6; the long end is hashtag spam). Tags that do not fit in the
    /// 280 characters are dropped from the text and from `hashtags` (never with the default
    /// of at most 10).
    pub tags_per_event: Vec<f64>,
    /// Weights of 0, 1, 2, ... @mentions per event. Default 60, 30, 7, 3. Most mentions open
    /// the text, as replies do.
    pub mentions_per_event: Vec<f64>,
    /// `lang` codes and their weights (normalised). Default: en 31, ja 16, es 8, und 8,
    /// pt 5.5, ar 4.5, ko 4, th 3.5, in 3, fr 2, tr 2, tl 1.2, hi 1.2, ru 1, it 0.8, de 0.8,
    /// fa 0.6, zh 0.5, ur 0.3, el 0.2, he 0.2 — a third of events in non-Latin scripts.
    /// Codes must be among these.
    pub languages: Vec<(String, f64)>,
    /// Share of events with at least one emoji. Default 0.3.
    pub emoji_share: f64,
    /// Share of events ending with a `https://t.co/...` link. Default 0.25.
    pub url_share: f64,
    /// Median text length in characters (before Twitter's double weight of CJK and Hangul,
    /// which halves theirs). Default 45.
    pub text_median_chars: f64,
    /// Log-normal spread of text lengths (σ of the logarithm). Default 0.85: ~9% of texts
    /// are longer than 140 characters.
    pub text_sigma: f64,
    /// Share of texts written up to the limit (250..=280 characters). Default 0.015.
    pub at_limit_share: f64,
    /// Share of Latin-script texts in Unicode decomposed form (NFD: `e` + U+0301 for `é`),
    /// as some keyboards and macOS file names produce. Default 0.03.
    pub decomposed_share: f64,
    /// Share of texts with stacked combining marks ("zalgo"). Default 0.002.
    pub zalgo_share: f64,
    /// Chance that a space between words is an invisible or unusual one instead (zero-width
    /// space, LRM/RLM marks, no-break space, ideographic space). Default 0.02.
    pub invisible_share: f64,
    /// Share of events with `coordinates` (a point near a city of the event's language).
    /// Default 0.02.
    pub coordinates_share: f64,
    /// Tail exponent α of `retweet_count`: P(count ≥ k) = (k+1)^-α, so 65% of events have
    /// none and a few have hundreds of thousands (capped at 10,000,000). Default 1.5.
    pub retweet_tail_exponent: f64,
}

impl Default for Shape {
    fn default() -> Self {
        Shape {
            hashtags: 2_000_000,
            hashtag_exponent: 1.0,
            users: 5_000_000,
            user_exponent: 0.8,
            words: 100_000,
            word_exponent: 1.0,
            tags_per_event: vec![30.0, 30.0, 18.0, 10.0, 5.0, 3.0, 1.5, 1.0, 0.75, 0.5, 0.25],
            mentions_per_event: vec![60.0, 30.0, 7.0, 3.0],
            languages: tables::LANGS
                .iter()
                .map(|l| (l.code.to_owned(), l.weight))
                .collect(),
            emoji_share: 0.3,
            url_share: 0.25,
            text_median_chars: 45.0,
            text_sigma: 0.85,
            at_limit_share: 0.015,
            decomposed_share: 0.03,
            zalgo_share: 0.002,
            invisible_share: 0.02,
            coordinates_share: 0.02,
            retweet_tail_exponent: 1.5,
        }
    }
}

/// A knob of [`Shape`] that cannot be used as given.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ShapeError {
    /// A number outside its range; the message says the range.
    #[error("{field} = {value} is out of range: expected {expected}")]
    OutOfRange {
        /// The field of [`Shape`].
        field: &'static str,
        /// The value given.
        value: String,
        /// The valid range.
        expected: &'static str,
    },
    /// A list of weights with a negative or non-finite entry, or none above zero.
    #[error("{field}: weights must be finite, not negative, and at least one above zero")]
    Weights {
        /// The field of [`Shape`].
        field: &'static str,
    },
    /// A `lang` code this generator has no script and words for.
    #[error("languages: unknown code {code:?} (known: {known})")]
    UnknownLanguage {
        /// The code given.
        code: String,
        /// The codes that can be used.
        known: String,
    },
}

impl Shape {
    /// Every problem of this shape (empty when it is valid), so a configuration can report
    /// them all at once.
    pub fn validate(&self) -> Result<(), Vec<ShapeError>> {
        let mut problems = Vec::new();
        let mut range = |field, ok: bool, value: String, expected| {
            if !ok {
                problems.push(ShapeError::OutOfRange {
                    field,
                    value,
                    expected,
                });
            }
        };
        let vocabulary = |n: u64| (1..=MAX_VOCABULARY).contains(&n);
        let exponent = |s: f64| (0.0..=10.0).contains(&s);
        let share = |p: f64| (0.0..=1.0).contains(&p);
        range(
            "hashtags",
            vocabulary(self.hashtags),
            self.hashtags.to_string(),
            "1..=2^40",
        );
        range(
            "users",
            vocabulary(self.users),
            self.users.to_string(),
            "1..=2^40",
        );
        range(
            "words",
            vocabulary(self.words),
            self.words.to_string(),
            "1..=2^40",
        );
        for (field, s) in [
            ("hashtag_exponent", self.hashtag_exponent),
            ("user_exponent", self.user_exponent),
            ("word_exponent", self.word_exponent),
        ] {
            range(field, exponent(s), s.to_string(), "0.0..=10.0");
        }
        for (field, p) in [
            ("emoji_share", self.emoji_share),
            ("url_share", self.url_share),
            ("at_limit_share", self.at_limit_share),
            ("decomposed_share", self.decomposed_share),
            ("zalgo_share", self.zalgo_share),
            ("invisible_share", self.invisible_share),
            ("coordinates_share", self.coordinates_share),
        ] {
            range(field, share(p), p.to_string(), "0.0..=1.0");
        }
        range(
            "text_median_chars",
            (1.0..=MAX_TEXT_CHARS as f64).contains(&self.text_median_chars),
            self.text_median_chars.to_string(),
            "1.0..=280.0",
        );
        range(
            "text_sigma",
            (0.0..=5.0).contains(&self.text_sigma),
            self.text_sigma.to_string(),
            "0.0..=5.0",
        );
        range(
            "retweet_tail_exponent",
            self.retweet_tail_exponent > 0.0 && self.retweet_tail_exponent <= 100.0,
            self.retweet_tail_exponent.to_string(),
            "above 0.0, at most 100.0",
        );
        let weights_ok = |w: &mut dyn Iterator<Item = f64>| {
            let mut any = false;
            for x in w {
                if !(x.is_finite() && x >= 0.0) {
                    return false;
                }
                any |= x > 0.0;
            }
            any
        };
        if !weights_ok(&mut self.tags_per_event.iter().copied()) {
            problems.push(ShapeError::Weights {
                field: "tags_per_event",
            });
        }
        if !weights_ok(&mut self.mentions_per_event.iter().copied()) {
            problems.push(ShapeError::Weights {
                field: "mentions_per_event",
            });
        }
        if !weights_ok(&mut self.languages.iter().map(|(_, w)| *w)) {
            problems.push(ShapeError::Weights { field: "languages" });
        }
        for (code, _) in &self.languages {
            if lang_index(code).is_none() {
                problems.push(ShapeError::UnknownLanguage {
                    code: code.clone(),
                    known: tables::LANGS
                        .iter()
                        .map(|l| l.code)
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }

    /// The nearest valid shape: numbers clamped into range, NaNs and unusable weight lists
    /// replaced by the defaults, unknown languages dropped.
    fn sanitized(mut self) -> Shape {
        let d = Shape::default();
        let clamp = |x: f64, lo: f64, hi: f64, default: f64| {
            if x.is_nan() { default } else { x.clamp(lo, hi) }
        };
        self.hashtags = self.hashtags.clamp(1, MAX_VOCABULARY);
        self.users = self.users.clamp(1, MAX_VOCABULARY);
        self.words = self.words.clamp(1, MAX_VOCABULARY);
        self.hashtag_exponent = clamp(self.hashtag_exponent, 0.0, 10.0, d.hashtag_exponent);
        self.user_exponent = clamp(self.user_exponent, 0.0, 10.0, d.user_exponent);
        self.word_exponent = clamp(self.word_exponent, 0.0, 10.0, d.word_exponent);
        for (p, default) in [
            (&mut self.emoji_share, d.emoji_share),
            (&mut self.url_share, d.url_share),
            (&mut self.at_limit_share, d.at_limit_share),
            (&mut self.decomposed_share, d.decomposed_share),
            (&mut self.zalgo_share, d.zalgo_share),
            (&mut self.invisible_share, d.invisible_share),
            (&mut self.coordinates_share, d.coordinates_share),
        ] {
            *p = clamp(*p, 0.0, 1.0, default);
        }
        self.text_median_chars = clamp(
            self.text_median_chars,
            1.0,
            MAX_TEXT_CHARS as f64,
            d.text_median_chars,
        );
        self.text_sigma = clamp(self.text_sigma, 0.0, 5.0, d.text_sigma);
        self.retweet_tail_exponent = clamp(
            self.retweet_tail_exponent,
            0.01,
            100.0,
            d.retweet_tail_exponent,
        );
        let usable =
            |w: &[f64]| w.iter().all(|x| x.is_finite() && *x >= 0.0) && w.iter().any(|x| *x > 0.0);
        if !usable(&self.tags_per_event) {
            self.tags_per_event = d.tags_per_event;
        }
        if !usable(&self.mentions_per_event) {
            self.mentions_per_event = d.mentions_per_event;
        }
        self.languages
            .retain(|(code, _)| lang_index(code).is_some());
        let weights: Vec<f64> = self.languages.iter().map(|(_, w)| *w).collect();
        if !usable(&weights) {
            self.languages = d.languages;
        }
        self
    }
}

/// The generator: one seeded random stream, everything else derived from it.
///
/// The same seed and shape give the same sequence of events (apart from the `created_at`
/// passed in) on every platform: the random generator is Xoshiro256++, whose output is fixed
/// by its definition (`StdRng` may change between `rand` releases).
pub struct Realistic {
    rng: Xoshiro256PlusPlus,
    /// Tweet ids: increasing, snowflake-sized (~1.7e18), like the synthetic source's.
    next_id: u64,
    /// The sanitized shape.
    shape: Shape,
    tag_ranks: Ranks,
    user_ranks: Ranks,
    word_ranks: Ranks,
    /// Indexes into [`tables::LANGS`], in the order of `lang_pick`'s weights.
    langs: Vec<usize>,
    lang_pick: Cumulative,
    tags_pick: Cumulative,
    mentions_pick: Cumulative,
    emoji_pick: Cumulative,
    /// Reused for each word, so a text costs no allocation per word.
    word_buf: String,
}

impl Realistic {
    /// A generator whose output depends only on `seed` and `shape` (invalid knobs are
    /// replaced by the nearest valid value: see [`Shape`]).
    pub fn new(seed: u64, shape: Shape) -> Self {
        let shape = shape.sanitized();
        let langs: Vec<usize> = shape
            .languages
            .iter()
            .filter_map(|(code, _)| lang_index(code))
            .collect();
        Realistic {
            rng: Xoshiro256PlusPlus::seed_from_u64(seed),
            next_id: 1_700_000_000_000_000_000 + seed % 1_000_000,
            tag_ranks: Ranks::new(shape.hashtags, shape.hashtag_exponent),
            user_ranks: Ranks::new(shape.users, shape.user_exponent),
            word_ranks: Ranks::new(shape.words, shape.word_exponent),
            langs,
            lang_pick: Cumulative::new(shape.languages.iter().map(|(_, w)| *w)),
            tags_pick: Cumulative::new(shape.tags_per_event.iter().copied()),
            mentions_pick: Cumulative::new(shape.mentions_per_event.iter().copied()),
            emoji_pick: Cumulative::new(tables::EMOJI.iter().map(|(_, w)| *w)),
            word_buf: String::with_capacity(64),
            shape,
        }
    }

    /// The shape in use (after sanitizing).
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The next document; `created_at` is stored as given (the caller owns the clock, so the
    /// generator stays pure).
    pub fn event(&mut self, created_at: &str) -> Value {
        self.next_id += self.rng.random_range(1..1000u64);
        let id = self.next_id;
        let author = self.user_ranks.draw(&mut self.rng);
        let lang_i = self
            .langs
            .get(self.lang_pick.pick(&mut self.rng))
            .copied()
            .unwrap_or(0);
        let mut tags: Vec<String> = (0..self.tags_pick.pick(&mut self.rng))
            .map(|_| hashtag(self.tag_ranks.draw(&mut self.rng)))
            .collect();
        let mut mentions: Vec<String> = (0..self.mentions_pick.pick(&mut self.rng))
            .map(|_| screen_name(self.user_ranks.draw(&mut self.rng), self.shape.users))
            .collect();
        let mut emoji = Vec::new();
        if self.rng.random::<f64>() < self.shape.emoji_share {
            emoji.push(self.emoji_run());
            while emoji.len() < 6 && self.rng.random::<f64>() < 0.35 {
                emoji.push(self.emoji_run());
            }
        }
        let url = self.rng.random::<f64>() < self.shape.url_share;
        let text = self.text(lang_i, &mut tags, &mut mentions, &mut emoji, url);
        // P(count ≥ k) = (k+1)^-α; 1 - u is in (0, 1], so the power is finite.
        let u: f64 = self.rng.random();
        let retweets = ((1.0 - u).powf(-1.0 / self.shape.retweet_tail_exponent) - 1.0)
            .floor()
            .min(10_000_000.0) as u64;
        let lang = &tables::LANGS[lang_i];
        let mut doc = Map::with_capacity(10);
        doc.insert("id".into(), id.into());
        doc.insert("id_str".into(), id.to_string().into());
        doc.insert("created_at".into(), created_at.into());
        doc.insert(
            "user".into(),
            json!({
                "id": user_id(author),
                "screen_name": screen_name(author, self.shape.users),
                "followers_count": followers(author, self.shape.users),
            }),
        );
        doc.insert("lang".into(), lang.code.into());
        doc.insert("text".into(), text.into());
        doc.insert("hashtags".into(), tags.into());
        doc.insert("retweet_count".into(), retweets.into());
        if self.rng.random::<f64>() < self.shape.coordinates_share {
            let (lon, lat) = lang.city;
            let dx: f64 = self.rng.sample(StandardNormal);
            let dy: f64 = self.rng.sample(StandardNormal);
            let lon = (lon + 0.6 * dx).clamp(-180.0, 180.0);
            let lat = (lat + 0.6 * dy).clamp(-85.0, 85.0);
            doc.insert(
                "coordinates".into(),
                json!({"type": "Point", "coordinates": [lon, lat]}),
            );
        }
        Value::Object(doc)
    }

    /// Emoji for one place in a text: one emoji, sometimes repeated (😂😂😂).
    fn emoji_run(&mut self) -> String {
        let mut run = String::with_capacity(16);
        match &tables::EMOJI[self.emoji_pick.pick(&mut self.rng)].0 {
            Emoji::Seq(s) => run.push_str(s),
            Emoji::Tone(s) => {
                run.push_str(s);
                if self.rng.random::<f64>() < 0.35 {
                    run.push(
                        tables::SKIN_TONES[self.rng.random_range(0..tables::SKIN_TONES.len())],
                    );
                }
            }
            Emoji::Flag => {
                let country = tables::FLAGS[self.rng.random_range(0..tables::FLAGS.len())];
                // Regional indicator symbols: U+1F1E6 is A.
                run.extend(
                    country.bytes().filter_map(|b| {
                        char::from_u32(0x1F1E6 + u32::from(b.saturating_sub(b'A')))
                    }),
                );
            }
        }
        if self.rng.random::<f64>() < 0.25 {
            let once = run.clone();
            for _ in 0..self.rng.random_range(1..=3) {
                run.push_str(&once);
            }
        }
        run
    }

    /// How many characters this text should have, before the language's width.
    fn target_chars(&mut self) -> usize {
        if self.rng.random::<f64>() < self.shape.at_limit_share {
            return self.rng.random_range(250..=MAX_TEXT_CHARS);
        }
        let z: f64 = self.rng.sample(StandardNormal);
        (self.shape.text_median_chars * (self.shape.text_sigma * z).exp())
            .round()
            .clamp(1.0, MAX_TEXT_CHARS as f64) as usize
    }

    /// The text: reply mentions, words (with punctuation, sometimes an emoji between
    /// sentences), then mentions, emoji, hashtags and a link. Pieces that cannot fit in
    /// [`MAX_TEXT_CHARS`] are dropped — link, mentions, emoji beyond the first, hashtags, in
    /// that order — and removed from `tags` too, so `hashtags` always matches the text.
    fn text(
        &mut self,
        lang_i: usize,
        tags: &mut Vec<String>,
        mentions: &mut Vec<String>,
        emoji: &mut Vec<String>,
        mut url: bool,
    ) -> String {
        let lang = &tables::LANGS[lang_i];
        let chars = |s: &String| s.chars().count();
        // Each piece costs its characters, its sigil and one separator.
        let cost = |tags: &[String], mentions: &[String], emoji: &[String], url: bool| {
            tags.iter().map(|t| chars(t) + 2).sum::<usize>()
                + mentions.iter().map(|m| chars(m) + 2).sum::<usize>()
                + emoji.iter().map(|e| chars(e) + 1).sum::<usize>()
                + if url { URL_CHARS + 1 } else { 0 }
        };
        let has_words = lang.script != Script::None;
        let reserve = if has_words { MIN_WORD_CHARS } else { 0 };
        while cost(tags, mentions, emoji, url) + reserve > MAX_TEXT_CHARS {
            if url {
                url = false;
            } else if !mentions.is_empty() {
                mentions.pop();
            } else if emoji.len() > 1 {
                emoji.pop();
            } else if !tags.is_empty() {
                tags.pop();
            } else {
                emoji.pop();
            }
        }
        let fixed = cost(tags, mentions, emoji, url);
        let target = (self.target_chars() / lang.width).max(1);
        let budget = if has_words {
            target
                .saturating_sub(fixed)
                .max(reserve)
                .min(MAX_TEXT_CHARS - fixed)
        } else {
            0
        };

        let mut out = Text::with_capacity(4 * (budget + fixed) + 8);
        let reply = !mentions.is_empty() && self.rng.random::<f64>() < 0.7;
        let tags_first = !tags.is_empty() && self.rng.random::<f64>() < 0.15;
        if reply {
            for m in mentions.iter() {
                out.separate();
                out.push_char('@');
                out.push(m);
            }
        }
        if tags_first {
            for t in tags.iter() {
                out.separate();
                out.push_char('#');
                out.push(t);
            }
        }
        let mut emoji_from = 0;
        if has_words {
            let inline = emoji
                .first()
                .filter(|_| self.rng.random::<f64>() < 0.3)
                .map(String::as_str);
            if self.words(lang_i, budget, inline, &mut out) {
                emoji_from = 1;
            }
        }
        if !reply {
            for m in mentions.iter() {
                out.separate();
                out.push_char('@');
                out.push(m);
            }
        }
        // Emoji often stick to the last word ("最高😂") or to each other, never to a mention
        // or a hashtag: `#tag1️⃣` would be another tag.
        let mut glue = has_words && (reply || mentions.is_empty());
        for e in &emoji[emoji_from..] {
            if !(glue && self.rng.random::<f64>() < 0.4) {
                out.separate();
            }
            out.push(e);
            glue = true;
        }
        if !tags_first {
            for t in tags.iter() {
                out.separate();
                out.push_char('#');
                out.push(t);
            }
        }
        if url || out.chars == 0 {
            out.separate();
            out.push("https://t.co/");
            for _ in 0..URL_CHARS - "https://t.co/".len() {
                out.push_char(char::from(BASE62[self.rng.random_range(0..BASE62.len())]));
            }
        }
        debug_assert!(
            out.chars <= MAX_TEXT_CHARS,
            "{} chars: {:?}",
            out.chars,
            out.s
        );
        out.s
    }

    /// Words of `lang` up to `budget` characters (at least one word, cut if it must be), with
    /// punctuation, line breaks and odd spaces. `inline` is an emoji run (already paid for by
    /// the caller) placed after the first sentence end; returns whether it was placed.
    fn words(
        &mut self,
        lang_i: usize,
        budget: usize,
        inline: Option<&str>,
        out: &mut Text,
    ) -> bool {
        let lang = &tables::LANGS[lang_i];
        let table = &TABLES.langs[lang_i];
        let decomposed =
            lang.script == Script::Latin && self.rng.random::<f64>() < self.shape.decomposed_share;
        let zalgo = self.rng.random::<f64>() < self.shape.zalgo_share;
        let mut inline = inline;
        let mut placed = false;
        let start = out.chars;
        let mut word = std::mem::take(&mut self.word_buf);
        let mut piece = String::with_capacity(64);
        let mut first = true;
        let mut sentence_start = true;
        loop {
            word.clear();
            self.word(lang, table, &mut word);
            piece.clear();
            let capital = lang.cased && sentence_start && self.rng.random::<f64>() < 0.7;
            for (i, c) in word.chars().enumerate() {
                if i == 0 && capital {
                    piece.extend(c.to_uppercase());
                } else {
                    piece.push(c);
                }
            }
            if decomposed {
                let nfd: String = piece.nfd().collect();
                piece = nfd;
            }
            if zalgo {
                let plain = std::mem::take(&mut piece);
                for c in plain.chars() {
                    piece.push(c);
                    for _ in 0..self.rng.random_range(1..=4) {
                        // U+0300..=U+0333: combining diacritics that are not letters.
                        piece.extend(char::from_u32(0x300 + self.rng.random_range(0..0x34u32)));
                    }
                }
            }
            let separator = if !first {
                self.separator(lang)
            } else if out.chars > 0 {
                // After a reply mention or leading hashtags: a space ends them.
                Some(' ')
            } else {
                None
            };
            let piece_chars = piece.chars().count();
            let used = out.chars - start;
            let cost = piece_chars + usize::from(separator.is_some());
            if used + cost > budget {
                if first {
                    // Cut the only word to fit (the budget leaves room for a separator and
                    // at least two characters).
                    let mut room = budget.saturating_sub(used);
                    if let Some(c) = separator {
                        out.push_char(c);
                        room = room.saturating_sub(1);
                    }
                    for c in piece.chars().take(room) {
                        out.push_char(c);
                    }
                }
                break;
            }
            if let Some(c) = separator {
                out.push_char(c);
            }
            out.push(&piece);
            first = false;
            sentence_start = false;
            if !lang.punctuation.is_empty() && self.rng.random::<f64>() < 0.12 {
                let p = lang.punctuation[self.rng.random_range(0..lang.punctuation.len())];
                if out.chars - start + p.chars().count() <= budget {
                    out.push(p);
                    sentence_start = true;
                    if let Some(e) = inline.take() {
                        out.separate();
                        out.push(e);
                        placed = true;
                    }
                }
            }
        }
        self.word_buf = word;
        placed
    }

    /// What goes between two words: mostly a space (none in Japanese and Chinese, few in
    /// Thai), sometimes a line break or an invisible character.
    fn separator(&mut self, lang: &Lang) -> Option<char> {
        let r: f64 = self.rng.random();
        if r < self.shape.invisible_share {
            Some(tables::INVISIBLES[self.rng.random_range(0..tables::INVISIBLES.len())])
        } else if r < self.shape.invisible_share + 0.02 {
            Some('\n')
        } else if self.rng.random::<f64>() < lang.space {
            Some(' ')
        } else {
            None
        }
    }

    /// One word of `lang`: a real one for the most frequent ranks, else spelled from its rank.
    fn word(&mut self, lang: &Lang, table: &[Box<str>], out: &mut String) {
        let rank = self.word_ranks.draw(&mut self.rng);
        let known = lang.words.len() as u64;
        if rank <= known {
            out.push_str(lang.words[(rank - 1) as usize]);
        } else {
            spell(rank - known, table, true, out);
            final_form(out, lang.finals);
        }
    }
}

const BASE62: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// The hashtag of a rank (1 is the most frequent), without `#`. A pure function: the same
/// rank is the same tag in every generator. Distinct ranks give tags that differ even
/// case-insensitively. Frequent tags are short (`#ka`), rare ones longer (`#KozumiFans2024`).
pub fn hashtag(rank: u64) -> String {
    let h = mix(rank ^ TAG_SALT);
    let style_i = TABLES.tag_pick.pick_unit(unit(h));
    let style = &tables::TAG_STYLES[style_i];
    let mut s = String::with_capacity(24);
    spell(rank.max(1), &TABLES.tags[style_i], true, &mut s);
    let h = mix(h);
    if style.accent {
        accent_last_vowel(&mut s, h);
    }
    final_form(&mut s, style.finals);
    if style.latin {
        if h % 100 < 40 {
            // Latin tag syllables start with an ASCII consonant.
            if let Some(first) = s.get_mut(..1) {
                first.make_ascii_uppercase();
            }
        }
        if (h >> 8) % 100 < 15 {
            s.push_str(tables::TAG_WORDS[((h >> 16) % tables::TAG_WORDS.len() as u64) as usize]);
        }
        if (h >> 24) % 100 < 8 {
            s.push_str(
                tables::TAG_NUMBERS[((h >> 32) % tables::TAG_NUMBERS.len() as u64) as usize],
            );
        }
    } else if (h >> 24) % 100 < 5 {
        // Years and counters only: the `_live`-style suffixes are Latin.
        s.push_str(tables::TAG_NUMBERS[((h >> 32) % 7) as usize]);
    }
    s
}

/// The screen name of user `rank` among `users` (without `@`): ASCII letters, digits and
/// `_`, at most 15 characters, as Twitter allows; distinct ranks give names that differ even
/// case-insensitively. The rank is first permuted, so a name's length does not reveal how
/// active its user is.
pub fn screen_name(rank: u64, users: u64) -> String {
    let bits = (64 - users.max(2).leading_zeros()).max(8);
    let x = permute(rank.max(1) - 1, bits) + 1;
    let mut s = String::with_capacity(MAX_SCREEN_NAME);
    // Scrambled too: `x` fills only the low part of its length class, whose top syllable
    // would otherwise be one of the first few ("...ba", "...ci").
    spell(x, &TABLES.names, true, &mut s);
    let h = mix(rank ^ NAME_SALT);
    // Every name syllable is two ASCII bytes.
    let syllables = s.len() / 2;
    if h % 100 < 15 && syllables >= 2 && s.len() < MAX_SCREEN_NAME {
        let at = 2 * (1 + ((h >> 8) % (syllables as u64 - 1)) as usize);
        s.insert(at, '_');
    }
    if (h >> 16) % 100 < 25
        && let Some(first) = s.get_mut(..1)
    {
        first.make_ascii_uppercase();
    }
    if (h >> 24) % 100 < 35 {
        let digits = 1 + ((h >> 32) % 4) as u32;
        if s.len() + digits as usize <= MAX_SCREEN_NAME {
            let n = (h >> 40) % 10u64.pow(digits);
            let _ = write!(s, "{n}");
        }
    }
    s
}

/// The numeric id of user `rank`: distinct for distinct ranks, like Twitter's a mix of
/// legacy ids (below 2^32) and snowflake ids (~7e17..1.3e18, beyond the 2^53 a JavaScript
/// number holds exactly, below 2^63).
pub fn user_id(rank: u64) -> u64 {
    let r = rank.max(1) - 1;
    if r < (1 << 32) && mix(rank ^ ID_SALT) % 100 < 40 {
        12 + permute(r, 32)
    } else {
        700_000_000_000_000_000 + (permute(r, 50) << 9)
    }
}

/// Followers of user `rank`: log-normal around 120 (σ 1.6 in the logarithm, capped at 300
/// million), higher for more active users; fixed per user.
fn followers(rank: u64, users: u64) -> u64 {
    let h = mix(rank ^ FOLLOWERS_SALT);
    // Box–Muller from two hash-derived uniforms; u1 > 0, so the logarithm is finite.
    let u1 = ((h >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    let u2 = unit(mix(h));
    let z = (-2.0 * u1.ln()).sqrt() * (TAU * u2).cos();
    let activity = (users.max(1) as f64 / rank.max(1) as f64).ln().max(0.0);
    (120f64.ln() + 0.3 * activity + 1.6 * z)
        .exp()
        .min(300_000_000.0) as u64
}

/// Replaces the last ASCII vowel with an accented form chosen by `h`.
fn accent_last_vowel(s: &mut String, h: u64) {
    let Some(at) = s.bytes().rposition(|b| b"aeiou".contains(&b)) else {
        return;
    };
    let vowel = s.as_bytes()[at];
    if let Some((_, forms)) = tables::ACCENTS.iter().find(|(v, _)| *v == vowel) {
        let form = forms[((h >> 48) % forms.len() as u64) as usize];
        s.replace_range(at..at + 1, form);
    }
}

/// Writes the last letter in its word-final form (Hebrew כ → ך, ...).
fn final_form(s: &mut String, finals: &[(char, char)]) {
    if finals.is_empty() {
        return;
    }
    if let Some(last) = s.chars().next_back()
        && let Some((_, f)) = finals.iter().find(|(c, _)| *c == last)
    {
        s.pop();
        s.push(*f);
    }
}

/// Writes `n ≥ 1` in bijective base-`table.len()` numeration, one syllable per digit: an
/// injective map from numbers to syllable strings in which small numbers are short. With
/// `scramble`, numbers of the same length are first permuted (an affine map modulo the
/// count of that length), so consecutive ranks do not read as consecutive strings — as real
/// popular tags are not alphabetically clustered in an index.
fn spell(n: u64, table: &[Box<str>], scramble: bool, out: &mut String) {
    let base = table.len() as u64;
    if base < 2 {
        if let Some(only) = table.first() {
            out.push_str(only);
        }
        return;
    }
    let n = n.max(1);
    let (mut start, mut size, mut digits) = (1u64, base, 1u32);
    while n - start >= size {
        start += size;
        size = size.saturating_mul(base);
        digits += 1;
    }
    let mut offset = n - start;
    if scramble {
        // 1,000,000,007 is prime, so coprime to `size` = base^digits: the map is a bijection.
        offset = ((u128::from(offset) * 1_000_000_007 + 0x5DEE_CE66D) % u128::from(size)) as u64;
    }
    for _ in 0..digits {
        out.push_str(&table[(offset % base) as usize]);
        offset /= base;
    }
}

const TAG_SALT: u64 = 0x7461_6773_0000_0001;
const NAME_SALT: u64 = 0x6e61_6d65_0000_0002;
const ID_SALT: u64 = 0x6964_7300_0000_0003;
const FOLLOWERS_SALT: u64 = 0x666f_6c6c_0000_0004;

/// SplitMix64's finaliser: a fast, well-mixed hash of a `u64`.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A hash as a uniform number in [0, 1).
fn unit(h: u64) -> f64 {
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// A bijection of `[0, 2^bits)` that looks random: an addition, multiplications by odd
/// constants and xor-shifts, each invertible modulo `2^bits`.
fn permute(x: u64, bits: u32) -> u64 {
    let bits = bits.clamp(1, 64);
    let mask = if bits == 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    };
    let shift = bits.div_ceil(2);
    // The offset keeps 0 from mapping to 0 (rank 1 would get the round id 7e17).
    let mut x = x.wrapping_add(0x2545_F491_4F6C_DD1D) & mask;
    for m in [
        0x9E37_79B9_7F4A_7C15u64,
        0xBF58_476D_1CE4_E5B9,
        0x94D0_49BB_1331_11EB,
    ] {
        x = x.wrapping_mul(m) & mask;
        x ^= x >> shift;
    }
    x
}

fn lang_index(code: &str) -> Option<usize> {
    tables::LANGS.iter().position(|l| l.code == code)
}

/// Zipf-distributed ranks in `1..=n`.
struct Ranks(Option<Zipf<f64>>);

impl Ranks {
    fn new(n: u64, exponent: f64) -> Self {
        // Rejected only for n < 1 or a negative/NaN exponent, which `Shape::sanitized` rules
        // out; a generator without a law would then draw rank 1 every time.
        Ranks(Zipf::new(n as f64, exponent).ok())
    }

    fn draw(&self, rng: &mut Xoshiro256PlusPlus) -> u64 {
        self.0.as_ref().map_or(1, |z| z.sample(rng) as u64).max(1)
    }
}

/// Picks an index with probability proportional to its weight.
struct Cumulative {
    /// Running sums of the weights (non-finite and negative weights count as zero).
    ends: Vec<f64>,
}

impl Cumulative {
    fn new(weights: impl IntoIterator<Item = f64>) -> Self {
        let mut total = 0.0;
        let ends = weights
            .into_iter()
            .map(|w| {
                total += if w.is_finite() && w > 0.0 { w } else { 0.0 };
                total
            })
            .collect();
        Cumulative { ends }
    }

    fn pick(&self, rng: &mut Xoshiro256PlusPlus) -> usize {
        self.pick_unit(rng.random::<f64>())
    }

    /// The index for a uniform `u` in [0, 1): 0 when every weight is zero.
    fn pick_unit(&self, u: f64) -> usize {
        let total = self.ends.last().copied().unwrap_or(0.0);
        if total <= 0.0 {
            return 0;
        }
        let x = u * total;
        self.ends
            .partition_point(|&end| end <= x)
            .min(self.ends.len() - 1)
    }
}

/// A text and its length in `char`s, kept as it grows.
struct Text {
    s: String,
    chars: usize,
}

impl Text {
    fn with_capacity(bytes: usize) -> Self {
        Text {
            s: String::with_capacity(bytes),
            chars: 0,
        }
    }

    fn push(&mut self, piece: &str) {
        self.s.push_str(piece);
        self.chars += piece.chars().count();
    }

    fn push_char(&mut self, c: char) {
        self.s.push(c);
        self.chars += 1;
    }

    /// A space, unless the text is empty.
    fn separate(&mut self) {
        if self.chars > 0 {
            self.push_char(' ');
        }
    }
}

/// Syllable tables, built once per process from [`tables`].
struct Tables {
    /// Per language of [`tables::LANGS`].
    langs: Vec<Vec<Box<str>>>,
    /// Per style of [`tables::TAG_STYLES`].
    tags: Vec<Vec<Box<str>>>,
    tag_pick: Cumulative,
    /// Screen-name syllables: ASCII consonant + vowel.
    names: Vec<Box<str>>,
}

static TABLES: LazyLock<Tables> = LazyLock::new(|| Tables {
    langs: tables::LANGS
        .iter()
        .map(|l| syllables(&l.syllables))
        .collect(),
    tags: tables::TAG_STYLES
        .iter()
        .map(|t| syllables(&t.syllables))
        .collect(),
    tag_pick: Cumulative::new(tables::TAG_STYLES.iter().map(|t| t.weight)),
    names: syllables(&Spec::Parts {
        prefixes: &[""],
        cores: Cores::Chars(tables::LATIN_NAME_CONSONANTS),
        suffixes: tables::LATIN_NAME_VOWELS,
    }),
});

fn syllables(spec: &Spec) -> Vec<Box<str>> {
    match spec {
        Spec::Parts {
            prefixes,
            cores,
            suffixes,
        } => {
            let cores: Vec<&str> = match cores {
                Cores::Chars(s) => s
                    .char_indices()
                    .map(|(i, c)| &s[i..i + c.len_utf8()])
                    .collect(),
                Cores::Tokens(s) => s.split_whitespace().collect(),
            };
            let mut out = Vec::with_capacity(prefixes.len() * cores.len() * suffixes.len());
            for p in prefixes.iter() {
                for c in &cores {
                    for x in suffixes.iter() {
                        out.push(format!("{p}{c}{x}").into_boxed_str());
                    }
                }
            }
            out
        }
        Spec::Hangul {
            initials,
            medials,
            finals,
        } => {
            let mut out = Vec::with_capacity(initials.len() * medials.len() * finals.len());
            for l in initials.iter() {
                for v in medials.iter() {
                    for t in finals.iter() {
                        if let Some(c) = char::from_u32(0xAC00 + (l * 21 + v) * 28 + t) {
                            out.push(c.to_string().into_boxed_str());
                        }
                    }
                }
            }
            out
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
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
                if text.contains("e\u{301}")
                    || text.contains("a\u{303}")
                    || text.contains("a\u{301}")
                {
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
                        || !(c.is_control()
                            || matches!(c as u32, 0xFFFE | 0xFFFF | 0xFDD0..=0xFDEF)),
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
                    tables::LATIN_NAME_CONSONANTS.as_bytes().contains(&p[0])
                        && b"aeiou".contains(&p[1])
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
}
