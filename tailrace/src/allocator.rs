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
//!
//! SQLite does not allocate through Rust's allocator: it calls the C library's `malloc`
//! unless it is told otherwise before it starts. [`route_sqlite`] tells it to use mimalloc
//! too, because glibc keeps what SQLite frees: its page caches and statements grow during a
//! burst, shrink after it, and the pages stayed resident (docs/BENCHMARKS.md, "Memory after a
//! burst").

#![allow(unsafe_code)]

use std::os::raw::{c_int, c_void};

use libmimalloc_sys::{mi_free, mi_good_size, mi_malloc, mi_realloc, mi_usable_size};
use libsqlite3_sys as sqlite;

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

/// Makes SQLite allocate with mimalloc. Call it before anything opens a database: SQLite
/// takes an allocator only before it initialises itself, and otherwise answers
/// `SQLITE_MISUSE`, the code returned as the error (SQLite then keeps `malloc`, which works,
/// only without the memory given back).
pub fn route_sqlite() -> Result<(), c_int> {
    let methods = sqlite::sqlite3_mem_methods {
        xMalloc: Some(sqlite_malloc),
        xFree: Some(sqlite_free),
        xRealloc: Some(sqlite_realloc),
        xSize: Some(sqlite_size),
        xRoundup: Some(sqlite_roundup),
        xInit: Some(sqlite_init),
        xShutdown: Some(sqlite_shutdown),
        pAppData: std::ptr::null_mut(),
    };
    // SAFETY: `SQLITE_CONFIG_MALLOC` takes one pointer to a `sqlite3_mem_methods`, which
    // SQLite copies before returning (sqlite3.h), so a local is enough. Before SQLite is
    // initialised nothing else is using it; after, it refuses the change (`SQLITE_MISUSE`)
    // and changes nothing. The functions below keep SQLite's contract: 8-byte aligned
    // blocks (mimalloc aligns to at least 8), a size at least the one asked for.
    let rc = unsafe { sqlite::sqlite3_config(sqlite::SQLITE_CONFIG_MALLOC, &raw const methods) };
    if rc == sqlite::SQLITE_OK {
        Ok(())
    } else {
        Err(rc)
    }
}

// SQLite asks for sizes above 0 only; a size is a positive `int`.
unsafe extern "C" fn sqlite_malloc(size: c_int) -> *mut c_void {
    // SAFETY: plain allocation; a null return is SQLite's out-of-memory.
    unsafe { mi_malloc(size.max(0) as usize) }
}

unsafe extern "C" fn sqlite_free(block: *mut c_void) {
    // SAFETY: SQLite frees only blocks it had from `sqlite_malloc` or `sqlite_realloc`.
    unsafe { mi_free(block) }
}

unsafe extern "C" fn sqlite_realloc(block: *mut c_void, size: c_int) -> *mut c_void {
    // SAFETY: as for `sqlite_free`; on failure the old block stays valid, as SQLite expects.
    unsafe { mi_realloc(block, size.max(0) as usize) }
}

/// The usable size of a block: SQLite counts it in `sqlite3_memory_used` on allocation and
/// takes the same figure back on free, so it must not change in between (it does not).
unsafe extern "C" fn sqlite_size(block: *mut c_void) -> c_int {
    // SAFETY: `block` is one of ours (as above).
    let size = unsafe { mi_usable_size(block) };
    c_int::try_from(size).unwrap_or(c_int::MAX)
}

/// What a request of `size` bytes really gets, so SQLite can use the slack.
unsafe extern "C" fn sqlite_roundup(size: c_int) -> c_int {
    // SAFETY: a pure function of its argument.
    let good = unsafe { mi_good_size(size.max(0) as usize) };
    c_int::try_from(good).unwrap_or(c_int::MAX)
}

unsafe extern "C" fn sqlite_init(_: *mut c_void) -> c_int {
    sqlite::SQLITE_OK
}

unsafe extern "C" fn sqlite_shutdown(_: *mut c_void) {}

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
