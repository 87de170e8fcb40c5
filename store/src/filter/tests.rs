//! Unit tests of `filter.rs`.

use super::cases::{Case, cases};
use super::*;
use serde_json::json;

fn doc(v: Value) -> Document {
    v.as_object().cloned().expect("test documents are objects")
}

/// The shared table, built once for the tests that read it (its big documents take tens
/// of milliseconds to build in a debug build).
static CASES: std::sync::LazyLock<Vec<Case>> = std::sync::LazyLock::new(cases);

/// A value for an assertion message: whole when short, cut (on a char boundary) when big.
fn show(v: &Value) -> String {
    let s = v.to_string();
    if s.len() <= 300 {
        return s;
    }
    let mut end = 300;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &s[..end], s.len())
}

#[test]
fn every_case_of_the_table_matches_as_expected() {
    let cases = &*CASES;
    assert!(
        cases.len() > 200,
        "the table should be broad, has {} rows",
        cases.len()
    );
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|c| {
            let filter = match Filter::parse(&c.filter) {
                Ok(f) => f,
                Err(e) => {
                    return Some(format!("{}: filter {} rejected: {e}", c.name, c.filter));
                }
            };
            let got = filter.matches(&c.doc);
            (got != c.expected).then(|| {
                format!(
                    "{}: filter {} on {} expected {} got {got}",
                    c.name,
                    c.filter,
                    show(&Value::Object(c.doc.clone())),
                    c.expected
                )
            })
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} rows failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn every_case_gives_the_same_answer_through_to_mongo_and_under_a_prefix() {
    // The MongoDB engine sends `to_mongo`; the change stream prefixes `fullDocument.`.
    // Parsing the canonical form back, and matching it on the document nested under the
    // prefix, must agree with the original on every row.
    for c in CASES.iter() {
        let f = Filter::parse(&c.filter).unwrap();
        let canonical = f.to_mongo("");
        let back = Filter::parse(&canonical)
            .unwrap_or_else(|e| panic!("{}: to_mongo gave {canonical}, which fails: {e}", c.name));
        assert_eq!(
            back.matches(&c.doc),
            c.expected,
            "{}: canonical form {canonical} of {} on {}",
            c.name,
            c.filter,
            show(&Value::Object(c.doc.clone()))
        );
        assert_eq!(
            back.to_mongo(""),
            canonical,
            "{}: to_mongo is not a fixed point",
            c.name
        );
        let prefixed = Filter::parse(&f.to_mongo("fullDocument.")).unwrap();
        let mut event = Document::new();
        event.insert("fullDocument".into(), Value::Object(c.doc.clone()));
        event.insert("operationType".into(), json!("insert"));
        assert_eq!(
            prefixed.matches(&event),
            c.expected,
            "{}: prefixed form {} on the change event",
            c.name,
            f.to_mongo("fullDocument.")
        );
    }
}

/// Collects operator names used anywhere in a filter's JSON.
fn operators_in(v: &Value, out: &mut std::collections::BTreeSet<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                if k.starts_with('$') {
                    out.insert(k.clone());
                }
                operators_in(x, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|x| operators_in(x, out)),
        _ => {}
    }
}

#[test]
fn the_table_uses_every_operator_with_both_outcomes() {
    let cases = &*CASES;
    let mut used = std::collections::BTreeSet::new();
    for c in cases {
        operators_in(&c.filter, &mut used);
    }
    for op in FIELD_OPERATORS.split(", ").chain(["$and", "$or"]) {
        assert!(used.contains(op), "no case uses {op}; used: {used:?}");
    }
    let hits = cases.iter().filter(|c| c.expected).count();
    assert!(
        hits > cases.len() / 4 && hits < cases.len() * 3 / 4,
        "the table should hold matches and non-matches alike: {hits} of {}",
        cases.len()
    );
}

#[test]
fn invalid_filters_name_the_place_and_what_is_allowed() {
    // Each $and adds two levels (its array and the object in it), so the object nested k
    // times is at level 2k + 1: the first level past MAX_DEPTH is the object nested
    // MAX_DEPTH / 2 times.
    let deep_and = (0..20).fold(json!({"n": 1}), |inner, _| json!({"$and": [inner]}));
    let deep_and_path = vec!["$and[0]"; MAX_DEPTH / 2].join(".");
    // The root, the operator object and the array come first.
    let over_values_path = format!("n.$in[{}]", MAX_VALUES - 3);
    let long_path = vec!["p"; MAX_DEPTH + 1].join(".");
    let many_values: Vec<Value> = (0..MAX_VALUES).map(|i| json!(i)).collect();
    let table: Vec<(Value, &str, &str)> = vec![
        (json!([{"a": 1}]), "", "must be a JSON object"),
        (json!("lang=ja"), "", "must be a JSON object"),
        (json!(null), "", "must be a JSON object"),
        (
            json!({"$where": "sleep(100)"}),
            "$where",
            "unknown operator $where",
        ),
        (
            json!({"$nor": [{"a": 1}]}),
            "$nor",
            "holds field paths, $and and $or",
        ),
        (json!({"$schema": "/x"}), "$schema", "cannot be matched"),
        (
            json!({"n": {"$regex": "^a"}}),
            "n.$regex",
            "allowed on a field: $eq, $ne, $gt",
        ),
        (
            json!({"n": {"$elemMatch": {"a": 1}}}),
            "n.$elemMatch",
            "unknown operator",
        ),
        (json!({"n": {"$in": 5}}), "n.$in", "$in needs an array"),
        (
            json!({"n": {"$nin": {"a": 1}}}),
            "n.$nin",
            "$nin needs an array",
        ),
        (
            json!({"$and": {"a": 1}}),
            "$and",
            "non-empty array of filters",
        ),
        (json!({"$and": []}), "$and", "non-empty array"),
        (
            json!({"$or": [{"a": 1}, 3]}),
            "$or[1]",
            "must be a JSON object",
        ),
        (
            json!({"$or": [{"a": 1}, [{"b": 1}]]}),
            "$or[1]",
            "not an array",
        ),
        (
            json!({"$and": [{"lang": "ja"}, {"retweet_count": {"$gt": [10]}}]}),
            "$and[1].retweet_count.$gt",
            "compares with a number, string, boolean, date ({\"$date\": \"2026-12-06T14:00:00Z\"}) or null, not an array",
        ),
        (json!({"n": {"$lte": {"x": 1}}}), "n.$lte", "not an object"),
        (
            json!({"n": {"$gt": 1, "a": 2}}),
            "n.a",
            "cannot also hold the field",
        ),
        (
            json!({"n": {"$exists": 1}}),
            "n.$exists",
            "true or false, not a number",
        ),
        (
            json!({"n": {"$exists": "yes"}}),
            "n.$exists",
            "true or false",
        ),
        (json!({"n": {"$not": 5}}), "n.$not", "object of operators"),
        (
            json!({"n": {"$not": {}}}),
            "n.$not",
            "at least one operator",
        ),
        (
            json!({"n": {"$not": {"a": 1}}}),
            "n.$not",
            "use $ne or $nin",
        ),
        (
            json!({"n": {"$not": {"$gt": 1, "a": 1}}}),
            "n.$not.a",
            "cannot also hold",
        ),
        (
            json!({"n": {"$not": {"$regex": "x"}}}),
            "n.$not.$regex",
            "unknown operator",
        ),
        (
            json!({"n": {"$and": [{"a": 1}]}}),
            "n.$and",
            "put it at the top level",
        ),
        (
            json!({"n": {"$in": [1, {"$gt": 1}]}}),
            "n.$in[1].$gt",
            "key starting with '$'",
        ),
        (
            json!({"n": {"$eq": {"a": {"$oid": "x"}}}}),
            "n.$eq.a.$oid",
            "BSON type",
        ),
        (
            json!({"n": {"$ne": [{"$date": 1}]}}),
            "n.$ne[0].$date",
            "a date is",
        ),
        (json!({"a..b": 1}), "a..b", "empty part"),
        (json!({".a": 1}), ".a", "empty part"),
        (json!({"a.": 1}), "a.", "empty part"),
        (json!({"": 1}), "", "cannot be empty"),
        (json!({"a.$b": 1}), "a.$b", "starts with '$'"),
        (json!({"a\u{0}b": 1}), "a\u{0}b", "NUL"),
        (json!({"n": {"$eq": {"k\u{0}": 1}}}), "n.$eq.k\u{0}", "NUL"),
        (
            json!({"$and": [{}, {"$or": [{"a..b": 1}]}]}),
            "$and[1].$or[0].a..b",
            "empty part",
        ),
        (
            deep_and,
            deep_and_path.as_str(),
            "nested deeper than 32 levels",
        ),
        (
            json!({long_path.clone(): 1}),
            long_path.as_str(),
            "more than 32 parts",
        ),
        (
            json!({"n": {"$in": many_values}}),
            over_values_path.as_str(),
            "more than 2000 values",
        ),
        (
            json!({"s": "x".repeat(MAX_BYTES + 1)}),
            "s",
            "exceed 65536 bytes",
        ),
    ];
    for (filter, path, fragment) in table {
        let shown = show(&filter);
        let err = match Filter::parse(&filter) {
            Ok(f) => panic!("{shown} should be rejected, parsed as {f:?}"),
            Err(e) => e,
        };
        assert_eq!(
            err.path, path,
            "{shown}: wrong path; message {:?}",
            err.message
        );
        assert!(
            err.message.contains(fragment),
            "{shown}: message {:?} should contain {fragment:?}",
            err.message
        );
        let line = err.to_string();
        assert!(
            line.starts_with("filter at ") && !line.contains('\n'),
            "{shown}: Display should be one line 'filter at <path>: <message>', got {line:?}"
        );
    }
}

#[test]
fn the_depth_bound_sits_exactly_at_max_depth() {
    // {"n": {"$eq": [[...[1]...]]}}: the filter object is level 1, the operator object
    // level 2, the operand level 3.
    let nested = |levels: usize| (0..levels).fold(json!(1), |v, _| json!([v]));
    let at_limit = json!({"n": {"$eq": nested(MAX_DEPTH - 3)}});
    assert!(
        Filter::parse(&at_limit).is_ok(),
        "{MAX_DEPTH} levels must be accepted"
    );
    let over = json!({"n": {"$eq": nested(MAX_DEPTH - 2)}});
    let err = Filter::parse(&over).unwrap_err();
    assert!(
        err.message.contains("deeper"),
        "{MAX_DEPTH}+1 levels must be refused, got {err}"
    );
}

#[test]
fn display_is_one_line_with_the_path() {
    let err =
        Filter::parse(&json!({"$and": [{}, {"retweet_count": {"$gt": {"a": 1}}}]})).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("filter at $and[1].retweet_count.$gt: {}", err.message),
        "Display should be 'filter at <path>: <message>'"
    );
    let top = Filter::parse(&json!([])).unwrap_err();
    assert_eq!(top.path, "", "a top-level problem has an empty path");
    assert!(
        top.to_string().starts_with("filter at top level: "),
        "got {top}"
    );
}

#[test]
fn to_mongo_prefixes_every_path_and_makes_equality_explicit() {
    let f = Filter::parse(&json!({
        "lang": "ja",
        "user": {"screen_name": "a"},
        "n": {"$not": {"$gt": 5}, "$in": [1, 2.5, "x", null]},
        "$or": [{"tags": {"$exists": true}}, {"$and": [{"m": {"$ne": [1]}}]}]
    }))
    .unwrap();
    assert_eq!(
        f.to_mongo("fullDocument."),
        json!({
            "fullDocument.lang": {"$eq": "ja"},
            "fullDocument.user": {"$eq": {"screen_name": "a"}},
            "fullDocument.n": {"$not": {"$gt": 5}, "$in": [1, 2.5, "x", null]},
            "$or": [
                {"fullDocument.tags": {"$exists": true}},
                {"$and": [{"fullDocument.m": {"$ne": [1]}}]}
            ]
        })
    );
    assert_eq!(
        Filter::parse(&json!({})).unwrap().to_mongo("fullDocument."),
        json!({})
    );
}

#[test]
fn to_mongo_keeps_json_number_types() {
    let f = Filter::parse(&json!({"a": 1, "b": 1.0, "c": {"$gt": u64::MAX}})).unwrap();
    let m = f.to_mongo("");
    assert!(m["a"]["$eq"].is_i64(), "an integer stays an integer: {m}");
    assert!(m["b"]["$eq"].is_f64(), "a float stays a float: {m}");
    assert!(
        m["c"]["$gt"].is_u64(),
        "a u64 stays a u64 (the engine decides BSON): {m}"
    );
}

#[test]
fn the_original_json_is_kept_and_compared() {
    let json = json!({"b": {"$in": [2, 1]}, "a": 1});
    let f = Filter::parse(&json).unwrap();
    assert_eq!(f.as_json(), &json, "as_json echoes the client's filter");
    assert_eq!(
        Filter::parse(f.as_json()).unwrap(),
        f,
        "reparsing gives an equal filter"
    );
    assert_ne!(
        Filter::parse(&json!({"a": 1.0, "b": {"$in": [2, 1]}})).unwrap(),
        f,
        "filters from different JSON are different values"
    );
    assert_eq!(format!("{f:?}"), format!("Filter({json})"));
    assert_eq!(
        serde_json::to_value(&f).unwrap(),
        json,
        "serializes as its JSON"
    );
}

#[test]
fn is_match_all_only_for_structurally_empty_filters() {
    for (json, expected) in [
        (json!({}), true),
        (json!({"$and": [{}]}), true),
        (json!({"$or": [{"a": 1}, {}]}), true),
        (json!({"$and": [{}, {"a": 1}]}), false),
        (json!({"$or": [{"a": 1}]}), false),
        (json!({"a": {"$exists": true}}), false),
    ] {
        let f = Filter::parse(&json).unwrap();
        assert_eq!(f.is_match_all(), expected, "is_match_all of {json}");
        if expected {
            assert!(
                f.matches(&Document::new()),
                "{json} claims to match all, not the empty doc"
            );
        }
    }
    assert!(Filter::match_all().is_match_all() && Filter::default().is_match_all());
    assert_eq!(Filter::match_all().as_json(), &json!({}));
}

#[test]
fn from_str_and_deserialize_validate() {
    let f: Filter = r#"{"lang":"ja","retweet_count":{"$gte":10}}"#.parse().unwrap();
    assert!(f.matches(&doc(json!({"lang": "ja", "retweet_count": 10}))));
    let bad_json = "{lang: ja}".parse::<Filter>().unwrap_err();
    assert_eq!(bad_json.path, "");
    assert!(
        bad_json.message.contains("not valid JSON"),
        "got {bad_json}"
    );
    let bad = serde_json::from_value::<Filter>(json!({"n": {"$in": 1}})).unwrap_err();
    assert!(
        bad.to_string().contains("filter at n.$in"),
        "deserializing must validate: {bad}"
    );
}

#[test]
fn a_deep_document_costs_no_more_than_the_path() {
    // 500 levels of arrays, and 500 of objects (serde_json refuses to read more than 128): the walk follows the path (at most
    // MAX_DEPTH parts), never the document's depth, and equality stops at the filter's
    // shallower value.
    let mut arrays = json!("bottom");
    let mut objects = json!("bottom");
    for _ in 0..500 {
        arrays = json!([arrays]);
        objects = json!({"p": objects});
    }
    let d = doc(json!({"a": arrays, "p": objects}));
    let index_path = vec!["0"; MAX_DEPTH - 1].join(".");
    for (filter, expected) in [
        (json!({format!("a.{index_path}"): {"$exists": true}}), true),
        (json!({"a": {"$eq": [[["bottom"]]]}}), false),
        (json!({"a": {"$in": [[[[[]]]], "x"]}}), false),
        (
            json!({vec!["p"; MAX_DEPTH].join("."): {"$exists": true}}),
            true,
        ),
        (json!({"p": {"$ne": {"p": {"p": 1}}}}), true),
    ] {
        let f = Filter::parse(&filter).unwrap();
        assert_eq!(f.matches(&d), expected, "{filter} on a 500-level document");
    }
}

#[test]
fn long_tail_population_matches_a_direct_count() {
    // 5000 tweets whose screen names follow a Zipf-like long tail (a few names very often,
    // most names once) in several scripts; the filter's count must equal a count computed
    // directly from the generated fields.
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let scripts = ["user", "ユーザー", "مستخدم", "משתמש", "🦀"];
    let langs = ["en", "ja", "ar", "he", "und"];
    let mut docs = Vec::new();
    for _ in 0..5000 {
        // rank = floor(1 / u): P(rank = k) ~ 1/k², a long tail.
        let u = (next() % 1_000_000 + 1) as f64 / 1_000_000.0;
        let rank = (1.0 / u) as u64;
        let script = scripts[(rank % 5) as usize];
        let lang = langs[(next() % 5) as usize];
        let retweets = (next() % 50) as i64;
        docs.push((format!("{script}{rank}"), lang, retweets));
    }
    let wanted = ["user5", "ユーザー1", "🦀4", "مستخدم7", "nobody"];
    let filter = Filter::parse(&json!({
        "user.screen_name": {"$in": wanted},
        "lang": {"$ne": "en"},
        "retweet_count": {"$gte": 10, "$lt": 40.5}
    }))
    .unwrap();
    let got = docs
        .iter()
        .filter(|(name, lang, rt)| filter.matches(&doc(tweet_like(name, lang, *rt))))
        .count();
    let direct = docs
        .iter()
        .filter(|(name, lang, rt)| {
            wanted.contains(&name.as_str()) && *lang != "en" && (10..=40).contains(rt)
        })
        .count();
    assert!(
        direct > 10,
        "the generated population should hit the filter often enough: {direct}"
    );
    assert_eq!(
        got, direct,
        "filter count against a direct count over 5000 long-tail tweets"
    );
}

fn tweet_like(name: &str, lang: &str, retweets: i64) -> Value {
    json!({
        "user": {"screen_name": name, "名前": name},
        "lang": lang,
        "retweet_count": retweets,
        "$schema": "/tweet/1",
        "meta.dt": "2024-01-01T00:00:00Z",
    })
}

mod properties {
    use super::super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn scalar() -> BoxedStrategy<Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            (-3i64..4).prop_map(Value::from),
            prop::sample::select(vec![-0.0, 0.5, 1.0, 2.0, 2.5, 1e300, -1e300])
                .prop_map(Value::from),
            Just(json!(u64::MAX)),
            Just(json!(i64::MIN)),
            prop::sample::select(vec![
                "",
                "a",
                "B",
                "日本",
                "😀",
                "\u{FF61}",
                "مرحبا",
                "e\u{301}"
            ])
            .prop_map(Value::from),
        ]
        .boxed()
    }

    /// Keys a document may hold, including ones a filter cannot address.
    fn doc_key() -> BoxedStrategy<String> {
        prop::sample::select(vec![
            "a", "b", "0", "1", "tags", "名前", "$s", "a.b", "01", "",
        ])
        .prop_map(str::to_owned)
        .boxed()
    }

    /// Keys a filter value may hold (no `$`).
    fn literal_key() -> BoxedStrategy<String> {
        prop::sample::select(vec!["a", "b", "0", "名前", "a.b"])
            .prop_map(str::to_owned)
            .boxed()
    }

    fn json_with(key: BoxedStrategy<String>) -> BoxedStrategy<Value> {
        scalar()
            .prop_recursive(4, 40, 4, move |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                    prop::collection::btree_map(key.clone(), inner, 0..4)
                        .prop_map(|m| Value::Object(m.into_iter().collect())),
                ]
            })
            .boxed()
    }

    fn document() -> impl Strategy<Value = Document> {
        prop::collection::btree_map(doc_key(), json_with(doc_key()), 0..5)
            .prop_map(|m| m.into_iter().collect())
    }

    fn literal() -> BoxedStrategy<Value> {
        json_with(literal_key())
    }

    fn path() -> impl Strategy<Value = String> {
        prop::collection::vec(
            prop::sample::select(vec!["a", "b", "0", "1", "tags", "名前"]),
            1..4,
        )
        .prop_map(|parts| parts.join("."))
    }

    /// A valid operator object, `$not` nested up to twice.
    fn operators() -> BoxedStrategy<Value> {
        let leaf = prop_oneof![
            literal().prop_map(|v| ("$eq".to_owned(), v)),
            literal().prop_map(|v| ("$ne".to_owned(), v)),
            (
                prop::sample::select(vec!["$gt", "$gte", "$lt", "$lte"]),
                scalar()
            )
                .prop_map(|(op, v)| (op.to_owned(), v)),
            (
                prop::sample::select(vec!["$in", "$nin"]),
                prop::collection::vec(literal(), 0..4)
            )
                .prop_map(|(op, v)| (op.to_owned(), Value::Array(v))),
            any::<bool>().prop_map(|b| ("$exists".to_owned(), Value::Bool(b))),
        ];
        // Duplicate names collapse, last wins: still at least one operator.
        let object = |entry: BoxedStrategy<(String, Value)>| {
            prop::collection::vec(entry, 1..3)
                .prop_map(|entries| Value::Object(entries.into_iter().collect()))
        };
        let level0 = object(leaf.clone().boxed()).boxed();
        let level1 =
            object(prop_oneof![leaf.clone(), level0.prop_map(|o| ("$not".to_owned(), o))].boxed())
                .boxed();
        object(prop_oneof![leaf, level1.prop_map(|o| ("$not".to_owned(), o))].boxed()).boxed()
    }

    fn field_condition() -> impl Strategy<Value = Value> {
        prop_oneof![literal(), operators()]
    }

    fn filter_json() -> impl Strategy<Value = Value> {
        let fields = prop::collection::btree_map(path(), field_condition(), 0..3)
            .prop_map(|m| Value::Object(m.into_iter().collect()));
        fields.prop_recursive(3, 24, 3, |inner| {
            (
                prop::collection::btree_map(path(), field_condition(), 0..3),
                prop::sample::select(vec!["$and", "$or"]),
                prop::collection::vec(inner, 1..3),
            )
                .prop_map(|(fields, op, subs)| {
                    let mut m: Map<String, Value> = fields.into_iter().collect();
                    m.insert(op.to_owned(), Value::Array(subs));
                    Value::Object(m)
                })
        })
    }

    proptest! {
        // 64 cases each keeps `cargo test -p store --lib filter` under a second in a debug
        // build; PROPTEST_CASES=10000 runs a deeper search.
        #![proptest_config(ProptestConfig {
            cases: std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(64),
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        #[test]
        fn parse_never_panics_and_round_trips(json in json_with(prop_oneof![
            doc_key(),
            prop::sample::select(vec!["$and", "$or", "$in", "$not", "$gt", "$exists", "$eq"]).prop_map(str::to_owned),
        ].boxed())) {
            if let Ok(f) = Filter::parse(&json) {
                prop_assert_eq!(&Filter::parse(f.as_json()).unwrap(), &f);
                let canonical = f.to_mongo("");
                let back = Filter::parse(&canonical);
                prop_assert!(back.is_ok(), "to_mongo {} of {} fails to parse: {:?}", canonical, json, back);
            }
        }

        #[test]
        fn generated_filters_parse_and_agree_with_their_canonical_and_prefixed_forms(
            json in filter_json(),
            d in document(),
        ) {
            let f = Filter::parse(&json);
            prop_assert!(f.is_ok(), "generated filter {} rejected: {:?}", json, f);
            let f = f.unwrap();
            prop_assert_eq!(&Filter::parse(f.as_json()).unwrap(), &f);
            let got = f.matches(&d);
            let canonical = Filter::parse(&f.to_mongo("")).unwrap();
            prop_assert_eq!(canonical.matches(&d), got, "canonical {} vs {} on {:?}", f.to_mongo(""), json, d);
            let prefixed = Filter::parse(&f.to_mongo("fullDocument.")).unwrap();
            let mut event = Document::new();
            event.insert("fullDocument".into(), Value::Object(d.clone()));
            prop_assert_eq!(prefixed.matches(&event), got, "prefixed form of {} on {:?}", json, d);
        }

        #[test]
        fn not_ne_and_nin_are_exact_negations(
            p in path(),
            ops in operators(),
            v in literal(),
            list in prop::collection::vec(literal(), 0..4),
            d in document(),
        ) {
            let positive = Filter::parse(&json!({p.clone(): ops.clone()})).unwrap();
            let negated = Filter::parse(&json!({p.clone(): {"$not": ops.clone()}})).unwrap();
            prop_assert_eq!(negated.matches(&d), !positive.matches(&d), "$not {} on {:?}", ops, d);
            let eq = Filter::parse(&json!({p.clone(): {"$eq": v.clone()}})).unwrap();
            let ne = Filter::parse(&json!({p.clone(): {"$ne": v.clone()}})).unwrap();
            prop_assert_eq!(ne.matches(&d), !eq.matches(&d), "$ne {} on {:?}", v, d);
            let implicit = Filter::parse(&json!({p.clone(): v.clone()})).unwrap();
            prop_assert_eq!(implicit.matches(&d), eq.matches(&d), "implicit vs $eq {} on {:?}", v, d);
            let inn = Filter::parse(&json!({p.clone(): {"$in": list.clone()}})).unwrap();
            let nin = Filter::parse(&json!({p.clone(): {"$nin": list.clone()}})).unwrap();
            prop_assert_eq!(nin.matches(&d), !inn.matches(&d), "$nin {:?} on {:?}", list, d);
            // MongoDB defines $in as an $or of equalities.
            let any_eq = list.iter().any(|x| {
                Filter::parse(&json!({p.clone(): {"$eq": x}})).unwrap().matches(&d)
            });
            prop_assert_eq!(inn.matches(&d), any_eq, "$in {:?} vs $or of $eq on {:?}", list, d);
        }
    }
}

#[test]
fn a_date_range_is_what_every_match_needs() {
    let range = |f: serde_json::Value| Filter::parse(&f).unwrap().date_range("t");
    let d = |s: &str| json!({"$date": s});
    let ms = |s: &str| crate::date::parse_rfc3339(s).unwrap();
    let (a, b) = ("2026-12-06T14:00:00Z", "2026-12-06T14:10:00Z");
    assert_eq!(
        range(json!({"t": {"$gte": d(a), "$lt": d(b)}, "lang": "ja"})),
        Some((ms(a), ms(b) - 1))
    );
    assert_eq!(
        range(json!({"$and": [{"t": {"$gt": d(a)}}, {"t": {"$lte": d(b)}}]})),
        Some((ms(a) + 1, ms(b)))
    );
    assert_eq!(range(json!({"t": d(a)})), Some((ms(a), ms(a))));
    assert_eq!(
        range(json!({"$or": [{"t": {"$gt": d(a)}}, {"x": 1}]})),
        None
    );
    assert_eq!(range(json!({"t": {"$gt": 5}})), None);
    assert_eq!(range(json!({"u": {"$gt": d(a)}})), None);
    assert_eq!(
        range(json!({"t": {"$gt": d(b), "$lt": d(a)}})),
        Some((ms(b) + 1, ms(a) - 1)),
        "an empty range stays empty"
    );
}
