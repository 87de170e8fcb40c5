//! The shared table of filter cases: (filter, document, expected), one row each.
//!
//! It lives in the test tree, not in the library (its big documents would otherwise be compiled
//! into every binary): `store::filter`'s unit tests include it with `#[path]` and run every row
//! through `Filter::matches`; the store contract suite (`contract::filter_*`) runs the same
//! rows through each engine (MongoDB: `find` with `Filter::to_mongo("")`, a change stream's
//! `$match` with `to_mongo("fullDocument.")`) and expects the same answers. The expectations follow MongoDB's manual (query operators, "Query an Array",
//! "Query on Embedded/Nested Documents", "Query for Null or Missing Fields") and, for the
//! corners the manual leaves open, the server's own path iterator and null-semantics tests.
//!
//! Documents carry no `_id` (a server adds its own; no filter reads it). Some carry keys that
//! start with `$` or contain dots, which MongoDB stores since 5.0.

use serde_json::{Value, json};

/// A document, spelled out so this file compiles both inside the library and in the tests.
type Document = serde_json::Map<String, Value>;

/// One row: does `filter` match `doc`?
#[derive(Clone, Debug)]
pub struct Case {
    /// The rule the row shows, for assertion messages.
    pub name: &'static str,
    /// The filter, as a client would send it.
    pub filter: Value,
    /// The document it is evaluated on.
    pub doc: Document,
    /// Whether MongoDB (and so `Filter::matches`) accepts `doc`.
    pub expected: bool,
}

/// Collects rows: one filter against several documents.
struct Table(Vec<Case>);

impl Table {
    fn add(&mut self, name: &'static str, filter: Value, rows: Vec<(Value, bool)>) {
        for (doc, expected) in rows {
            let doc = match doc {
                Value::Object(m) => m,
                // Every document below is an object; anything else would be a typo here.
                other => {
                    let mut m = Document::new();
                    m.insert("not_an_object".into(), other);
                    m
                }
            };
            self.0.push(Case {
                name,
                filter: filter.clone(),
                doc,
                expected,
            });
        }
    }
}

/// A tweet-like document, the shape the pipeline's sample source produces.
fn tweet(screen_name: &str, lang: &str, retweets: i64, hashtags: &[&str]) -> Value {
    json!({
        "text": format!("{screen_name} says hello"),
        "lang": lang,
        "retweet_count": retweets,
        "user": {"screen_name": screen_name, "followers_count": retweets * 7},
        "entities": {
            "hashtags": hashtags.iter().map(|t| json!({"text": t, "indices": [0, t.len()]})).collect::<Vec<_>>()
        },
        "tags": hashtags,
    })
}

/// A Wikimedia recent-change event: a `$schema` key and, in the wild, dotted keys beside the
/// `meta` object.
fn wikimedia(domain: &str, dotted_dt: &str, nested_dt: &str) -> Value {
    json!({
        "$schema": "/mediawiki/recentchange/1.0.0",
        "meta": {"domain": domain, "dt": nested_dt, "uri": format!("https://{domain}/wiki/X")},
        "meta.dt": dotted_dt,
        "type": "edit",
        "title": "\u{d1}and\u{fa}",
    })
}

/// A document of a few hundred kilobytes: thousands of hashtag objects, the interesting one
/// last, and a long text in several scripts.
fn big_document(last_tag: &str) -> Value {
    let mut hashtags: Vec<Value> = (0..4000)
        .map(|i| json!({"text": format!("tag{i}"), "indices": [i, i + 5]}))
        .collect();
    hashtags.push(json!({"text": last_tag, "indices": [9000, 9010]}));
    json!({
        "text": "長いテキスト — نص طويل — טקסט ארוך — 🚀".repeat(2000),
        "retweet_count": 4000,
        "entities": {"hashtags": hashtags},
    })
}

/// Long-tail screen names: a few frequent ones and many that appear once.
fn long_tail_names(n: usize) -> Vec<Value> {
    (0..n)
        .map(|i| match i % 4 {
            0 => json!(format!("user{i}")),
            1 => json!(format!("ユーザー{i}")),
            2 => json!(format!("مستخدم{i}")),
            _ => json!(format!("🦀rustacean{i}")),
        })
        .collect()
}

/// The shared table of filter cases, a few hundred rows covering every operator and rule of
/// the module doc, with unicode in several scripts, `$`-prefixed and dotted document keys, a
/// document of ~300 KB and a 500-name `$in` list.
///
/// The filter module's tests run every row through `Filter::matches`. The contract suite runs
/// the same rows against each engine (MongoDB 5.0 or later stores the `$`-prefixed and dotted
/// keys): store `doc`, query with the filter, and expect `expected`. Documents carry
/// no `_id` and no filter reads one, so the server may add its own.
pub fn cases() -> Vec<Case> {
    let mut t = Table(Vec::new());

    // --- The empty filter and implicit equality -------------------------------------------
    t.add(
        "{} matches every document",
        json!({}),
        vec![
            (json!({}), true),
            (tweet("a", "en", 0, &[]), true),
            (wikimedia("x", "1", "2"), true),
        ],
    );
    t.add(
        "implicit equality on a top-level field",
        json!({"lang": "ja"}),
        vec![
            (tweet("a", "ja", 1, &[]), true),
            (tweet("a", "en", 1, &[]), false),
            (json!({"text": "no lang"}), false),
            (json!({"lang": "JA"}), false),
            (json!({"lang": ["en", "ja"]}), true),
        ],
    );
    t.add(
        "several fields must all hold",
        json!({"lang": "ja", "retweet_count": {"$gte": 10}}),
        vec![
            (tweet("a", "ja", 10, &[]), true),
            (tweet("a", "ja", 9, &[]), false),
            (tweet("a", "en", 99, &[]), false),
        ],
    );

    // --- Dotted paths through objects --------------------------------------------------------
    t.add(
        "dotted path into an embedded object",
        json!({"user.screen_name": "ada"}),
        vec![
            (tweet("ada", "en", 0, &[]), true),
            (tweet("bob", "en", 0, &[]), false),
            (json!({"user": "ada"}), false),
            (json!({"user": {"name": "ada"}}), false),
        ],
    );
    t.add(
        "a numeric part is an object key when the value is an object",
        json!({"a.0": 1}),
        vec![
            (json!({"a": {"0": 1}}), true),
            (json!({"a": {"1": 1}}), false),
        ],
    );
    t.add(
        "a path through a scalar reaches nothing",
        json!({"user.screen_name.first": "a"}),
        vec![(tweet("a", "en", 0, &[]), false)],
    );

    // --- Arrays at the end of a path ---------------------------------------------------------
    t.add(
        "equality with an array field: any element",
        json!({"tags": "rust"}),
        vec![
            (json!({"tags": ["db", "rust"]}), true),
            (json!({"tags": ["db", "go"]}), false),
            (json!({"tags": []}), false),
            (json!({"tags": "rust"}), true),
            (json!({"tags": [["rust"]]}), false),
        ],
    );
    t.add(
        "equality with an array value: the whole array, exactly, or an element that is that array",
        json!({"tags": ["db", "rust"]}),
        vec![
            (json!({"tags": ["db", "rust"]}), true),
            (json!({"tags": ["rust", "db"]}), false),
            (json!({"tags": ["db", "rust", "go"]}), false),
            (json!({"tags": [["db", "rust"], "go"]}), true),
            (json!({"tags": "db"}), false),
        ],
    );
    t.add(
        "equality with the empty array",
        json!({"tags": []}),
        vec![
            (json!({"tags": []}), true),
            (json!({"tags": [[]]}), true),
            (json!({"tags": ["x"]}), false),
            (json!({}), false),
        ],
    );
    t.add(
        "array elements compare numerically",
        json!({"scores": [1, 2.5]}),
        vec![
            (json!({"scores": [1.0, 2.5]}), true),
            (json!({"scores": [1, 2]}), false),
        ],
    );

    // --- Paths through arrays of objects -----------------------------------------------------
    t.add(
        "dotted path through an array of objects",
        json!({"entities.hashtags.text": "rust"}),
        vec![
            (tweet("a", "en", 0, &["go", "rust"]), true),
            (tweet("a", "en", 0, &["go"]), false),
            (tweet("a", "en", 0, &[]), false),
            (json!({"entities": {"hashtags": {"text": "rust"}}}), true),
        ],
    );
    t.add(
        "arrays at several levels of one path",
        json!({"a.b.c": 3}),
        vec![
            (
                json!({"a": [{"b": [{"c": 1}, {"c": 3}]}, {"b": {"c": 2}}]}),
                true,
            ),
            (
                json!({"a": [{"b": [{"c": 1}]}, {"b": {"c": [4, 3]}}]}),
                true,
            ),
            (json!({"a": [{"b": [{"c": 1}]}, {"b": {"c": 2}}]}), false),
        ],
    );
    t.add(
        "arrays of arrays are not flattened on the way",
        json!({"a.b": 1}),
        vec![
            (json!({"a": [[{"b": 1}]]}), false),
            (json!({"a": [{"b": 1}]}), true),
        ],
    );
    t.add(
        "comparison through an array of objects",
        json!({"entities.hashtags.indices": {"$gt": 4}}),
        vec![
            (tweet("a", "en", 0, &["rust"]), false),
            (tweet("a", "en", 0, &["rustlang"]), true),
        ],
    );

    // --- Numeric parts index arrays ------------------------------------------------------------
    t.add(
        "a numeric part indexes an array",
        json!({"tags.0": "db"}),
        vec![
            (json!({"tags": ["db", "rust"]}), true),
            (json!({"tags": ["rust", "db"]}), false),
            (json!({"tags": []}), false),
        ],
    );
    t.add(
        "an index then a field",
        json!({"entities.hashtags.1.text": "rust"}),
        vec![
            (tweet("a", "en", 0, &["go", "rust"]), true),
            (tweet("a", "en", 0, &["rust", "go"]), false),
        ],
    );
    t.add(
        "an index into an array of arrays",
        json!({"m.0.1": 5}),
        vec![
            (json!({"m": [[4, 5]]}), true),
            (json!({"m": [[5, 4]]}), false),
        ],
    );
    t.add(
        "an element picked by index is compared as it is, not expanded",
        json!({"m.0": 4}),
        vec![
            (json!({"m": [[4, 5]]}), false),
            (json!({"m": [4, 5]}), true),
        ],
    );
    t.add(
        "an index part is canonical: 01 is not 1",
        json!({"tags.01": "b"}),
        vec![
            (json!({"tags": ["a", "b"]}), false),
            (json!({"tags": {"01": "b"}}), true),
        ],
    );
    t.add(
        "comparison by index with mixed integer and float",
        json!({"dim_cm.1": {"$gt": 25}}),
        vec![
            (json!({"dim_cm": [14, 25.5]}), true),
            (json!({"dim_cm": [30, 25]}), false),
            (json!({"dim_cm": [30]}), false),
        ],
    );

    // --- Comparisons and type brackets ---------------------------------------------------------
    t.add(
        "$gt/$lt on integers",
        json!({"n": {"$gt": 5}}),
        vec![
            (json!({"n": 6}), true),
            (json!({"n": 5}), false),
            (json!({"n": -7}), false),
            (json!({"n": 5.000001}), true),
        ],
    );
    t.add(
        "$gte/$lte are inclusive",
        json!({"n": {"$gte": 5, "$lte": 5}}),
        vec![
            (json!({"n": 5}), true),
            (json!({"n": 5.0}), true),
            (json!({"n": 5.5}), false),
        ],
    );
    t.add(
        "integers and floats compare by value",
        json!({"n": {"$lt": 2.5}}),
        vec![
            (json!({"n": 2}), true),
            (json!({"n": 3}), false),
            (json!({"n": -0.0}), true),
        ],
    );
    t.add(
        "integer equality with a float",
        json!({"n": 3}),
        vec![(json!({"n": 3.0}), true), (json!({"n": 3.0000001}), false)],
    );
    t.add(
        "integers beyond 2^53 compare exactly with floats",
        json!({"n": {"$lt": 9_007_199_254_740_993_i64}}),
        vec![
            (json!({"n": 9_007_199_254_740_992.0}), true),
            (json!({"n": 9_007_199_254_740_993_i64}), false),
        ],
    );
    t.add(
        "a float operand against integers beyond 2^53",
        json!({"n": {"$gt": 9_007_199_254_740_992.0}}),
        vec![
            (json!({"n": 9_007_199_254_740_993_i64}), true),
            (json!({"n": 9_007_199_254_740_992_i64}), false),
        ],
    );
    t.add(
        "i64::MAX is below 2^63 written as a float",
        json!({"n": {"$lt": 9_223_372_036_854_775_808.0}}),
        vec![
            (json!({"n": i64::MAX}), true),
            (json!({"n": 9.3e18}), false),
        ],
    );
    t.add(
        "large negative integers",
        json!({"n": {"$lte": i64::MIN}}),
        vec![
            (json!({"n": i64::MIN}), true),
            (json!({"n": -9.3e18}), true),
            (json!({"n": 0}), false),
        ],
    );
    t.add(
        "a string operand does not compare with numbers",
        json!({"n": {"$gt": "5"}}),
        vec![
            (json!({"n": 7}), false),
            (json!({"n": "7"}), true),
            (json!({"n": "10"}), false),
        ],
    );
    t.add(
        "a number operand does not compare with strings, booleans or null",
        json!({"n": {"$gte": 0}}),
        vec![
            (json!({"n": "1"}), false),
            (json!({"n": true}), false),
            (json!({"n": null}), false),
            (json!({"n": {"v": 1}}), false),
        ],
    );
    t.add(
        "booleans order false before true and equal only themselves",
        json!({"flag": {"$gt": false}}),
        vec![
            (json!({"flag": true}), true),
            (json!({"flag": false}), false),
            (json!({"flag": 1}), false),
        ],
    );
    t.add(
        "true is not 1",
        json!({"flag": true}),
        vec![(json!({"flag": 1}), false), (json!({"flag": true}), true)],
    );
    t.add(
        "strings compare by bytes: upper case before lower case",
        json!({"s": {"$gt": "Z"}}),
        vec![
            (json!({"s": "a"}), true),
            (json!({"s": "Zebra"}), true),
            (json!({"s": "ABC"}), false),
        ],
    );
    t.add(
        "strings compare by UTF-8 bytes, not UTF-16 units: an emoji sorts after U+FF61",
        json!({"s": {"$gt": "\u{FF61}"}}),
        vec![
            (json!({"s": "😀"}), true),
            (json!({"s": "日本"}), false),
            (json!({"s": "｡a"}), true),
        ],
    );
    t.add(
        "range over CJK strings",
        json!({"word": {"$gte": "あ", "$lt": "ん"}}),
        vec![
            (json!({"word": "こんにちは"}), true),
            (json!({"word": "漢字"}), false),
            (json!({"word": "hello"}), false),
        ],
    );
    t.add(
        "equality is binary: no Unicode normalisation, no case folding",
        json!({"name": "\u{e9}"}),
        vec![
            (json!({"name": "\u{e9}"}), true),
            (json!({"name": "e\u{301}"}), false),
            (json!({"name": "\u{c9}"}), false),
        ],
    );
    t.add(
        "right-to-left strings",
        json!({"greeting": {"$in": ["مرحبا", "שלום"]}}),
        vec![
            (json!({"greeting": "שלום"}), true),
            (json!({"greeting": "مرحبا بالعالم"}), false),
            (json!({"greeting": ["hello", "مرحبا"]}), true),
        ],
    );
    t.add(
        "emoji and ZWJ sequences are compared whole",
        json!({"mood": "\u{1f469}\u{200d}\u{1f4bb}"}),
        vec![
            (json!({"mood": "\u{1f469}\u{200d}\u{1f4bb}"}), true),
            (json!({"mood": "\u{1f469}"}), false),
            (json!({"mood": ["🦀", "\u{1f469}\u{200d}\u{1f4bb}"]}), true),
        ],
    );
    t.add(
        "unicode field names in paths",
        json!({"利用者.名前": "花子", "Δ.λ": {"$exists": true}}),
        vec![
            (json!({"利用者": {"名前": "花子"}, "Δ": {"λ": 0}}), true),
            (json!({"利用者": {"名前": "太郎"}, "Δ": {"λ": 0}}), false),
            (json!({"利用者": {"名前": "花子"}}), false),
        ],
    );
    t.add(
        "comparison on an array: any element in range",
        json!({"scores": {"$gt": 90}}),
        vec![
            (json!({"scores": [50, 95]}), true),
            (json!({"scores": [50, 60]}), false),
        ],
    );
    t.add(
        "several operators on an array field may hold by different elements",
        json!({"n": {"$gt": 15, "$lt": 20}}),
        vec![
            (json!({"n": [10, 25]}), true),
            (json!({"n": [17]}), true),
            (json!({"n": [10, 12]}), false),
            (json!({"n": 25}), false),
        ],
    );
    t.add(
        "$gt does not compare whole arrays with scalars, nor nested arrays",
        json!({"n": {"$gt": 5}}),
        vec![(json!({"n": [[10]]}), false), (json!({"n": []}), false)],
    );

    // --- null and missing ----------------------------------------------------------------------
    t.add(
        "{f: null} matches null and missing",
        json!({"f": null}),
        vec![
            (json!({"f": null}), true),
            (json!({}), true),
            (json!({"f": 0}), false),
            (json!({"f": ""}), false),
            (json!({"f": []}), false),
            (json!({"f": [1, null]}), true),
            (json!({"f": [[]]}), false),
            (json!({"f": {}}), false),
        ],
    );
    t.add(
        "{a.b: null}: missing below a scalar or null, or in some object of an array",
        json!({"a.b": null}),
        vec![
            (json!({}), true),
            (json!({"a": null}), true),
            (json!({"a": 4}), true),
            (json!({"a": {}}), true),
            (json!({"a": {"b": null}}), true),
            (json!({"a": {"b": "hi"}}), false),
            (json!({"a": [{"b": 3}, {}]}), true),
            (json!({"a": [{"b": null}, {"b": 3}]}), true),
            (json!({"a": [{"b": 1}, {"b": 3}]}), false),
            (json!({"a": [1, "string", 4]}), false),
            (json!({"a": [null, null]}), false),
            (json!({"a": []}), false),
            (json!({"a": [[]]}), false),
        ],
    );
    t.add(
        "$ne null: present and not null",
        json!({"f": {"$ne": null}}),
        vec![
            (json!({"f": 0}), true),
            (json!({"f": null}), false),
            (json!({}), false),
            (json!({"f": [1, null]}), false),
            (json!({"f": []}), true),
        ],
    );
    t.add(
        "{a.b: {$ne: null}} holds for arrays of scalars",
        json!({"a.b": {"$ne": null}}),
        vec![
            (json!({"a": [1, "string", 4]}), true),
            (json!({"a": []}), true),
            (json!({"a": [{"b": 3}, {}]}), false),
            (json!({"a": 4}), false),
        ],
    );
    t.add(
        "$gte null matches null and missing",
        json!({"f": {"$gte": null}}),
        vec![
            (json!({"f": null}), true),
            (json!({}), true),
            (json!({"f": 1}), false),
        ],
    );
    t.add(
        "$lte null matches null and missing",
        json!({"f": {"$lte": null}}),
        vec![
            (json!({"f": null}), true),
            (json!({}), true),
            (json!({"f": false}), false),
        ],
    );
    t.add(
        "$gt null matches nothing, not even null",
        json!({"f": {"$gt": null}}),
        vec![
            (json!({"f": null}), false),
            (json!({}), false),
            (json!({"f": 1}), false),
        ],
    );
    t.add(
        "$lt null matches nothing, not even null",
        json!({"f": {"$lt": null}}),
        vec![
            (json!({"f": null}), false),
            (json!({}), false),
            (json!({"f": -1}), false),
        ],
    );
    t.add(
        "$not $gte null",
        json!({"f": {"$not": {"$gte": null}}}),
        vec![
            (json!({"f": 4}), true),
            (json!({"f": null}), false),
            (json!({}), false),
            (json!({"f": [1, null]}), false),
            (json!({"f": [1, 2]}), true),
        ],
    );

    // --- $ne, $nin, $exists, $not ------------------------------------------------------------
    t.add(
        "$ne matches a missing field",
        json!({"lang": {"$ne": "en"}}),
        vec![
            (json!({"lang": "ja"}), true),
            (json!({"lang": "en"}), false),
            (json!({}), true),
            (json!({"lang": null}), true),
        ],
    );
    t.add(
        "$ne on an array: no element equals",
        json!({"tags": {"$ne": "rust"}}),
        vec![
            (json!({"tags": ["db", "rust"]}), false),
            (json!({"tags": ["db", "go"]}), true),
        ],
    );
    t.add(
        "$in: any listed value",
        json!({"lang": {"$in": ["ja", "ko", "zh"]}}),
        vec![
            (json!({"lang": "ko"}), true),
            (json!({"lang": "en"}), false),
            (json!({}), false),
            (json!({"lang": ["en", "zh"]}), true),
        ],
    );
    t.add(
        "$in with null also matches a missing field",
        json!({"a": {"$in": [null, 75]}}),
        vec![
            (json!({}), true),
            (json!({"a": null}), true),
            (json!({"a": 75.0}), true),
            (json!({"a": 4}), false),
            (json!({"a": [1, null]}), true),
        ],
    );
    t.add(
        "$in with arrays and objects in the list",
        json!({"v": {"$in": [[1, 2], {"k": "x"}]}}),
        vec![
            (json!({"v": [1, 2]}), true),
            (json!({"v": [[1, 2], 3]}), true),
            (json!({"v": [2, 1]}), false),
            (json!({"v": {"k": "x"}}), true),
            (json!({"v": [{"k": "x"}]}), true),
            (json!({"v": {"k": "x", "j": 1}}), false),
        ],
    );
    t.add(
        "$in with an empty list matches nothing",
        json!({"a": {"$in": []}}),
        vec![(json!({"a": 1}), false), (json!({}), false)],
    );
    t.add(
        "$nin: no listed value, missing included",
        json!({"lang": {"$nin": ["en", "es"]}}),
        vec![
            (json!({"lang": "ja"}), true),
            (json!({"lang": "en"}), false),
            (json!({}), true),
            (json!({"lang": ["ja", "es"]}), false),
        ],
    );
    t.add(
        "$nin with null and [] excludes missing, null and empty arrays",
        json!({"a": {"$nin": [null, []]}}),
        vec![
            (json!({}), false),
            (json!({"a": null}), false),
            (json!({"a": []}), false),
            (json!({"a": [[]]}), false),
            (json!({"a": 4}), true),
            (json!({"a": {}}), true),
            (json!({"a": [1, "string", 4]}), true),
        ],
    );
    t.add(
        "$nin with an empty list matches everything",
        json!({"a": {"$nin": []}}),
        vec![(json!({"a": 1}), true), (json!({}), true)],
    );
    t.add(
        "$exists: true holds for null and empty values too",
        json!({"f": {"$exists": true}}),
        vec![
            (json!({"f": null}), true),
            (json!({"f": []}), true),
            (json!({"f": false}), true),
            (json!({}), false),
            (json!({"g": 1}), false),
        ],
    );
    t.add(
        "$exists: false holds only for a missing field",
        json!({"f": {"$exists": false}}),
        vec![
            (json!({}), true),
            (json!({"f": null}), false),
            (json!({"f": 0}), false),
        ],
    );
    t.add(
        "$exists through arrays of objects",
        json!({"a.b": {"$exists": true}}),
        vec![
            (json!({"a": [{"c": 1}, {"b": null}]}), true),
            (json!({"a": [{"c": 1}]}), false),
            (json!({"a": [1, 2]}), false),
            (json!({"a": {"b": 0}}), true),
        ],
    );
    t.add(
        "$exists: false through an array of scalars",
        json!({"a.b": {"$exists": false}}),
        vec![
            (json!({"a": [1, 2]}), true),
            (json!({"a": [{"b": 1}]}), false),
        ],
    );
    t.add(
        "$not negates the whole path, not each element",
        json!({"tags": {"$not": {"$eq": "rust"}}}),
        vec![
            (json!({"tags": ["db", "rust"]}), false),
            (json!({"tags": ["db"]}), true),
            (json!({}), true),
        ],
    );
    t.add(
        "$not with a range: outside or missing or another type",
        json!({"n": {"$not": {"$gt": 1, "$lt": 5}}}),
        vec![
            (json!({"n": 3}), false),
            (json!({"n": 7}), true),
            (json!({"n": 1}), true),
            (json!({}), true),
            (json!({"n": "3"}), true),
        ],
    );
    t.add(
        "$not $not",
        json!({"n": {"$not": {"$not": {"$gt": 5}}}}),
        vec![
            (json!({"n": 6}), true),
            (json!({"n": 4}), false),
            (json!({}), false),
        ],
    );
    t.add(
        "$not $in and $not $exists",
        json!({"lang": {"$not": {"$in": ["en"]}}, "deleted": {"$not": {"$exists": true}}}),
        vec![
            (json!({"lang": "fr"}), true),
            (json!({"lang": "en"}), false),
            (json!({"lang": "fr", "deleted": false}), false),
        ],
    );

    // --- $and, $or ------------------------------------------------------------------------------
    t.add(
        "$or: any branch",
        json!({"$or": [{"lang": "ja"}, {"retweet_count": {"$gte": 100}}]}),
        vec![
            (tweet("a", "ja", 0, &[]), true),
            (tweet("a", "en", 100, &[]), true),
            (tweet("a", "en", 99, &[]), false),
        ],
    );
    t.add(
        "$and: every branch, same field twice",
        json!({"$and": [{"n": {"$gt": 1}}, {"n": {"$lt": 5}}]}),
        vec![
            (json!({"n": 3}), true),
            (json!({"n": 5}), false),
            (json!({"n": [0, 9]}), true),
        ],
    );
    t.add(
        "$and inside $or, beside fields",
        json!({
            "user.screen_name": {"$exists": true},
            "$or": [
                {"$and": [{"lang": "ja"}, {"tags": "rust"}]},
                {"retweet_count": {"$gt": 1000}}
            ]
        }),
        vec![
            (tweet("a", "ja", 0, &["rust"]), true),
            (tweet("a", "ja", 0, &["go"]), false),
            (tweet("a", "en", 1001, &[]), true),
            (json!({"lang": "ja", "tags": ["rust"]}), false),
        ],
    );
    t.add(
        "$and and $or of empty filters",
        json!({"$and": [{}], "$or": [{}, {"never": "there"}]}),
        vec![(json!({}), true), (json!({"x": 1}), true)],
    );

    // --- Objects ------------------------------------------------------------------------------
    t.add(
        "equality with an object: exactly the same fields and values",
        json!({"user": {"screen_name": "ada", "followers_count": 0}}),
        vec![
            (tweet("ada", "en", 0, &[]), true),
            (tweet("ada", "en", 1, &[]), false),
            (json!({"user": {"screen_name": "ada"}}), false),
            (
                json!({"user": {"screen_name": "ada", "followers_count": 0.0}}),
                true,
            ),
        ],
    );
    t.add(
        "$eq with an empty object",
        json!({"meta": {"$eq": {}}}),
        vec![
            (json!({"meta": {}}), true),
            (json!({"meta": {"a": 1}}), false),
            (json!({}), false),
        ],
    );
    t.add(
        "equality with an object inside an array",
        json!({"entities.hashtags": {"text": "rust", "indices": [0, 4]}}),
        vec![
            (tweet("a", "en", 0, &["go", "rust"]), true),
            (tweet("a", "en", 0, &["rusty"]), false),
        ],
    );

    // --- Keys a filter cannot address --------------------------------------------------------
    t.add(
        "a dotted path never reads a key spelled with a dot",
        json!({"meta.dt": "dotted"}),
        vec![
            (wikimedia("en.wikipedia.org", "dotted", "nested"), false),
            (wikimedia("en.wikipedia.org", "x", "dotted"), true),
        ],
    );
    t.add(
        "documents with $-prefixed keys match on their other fields",
        json!({"meta.domain": "ja.wikipedia.org", "title": {"$gte": "N"}}),
        vec![
            (wikimedia("ja.wikipedia.org", "a", "b"), true),
            (wikimedia("de.wikipedia.org", "a", "b"), false),
        ],
    );
    t.add(
        "$-prefixed and dotted keys inside an embedded object do not disturb equality",
        json!({"payload": {"kind": "x"}}),
        vec![
            (json!({"payload": {"kind": "x", "$tag": "y"}}), false),
            (json!({"payload": {"kind": "x", "a.b": 1}}), false),
            (json!({"payload": {"kind": "x"}}), true),
        ],
    );
    t.add(
        "$exists: false on a field only present under a dotted key",
        json!({"meta.dt": {"$exists": false}}),
        vec![
            (json!({"meta.dt": "x"}), true),
            (json!({"meta": {"dt": "x"}}), false),
        ],
    );

    // --- Big documents and long lists ------------------------------------------------------------
    t.add(
        "a big document: the one matching hashtag is the last of thousands",
        json!({"entities.hashtags.text": "needle🪡", "retweet_count": {"$gte": 4000}}),
        vec![
            (big_document("needle🪡"), true),
            (big_document("hay"), false),
        ],
    );
    let names = long_tail_names(500);
    let last = names.last().cloned().unwrap_or(Value::Null);
    t.add(
        "a long-tail $in list of five hundred screen names",
        json!({"user.screen_name": {"$in": names}}),
        vec![
            (json!({"user": {"screen_name": last}}), true),
            (json!({"user": {"screen_name": "ユーザー1"}}), true),
            (json!({"user": {"screen_name": "user1"}}), false),
            (json!({"user": {"screen_name": "user500"}}), false),
        ],
    );

    // --- Dates (extended JSON `{"$date": ...}`, a BSON date on MongoDB) ---------------------
    let at = |s: &str| json!({"_tailrace": {"received": {"$date": s}}});
    t.add(
        "a date range compares instants, however each is spelled",
        json!({"_tailrace.received": {
            "$gte": {"$date": "2026-12-06T14:00:00Z"},
            "$lt": {"$date": "2026-12-06T14:10:00.000Z"}
        }}),
        vec![
            (at("2026-12-06T14:00:00.000Z"), true),
            (at("2026-12-06T14:09:59.999Z"), true),
            (at("2026-12-06T14:10:00.000Z"), false),
            (at("2026-12-06T13:59:59.999Z"), false),
            (
                json!({"_tailrace": {"received": "2026-12-06T14:05:00.000Z"}}),
                false,
            ),
            (
                json!({"_tailrace": {"received": 1_765_029_900_000_i64}}),
                false,
            ),
            (json!({"_tailrace": {}}), false),
        ],
    );
    t.add(
        "equality with a date matches the same instant",
        json!({"t": {"$date": "2026-12-06T14:00:00Z"}}),
        vec![
            (json!({"t": {"$date": "2026-12-06T14:00:00.000Z"}}), true),
            (json!({"t": {"$date": "2026-12-06T14:00:00.001Z"}}), false),
            (json!({"t": "2026-12-06T14:00:00Z"}), false),
            (json!({"t": [{"$date": "2026-12-06T14:00:00.000Z"}]}), true),
        ],
    );
    t.add(
        "$in with dates",
        json!({"t": {"$in": [{"$date": "2026-12-06T14:00:00Z"}, "x"]}}),
        vec![
            (json!({"t": {"$date": "2026-12-06T14:00:00.000Z"}}), true),
            (json!({"t": "x"}), true),
            (json!({"t": {"$date": "2026-12-06T14:00:01.000Z"}}), false),
        ],
    );

    t.0
}
