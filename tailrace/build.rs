//! Links the release binary with the functions a running pipeline executes first, in the
//! order of `symbol-order.txt` (written by `scripts/symbol_order.py`): that code then sits
//! together instead of spread over the whole text, and the process keeps less of the binary
//! resident.
//!
//! Why: a process keeps resident every page of the binary's code it has touched, and the kernel
//! maps that code in blocks around each page touched (fault-around, whole large folios of the
//! page cache). Linked in the compiler's order, the functions a pipeline runs are spread over all
//! of the text, and most of the text stays resident for the process's whole life. The script
//! lists every function that executed while the pipeline ran under callgrind, hottest first; its
//! own docs say how it samples. The figures are in docs/BENCHMARKS.md ("The release build").
//!
//! Only where the linker is known to be LLD, which reads the order file: Rust's own
//! `rust-lld`, the default for `x86_64-unknown-linux-gnu` since Rust 1.90, when no other
//! linker is configured. Elsewhere the binary links as before.
//! `TAILRACE_SYMBOL_ORDER=0` turns it off.
//!
//! The list names functions by their mangled names, whose hashes change with the compiler and
//! with the crates' dependencies, and theirs in turn: a dependency added to `store` renames the
//! functions of `store` and of every crate built on it. A function renamed since the list was
//! taken is placed where the linker would have put it anyway, which costs resident memory, never
//! correctness. `symbol-order.stamp` says which `Cargo.lock` and `rustc` the list was taken
//! with, and a release build with others warns that it is stale: run the script again then,
//! after large changes, and after a new Rust (it needs valgrind; the build does not).
//! `scripts/text_resident.py PID` says how much of a running process's text is resident inside
//! the ordered functions and outside them: most of it outside means the list is stale.
//!
//! The rest of the release profile is in the workspace's `Cargo.toml`: one codegen unit with fat
//! link-time optimisation, so serde_json, the store, the feeds and the allocator are inlined
//! into each other where every event passes. It makes the release build slower, a cost paid by
//! `cargo build --release` and the Docker image, not by CI, which tests debug builds.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=TAILRACE_SYMBOL_ORDER");
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    let order = manifest.join("symbol-order.txt");
    // Watched by its absolute path, the one the link argument below names: a checkout moved
    // or renamed (its target directory with it) no longer has the file there, so the script
    // runs again and names the new place, where a relative path would leave the old one in
    // the link arguments and the link would fail.
    println!("cargo:rerun-if-changed={}", order.display());
    let stamp = order.with_extension("stamp");
    let lock = manifest.parent().unwrap_or(&manifest).join("Cargo.lock");
    // Only files that exist: cargo runs a script again on every build while one it watches
    // is missing.
    for watched in [&stamp, &lock] {
        if watched.is_file() {
            println!("cargo:rerun-if-changed={}", watched.display());
        }
    }
    if env::var("PROFILE").as_deref() != Ok("release")
        || env::var("TAILRACE_SYMBOL_ORDER").as_deref() == Ok("0")
        || !order.is_file()
    {
        return;
    }
    let Some(release) = rustc_release().filter(|r| links_with_rust_lld(r)) else {
        return;
    };
    if let Some(why) = stale(&stamp, &lock, &release) {
        println!(
            "cargo:warning=tailrace/symbol-order.txt may be stale ({why}): the release binary \
             then keeps more of its code resident; run scripts/symbol_order.py again \
             (tailrace/build.rs)"
        );
    }
    println!(
        "cargo:rustc-link-arg-bins=-Wl,--symbol-ordering-file={}",
        order.display()
    );
    // Functions renamed since the list was written are simply placed where they would be.
    println!("cargo:rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
}

/// Why the order list was taken for another build, if it was: the stamp's `rustc` release
/// and `Cargo.lock` hash against this build's. No stamp, no lock file (a copy of the crate
/// alone): nothing to compare, no warning.
fn stale(stamp: &Path, lock: &Path, release: &str) -> Option<String> {
    let stamp = std::fs::read_to_string(stamp).ok()?;
    let lock = std::fs::read(lock).ok()?;
    let field = |name: &str| {
        stamp
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
            .unwrap_or_default()
            .to_owned()
    };
    let (taken_rustc, taken_lock) = (field("rustc "), field("Cargo.lock fnv1a64 "));
    if taken_rustc != release {
        return Some(format!(
            "taken with rustc {taken_rustc}, built with {release}"
        ));
    }
    if taken_lock != format!("{:016x}", fnv1a64(&lock)) {
        return Some("taken with another Cargo.lock".into());
    }
    None
}

/// FNV-1a, 64 bits: a hash `scripts/symbol_order.py` computes the same way without a library.
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The compiler's release ("1.95.0"), from `rustc -vV`.
fn rustc_release() -> Option<String> {
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let out = Command::new(rustc).arg("-vV").output().ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("release: "))
        .map(str::to_owned)
}

/// The target links with `rust-lld` by default (from Rust 1.90, `release`) and nothing asks
/// for another linker.
fn links_with_rust_lld(release: &str) -> bool {
    if env::var("TARGET").as_deref() != Ok("x86_64-unknown-linux-gnu") {
        return false;
    }
    let flags = env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    if flags.contains("linker") || flags.contains("link-self-contained") {
        return false;
    }
    if env::var_os("CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER").is_some() {
        return false;
    }
    let mut parts = release
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (1, 90)
}
