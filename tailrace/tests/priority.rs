//! The running binary's threads: the async runtime's a few nice steps below the store's
//! (`tailrace::priority`), and the store's at the process's own priority, which they would
//! lose for good if a lowered thread started them.

#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used)]

mod common;

use common::Tailrace;
use tailrace::priority::WORKER_NICE_STEP;

/// Each thread of `pid`: its name and nice value (`/proc/<pid>/task/<tid>/stat`, field 19,
/// counted after the name's closing parenthesis, since a name may hold spaces).
fn threads(pid: u32) -> Vec<(String, i32)> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let dir = task.unwrap().path();
        let (Ok(comm), Ok(stat)) = (
            std::fs::read_to_string(dir.join("comm")),
            std::fs::read_to_string(dir.join("stat")),
        ) else {
            continue; // the thread ended meanwhile
        };
        let after_name = &stat[stat.rfind(')').unwrap() + 1..];
        let nice: i32 = after_name
            .split_whitespace()
            .nth(16)
            .unwrap()
            .parse()
            .unwrap();
        out.push((comm.trim().to_owned(), nice));
    }
    out
}

#[tokio::test]
async fn async_workers_run_below_the_store_threads() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = Tailrace::start(dir.path(), &[]).await;
    let all = threads(t.pid());
    t.stop().await;
    let shown = format!("{all:?}");
    // The main thread's id is the process id: its value is the process's.
    let base = all
        .iter()
        .find(|(name, _)| name == "tailrace")
        .map(|(_, nice)| *nice)
        .unwrap_or_else(|| panic!("no main thread named tailrace among {shown}"));
    let lowered = (base + WORKER_NICE_STEP).min(19);
    let store: Vec<_> = all
        .iter()
        .filter(|(name, _)| name == "tailrace-writer" || name == "tailrace-maint")
        .collect();
    let workers: Vec<_> = all
        .iter()
        .filter(|(name, _)| name.starts_with("tokio"))
        .collect();
    assert_eq!(
        store.len(),
        2,
        "the writer and maint threads, among {shown}"
    );
    assert!(!workers.is_empty(), "no runtime thread among {shown}");
    for (name, nice) in store {
        assert_eq!(
            *nice, base,
            "{name} runs at the process's priority ({shown})"
        );
    }
    for (name, nice) in workers {
        assert_eq!(
            *nice, lowered,
            "{name} runs {WORKER_NICE_STEP} steps below ({shown})"
        );
    }
}
