//! `tailrace bench all --quick`, in-process: every scenario runs at a tiny size on the
//! embedded engine and its JSON and plots are checked for form (not for speed: the numbers of
//! a debug build on a shared machine mean nothing). The replay scenario starts the real
//! `tailrace` binary four times.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use bench::{BenchArgs, Scenario};
use ingest::config::Config;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scenario_writes_well_formed_results() {
    let out = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let mut args = BenchArgs::new(Scenario::All, out.path());
    args.quick = true;
    args.data = Some(data.path().to_path_buf());
    // The replay scenario runs the real binary, which is not this test program.
    args.binary = Some(env!("CARGO_BIN_EXE_tailrace").into());
    tokio::time::timeout(
        Duration::from_secs(120),
        bench::run(Config::default(), args),
    )
    .await
    .expect("bench all --quick finished within 120 s")
    .unwrap_or_else(|e| panic!("bench all --quick failed: {e}"));
    for scenario in Scenario::EACH {
        let report = bench::check::report_files(out.path(), scenario.as_str())
            .unwrap_or_else(|e| panic!("{}: {e}", scenario.as_str()));
        assert!(
            report.quick,
            "{} is marked as a --quick run",
            scenario.as_str()
        );
        assert_eq!(report.engine, "embedded");
    }

    // End to end: in every insert variant both default feeds ran and held every event.
    let insert = bench::check::report_files(out.path(), "insert").unwrap();
    for s in &insert.series {
        let feeds = s.extra["feeds"].as_array().cloned().unwrap_or_default();
        let names: Vec<&str> = feeds.iter().filter_map(|f| f["feed"].as_str()).collect();
        assert_eq!(
            names,
            ["tail", "changes"],
            "insert {}: the default feeds ran, saw {feeds:?}",
            s.name
        );
        for f in &feeds {
            assert!(
                f["caught_up_secs"].as_f64().is_some(),
                "insert {}: feed {} held the last event, saw {f}",
                s.name,
                f["feed"]
            );
            assert!(
                f["notification_us"]["count"].as_u64().unwrap_or(0) > 0,
                "insert {}: feed {} measured notification latency, saw {f}",
                s.name,
                f["feed"]
            );
        }
    }
    // Catch-up: each feed alone and both together held every event they were behind.
    let catchup = bench::check::report_files(out.path(), "catchup").unwrap();
    let runs: Vec<&str> = catchup.series.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(runs, ["tail", "changes", "all feeds together"]);
    let behind = catchup.params["behind"].as_u64().unwrap();
    for s in &catchup.series {
        assert_eq!(
            s.extra["caught_up"], true,
            "catchup {}: {}",
            s.name, s.extra
        );
        let feeds = s.extra["feeds"].as_array().unwrap().len() as u64;
        assert_eq!(
            s.ops,
            behind * feeds,
            "catchup {}: each feed held the {behind} events it was behind",
            s.name
        );
    }
    // Replay: four runs of the real binary, and its feeds processed every event.
    let replay = bench::check::report_files(out.path(), "replay").unwrap();
    assert_eq!(replay.series.len(), 4, "four hashtag shapes");
    for s in &replay.series {
        assert_eq!(
            s.failures, 0,
            "replay {}: the feeds processed every event before the binary stopped: {}",
            s.name, s.extra
        );
    }
    let leftovers: Vec<_> = std::fs::read_dir(data.path()).unwrap().collect();
    assert!(
        leftovers.is_empty(),
        "the bench removes its data directories, found {leftovers:?}"
    );
}
