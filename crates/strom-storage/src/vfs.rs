//! The file operations storage is allowed to use, behind one small trait so
//! that tests can run the real log code over a simulated disk that loses
//! unsynced writes at a crash and injects I/O errors ([`crate::sim`]).
//! [`RealFs`] is the default and maps every call to one syscall.
//!
//! Durability contract (what the simulator enforces): file contents written
//! with `write_all_at`/`set_len` are durable only after that file's
//! `sync_data`; a created, renamed or removed directory entry is durable only
//! after `sync_dir` of its parent directory.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;

use crate::io_util::pwritev_all;

/// An open file, read and written with positional I/O only.
#[allow(clippy::len_without_is_empty)]
pub trait VfsFile: Send + Sync {
    fn len(&self) -> io::Result<u64>;
    /// Reads exactly `buf.len()` bytes at `offset`.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes every buffer of `bufs`, in order, at `offset` (one vectored
    /// write where the platform allows).
    fn write_all_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()>;
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// fdatasync: the contents and size written so far survive power loss.
    fn sync_data(&self) -> io::Result<()>;
}

/// A file system: the directory operations storage uses.
pub trait Vfs: Send + Sync + 'static {
    /// Opens `path` for reading and writing, creating it (empty) if
    /// `create` and it does not exist.
    fn open(&self, path: &Path, create: bool) -> io::Result<Box<dyn VfsFile>>;
    fn exists(&self, path: &Path) -> io::Result<bool>;
    /// Names of the entries of directory `dir`.
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// Creates one directory (its parent must exist).
    fn create_dir(&self, path: &Path) -> io::Result<()>;
    /// Makes the entries of directory `dir` (creations, renames, removals)
    /// durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
}

/// Creates `dir` and any missing ancestors, fsyncing the parent of each
/// directory it creates. Returns whether `dir` was created.
pub(crate) fn create_dir_durable(vfs: &dyn Vfs, dir: &Path) -> io::Result<bool> {
    if vfs.exists(dir)? {
        return Ok(false);
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        create_dir_durable(vfs, parent)?;
    }
    match vfs.create_dir(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(false),
        Err(e) => return Err(e),
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        vfs.sync_dir(parent)?;
    }
    Ok(true)
}

/// The operating system's file system.
#[derive(Clone, Copy, Debug, Default)]
pub struct RealFs;

struct RealFile(File);

impl VfsFile for RealFile {
    fn len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(&self.0, buf, offset)
    }

    fn write_all_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        pwritev_all(&self.0, bufs, offset)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }
}

impl Vfs for RealFs {
    fn open(&self, path: &Path, create: bool) -> io::Result<Box<dyn VfsFile>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .truncate(false)
            .open(path)?;
        Ok(Box::new(RealFile(file)))
    }

    fn exists(&self, path: &Path) -> io::Result<bool> {
        path.try_exists()
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            if let Ok(name) = entry?.file_name().into_string() {
                names.push(name);
            }
        }
        Ok(names)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn create_dir(&self, path: &Path) -> io::Result<()> {
        std::fs::create_dir(path)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }
}
