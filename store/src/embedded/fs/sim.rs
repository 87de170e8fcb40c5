//! A simulated disk for crash tests, in the manner of SQLite's crash-test VFS and ALICE: it
//! keeps, per file, what is durable and what was written since the file's last sync, and per
//! directory which entries (creations, renames, removals) are durable. At a crash point it
//! makes the image a power cut could leave: the durable state plus, per unsynced write,
//! the write kept, dropped or torn at sector boundaries; plus a prefix of the directory
//! operations not yet synced. It can also fail a chosen call with `EIO` or `ENOSPC` (a failed
//! `fsync` drops the file's unsynced writes from what can become durable, as Linux does, and
//! a later `fsync` succeeds).
//!
//! Every mutating call is numbered; a [`Plan`] names the call at which the power goes
//! (before it runs) and the calls that fail. Everything random (which writes survive, where a
//! write tears) comes from the plan's seed, so a failure is replayed from its seed and crash
//! point. After the crash, every mutating call fails with `EIO`: the engine stops where the
//! power went.
//!
//! **Sectors.** [`Geometry`] says what a write must be aligned to with `O_DIRECT` (the
//! device's logical block, `STATX_DIOALIGN`) and the physical sector, the unit a write
//! tears at. A write smaller than the physical sector (512-byte writes on a "512e" disk of
//! 4 KiB sectors) is a read-modify-write of the whole sector on the device: a power cut
//! during it can leave the whole sector damaged, including bytes written and synced long
//! before. So a torn write leaves each physical sector it touches old, new, or — when the
//! write covered only part of it — damaged.
//!
//! What it does not model: the keyed state's tree (`lsm-tree` does its own I/O, and syncs
//! what it writes); the tests copy its directory at the crash point instead
//! ([`SimDisk::on_crash`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{self, ErrorKind};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{Fs, FsFile, Open};

/// The device's sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// What an `O_DIRECT` write's offset and length must be multiples of.
    pub write_align: u64,
    /// The unit a write tears at: a write that covers part of one is a read-modify-write of
    /// all of it.
    pub sector: u64,
}

impl Geometry {
    /// 512-byte sectors, written 512 bytes at a time.
    pub const N512: Geometry = Geometry {
        write_align: 512,
        sector: 512,
    };
    /// 4 KiB physical sectors addressed in 512-byte blocks ("512e"): most disks sold since
    /// 2011, and the machine this was written on.
    pub const E512: Geometry = Geometry {
        write_align: 512,
        sector: 4096,
    };
    /// 4 KiB sectors, written 4 KiB at a time ("4Kn", and dm-crypt over most disks).
    pub const K4: Geometry = Geometry {
        write_align: 4096,
        sector: 4096,
    };
}

/// What survives of the writes and directory operations not yet synced, at a crash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keep {
    /// Only what was synced (the unluckiest power cut).
    Nothing,
    /// Everything (what a killed process leaves: the page cache is the kernel's).
    Everything,
    /// Each write kept, dropped or torn, and a prefix of the directory operations, drawn
    /// from this seed.
    Random(u64),
}

/// How a call fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    Eio,
    Enospc,
}

/// Where the power goes and which calls fail.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    /// The number of the mutating call before which the power goes.
    pub crash_at: Option<u64>,
    /// What survives of what was not synced.
    pub keep: Option<Keep>,
    /// Calls (by number) that fail, and how.
    pub faults: Vec<(u64, Fault)>,
}

/// A mutating call, as the trace records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Op {
    /// Its number (calls are numbered from 0).
    pub n: u64,
    pub kind: &'static str,
    pub path: PathBuf,
    /// Offset and length of a write, the range of an allocation.
    pub at: u64,
    pub len: u64,
    /// Whether it failed, injected.
    pub failed: Option<Fault>,
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "#{} {} {}", self.n, self.kind, self.path.display())?;
        if self.len > 0 {
            write!(f, " [{}..{})", self.at, self.at + self.len)?;
        }
        if let Some(e) = self.failed {
            write!(f, " -> {e:?}")?;
        }
        Ok(())
    }
}

/// What a power cut left: files (paths relative to the disk's root) and directories.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Image {
    pub files: BTreeMap<PathBuf, Vec<u8>>,
    pub dirs: BTreeSet<PathBuf>,
}

/// A change to a file not yet synced.
#[derive(Clone, Debug)]
enum Change {
    Write { at: u64, bytes: Vec<u8> },
    Len(u64),
}

#[derive(Clone, Debug, Default)]
struct Inode {
    /// What reads see.
    data: Vec<u8>,
    /// What survives any crash.
    durable: Vec<u8>,
    /// Changes since the last sync, in order.
    unsynced: Vec<Change>,
}

impl Inode {
    /// Makes the changes since the last sync durable. Not a copy of what reads see: after a
    /// failed sync, what it dropped stays readable and never becomes durable.
    fn sync(&mut self) {
        for change in std::mem::take(&mut self.unsynced) {
            match change {
                Change::Write { at, bytes } => write_into(&mut self.durable, at, &bytes),
                Change::Len(n) => self.durable.resize(n as usize, 0),
            }
        }
    }
}

/// A directory operation not yet synced.
#[derive(Clone, Debug)]
enum NsOp {
    Mkdir(PathBuf),
    Link(PathBuf, u64),
    Unlink(PathBuf),
    Rmdir(PathBuf),
}

impl NsOp {
    /// The directory whose sync makes it durable.
    fn dir(&self) -> &Path {
        let p = match self {
            NsOp::Mkdir(p) | NsOp::Link(p, _) | NsOp::Unlink(p) | NsOp::Rmdir(p) => p,
        };
        p.parent().unwrap_or(Path::new(""))
    }

    fn apply(&self, names: &mut BTreeMap<PathBuf, u64>, dirs: &mut BTreeSet<PathBuf>) {
        match self {
            NsOp::Mkdir(p) => {
                dirs.insert(p.clone());
            }
            NsOp::Link(p, ino) => {
                names.insert(p.clone(), *ino);
            }
            NsOp::Unlink(p) => {
                names.remove(p);
            }
            NsOp::Rmdir(p) => {
                dirs.remove(p);
            }
        }
    }
}

#[derive(Debug, Default)]
struct State {
    geometry: Option<Geometry>,
    inodes: HashMap<u64, Inode>,
    next_ino: u64,
    names: BTreeMap<PathBuf, u64>,
    dirs: BTreeSet<PathBuf>,
    durable_names: BTreeMap<PathBuf, u64>,
    durable_dirs: BTreeSet<PathBuf>,
    pending: Vec<NsOp>,
    plan: Plan,
    ops: u64,
    trace: Vec<Op>,
    /// The image the crash left, once the power went.
    crashed: Option<Image>,
}

/// A splitmix64 stream: small, and the same everywhere.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }
}

type Hook = Box<dyn Fn() + Send + Sync>;

struct Inner {
    root: PathBuf,
    state: Mutex<State>,
    /// Called once, when the power goes (the tests copy the keyed state's directory).
    on_crash: Mutex<Option<Hook>>,
}

/// The simulated disk: cheap to clone, all clones one disk. Paths given to it must lie under
/// its root.
#[derive(Clone)]
pub struct SimDisk {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SimDisk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimDisk")
            .field("root", &self.inner.root)
            .finish_non_exhaustive()
    }
}

fn err(kind: ErrorKind, what: &str) -> io::Error {
    io::Error::new(kind, format!("simulated disk: {what}"))
}

fn fault_error(f: Fault) -> io::Error {
    match f {
        Fault::Eio => io::Error::from_raw_os_error(5),
        Fault::Enospc => io::Error::from_raw_os_error(28),
    }
}

fn write_into(data: &mut Vec<u8>, at: u64, bytes: &[u8]) {
    let (at, end) = (at as usize, at as usize + bytes.len());
    if data.len() < end {
        data.resize(end, 0);
    }
    data[at..end].copy_from_slice(bytes);
}

impl SimDisk {
    /// An empty disk rooted at `root` (the data directory's parent or itself).
    pub fn new(root: impl Into<PathBuf>, geometry: Geometry) -> SimDisk {
        let mut state = State {
            geometry: Some(geometry),
            next_ino: 1,
            ..State::default()
        };
        state.dirs.insert(PathBuf::new());
        state.durable_dirs.insert(PathBuf::new());
        SimDisk {
            inner: Arc::new(Inner {
                root: root.into(),
                state: Mutex::new(state),
                on_crash: Mutex::new(None),
            }),
        }
    }

    /// A disk holding `image` (all of it durable), rooted at `root`.
    pub fn from_image(root: impl Into<PathBuf>, geometry: Geometry, image: &Image) -> SimDisk {
        let disk = SimDisk::new(root, geometry);
        {
            let mut s = disk.state();
            for d in &image.dirs {
                s.dirs.insert(d.clone());
                s.durable_dirs.insert(d.clone());
            }
            for (path, bytes) in &image.files {
                let ino = s.next_ino;
                s.next_ino += 1;
                s.inodes.insert(
                    ino,
                    Inode {
                        data: bytes.clone(),
                        durable: bytes.clone(),
                        unsynced: Vec::new(),
                    },
                );
                s.names.insert(path.clone(), ino);
                s.durable_names.insert(path.clone(), ino);
            }
        }
        disk
    }

    /// This disk as the engine takes it.
    pub fn shared(&self) -> Arc<dyn Fs> {
        Arc::new(self.clone())
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding it (a test's assertion) leaves the state as it was.
        self.inner
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Where the power goes and which calls fail, from the next call on.
    pub fn set_plan(&self, plan: Plan) {
        self.state().plan = plan;
    }

    /// Called once when the power goes, before the crashing call returns.
    pub fn on_crash(&self, hook: impl Fn() + Send + Sync + 'static) {
        *self
            .inner
            .on_crash
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Box::new(hook));
    }

    /// Mutating calls so far.
    pub fn ops(&self) -> u64 {
        self.state().ops
    }

    /// Every mutating call so far.
    pub fn trace(&self) -> Vec<Op> {
        self.state().trace.clone()
    }

    /// The image the planned crash left, once it happened.
    pub fn crashed(&self) -> Option<Image> {
        self.state().crashed.clone()
    }

    /// Cuts the power now (if the plan has not already): what survives is `keep`'s.
    pub fn crash_now(&self, keep: Keep) -> Image {
        let image = {
            let mut s = self.state();
            if let Some(image) = &s.crashed {
                return image.clone();
            }
            let image = s.image(keep);
            s.crashed = Some(image.clone());
            image
        };
        self.run_hook();
        image
    }

    fn run_hook(&self) {
        if let Some(hook) = self
            .inner
            .on_crash
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
        {
            hook();
        }
    }

    fn rel(&self, path: &Path) -> io::Result<PathBuf> {
        path.strip_prefix(&self.inner.root)
            .map(Path::to_path_buf)
            .map_err(|_| err(ErrorKind::InvalidInput, "a path outside the disk"))
    }

    /// Numbers a mutating call: fails it if the power is gone, cuts the power if it is the
    /// planned crash point, or fails it as planned. `Ok(())`: go ahead.
    fn begin(&self, kind: &'static str, path: &Path, at: u64, len: u64) -> io::Result<()> {
        let crash = {
            let mut s = self.state();
            if s.crashed.is_some() {
                return Err(err(ErrorKind::Other, "the power is off"));
            }
            let n = s.ops;
            s.ops += 1;
            let failed = s
                .plan
                .faults
                .iter()
                .find(|(at, _)| *at == n)
                .map(|(_, f)| *f);
            s.trace.push(Op {
                n,
                kind,
                path: path.to_path_buf(),
                at,
                len,
                failed,
            });
            if s.plan.crash_at == Some(n) {
                let keep = s.plan.keep.unwrap_or(Keep::Nothing);
                let image = s.image(keep);
                s.crashed = Some(image);
                true
            } else if let Some(f) = failed {
                if matches!(kind, "sync_data" | "sync_all") {
                    // Linux marks the pages clean after a failed writeback: those writes never
                    // become durable, and the next fsync has nothing to report.
                    if let Some(ino) = self.rel(path).ok().and_then(|p| s.names.get(&p).copied())
                        && let Some(inode) = s.inodes.get_mut(&ino)
                    {
                        inode.unsynced.clear();
                    }
                }
                if kind == "sync_dir" {
                    let dir = self.rel(path)?;
                    s.pending.retain(|op| op.dir() != dir);
                }
                return Err(fault_error(f));
            } else {
                false
            }
        };
        if crash {
            self.run_hook();
            return Err(err(ErrorKind::Other, "power cut"));
        }
        Ok(())
    }

    fn with_inode<T>(&self, ino: u64, f: impl FnOnce(&mut Inode) -> T) -> io::Result<T> {
        let mut s = self.state();
        let inode = s
            .inodes
            .get_mut(&ino)
            .ok_or_else(|| err(ErrorKind::NotFound, "no such inode"))?;
        Ok(f(inode))
    }
}

impl State {
    /// The image a power cut leaves now.
    fn image(&self, keep: Keep) -> Image {
        let sector = self.geometry.map_or(512, |g| g.sector).max(1);
        let mut rng = Rng(match keep {
            Keep::Random(seed) => seed,
            _ => 0,
        });
        // Directory operations: the synced ones, then a prefix of the rest.
        let (mut names, mut dirs) = (self.durable_names.clone(), self.durable_dirs.clone());
        let kept_ops = match keep {
            Keep::Nothing => 0,
            Keep::Everything => self.pending.len(),
            Keep::Random(_) => rng.below(self.pending.len() as u64 + 1) as usize,
        };
        for op in &self.pending[..kept_ops] {
            op.apply(&mut names, &mut dirs);
        }
        // A directory whose parent's entry for it did not survive is unreachable (what fsck
        // would put in lost+found), and so is everything under it.
        let reachable: BTreeSet<PathBuf> = dirs
            .iter()
            .filter(|d| d.ancestors().skip(1).all(|a| dirs.contains(a)))
            .cloned()
            .collect();
        let dirs = reachable;
        let mut files = BTreeMap::new();
        for (path, ino) in &names {
            if !path.parent().is_some_and(|d| dirs.contains(d)) {
                continue;
            }
            let Some(inode) = self.inodes.get(ino) else {
                continue;
            };
            let mut data = inode.durable.clone();
            for change in &inode.unsynced {
                let fate = match keep {
                    Keep::Nothing => 1,
                    Keep::Everything => 0,
                    Keep::Random(_) => rng.below(3),
                };
                match (change, fate) {
                    (_, 1) => {}
                    (Change::Len(n), _) => data.resize(*n as usize, 0),
                    (Change::Write { at, bytes }, 0) => write_into(&mut data, *at, bytes),
                    (Change::Write { at, bytes }, _) => {
                        tear(&mut data, *at, bytes, sector, &mut rng);
                    }
                }
            }
            files.insert(path.clone(), data);
        }
        Image { files, dirs }
    }
}

/// A write torn at sector boundaries: each physical sector it touches is left old or new;
/// one it covers only in part (a read-modify-write on the device) may be left damaged whole.
fn tear(data: &mut Vec<u8>, at: u64, bytes: &[u8], sector: u64, rng: &mut Rng) {
    let end = at + bytes.len() as u64;
    let mut s = at / sector * sector;
    while s < end {
        let (lo, hi) = (s.max(at), (s + sector).min(end));
        let partial = lo > s || hi < s + sector;
        match rng.below(if partial { 3 } else { 2 }) {
            0 => write_into(data, lo, &bytes[(lo - at) as usize..(hi - at) as usize]),
            1 => {}
            _ => {
                let garbage: Vec<u8> = (0..sector).map(|_| rng.next() as u8).collect();
                write_into(data, s, &garbage);
            }
        }
        s += sector;
    }
}

#[derive(Debug)]
struct SimFile {
    disk: SimDisk,
    path: PathBuf,
    ino: u64,
    direct: bool,
    writable: bool,
}

impl FsFile for SimFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.disk.with_inode(self.ino, |i| {
            let (at, end) = (offset as usize, offset as usize + buf.len());
            if end > i.data.len() {
                return Err(err(ErrorKind::UnexpectedEof, "read past the end"));
            }
            buf.copy_from_slice(&i.data[at..end]);
            Ok(())
        })?
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if !self.writable {
            return Err(io::Error::from_raw_os_error(9));
        }
        let align = self.write_align();
        if !offset.is_multiple_of(align) || !(buf.len() as u64).is_multiple_of(align) {
            return Err(io::Error::from_raw_os_error(22));
        }
        self.disk
            .begin("write", &self.path, offset, buf.len() as u64)?;
        self.disk.with_inode(self.ino, |i| {
            write_into(&mut i.data, offset, buf);
            i.unsynced.push(Change::Write {
                at: offset,
                bytes: buf.to_vec(),
            });
        })
    }

    fn sync_data(&self) -> io::Result<()> {
        self.disk.begin("sync_data", &self.path, 0, 0)?;
        self.disk.with_inode(self.ino, Inode::sync)
    }

    fn sync_all(&self) -> io::Result<()> {
        self.disk.begin("sync_all", &self.path, 0, 0)?;
        self.disk.with_inode(self.ino, Inode::sync)
    }

    fn allocate(&self, from: u64, to: u64) -> io::Result<()> {
        self.disk.begin("allocate", &self.path, from, to - from)?;
        self.disk.with_inode(self.ino, |i| {
            if (i.data.len() as u64) < to {
                i.data.resize(to as usize, 0);
                i.unsynced.push(Change::Len(to));
            }
        })
    }

    fn size(&self) -> io::Result<u64> {
        self.disk.with_inode(self.ino, |i| i.data.len() as u64)
    }

    fn direct(&self) -> bool {
        self.direct
    }

    fn write_align(&self) -> u64 {
        if self.direct {
            self.disk.state().geometry.map_or(512, |g| g.write_align)
        } else {
            1
        }
    }
}

impl Fs for SimDisk {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let rel = self.rel(dir)?;
        let missing: Vec<PathBuf> = {
            let s = self.state();
            rel.ancestors()
                .filter(|a| !a.as_os_str().is_empty() && !s.dirs.contains(*a))
                .map(Path::to_path_buf)
                .collect()
        };
        for d in missing.into_iter().rev() {
            self.begin("mkdir", &self.inner.root.join(&d), 0, 0)?;
            let mut s = self.state();
            s.dirs.insert(d.clone());
            s.pending.push(NsOp::Mkdir(d));
        }
        Ok(())
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let rel = self.rel(dir)?;
        let s = self.state();
        if !s.dirs.contains(&rel) {
            return Err(err(ErrorKind::NotFound, "no such directory"));
        }
        let names = s.names.keys().chain(s.dirs.iter());
        Ok(names
            .filter(|p| p.parent() == Some(rel.as_path()))
            .filter_map(|p| p.file_name()?.to_str().map(str::to_owned))
            .collect())
    }

    fn exists(&self, path: &Path) -> bool {
        let Ok(rel) = self.rel(path) else {
            return false;
        };
        let s = self.state();
        s.names.contains_key(&rel) || s.dirs.contains(&rel)
    }

    fn open(&self, path: &Path, how: Open) -> io::Result<Arc<dyn FsFile>> {
        let rel = self.rel(path)?;
        let (writable, direct, create, truncate) = match how {
            Open::Read => (false, false, false, false),
            Open::Write {
                create,
                truncate,
                direct,
            } => (true, direct, create, truncate),
        };
        let existing = self.state().names.get(&rel).copied();
        let ino = match existing {
            Some(ino) => {
                if truncate {
                    self.begin("truncate", path, 0, 0)?;
                    self.with_inode(ino, |i| {
                        i.data.clear();
                        i.unsynced.push(Change::Len(0));
                    })?;
                }
                ino
            }
            None if create => {
                if !rel.parent().is_some_and(|d| self.state().dirs.contains(d)) {
                    return Err(err(ErrorKind::NotFound, "no such directory"));
                }
                self.begin("create", path, 0, 0)?;
                let mut s = self.state();
                let ino = s.next_ino;
                s.next_ino += 1;
                s.inodes.insert(ino, Inode::default());
                s.names.insert(rel.clone(), ino);
                s.pending.push(NsOp::Link(rel, ino));
                ino
            }
            None => return Err(err(ErrorKind::NotFound, "no such file")),
        };
        Ok(Arc::new(SimFile {
            disk: self.clone(),
            path: path.to_path_buf(),
            ino,
            direct,
            writable,
        }))
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let rel = self.rel(path)?;
        let s = self.state();
        let ino = s
            .names
            .get(&rel)
            .ok_or_else(|| err(ErrorKind::NotFound, "no such file"))?;
        Ok(s.inodes
            .get(ino)
            .map(|i| i.data.clone())
            .unwrap_or_default())
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let rel = self.rel(path)?;
        if !self.state().names.contains_key(&rel) {
            return Err(err(ErrorKind::NotFound, "no such file"));
        }
        self.begin("remove", path, 0, 0)?;
        let mut s = self.state();
        s.names.remove(&rel);
        s.pending.push(NsOp::Unlink(rel));
        Ok(())
    }

    fn remove_dir(&self, dir: &Path) -> io::Result<()> {
        let rel = self.rel(dir)?;
        {
            let s = self.state();
            if !s.dirs.contains(&rel) {
                return Err(err(ErrorKind::NotFound, "no such directory"));
            }
            let mut entries = s.names.keys().chain(s.dirs.iter());
            if entries.any(|p| p.parent() == Some(rel.as_path())) {
                return Err(io::Error::from_raw_os_error(39));
            }
        }
        self.begin("rmdir", dir, 0, 0)?;
        let mut s = self.state();
        s.dirs.remove(&rel);
        s.pending.push(NsOp::Rmdir(rel));
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let (rf, rt) = (self.rel(from)?, self.rel(to)?);
        if !self.state().names.contains_key(&rf) {
            return Err(err(ErrorKind::NotFound, "no such file"));
        }
        self.begin("rename", to, 0, 0)?;
        let mut s = self.state();
        let Some(ino) = s.names.remove(&rf) else {
            return Err(err(ErrorKind::NotFound, "no such file"));
        };
        s.names.insert(rt.clone(), ino);
        // The new name and the old one's removal, in this order: a crash between them (two
        // directories synced apart) leaves the file under both names, never under none.
        s.pending.push(NsOp::Link(rt, ino));
        s.pending.push(NsOp::Unlink(rf));
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let rel = self.rel(dir)?;
        self.begin("sync_dir", dir, 0, 0)?;
        let mut s = self.state();
        let (synced, rest): (Vec<NsOp>, Vec<NsOp>) = std::mem::take(&mut s.pending)
            .into_iter()
            .partition(|op| op.dir() == rel);
        s.pending = rest;
        let State {
            durable_names,
            durable_dirs,
            ..
        } = &mut *s;
        for op in &synced {
            op.apply(durable_names, durable_dirs);
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn w(direct: bool) -> Open {
        Open::Write {
            create: true,
            truncate: false,
            direct,
        }
    }

    #[test]
    fn only_what_was_synced_survives_the_unluckiest_crash() {
        let disk = SimDisk::new("/d", Geometry::N512);
        disk.create_dir_all(Path::new("/d/j")).unwrap();
        disk.sync_dir(Path::new("/d")).unwrap();
        let f = disk.open(Path::new("/d/j/a"), w(false)).unwrap();
        f.write_at(b"synced", 0).unwrap();
        f.sync_data().unwrap();
        disk.sync_dir(Path::new("/d/j")).unwrap();
        f.write_at(b"later!", 6).unwrap();
        let g = disk.open(Path::new("/d/j/b"), w(false)).unwrap();
        g.write_at(b"x", 0).unwrap();
        g.sync_data().unwrap();
        assert_eq!(disk.read(Path::new("/d/j/a")).unwrap(), b"syncedlater!");
        let nothing = disk.crash_now(Keep::Nothing);
        assert_eq!(nothing.files.len(), 1, "b's name was never synced");
        assert_eq!(nothing.files[Path::new("j/a")], b"synced");
        let disk2 = SimDisk::new("/d", Geometry::N512);
        assert!(disk2.crashed().is_none());
        // After the crash every mutating call fails.
        assert!(f.write_at(b"y", 0).is_err());
        assert!(f.sync_data().is_err());
    }

    #[test]
    fn a_failed_fsync_loses_the_writes_and_the_next_one_passes() {
        let disk = SimDisk::new("/d", Geometry::N512);
        let f = disk.open(Path::new("/d/a"), w(false)).unwrap();
        disk.sync_dir(Path::new("/d")).unwrap();
        f.write_at(b"one", 0).unwrap();
        let n = disk.ops();
        disk.set_plan(Plan {
            faults: vec![(n, Fault::Eio)],
            ..Plan::default()
        });
        assert_eq!(f.sync_data().unwrap_err().raw_os_error(), Some(5));
        assert!(f.sync_data().is_ok(), "nothing left to report");
        assert_eq!(
            disk.read(Path::new("/d/a")).unwrap(),
            b"one",
            "still read back"
        );
        let image = disk.crash_now(Keep::Everything);
        assert_eq!(image.files[Path::new("a")], b"", "but never durable");
    }

    #[test]
    fn direct_writes_must_be_aligned_to_the_device() {
        let disk = SimDisk::new("/d", Geometry::K4);
        let f = disk.open(Path::new("/d/a"), w(true)).unwrap();
        assert_eq!(f.write_align(), 4096);
        assert_eq!(
            f.write_at(&[1; 512], 0).unwrap_err().raw_os_error(),
            Some(22)
        );
        f.write_at(&[1; 4096], 4096).unwrap();
        let buffered = disk.open(Path::new("/d/b"), w(false)).unwrap();
        buffered.write_at(&[1; 3], 5).unwrap();
    }

    #[test]
    fn a_torn_partial_sector_write_can_damage_what_was_synced_beside_it() {
        // On a 512e disk a 512-byte write into a 4 KiB sector rewrites the whole sector.
        let mut damaged = 0;
        for seed in 0..64 {
            let disk = SimDisk::new("/d", Geometry::E512);
            let f = disk.open(Path::new("/d/a"), w(true)).unwrap();
            disk.sync_dir(Path::new("/d")).unwrap();
            f.write_at(&[7; 512], 0).unwrap();
            f.sync_data().unwrap();
            f.write_at(&[9; 512], 512).unwrap();
            let image = disk.crash_now(Keep::Random(seed));
            let a = &image.files[Path::new("a")];
            if a.len() < 512 || a[..512] != [7; 512] {
                damaged += 1;
            }
        }
        assert!(damaged > 0, "some crash damages the synced first block");
    }

    #[test]
    fn a_planned_crash_happens_before_its_call_and_runs_the_hook() {
        let disk = SimDisk::new("/d", Geometry::N512);
        let f = disk.open(Path::new("/d/a"), w(false)).unwrap();
        disk.sync_dir(Path::new("/d")).unwrap();
        f.write_at(b"1", 0).unwrap();
        let n = disk.ops();
        let hit = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let h = hit.clone();
        disk.on_crash(move || h.store(true, std::sync::atomic::Ordering::SeqCst));
        disk.set_plan(Plan {
            crash_at: Some(n + 1),
            keep: Some(Keep::Everything),
            faults: vec![],
        });
        f.sync_data().unwrap();
        assert!(f.write_at(b"2", 1).is_err());
        assert!(hit.load(std::sync::atomic::Ordering::SeqCst));
        assert_eq!(disk.crashed().unwrap().files[Path::new("a")], b"1");
        assert_eq!(disk.trace().len() as u64, n + 2);
    }
}
