//! Whole-file primitives over a [`Vfs`], for the small files that are
//! rewritten as a whole (the registry's snapshot, the metadata quorum's
//! log and snapshot): read a file whole, remove one if present, replace
//! one atomically and durably (temp file, fdatasync, rename, fsync of the
//! directory), and create a directory durably. A failure names the step
//! and the path; callers wrap it in their own error type.

use std::io;
use std::path::{Path, PathBuf};

use crate::vfs::{Vfs, VfsFile};

/// One failed step: what was being done, to which path, and why.
#[derive(Debug)]
pub struct StepError {
    /// "opening", "writing", "syncing the directory", ...
    pub step: &'static str,
    pub path: PathBuf,
    pub source: io::Error,
}

fn fail<'a>(step: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> StepError + 'a {
    move |source| StepError {
        step,
        path: path.to_path_buf(),
        source,
    }
}

/// Whether `path` exists.
pub fn exists(vfs: &dyn Vfs, path: &Path) -> Result<bool, StepError> {
    vfs.exists(path).map_err(fail("looking for", path))
}

/// The whole contents of `path`, or `None` if it does not exist. The buffer
/// is as large as the file, never as large as a length read from it.
pub fn read_all(vfs: &dyn Vfs, path: &Path) -> Result<Option<Vec<u8>>, StepError> {
    if !exists(vfs, path)? {
        return Ok(None);
    }
    let f = vfs.open(path, false).map_err(fail("opening", path))?;
    let len = f.len().map_err(fail("reading", path))?;
    let len = usize::try_from(len).map_err(|_| {
        fail("reading", path)(io::Error::new(
            io::ErrorKind::InvalidData,
            "the file is larger than memory can address",
        ))
    })?;
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, 0)
        .map_err(fail("reading", path))?;
    Ok(Some(buf))
}

/// Removes `path` if it exists.
pub fn remove_if_exists(vfs: &dyn Vfs, path: &Path) -> Result<(), StepError> {
    match vfs.remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(fail("removing", path)(e)),
        _ => Ok(()),
    }
}

/// Replaces `dir/name` with the concatenation of `bufs`, atomically and
/// durably, and returns the new file, open (a log goes on appending to
/// it). On failure, the flag says whether the new file already took the
/// name (only the directory sync failed, so a crash may still bring the
/// old file back).
pub fn replace(
    vfs: &dyn Vfs,
    dir: &Path,
    name: &str,
    bufs: &[&[u8]],
) -> Result<Box<dyn VfsFile>, (StepError, bool)> {
    let path = dir.join(name);
    let tmp = dir.join(format!("{name}.tmp"));
    remove_if_exists(vfs, &tmp).map_err(|e| (e, false))?;
    let f = vfs
        .open(&tmp, true)
        .map_err(|e| (fail("creating", &tmp)(e), false))?;
    f.write_all_at(bufs, 0)
        .and_then(|_| f.sync_data())
        .map_err(|e| (fail("writing", &tmp)(e), false))?;
    vfs.rename(&tmp, &path)
        .map_err(|e| (fail("renaming into", &path)(e), false))?;
    sync_dir(vfs, dir).map_err(|e| (e, true))?;
    Ok(f)
}

/// fsyncs the directory `dir`, so the entries just made in it last.
pub fn sync_dir(vfs: &dyn Vfs, dir: &Path) -> Result<(), StepError> {
    vfs.sync_dir(dir)
        .map_err(fail("syncing the directory", dir))
}

/// Creates `dir` (and missing ancestors), fsyncing each new entry's parent.
pub fn create_dir_durable(vfs: &dyn Vfs, dir: &Path) -> Result<(), StepError> {
    if exists(vfs, dir)? {
        return Ok(());
    }
    let parent = dir.parent().filter(|p| !p.as_os_str().is_empty());
    if let Some(parent) = parent {
        create_dir_durable(vfs, parent)?;
    }
    match vfs.create_dir(dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(fail("creating", dir)(e)),
        _ => {}
    }
    match parent {
        Some(parent) => sync_dir(vfs, parent),
        None => Ok(()),
    }
}
