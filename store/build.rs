//! Tells the MongoDB contract tests whether a server is configured: with
//! `TAILRACE_TEST_MONGODB_URI` unset they are compiled as `#[ignore]`d (with the reason), so
//! `cargo test` reports them as ignored instead of passing them without running anything.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(tailrace_mongodb_uri)");
    println!("cargo::rerun-if-env-changed=TAILRACE_TEST_MONGODB_URI");
    if std::env::var_os("TAILRACE_TEST_MONGODB_URI").is_some_and(|v| !v.is_empty()) {
        println!("cargo::rustc-cfg=tailrace_mongodb_uri");
    }
}
