//! The binary's allocator: mimalloc, built without transparent huge pages and told to give
//! freed memory back at once.
//!
//! `tailrace` allocates and frees on every event (JSON values, batches, op-log images, the
//! commit published to the feeds), on several threads; mimalloc does that faster than glibc's
//! allocator (`bench insert`: docs/BENCHMARKS.md). With its defaults, though, it kept
//! 30–43 MiB of anonymous memory at 70 events/s where glibc kept 15–20: it asks for huge pages
//! on its arenas (`madvise(MADV_HUGEPAGE)`, so touching a few bytes of a region can make
//! 2 MiB of it resident) and holds freed pages for a second before returning them. The
//! crate's `no_thp` feature (Cargo.toml) removes the first; [`tune`] sets the second. The
//! library (`default-features = false`) leaves the allocator to its user.

#![allow(unsafe_code)]

use std::os::raw::c_int;

#[cfg(test)]
use libmimalloc_sys::mi_option_get;
use libmimalloc_sys::mi_option_set;

/// `mi_option_purge_delay` in mimalloc.h: milliseconds before freed pages go back to the OS
/// (1,000 by default). The option enum keeps the slots of retired options, so the number
/// does not move between versions; a test checks it against the documented default.
const PURGE_DELAY: c_int = 15;

/// Sets the options; call first thing in `main`. A purge delay the operator chose
/// (`MIMALLOC_PURGE_DELAY`, which mimalloc reads itself) is left as it is: holding freed
/// pages for a while costs memory after a burst and saves the page faults of taking them
/// back (docs/BENCHMARKS.md, "Memory after a burst").
pub fn tune() {
    tune_unless_chosen(std::env::var_os("MIMALLOC_PURGE_DELAY").is_some());
}

fn tune_unless_chosen(operator_chose: bool) {
    if operator_chose {
        return;
    }
    // SAFETY: `mi_option_set` stores a value in mimalloc's option table (an array indexed by
    // the option, bounds-checked by mimalloc itself). The purge delay is read each time freed
    // pages are considered for purging, so setting it at run time takes effect.
    unsafe {
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

    /// The constant names the option it means to: before `tune` it holds the default
    /// mimalloc.h documents for the purge delay (1,000 ms), which no neighbouring option has;
    /// an operator's `MIMALLOC_PURGE_DELAY` keeps what mimalloc read; otherwise `tune` sets it
    /// to 0.
    #[test]
    fn the_option_number_is_mimallocs_and_tune_sets_it() {
        let env = "(a MIMALLOC_PURGE_DELAY variable in the environment changes the default)";
        assert_eq!(option(PURGE_DELAY), 1000, "purge_delay default {env}");
        tune_unless_chosen(true);
        assert_eq!(
            option(PURGE_DELAY),
            1000,
            "an operator's choice is left alone"
        );
        tune();
        assert_eq!(option(PURGE_DELAY), 0);
    }
}
