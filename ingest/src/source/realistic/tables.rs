//! The static data of the realistic generator: languages (weights, scripts, frequent words,
//! syllables), hashtag styles, emoji.
//!
//! Kept apart from the generator so the logic reads without scrolling past alphabets. Combining
//! marks (Thai and Devanagari vowel signs, Arabic harakat, Hebrew niqqud) are written as
//! `\u{..}` escapes: alone in a literal they render on the quote mark and are easy to lose.
//!
//! Invariant the hashtag and screen-name spelling relies on (tested in the parent module):
//! every *tag* syllable table has no duplicate entries, and every syllable in it is one
//! "starter" character followed by at most one non-starter mark, so a spelled name decodes to
//! exactly one digit sequence; the tag styles' alphabets are pairwise disjoint.

/// The script a language's words are written in; `None` for `und` (no words: emoji, tags,
/// mentions, links only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Script {
    /// Latin, with or without diacritics.
    Latin,
    /// Cyrillic.
    Cyrillic,
    /// Greek.
    Greek,
    /// Arabic script (Arabic, Persian, Urdu); right to left.
    Arabic,
    /// Hebrew; right to left.
    Hebrew,
    /// Han ideographs, with kana for Japanese.
    Cjk,
    /// Hangul syllable blocks.
    Hangul,
    /// Thai (no spaces between words).
    Thai,
    /// Devanagari.
    Devanagari,
    /// No words at all.
    None,
}

/// How the syllables of a script are listed.
pub(super) enum Cores {
    /// Every character of the string is one core.
    Chars(&'static str),
    /// Whitespace-separated tokens.
    Tokens(&'static str),
}

/// A syllable table: every `prefix + core + suffix`, or Hangul blocks composed from jamo
/// indices (`U+AC00 + (initial × 21 + medial) × 28 + final`). Repeated entries weight a
/// choice in *text* tables; tag tables have none (see the module doc).
pub(super) enum Spec {
    /// Cartesian product of the three lists.
    Parts {
        /// What may come before the core (Thai leading vowels, the Arabic article).
        prefixes: &'static [&'static str],
        /// The syllable's starting letters.
        cores: Cores,
        /// What may follow (vowels, vowel signs, marks).
        suffixes: &'static [&'static str],
    },
    /// Hangul syllable blocks.
    Hangul {
        /// Indexes of leading consonants (0 = ㄱ .. 18 = ㅎ).
        initials: &'static [u32],
        /// Indexes of vowels (0 = ㅏ .. 20 = ㅣ).
        medials: &'static [u32],
        /// Indexes of final consonants (0 = none).
        finals: &'static [u32],
    },
}

/// One language of the stream.
pub(super) struct Lang {
    /// The `lang` value (Twitter's codes: `in` for Indonesian, `und` for undetermined).
    pub code: &'static str,
    /// Default weight, in percent of events (roughly a 2020s sample stream).
    pub weight: f64,
    /// The script of its words.
    pub script: Script,
    /// The most frequent words, most frequent first: Zipf ranks 1..=len map to these, higher
    /// ranks to spelled words.
    pub words: &'static [&'static str],
    /// Syllables of the words beyond `words`.
    pub syllables: Spec,
    /// Chance of a space between two words (1 for spaced scripts, 0 for Chinese and Japanese).
    pub space: f64,
    /// Whether sentences start with a capital letter.
    pub cased: bool,
    /// Twitter's weighted length: CJK and Hangul count 2, so their tweets hold half as many
    /// characters.
    pub width: usize,
    /// What may end a sentence or clause.
    pub punctuation: &'static [&'static str],
    /// Letters written differently at the end of a word (Hebrew final forms).
    pub finals: &'static [(char, char)],
    /// Where geotagged posts of this language cluster (longitude, latitude).
    pub city: (f64, f64),
}

const LATIN_PUNCT: &[&str] = &[".", ",", "!", "?", "…", "!!", "?!", ":", " -"];
const ARABIC_PUNCT: &[&str] = &["،", "؟", ".", "!", "…"];
const HEBREW_FINALS: &[(char, char)] =
    &[('כ', 'ך'), ('מ', 'ם'), ('נ', 'ן'), ('פ', 'ף'), ('צ', 'ץ')];
/// Hiragana, katakana, then common kanji.
const KANA_AND_KANJI: &str = concat!(
    "あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわをん",
    "アイウエオカキクケコサシスセソタチツテトナニヌネノハヒフヘホマミムメモヤユヨラリルレロワヲン",
    "東京大阪日本人語学生先年月火水木金土山川田天気雨雪花愛猫犬夢歌映画試合選手優勝応援拡散希望",
    "新作公開発売予定記念誕祭今夜朝昼食旅行写真動配信実況投稿話題速報地震台風情",
);
const HANZI: &str = concat!(
    "的一是不了人我在有他这中大来上个国们到说和地也子时道出而要于就下得可你年生自会那后能对着",
    "事其里所去行过家十用发天如然作方成者多日都三小军二无同么经法当起与好看学进种将还分此心前",
    "面又定见只主没公从",
);
const ARABIC_LETTERS: &str = "ابتثجحخدذرزسشصضطظعغفقكلمنهوي";
const THAI_CONSONANTS: &str = "กขคงจชซดตถทนบปผพฟมยรลวสหอ";
const DEVANAGARI_CONSONANTS: &str = "कखगघचछजझटठडढतथदधनपफबभमयरलवशषसह";
const CYRILLIC_CONSONANTS: &str = "бвгджзклмнпрстфхцчшщ";
const HEBREW_LETTERS: &str = "אבגדהוזחטיכלמנסעפצקרשת";
/// Consonants and vowels of Latin tag and screen-name syllables: single ASCII letters, so
/// every syllable is exactly two bytes (screen names rely on it to place an underscore).
pub(super) const LATIN_NAME_CONSONANTS: &str = "bcdfghjklmnprstvyz";
pub(super) const LATIN_NAME_VOWELS: &[&str] = &["a", "e", "i", "o", "u"];

const NO_AFFIX: &[&str] = &[""];

/// Default languages. Weights sum to ~94; they are normalised.
pub(super) const LANGS: &[Lang] = &[
    Lang {
        code: "en",
        weight: 31.0,
        script: Script::Latin,
        words: &[
            "the", "I", "to", "a", "and", "you", "is", "in", "it", "of", "my", "for", "this",
            "that", "me", "on", "so", "be", "with", "just", "we", "lol", "love", "your", "have",
            "not", "are", "but", "all", "like", "what", "&amp;", "can", "get", "now", "out", "one",
            "good", "day", "new", "time", "people", "know", "see", "go", "today", "thank", "happy",
            "u", "omg",
        ],
        syllables: Spec::Parts {
            prefixes: NO_AFFIX,
            cores: Cores::Tokens("b c d f g h j k l m n p r s t v w y z st th ch sh br tr pl gr"),
            suffixes: &[
                "a", "e", "i", "o", "u", "ee", "ou", "ea", "y", "ay", "er", "in",
            ],
        },
        space: 1.0,
        cased: true,
        width: 1,
        punctuation: LATIN_PUNCT,
        finals: &[],
        city: (-73.99, 40.73),
    },
    Lang {
        code: "ja",
        weight: 16.0,
        script: Script::Cjk,
        words: &[
            "の",
            "に",
            "は",
            "を",
            "が",
            "と",
            "て",
            "た",
            "です",
            "ます",
            "した",
            "する",
            "いる",
            "こと",
            "これ",
            "それ",
            "今日",
            "本当",
            "ありがとう",
            "おめでとう",
            "かわいい",
            "すごい",
            "好き",
            "www",
            "笑",
            "草",
            "やばい",
            "ちゃん",
            "さん",
        ],
        syllables: Spec::Parts {
            prefixes: NO_AFFIX,
            cores: Cores::Chars(KANA_AND_KANJI),
            suffixes: &["", "", "", "", "", "", "っ", "ー", "ん"],
        },
        space: 0.0,
        cased: false,
        width: 2,
        punctuation: &["。", "、", "！", "？", "…", "♪", "（笑）", "\u{3000}"],
        finals: &[],
        city: (139.69, 35.69),
    },
    Lang {
        code: "es",
        weight: 8.0,
        script: Script::Latin,
        words: &[
            "de", "que", "la", "el", "y", "en", "a", "no", "me", "es", "lo", "por", "un", "se",
            "los", "con", "mi", "para", "una", "te", "las", "si", "más", "pero", "qué", "ya",
            "jajaja", "está", "muy", "bien", "todo", "hoy", "amor", "así", "también", "años",
            "niño", "¿", "¡",
        ],
        syllables: Spec::Parts {
            prefixes: NO_AFFIX,
            cores: Cores::Tokens("b c d f g h j l m n p r s t v z ñ ll ch rr br tr"),
            suffixes: &[
                "a", "e", "i", "o", "u", "á", "é", "í", "ó", "ú", "ue", "ie", "as", "os",
            ],
        },
        space: 1.0,
        cased: true,
        width: 1,
        punctuation: LATIN_PUNCT,
        finals: &[],
        city: (-99.13, 19.43),
    },
    Lang {
        code: "und",
        weight: 8.0,
        script: Script::None,
        words: &[],
        syllables: Spec::Parts {
            prefixes: NO_AFFIX,
            cores: Cores::Tokens("x y"),
            suffixes: NO_AFFIX,
        },
        space: 1.0,
        cased: false,
        width: 1,
        punctuation: &[],
        finals: &[],
        city: (-0.13, 51.51),
    },
    Lang {
        code: "pt",
        weight: 5.5,
        script: Script::Latin,
        words: &[
            "que",
            "de",
            "não",
            "e",
            "o",
            "a",
            "eu",
            "é",
            "do",
            "da",
            "em",
            "um",
            "pra",
            "com",
            "me",
            "se",
            "mas",
            "na",
            "no",
            "você",
            "tá",
            "isso",
            "muito",
            "mais",
            "kkkkk",
            "só",
            "já",
            "ser",
            "bem",
            "hoje",
            "então",
            "coração",
            "ação",
        ],
        syllables: Spec::Parts {
            prefixes: NO_AFFIX,
            cores: Cores::Tokens("b c d f g j l m n p r s t v x ç lh nh ch br tr"),
            suffixes: &[
                "a", "e", "i", "o", "u", "ã", "õ", "á", "é", "ê", "ô", "ão", "ões", "as",
            ],
        },
        space: 1.0,
        cased: true,
        width: 1,
        punctuation: LATIN_PUNCT,
        finals: &[],
        city: (-46.63, -23.55),
    },
    Lang {
        code: "ar",
        weight: 4.5,
        script: Script::Arabic,
        words: &[
            "في",
            "من",
            "على",
            "و",
            "الله",
            "ما",
            "لا",
            "يا",
            "أن",
            "إلى",
            "هذا",
            "كل",
            "عن",
            "اللهم",
            "مع",
            "هههه",
            "الحمد",
            "شكرا",
            "كورة",
            "اليوم",
        ],
        syllables: Spec::Parts {
            prefixes: &["", "", "", "", "ال"],
            cores: Cores::Chars("ابتثجحخدذرزسشصضطظعغفقكلمنهويةءأإ"),
            // Harakat (fatha, damma, kasra, shadda) on a few letters, as in religious and
            // poetic tweets.
            suffixes: &[
                "", "", "", "", "", "", "ا", "و", "ي", "\u{064E}", "\u{064F}", "\u{0650}",
                "\u{0651}",
            ],
        },
        space: 1.0,
        cased: false,
        width: 1,
        punctuation: ARABIC_PUNCT,
        finals: &[],
        city: (46.72, 24.69),
    },
    Lang {
        code: "ko",
        weight: 4.0,
        script: Script::Hangul,
        words: &[
            "이",
            "그",
            "저",
            "너무",
            "진짜",
            "정말",
            "오늘",
            "우리",
            "사랑해",
            "ㅋㅋㅋ",
            "ㅠㅠ",
            "방탄",
            "감사합니다",
            "좋아",
            "있는",
            "하는",
            "것",
            "수",
            "나",
            "더",
        ],
        syllables: Spec::Hangul {
            initials: &[0, 2, 3, 5, 6, 7, 9, 11, 12, 14, 15, 16, 17, 18],
            medials: &[0, 1, 4, 5, 8, 12, 13, 17, 18, 20],
            finals: &[0, 0, 0, 0, 1, 4, 8, 16, 21],
        },
        space: 1.0,
        cased: false,
        width: 2,
        punctuation: &[".", "!", "?", "~", "…", "ㅠ"],
        finals: &[],
        city: (126.98, 37.57),
    },
    Lang {
        code: "th",
        weight: 3.5,
        script: Script::Thai,
        words: &[
            "ที่",
            "และ",
            "ไม่",
            "มี",
            "เป็น",
            "ของ",
            "การ",
            "ใน",
            "ได้",
            "ให้",
            "จะ",
            "ว่า",
            "นี้",
            "คน",
            "ก็",
            "แล้ว",
            "กับ",
            "555",
            "ค่ะ",
            "ครับ",
            "น่ารัก",
        ],
        syllables: Spec::Parts {
            prefixes: &["", "", "", "", "เ", "แ", "โ", "ไ"],
            cores: Cores::Chars(THAI_CONSONANTS),
            suffixes: &[
                "",
                "",
                "\u{0E31}",
                "\u{0E34}",
                "\u{0E35}",
                "\u{0E36}",
                "\u{0E38}",
                "\u{0E39}",
                "า",
                "\u{0E48}",
                "\u{0E49}",
                "\u{0E35}\u{0E48}",
                "\u{0E49}า",
                "ง",
                "น",
            ],
        },
        space: 0.15,
        cased: false,
        width: 1,
        punctuation: &[" ", "!", "?", "ๆ", "…"],
        finals: &[],
        city: (100.50, 13.76),
    },
    Lang {
        code: "in",
        weight: 3.0,
        script: Script::Latin,
        words: &[
            "yang", "di", "dan", "ini", "itu", "aku", "ga", "ke", "ada", "dari", "kamu", "apa",
            "juga", "aja", "udah", "bisa", "wkwk", "banget", "sama", "tidak",
        ],
        syllables: Spec::Parts {
            prefixes: NO_AFFIX,
            cores: Cores::Tokens("b c d f g h j k l m n p r s t w y ng ny"),
            suffixes: &["a", "e", "i", "o", "u", "an", "ang", "ah"],
        },
        space: 1.0,
        cased: true,
        width: 1,
        punctuation: LATIN_PUNCT,
        finals: &[],
        city: (106.85, -6.21),
    },
    Lang {
        code: "fr",
        weight: 2.0,
        script: Script::Latin,
        words: &[
            "de",
            "la",
            "le",
            "et",
            "les",
            "à",
            "je",
            "que",
            "pas",
            "un",
            "en",
            "c'est",
            "est",
            "pour",
            "une",
            "qui",
            "des",
            "du",
            "on",
            "tu",
            "ça",
            "mais",
            "très",
            "été",
            "être",
            "où",
            "français",
            "déjà",
            "«",
            "»",
        ],
        syllables: Spec::Parts {
            prefixes: NO_AFFIX,
            cores: Cores::Tokens("b c d f g j l m n p r s t v ch qu tr br"),
            suffixes: &[
                "a", "e", "i", "o", "u", "é", "è", "ê", "à", "ou", "ai", "eau", "on", "an", "œu",
            ],
        },
        space: 1.0,
        cased: true,
        width: 1,
        punctuation: LATIN_PUNCT,
        finals: &[],
        city: (2.35, 48.86),
    },
    Lang {
        code: "tr",
        weight: 2.0,
        script: Script::Latin,
        words: &[
            "bir",
            "ve",
            "bu",
            "da",
            "de",
            "ne",
            "çok",
            "için",
            "ben",
            "mi",
            "ama",
            "gibi",
            "daha",
            "sen",
            "var",
            "yok",
            "şey",
            "değil",
            "güzel",
            "iyi",
            "İstanbul",
            "ağır",
        ],
        syllables: Spec::Parts {
            prefixes: NO_AFFIX,
            cores: Cores::Tokens("b c ç d f g ğ h k l m n p r s ş t v y z"),
            suffixes: &["a", "e", "ı", "i", "o", "ö", "u", "ü", "ar", "ler"],
        },
        space: 1.0,
        cased: true,
        width: 1,
        punctuation: LATIN_PUNCT,
        finals: &[],
        city: (28.98, 41.01),
    },
    Lang {
        code: "tl",
        weight: 1.2,
        script: Script::Latin,
        words: &[
            "ang", "ng", "sa", "na", "ko", "mo", "ako", "ka", "pa", "lang", "ba", "naman", "po",
            "yung", "hindi", "talaga", "salamat", "mahal",
        ],
        syllables: Spec::Parts {
            prefixes: NO_AFFIX,
            cores: Cores::Tokens("b d g h k l m n p r s t w y ng"),
            suffixes: &["a", "e", "i", "o", "u", "an", "ng"],
        },
        space: 1.0,
        cased: true,
        width: 1,
        punctuation: LATIN_PUNCT,
        finals: &[],
        city: (120.98, 14.60),
    },
    Lang {
        code: "hi",
        weight: 1.2,
        script: Script::Devanagari,
        words: &[
            "है",
            "के",
            "में",
            "की",
            "और",
            "का",
            "को",
            "से",
            "एक",
            "यह",
            "नहीं",
            "तो",
            "भी",
            "हैं",
            "पर",
            "कि",
            "जो",
            "कर",
            "मैं",
            "हम",
            "भारत",
            "धन्यवाद",
        ],
        syllables: Spec::Parts {
            prefixes: NO_AFFIX,
            cores: Cores::Tokens(
                "क ख ग घ च छ ज झ ट ठ ड ढ त थ द ध न प फ ब भ म य र ल व श ष स ह क्ष त्र ज्ञ श्र",
            ),
            suffixes: &[
                "",
                "",
                "\u{093E}",
                "\u{093F}",
                "\u{0940}",
                "\u{0941}",
                "\u{0942}",
                "\u{0947}",
                "\u{0948}",
                "\u{094B}",
                "\u{094C}",
                "\u{0902}",
                "\u{093E}\u{0902}",
            ],
        },
        space: 1.0,
        cased: false,
        width: 1,
        punctuation: &["।", "!", "?", ","],
        finals: &[],
        city: (77.21, 28.61),
    },
    Lang {
        code: "ru",
        weight: 1.0,
        script: Script::Cyrillic,
        words: &[
            "и",
            "в",
            "не",
            "на",
            "я",
            "что",
            "с",
            "это",
            "а",
            "как",
            "по",
            "но",
            "он",
            "так",
            "все",
            "да",
            "ты",
            "у",
            "мы",
            "очень",
            "спасибо",
            "сегодня",
            "привет",
            "ещё",
        ],
        syllables: Spec::Parts {
            prefixes: NO_AFFIX,
            cores: Cores::Chars(CYRILLIC_CONSONANTS),
            suffixes: &["а", "е", "и", "о", "у", "ы", "я", "ю", "ё", "ь", "ой", "ет"],
        },
        space: 1.0,
        cased: true,
        width: 1,
        punctuation: LATIN_PUNCT,
        finals: &[],
        city: (37.62, 55.76),
    },
    Lang {
        code: "it",
        weight: 0.8,
        script: Script::Latin,
        words: &[
            "di", "e", "che", "il", "la", "non", "è", "per", "un", "mi", "a", "in", "sono", "ma",
            "ho", "più", "perché", "città", "però", "grazie",
        ],
        syllables: Spec::Parts {
            prefixes: NO_AFFIX,
            cores: Cores::Tokens("b c d f g l m n p r s t v z gl gn sc"),
            suffixes: &["a", "e", "i", "o", "u", "à", "è", "ì", "ò", "ù"],
        },
        space: 1.0,
        cased: true,
        width: 1,
        punctuation: LATIN_PUNCT,
        finals: &[],
        city: (12.50, 41.90),
    },
    Lang {
        code: "de",
        weight: 0.8,
        script: Script::Latin,
        words: &[
            "der", "die", "und", "ich", "das", "ist", "nicht", "zu", "es", "ein", "sie", "mit",
            "auf", "für", "den", "sich", "auch", "so", "wie", "mal", "schön", "über", "heute",
            "Grüße", "Straße",
        ],
        syllables: Spec::Parts {
            prefixes: NO_AFFIX,
            cores: Cores::Tokens("b d f g h k l m n p r s t w z sch st ß pf"),
            suffixes: &[
                "a", "e", "i", "o", "u", "ä", "ö", "ü", "ei", "au", "en", "er",
            ],
        },
        space: 1.0,
        cased: true,
        width: 1,
        punctuation: LATIN_PUNCT,
        finals: &[],
        city: (13.40, 52.52),
    },
    Lang {
        code: "fa",
        weight: 0.6,
        script: Script::Arabic,
        words: &[
            "و",
            "در",
            "به",
            "از",
            "که",
            "این",
            "را",
            "با",
            "است",
            "من",
            "برای",
            "آن",
            "یک",
            "هم",
            "ما",
            "خیلی",
            "چه",
            "گفت",
            "می\u{200C}خواهم",
            "پیام",
        ],
        syllables: Spec::Parts {
            prefixes: NO_AFFIX,
            cores: Cores::Chars("ابپتثجچحخدذرزژسشصضطظعغفقکگلمنوهی"),
            suffixes: &["", "", "", "ا", "و", "ی"],
        },
        space: 1.0,
        cased: false,
        width: 1,
        punctuation: ARABIC_PUNCT,
        finals: &[],
        city: (51.39, 35.69),
    },
    Lang {
        code: "zh",
        weight: 0.5,
        script: Script::Cjk,
        words: &[
            "的",
            "了",
            "是",
            "我",
            "不",
            "在",
            "人",
            "有",
            "这",
            "他",
            "们",
            "你",
            "来",
            "大",
            "好",
            "说",
            "中国",
            "今天",
            "谢谢",
            "哈哈哈",
        ],
        syllables: Spec::Parts {
            prefixes: NO_AFFIX,
            cores: Cores::Chars(HANZI),
            suffixes: NO_AFFIX,
        },
        space: 0.0,
        cased: false,
        width: 2,
        punctuation: &["。", "，", "！", "？", "…", "～"],
        finals: &[],
        city: (121.56, 25.03),
    },
    Lang {
        code: "ur",
        weight: 0.3,
        script: Script::Arabic,
        words: &[
            "کے",
            "کی",
            "ہے",
            "میں",
            "اور",
            "کا",
            "کو",
            "سے",
            "نہیں",
            "یہ",
            "پاکستان",
            "شکریہ",
        ],
        syllables: Spec::Parts {
            prefixes: NO_AFFIX,
            cores: Cores::Chars("ابپتٹثجچحخدڈذرڑزژسشصضطظعغفقکگلمنوہھی"),
            suffixes: &["", "", "ا", "و", "ی", "ں", "ے"],
        },
        space: 1.0,
        cased: false,
        width: 1,
        punctuation: ARABIC_PUNCT,
        finals: &[],
        city: (67.01, 24.86),
    },
    Lang {
        code: "el",
        weight: 0.2,
        script: Script::Greek,
        words: &[
            "και",
            "το",
            "να",
            "η",
            "του",
            "της",
            "που",
            "τα",
            "με",
            "θα",
            "δεν",
            "είναι",
            "για",
            "σε",
            "πολύ",
            "ευχαριστώ",
            "σήμερα",
        ],
        syllables: Spec::Parts {
            prefixes: NO_AFFIX,
            cores: Cores::Chars("βγδζθκλμνξπρστφχψ"),
            suffixes: &[
                "α", "ε", "η", "ι", "ο", "υ", "ω", "ά", "έ", "ή", "ί", "ό", "ύ", "ώ", "ου", "αι",
            ],
        },
        space: 1.0,
        cased: true,
        width: 1,
        punctuation: &[".", ",", "!", ";", "…"],
        finals: &[],
        city: (23.73, 37.98),
    },
    Lang {
        code: "he",
        weight: 0.2,
        script: Script::Hebrew,
        words: &[
            "של",
            "את",
            "על",
            "לא",
            "זה",
            "אני",
            "עם",
            "כל",
            "מה",
            "גם",
            "הוא",
            "היום",
            "תודה",
            "שלום",
            "אבל",
            "יש",
            "ישראל",
        ],
        syllables: Spec::Parts {
            prefixes: NO_AFFIX,
            cores: Cores::Chars(HEBREW_LETTERS),
            suffixes: &["", "", "", "", "ו", "י", "\u{05B8}", "\u{05B7}"],
        },
        space: 1.0,
        cased: false,
        width: 1,
        punctuation: &[".", ",", "!", "?", "…"],
        finals: HEBREW_FINALS,
        city: (34.78, 32.09),
    },
];

/// How a hashtag of a given rank is spelled. Which style a rank gets is a pure function of
/// the rank (a hash), so the same rank is always the same tag.
pub(super) struct TagStyle {
    /// Share of hashtag ranks, in percent.
    pub weight: f64,
    /// Syllables, one per digit of the rank (see the module doc for their invariant).
    pub syllables: Spec,
    /// Latin decorations: capitalisation, a CamelCase word, a year or `_suffix`.
    pub latin: bool,
    /// The last vowel carries a diacritic (á, ã, ö, ı, ...): Spanish, Portuguese, Turkish tags.
    pub accent: bool,
    /// Word-final letter forms, as for [`Lang::finals`].
    pub finals: &'static [(char, char)],
}

pub(super) const TAG_STYLES: &[TagStyle] = &[
    TagStyle {
        weight: 52.0,
        syllables: Spec::Parts {
            prefixes: NO_AFFIX,
            cores: Cores::Chars(LATIN_NAME_CONSONANTS),
            suffixes: LATIN_NAME_VOWELS,
        },
        latin: true,
        accent: false,
        finals: &[],
    },
    TagStyle {
        weight: 8.0,
        syllables: Spec::Parts {
            prefixes: NO_AFFIX,
            cores: Cores::Chars(LATIN_NAME_CONSONANTS),
            suffixes: LATIN_NAME_VOWELS,
        },
        latin: true,
        accent: true,
        finals: &[],
    },
    TagStyle {
        weight: 15.0,
        syllables: Spec::Parts {
            prefixes: NO_AFFIX,
            cores: Cores::Chars(KANA_AND_KANJI),
            suffixes: NO_AFFIX,
        },
        latin: false,
        accent: false,
        finals: &[],
    },
    TagStyle {
        weight: 7.0,
        syllables: Spec::Hangul {
            initials: &[0, 2, 3, 5, 6, 7, 9, 11, 12, 14, 15, 16, 17, 18],
            medials: &[0, 1, 4, 5, 8, 12, 13, 17, 18, 20],
            finals: &[0, 1, 4, 8, 16, 21],
        },
        latin: false,
        accent: false,
        finals: &[],
    },
    TagStyle {
        weight: 6.0,
        syllables: Spec::Parts {
            prefixes: NO_AFFIX,
            cores: Cores::Chars(ARABIC_LETTERS),
            suffixes: NO_AFFIX,
        },
        latin: false,
        accent: false,
        finals: &[],
    },
    TagStyle {
        weight: 4.0,
        syllables: Spec::Parts {
            prefixes: NO_AFFIX,
            cores: Cores::Chars(THAI_CONSONANTS),
            suffixes: &[
                "", "\u{0E31}", "\u{0E34}", "\u{0E35}", "\u{0E38}", "\u{0E39}", "\u{0E48}",
                "\u{0E49}",
            ],
        },
        latin: false,
        accent: false,
        finals: &[],
    },
    TagStyle {
        weight: 3.0,
        syllables: Spec::Parts {
            prefixes: NO_AFFIX,
            cores: Cores::Chars(CYRILLIC_CONSONANTS),
            suffixes: &["а", "е", "и", "о", "у", "ы", "я", "ю"],
        },
        latin: false,
        accent: false,
        finals: &[],
    },
    TagStyle {
        weight: 3.0,
        syllables: Spec::Parts {
            prefixes: NO_AFFIX,
            cores: Cores::Chars(DEVANAGARI_CONSONANTS),
            suffixes: &[
                "", "\u{093E}", "\u{093F}", "\u{0940}", "\u{0941}", "\u{0942}", "\u{0947}",
                "\u{0948}", "\u{094B}", "\u{094C}", "\u{0902}",
            ],
        },
        latin: false,
        accent: false,
        finals: &[],
    },
    TagStyle {
        weight: 2.0,
        syllables: Spec::Parts {
            prefixes: NO_AFFIX,
            cores: Cores::Chars(HEBREW_LETTERS),
            suffixes: NO_AFFIX,
        },
        latin: false,
        accent: false,
        finals: HEBREW_FINALS,
    },
];

/// Accented forms of each ASCII vowel, for the `accent` tag style.
pub(super) const ACCENTS: &[(u8, &[&str])] = &[
    (b'a', &["á", "ã", "â", "à"]),
    (b'e', &["é", "ê", "è"]),
    (b'i', &["í", "ı"]),
    (b'o', &["ó", "õ", "ô", "ö"]),
    (b'u', &["ú", "ü"]),
];

/// CamelCase words appended to Latin tags (`#KamoFans`). None is itself a sequence of
/// consonant-vowel syllables and none ends another, so a lowercased tag still decodes to one
/// rank: tags stay distinct case-insensitively, as Twitter compares them and as the rollup
/// keys (lowercased) need.
pub(super) const TAG_WORDS: &[&str] = &[
    "Day",
    "News",
    "Fc",
    "Tv",
    "Army",
    "Out",
    "Now",
    "Art",
    "Week",
    "Vibes",
    "Edit",
    "Fans",
    "Official",
    "Challenge",
    "Lovers",
    "Nft",
];
/// Suffixes that start with a digit or `_`, never a letter of a tag alphabet.
pub(super) const TAG_NUMBERS: &[&str] = &[
    "2024",
    "2025",
    "2026",
    "1",
    "2",
    "3",
    "10",
    "_live",
    "_fans",
    "_official",
    "_tv",
];

/// One emoji choice.
pub(super) enum Emoji {
    /// A fixed sequence (a single emoji, with VS16, a ZWJ sequence, a keycap, a tag sequence).
    Seq(&'static str),
    /// An emoji that takes a skin-tone modifier (sometimes).
    Tone(&'static str),
    /// A national flag: two regional indicators from [`FLAGS`].
    Flag,
}

/// Emoji with weights roughly in the order of real usage (😂 ❤️ 😭 🔥 lead), plus the hard
/// cases: ZWJ families, the rainbow flag (VS16 inside a ZWJ sequence), keycaps, a subdivision
/// flag (tag characters), newer emoji (Unicode 14).
pub(super) const EMOJI: &[(Emoji, f64)] = &[
    (Emoji::Seq("\u{1F602}"), 20.0),
    (Emoji::Seq("\u{2764}\u{FE0F}"), 14.0),
    (Emoji::Seq("\u{1F62D}"), 12.0),
    (Emoji::Seq("\u{1F525}"), 8.0),
    (Emoji::Seq("\u{1F97A}"), 6.0),
    (Emoji::Seq("\u{2728}"), 6.0),
    (Emoji::Tone("\u{1F64F}"), 5.0),
    (Emoji::Seq("\u{1F60D}"), 5.0),
    (Emoji::Seq("\u{1F923}"), 5.0),
    (Emoji::Seq("\u{1F495}"), 4.0),
    (Emoji::Tone("\u{1F44D}"), 4.0),
    (Emoji::Seq("\u{1F440}"), 3.0),
    (Emoji::Seq("\u{1F389}"), 3.0),
    (Emoji::Seq("\u{1F49C}"), 3.0),
    (Emoji::Seq("\u{1F60A}"), 3.0),
    (Emoji::Flag, 3.0),
    (Emoji::Seq("\u{1F499}"), 2.0),
    (Emoji::Tone("\u{1F44F}"), 2.0),
    (Emoji::Tone("\u{1F4AA}"), 2.0),
    (Emoji::Seq("\u{1F914}"), 2.0),
    (Emoji::Seq("\u{1F480}"), 2.0),
    (Emoji::Tone("\u{1F44B}"), 1.0),
    (Emoji::Seq("\u{263A}\u{FE0F}"), 1.0),
    (Emoji::Seq("\u{1F644}"), 1.0),
    (Emoji::Seq("\u{1F979}"), 1.0),
    (Emoji::Seq("\u{1FAE0}"), 1.0),
    (Emoji::Tone("\u{1FAF6}"), 1.0),
    (Emoji::Seq("\u{1F469}\u{200D}\u{1F4BB}"), 1.0),
    (
        Emoji::Seq("\u{1F468}\u{200D}\u{1F469}\u{200D}\u{1F467}\u{200D}\u{1F466}"),
        1.0,
    ),
    (Emoji::Seq("\u{1F3F3}\u{FE0F}\u{200D}\u{1F308}"), 1.0),
    (Emoji::Seq("\u{1F9D1}\u{1F3FE}\u{200D}\u{1F680}"), 1.0),
    (Emoji::Seq("\u{2764}\u{FE0F}\u{200D}\u{1F525}"), 1.0),
    (Emoji::Seq("\u{1F636}\u{200D}\u{1F32B}\u{FE0F}"), 1.0),
    (Emoji::Seq("\u{1F408}\u{200D}\u{2B1B}"), 1.0),
    (Emoji::Seq("1\u{FE0F}\u{20E3}"), 1.0),
    (Emoji::Seq("#\u{FE0F}\u{20E3}"), 0.5),
    (
        Emoji::Seq("\u{1F3F4}\u{E0067}\u{E0062}\u{E0065}\u{E006E}\u{E0067}\u{E007F}"),
        0.5,
    ),
];

/// Fitzpatrick modifiers 🏻 🏼 🏽 🏾 🏿.
pub(super) const SKIN_TONES: [char; 5] = [
    '\u{1F3FB}',
    '\u{1F3FC}',
    '\u{1F3FD}',
    '\u{1F3FE}',
    '\u{1F3FF}',
];

/// Country codes of flag emoji.
pub(super) const FLAGS: &[&str] = &[
    "JP", "BR", "US", "SA", "KR", "TH", "ES", "FR", "TR", "IN", "ID", "MX", "AR", "GB", "DE", "PS",
    "UA", "IL", "IR", "PH", "NG", "CO",
];

/// Characters real texts carry that are invisible or look like a space: zero-width space,
/// left-to-right and right-to-left marks, no-break space, ideographic space.
pub(super) const INVISIBLES: &[char] =
    &['\u{200B}', '\u{200E}', '\u{200F}', '\u{00A0}', '\u{3000}'];
