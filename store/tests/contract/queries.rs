//! Queries over a capped collection answer on every engine as the same pipeline answers over
//! the same documents in memory: random pipelines (filters, time ranges, groups, sorts) from a
//! fixed seed, over a fixed data set of the shapes the world sends (long-tail values in every
//! script, arrays, missing fields, received times as dates). What differs between engines is
//! how the documents are read (the embedded engine's time spans and projected scans, a
//! server's tail), so that is what this holds to one answer.

use serde_json::{Value, json};
use store::query::{Input, Limits, Pipeline, aggregate};
use store::{Document, Durability, Store};

use super::capped;
use super::reference;

/// A small deterministic generator (xorshift64*): the same pipelines on every engine and run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

/// 2:00 pm on 2026-12-06, in ms.
const BASE_MS: i64 = 1_796_565_600_000;
const DOCS: u64 = 1_200;

const LANGS: [&str; 7] = ["en", "ja", "ar", "🌍", "ü", "und", "zh-Hant"];
const TAGS: [&str; 6] = ["rust", "東京", "مرحبا", "🦀", "a.b", "Ünïcode"];

/// Between two documents' received times: five a second, so that the embedded engine keeps
/// runs of them ([`store::ReceivedRun`]) and a count by minute adds those up.
const STEP_MS: i64 = 200;

/// Document `i`: received `i` × [`STEP_MS`] after [`BASE_MS`], so the set spans 4 minutes.
fn event(i: u64) -> Document {
    let mut d = json!({
        "i": i,
        "lang": LANGS[(i * i % 7) as usize],
        "n": (i * 37 % 101) as i64 - 50,
        "f": (i % 13) as f64 / 4.0,
        "user": {"screen_name": format!("u{}", i * 7 % 61)},
        "_tailrace": {"received": store::date::value(BASE_MS + i as i64 * STEP_MS).unwrap()},
    });
    match i % 5 {
        0 => {}
        1 => d["hashtags"] = json!([]),
        _ => {
            d["hashtags"] = json!(
                (0..i % 4)
                    .map(|k| TAGS[((i + k * 3) % 6) as usize])
                    .collect::<Vec<_>>()
            )
        }
    }
    if i.is_multiple_of(11) {
        d.as_object_mut().unwrap().remove("n");
    }
    d.as_object().cloned().unwrap()
}

fn at(ms: i64) -> Value {
    store::date::value(ms).unwrap()
}

/// A first `$match`, or none.
fn first_match(r: &mut Rng) -> Option<Value> {
    let span = DOCS as i64 * STEP_MS;
    let from = BASE_MS - 5_000 + r.below(span as u64 + 10_000) as i64;
    let to = from + r.below(span as u64 / 2) as i64;
    let range = json!({"_tailrace.received": {"$gte": at(from), "$lt": at(to)}});
    Some(match r.below(7) {
        0 => return None,
        1 => range,
        2 => json!({"lang": r.pick(&LANGS)}),
        3 => json!({"n": {"$gt": r.below(100) as i64 - 50}}),
        4 => json!({"hashtags": r.pick(&TAGS)}),
        5 => json!({"$and": [range, {"lang": {"$in": [r.pick(&LANGS), r.pick(&LANGS)]}}]}),
        _ => {
            json!({"_tailrace.received": {"$gt": at(BASE_MS + r.below(span as u64) as i64)}, "f": {"$lte": 2}})
        }
    })
}

/// The rest of a pipeline: a group, an unwind and count, a projection, or a count; each stage
/// as JSON text (which keeps a `$sort`'s keys in order).
/// With each, the stage as [`reference::evaluate`] takes it (a `$sort` as ordered pairs).
fn rest(r: &mut Rng) -> Vec<(String, Value)> {
    rest_values(r)
        .into_iter()
        .map(|s| match s.get("$sort") {
            Some(keys) if keys.get("n").is_some() => (
                r#"{"$sort": {"n": -1, "_id": 1}}"#.to_owned(),
                json!({"$sort": [["n", -1], ["_id", 1]]}),
            ),
            Some(keys) => {
                let pairs: Vec<Value> = keys
                    .as_object()
                    .unwrap()
                    .iter()
                    .map(|(k, v)| json!([k, v]))
                    .collect();
                (s.to_string(), json!({"$sort": pairs}))
            }
            None => (s.to_string(), s),
        })
        .collect()
}

fn rest_values(r: &mut Rng) -> Vec<Value> {
    let accs = [
        ("events", json!({"$sum": 1})),
        ("total", json!({"$sum": "$n"})),
        ("mean", json!({"$avg": "$f"})),
        ("least", json!({"$min": "$n"})),
        ("most", json!({"$max": "$n"})),
        ("first", json!({"$first": "$i"})),
        ("last", json!({"$last": "$i"})),
        ("langs", json!({"$addToSet": "$lang"})),
        ("count", json!({"$count": {}})),
    ];
    match r.below(6) {
        0 | 1 => {
            let key = match r.below(4) {
                0 => json!("$lang"),
                1 => json!({"$dateTrunc": {"date": "$_tailrace.received", "unit": "minute"}}),
                2 => {
                    json!({"$dateTrunc": {"date": "$_tailrace.received", "unit": "second", "binSize": 30}})
                }
                _ => json!({"lang": "$lang", "user": "$user.screen_name"}),
            };
            let mut group = serde_json::Map::new();
            group.insert("_id".into(), key);
            for _ in 0..1 + r.below(4) {
                let (name, acc) = r.pick(&accs);
                group.insert((*name).into(), acc.clone());
            }
            let mut out = vec![json!({"$group": group}), json!({"$sort": {"_id": 1}})];
            if r.below(2) == 0 {
                out.push(json!({"$limit": 1 + r.below(20)}));
            }
            out
        }
        // Each element's document into a stage that only reads it (tailrace replaces the
        // element in one document instead of copying it).
        2 => match r.below(4) {
            0 => vec![
                json!({"$unwind": "$hashtags"}),
                json!({"$sortByCount": "$hashtags"}),
                json!({"$limit": 1 + r.below(6)}),
            ],
            1 => {
                let mut group = serde_json::Map::new();
                group.insert("_id".into(), json!("$hashtags"));
                for _ in 0..1 + r.below(3) {
                    let (name, acc) = r.pick(&accs);
                    group.insert((*name).into(), acc.clone());
                }
                vec![
                    json!({"$unwind": "$hashtags"}),
                    json!({"$group": group}),
                    json!({"$sort": {"_id": 1}}),
                ]
            }
            _ => vec![json!({"$unwind": "$hashtags"}), json!({"$count": "n"})],
        },
        3 => vec![
            json!({"$project": {"lang": 1, "n": 1, "user.screen_name": 1}}),
            json!({"$sort": {"n": -1, "_id": 1}}),
            json!({"$skip": r.below(30)}),
            json!({"$limit": 1 + r.below(40)}),
        ],
        4 => vec![json!({"$count": "n"})],
        // Counting by time: added up from runs where the engine keeps them.
        _ => {
            let key = match r.below(3) {
                0 => json!({"$dateTrunc": {"date": "$_tailrace.received", "unit": "minute"}}),
                1 => {
                    json!({"$dateTrunc": {"date": "$_tailrace.received", "unit": "second", "binSize": 30}})
                }
                _ => {
                    json!({"m": {"$dateTrunc": {"date": "$_tailrace.received", "unit": "minute"}}, "k": null})
                }
            };
            if r.below(3) == 0 {
                return vec![
                    json!({"$sortByCount": key}),
                    json!({"$limit": 1 + r.below(5)}),
                ];
            }
            vec![
                json!({"$group": {"_id": key, "events": {"$sum": 1}, "count": {"$count": {}}}}),
                json!({"$sort": {"_id": 1}}),
            ]
        }
    }
}

/// Random pipelines answer through the engine as over the same documents in memory, and
/// in memory as a naive reference evaluator answers them.
pub async fn random_pipelines_answer_as_in_memory(store: &dyn Store) {
    let c = capped(store, "c_queries", 100_000, 256 << 20).await;
    let mut all: Vec<Document> = Vec::new();
    for chunk in (0..DOCS).collect::<Vec<_>>().chunks(100) {
        let docs: Vec<Document> = chunk.iter().map(|i| event(*i)).collect();
        let positions = c
            .append(docs.clone(), Durability::Acknowledged)
            .await
            .unwrap();
        for (mut d, p) in docs.into_iter().zip(positions) {
            // A query sees each capped document with its position as `_id`.
            d.insert("_id".into(), json!(p.0));
            all.push(d);
        }
    }
    let mut r = Rng(0x7A11_5ACE_D00D_F00D);
    let mut failures = Vec::new();
    // Answers added up from runs of documents received each second.
    let mut timeline = 0u32;
    for _ in 0..150 {
        let mut stages: Vec<(String, Value)> = first_match(&mut r)
            .map(|m| (json!({"$match": m}).to_string(), json!({"$match": m})))
            .into_iter()
            .collect();
        stages.extend(rest(&mut r));
        let texts: Vec<&str> = stages.iter().map(|(t, _)| t.as_str()).collect();
        let json = format!("[{}]", texts.join(", "));
        let pipeline = Pipeline::parse_text(&json).unwrap_or_else(|e| panic!("{json}: {e}"));
        let want = pipeline.run(all.clone(), Limits::default()).unwrap();
        let reference: Vec<Value> = stages.into_iter().map(|(_, v)| v).collect();
        let by_reference = reference::evaluate(&all, &reference);
        if sets_sorted(want.docs.clone()) != sets_sorted(by_reference.clone()) {
            failures.push(format!(
                "{json}\n  tailrace:  {}\n  reference: {}",
                Value::Array(want.docs.clone()),
                Value::Array(by_reference)
            ));
        }
        let got = aggregate(Input::Capped(c.clone()), pipeline, Limits::default())
            .await
            .unwrap_or_else(|e| panic!("{json}: {e}"));
        timeline += u32::from(got.stages.iter().any(|s| s.ran == "timeline"));
        if got.docs != want.docs {
            failures.push(format!(
                "{json}\n  engine:    {}\n  in memory: {}",
                Value::Array(got.docs),
                Value::Array(want.docs)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of 150 pipelines answered differently:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // An engine that reads in-process and keeps runs used them for some.
    if c.server_query().is_none() {
        assert!(timeline >= 5, "{timeline} of 150 from the timeline");
    }
}

/// Each stage runs on the collection's server when the server evaluates everything the stage
/// uses as tailrace does (by the server's own probe), and from the first stage it does not,
/// here; the answer is the same either way.
pub async fn queries_run_on_the_server_as_far_as_it_agrees(store: &dyn Store) {
    let c = capped(store, "c_pushdown", 100_000, 256 << 20).await;
    let docs: Vec<Document> = (0..300).map(event).collect();
    let positions = c
        .append(docs.clone(), Durability::Acknowledged)
        .await
        .unwrap();
    let all: Vec<Document> = docs
        .into_iter()
        .zip(positions)
        .map(|(mut d, p)| {
            d.insert("_id".into(), json!(p.0));
            d
        })
        .collect();
    let features = match c.server_query() {
        Some(server) => Some(server.features().await.unwrap()),
        None => None,
    };
    if let Some(f) = &features {
        eprintln!("query features of the server:");
        for (name, support) in f.iter() {
            eprintln!("  {name}: {}", support.reason().unwrap_or("yes"));
        }
    }
    let has = |names: &[&str]| {
        features
            .as_ref()
            .is_some_and(|f| names.iter().all(|n| f.get(n).is_some_and(|s| s.is_yes())))
    };
    let minute = json!({"$dateTrunc": {"date": "$_tailrace.received", "unit": "minute"}});
    // Each pipeline with, per stage, what it uses: written out here, not taken from the code
    // that decides.
    let cases: Vec<(Value, Vec<&[&str]>)> = vec![
        (
            json!([{"$group": {"_id": "$lang", "n": {"$sum": 1}, "most": {"$max": "$n"}}}, {"$sort": {"_id": 1}}]),
            vec![&["$group", "$sum", "$max"], &["$sort"]],
        ),
        (
            json!([{"$match": {"lang": "ja"}}, {"$group": {"_id": minute, "n": {"$sum": 1}}}, {"$sort": {"_id": 1}}]),
            vec![&["$match"], &["$group", "$sum", "$dateTrunc"], &["$sort"]],
        ),
        (
            json!([{"$unwind": "$hashtags"}, {"$sortByCount": "$hashtags"}, {"$limit": 3}]),
            vec![&["$unwind"], &["$group", "$sum", "$sort"], &["$limit"]],
        ),
        (
            json!([{"$project": {"lang": 1, "user.screen_name": 1}}, {"$sort": {"_id": -1}}, {"$skip": 5}, {"$limit": 4}]),
            vec![&["$project"], &["$sort"], &["$skip"], &["$limit"]],
        ),
        (
            json!([{"$group": {"_id": null, "langs": {"$addToSet": "$lang"}, "mean": {"$avg": "$f"}}}]),
            vec![&["$group", "$addToSet", "$avg"], &[]],
        ),
    ];
    let mut pushed = 0;
    for (json, uses) in cases {
        let pipeline = Pipeline::parse(&json).unwrap();
        let want = pipeline.run(all.clone(), Limits::default()).unwrap();
        let got = aggregate(Input::Capped(c.clone()), pipeline, Limits::default())
            .await
            .unwrap_or_else(|e| panic!("{json}: {e}"));
        assert_eq!(
            sets_sorted(got.docs),
            sets_sorted(want.docs),
            "{json}: the answers differ"
        );
        let mut on_server = true;
        let expected: Vec<&str> = uses
            .iter()
            .filter(|u| !u.is_empty())
            .map(|u| {
                on_server &= has(u);
                if on_server { "server" } else { "tailrace" }
            })
            .collect();
        let ran: Vec<&str> = got.stages.iter().map(|s| s.ran).collect();
        assert_eq!(ran, expected, "{json}: where the stages ran");
        pushed += ran.iter().filter(|r| **r == "server").count();
    }
    if has(&["$group", "$sum", "$sort", "$unwind"]) {
        assert!(
            pushed >= 3,
            "a server with $group and $sum ran {pushed} stages"
        );
    }
}

/// `$addToSet`'s arrays (`langs`) sorted: MongoDB keeps no order in a set.
fn sets_sorted(docs: Vec<Value>) -> Vec<Value> {
    docs.into_iter()
        .map(|mut d| {
            if let Some(Value::Array(items)) = d.get_mut("langs") {
                items.sort_by_key(Value::to_string);
            }
            d
        })
        .collect()
}

/// Keys of the keyed collection the keyed queries run over: several scripts, dots, a `$`.
fn keyed_key(i: u64) -> String {
    let lang = LANGS[(i % 7) as usize];
    match i % 4 {
        0 => format!("lang:{lang}:{i:03}"),
        1 => format!("tag:{}:{i:03}", TAGS[(i % 6) as usize]),
        2 => format!("$user.{i:03}"),
        _ => format!("minute:{i:03}"),
    }
}

/// A keyed collection answers a query as the same pipeline answers over its documents in
/// memory, by key, each with its key as `_id` and none of the engine's own fields: written
/// whole (`set`) and by `$inc`/`$set` upserts named for retries, as the ingester writes its
/// rollups. On a server, the stages it evaluates as tailrace does run there, and the rest
/// here over documents it reads without a snapshot (FerretDB has no snapshot reads).
pub async fn keyed_queries_answer_as_in_memory(store: &dyn Store) {
    let k = store.keyed("k_queries").await.unwrap();
    let mut all: Vec<Document> = Vec::new();
    let mut updates = Vec::new();
    for i in 0..160_u64 {
        let key = keyed_key(i);
        let lang = LANGS[(i * 3 % 7) as usize];
        let n = (i * 37 % 101) as i64 - 50;
        let minute = store::date::value(BASE_MS + (i as i64 % 90) * 60_000).unwrap();
        if i % 3 == 0 {
            // Upserted: the document is its key, its increments and its sets.
            updates.push(
                store::KeyUpdate::new(
                    key.clone(),
                    store::Update::inc("n", n)
                        .and_set("lang", lang)
                        .and_set("minute", minute.clone()),
                )
                .once(store::WriteId {
                    writer: 7,
                    seq: i + 1,
                }),
            );
            let mut d = super::doc(json!({"n": n, "lang": lang, "minute": minute}));
            d.insert("_id".into(), json!(key));
            all.push(d);
        } else {
            let tags: Vec<&str> = (0..i % 4).map(|t| TAGS[((i + t) % 6) as usize]).collect();
            let d = super::doc(json!({"n": n, "lang": lang, "minute": minute, "tags": tags}));
            k.set(&key, d.clone(), Durability::Acknowledged)
                .await
                .unwrap();
            let mut d = d;
            d.insert("_id".into(), json!(key));
            all.push(d);
        }
    }
    k.update(updates, Durability::Acknowledged).await.unwrap();
    // By key, bytewise, as the engines keep them.
    all.sort_by(|a, b| a["_id"].as_str().cmp(&b["_id"].as_str()));

    let features = match k.server_query() {
        Some(server) => Some(server.features().await.unwrap()),
        None => None,
    };
    let has = |names: &[&str]| {
        features
            .as_ref()
            .is_some_and(|f| names.iter().all(|n| f.get(n).is_some_and(|s| s.is_yes())))
    };
    let pipelines = [
        // Whole documents, in key order: an engine field that leaks, or another order, shows.
        r#"[{"$project": {"tags": 0}}]"#,
        r#"[{"$match": {"_id": {"$gte": "lang:", "$lt": "lang;"}}}, {"$group": {"_id": "$lang", "n": {"$sum": "$n"}, "keys": {"$sum": 1}}}, {"$sort": {"n": -1, "_id": 1}}]"#,
        r#"[{"$sort": {"n": -1, "_id": 1}}, {"$skip": 3}, {"$limit": 5}]"#,
        r#"[{"$unwind": "$tags"}, {"$sortByCount": "$tags"}]"#,
        r#"[{"$group": {"_id": null, "first": {"$first": "$_id"}, "last": {"$last": "$_id"}, "keys": {"$count": {}}}}]"#,
        r#"[{"$group": {"_id": {"$dateTrunc": {"date": "$minute", "unit": "hour"}}, "n": {"$sum": "$n"}}}, {"$sort": {"_id": 1}}]"#,
    ];
    for json in pipelines {
        let pipeline = Pipeline::parse_text(json).unwrap();
        let want = pipeline.run(all.clone(), Limits::default()).unwrap();
        let got = aggregate(Input::Keyed(k.clone()), pipeline, Limits::default())
            .await
            .unwrap_or_else(|e| panic!("{json}: {e}"));
        assert_eq!(
            Value::Array(got.docs),
            Value::Array(want.docs),
            "{json}: the engine's answer, then the answer in memory"
        );
    }
    // Where the stages ran: on a server that sorts and projects as tailrace does (a keyed
    // collection's stages follow a sort by key and a projection), a `$group` by a field and
    // its `$sort` run there; elsewhere here.
    let pipeline = Pipeline::parse_text(
        r#"[{"$group": {"_id": "$lang", "n": {"$sum": 1}}}, {"$sort": {"_id": 1}}]"#,
    )
    .unwrap();
    let got = aggregate(Input::Keyed(k.clone()), pipeline, Limits::default())
        .await
        .unwrap();
    let on_server = has(&["$sort", "$project", "$group", "$sum"]);
    let ran: Vec<&str> = got.stages.iter().map(|s| s.ran).collect();
    assert_eq!(
        ran,
        if on_server {
            ["server", "server"]
        } else {
            ["tailrace", "tailrace"]
        },
        "where the stages ran (features: {features:?})"
    );
    assert_eq!(got.docs.len(), 7, "{:?}", got.docs);
}
