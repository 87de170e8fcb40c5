//! The binary's allocator: mimalloc, told to give freed memory back at once.
//!
//! `tailrace` allocates and frees on every event (JSON values, batches, op-log images, the
//! commit published to the feeds), on several threads. Against glibc's allocator, mimalloc
//! raised `bench insert` by 10–35 % (realistic 17.8–19.1k → 20.9–24.1k events/s, small-vocabulary
//! content 41–46k → 46–54k, alternating runs; docs/BENCHMARKS.md). With its defaults, though,
//! it kept 32–44 MiB of anonymous memory at 70 events/s where glibc kept 15–20: it commits
//! whole arenas eagerly where the OS overcommits, and holds freed pages for a second before
//! returning them. With the two options below it kept 12–15 MiB in the same run, at the same
//! CPU. The library (`default-features = false`) leaves the allocator to its user.

#![allow(unsafe_code)]

use std::os::raw::c_int;

#[cfg(test)]
use libmimalloc_sys::mi_option_get;
use libmimalloc_sys::mi_option_set;

/// `mi_option_arena_eager_commit` in mimalloc.h. The option enum keeps the slots of retired
/// options, so the numbers do not move between versions; a test checks both against their
/// documented defaults.
const ARENA_EAGER_COMMIT: c_int = 4;
/// `mi_option_purge_delay` in mimalloc.h (milliseconds before freed pages go back to the OS).
const PURGE_DELAY: c_int = 15;

/// Sets the options; call first thing in `main`, before the runtime starts its threads.
pub fn tune() {
    // SAFETY: `mi_option_set` stores a value in mimalloc's option table (an array indexed by
    // the option, bounds-checked by mimalloc itself); both options are read when memory is
    // next obtained or freed, and changing them at run time is supported.
    unsafe {
        mi_option_set(ARENA_EAGER_COMMIT, 0);
        mi_option_set(PURGE_DELAY, 0);
    }
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
    use super::*;

    /// The constants name the options they mean to: before `tune`, each holds the default
    /// mimalloc.h documents for it (2: eager only where the OS overcommits; 1,000 ms), which
    /// no neighbouring option has. Then `tune` sets both to 0.
    #[test]
    fn the_option_numbers_are_mimallocs_and_tune_sets_them() {
        let env = "(a MIMALLOC_* variable in the environment changes the defaults)";
        assert_eq!(option(ARENA_EAGER_COMMIT), 2, "arena_eager_commit default {env}");
        assert_eq!(option(PURGE_DELAY), 1000, "purge_delay default {env}");
        tune();
        assert_eq!(option(ARENA_EAGER_COMMIT), 0);
        assert_eq!(option(PURGE_DELAY), 0);
    }
}
