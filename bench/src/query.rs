//! `query`: the questions of issue 57 asked of a stored window of realistic events, in
//! MongoDB's aggregation language (`store::query`), on whichever engine the config selects.
//!
//! The window: `--docs` events (1,000,000) written straight into a capped collection, their
//! receipt times spread evenly over the day before the run, so that "the last hour" and "ten
//! minutes" hold what they would at ~12 events/s. Each pipeline runs `--iterations` times (5)
//! after one untimed run; the table gives the median, the documents read and the answer's
//! size, and the targets say which bounds are met.
//!
//! Then events arrive at 70/s (journaled, one at a time, as the sample stream lands) for
//! `--duration` (60 s) with no question asked and as long with every question asked back to
//! back, in alternating slices of 10 s: the machine's other tenants, which come and go over
//! minutes, weigh on both alike (two runs one after the other put the ratio of their p99s
//! anywhere from 1.1× to 1.4× on one build). A tail of the collection notes how long after
//! each commit it holds the event (the notification latency); the table compares the two,
//! with the events stored per second and the process's resident memory.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;

use serde_json::{Value, json};
use store::query::{Input, Limits, Pipeline, aggregate};
use store::{Capped, Durability, Start};

use super::dataset::Docs;
use super::measure::{Samples, fmt_us, thousands};
use super::plot::{self, Line};
use super::report::{Report, Series, Table, Target};
use super::writes::events_like;
use super::{Bench, BenchError, Result, Scenario, new_report};

/// A day of receipt times, in microseconds.
const DAY_US: i64 = 86_400_000_000;

/// One question: its name, its pipeline, and the median it should take (ms), if any, with
/// queries on at least `cores` cores.
struct Question {
    name: &'static str,
    pipeline: Value,
    target_ms: Option<f64>,
    cores: usize,
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
            cores: 1,
        },
        Question {
            name: "events per minute, last hour",
            pipeline: json!([
                {"$match": {"_tailrace.received": {"$gte": hour_ago}}},
                {"$group": {"_id": minute, "n": {"$sum": 1}}},
                {"$sort": {"_id": 1}},
            ]),
            target_ms: Some(50.0),
            cores: 1,
        },
        Question {
            name: "top 10 hashtags, all",
            pipeline: json!([
                {"$unwind": "$hashtags"},
                {"$sortByCount": "$hashtags"},
                {"$limit": 10},
            ]),
            target_ms: Some(1500.0),
            // "On 2 cores, using both".
            cores: 2,
        },
        Question {
            name: "distinct user.screen_name (indexed), all",
            pipeline: json!([{"$group": {"_id": "$user.screen_name"}}, {"$count": "n"}]),
            target_ms: Some(1000.0),
            cores: 1,
        },
        Question {
            name: "distinct user.followers_count (unindexed), all",
            pipeline: json!([{"$group": {"_id": "$user.followers_count"}}, {"$count": "n"}]),
            target_ms: Some(3000.0),
            cores: 1,
        },
        Question {
            name: "users posting more than 5 times, all",
            pipeline: json!([
                {"$group": {"_id": "$user.screen_name", "n": {"$sum": 1}}},
                {"$match": {"n": {"$gt": 5}}},
                {"$count": "users"},
            ]),
            target_ms: None,
            cores: 1,
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
        match q.target_ms {
            Some(ms) if store::query::cores() >= q.cores => {
                report.targets.push(Target::at_most(
                    format!("{}: p50 ≤ {ms} ms", q.name),
                    summary.p50 / 1000.0,
                    ms,
                    "ms",
                ));
            }
            Some(ms) => report.notes.push(format!(
                "{}: its bound ({ms} ms) is for queries on {} cores; these ran on {} (TAILRACE_HTTP__QUERY_CORES={} to judge it)",
                q.name,
                q.cores,
                store::query::cores(),
                q.cores
            )),
            None => {}
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
    // The same questions back to back while events arrive at 70/s, against the same arrivals
    // with no question asked.
    let pipelines: Vec<Pipeline> = questions(end_us)
        .iter()
        .filter_map(|q| Pipeline::parse(&q.pipeline).ok())
        .collect();
    let span = bench.duration(Duration::from_secs(60), Duration::from_secs(1));
    let (quiet, busy) = under_load(bench, &coll, &pipelines, span).await?;
    let mut l = Table::new(&[
        "at 70 events/s",
        "notify p50",
        "notify p99",
        "stored/s",
        "RSS max",
        "questions",
    ]);
    for (name, run) in [("no questions", &quiet), ("questions back to back", &busy)] {
        let s = run.notify.summary();
        l.row(vec![
            name.to_owned(),
            fmt_us(s.p50),
            fmt_us(s.p99),
            format!("{:.1}", run.stored_per_sec),
            format!("{:.1} MiB", run.rss_max_kib as f64 / 1024.0),
            thousands(run.questions),
        ]);
        report.series.push(Series {
            name: format!("70/s, {name}"),
            params: json!({"questions": run.questions, "rss_max_kib": run.rss_max_kib,
                           "stored_per_sec": run.stored_per_sec, "latency": "notification: committed → a tail holds it"}),
            latency_us: s,
            ops: run.notify.len() as u64,
            elapsed_secs: span.as_secs_f64(),
            throughput_per_sec: run.stored_per_sec,
            ..Series::default()
        });
    }
    let (q99, b99) = (quiet.notify.summary().p99, busy.notify.summary().p99);
    report.targets.push(Target::at_most(
        "notification p99 with questions back to back ≤ 1.2× without",
        b99 / q99.max(1.0),
        1.2,
        "×",
    ));
    report.targets.push(Target::at_least(
        "events stored per second with questions ≥ 0.99× without",
        busy.stored_per_sec / quiet.stored_per_sec.max(1e-9),
        0.99,
        "×",
    ));
    let query_cores = store::query::cores();
    report.params = json!({
        "docs": docs, "iterations": n, "dataset": bench.args.dataset.describe(),
        "under_load_secs": span.as_secs_f64(),
        "receipt_times": "spread evenly over the 24 hours before the run",
        "evaluated": "in tailrace (store::query), every stage; documents read from the capped collection oldest first",
        "query_cores": query_cores,
    });
    report.notes.push(
        "where each question ran and what it read: a $match on _tailrace.received reads only where that range lies (store::Capped::time_span); a count by minute adds up the documents received each second (the timeline); a $group by an indexed field reads its values files (the index); the rest read the whole window".into(),
    );
    let all = std::thread::available_parallelism().map_or(1, |n| n.get());
    report.notes.push(format!(
        "queries ran on {query_cores} of the {all} cores (http.query_cores; the rest are the pipeline's)"
    ));
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
    l.print();
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

/// One run at 70 events/s.
struct LoadRun {
    /// Commit → the tail holds the event, per event.
    notify: Samples,
    stored_per_sec: f64,
    rss_max_kib: u64,
    /// Questions answered while it ran.
    questions: u64,
}

/// The process's resident memory, in KiB (0 where `/proc` has none).
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// What the run under load is doing; each notification is filed under the phase it arrives in.
const QUIET: u8 = 0;
const BUSY: u8 = 1;
/// Questions stopped, the one in flight finishing: its notifications are in neither phase.
const SETTLING: u8 = 2;

/// The longest slice of one phase: the machine's other tenants come and go over minutes, so
/// the phases alternate well within that, and both meet the same machine.
const SLICE: Duration = Duration::from_secs(10);

/// Appends one event every 1/70 s and tails the collection, for `span` with no question asked
/// and `span` with `pipelines` asked back to back, in alternating slices of at most [`SLICE`]
/// (quiet first). Between a busy slice and the next quiet one, the question in flight
/// finishes first. Returns the quiet run, then the busy one.
async fn under_load(
    bench: &Bench,
    coll: &Arc<dyn Capped>,
    pipelines: &[Pipeline],
    span: Duration,
) -> Result<(LoadRun, LoadRun)> {
    let pairs = ((span.as_secs_f64() / SLICE.as_secs_f64()).floor() as u32).max(1);
    let slice = span / pairs;
    let newest = coll.bounds().await?.map(|b| b.newest);
    let mut tail = coll.tail(newest.map_or(Start::Oldest, Start::After));
    let done = Arc::new(AtomicBool::new(false));
    let stored = Arc::new(AtomicU64::new(0));
    let phase = Arc::new(AtomicU8::new(QUIET));
    let consumer = {
        let (done, stored, phase) = (done.clone(), stored.clone(), phase.clone());
        tokio::spawn(async move {
            let mut notify = [Samples::with_capacity(8192), Samples::with_capacity(8192)];
            let mut held = 0;
            loop {
                if done.load(Ordering::Relaxed) && held >= stored.load(Ordering::Relaxed) {
                    break;
                }
                match tokio::time::timeout(Duration::from_millis(200), tail.next()).await {
                    Ok(Some(Ok(r))) => {
                        let now = super::wall_us();
                        let at = phase.load(Ordering::Relaxed);
                        if let (Some(c), Some(s)) = (r.committed_at_us, notify.get_mut(at as usize))
                        {
                            s.push_us((now - c as f64).max(0.0));
                        }
                        held += 1;
                    }
                    Ok(Some(Err(e))) => return Err(BenchError::from(e)),
                    Ok(None) => break,
                    Err(_) => {}
                }
            }
            Ok(notify)
        })
    };
    let asked = Arc::new(AtomicU64::new(0));
    let idle = Arc::new(AtomicBool::new(true));
    let asker = {
        let (done, asked, idle, phase) = (done.clone(), asked.clone(), idle.clone(), phase.clone());
        let (coll, pipelines) = (coll.clone(), pipelines.to_vec());
        tokio::spawn(async move {
            let mut next = 0;
            while !pipelines.is_empty() && !done.load(Ordering::Relaxed) {
                if phase.load(Ordering::Relaxed) != BUSY {
                    idle.store(true, Ordering::Release);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
                idle.store(false, Ordering::Release);
                let p = pipelines[next % pipelines.len()].clone();
                next += 1;
                aggregate(Input::Capped(coll.clone()), p, Limits::default())
                    .await
                    .map_err(|e| BenchError::Scenario(format!("under load: {e}")))?;
                asked.fetch_add(1, Ordering::Relaxed);
            }
            idle.store(true, Ordering::Release);
            Ok::<_, BenchError>(())
        })
    };
    let mut g = Docs::new(bench.args.dataset, 70);
    let pb = bench.progress(
        2 * span.as_millis() as u64,
        "query: 70/s, without and with questions in turn",
    );
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / 70.0));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    // Per phase (quiet, busy): seconds spent, events stored, the most memory held.
    let mut secs = [0.0_f64; 2];
    let mut appended = [0_u64; 2];
    let mut rss_max = [rss_kib(); 2];
    let mut at = QUIET;
    let mut started = Instant::now();
    let mut done_pairs = 0;
    let mut seq = 0_u64;
    loop {
        tick.tick().await;
        seq += 1;
        coll.append(vec![g.stamped(seq)], Durability::Journaled)
            .await?;
        stored.fetch_add(1, Ordering::Relaxed);
        if let Some(n) = appended.get_mut(at as usize) {
            *n += 1;
        }
        if seq.is_multiple_of(35)
            && let Some(r) = rss_max.get_mut(at as usize)
        {
            *r = (*r).max(rss_kib());
        }
        let elapsed = started.elapsed();
        match at {
            QUIET | BUSY if elapsed >= slice => {
                secs[at as usize] += elapsed.as_secs_f64();
                pb.inc(elapsed.as_millis() as u64);
                if at == QUIET {
                    at = BUSY;
                } else {
                    at = SETTLING;
                    done_pairs += 1;
                }
                phase.store(at, Ordering::Relaxed);
                started = Instant::now();
            }
            SETTLING if idle.load(Ordering::Acquire) => {
                if done_pairs == pairs {
                    break;
                }
                at = QUIET;
                phase.store(at, Ordering::Relaxed);
                started = Instant::now();
            }
            _ => {}
        }
    }
    done.store(true, Ordering::Relaxed);
    pb.finish_and_clear();
    asker
        .await
        .map_err(|e| BenchError::Scenario(format!("the questions stopped: {e}")))??;
    let [quiet, busy] = consumer
        .await
        .map_err(|e| BenchError::Scenario(format!("the tail stopped: {e}")))??;
    let run = |notify, i: usize, questions| LoadRun {
        notify,
        stored_per_sec: appended[i] as f64 / secs[i].max(1e-9),
        rss_max_kib: rss_max[i],
        questions,
    };
    Ok((
        run(quiet, QUIET as usize, 0),
        run(busy, BUSY as usize, asked.load(Ordering::Relaxed)),
    ))
}
