//! A query's memory bound against what its groups really allocate, counted by the allocator:
//! a `$group` over a long tail of keys is refused before its heap passes the bound (a table
//! that doubles holds its old and new blocks while it copies: the growth is refused before
//! it is made, not counted after), and a `$group` within the bound hands its groups on
//! without making them all into documents at once (which held as much again).
//!
//! Its own test binary: the allocator below counts every allocation of the process.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Map, Value, json};
use store::query::{Limits, Pipeline};

/// The system allocator, counting the bytes live and the most live at once.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(bytes: usize) {
    let live = LIVE.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

// Counting needs an allocator of its own, which only unsafe code can be.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        // SAFETY: the caller's layout, passed on as it is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` was allocated by `System` with `layout` (above).
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Documents with a name each, every one different, of every script: a long tail's keys.
fn named(n: usize) -> impl Iterator<Item = Map<String, Value>> {
    const SCRIPTS: [&str; 4] = ["user_", "ユーザー", "مستخدم", "😀"];
    (0..n).map(|i| {
        let mut d = Map::new();
        d.insert("name".into(), json!(format!("{}{i:x}", SCRIPTS[i % 4])));
        d.insert("followers".into(), json!(i % 1000));
        d
    })
}

/// The most heap held at once while `f` ran, beyond what was held before.
fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let out = f();
    (out, PEAK.load(Ordering::Relaxed).saturating_sub(before))
}

#[test]
fn a_group_bomb_is_refused_within_its_bound() {
    const BOUND: usize = 8 << 20;
    let limits = Limits { max_bytes: BOUND };
    let pipeline = Pipeline::parse(&json!([
        {"$group": {"_id": "$name", "n": {"$sum": 1}, "f": {"$avg": "$followers"}}}
    ]))
    .expect("a pipeline");
    let (answer, peak) = peak_of(|| pipeline.run(named(2_000_000), limits));
    let e = answer.expect_err("two million groups are over 8 MiB");
    assert!(e.to_string().contains("query bound"), "{e}");
    assert!(
        peak <= BOUND,
        "refused only at {peak} bytes held, {:.2}× the bound",
        peak as f64 / BOUND as f64
    );

    // Within the bound: the groups go on to the next stage one at a time.
    let (answer, peak) = peak_of(|| {
        Pipeline::parse(&json!([
            {"$group": {"_id": "$name", "n": {"$sum": 1}}},
            {"$match": {"n": {"$gt": 1}}},
            {"$count": "n"}
        ]))
        .expect("a pipeline")
        .run(named(20_000), limits)
    });
    let answer = answer.expect("20,000 groups are within 8 MiB");
    assert!(
        answer.docs.is_empty(),
        "no name is met twice: {:?}",
        answer.docs
    );
    assert!(
        peak <= BOUND,
        "answered holding {peak} bytes, {:.2}× the bound",
        peak as f64 / BOUND as f64
    );
}
