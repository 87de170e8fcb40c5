//! Names the engines accept, and the file of the earlier (SQLite) layout.

use crate::{Result, StoreError};

/// The database file of the earlier layout (SQLite, before the journal): a data directory
/// holding it is converted at its first open ([`super::migrate`]).
pub const DB_FILE: &str = "tailrace.db";

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
