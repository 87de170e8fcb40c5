//! The physical floors the scenarios are bounded by, measured in the same run so the
//! scenarios can report ratios to them:
//!
//! - [`fdatasync`]: append 512 bytes to a file on the data directory's disk and `fdatasync`
//!   it — what any durable commit must at least wait for (writes, insert). An append grows the
//!   file, so the file system also commits its size;
//! - [`fdatasync_overwrite`]: overwrite a 4 KiB page of a file already allocated and
//!   `fdatasync` it — what a WAL that is being reused pays (SQLite restarts its WAL from the
//!   top after each checkpoint), and so the stricter floor for a journaled commit (writes);
//! - raw SQLite single-row inserts ([`sqlite_insert`]), `synchronous` FULL and NORMAL — what
//!   a bare embedded database pays for one durable row, without tailrace's thread hand-off,
//!   indexes and op log (writes);
//! - [`wake`]: wake a task parked on the async runtime from another thread, through the
//!   same primitive the embedded engine uses to publish commits (a tokio broadcast channel) —
//!   what an in-process notification must at least cost (notify);
//! - [`loopback`]: a one-byte TCP round trip on 127.0.0.1 between two tasks — what any HTTP
//!   request must at least cost (outbox).

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::measure::{Samples, Summary};
use super::{BenchError, Result, io_err};

/// A floor's name, what it is, and its distribution.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Floor {
    /// `fdatasync_512b`, `task_wake`, `loopback_rtt`, `http_healthz`.
    pub name: String,
    /// What was measured, for humans.
    pub what: String,
    /// Latency in microseconds.
    pub latency_us: Summary,
}

impl Floor {
    /// Summarises samples under a name.
    pub fn new(name: &str, what: impl Into<String>, samples: &Samples) -> Floor {
        Floor {
            name: name.into(),
            what: what.into(),
            latency_us: samples.summary(),
        }
    }
}

/// `n` appends of 512 bytes to a probe file in `dir`, each followed by `fdatasync`
/// (`File::sync_data`). The file is removed afterwards.
pub async fn fdatasync(dir: &Path, n: usize) -> Result<Samples> {
    let dir = dir.to_path_buf();
    tokio::task::spawn_blocking(move || {
        std::fs::create_dir_all(&dir).map_err(io_err(format!("creating {}", dir.display())))?;
        let path = dir.join("fdatasync-probe");
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(io_err(format!("opening {}", path.display())))?;
        let block = [b'x'; 512];
        let mut samples = Samples::with_capacity(n);
        // One untimed round: the first append allocates the file's first block.
        file.write_all(&block)
            .and_then(|_| file.sync_data())
            .map_err(io_err("fdatasync probe"))?;
        for _ in 0..n {
            let t = Instant::now();
            file.write_all(&block)
                .and_then(|_| file.sync_data())
                .map_err(io_err("fdatasync probe"))?;
            samples.push(t.elapsed());
        }
        drop(file);
        let _ = std::fs::remove_file(&path);
        Ok(samples)
    })
    .await
    .map_err(|e| BenchError::Scenario(format!("fdatasync probe task: {e}")))?
}

/// `n` overwrites of a 4 KiB page, cycling over a file of 64 pages written and synced before
/// the first, each followed by `fdatasync`. The file is removed afterwards.
pub async fn fdatasync_overwrite(dir: &Path, n: usize) -> Result<Samples> {
    use std::os::unix::fs::FileExt;
    const PAGES: u64 = 64;
    let dir = dir.to_path_buf();
    tokio::task::spawn_blocking(move || {
        std::fs::create_dir_all(&dir).map_err(io_err(format!("creating {}", dir.display())))?;
        let path = dir.join("fdatasync-overwrite-probe");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(io_err(format!("opening {}", path.display())))?;
        let page = [b'x'; 4096];
        for i in 0..PAGES {
            file.write_all_at(&page, i * 4096)
                .map_err(io_err("fdatasync overwrite probe"))?;
        }
        file.sync_all()
            .map_err(io_err("fdatasync overwrite probe"))?;
        let mut samples = Samples::with_capacity(n);
        for i in 0..n as u64 {
            let t = Instant::now();
            file.write_all_at(&page, (i % PAGES) * 4096)
                .and_then(|_| file.sync_data())
                .map_err(io_err("fdatasync overwrite probe"))?;
            samples.push(t.elapsed());
        }
        drop(file);
        let _ = std::fs::remove_file(&path);
        Ok(samples)
    })
    .await
    .map_err(|e| BenchError::Scenario(format!("fdatasync overwrite probe task: {e}")))?
}

/// `n` raw SQLite single-row inserts of `body` (one transaction each, WAL, `synchronous` FULL
/// or NORMAL, `indexes` indexed columns) in a scratch database under `dir`.
pub async fn sqlite_insert(
    dir: &Path,
    n: usize,
    full: bool,
    indexes: usize,
    body: String,
) -> Result<Samples> {
    let dir = dir.to_path_buf();
    let times = tokio::task::spawn_blocking(move || raw_inserts(&dir, n, full, indexes, &body))
        .await
        .map_err(|e| BenchError::Scenario(format!("sqlite probe task: {e}")))??;
    let mut samples = Samples::with_capacity(n);
    for t in times {
        samples.push(t);
    }
    Ok(samples)
}

/// `n` single-row inserts of `body`, each its own transaction, in a fresh SQLite database
/// under `dir` in WAL mode with `synchronous = FULL` (`full`) or `NORMAL`; the time of each.
/// One row per transaction into a table with a capped collection's columns, no op log, no
/// thread hand-off: what a single write costs a bare embedded database on this disk. With
/// `indexes` > 0 the table also has that many indexed text columns, filled with values of a
/// few thousand distinct. The database is removed afterwards.
fn raw_inserts(
    dir: &Path,
    n: usize,
    full: bool,
    indexes: usize,
    body: &str,
) -> Result<Vec<Duration>> {
    std::fs::create_dir_all(dir).map_err(io_err(format!("creating {}", dir.display())))?;
    let path = dir.join(if full {
        "probe-full.db"
    } else {
        "probe-normal.db"
    });
    let mut times = Vec::with_capacity(n);
    {
        let conn = rusqlite::Connection::open(&path).map_err(sqlite_err)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(sqlite_err)?;
        conn.pragma_update(None, "synchronous", if full { "FULL" } else { "NORMAL" })
            .map_err(sqlite_err)?;
        let cols: String = (0..indexes).map(|i| format!(", ix{i} TEXT")).collect();
        conn.execute_batch(&format!(
            "CREATE TABLE IF NOT EXISTS t(
                pos INTEGER PRIMARY KEY AUTOINCREMENT,
                body TEXT NOT NULL,
                sz INTEGER NOT NULL,
                ts INTEGER NOT NULL{cols}
            )"
        ))
        .map_err(sqlite_err)?;
        for i in 0..indexes {
            conn.execute_batch(&format!("CREATE INDEX IF NOT EXISTS t_ix{i} ON t(ix{i})"))
                .map_err(sqlite_err)?;
        }
        let names: String = (0..indexes).map(|i| format!(", ix{i}")).collect();
        let marks: String = (0..indexes).map(|i| format!(", ?{}", i + 4)).collect();
        let mut insert = conn
            .prepare(&format!(
                "INSERT INTO t(body, sz, ts{names}) VALUES (?1, ?2, ?3{marks})"
            ))
            .map_err(sqlite_err)?;
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
            row(i).map_err(sqlite_err)?;
        }
        for i in 0..n {
            let t = Instant::now();
            row(i).map_err(sqlite_err)?;
            times.push(t.elapsed());
        }
    }
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    Ok(times)
}

fn sqlite_err(e: rusqlite::Error) -> BenchError {
    BenchError::Scenario(format!("sqlite floor: {e}"))
}

/// `n` wakes of a task parked on the runtime, each sent from a plain thread through a
/// tokio broadcast channel (the embedded engine's commit hub) after a pause of `gap`, so the
/// runtime's workers (and the CPU) have gone idle as they do between events at a low rate.
pub async fn wake(n: usize, gap: Duration) -> Result<Samples> {
    let (tx, mut rx) = tokio::sync::broadcast::channel::<Instant>(16);
    let consumer = tokio::spawn(async move {
        let mut samples = Samples::with_capacity(n);
        while samples.len() < n {
            match rx.recv().await {
                Ok(sent) => samples.push(sent.elapsed()),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
            }
        }
        samples
    });
    let sender = std::thread::Builder::new()
        .name("bench-waker".into())
        .spawn(move || {
            for _ in 0..n {
                std::thread::sleep(gap);
                if tx.send(Instant::now()).is_err() {
                    break;
                }
            }
        })
        .map_err(io_err("starting the waker thread"))?;
    let samples = consumer
        .await
        .map_err(|e| BenchError::Scenario(format!("wake probe task: {e}")))?;
    let _ = tokio::task::spawn_blocking(move || sender.join()).await;
    Ok(samples)
}

/// `n` one-byte TCP round trips on 127.0.0.1 between two tasks (Nagle off).
pub async fn loopback(n: usize) -> Result<Samples> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(io_err("binding the loopback probe"))?;
    let addr = listener
        .local_addr()
        .map_err(io_err("loopback probe address"))?;
    let echo = tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await?;
        sock.set_nodelay(true)?;
        let mut b = [0u8; 1];
        loop {
            if sock.read(&mut b).await? == 0 {
                return Ok::<_, std::io::Error>(());
            }
            sock.write_all(&b).await?;
        }
    });
    let mut sock = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(io_err("connecting the loopback probe"))?;
    sock.set_nodelay(true)
        .map_err(io_err("loopback probe nodelay"))?;
    let mut samples = Samples::with_capacity(n);
    let mut b = [7u8; 1];
    for _ in 0..n {
        let t = Instant::now();
        sock.write_all(&b)
            .await
            .map_err(io_err("loopback probe write"))?;
        sock.read_exact(&mut b)
            .await
            .map_err(io_err("loopback probe read"))?;
        samples.push(t.elapsed());
    }
    drop(sock);
    let _ = echo.await;
    Ok(samples)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {

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
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn floors_measure_something() {
        let dir = tempfile::tempdir().unwrap();
        let f = fdatasync(dir.path(), 5).await.unwrap();
        assert_eq!(f.len(), 5);
        assert!(
            !dir.path().join("fdatasync-probe").exists(),
            "probe file removed"
        );
        let w = wake(5, Duration::from_millis(1)).await.unwrap();
        assert_eq!(w.len(), 5);
        let l = loopback(5).await.unwrap();
        assert_eq!(l.len(), 5);
        assert!(l.summary().min > 0.0, "a round trip takes time");
    }
}
