//! The async runtime's threads run a few nice steps below the store's own.
//!
//! A running `tailrace` has the async runtime's threads (one worker per core, and blocking
//! threads as needed), the embedded engine's writer (`tailrace-writer`: every commit goes
//! through it), its maintenance thread (`tailrace-maint`: memtable flushes and compactions) and
//! the thread that builds its filter of stored keys (`tailrace-keys`), and the allocator's
//! collector (`tailrace-alloc`). The runtime's workers feed the writer: they read the sources,
//! parse, validate and stamp events and derive their rollups, and they also run the feeds and
//! serve HTTP. Flat out on a machine with fewer cores than runnable threads, the scheduler
//! shares each core evenly, so the writer waited for a core behind workers preparing batches it
//! could not take yet, and everything downstream then waited for the writer. Niced, the workers
//! give way to the writer and `maint` when they compete for a core; when a core is free (a slow
//! stream, a quiet machine) nothing changes, and a notification is not held back.
//!
//! The cost: tailrace may share a CPU group (a cgroup, or a session's autogroup) with other busy
//! processes, and its workers then get a third of their weight. Between groups the CPU is shared
//! by group, whatever the nice values. What the step gained, and the alternatives measured
//! against it (other steps, one worker, `SCHED_BATCH`, a raised writer):
//! docs/results/writer-priority-2026-12-05.md.
//!
//! Linux only: there a thread's nice value is its own, so this lowers only the thread that
//! asks. Elsewhere the same call would lower the whole process, store threads included, and
//! gain nothing.

/// How many nice steps the runtime's threads run below the process: a weight of about a third
/// of the store's threads' when both want the same core (1024 against 335 in the kernel's table).
pub const WORKER_NICE_STEP: i32 = 5;

/// Sets the calling thread's nice value [`WORKER_NICE_STEP`] above the process's (its main
/// thread's), never past 19, the lowest. For the runtime's `on_thread_start`: called on each
/// worker and blocking thread as it starts. Counted from the main thread, not from the caller:
/// a blocking thread started by a worker inherits the worker's value, and would otherwise be
/// lowered twice. A refusal (a sandbox that forbids `setpriority`) leaves the thread as it
/// was: the pipeline is then as fast as before, not broken.
///
/// The store's threads must not be started from a lowered thread: they would inherit its value,
/// and an unprivileged thread cannot raise its priority again. `tailrace` opens its stores
/// from the main thread (the runtime's `block_on`), which starts a thread of its own for the
/// embedded engine's recovery (`EmbeddedStore::open_async`); `tests/priority.rs` checks the
/// result.
pub fn lower_this_thread() {
    #[cfg(target_os = "linux")]
    {
        use rustix::process::{getpid, getpriority_process, setpriority_process};
        let Ok(base) = getpriority_process(Some(getpid())) else {
            return;
        };
        let lowered = (base + WORKER_NICE_STEP).min(19);
        if let Err(e) = setpriority_process(None, lowered) {
            tracing::debug!(error = %e, "could not lower an async worker's priority");
        }
    }
}
