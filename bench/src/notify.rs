//! `notify`: how long after a write is acknowledged does a consumer hold it — for each feed
//! kind (tailable cursor; change feed; on MongoDB also the raw oplog watcher), at 70 events/s
//! and with writers going flat out.
//!
//! The consumer reads the same streams the feeds read (`Capped::tail`, `Store::changes`,
//! `Store::oplog`), opened at "now", and notes the wall-clock time the moment an event is
//! yielded — the point where a feed starts processing it. Latency is measured from the
//! engine's acknowledgment stamp (`committed_at_us`, set when the commit returned, the same
//! origin as the `tailrace_notification_latency_seconds` metric); where an engine does not
//! stamp, from the moment the writer's `append` returned. Both clocks are the same host's.
//! The latency from the writer's own acknowledgment is also reported: it can be negative,
//! because the embedded engine publishes a commit before it answers the writer.
//!
//! The floor is a cross-thread wake of a parked task through a tokio broadcast channel, the
//! primitive the embedded engine publishes commits with.
//!
//! The flat-out runs write `--dataset` (realistic by default: tweets with every script and
//! emoji to the capped collection, and for the change feeds `hashtags:<tag>` keys with the
//! realistic hashtag law, mostly new keys); the 70/s runs always write the small dataset, so
//! they stay comparable with the targets measured on it (at 70/s the content does not matter).
//!
//! **External consumer**: the same writes to the capped collection, held by a client of
//! `/api/changes` over 127.0.0.1 — the real router in this process, a TCP connection of its
//! own, NDJSON decoded by [`super::changes_client`] — so the latency includes the server's
//! stream task, HTTP framing and the loopback. Its floor is a one-byte loopback round trip;
//! it is set beside the networked notification systems measured by the issue (#12).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::BoxStream;
use serde_json::{Value, json};
use store::{
    Capped, CappedSpec, ChangeFilter, ChangeStart, Durability, KeyUpdate, Keyed, Start, Store,
    StoreError, Update,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::dataset::{Dataset, Docs};
use super::floors::{self, Floor};
use super::measure::{Samples, fmt_rate, fmt_ratio, fmt_us};
use super::plot::{self, Line};
use super::report::{Report, Series, Table, Target};
use super::{Bench, BenchError, Result, Scenario, new_report, wall_us};

/// The low rate: the original sample stream's 70 events/s.
pub const LOW_RATE: f64 = 70.0;
/// How long the consumer may take to catch up after the writers stop.
const CATCH_UP: Duration = Duration::from_secs(10);
/// The goal for the external client's p50 at 70/s (issue #12: under every networked peer).
pub const HTTP_P50_GOAL_US: f64 = 150.0;
/// The networked notification systems measured in one harness run on this machine (issue
/// #12), p50: what an external consumer of tailrace is set beside.
const PEERS: [(&str, &str, f64, &str); 6] = [
    (
        "Redis Streams XREAD BLOCK",
        "notify p50 (low end)",
        157.0,
        "µs",
    ),
    (
        "Redis Streams XREAD BLOCK",
        "notify p50 (high end)",
        511.0,
        "µs",
    ),
    ("NATS core", "notify p50", 178.0, "µs"),
    ("NATS JetStream push", "notify p50", 284.0, "µs"),
    (
        "PostgreSQL LISTEN/NOTIFY",
        "notify p50 (low end)",
        353.0,
        "µs",
    ),
    (
        "PostgreSQL LISTEN/NOTIFY",
        "notify p50 (high end)",
        610.0,
        "µs",
    ),
];

/// A feed kind as this scenario reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `Capped::tail`.
    Tailable,
    /// `Store::changes`.
    Changes,
    /// `Store::oplog`.
    Oplog,
    /// A client of `/api/changes?collection=events` over 127.0.0.1 (the capped collection).
    Http,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Tailable => "tailable",
            Kind::Changes => "changes",
            Kind::Oplog => "oplog",
            Kind::Http => "/api/changes client",
        }
    }
}

/// One event as the consumer saw it.
struct Held {
    seq: u64,
    hold_us: f64,
    committed_us: Option<i64>,
}

/// What one measured run produced.
struct Phase {
    kind: Kind,
    /// The paced low-rate run (not flat out).
    low: bool,
    label: String,
    /// Acknowledgment stamp (or writer's ack) → consumer holds it.
    latency: Samples,
    /// Writer's ack → consumer holds it (signed).
    from_caller_ack: Samples,
    written: u64,
    received: u64,
    write_secs: f64,
    lag_at_end: u64,
    stamped: bool,
}

/// The collections written to.
struct Targets {
    capped: Arc<dyn Capped>,
    keyed: Arc<dyn Keyed>,
}

type HeldStream = BoxStream<'static, Result<(u64, Option<i64>), BenchError>>;

/// Opens what `kind` reads, at "now". The HTTP client returns once the server said `ready`:
/// every write after that reaches it.
async fn open_stream(
    store: &Arc<dyn Store>,
    t: &Targets,
    kind: Kind,
    http: Option<SocketAddr>,
) -> Result<HeldStream> {
    let seq_of = |doc: Option<&store::Document>| {
        doc.and_then(|d| d.get("bench_seq"))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    let filter = ChangeFilter::collections([t.keyed.name().to_string()]);
    let store_err =
        |r: std::result::Result<(u64, Option<i64>), StoreError>| r.map_err(BenchError::Store);
    Ok(match kind {
        Kind::Tailable => t
            .capped
            .tail(Start::Now)
            .map(move |r| r.map(|r| (seq_of(Some(&r.doc)), r.committed_at_us)))
            .map(store_err)
            .boxed(),
        Kind::Changes => store
            .changes(filter, ChangeStart::Now)
            .map(move |c| c.map(|c| (seq_of(c.after.as_deref()), Some(c.committed_at_us))))
            .map(store_err)
            .boxed(),
        Kind::Oplog => store
            .oplog(filter, ChangeStart::Now)
            .map(move |c| c.map(|c| (seq_of(c.after.as_deref()), Some(c.committed_at_us))))
            .map(store_err)
            .boxed(),
        Kind::Http => {
            let addr = http.ok_or_else(|| BenchError::Scenario("no API server".into()))?;
            let mut events =
                super::changes_client::open(addr, "collection=events&include_states=true").await?;
            loop {
                match events.next().await {
                    Some(Ok(v)) if v["type"] == "state" && v["state"] == "ready" => break,
                    Some(Ok(_)) => {}
                    Some(Err(e)) => return Err(e),
                    None => {
                        return Err(BenchError::Scenario(
                            "/api/changes ended before ready".into(),
                        ));
                    }
                }
            }
            events
                .filter_map(|v| {
                    futures::future::ready(match v {
                        Ok(v) if v["type"] == "change" => Some(Ok((
                            v["doc"]["bench_seq"].as_u64().unwrap_or(0),
                            v["committed_at_us"].as_i64(),
                        ))),
                        Ok(_) => None,
                        Err(e) => Some(Err(e)),
                    })
                })
                .boxed()
        }
    })
}

/// The real router on a free loopback port (`TCP_NODELAY`, as the pipeline serves it), with
/// the bench's collections as `events` and `rollups`; stopped by `stop`.
async fn api_server(
    store: &Arc<dyn Store>,
    t: &Targets,
    stop: CancellationToken,
) -> Result<SocketAddr> {
    use axum::serve::ListenerExt;
    let collections = ingest::pipeline::Collections {
        events: t.capped.clone(),
        dead_letters: t.capped.clone(),
        rollups: t.keyed.clone(),
        stats: t.keyed.clone(),
        trends: t.keyed.clone(),
    };
    let state = server::AppState::for_collections(
        store.clone(),
        collections,
        json!({"bench": "notify"}),
        server::StreamLimits::new(8, Duration::from_secs(30)),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(super::io_err("binding the API server"))?;
    let addr = listener
        .local_addr()
        .map_err(super::io_err("API server address"))?;
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let app = server::router(state);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await;
    });
    Ok(addr)
}

/// One write of event `seq` to what `kind` reads.
async fn write_one(t: &Targets, kind: Kind, g: &mut Docs, seq: u64, d: Durability) -> Result<()> {
    match kind {
        Kind::Tailable | Kind::Http => {
            let mut doc = g.stamped(seq);
            doc.insert("bench_seq".into(), json!(seq));
            t.capped.append(vec![doc], d).await?;
        }
        Kind::Changes | Kind::Oplog => {
            let key = g.key(seq);
            let u = Update::inc("n", 1).and_set("bench_seq", seq);
            t.keyed.update(vec![KeyUpdate::new(key, u)], d).await?;
        }
    }
    Ok(())
}

/// How a phase writes.
#[derive(Clone, Copy)]
struct Load {
    durability: Durability,
    /// One writer paced at this rate, or (`None`) `writers` flat out.
    rate: Option<f64>,
    writers: usize,
    duration: Duration,
    /// What the writers write.
    dataset: Dataset,
}

/// Runs the writers of `load` while one consumer holds the events.
async fn phase(
    bench: &Bench,
    store: &Arc<dyn Store>,
    t: &Arc<Targets>,
    kind: Kind,
    load: Load,
    http: Option<SocketAddr>,
) -> Result<Phase> {
    let Load {
        durability: d,
        rate,
        writers,
        duration,
        dataset,
    } = load;
    let mut stream = Box::pin(open_stream(store, t, kind, http)).await?;
    let (total_tx, mut total_rx) = watch::channel::<Option<u64>>(None);
    let received = Arc::new(AtomicU64::new(0));
    let consumer = {
        let received = received.clone();
        tokio::spawn(async move {
            let mut held: Vec<Held> = Vec::new();
            loop {
                if let Some(total) = *total_rx.borrow()
                    && received.load(Ordering::Relaxed) >= total
                {
                    break;
                }
                tokio::select! {
                    item = stream.next() => match item {
                        Some(Ok((seq, committed_us))) => {
                            let hold_us = wall_us();
                            held.push(Held { seq, hold_us, committed_us });
                            received.fetch_add(1, Ordering::Relaxed);
                        }
                        Some(Err(e)) => return Err(e),
                        None => break,
                    },
                    changed = total_rx.changed() => if changed.is_err() { break },
                }
            }
            Ok(held)
        })
    };

    let label = match rate {
        Some(r) => format!("{} @ {r:.0}/s", kind.as_str()),
        None => format!("{} @ max ({writers} writers)", kind.as_str()),
    };
    let pb = bench.progress(duration.as_millis() as u64, &format!("notify {label}"));
    let next_seq = Arc::new(AtomicU64::new(1));
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + duration;
    let tasks = if rate.is_some() { 1 } else { writers.max(1) };
    let mut handles = Vec::new();
    for w in 0..tasks {
        let (t, next_seq) = (t.clone(), next_seq.clone());
        let period = rate.map(|r| Duration::from_secs_f64(1.0 / r));
        handles.push(tokio::spawn(async move {
            let mut g = Docs::new(dataset, 100 + w as u64);
            let mut acks: Vec<(u64, f64)> = Vec::new();
            let start = tokio::time::Instant::now();
            let mut i = 0u32;
            loop {
                if let Some(p) = period {
                    let at = start + p * i;
                    if at >= deadline {
                        break;
                    }
                    tokio::time::sleep_until(at).await;
                    i += 1;
                } else if tokio::time::Instant::now() >= deadline {
                    break;
                }
                let seq = next_seq.fetch_add(1, Ordering::Relaxed);
                write_one(&t, kind, &mut g, seq, d).await?;
                acks.push((seq, wall_us()));
            }
            Ok::<_, BenchError>(acks)
        }));
    }
    let ticker = {
        let pb = pb.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_millis(200));
            loop {
                every.tick().await;
                pb.set_position(started.elapsed().as_millis() as u64);
            }
        })
    };
    let mut acks: Vec<(u64, f64)> = Vec::new();
    for h in handles {
        acks.extend(
            h.await
                .map_err(|e| BenchError::Scenario(format!("notify writer: {e}")))??,
        );
    }
    ticker.abort();
    pb.finish_and_clear();
    let write_secs = started.elapsed().as_secs_f64();
    let written = acks.len() as u64;
    let lag_at_end = written.saturating_sub(received.load(Ordering::Relaxed));
    let _ = total_tx.send(Some(written));
    let held = match tokio::time::timeout(CATCH_UP, consumer).await {
        Ok(joined) => {
            joined.map_err(|e| BenchError::Scenario(format!("notify consumer: {e}")))??
        }
        Err(_) => {
            return Err(BenchError::Scenario(format!(
                "notify {label}: the consumer had not caught up {} s after the writers stopped ({} of {written} held)",
                CATCH_UP.as_secs(),
                received.load(Ordering::Relaxed)
            )));
        }
    };
    // Writer acknowledgment time by sequence number.
    let max_seq = acks.iter().map(|a| a.0).max().unwrap_or(0) as usize;
    let mut ack_at = vec![f64::NAN; max_seq + 1];
    for (seq, at) in &acks {
        ack_at[*seq as usize] = *at;
    }
    let mut latency = Samples::with_capacity(held.len());
    let mut from_caller_ack = Samples::with_capacity(held.len());
    let mut stamped = true;
    for h in &held {
        let ack = ack_at.get(h.seq as usize).copied().unwrap_or(f64::NAN);
        match h.committed_us {
            Some(c) => latency.push_us(h.hold_us - c as f64),
            None => {
                stamped = false;
                latency.push_us(h.hold_us - ack);
            }
        }
        if ack.is_finite() {
            from_caller_ack.push_us(h.hold_us - ack);
        }
    }
    Ok(Phase {
        kind,
        low: rate.is_some(),
        label,
        latency,
        from_caller_ack,
        written,
        received: held.len() as u64,
        write_secs,
        lag_at_end,
        stamped,
    })
}

/// Runs the scenario.
pub async fn run(bench: &Bench) -> Result<Report> {
    let duration = bench.duration(Duration::from_secs(8), Duration::from_millis(400));
    let writers = *bench.concurrency(&[16], &[2]).iter().max().unwrap_or(&16);
    let d = bench.config.store.durability;
    let n_floor = bench.iterations(1000, 20);
    let mut kinds = vec![Kind::Tailable, Kind::Changes];
    if !bench.local_disk() {
        kinds.push(Kind::Oplog);
    }
    kinds.push(Kind::Http);
    let dir = bench.data_dir("notify");
    let store = bench.open_store("notify").await?;
    // A kind the server cannot serve is left out, and the report says why.
    let caps = store.capabilities();
    let mut left_out = Vec::new();
    kinds.retain(|kind| {
        let needs = match kind {
            Kind::Changes => Some(store::Capability::ChangeStreams),
            Kind::Oplog => Some(store::Capability::Oplog),
            Kind::Tailable | Kind::Http => None,
        };
        match needs.and_then(|c| caps.get(c).reason().map(|r| (c, r))) {
            Some((c, reason)) => {
                left_out.push(format!(
                    "{} not measured: the server lacks {c} ({reason})",
                    kind.as_str()
                ));
                false
            }
            None => true,
        }
    });
    let mut report = new_report(
        bench,
        Scenario::Notify,
        &format!(
            "write acknowledged → consumer holds it, per feed kind, at {LOW_RATE:.0}/s and flat out, {} each",
            humantime::format_duration(duration)
        ),
    );
    report.params = json!({
        "duration_secs": duration.as_secs_f64(), "low_rate": LOW_RATE, "max_writers": writers,
        "durability": d.as_str(), "kinds": kinds.iter().map(|k| k.as_str()).collect::<Vec<_>>(),
        "flat_out_dataset": bench.args.dataset.describe(), "low_rate_dataset": "small",
    });
    let spec = CappedSpec {
        max_docs: 1_000_000,
        max_bytes: 1 << 30,
        indexes: vec![],
    };
    let t = Arc::new(Targets {
        capped: store.capped("bench_notify", &spec).await?,
        keyed: store.keyed("bench_notify_kv").await?,
    });
    // Warm-up: statements, pages, the writer thread.
    let mut g = Docs::new(Dataset::Small, 3);
    for seq in 0..20 {
        write_one(&t, Kind::Tailable, &mut g, seq, d).await?;
        write_one(&t, Kind::Changes, &mut g, seq, d).await?;
    }

    // The floor at the low rate's own pace (an idle runtime and CPU between events wake more
    // slowly than busy ones), and at 1 ms gaps for the flat-out runs.
    let low_gap = Duration::from_secs_f64(1.0 / LOW_RATE);
    let n_low = ((duration.as_secs_f64() * LOW_RATE) as usize).clamp(20, n_floor.max(20));
    let wake = floors::wake(n_low, low_gap).await?;
    report.floors.push(Floor::new(
        "task_wake",
        format!("a parked task woken from another thread through a tokio broadcast channel (the embedded engine's commit hub), one wake every {} like events at {LOW_RATE:.0}/s", fmt_us(low_gap.as_secs_f64() * 1e6)),
        &wake,
    ));
    let wake_busy = floors::wake(n_floor, Duration::from_millis(1)).await?;
    report.floors.push(Floor::new(
        "task_wake_1ms",
        "the same wake, one every 1 ms (a busier runtime, for the flat-out runs)",
        &wake_busy,
    ));
    let wake_p50 = wake.summary().p50;
    let busy_p50 = wake_busy.summary().p50;
    let loopback = floors::loopback(n_floor).await?;
    report.floors.push(Floor::new(
        "loopback_rtt",
        "a one-byte TCP round trip on 127.0.0.1 between two tasks (the external client's floor)",
        &loopback,
    ));
    let loopback_p50 = loopback.summary().p50;
    let stop_api = CancellationToken::new();
    let http = Some(Box::pin(api_server(&store, &t, stop_api.clone())).await?);

    let mut phases = Vec::new();
    for &kind in &kinds {
        let low = Load {
            durability: d,
            rate: Some(LOW_RATE),
            writers: 1,
            duration,
            dataset: Dataset::Small,
        };
        // Boxed: a phase's future is large, and `bench all` nests every scenario's in one.
        phases.push(Box::pin(phase(bench, &store, &t, kind, low, http)).await?);
        let max = Load {
            rate: None,
            writers,
            dataset: bench.args.dataset,
            ..low
        };
        phases.push(Box::pin(phase(bench, &store, &t, kind, max, http)).await?);
    }
    stop_api.cancel();

    for p in &phases {
        let low = p.low;
        let s = p.latency.summary();
        let ack = p.from_caller_ack.summary();
        let before_ack = p
            .from_caller_ack
            .as_slice()
            .iter()
            .filter(|v| **v < 0.0)
            .count();
        report.series.push(Series {
            name: p.label.clone(),
            params: json!({"kind": p.kind.as_str(), "rate": if low { json!(LOW_RATE) } else { Value::Null },
                           "writers": if low { 1 } else { writers },
                           "dataset": if low { "small" } else { bench.args.dataset.as_str() }}),
            latency_us: s,
            ops: p.received,
            failures: p.written.saturating_sub(p.received),
            elapsed_secs: p.write_secs,
            throughput_per_sec: p.written as f64 / p.write_secs.max(1e-9),
            floor: Some(
                match (p.kind, low) {
                    (Kind::Http, _) => "loopback_rtt",
                    (_, true) => "task_wake",
                    (_, false) => "task_wake_1ms",
                }
                .into(),
            ),
            ratio_to_floor: Some(
                s.p50
                    / match (p.kind, low) {
                        (Kind::Http, _) => loopback_p50,
                        (_, true) => wake_p50,
                        (_, false) => busy_p50,
                    },
            ),
            extra: json!({
                "measured_from": if p.stamped { "engine acknowledgment stamp (committed_at_us)" } else { "writer's append returning" },
                "written": p.written,
                "lag_when_writers_stopped": p.lag_at_end,
                "from_writer_ack_us": ack,
                "held_before_writer_saw_ack": before_ack,
            }),
        });
    }
    if bench.local_disk() {
        for kind in [Kind::Tailable, Kind::Changes] {
            if let Some(s) = report
                .series
                .iter()
                .find(|s| s.params["kind"] == kind.as_str() && !s.params["rate"].is_null())
            {
                let (ratio, p99) = (s.ratio_to_floor.unwrap_or(f64::NAN), s.latency_us.p99);
                report.targets.push(Target::at_most(
                    format!("{} at 70/s p50 ≤ 2× the wake floor", kind.as_str()),
                    ratio,
                    2.0,
                    "×floor",
                ));
                report.targets.push(Target::at_most(
                    format!("{} at 70/s p99 ≤ 250 µs", kind.as_str()),
                    p99,
                    250.0,
                    "µs",
                ));
            }
        }
    }
    if let Some(s) = report
        .series
        .iter()
        .find(|s| s.params["kind"] == Kind::Http.as_str() && !s.params["rate"].is_null())
    {
        report.targets.push(Target::at_most(
            format!("/api/changes client at 70/s p50 ≤ {HTTP_P50_GOAL_US:.0} µs (under every networked peer)"),
            s.latency_us.p50,
            HTTP_P50_GOAL_US,
            "µs",
        ));
    }
    report.references(&PEERS);
    report.notes.extend(left_out);
    report.notes.push(
        "the peers (issue #12) were measured in one harness run on this machine: networked clients of each system, p50; the /api/changes client is their counterpart (a separate TCP connection, HTTP framing, JSON)".into(),
    );
    report.notes.push(format!(
        "writes use durability {d}; latency starts at the engine's acknowledgment stamp, so the fsync itself is not in it"
    ));
    if phases.iter().any(|p| p.lag_at_end > 0) {
        report.notes.push(
            "flat out, the consumer trailed the writers (see lag_when_writers_stopped); every event was still held".into(),
        );
    }

    let mut lines: Vec<Line<'_>> = phases
        .iter()
        .map(|p| Line {
            name: p.label.clone(),
            values: p.latency.as_slice(),
        })
        .collect();
    lines.push(Line {
        name: "wake floor (70/s pace)".into(),
        values: wake.as_slice(),
    });
    report.plots.extend(plot::latency_pair(
        &bench.out,
        "notify",
        "notification latency",
        &lines,
    )?);

    report.print_header();
    let mut tab = Table::new(&[
        "feed @ rate",
        "held",
        "writes/s",
        "p50",
        "p99",
        "p99.9",
        "max",
        "p50 ×floor",
        "p50 from writer ack",
    ]);
    for s in &report.series {
        tab.row(vec![
            s.name.clone(),
            format!("{}/{}", s.ops, s.ops + s.failures),
            fmt_rate(s.throughput_per_sec),
            fmt_us(s.latency_us.p50),
            fmt_us(s.latency_us.p99),
            fmt_us(s.latency_us.p999),
            fmt_us(s.latency_us.max),
            s.ratio_to_floor.map(fmt_ratio).unwrap_or_default(),
            fmt_us(
                s.extra["from_writer_ack_us"]["p50"]
                    .as_f64()
                    .unwrap_or(f64::NAN),
            ),
        ]);
    }
    tab.print();
    report.print_footer();
    drop(t);
    store.close().await?;
    drop(store);
    super::remove_dir(&dir);
    Ok(report)
}
