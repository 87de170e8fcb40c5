//! The file of the earlier (SQLite) layout.

/// The database file of the earlier layout (SQLite, before the journal): a data directory
/// holding it is converted at its first open ([`super::migrate`]).
pub const DB_FILE: &str = "tailrace.db";
