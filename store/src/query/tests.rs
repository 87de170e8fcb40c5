#![allow(clippy::unwrap_used)]

use serde_json::{Value, json};

use super::{Limits, Pipeline};
use crate::Document;

fn docs() -> Vec<Document> {
    [
        json!({"_id": 1, "lang": "ja", "user": {"id": 7}, "hashtags": ["rust", "db"], "n": 3, "t": 1_765_000_000_123_i64}),
        json!({"_id": 2, "lang": "en", "user": {"id": 8}, "hashtags": ["rust"], "n": 1.5, "t": 1_765_000_030_000_i64}),
        json!({"_id": 3, "lang": "ja", "user": {"id": 7}, "hashtags": [], "n": "x", "t": 1_765_000_075_000_i64}),
        json!({"_id": 4, "lang": "🌍", "user": {"id": 9}, "n": null, "t": 1_765_000_200_000_i64}),
        json!({"_id": 5, "lang": "en", "user": {"id": 8}, "hashtags": ["db", "ℝust"], "n": 2, "t": 1_765_000_200_001_i64}),
    ]
    .into_iter()
    .map(|v| v.as_object().cloned().unwrap())
    .collect()
}

fn run(pipeline: Value) -> Vec<Value> {
    let p = Pipeline::parse(&pipeline).unwrap_or_else(|e| panic!("{pipeline}: {e}"));
    p.run(docs(), Limits::default())
        .unwrap_or_else(|e| panic!("{pipeline}: {e}"))
        .docs
}

fn run_text(pipeline: &str) -> Vec<Value> {
    let p = Pipeline::parse_text(pipeline).unwrap_or_else(|e| panic!("{pipeline}: {e}"));
    p.run(docs(), Limits::default())
        .unwrap_or_else(|e| panic!("{pipeline}: {e}"))
        .docs
}

fn refused(pipeline: Value) -> String {
    match Pipeline::parse(&pipeline) {
        Ok(p) => match p.run(docs(), Limits::default()) {
            Ok(a) => panic!("{pipeline} answered {:?}", a.docs),
            Err(e) => e.to_string(),
        },
        Err(e) => e.to_string(),
    }
}

#[test]
fn count_by_language_sorted() {
    let by_count =
        r#"[{"$group": {"_id": "$lang", "n": {"$sum": 1}}}, {"$sort": {"n": -1, "_id": -1}}]"#;
    assert_eq!(
        run_text(by_count),
        [
            json!({"_id": "ja", "n": 2}),
            json!({"_id": "en", "n": 2}),
            json!({"_id": "🌍", "n": 1})
        ]
    );
    // The keys' order as written is the sort's, not the order a parsed object keeps.
    let by_id =
        r#"[{"$group": {"_id": "$lang", "n": {"$sum": 1}}}, {"$sort": {"_id": -1, "n": -1}}]"#;
    assert_eq!(
        run_text(by_id),
        [
            json!({"_id": "🌍", "n": 1}),
            json!({"_id": "ja", "n": 2}),
            json!({"_id": "en", "n": 2})
        ]
    );
    // A parsed value has lost that order: such a pipeline is refused, not sorted otherwise.
    let parsed: Value = serde_json::from_str(by_count).unwrap();
    assert!(refused(parsed).contains("Pipeline::parse_text"));
}

#[test]
fn top_hashtags_with_unwind_and_sort_by_count() {
    assert_eq!(
        run(json!([{"$unwind": "$hashtags"}, {"$sortByCount": "$hashtags"}, {"$limit": 2}])),
        [
            json!({"_id": "db", "count": 2}),
            json!({"_id": "rust", "count": 2})
        ]
    );
    // Empty arrays and missing fields are dropped, unless asked to be kept.
    assert_eq!(
        run(json!([{"$unwind": "$hashtags"}, {"$count": "n"}])),
        [json!({"n": 5})]
    );
    assert_eq!(
        run(
            json!([{"$unwind": {"path": "$hashtags", "preserveNullAndEmptyArrays": true}}, {"$count": "n"}])
        ),
        [json!({"n": 7})]
    );
}

#[test]
fn accumulators_follow_mongodb() {
    let out = run(json!([{"$group": {
        "_id": null,
        "sum": {"$sum": "$n"}, "avg": {"$avg": "$n"}, "min": {"$min": "$n"}, "max": {"$max": "$n"},
        "first": {"$first": "$lang"}, "last": {"$last": "$lang"},
        "users": {"$addToSet": "$user.id"}, "count": {"$count": {}}, "ids": {"$push": "$_id"}
    }}]));
    // $sum and $avg skip non-numbers; $min/$max skip null and compare across types
    // (numbers before strings).
    assert_eq!(
        out,
        [
            json!({"_id": null, "sum": 6.5, "avg": 6.5 / 3.0, "min": 1.5, "max": "x",
                "first": "ja", "last": "en", "users": [7, 8, 9], "count": 5, "ids": [1, 2, 3, 4, 5]})
        ]
    );
    // Integers stay integers; 1 and 1.0 are one group.
    assert_eq!(
        run(
            json!([{"$match": {"_id": {"$in": [1, 5]}}}, {"$group": {"_id": "$user.id", "s": {"$sum": "$n"}}}, {"$sort": {"_id": 1}}])
        ),
        [json!({"_id": 7, "s": 3}), json!({"_id": 8, "s": 2})]
    );
    let one = vec![json!({"k": 1}), json!({"k": 1.0})]
        .into_iter()
        .map(|v| v.as_object().cloned().unwrap())
        .collect::<Vec<_>>();
    let p = Pipeline::parse(&json!([{"$group": {"_id": "$k", "n": {"$sum": 1}}}])).unwrap();
    assert_eq!(p.run(one, Limits::default()).unwrap().docs.len(), 1);
}

#[test]
fn time_buckets_by_minute() {
    let minute = json!({"$dateTrunc": {"date": {"$toDate": "$t"}, "unit": "minute"}});
    assert_eq!(
        run(json!([{"$group": {"_id": minute, "n": {"$sum": 1}}}, {"$sort": {"_id": 1}}])),
        [
            // 05:46:40.123
            json!({"_id": {"$date": "2025-12-06T05:46:00.000Z"}, "n": 1}),
            // 05:47:10, 05:47:55
            json!({"_id": {"$date": "2025-12-06T05:47:00.000Z"}, "n": 2}),
            // 05:50:00.000, 05:50:00.001
            json!({"_id": {"$date": "2025-12-06T05:50:00.000Z"}, "n": 2}),
        ]
    );
    // Microseconds (the stamp's received_us) are divided into milliseconds first.
    let from_us = json!({"$dateTrunc": {"date": {"$toDate": {"$divide": [{"$literal": 1_765_000_000_123_000_i64}, 1000]}}, "unit": "hour", "binSize": 2}});
    assert_eq!(
        run(json!([{"$limit": 1}, {"$project": {"_id": 0, "h": from_us}}])),
        [json!({"h": {"$date": "2025-12-06T04:00:00.000Z"}})]
    );
}

#[test]
fn time_bins_start_at_mongodbs_reference_date() {
    // 7-day bins start on 2000-01-01 and every 7 days after, as on a MongoDB server: the bin
    // of 2024-12-05 starts on 2024-11-30 (from the epoch it would start on 2024-12-05).
    let week = json!({"$dateTrunc": {"date": {"$toDate": "2024-12-05T10:00:00Z"}, "unit": "day", "binSize": 7}});
    assert_eq!(
        run(json!([{"$limit": 1}, {"$project": {"_id": 0, "w": week}}])),
        [json!({"w": {"$date": "2024-11-30T00:00:00.000Z"}})]
    );
    // Before the reference date too.
    let before = json!({"$dateTrunc": {"date": {"$toDate": "1999-12-31T23:59:00Z"}, "unit": "minute", "binSize": 7}});
    assert_eq!(
        run(json!([{"$limit": 1}, {"$project": {"_id": 0, "m": before}}])),
        [json!({"m": {"$date": "1999-12-31T23:53:00.000Z"}})]
    );
}

#[test]
fn project_sort_skip_limit() {
    assert_eq!(
        run(
            json!([{"$sort": {"t": -1}}, {"$skip": 1}, {"$limit": 2}, {"$project": {"user.id": 1, "_id": 0}}])
        ),
        [json!({"user": {"id": 9}}), json!({"user": {"id": 7}})]
    );
    assert_eq!(
        run(json!([{"$match": {"_id": 2}}, {"$project": {"hashtags": 0, "t": 0, "user": 0}}])),
        [json!({"_id": 2, "lang": "en", "n": 1.5})]
    );
}

#[test]
fn a_limit_stops_the_reading() {
    let p = Pipeline::parse(&json!([{"$match": {"lang": "ja"}}, {"$limit": 1}])).unwrap();
    let a = p.run(docs(), Limits::default()).unwrap();
    assert_eq!(a.read, 1);
    assert_eq!(a.docs, [json!(docs()[0])]);
    assert_eq!(
        a.stages
            .iter()
            .map(|s| (s.stage, s.ran, s.out))
            .collect::<Vec<_>>(),
        [
            ("$match", "tailrace", Some(1)),
            ("$limit", "tailrace", Some(1))
        ]
    );
}

#[test]
fn outside_the_subset_is_refused_by_name() {
    assert_eq!(
        refused(json!([{"$match": {}}, {"$lookup": {}}])),
        "[1].$lookup: stage $lookup is not supported (supported: $match, $sort, $limit, $skip, $project, $unwind, $group, $count, $sortByCount)"
    );
    assert!(
        refused(json!([{"$group": {"_id": null, "m": {"$median": "$n"}}}]))
            .starts_with("[0].$group.m: accumulator $median is not supported")
    );
    assert!(
        refused(json!([{"$group": {"_id": {"$week": "$t"}}}]))
            .starts_with("[0].$group._id: expression operator $week is not supported")
    );
    assert!(refused(json!([{"$match": {"n": {"$regex": "x"}}}])).starts_with("[0].$match.n"));
    assert!(refused(json!([{"$sort": {"n": 2}}])).starts_with("[0].$sort.n: must be 1 or -1"));
    assert!(
        refused(json!([{"$group": {"_id": {"$dateTrunc": {"date": "$t", "unit": "week"}}}}]))
            .contains("unit")
    );
    assert!(refused(json!({"$match": {}})).starts_with("a pipeline is an array"));
    assert!(
        refused(json!([{"$match": {}, "$limit": 1}]))
            .starts_with("[0]: a stage is an object with one key")
    );
    // A date operator on what is not a date fails the query, naming why.
    assert!(
        refused(json!([{"$group": {"_id": {"$dateTrunc": {"date": "$lang", "unit": "day"}}}}]))
            .contains("needs a date, found a string")
    );
}

#[test]
fn deep_nesting_and_group_bombs_are_refused() {
    let mut e = json!("$n");
    for _ in 0..100 {
        e = json!({"$toDate": e});
    }
    assert!(refused(json!([{"$group": {"_id": e}}])).contains("nested deeper than"));
    // Every document its own group of a large key: past the bound, refused.
    let big: Vec<Document> = (0..2_000)
        .map(|i| {
            json!({"k": format!("{i:0>1000}")})
                .as_object()
                .cloned()
                .unwrap()
        })
        .collect();
    let p = Pipeline::parse(&json!([{"$group": {"_id": "$k"}}])).unwrap();
    let e = p
        .run(big.clone(), Limits { max_bytes: 1 << 20 })
        .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("[0].$group: holds more than the query bound of 1048576 bytes"),
        "{e}"
    );
    assert_eq!(
        p.run(
            big,
            Limits {
                max_bytes: 16 << 20
            }
        )
        .unwrap()
        .docs
        .len(),
        2_000
    );
}

/// What a pipeline says it reads is all it reads: the answer over documents cut down to those
/// fields is the answer over whole documents.
#[test]
fn the_fields_read_are_enough_for_the_answer() {
    let pipelines = [
        json!([{"$group": {"_id": "$lang", "n": {"$sum": 1}}}]),
        json!([{"$match": {"$or": [{"lang": "ja"}, {"user.id": 8}]}}, {"$unwind": "$hashtags"}, {"$sortByCount": "$hashtags"}]),
        json!([{"$sort": {"t": -1}}, {"$group": {"_id": {"d": {"$dateTrunc": {"date": {"$toDate": "$t"}, "unit": "day"}}}, "first": {"$first": "$_id"}, "n": {"$avg": "$n"}}}]),
        json!([{"$project": {"user.id": 1, "x": "$lang"}}]),
        json!([{"$match": {"n": {"$gt": 0}}}, {"$count": "c"}]),
    ];
    for pipeline in pipelines {
        let p = Pipeline::parse(&pipeline).unwrap();
        let fields = p
            .fields_read()
            .unwrap_or_else(|| panic!("{pipeline}: whole documents"));
        assert!(
            !fields.iter().any(|f| f == "hashtags") || pipeline.to_string().contains("hashtags")
        );
        let tops: Vec<&str> = fields
            .iter()
            .map(|f| f.split('.').next().unwrap_or(f))
            .collect();
        let cut: Vec<Document> = docs()
            .into_iter()
            .map(|d| {
                d.into_iter()
                    .filter(|(k, _)| tops.contains(&k.as_str()))
                    .collect()
            })
            .collect();
        assert_eq!(
            p.run(cut, Limits::default()).unwrap().docs,
            p.run(docs(), Limits::default()).unwrap().docs,
            "{pipeline} with {fields:?}"
        );
    }
    // Whole documents come out: every field is needed.
    let p = Pipeline::parse(&json!([{"$match": {"lang": "ja"}}, {"$limit": 1}])).unwrap();
    assert_eq!(p.fields_read(), None);
    let p = Pipeline::parse(&json!([{"$group": {"_id": "$lang"}}])).unwrap();
    assert_eq!(p.fields_read(), Some(vec!["lang".to_owned()]));
}

#[test]
fn group_keys_of_every_type_stay_apart() {
    // A string key's text is written unescaped: no string may meet another value's key, or
    // another string's. Numbers equal in value group together, as in MongoDB.
    let keys = [
        json!("1"),
        json!(1),
        json!(1.0),
        json!("null"),
        json!(null),
        json!("[1]"),
        json!([1]),
        json!("\"x"),
        json!("x"),
        json!("{\"a\":1}"),
        json!({"a": 1}),
        json!("true"),
        json!(true),
        json!("n1"),
    ];
    let docs: Vec<Document> = keys
        .iter()
        .map(|k| json!({"k": k}).as_object().cloned().unwrap())
        .collect();
    let p = Pipeline::parse(&json!([{"$group": {"_id": "$k", "n": {"$sum": 1}}}])).unwrap();
    let got = p.run(docs, Limits::default()).unwrap().docs;
    let counts: Vec<(Value, Value)> = got
        .iter()
        .map(|g| (g["_id"].clone(), g["n"].clone()))
        .collect();
    let mut want: Vec<(Value, Value)> = keys
        .iter()
        .filter(|k| **k != json!(1.0))
        .map(|k| (k.clone(), json!(if *k == json!(1) { 2 } else { 1 })))
        .collect();
    want.dedup();
    assert_eq!(counts, want);
}

/// `$sortByCount` orders as a `$group` counting then a `$sort` by count (most first) and
/// `_id` does, with and without a `$limit` after it, over keys of every type (arrays, which
/// sort by an element, included), many tied counts among them.
#[test]
fn sort_by_count_orders_as_a_group_and_a_sort() {
    let keys = [
        json!("b"),
        json!("a"),
        json!(null),
        json!(2),
        json!(1.5),
        json!({"x": 1}),
        json!("ℝ"),
        json!("a"),
        json!(2.0),
        json!(true),
        json!([3, 1]),
        json!([2]),
    ];
    let many: Vec<Document> = (0..500u64)
        .map(|i| {
            let k = keys[(i % keys.len() as u64) as usize].clone();
            let mut d = Document::new();
            d.insert("_id".into(), json!(i));
            if i % 17 != 0 {
                d.insert("k".into(), k);
            }
            d
        })
        .collect();
    for with_arrays in [false, true] {
        let docs: Vec<Document> = many
            .iter()
            .filter(|d| with_arrays || !d.get("k").is_some_and(Value::is_array))
            .cloned()
            .collect();
        for limit in [
            "",
            r#", {"$limit": 1}"#,
            r#", {"$limit": 4}"#,
            r#", {"$limit": 100}"#,
        ] {
            let by_count = format!(r#"[{{"$sortByCount": "$k"}}{limit}]"#);
            let by_sort = format!(
                r#"[{{"$group": {{"_id": "$k", "count": {{"$sum": 1}}}}}}, {{"$sort": {{"count": -1, "_id": 1}}}}{limit}]"#
            );
            let ask = |text: &str| {
                Pipeline::parse_text(text)
                    .unwrap()
                    .run(docs.clone(), Limits::default())
                    .unwrap()
                    .docs
            };
            assert_eq!(ask(&by_count), ask(&by_sort), "{by_count}");
        }
    }
}
