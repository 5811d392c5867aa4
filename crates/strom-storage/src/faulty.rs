//! The operating system's file system with I/O errors injected on demand,
//! for tests that run the real `strom server` binary (a full disk, a
//! failing fdatasync on one member). [`crate::sim`] does the same over a
//! simulated disk, for tests inside one process.
//!
//! A *control file* says which faults are in force. It is read again before
//! every write and sync, so a test changes the faults of a running server
//! by rewriting it (atomically: write a temporary file, rename it). Each
//! line is `OP ERRNO [PATH-PART]`:
//!
//! - `OP`: `write` (writes and growing `set_len`) or `sync` (`sync_data`
//!   and `sync_dir`);
//! - `ERRNO`: `EIO`, `ENOSPC` or `EDQUOT`;
//! - `PATH-PART`: only paths containing this text (all when absent).
//!
//! A missing or empty control file injects nothing. A failed `sync_data`
//! also cuts the file back to its length at its last successful sync: the
//! kernel may drop the dirty pages of a failed fdatasync, and this makes
//! the loss visible after a restart instead of leaving it to chance.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::sim::FaultOp;
use crate::vfs::{RealFs, Vfs, VfsFile};

/// [`RealFs`] with the faults its control file names.
#[derive(Clone, Debug)]
pub struct FaultyFs {
    control: Arc<PathBuf>,
}

/// One line of the control file.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Rule {
    op: FaultOp,
    errno: i32,
    path_part: String,
}

fn parse_errno(name: &str) -> Option<i32> {
    match name {
        "EIO" => Some(libc::EIO),
        "ENOSPC" => Some(libc::ENOSPC),
        "EDQUOT" => Some(libc::EDQUOT),
        _ => None,
    }
}

/// The rules of a control file's text; lines that do not parse are
/// skipped with a warning.
fn parse(text: &str) -> Vec<Rule> {
    let mut rules = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let mut words = line.split_whitespace();
        let op = match words.next() {
            Some("write") => Some(FaultOp::Write),
            Some("sync") => Some(FaultOp::Sync),
            _ => None,
        };
        let errno = words.next().and_then(parse_errno);
        let path_part = words.next().unwrap_or("").to_string();
        match (op, errno) {
            (Some(op), Some(errno)) => rules.push(Rule {
                op,
                errno,
                path_part,
            }),
            _ => tracing::warn!(
                line,
                "ignoring a fault-injection line (want `write|sync EIO|ENOSPC|EDQUOT [PATH-PART]`)"
            ),
        }
    }
    rules
}

impl FaultyFs {
    /// Faults as `control` names them, whenever it is read.
    pub fn new(control: &Path) -> FaultyFs {
        FaultyFs {
            control: Arc::new(control.to_path_buf()),
        }
    }

    /// The error an `op` on `path` gets now, if any.
    fn check(&self, op: FaultOp, path: &Path) -> io::Result<()> {
        let Ok(text) = std::fs::read_to_string(&*self.control) else {
            return Ok(());
        };
        let shown = path.to_string_lossy();
        match parse(&text)
            .into_iter()
            .find(|r| r.op == op && shown.contains(r.path_part.as_str()))
        {
            Some(r) => Err(io::Error::from_raw_os_error(r.errno)),
            None => Ok(()),
        }
    }
}

struct FaultyFile {
    inner: Box<dyn VfsFile>,
    path: PathBuf,
    fs: FaultyFs,
    /// The file's length at its last successful `sync_data` (or open).
    synced: AtomicU64,
}

impl VfsFile for FaultyFile {
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_exact_at(buf, offset)
    }

    fn write_all_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        self.fs.check(FaultOp::Write, &self.path)?;
        self.inner.write_all_at(bufs, offset)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        if len > self.inner.len()? {
            self.fs.check(FaultOp::Write, &self.path)?;
        }
        self.inner.set_len(len)?;
        self.synced.fetch_min(len, Ordering::AcqRel);
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        if let Err(e) = self.fs.check(FaultOp::Sync, &self.path) {
            // What the failed sync was to make durable is gone.
            let synced = self.synced.load(Ordering::Acquire);
            if self.inner.len()? > synced {
                self.inner.set_len(synced)?;
            }
            return Err(e);
        }
        self.inner.sync_data()?;
        self.synced.store(self.inner.len()?, Ordering::Release);
        Ok(())
    }
}

impl Vfs for FaultyFs {
    fn open(&self, path: &Path, create: bool) -> io::Result<Box<dyn VfsFile>> {
        let inner = RealFs.open(path, create)?;
        let synced = AtomicU64::new(inner.len()?);
        Ok(Box::new(FaultyFile {
            inner,
            path: path.to_path_buf(),
            fs: self.clone(),
            synced,
        }))
    }

    fn exists(&self, path: &Path) -> io::Result<bool> {
        RealFs.exists(path)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        RealFs.list(dir)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        RealFs.rename(from, to)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        RealFs.remove_file(path)
    }

    fn create_dir(&self, path: &Path) -> io::Result<()> {
        RealFs.create_dir(path)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.check(FaultOp::Sync, dir)?;
        RealFs.sync_dir(dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_control_file_names_the_faults_in_force() {
        let tmp = tempfile::tempdir().unwrap();
        let control = tmp.path().join("faults");
        let fs = FaultyFs::new(&control);
        let f = fs.open(&tmp.path().join("a.log"), true).unwrap();
        f.write_all_at(&[b"held"], 0).unwrap();
        f.sync_data().unwrap();
        std::fs::write(&control, "write ENOSPC\nsync EIO b.log\nbogus\n").unwrap();
        let e = f.write_all_at(&[b"more"], 4).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC));
        f.sync_data().expect("the sync fault names another file");
        std::fs::write(&control, "sync EIO a.log").unwrap();
        f.write_all_at(&[b"lost"], 4).unwrap();
        let e = f.sync_data().unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO));
        assert_eq!(f.len().unwrap(), 4, "the unsynced tail is cut");
        std::fs::remove_file(&control).unwrap();
        f.write_all_at(&[b"back"], 4).unwrap();
        f.sync_data().unwrap();
        let mut buf = [0u8; 8];
        f.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"heldback");
    }
}
