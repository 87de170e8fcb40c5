//! Table layout of the embedded engine, and connection setup.
//!
//! One SQLite database file in WAL mode holds everything:
//! - `capped_<name>`: one table per capped collection; `pos` is an AUTOINCREMENT rowid, so
//!   positions strictly increase and are never reused, even after eviction.
//! - `kv`: the changefeed-backed collections' documents, keyed by (collection, key), with the
//!   time of each key's last write (`ts`, indexed) so idle keys can be expired.
//! - `oplog`: every change of `kv`, with before/after images; `seq` is the resume token.
//! - `checkpoints`: each feed's position and state, written in one statement (atomic).
//! - `collections`: what exists, with the capped limits it was created with.

use std::path::Path;

use rusqlite::Connection;
use rusqlite::types::ToSqlOutput;

use crate::{Result, StoreError};

/// The database file name inside the data directory.
pub const DB_FILE: &str = "tailrace.db";

pub(crate) const CREATE: &str = "
CREATE TABLE IF NOT EXISTS collections(
    name TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    max_docs INTEGER,
    max_bytes INTEGER
);
CREATE TABLE IF NOT EXISTS kv(
    coll TEXT NOT NULL,
    key TEXT NOT NULL,
    body TEXT NOT NULL,
    ts INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY(coll, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS oplog(
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    coll TEXT NOT NULL,
    op TEXT NOT NULL,
    key TEXT NOT NULL,
    before TEXT,
    after TEXT,
    ts INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS checkpoints(
    feed TEXT PRIMARY KEY,
    body TEXT NOT NULL,
    ts INTEGER NOT NULL
);
";

/// Brings a database made by an earlier version up to the current layout.
pub(crate) fn migrate(conn: &rusqlite::Connection) -> Result<()> {
    // `kv.ts` (last write time): rows written before it existed count as written now, so an
    // upgrade does not expire every key at once.
    let has_ts: bool = conn
        .prepare("SELECT 1 FROM pragma_table_info('kv') WHERE name = 'ts'")?
        .exists([])?;
    if !has_ts {
        conn.execute_batch("ALTER TABLE kv ADD COLUMN ts INTEGER NOT NULL DEFAULT 0")?;
        conn.execute("UPDATE kv SET ts = ?1", [crate::clock::now_us()])?;
    }
    conn.execute_batch("CREATE INDEX IF NOT EXISTS kv_written ON kv(coll, ts)")?;
    Ok(())
}

/// The table behind a capped collection.
pub(crate) fn capped_table(name: &str) -> String {
    format!("capped_{name}")
}

/// The column holding the value of `field` (a dotted path) in a capped collection's table,
/// filled by the writer from the document it already holds, so an insert does not make
/// SQLite parse the JSON text once per index. The name encodes the field reversibly (`_` →
/// `_u`, `.` → `_d`), so the writer can tell every indexed field from the table's columns.
pub(crate) fn index_column(field: &str) -> String {
    let mut col = String::from("ix_");
    for c in field.chars() {
        match c {
            '_' => col.push_str("_u"),
            '.' => col.push_str("_d"),
            c => col.push(c),
        }
    }
    col
}

/// The field of an index column (the inverse of [`index_column`]); `None` for other columns.
pub(crate) fn column_field(col: &str) -> Option<String> {
    let mut out = String::new();
    let mut chars = col.strip_prefix("ix_")?.chars();
    while let Some(c) = chars.next() {
        match c {
            '_' => match chars.next()? {
                'u' => out.push('_'),
                'd' => out.push('.'),
                _ => return None,
            },
            c => out.push(c),
        }
    }
    Some(out)
}

/// The value an index column holds for `value`: what SQLite's `json_extract` returns for it,
/// so a column filled by the writer and one backfilled from the JSON text agree. A string is
/// borrowed from the document, not copied.
pub(crate) fn index_value(value: Option<&serde_json::Value>) -> ToSqlOutput<'_> {
    use rusqlite::types::{Value as Sql, ValueRef};
    use serde_json::Value;
    match value {
        None | Some(Value::Null) => ToSqlOutput::Owned(Sql::Null),
        Some(Value::Bool(b)) => ToSqlOutput::Owned(Sql::Integer(*b as i64)),
        Some(Value::Number(n)) => ToSqlOutput::Owned(match n.as_i64() {
            Some(i) => Sql::Integer(i),
            None => Sql::Real(n.as_f64().unwrap_or(f64::NAN)),
        }),
        Some(Value::String(s)) => ToSqlOutput::Borrowed(ValueRef::Text(s.as_bytes())),
        Some(other) => ToSqlOutput::Owned(Sql::Text(other.to_string())),
    }
}

/// The SQL that reads `field` in a capped collection's table: its index column when it has
/// one, else the JSON path (a full scan).
pub(crate) fn field_sql(conn: &Connection, table: &str, field: &str) -> Result<String> {
    let col = index_column(field);
    let indexed = conn
        .prepare_cached("SELECT 1 FROM pragma_table_info(?1) WHERE name = ?2")?
        .exists([table, col.as_str()])?;
    Ok(if indexed { col } else { field_expr(field) })
}

/// The name of the expression index earlier versions kept on `field` (dropped when the
/// column index replaces it).
pub(crate) fn index_name(coll: &str, field: &str) -> String {
    let clean: String = field
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!("idx_{coll}_{clean}")
}

/// The SQL expression that extracts `field` (a dotted path) from a document body (used once,
/// to fill a new index column from the documents already stored).
pub(crate) fn field_expr(field: &str) -> String {
    format!("json_extract(body, '$.{field}')")
}

/// Checks a collection name: lower-case letters, digits and `_`, so it is safe in table names.
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

/// Checks a field path used in an index: letters, digits, `_` and `.` only, so it is safe in
/// a JSON path literal.
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

/// Opens a connection with the settings every connection needs.
pub(crate) fn open(path: &Path) -> Result<Connection> {
    let conn = Connection::open(path)?;
    // Readers and the writer share the file; WAL lets readers run during a commit. A writer
    // never waits on another writer (there is one), but a checkpoint may briefly hold a lock.
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    Ok(conn)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_columns_name_their_field_reversibly() {
        for field in [
            "id",
            "user.screen_name",
            "a_b.c",
            "_tailrace.source",
            "x__y..z",
        ] {
            let col = index_column(field);
            assert!(
                col.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
                "{col}"
            );
            assert_eq!(column_field(&col).as_deref(), Some(field), "{col}");
        }
        assert_ne!(index_column("a.b"), index_column("a_b"));
        assert_eq!(column_field("body"), None);
        assert_eq!(column_field("ix_a_x"), None);
    }
}
