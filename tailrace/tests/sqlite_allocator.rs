//! SQLite allocates with mimalloc once `allocator::route_sqlite` has run (the binary calls it
//! before opening the store). A test binary of its own: SQLite takes an allocator only before
//! anything in the process has used it, and other tests open databases.
#![allow(unsafe_code, clippy::unwrap_used)]

use rusqlite::ffi;
use tailrace::allocator::route_sqlite;

#[test]
fn sqlite_allocates_with_mimalloc_once_routed_and_a_late_change_is_refused() {
    route_sqlite().expect("nothing in this process has used SQLite yet");

    // A block from SQLite's allocator is mimalloc's, and SQLite sees at least its size.
    // SAFETY: a block from `sqlite3_malloc`, measured and freed once.
    unsafe {
        let block = ffi::sqlite3_malloc(1000);
        assert!(!block.is_null());
        assert!(
            libmimalloc_sys::mi_is_in_heap_region(block),
            "SQLite's block is not in mimalloc's heap"
        );
        assert!(ffi::sqlite3_msize(block) >= 1000);
        let grown = ffi::sqlite3_realloc(block, 100_000);
        assert!(libmimalloc_sys::mi_is_in_heap_region(grown));
        assert!(ffi::sqlite3_msize(grown) >= 100_000);
        ffi::sqlite3_free(grown);
    }

    // A database works on it: its page cache is counted while it is open, and given back.
    // SAFETY: reads SQLite's own counter.
    let used = || unsafe { ffi::sqlite3_memory_used() };
    let before = used();
    let conn = rusqlite::Connection::open_in_memory().unwrap();
    conn.execute_batch("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT); CREATE INDEX tv ON t (v);")
        .unwrap();
    let tx = conn.unchecked_transaction().unwrap();
    for k in 0..20_000i64 {
        tx.execute(
            "INSERT INTO t VALUES (?1, ?2)",
            rusqlite::params![
                k,
                format!(
                    "value-{}-🦀-{}",
                    k * 7919 % 20_000,
                    "x".repeat((k % 50) as usize)
                )
            ],
        )
        .unwrap();
    }
    tx.commit().unwrap();
    let (rows, distinct): (i64, i64) = conn
        .query_row("SELECT count(*), count(DISTINCT v) FROM t", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    assert_eq!((rows, distinct), (20_000, 20_000));
    let open = used();
    assert!(
        open > before + 1_000_000,
        "20,000 rows in memory should hold over 1 MB: {before} -> {open}"
    );
    drop(conn);
    assert!(
        used() < before + 100_000,
        "closed, SQLite still counts {} bytes",
        used() - before
    );

    // Too late now: SQLite is running, and keeps its allocator.
    assert_eq!(route_sqlite(), Err(ffi::SQLITE_MISUSE));
}
