//! The knobs of the realistic stream ([`Shape`]), their defaults and their checks.

use super::{MAX_TEXT_CHARS, MAX_VOCABULARY, lang_index, tables};

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
    pub(super) fn sanitized(mut self) -> Shape {
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
