//! The file interface of the journal engine: every file operation the engine makes on its
//! journal segments, their index files and the catalog goes through [`Fs`], so that the same
//! engine runs on the real file system ([`RealFs`]) and on a simulated disk ([`sim::SimDisk`])
//! that crashes, tears sectors and fails calls where a test tells it to. The keyed state's
//! tree (`lsm-tree`) does its own file I/O, and the data directory's lock is a real file: the
//! simulated disk stands beside them (see [`sim`]).
//!
//! The interface is narrow on purpose: positioned reads and writes, `fdatasync`/`fsync`,
//! allocation, whole-file reads, and the namespace (create, rename, remove, list, sync a
//! directory). Anything more would be one more thing the simulated disk must model.

pub mod sim;

use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::io::{self, ErrorKind};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

/// How a file is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Open {
    /// For reading.
    Read,
    /// For writing: created (empty) when `create`, emptied when `truncate`, and with
    /// `O_DIRECT` when `direct` and the file system takes it ([`FsFile::direct`] says).
    Write {
        create: bool,
        truncate: bool,
        direct: bool,
    },
}

/// An open file.
pub trait FsFile: Send + Sync + Debug {
    /// Reads exactly `buf.len()` bytes at `offset` (an error past the end).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes all of `buf` at `offset`. A file opened with `O_DIRECT` takes only writes whose
    /// offset and length are multiples of [`FsFile::write_align`] (else `EINVAL`).
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// `fdatasync`: the data written so far, and the size, are durable once it returns.
    fn sync_data(&self) -> io::Result<()>;
    /// `fsync`.
    fn sync_all(&self) -> io::Result<()>;
    /// Allocates `[from, to)` without writing it (the file grows to `to` if shorter).
    fn allocate(&self, from: u64, to: u64) -> io::Result<()>;
    /// The file's length.
    fn size(&self) -> io::Result<u64>;
    /// Whether writes bypass the page cache (`O_DIRECT`).
    fn direct(&self) -> bool;
    /// What a write's offset and length must be multiples of: the device's direct-I/O
    /// alignment for a file opened with `O_DIRECT`, 1 otherwise.
    fn write_align(&self) -> u64;
}

/// A file system, as the engine uses it.
pub trait Fs: Send + Sync + Debug {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// The names of the entries of `dir`.
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    fn exists(&self, path: &Path) -> bool;
    fn open(&self, path: &Path, how: Open) -> io::Result<Arc<dyn FsFile>>;
    /// A whole file.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Removes an empty directory.
    fn remove_dir(&self, dir: &Path) -> io::Result<()>;
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Makes the entries of `dir` (creations, renames, removals) durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
}

/// Writes `bytes` as the whole of `path`, atomically: a temporary file beside it, synced,
/// renamed over it, the directory synced. A crash leaves the old file or the new one.
pub(crate) fn write_atomic(fs: &dyn Fs, path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    let written = (|| {
        let f = fs.open(
            &tmp,
            Open::Write {
                create: true,
                truncate: true,
                direct: false,
            },
        )?;
        f.write_at(bytes, 0)?;
        f.sync_all()?;
        fs.rename(&tmp, path)
    })();
    if let Err(e) = written {
        let _ = fs.remove(&tmp);
        return Err(e);
    }
    match path.parent() {
        Some(dir) => fs.sync_dir(dir),
        None => Ok(()),
    }
}

/// Removes `path` and, if it is a directory, everything under it; nothing if it is absent.
pub(crate) fn remove_tree(fs: &dyn Fs, path: &Path) -> io::Result<()> {
    if !fs.exists(path) {
        return Ok(());
    }
    match fs.list(path) {
        Ok(names) => {
            for name in names {
                remove_tree(fs, &path.join(name))?;
            }
            fs.remove_dir(path)
        }
        Err(_) => fs.remove(path),
    }
}

/// The real file system.
#[derive(Debug, Default)]
pub struct RealFs;

impl RealFs {
    /// A shared handle, as the engine takes it.
    pub fn shared() -> Arc<dyn Fs> {
        Arc::new(RealFs)
    }
}

#[derive(Debug)]
struct RealFile {
    file: File,
    direct: bool,
    align: u64,
}

/// The direct-I/O offset alignment of `file` (`statx(STATX_DIOALIGN)`, Linux 6.1+), or
/// 4,096 where the kernel does not say: the sector size of most disks (4Kn, and 512e's
/// physical sectors), a multiple of the others'.
fn dio_align(file: &File) -> u64 {
    #[cfg(target_os = "linux")]
    {
        use rustix::fs::{AtFlags, StatxFlags, statx};
        if let Ok(st) = statx(file, "", AtFlags::EMPTY_PATH, StatxFlags::DIOALIGN)
            && st.stx_mask & StatxFlags::DIOALIGN.bits() != 0
            && st.stx_dio_offset_align > 0
        {
            return u64::from(st.stx_dio_offset_align);
        }
    }
    let _ = file;
    4096
}

impl FsFile for RealFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(buf, offset)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn sync_all(&self) -> io::Result<()> {
        self.file.sync_all()
    }

    fn allocate(&self, from: u64, to: u64) -> io::Result<()> {
        #[cfg(target_os = "linux")]
        {
            match rustix::fs::fallocate(
                &self.file,
                rustix::fs::FallocateFlags::empty(),
                from,
                to - from,
            ) {
                Ok(()) => Ok(()),
                Err(e) if e == rustix::io::Errno::OPNOTSUPP => self.file.set_len(to),
                Err(e) => Err(e.into()),
            }
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = from;
            self.file.set_len(to)
        }
    }

    fn size(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn direct(&self) -> bool {
        self.direct
    }

    fn write_align(&self) -> u64 {
        self.align
    }
}

impl Fs for RealFs {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            if let Some(name) = entry?.file_name().to_str() {
                out.push(name.to_owned());
            }
        }
        Ok(out)
    }

    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }

    fn open(&self, path: &Path, how: Open) -> io::Result<Arc<dyn FsFile>> {
        let Open::Write {
            create,
            truncate,
            direct,
        } = how
        else {
            return Ok(Arc::new(RealFile {
                file: File::open(path)?,
                direct: false,
                align: 1,
            }));
        };
        let mut options = OpenOptions::new();
        options.write(true).create(create).truncate(truncate);
        #[cfg(target_os = "linux")]
        if direct {
            use std::os::unix::fs::OpenOptionsExt;
            let mut with_direct = options.clone();
            with_direct.custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32);
            match with_direct.open(path) {
                Ok(file) => {
                    let align = dio_align(&file);
                    return Ok(Arc::new(RealFile {
                        file,
                        direct: true,
                        align,
                    }));
                }
                // The file system does not take O_DIRECT (tmpfs): buffered writes.
                Err(e) if e.kind() == ErrorKind::InvalidInput => {}
                Err(e) => return Err(e),
            }
        }
        let _ = direct;
        Ok(Arc::new(RealFile {
            file: options.open(path)?,
            direct: false,
            align: 1,
        }))
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        std::fs::read(path)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn remove_dir(&self, dir: &Path) -> io::Result<()> {
        std::fs::remove_dir(dir)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }
}
