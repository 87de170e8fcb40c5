//! The pipeline's hand-offs at a paced rate with no work in them: what the async runtime and
//! the durable commit cost a process on this machine before tailrace does anything with an
//! event (issue 24's CPU target at 70 events/s).
//!
//! The same shape as the real pipeline (`ingest::ingester`, `store::embedded`): a source task
//! woken by a timer at Poisson arrivals, a channel to the stage that gathers a batch (waiting
//! up to WAIT_MS for more, as `ingest.batch_max_wait_ms`), a channel to the stage that commits
//! it inline on the runtime's worker (a 1 KiB `O_DIRECT` write and an `fdatasync`, as the
//! journal does), a broadcast of the commit to two feed tasks, and a hand-off to a third
//! stage, as the rollups take. Events are 420 bytes that nothing reads.
//!
//! ```text
//! cargo run --release -p bench --example paced_skeleton -- 70 60 /var/tmp 5
//! cargo run --release -p bench --example paced_skeleton -- 70 60 none 5   # no commit
//! ```
//!
//! Arguments: RATE (events a second), SECONDS, DIRECTORY for the commit's file (on the data's
//! disk) or `none`, WAIT_MS. It prints the process's CPU time (the sum of every thread's
//! `/proc/self/task/*/schedstat` run time, in nanoseconds) per event and per commit, and the
//! threads' voluntary context switches per event. `scripts/paced_floor.c` measures the same
//! commit, and a bare wake-up, without a runtime around them.

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{broadcast, mpsc};

/// The journal's alignment for `O_DIRECT` writes.
const ALIGN: usize = 4096;
/// Bytes a commit writes: a small group's journal record.
const RECORD: usize = 1024;
/// The journal's file grows no further than this; writes wrap around in it.
const FILE_BYTES: u64 = 64 << 20;

struct Args {
    rate: f64,
    seconds: u64,
    dir: Option<PathBuf>,
    wait: Duration,
}

fn args() -> Result<Args, String> {
    let usage = "usage: paced_skeleton RATE SECONDS DIRECTORY|none WAIT_MS";
    let a: Vec<String> = std::env::args().skip(1).collect();
    let [rate, seconds, dir, wait] = a.as_slice() else {
        return Err(usage.into());
    };
    let number = |what: &str, s: &str| {
        s.parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v >= 0.0)
            .ok_or_else(|| format!("{what} must be a non-negative number, not {s:?} ({usage})"))
    };
    let rate = number("RATE", rate)?;
    if rate == 0.0 {
        return Err(format!("RATE must be above zero ({usage})"));
    }
    Ok(Args {
        rate,
        seconds: number("SECONDS", seconds)? as u64,
        dir: (dir != "none").then(|| PathBuf::from(dir)),
        wait: Duration::from_secs_f64(number("WAIT_MS", wait)? / 1000.0),
    })
}

/// Run time of every live thread of this process (ns), and their voluntary context switches.
fn usage() -> io::Result<(u64, u64)> {
    let (mut ns, mut switches) = (0u64, 0u64);
    for task in std::fs::read_dir("/proc/self/task")? {
        let path = task?.path();
        // A thread that exited between the listing and the read has nothing left to count.
        let Ok(stat) = std::fs::read_to_string(path.join("schedstat")) else {
            continue;
        };
        ns += stat
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        let status = std::fs::read_to_string(path.join("status")).unwrap_or_default();
        switches += status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
    }
    Ok((ns, switches))
}

/// The commit's file: preallocated, written with `O_DIRECT` where the filesystem takes it.
struct Journal {
    file: File,
    path: PathBuf,
    buf: Vec<u8>,
    at: u64,
}

impl Journal {
    fn open(dir: PathBuf) -> io::Result<Journal> {
        let path = dir.join(format!("paced-skeleton.{}", std::process::id()));
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
            .open(&path)?;
        let journal = Journal {
            file,
            path,
            buf: vec![b'x'; RECORD + ALIGN],
            at: 0,
        };
        rustix::fs::fallocate(
            &journal.file,
            rustix::fs::FallocateFlags::empty(),
            0,
            FILE_BYTES,
        )?;
        journal.file.sync_all()?;
        Ok(journal)
    }

    fn commit(&mut self) -> io::Result<()> {
        let start = self.buf.as_ptr().align_offset(ALIGN);
        self.file
            .write_at(&self.buf[start..start + RECORD], self.at)?;
        self.file.sync_data()?;
        self.at = (self.at + RECORD as u64) % FILE_BYTES;
        Ok(())
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Waits for the first event, then up to `wait` for more, as the ingester gathers a batch.
async fn gather(rx: &mut mpsc::Receiver<Vec<u8>>, wait: Duration) -> Option<Vec<Vec<u8>>> {
    let mut batch = vec![rx.recv().await?];
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match rx.try_recv() {
            Ok(e) => batch.push(e),
            Err(_) if wait.is_zero() => break,
            Err(_) => match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(e)) => batch.push(e),
                _ => break,
            },
        }
    }
    Some(batch)
}

async fn run(a: Args) -> io::Result<String> {
    let mut journal = match a.dir {
        Some(dir) => Some(Journal::open(dir.clone()).map_err(|e| {
            io::Error::new(e.kind(), format!("a commit file in {}: {e}", dir.display()))
        })?),
        None => None,
    };
    let (events_tx, mut events_rx) = mpsc::channel::<Vec<u8>>(1024);
    let (batches_tx, mut batches_rx) = mpsc::channel::<Vec<Vec<u8>>>(1);
    let (rolls_tx, mut rolls_rx) = mpsc::channel::<usize>(1);
    let (published, _) = broadcast::channel::<Arc<Vec<Vec<u8>>>>(1024);
    for _ in 0..2 {
        let mut feed = published.subscribe();
        tokio::spawn(async move { while feed.recv().await.is_ok() {} });
    }
    let rate = a.rate;
    tokio::spawn(async move {
        let mut next = tokio::time::Instant::now();
        loop {
            // Exponential gaps: arrivals of a stream of independent events.
            let gap = -(1.0 - rand::random::<f64>()).ln() / rate;
            next += Duration::from_secs_f64(gap);
            tokio::time::sleep_until(next).await;
            if events_tx.send(vec![b'e'; 420]).await.is_err() {
                break;
            }
        }
    });
    let wait = a.wait;
    tokio::spawn(async move {
        while let Some(batch) = gather(&mut events_rx, wait).await {
            if batches_tx.send(batch).await.is_err() {
                break;
            }
        }
    });
    tokio::spawn(async move { while rolls_rx.recv().await.is_some() {} });
    let committer = tokio::spawn(async move {
        let run_for = Duration::from_secs(a.seconds);
        let started = Instant::now();
        let before = usage()?;
        let (mut events, mut commits) = (0u64, 0u64);
        while started.elapsed() < run_for {
            let Ok(Some(batch)) =
                tokio::time::timeout(Duration::from_millis(100), batches_rx.recv()).await
            else {
                continue;
            };
            events += batch.len() as u64;
            commits += 1;
            if let Some(j) = journal.as_mut() {
                j.commit()?;
            }
            let _ = published.send(Arc::new(batch));
            let _ = rolls_tx.send(1).await;
        }
        let after = usage()?;
        let secs = started.elapsed().as_secs_f64();
        let cpu_us = (after.0 - before.0) as f64 / 1e3;
        let events_f = events.max(1) as f64;
        Ok::<_, io::Error>(format!(
            "{events} events at {rate}/s, wait {} ms, {}: {:.3} commits an event; \
             CPU {:.2} % of a core, {:.0} µs an event, {:.0} µs a commit; \
             {:.2} voluntary context switches an event",
            wait.as_secs_f64() * 1e3,
            if journal.is_some() {
                "commits to disk"
            } else {
                "no commit"
            },
            commits as f64 / events_f,
            100.0 * cpu_us / 1e6 / secs,
            cpu_us / events_f,
            cpu_us / commits.max(1) as f64,
            (after.1 - before.1) as f64 / events_f,
        ))
    });
    committer.await.map_err(io::Error::other)?
}

fn main() -> std::process::ExitCode {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return std::process::ExitCode::from(2);
        }
    };
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .and_then(|rt| rt.block_on(run(a)));
    match result {
        Ok(line) => {
            println!("{line}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("paced_skeleton: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
