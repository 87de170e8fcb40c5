//! Raw SQLite, without tailrace: the floors the embedded engine's single writes are measured
//! against (`tailrace bench writes`). Same library, same build, same disk, same journal mode
//! (WAL) as the engine; one row per transaction into a table with the capped tables' columns,
//! no index, no op log, no thread hand-off.

use std::path::Path;
use std::time::{Duration, Instant};

use rusqlite::Connection;

use crate::{Result, StoreError};

/// `n` single-row inserts of `body`, each its own transaction, in a fresh database under
/// `dir` in WAL mode with `synchronous = FULL` (`full`) or `NORMAL`; the time of each. With
/// `indexes` > 0 the table also has that many indexed text columns, filled with values of a
/// few thousand distinct (as the engine's index columns are). The database is removed
/// afterwards.
pub fn raw_inserts(
    dir: &Path,
    n: usize,
    full: bool,
    indexes: usize,
    body: &str,
) -> Result<Vec<Duration>> {
    std::fs::create_dir_all(dir).map_err(|source| StoreError::Io {
        context: format!("creating {}", dir.display()),
        source,
    })?;
    let path = dir.join(if full {
        "probe-full.db"
    } else {
        "probe-normal.db"
    });
    let mut times = Vec::with_capacity(n);
    {
        let conn = Connection::open(&path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", if full { "FULL" } else { "NORMAL" })?;
        let cols: String = (0..indexes).map(|i| format!(", ix{i} TEXT")).collect();
        conn.execute_batch(&format!(
            "CREATE TABLE IF NOT EXISTS t(
                pos INTEGER PRIMARY KEY AUTOINCREMENT,
                body TEXT NOT NULL,
                sz INTEGER NOT NULL,
                ts INTEGER NOT NULL{cols}
            )"
        ))?;
        for i in 0..indexes {
            conn.execute_batch(&format!("CREATE INDEX IF NOT EXISTS t_ix{i} ON t(ix{i})"))?;
        }
        let names: String = (0..indexes).map(|i| format!(", ix{i}")).collect();
        let marks: String = (0..indexes).map(|i| format!(", ?{}", i + 4)).collect();
        let mut insert = conn.prepare(&format!(
            "INSERT INTO t(body, sz, ts{names}) VALUES (?1, ?2, ?3{marks})"
        ))?;
        let mut row = |i: usize| -> rusqlite::Result<usize> {
            let mut values: Vec<rusqlite::types::Value> = vec![
                body.to_owned().into(),
                (body.len() as i64).into(),
                (i as i64).into(),
            ];
            for x in 0..indexes {
                values.push(format!("v{x}-{}", (i * 7919 + x) % 5000).into());
            }
            insert.execute(rusqlite::params_from_iter(values))
        };
        // Warm-up: the first pages and the WAL file.
        for i in 0..20 {
            row(i)?;
        }
        for i in 0..n {
            let t = Instant::now();
            row(i)?;
            times.push(t.elapsed());
        }
    }
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    Ok(times)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn raw_inserts_time_each_insert_and_clean_up() {
        let dir = tempfile::tempdir().unwrap();
        for full in [true, false] {
            for indexes in [0, 3] {
                let times = raw_inserts(dir.path(), 5, full, indexes, "{\"a\":1}").unwrap();
                assert_eq!(times.len(), 5);
                assert!(times.iter().all(|t| *t > Duration::ZERO));
            }
        }
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
