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

mod shape;
mod tables;

use std::f64::consts::TAU;
use std::fmt::Write as _;
use std::sync::LazyLock;

use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, StandardNormal, Zipf};
use serde_json::{Map, Value, json};
use unicode_normalization::UnicodeNormalization;

pub use shape::{Shape, ShapeError};
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
mod tests;
