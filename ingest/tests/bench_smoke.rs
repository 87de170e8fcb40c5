//! `tailrace bench all --quick`, in-process: every scenario runs at a tiny size on the
//! embedded engine and its JSON and plots are checked for form (not for speed: the numbers of
//! a debug build on a shared machine mean nothing).

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use ingest::bench::{self, BenchArgs, Scenario};
use ingest::config::Config;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scenario_writes_well_formed_results() {
    let out = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let mut args = BenchArgs::new(Scenario::All, out.path());
    args.quick = true;
    args.data = Some(data.path().to_path_buf());
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
    let leftovers: Vec<_> = std::fs::read_dir(data.path()).unwrap().collect();
    assert!(
        leftovers.is_empty(),
        "the bench removes its data directories, found {leftovers:?}"
    );
}
