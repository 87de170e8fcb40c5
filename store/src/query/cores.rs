//! The cores a query's threads run on: by default all but one, so that the pipeline (the
//! writer, the feeds, the ingester) always has a core no query is using.
//!
//! Why not priorities alone: query threads run at nice 19, and yet on a 2-core machine with
//! both cores busy answering questions, about one event in a hundred reached its feed a
//! millisecond or more late (notification p99 1.3–6 ms against 0.1 ms without questions,
//! `tailrace bench query`). `SCHED_IDLE` for the query threads and a short scheduler slice for
//! the pipeline's threads changed that within the runs' spread: a woken thread still waited
//! for a busy core. With the query threads on one core of the two, the same p99 was 1.3–1.4×
//! its value without questions, and the questions over the whole window took about 1.3×
//! longer (docs/results/query-2026-12-06.md). A query is an analyst's, a notification the
//! stream's; `http.query_cores` gives queries every core where the trade should go the other
//! way.
//!
//! Linux only (a thread's CPU set is its own there); elsewhere queries run where the system
//! puts them.

use std::sync::OnceLock;

/// The query threads' CPU set: `None` when they may run on every CPU the process may.
#[cfg(target_os = "linux")]
static CPUS: OnceLock<Option<rustix::thread::CpuSet>> = OnceLock::new();
#[cfg(not(target_os = "linux"))]
static CPUS: OnceLock<Option<()>> = OnceLock::new();

/// Lets queries use `cores` of the CPUs this process may run on, leaving the rest to the
/// pipeline; 0 means all but one (all of them on a machine of one CPU), as does never calling
/// it. Takes effect for the process's life at the first call, or at the first query: call it
/// at start, from a thread that may run on every CPU the process may (the main thread).
pub fn use_cores(cores: usize) {
    CPUS.get_or_init(|| choose(cores));
}

/// The query cores as chosen: by [`use_cores`], else all but one at the first use.
#[cfg(target_os = "linux")]
fn chosen() -> Option<&'static rustix::thread::CpuSet> {
    CPUS.get_or_init(|| choose(0)).as_ref()
}

/// How many cores queries may use.
pub fn cores() -> usize {
    #[cfg(target_os = "linux")]
    if let Some(set) = chosen() {
        return set.count() as usize;
    }
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Threads a query reads on: one per core it may use, at most four.
pub fn threads() -> usize {
    cores().clamp(1, 4)
}

/// Makes the calling thread a query's: the lowest priority there is (nice 19), on the cores
/// queries may use. Refused (a sandbox), the thread runs as it was.
pub fn as_query_thread() {
    #[cfg(target_os = "linux")]
    {
        if let Err(e) = rustix::process::setpriority_process(None, 19) {
            tracing::debug!(error = %e, "could not lower a query thread's priority");
        }
        if let Some(set) = chosen()
            && let Err(e) = rustix::thread::sched_setaffinity(None, set)
        {
            tracing::debug!(error = %e, "could not keep a query thread to its cores");
        }
    }
}

/// The highest-numbered `cores` of the calling thread's CPUs, or `None` when that is all of
/// them. Which ones matters little: the pipeline's threads are not pinned, and the scheduler
/// puts them where queries are not.
#[cfg(target_os = "linux")]
fn choose(cores: usize) -> Option<rustix::thread::CpuSet> {
    use rustix::thread::CpuSet;
    let allowed = rustix::thread::sched_getaffinity(None).ok()?;
    let cpus: Vec<usize> = (0..CpuSet::MAX_CPU)
        .filter(|c| allowed.is_set(*c))
        .collect();
    let n = match cores {
        0 => cpus.len().saturating_sub(1).max(1),
        n => n.min(cpus.len()),
    };
    if n >= cpus.len() {
        return None;
    }
    let mut set = CpuSet::new();
    for c in &cpus[cpus.len() - n..] {
        set.set(*c);
    }
    tracing::debug!(cores = n, of = cpus.len(), "queries run on their own cores");
    Some(set)
}

#[cfg(not(target_os = "linux"))]
fn choose(_cores: usize) -> Option<()> {
    None
}
