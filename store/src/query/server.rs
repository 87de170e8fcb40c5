//! Pipelines run on a database server: the longest prefix of a pipeline whose every stage,
//! accumulator and operator the server evaluates as tailrace does, with tailrace evaluating
//! the rest.
//!
//! What a server evaluates is learned from the server itself, never from its name: each
//! feature of the subset (a stage, an accumulator, an expression operator) has a probe, a
//! small pipeline over [`probe_docs`] (numbers of both kinds, strings in several scripts,
//! nulls, missing fields, arrays, nested documents, dates); the server runs it over those
//! documents in a scratch collection, tailrace runs it too, and the feature is the server's
//! only when the answers agree. A MongoDB server answers as tailrace does on every probe (its
//! semantics are the reference tailrace follows, so a difference there is a tailrace defect,
//! and the server's answer is not used meanwhile); FerretDB 1.24 lacks `$dateTrunc`, `$min`,
//! `$max` and `$avg`, so a pipeline that groups by minute runs its `$match` on the server and
//! its `$group` here.
//!
//! A probe can only show a difference on the documents it has; the contract's random
//! pipelines (`store/tests/contract/queries.rs`) compare answers over a wider set.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use futures::stream::BoxStream;
use serde_json::{Value, json};

use super::expr::Expr;
use super::{Acc, Limits, Pipeline, Projection, Stage};
use crate::{Document, Result, Support};

/// A server that runs pipelines over the collection a [`crate::Capped`] handle stores.
#[async_trait]
pub trait ServerQuery: Send + Sync {
    /// Which features the server evaluates as tailrace does ([`probe`]), learned once per
    /// server and kept.
    async fn features(&self) -> Result<Arc<Features>>;

    /// Runs `stages` (MongoDB aggregation stages, as JSON: dates as `{"$date": ...}`) over
    /// the collection on the server, streaming what comes out. A `$sort` comes as an array of
    /// `[path, 1 | -1]` pairs, in order (a [`Value`]'s object here keeps its keys sorted, and
    /// their order is the sort's): the engine writes it as MongoDB's ordered `$sort`.
    async fn run(&self, stages: Vec<Value>) -> Result<BoxStream<'static, Result<Document>>>;
}

/// What a server does with each feature, by name (`$group`, `$avg`, `$dateTrunc`).
pub type Features = BTreeMap<&'static str, Support>;

/// A feature's probe: a pipeline, and whether its answer's order is part of the answer.
struct Probe {
    feature: &'static str,
    /// The pipeline as text, which keeps a `$sort`'s keys in order.
    stages: String,
    ordered: bool,
}

/// Features whose answers hold arrays in no particular order (MongoDB's `$addToSet`), under
/// the field `v`: compared as sets.
const UNORDERED_V: [&str; 1] = ["$addToSet"];

/// The documents every probe runs over, as both tailrace and the server hold them (`_id`
/// 1..n, as capped documents carry their position).
pub fn probe_docs() -> Vec<Document> {
    let t = |s: &str| json!({"$date": s});
    let docs = [
        json!({"n": 3, "f": 0.5, "s": "b", "lang": "ja", "tags": ["東京", "rust"], "u": {"id": 7, "name": "ü"}, "t": t("2026-12-06T14:00:01.250Z")}),
        json!({"n": -2, "f": 2.25, "s": "a", "lang": "en", "tags": [], "u": {"id": 9}, "t": t("2026-12-06T14:00:59.999Z")}),
        json!({"n": 3, "s": "🦀", "lang": "ja", "tags": ["rust", "🦀", "rust"], "t": t("2026-12-06T14:01:00.000Z")}),
        json!({"n": null, "f": 1.0, "lang": "ar", "tags": "مرحبا", "u": {"id": 7}, "t": t("2026-12-06T14:07:30.000Z")}),
        json!({"n": "4", "f": -1.5, "s": "B", "lang": "en", "u": [{"id": 1}, {"id": 2}], "t": t("2026-12-06T13:59:59.999Z")}),
        json!({"n": 10, "f": 4.0, "s": "a", "lang": null, "tags": ["a.b"], "ms": 1_796_565_600_000_i64}),
    ];
    docs.into_iter()
        .enumerate()
        .map(|(i, d)| {
            let mut d = d.as_object().cloned().unwrap_or_default();
            d.insert("_id".to_owned(), json!(i + 1));
            d
        })
        .collect()
}

fn probes() -> Vec<Probe> {
    let p = |feature, stages: Value, ordered| Probe {
        feature,
        stages: stages.to_string(),
        ordered,
    };
    let text = |feature, stages: &str| Probe {
        feature,
        stages: stages.to_owned(),
        ordered: true,
    };
    let group = |acc: Value| json!([{"$group": {"_id": "$lang", "v": acc}}]);
    vec![
        p(
            "$match",
            json!([{"$match": {"$or": [{"n": {"$gte": 3}}, {"tags": "rust"}, {"t": {"$gte": {"$date": "2026-12-06T14:01:00.000Z"}, "$lt": {"$date": "2026-12-06T14:08:00.000Z"}}}]}}]),
            true,
        ),
        text("$sort", r#"[{"$sort": {"s": 1, "_id": -1}}]"#),
        text("$sort", r#"[{"$sort": {"n": -1, "_id": 1}}]"#),
        text("$sort", r#"[{"$sort": {"t": 1, "_id": 1}}]"#),
        text("$sort", r#"[{"$sort": {"lang": -1, "f": 1, "_id": 1}}]"#),
        p("$skip", json!([{"$skip": 2}]), true),
        p("$limit", json!([{"$limit": 4}]), true),
        p(
            "$project",
            json!([{"$project": {"u.id": 1, "lang": 1, "_id": 0}}]),
            true,
        ),
        p("$project", json!([{"$project": {"u": 0, "tags": 0}}]), true),
        p(
            "$project:computed",
            json!([{"$project": {"key": {"l": "$lang", "id": "$u.id"}}}]),
            true,
        ),
        p("$unwind", json!([{"$unwind": "$tags"}]), true),
        p(
            "$unwind:preserve",
            json!([{"$unwind": {"path": "$tags", "preserveNullAndEmptyArrays": true}}]),
            true,
        ),
        p(
            "$group",
            json!([{"$group": {"_id": {"l": "$lang", "u": "$u.id"}, "c": {"$sum": 1}}}]),
            false,
        ),
        p(
            "$group",
            json!([{"$group": {"_id": null, "c": {"$sum": 1}}}]),
            false,
        ),
        p("$sum", group(json!({"$sum": "$n"})), false),
        p("$sum", group(json!({"$sum": "$f"})), false),
        p("$avg", group(json!({"$avg": "$n"})), false),
        p("$avg", group(json!({"$avg": "$f"})), false),
        p("$min", group(json!({"$min": "$n"})), false),
        p("$min", group(json!({"$min": "$s"})), false),
        p("$max", group(json!({"$max": "$n"})), false),
        p("$max", group(json!({"$max": "$t"})), false),
        p("$first", group(json!({"$first": "$s"})), false),
        p("$last", group(json!({"$last": "$n"})), false),
        p("$push", group(json!({"$push": "$s"})), false),
        p("$count:acc", group(json!({"$count": {}})), false),
        p("$count", json!([{"$count": "n"}]), true),
        p("$addToSet", group(json!({"$addToSet": "$s"})), false),
        p("$addToSet", group(json!({"$addToSet": "$u.id"})), false),
        p(
            "$literal",
            json!([{"$project": {"x": {"$literal": "$n"}}}]),
            true,
        ),
        p(
            "$toDate",
            json!([{"$project": {"d": {"$toDate": "$ms"}}}, {"$match": {"d": {"$exists": true}}}]),
            true,
        ),
        p(
            "$toDate",
            json!([{"$limit": 1}, {"$project": {"d": {"$toDate": "2026-12-06T14:00:00.5Z"}}}]),
            true,
        ),
        p(
            "$dateTrunc",
            json!([{"$project": {"m": {"$dateTrunc": {"date": "$t", "unit": "minute"}}, "h": {"$dateTrunc": {"date": "$t", "unit": "hour", "binSize": 7}}}}]),
            true,
        ),
        p(
            "$dateTrunc",
            json!([{"$project": {"d": {"$dateTrunc": {"date": "$t", "unit": "day", "binSize": 3}}, "s": {"$dateTrunc": {"date": "$t", "unit": "second", "binSize": 30}}}}]),
            true,
        ),
        p(
            "$divide",
            json!([{"$match": {"f": {"$gte": -100}}}, {"$project": {"q": {"$divide": ["$f", 4]}, "r": {"$divide": [10, 4]}}}]),
            true,
        ),
    ]
}

/// Learns which features a server evaluates as tailrace does: `run_over(docs, stages)` runs
/// `stages` over exactly `docs` on the server. A probe the server refuses, or answers
/// differently, makes its feature tailrace's, with the reason; an outage is an error.
pub async fn probe<F, Fut>(run_over: F) -> Result<Features>
where
    F: Fn(Vec<Document>, Vec<Value>) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<Document>>>,
{
    let docs = probe_docs();
    let mut features = Features::new();
    for probe in probes() {
        if features.get(probe.feature).is_some_and(|s| !s.is_yes()) {
            continue;
        }
        let pipeline = match Pipeline::parse_text(&probe.stages) {
            Ok(p) => p,
            Err(e) => {
                features.insert(
                    probe.feature,
                    no(format!("tailrace refuses its probe: {e}")),
                );
                continue;
            }
        };
        let stages = pipeline.server_stages(pipeline.stages.len());
        let support = match run_over(docs.clone(), stages).await {
            Err(e) if e.is_transient() => return Err(e),
            Err(e) => no(format!("the server refused {}: {e}", probe.stages)),
            Ok(got) => match pipeline.run(docs.clone(), Limits::default()) {
                Err(e) => no(format!("tailrace failed its probe: {e}")),
                Ok(want) => {
                    let (mut got, mut want): (Vec<Value>, Vec<Value>) = (
                        got.into_iter()
                            .map(|d| normalize(Value::Object(d)))
                            .collect(),
                        want.docs,
                    );
                    if UNORDERED_V.contains(&probe.feature) {
                        got.iter_mut().chain(want.iter_mut()).for_each(sort_v);
                    }
                    if !probe.ordered {
                        got.sort_by_key(Value::to_string);
                        want.sort_by_key(Value::to_string);
                    }
                    if got == want {
                        Support::Yes
                    } else {
                        no(format!(
                            "{} answered {} where tailrace answers {}",
                            probe.stages,
                            Value::Array(got),
                            Value::Array(want)
                        ))
                    }
                }
            },
        };
        // A feature with several probes is the server's only if it agrees on all of them.
        features.insert(probe.feature, support);
    }
    Ok(features)
}

/// Sorts the array under `v`.
fn sort_v(doc: &mut Value) {
    if let Some(Value::Array(items)) = doc.get_mut("v") {
        items.sort_by_key(Value::to_string);
    }
}

fn no(reason: String) -> Support {
    Support::No { reason }
}

/// A value out of a server in tailrace's spelling: dates as [`crate::date::value`] writes
/// them (servers and drivers drop zero milliseconds: `"2026-12-06T14:00:00Z"`).
pub(crate) fn normalize(v: Value) -> Value {
    match v {
        Value::Object(o) => {
            if let Some(ms) = crate::date::millis(&Value::Object(o.clone()))
                && let Some(d) = crate::date::value(ms)
            {
                return d;
            }
            Value::Object(o.into_iter().map(|(k, v)| (k, normalize(v))).collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(normalize).collect()),
        other => other,
    }
}

impl Pipeline {
    /// How many leading stages a server with `features` runs as tailrace would.
    pub(crate) fn server_prefix(&self, features: &Features) -> usize {
        let has = |f: &str| features.get(f).is_some_and(Support::is_yes);
        let json = self.json.as_array().map_or(&[][..], Vec::as_slice);
        self.stages
            .iter()
            .zip(json)
            .take_while(|(s, j)| {
                stage_features(s).iter().all(|f| has(f))
                    && (!mentions(j, "$literal") || has("$literal"))
            })
            .count()
    }

    /// The first `n` stages as a server is given them: each `$match` in canonical form
    /// ([`crate::Filter::to_mongo`]), `$sortByCount` as the `$group` and `$sort` tailrace
    /// means by it (ties by `_id`, which MongoDB leaves unordered).
    pub(crate) fn server_stages(&self, n: usize) -> Vec<Value> {
        let mut out = Vec::with_capacity(n);
        let json = self.json.as_array().into_iter().flatten();
        for (stage, json) in self.stages.iter().zip(json).take(n) {
            match stage {
                Stage::Match(f) => out.push(json!({"$match": f.to_mongo("")})),
                Stage::Sort(keys) => {
                    let pairs: Vec<Value> = keys
                        .iter()
                        .map(|(path, asc)| json!([path.join("."), if *asc { 1 } else { -1 }]))
                        .collect();
                    out.push(json!({"$sort": pairs}));
                }
                Stage::SortByCount(_) => {
                    let key = json.get("$sortByCount").cloned().unwrap_or(Value::Null);
                    out.push(json!({"$group": {"_id": key, "count": {"$sum": 1}}}));
                    out.push(json!({"$sort": [["count", -1], ["_id", 1]]}));
                }
                _ => out.push(json.clone()),
            }
        }
        out
    }

    /// The stages from `n` on, to run here after a server ran the first `n`.
    pub(crate) fn after(&self, n: usize) -> Pipeline {
        let json = self.json.as_array().map_or(Value::Null, |a| {
            Value::Array(a.iter().skip(n).cloned().collect())
        });
        Pipeline {
            json,
            stages: self.stages[n.min(self.stages.len())..].to_vec(),
        }
    }
}

/// Whether `key` is a key anywhere in `json`.
fn mentions(json: &Value, key: &str) -> bool {
    match json {
        Value::Object(o) => o.iter().any(|(k, v)| k == key || mentions(v, key)),
        Value::Array(items) => items.iter().any(|v| mentions(v, key)),
        _ => false,
    }
}

/// The features a stage uses: its own name, its accumulators and its operators.
fn stage_features(stage: &Stage) -> Vec<&'static str> {
    let mut out = vec![stage.name()];
    let mut exprs: Vec<&Expr> = Vec::new();
    match stage {
        Stage::Project(Projection::Include { computed, .. }) if !computed.is_empty() => {
            out.push("$project:computed");
            exprs.extend(computed.iter().map(|(_, e)| e));
        }
        Stage::Unwind {
            keep_empty: true, ..
        } => out.push("$unwind:preserve"),
        Stage::Group { id, accs } => {
            exprs.push(id);
            for (_, acc) in accs {
                out.push(match acc {
                    Acc::Sum(_) => "$sum",
                    Acc::Avg(_) => "$avg",
                    Acc::Min(_) => "$min",
                    Acc::Max(_) => "$max",
                    Acc::First(_) => "$first",
                    Acc::Last(_) => "$last",
                    Acc::AddToSet(_) => "$addToSet",
                    Acc::Push(_) => "$push",
                    Acc::Count => "$count:acc",
                });
                exprs.extend(acc.expr());
            }
        }
        Stage::SortByCount(e) => {
            // Run on a server as a `$group` with `$sum` and a `$sort`.
            out = vec!["$group", "$sum", "$sort"];
            exprs.push(e);
        }
        _ => {}
    }
    for e in exprs {
        e.operators(&mut out);
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::StoreError;

    /// A server that evaluates with tailrace's own evaluator, writes dates without their
    /// milliseconds as drivers do, refuses `$avg`, answers `$unwind` wrong, and returns groups
    /// and skipped documents in reverse.
    async fn fake_server(docs: Vec<Document>, stages: Vec<Value>) -> Result<Vec<Document>> {
        let text = as_text(&stages);
        if text.contains("$avg") {
            return Err(StoreError::Invalid(
                "accumulator $avg is not implemented".into(),
            ));
        }
        let answer = Pipeline::parse_text(&text)
            .unwrap()
            .run(docs, Limits::default())
            .unwrap();
        let mut out: Vec<Document> = answer
            .docs
            .into_iter()
            .map(|d| d.as_object().cloned().unwrap())
            .collect();
        if text.contains("$unwind") {
            out.pop();
        }
        for d in &mut out {
            for v in d.values_mut() {
                if let Some(ms) = crate::date::millis(v) {
                    let s = crate::date::value(ms).unwrap()["$date"]
                        .as_str()
                        .unwrap()
                        .replace(".000Z", "Z");
                    *v = json!({"$date": s});
                }
            }
        }
        // Groups come in any order; a `$skip`'s answer in the wrong one.
        if text.contains("$group") || text.contains("$skip") {
            out.reverse();
        }
        Ok(out)
    }

    /// Server stages as MongoDB's JSON text: a `$sort`'s pairs as one object, in order.
    fn as_text(stages: &[Value]) -> String {
        let parts: Vec<String> = stages
            .iter()
            .map(|s| match s.get("$sort") {
                Some(Value::Array(pairs)) => {
                    let keys: Vec<String> = pairs
                        .iter()
                        .map(|p| format!("{}: {}", p[0], p[1]))
                        .collect();
                    format!("{{\"$sort\": {{{}}}}}", keys.join(", "))
                }
                _ => s.to_string(),
            })
            .collect();
        format!("[{}]", parts.join(", "))
    }

    #[tokio::test]
    async fn a_feature_is_the_servers_only_where_its_answer_agrees() {
        let features = probe(fake_server).await.unwrap();
        let yes = |f: &str| features.get(f).unwrap().is_yes();
        // Dates spelled differently and groups in another order are the same answer.
        for f in ["$group", "$sum", "$dateTrunc", "$max"] {
            assert!(yes(f), "{f}: {:?}", features[f]);
        }
        // A refusal and a wrong answer are tailrace's, and say why.
        assert!(!yes("$avg") && !yes("$unwind"));
        assert!(
            features["$avg"]
                .reason()
                .unwrap()
                .contains("not implemented")
        );
        assert!(
            features["$unwind"]
                .reason()
                .unwrap()
                .contains("where tailrace answers")
        );
        // The order of a stage's answer is part of it, except for groups.
        assert!(!yes("$skip") && yes("$sort"), "{:?}", features["$skip"]);
        // Every feature a pipeline can use has a probe.
        for f in [
            "$match",
            "$skip",
            "$limit",
            "$project",
            "$project:computed",
            "$unwind:preserve",
            "$min",
            "$first",
            "$last",
            "$push",
            "$addToSet",
            "$count",
            "$count:acc",
            "$toDate",
            "$divide",
            "$literal",
        ] {
            assert!(features.contains_key(f), "no probe for {f}");
        }
    }

    fn features(yes: &[&'static str]) -> Features {
        probes()
            .iter()
            .map(|p| {
                let s = if yes.contains(&p.feature) {
                    Support::Yes
                } else {
                    no("absent".into())
                };
                (p.feature, s)
            })
            .collect()
    }

    #[test]
    fn the_prefix_ends_at_the_first_stage_the_server_lacks() {
        let ferret = features(&[
            "$group", "$sum", "$sort", "$limit", "$skip", "$project", "$count",
        ]);
        let p = |v: Value| Pipeline::parse(&v).unwrap();
        let minute = json!({"$dateTrunc": {"date": "$t", "unit": "minute"}});
        let by_minute =
            p(json!([{"$group": {"_id": minute, "n": {"$sum": 1}}}, {"$sort": {"_id": 1}}]));
        assert_eq!(by_minute.server_prefix(&ferret), 0);
        let top = p(
            json!([{"$group": {"_id": "$lang", "n": {"$sum": 1}}}, {"$sort": {"n": -1}}, {"$limit": 3}]),
        );
        assert_eq!(top.server_prefix(&ferret), 3);
        let avg =
            p(json!([{"$sort": {"n": 1}}, {"$group": {"_id": "$lang", "n": {"$avg": "$n"}}}]));
        assert_eq!(avg.server_prefix(&ferret), 1);
        assert_eq!(avg.after(1).stage_names(), ["$group"]);
        // `$literal` anywhere in a stage needs the server's `$literal`.
        let lit = p(json!([{"$group": {"_id": {"$literal": "$x"}, "n": {"$sum": 1}}}]));
        assert_eq!(lit.server_prefix(&ferret), 0);
        let mut with_literal = ferret.clone();
        with_literal.insert("$literal", Support::Yes);
        assert_eq!(lit.server_prefix(&with_literal), 1);
        // A `$sortByCount` goes as the `$group` and `$sort` it means, ties by `_id`.
        let counted = p(json!([{"$sortByCount": "$tags"}, {"$limit": 2}]));
        assert_eq!(counted.server_prefix(&ferret), 2);
        assert_eq!(
            counted.server_stages(2),
            [
                json!({"$group": {"_id": "$tags", "count": {"$sum": 1}}}),
                json!({"$sort": [["count", -1], ["_id", 1]]}),
                json!({"$limit": 2}),
            ]
        );
        // A `$match` goes in canonical form, its dates as dates.
        let m = p(
            json!([{"$match": {"lang": "ja", "t": {"$gte": {"$date": "2026-12-06T14:00:00Z"}}}}]),
        );
        assert_eq!(
            m.server_stages(1),
            [
                json!({"$match": {"lang": {"$eq": "ja"}, "t": {"$gte": {"$date": "2026-12-06T14:00:00Z"}}}})
            ]
        );
    }

    #[test]
    fn server_dates_read_as_tailrace_writes_them() {
        assert_eq!(
            normalize(json!({"a": [{"$date": "2026-12-06T14:00:00Z"}], "b": {"$date": "x"}})),
            json!({"a": [{"$date": "2026-12-06T14:00:00.000Z"}], "b": {"$date": "x"}})
        );
    }
}
