//! What a result was measured on, so two runs can be compared: cores, memory, CPU, kernel,
//! the data directory's disk, the load when the run started, the build profile.
//! Read from `/proc` and `/sys` (Linux); a fact that cannot be read is `null`, never a guess.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The machine and build a run was measured on.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Machine {
    /// Logical CPUs available to this process.
    pub cores: usize,
    /// CPU model name.
    pub cpu_model: Option<String>,
    /// Physical memory in bytes.
    pub memory_bytes: Option<u64>,
    /// Operating system (`PRETTY_NAME` of /etc/os-release).
    pub os: Option<String>,
    /// Kernel release.
    pub kernel: Option<String>,
    /// The disk holding the data directory.
    pub disk: Disk,
    /// 1, 5 and 15-minute load averages when the scenario started (a busy, shared machine
    /// shows here).
    pub load_average: Option<[f64; 3]>,
    /// `release` or `debug`: a debug build's numbers are not worth comparing.
    pub build: String,
}

/// The filesystem and device holding a directory.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Disk {
    /// The directory asked about.
    pub path: PathBuf,
    /// The mount point it lives under.
    pub mount_point: Option<String>,
    /// The filesystem type (ext4, xfs, tmpfs, overlay...).
    pub fs_type: Option<String>,
    /// The mounted device.
    pub device: Option<String>,
    /// Whether the kernel reports it as a rotating disk.
    pub rotational: Option<bool>,
}

/// `release` or `debug`.
pub fn build_profile() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

/// The facts of this machine, with `data` as the directory whose disk matters.
pub fn detect(data: &Path) -> Machine {
    let cpuinfo = read("/proc/cpuinfo");
    let meminfo = read("/proc/meminfo");
    Machine {
        cores: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        cpu_model: cpuinfo.as_deref().and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        }),
        memory_bytes: meminfo.as_deref().and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
                .map(|kb| kb * 1024)
        }),
        os: read("/etc/os-release").and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("PRETTY_NAME="))
                .map(|v| v.trim_matches('"').to_string())
        }),
        kernel: read("/proc/sys/kernel/osrelease").map(|s| s.trim().to_string()),
        disk: disk(data),
        load_average: load_average(),
        build: build_profile().into(),
    }
}

/// The 1, 5 and 15-minute load averages.
pub fn load_average() -> Option<[f64; 3]> {
    let s = read("/proc/loadavg")?;
    let mut it = s.split_whitespace().map(|v| v.parse::<f64>().ok());
    Some([it.next()??, it.next()??, it.next()??])
}

/// What this process has used so far: CPU seconds (user + system, all threads) and bytes it
/// caused to be written to storage (`write_bytes` of `/proc/self/io`: data written back to the
/// disk, the engine's WAL and checkpoints included, whatever the page cache later absorbs).
/// Taken before and after a run, the difference is that run's cost. Beside it, the CPU of the
/// database servers running on this machine (see [`SERVERS`]): on the MongoDB engine the
/// other half of the cost, which this process's own figure leaves out.
#[derive(Clone, Copy, Debug, Default)]
pub struct Usage {
    /// CPU seconds, when readable (clock ticks: 10 ms resolution).
    pub cpu_secs: Option<f64>,
    /// Bytes written to storage, when readable.
    pub write_bytes: Option<u64>,
    /// CPU seconds of the database server processes on this machine; `None` when none runs.
    pub server_cpu_secs: Option<f64>,
}

/// The process names (`comm`) counted as database servers: MongoDB, FerretDB and the
/// PostgreSQL it runs on (every `postgres` process: backends, the writer, autovacuum).
/// Processes that exit during a run take their time with them: connection pools keep the
/// backends that matter.
pub const SERVERS: [&str; 3] = ["mongod", "ferretdb", "postgres"];

/// The CPU seconds used so far by the processes named in [`SERVERS`], `None` when none runs.
fn servers_cpu_secs() -> Option<f64> {
    let ticks = procfs::ticks_per_second() as f64;
    let mut total = None;
    for p in procfs::process::all_processes().ok()?.flatten() {
        let Ok(stat) = p.stat() else { continue };
        if SERVERS.contains(&stat.comm.as_str()) {
            *total.get_or_insert(0.0) += (stat.utime + stat.stime) as f64 / ticks;
        }
    }
    total
}

impl Usage {
    /// This process's usage now.
    pub fn now() -> Usage {
        let write_bytes = read("/proc/self/io").and_then(|io| {
            io.lines()
                .find_map(|l| l.strip_prefix("write_bytes:"))
                .and_then(|v| v.trim().parse().ok())
        });
        Usage {
            cpu_secs: metrics_process::collector::collect().cpu_seconds_total,
            write_bytes,
            server_cpu_secs: servers_cpu_secs(),
        }
    }

    /// The usage since `before`.
    pub fn since(before: Usage) -> Usage {
        let now = Usage::now();
        Usage {
            cpu_secs: now.cpu_secs.zip(before.cpu_secs).map(|(a, b)| a - b),
            write_bytes: now
                .write_bytes
                .zip(before.write_bytes)
                .map(|(a, b)| a.saturating_sub(b)),
            // No server before (`None`) is none of their CPU yet: a server started since
            // counts from zero.
            server_cpu_secs: now
                .server_cpu_secs
                .map(|a| (a - before.server_cpu_secs.unwrap_or(0.0)).max(0.0)),
        }
    }

    /// The database servers' CPU µs per one of `n` events.
    pub fn server_per_event(&self, n: u64) -> Option<f64> {
        self.server_cpu_secs.map(|c| c * 1e6 / n.max(1) as f64)
    }

    /// CPU µs and bytes written per one of `n` events.
    pub fn per_event(&self, n: u64) -> (Option<f64>, Option<f64>) {
        let n = n.max(1) as f64;
        (
            self.cpu_secs.map(|c| c * 1e6 / n),
            self.write_bytes.map(|b| b as f64 / n),
        )
    }
}

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// The mount (longest mount point that is a prefix of the directory) from mountinfo.
fn disk(dir: &Path) -> Disk {
    let path = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let mut best: Option<(String, String, String, String)> = None;
    if let Some(info) = read("/proc/self/mountinfo") {
        for line in info.lines() {
            // id parent major:minor root mount-point options [optional...] - fstype source super
            let fields: Vec<&str> = line.split_whitespace().collect();
            let Some(dash) = fields.iter().position(|f| *f == "-") else {
                continue;
            };
            let (Some(dev), Some(mount), Some(fs), Some(src)) = (
                fields.get(2),
                fields.get(4),
                fields.get(dash + 1),
                fields.get(dash + 2),
            ) else {
                continue;
            };
            let mount = mount.replace("\\040", " ");
            if path.starts_with(&mount) && best.as_ref().is_none_or(|b| mount.len() >= b.1.len()) {
                best = Some((dev.to_string(), mount, fs.to_string(), src.to_string()));
            }
        }
    }
    let Some((dev, mount, fs, src)) = best else {
        return Disk {
            path,
            ..Disk::default()
        };
    };
    // A partition's queue/ lives in its parent device's directory.
    let rotational = [
        format!("/sys/dev/block/{dev}/queue/rotational"),
        format!("/sys/dev/block/{dev}/../queue/rotational"),
    ]
    .iter()
    .find_map(|p| read(p))
    .map(|s| s.trim() == "1");
    Disk {
        path,
        mount_point: Some(mount),
        fs_type: Some(fs),
        device: Some(src),
        rotational,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn detects_this_machine() {
        let dir = tempfile::tempdir().unwrap();
        let m = detect(dir.path());
        assert!(m.cores >= 1);
        if cfg!(target_os = "linux") {
            assert!(m.memory_bytes.unwrap_or(0) > 0, "MemTotal read: {m:?}");
            assert!(m.disk.mount_point.is_some(), "a mount found: {m:?}");
            assert!(m.load_average.is_some(), "loadavg read: {m:?}");
        }
    }

    /// A busy process named like a server is counted in the servers' CPU, and this process
    /// is not (it is named otherwise).
    #[test]
    #[cfg(target_os = "linux")]
    fn counts_the_cpu_of_processes_named_like_servers() {
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("ferretdb");
        std::fs::copy("/usr/bin/yes", &fake).unwrap();
        let before = Usage::now();
        let mut busy = std::process::Command::new(&fake)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(600));
        let during = Usage::since(before);
        busy.kill().unwrap();
        busy.wait().unwrap();
        let server = during
            .server_cpu_secs
            .expect("a process named ferretdb ran");
        assert!(server >= 0.1, "its CPU counted: {server} s");
        assert!(
            during.cpu_secs.unwrap_or(0.0) < server,
            "this process's own CPU is apart: {during:?}"
        );
    }
}
