//! The environment variables that override config keys: their prefix, how a key's path
//! becomes a variable's name, and the `TAILRACE_*` variables that are not config keys.

/// Prefix of the environment variables that override config keys.
pub const ENV_PREFIX: &str = "TAILRACE_";
/// Separator between levels in environment variable names (`TAILRACE_STORE__ENGINE`).
pub const ENV_SEPARATOR: &str = "__";
/// Variables with [`ENV_PREFIX`] that are not config keys, written without the prefix: the
/// CLI's own (`TAILRACE_CONFIG`, `TAILRACE_LOG`, `TAILRACE_LOG_FORMAT`) and the test tools'
/// (`TAILRACE_TEST_MONGODB_URI`, and `TAILRACE_FERRETDB_BIN`/`_HOME` of
/// `scripts/ferretdb.sh`), so a shell that exported those can still run tailrace.
pub const ENV_IGNORED: [&str; 6] = [
    "config",
    "log",
    "log_format",
    "test_mongodb_uri",
    "ferretdb_bin",
    "ferretdb_home",
];

/// Name given to the environment provider's metadata, to recognise it in errors.
pub(super) const ENV_METADATA_NAME: &str = "environment variable";

/// The environment variable that sets the key at `path` (`TAILRACE_STORE__ENGINE`). An
/// array comes whole from one variable, so the name stops before the first index.
pub(super) fn env_var_name<S: AsRef<str>>(path: &[S]) -> String {
    let keys: Vec<String> = path
        .iter()
        .map(AsRef::as_ref)
        .take_while(|k| !is_index(k))
        .map(str::to_ascii_uppercase)
        .collect();
    format!("{ENV_PREFIX}{}", keys.join(ENV_SEPARATOR))
}

/// Whether a path segment is an array index.
pub(super) fn is_index(segment: &str) -> bool {
    !segment.is_empty() && segment.bytes().all(|b| b.is_ascii_digit())
}
