//! Links the release binary with the functions a running pipeline executes first, in the
//! order of `symbol-order.txt` (written by `scripts/symbol_order.py`): that code then sits
//! together instead of spread over the whole text, and the process keeps less of the binary
//! resident (docs/ARCHITECTURE.md, "The release build").
//!
//! Only where the linker is known to be LLD, which reads the order file: Rust's own
//! `rust-lld`, the default for `x86_64-unknown-linux-gnu` since Rust 1.90, when no other
//! linker is configured. Elsewhere the binary links as before.
//! `TAILRACE_SYMBOL_ORDER=0` turns it off.

use std::env;
use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=TAILRACE_SYMBOL_ORDER");
    let order =
        Path::new(&env::var("CARGO_MANIFEST_DIR").unwrap_or_default()).join("symbol-order.txt");
    // Watched by its absolute path, the one the link argument below names: a checkout moved
    // or renamed (its target directory with it) no longer has the file there, so the script
    // runs again and names the new place, where a relative path would leave the old one in
    // the link arguments and the link would fail.
    println!("cargo:rerun-if-changed={}", order.display());
    if env::var("PROFILE").as_deref() != Ok("release")
        || env::var("TAILRACE_SYMBOL_ORDER").as_deref() == Ok("0")
        || !order.is_file()
        || !links_with_rust_lld()
    {
        return;
    }
    println!(
        "cargo:rustc-link-arg-bins=-Wl,--symbol-ordering-file={}",
        order.display()
    );
    // Functions renamed since the list was written are simply placed where they would be.
    println!("cargo:rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
}

/// The target links with `rust-lld` by default and nothing asks for another linker.
fn links_with_rust_lld() -> bool {
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
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let Ok(out) = Command::new(rustc).arg("-vV").output() else {
        return false;
    };
    // "release: 1.95.0"
    let version = String::from_utf8_lossy(&out.stdout);
    let Some(release) = version.lines().find_map(|l| l.strip_prefix("release: ")) else {
        return false;
    };
    let mut parts = release
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (1, 90)
}
