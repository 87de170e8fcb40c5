//! `query`: the questions of issue 57 asked of a stored window of realistic events, in
//! MongoDB's aggregation language (`store::query`), on whichever engine the config selects.
//!
//! The window: `--docs` events (1,000,000) written straight into a capped collection, their
//! receipt times spread evenly over the day before the run, so that "the last hour" and "ten
//! minutes" hold what they would at ~12 events/s. Each pipeline runs `--iterations` times (5)
//! after one untimed run; the table gives the median, the documents read and the answer's
//! size, and the targets say which bounds are met.

use std::sync::Arc;
use std::time::Instant;

use serde_json::{Value, json};
use store::query::{Input, Limits, Pipeline, aggregate};
use store::{Capped, Durability};

use super::dataset::Docs;
use super::measure::{Samples, fmt_us, thousands};
use super::plot::{self, Line};
use super::report::{Report, Series, Table, Target};
use super::writes::events_like;
use super::{Bench, BenchError, Result, Scenario, new_report};

/// A day of receipt times, in microseconds.
const DAY_US: i64 = 86_400_000_000;

/// One question: its name, its pipeline, and the median it should take (ms), if any.
struct Question {
    name: &'static str,
    pipeline: Value,
    target_ms: Option<f64>,
}

fn questions(end_us: i64) -> Vec<Question> {
    let minute = json!({"$dateTrunc": {"date": "$_tailrace.received", "unit": "minute"}});
    let ago = |us: i64| store::date::value((end_us - us).div_euclid(1000));
    let ten_minutes_ago = ago(600_000_000);
    let hour_ago = ago(3_600_000_000);
    vec![
        Question {
            name: "count by lang, last 10 minutes",
            pipeline: json!([
                {"$match": {"_tailrace.received": {"$gte": ten_minutes_ago}}},
                {"$group": {"_id": "$lang", "n": {"$sum": 1}}},
                {"$sort": {"n": -1}},
            ]),
            target_ms: Some(50.0),
        },
        Question {
            name: "events per minute, last hour",
            pipeline: json!([
                {"$match": {"_tailrace.received": {"$gte": hour_ago}}},
                {"$group": {"_id": minute, "n": {"$sum": 1}}},
                {"$sort": {"_id": 1}},
            ]),
            target_ms: Some(50.0),
        },
        Question {
            name: "top 10 hashtags, all",
            pipeline: json!([
                {"$unwind": "$hashtags"},
                {"$sortByCount": "$hashtags"},
                {"$limit": 10},
            ]),
            target_ms: Some(1500.0),
        },
        Question {
            name: "distinct user.screen_name (indexed), all",
            pipeline: json!([{"$group": {"_id": "$user.screen_name"}}, {"$count": "n"}]),
            target_ms: Some(1000.0),
        },
        Question {
            name: "distinct user.followers_count (unindexed), all",
            pipeline: json!([{"$group": {"_id": "$user.followers_count"}}, {"$count": "n"}]),
            target_ms: Some(3000.0),
        },
        Question {
            name: "users posting more than 5 times, all",
            pipeline: json!([
                {"$group": {"_id": "$user.screen_name", "n": {"$sum": 1}}},
                {"$match": {"n": {"$gt": 5}}},
                {"$count": "users"},
            ]),
            target_ms: None,
        },
    ]
}

/// Runs the scenario.
pub async fn run(bench: &Bench) -> Result<Report> {
    let docs = bench.docs(1_000_000, 2_000);
    let n = bench.iterations(5, 2);
    let mut report = new_report(
        bench,
        Scenario::Query,
        &format!(
            "aggregation pipelines over {} stored {} events, {n} runs each",
            thousands(docs),
            bench.args.dataset.as_str()
        ),
    );
    let dir = bench.data_dir("query");
    let store = bench.open_store("query").await?;
    let coll = store
        .capped("bench_query", &events_like(bench, docs))
        .await?;
    let end_us = load(bench, &coll, docs).await?;

    let mut lines: Vec<(String, Samples)> = Vec::new();
    let mut t = Table::new(&["question", "first", "p50", "max", "read", "answer"]);
    for q in questions(end_us) {
        let pipeline = Pipeline::parse(&q.pipeline)
            .map_err(|e| BenchError::Scenario(format!("{}: {e}", q.name)))?;
        let ask = || {
            aggregate(
                Input::Capped(Arc::clone(&coll)),
                pipeline.clone(),
                Limits::default(),
            )
        };
        // The first run also builds what the engine keeps to answer the next ones (the
        // embedded engine's zones of received times): reported apart.
        let t0 = Instant::now();
        let warm = ask()
            .await
            .map_err(|e| BenchError::Scenario(format!("{}: {e}", q.name)))?;
        let first_us = t0.elapsed().as_secs_f64() * 1e6;
        let mut samples = Samples::with_capacity(n);
        let started = Instant::now();
        for _ in 0..n {
            let t0 = Instant::now();
            ask()
                .await
                .map_err(|e| BenchError::Scenario(format!("{}: {e}", q.name)))?;
            samples.push(t0.elapsed());
        }
        let elapsed = started.elapsed().as_secs_f64();
        let summary = samples.summary();
        let answer = if warm.docs.len() == 1 {
            warm.docs[0].to_string()
        } else {
            format!("{} documents", warm.docs.len())
        };
        t.row(vec![
            q.name.to_owned(),
            fmt_us(first_us),
            fmt_us(summary.p50),
            fmt_us(summary.max),
            thousands(warm.read),
            answer.chars().take(40).collect(),
        ]);
        if let Some(ms) = q.target_ms {
            report.targets.push(Target::at_most(
                format!("{}: p50 ≤ {ms} ms", q.name),
                summary.p50 / 1000.0,
                ms,
                "ms",
            ));
        }
        report.series.push(Series {
            name: q.name.into(),
            params: json!({"pipeline": q.pipeline, "read": warm.read, "answer_docs": warm.docs.len(),
                           "stages": warm.stages, "first_us": first_us}),
            latency_us: summary,
            ops: n as u64,
            elapsed_secs: elapsed,
            throughput_per_sec: n as f64 / elapsed.max(1e-9),
            ..Series::default()
        });
        lines.push((q.name.to_owned(), samples));
    }
    report.params = json!({
        "docs": docs, "iterations": n, "dataset": bench.args.dataset.describe(),
        "receipt_times": "spread evenly over the 24 hours before the run",
        "evaluated": "in tailrace (store::query), every stage; documents read from the capped collection oldest first",
    });
    report.notes.push(
        "a $match on _tailrace.received reads only where that range lies (store::Capped::time_span); every other question reads the whole window".into(),
    );
    let plot_lines: Vec<Line<'_>> = lines
        .iter()
        .map(|(name, s)| Line {
            name: name.clone(),
            values: s.as_slice(),
        })
        .collect();
    report.plots.extend(plot::latency_pair(
        &bench.out,
        "query",
        "aggregation pipelines",
        &plot_lines,
    )?);
    report.print_header();
    t.print();
    report.print_footer();
    drop(coll);
    store.close().await?;
    drop(store);
    super::remove_dir(&dir);
    Ok(report)
}

/// Writes `docs` stamped events, receipt times spread over the day before now; the newest
/// receipt time.
async fn load(bench: &Bench, coll: &Arc<dyn Capped>, docs: u64) -> Result<i64> {
    let end_us = store::clock::now_us();
    let start_us = end_us - DAY_US;
    let step = DAY_US / docs.max(1) as i64;
    let mut g = Docs::new(bench.args.dataset, 57);
    let pb = bench.progress(docs, "query: loading");
    let mut seq = 0;
    while seq < docs {
        let k = 1000.min(docs - seq);
        let chunk = (0..k)
            .map(|i| {
                let mut d = g.stamped(seq + i + 1);
                let at = start_us + (seq + i) as i64 * step;
                if let Some(Value::Object(stamp)) = d.get_mut(store::STAMP_FIELD) {
                    stamp.insert("received_us".into(), at.into());
                    stamp.insert("ingested_us".into(), at.into());
                    if let Some(date) = store::date::value(at.div_euclid(1000)) {
                        stamp.insert("received".into(), date);
                    }
                }
                d
            })
            .collect::<Vec<_>>();
        coll.append(chunk, Durability::Acknowledged).await?;
        seq += k;
        pb.inc(k);
    }
    pb.finish_and_clear();
    Ok(start_us + (docs as i64 - 1) * step)
}
