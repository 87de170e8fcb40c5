//! The names both engines accept: collection names, indexed field paths and the keys of
//! keyed collections. Shared rules live here, at the store's root, so that no engine imports
//! another for them.

use crate::{Result, StoreError};

/// The longest key a keyed collection takes, in bytes of UTF-8.
///
/// The embedded engine keeps keyed documents in an LSM tree that asserts (a panic, not an
/// error) on a key over 65,535 bytes, and builds several tree keys from one document key
/// (the document, its write-time index entry). A key built from event data (a rollup's
/// `hashtags:<value>`, lowercased, where `İ` grows by half) must never reach it unbounded: the
/// store refuses longer keys with an error, and the ingester shortens the rollup keys it
/// builds ([`bounded_key`]). MongoDB takes longer `_id`s; the bound is the contract's, so both
/// engines answer the same.
pub const MAX_KEY_BYTES: usize = 4096;

/// Checks a collection name: lower-case letters, digits and `_`, so it is safe in file and
/// key names.
pub fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(StoreError::Invalid(format!(
            "collection name {name:?}: use 1-64 characters from a-z, 0-9 and _"
        )))
    }
}

/// Checks a field path used in an index: letters, digits, `_` and `.` only.
pub fn check_field(field: &str) -> Result<()> {
    let ok = !field.is_empty()
        && !field.starts_with('.')
        && !field.ends_with('.')
        && field
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.');
    if ok {
        Ok(())
    } else {
        Err(StoreError::Invalid(format!(
            "field {field:?}: use a dotted path of letters, digits and _"
        )))
    }
}

/// Checks the key of a keyed collection's document (or a feed's checkpoint): at most
/// [`MAX_KEY_BYTES`] bytes.
pub fn check_key(collection: &str, key: &str) -> Result<()> {
    if key.len() <= MAX_KEY_BYTES {
        return Ok(());
    }
    let mut start = 40.min(key.len());
    while !key.is_char_boundary(start) {
        start -= 1;
    }
    Err(StoreError::Invalid(format!(
        "{collection}: a key of {} bytes ({:?}…); keys hold at most {MAX_KEY_BYTES} bytes",
        key.len(),
        &key[..start]
    )))
}

/// The bytes of the hash suffix [`bounded_key`] appends: `~` and 16 hex digits.
const HASH_SUFFIX: usize = 17;

/// Makes `key` at most `max` bytes (at least 64): unchanged when it fits; else its first bytes
/// (cut at a character boundary), `~` and 16 hex digits of a hash of the whole key, so that
/// two long keys that share their start stay two keys. The hash is xxh3-64, stable across
/// versions and processes: a counter's key is the same after a restart.
pub fn bounded_key(mut key: String, max: usize) -> String {
    use std::fmt::Write as _;
    let max = max.max(64);
    if key.len() <= max {
        return key;
    }
    let hash = xxhash_rust::xxh3::xxh3_64(key.as_bytes());
    let mut cut = max - HASH_SUFFIX;
    while !key.is_char_boundary(cut) {
        cut -= 1;
    }
    key.truncate(cut);
    let _ = write!(key, "~{hash:016x}");
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_key_is_refused_and_a_bounded_one_fits() {
        let long = format!("hashtags:{}", "i̇".repeat(22_000));
        assert!(long.len() > 65_535, "the key that panicked the tree");
        let e = check_key("rollups", &long).expect_err("refused");
        assert!(
            e.to_string().contains("keys hold at most 4096 bytes"),
            "{e}"
        );
        assert!(check_key("rollups", &"x".repeat(MAX_KEY_BYTES)).is_ok());

        let b = bounded_key(long.clone(), 512);
        assert!(b.len() <= 512, "{} bytes", b.len());
        assert!(b.starts_with("hashtags:i̇"));
        assert!(check_key("rollups", &b).is_ok());
        // Stable, and distinct for keys that share their first 512 bytes.
        assert_eq!(b, bounded_key(long.clone(), 512));
        let other = format!("{long}x");
        assert_ne!(b, bounded_key(other, 512));
        // A key that fits is kept as it is.
        assert_eq!(bounded_key("lang:ja".into(), 512), "lang:ja");
        // Cut at a character boundary whatever the script.
        for unit in ["東", "🦀", "a", "ß", "ʻ"] {
            for max in 64..80 {
                let k = bounded_key(unit.repeat(100), max);
                assert!(k.len() <= max, "{unit} {max}: {}", k.len());
            }
        }
    }
}
