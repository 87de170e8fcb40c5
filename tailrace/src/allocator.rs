//! The binary's allocator: mimalloc, built without transparent huge pages, holding freed
//! memory a few milliseconds and giving it back to the system within about a second.
//!
//! `tailrace` allocates and frees on every event (JSON values, batches, op-log images, the
//! commit published to the feeds), on several threads; mimalloc does that faster than glibc's
//! allocator (`bench insert`: docs/BENCHMARKS.md). With its defaults, though, it kept
//! 30–43 MiB of anonymous memory at 70 events/s where glibc kept 15–20: it asks for huge pages
//! on its arenas (`madvise(MADV_HUGEPAGE)`, so touching a few bytes of a region can make
//! 2 MiB of it resident) and holds freed pages for a second before returning them. The
//! crate's `no_thp` feature (Cargo.toml) removes the first; [`tune`] handles the second.
//!
//! Giving freed pages back at once (a purge delay of 0) makes a flat-out stream or a feed
//! catching up pay twice for most pages: a page freed by one thread is decommitted and, a
//! moment later, faulted in again, zeroed, by the next allocation. Held a few milliseconds,
//! it is reused instead.
//! But mimalloc purges what has waited long enough only when some thread allocates or frees
//! through its slow paths, so after a burst the threads that went quiet would keep their
//! freed pages: [`tune`] also starts a thread that asks for those purges once a second (they
//! are program-wide in mimalloc 3). The library (`default-features = false`) leaves the
//! allocator to its user.

#![allow(unsafe_code)]

use std::os::raw::c_int;
use std::time::Duration;

#[cfg(test)]
use libmimalloc_sys::mi_option_get;
use libmimalloc_sys::{mi_collect, mi_free, mi_malloc, mi_option_set};

/// `mi_option_purge_delay` in mimalloc.h: milliseconds before freed pages go back to the OS
/// (1,000 by default). The option enum keeps the slots of retired options, so the number
/// does not move between versions; a test checks it against the documented default.
const PURGE_DELAY: c_int = 15;

/// The purge delay tailrace sets, in milliseconds: long enough that a page freed under load is
/// mostly taken again before it is decommitted, short beside [`COLLECT_EVERY`].
const DELAY_MS: std::os::raw::c_long = 10;

/// How often the collector thread has mimalloc purge what has waited past the delay.
const COLLECT_EVERY: Duration = Duration::from_secs(1);

/// Sets the options and starts the collector; call first thing in `main`. A purge delay the
/// operator chose (`MIMALLOC_PURGE_DELAY`, which mimalloc reads itself) is left as it is
/// (docs/BENCHMARKS.md, "Memory after a burst").
pub fn tune() {
    tune_unless_chosen(std::env::var_os("MIMALLOC_PURGE_DELAY").is_some());
    // Without the collector the process works the same, only keeps more memory after a
    // burst: a thread that cannot be started is not worth failing for.
    let _ = std::thread::Builder::new()
        .name("tailrace-alloc".into())
        .stack_size(64 * 1024)
        .spawn(|| {
            // mimalloc collects through the calling thread's heap, and does nothing through
            // one that never allocated: an allocation sets it up.
            // SAFETY: a block from mimalloc, freed once, unused in between.
            unsafe { mi_free(mi_malloc(8)) };
            loop {
                std::thread::sleep(COLLECT_EVERY);
                collect();
            }
        });
}

fn tune_unless_chosen(operator_chose: bool) {
    if operator_chose {
        return;
    }
    // SAFETY: `mi_option_set` stores a value in mimalloc's option table (an array indexed by
    // the option, bounds-checked by mimalloc itself). The purge delay is read each time freed
    // pages are considered for purging, so setting it at run time takes effect.
    unsafe {
        mi_option_set(PURGE_DELAY, DELAY_MS);
    }
}

/// Purges, in every arena, the freed pages that have waited past the delay (and collects the
/// calling thread's own free pages).
fn collect() {
    // SAFETY: `mi_collect` takes no pointers; mimalloc documents it as callable from any
    // thread at any time ("it may improve resource usage by calling this every once in a
    // while"). `false`: no forced purge of what has not yet waited its delay.
    unsafe { mi_collect(false) }
}

/// The current value of an option.
#[cfg(test)]
fn option(option: c_int) -> std::os::raw::c_long {
    // SAFETY: reads mimalloc's option table, initialising the option from its default or its
    // `MIMALLOC_*` environment variable on first use.
    unsafe { mi_option_get(option) }
}

#[cfg(test)]
mod tests {
    use std::os::raw::c_void;
    use std::time::Instant;

    use super::*;

    /// The process's resident bytes (`/proc/self/statm`, in 4 KiB pages). mimalloc's own
    /// `committed` count is no use here: it does not go down when pages are purged.
    fn resident() -> usize {
        let statm = std::fs::read_to_string("/proc/self/statm").expect("Linux's /proc");
        let pages: usize = statm
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse().ok())
            .expect("statm's second field");
        pages * 4096
    }

    /// One test, as the option table is the process's: before `tune` the option holds the
    /// default mimalloc.h documents for the purge delay (1,000 ms), which no neighbouring option
    /// has, so the constant names the option it means to; an operator's `MIMALLOC_PURGE_DELAY`
    /// keeps what mimalloc read; `tune` sets the delay. Then what a thread frees before going
    /// quiet, held past its free by the delay, goes back to the system within about a
    /// collector period, with nobody else allocating from mimalloc.
    #[test]
    fn tune_sets_the_delay_and_a_quiet_threads_memory_goes_back() {
        let env = "(a MIMALLOC_PURGE_DELAY variable in the environment changes the default)";
        assert_eq!(option(PURGE_DELAY), 1000, "purge_delay default {env}");
        tune_unless_chosen(true);
        assert_eq!(
            option(PURGE_DELAY),
            1000,
            "an operator's choice is left alone"
        );
        tune();
        assert_eq!(option(PURGE_DELAY), DELAY_MS);

        // 64 MiB in blocks of mimalloc's small pages (up to 10 KiB), few enough that freeing
        // them all takes a fraction of the delay even in a debug build.
        const BLOCKS: usize = 8 * 1024;
        const SIZE: usize = 8 * 1024;
        const ROUNDS: usize = 20;
        let delay = Duration::from_millis(u64::try_from(DELAY_MS).expect("a positive delay"));
        let before = resident();
        let (freed_tx, freed_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let quiet = std::thread::spawn(move || {
            // Whether the delay holds pages can only be seen if the frees and the reading
            // after them take less than the delay: a thread preempted longer than that (a
            // loaded machine) rightly finds them purged. So the round is repeated until one
            // is that quick, and the quickest is judged; with no delay, every round finds the
            // pages gone.
            // The quickest round so far: resident bytes at its peak and just after its free,
            // and how long the free and the reading took.
            let mut quickest = (0, 0, Duration::MAX);
            for _ in 0..ROUNDS {
                // SAFETY: each block is written within its size and freed once, by this thread.
                let blocks: Vec<usize> = (0..BLOCKS)
                    .map(|i| unsafe {
                        let p = mi_malloc(SIZE).cast::<u8>();
                        assert!(!p.is_null());
                        p.write_bytes(i as u8, SIZE);
                        p as usize
                    })
                    .collect();
                let peak = resident();
                let started = Instant::now();
                for p in blocks {
                    unsafe { mi_free(p as *mut c_void) };
                }
                let just_freed = resident();
                let took = started.elapsed();
                if took < quickest.2 {
                    quickest = (peak, just_freed, took);
                }
                if took < delay {
                    break;
                }
            }
            // From the last free on, nothing allocates: the purge is timed from here.
            freed_tx.send((quickest, Instant::now())).ok();
            // Quiet, but alive: a thread's exit would hand its memory back by itself.
            done_rx.recv().ok();
        });
        let ((peak, just_freed, took), freed_at) =
            freed_rx.recv().expect("the allocating thread ran");
        let held = peak.saturating_sub(before);
        assert!(
            held >= BLOCKS * SIZE / 2,
            "{held} bytes resident for 64 MiB"
        );
        assert!(
            just_freed > before + held / 2,
            "the delay holds freed pages: {} of {held} bytes resident just after the free, \
             {took:?} after it began (the quickest of {ROUNDS} rounds; the delay is {delay:?})",
            just_freed.saturating_sub(before)
        );
        let mut now = resident();
        while now > before + held / 4 && freed_at.elapsed() < COLLECT_EVERY * 5 {
            std::thread::sleep(Duration::from_millis(50));
            now = resident();
        }
        done_tx.send(()).ok();
        quiet.join().expect("the allocating thread ended");
        assert!(
            now <= before + held / 4,
            "{} of {held} bytes still resident {:?} after the free",
            now.saturating_sub(before),
            freed_at.elapsed()
        );
    }
}
