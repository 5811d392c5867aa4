//! The file primitives the durable log and the snapshot file are built
//! from: read a whole file, replace a file atomically and durably (temp
//! file, fdatasync, rename, fsync of the directory), and create the data
//! directory durably. All I/O goes through `strom_storage::vfs`, so a
//! simulated disk can stand in for the real one.

use std::io;
use std::path::Path;

use strom_storage::vfs::{Vfs, VfsFile};

use crate::error::LogError;

/// Whether `path` exists.
pub fn exists(vfs: &dyn Vfs, path: &Path) -> Result<bool, LogError> {
    vfs.exists(path)
        .map_err(|e| LogError::io("looking for", path, e))
}

/// The whole contents of `path`, or `None` if it does not exist. The buffer
/// is as large as the file, never as large as a length read from it.
pub fn read_all(vfs: &dyn Vfs, path: &Path) -> Result<Option<Vec<u8>>, LogError> {
    if !exists(vfs, path)? {
        return Ok(None);
    }
    let f = vfs
        .open(path, false)
        .map_err(|e| LogError::io("opening", path, e))?;
    let len = f.len().map_err(|e| LogError::io("reading", path, e))?;
    let len = usize::try_from(len).map_err(|_| LogError::corrupt(path, 0, "too large"))?;
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, 0)
        .map_err(|e| LogError::io("reading", path, e))?;
    Ok(Some(buf))
}

/// Removes `path` if it exists.
pub fn remove_if_exists(vfs: &dyn Vfs, path: &Path) -> Result<(), LogError> {
    match vfs.remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(LogError::io("removing", path, e)),
        _ => Ok(()),
    }
}

/// Replaces `dir/name` with the concatenation of `bufs`, atomically and
/// durably, and returns the new file, open. On failure, the flag says
/// whether the new file already took the name (only the directory sync
/// failed, so a crash may still bring the old file back).
pub fn replace(
    vfs: &dyn Vfs,
    dir: &Path,
    name: &str,
    bufs: &[&[u8]],
) -> Result<Box<dyn VfsFile>, (LogError, bool)> {
    let path = dir.join(name);
    let tmp = dir.join(format!("{name}.tmp"));
    remove_if_exists(vfs, &tmp).map_err(|e| (e, false))?;
    let f = vfs
        .open(&tmp, true)
        .map_err(|e| (LogError::io("creating", &tmp, e), false))?;
    f.write_all_at(bufs, 0)
        .and_then(|_| f.sync_data())
        .map_err(|e| (LogError::io("writing", &tmp, e), false))?;
    vfs.rename(&tmp, &path)
        .map_err(|e| (LogError::io("renaming into", &path, e), false))?;
    vfs.sync_dir(dir)
        .map_err(|e| (LogError::io("syncing the directory", dir, e), true))?;
    Ok(f)
}

/// Creates `dir` (and missing ancestors), fsyncing each new entry's parent.
pub fn create_dir_durable(vfs: &dyn Vfs, dir: &Path) -> Result<(), LogError> {
    if exists(vfs, dir)? {
        return Ok(());
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        create_dir_durable(vfs, parent)?;
    }
    match vfs.create_dir(dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
            return Err(LogError::io("creating", dir, e))
        }
        _ => {}
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        vfs.sync_dir(parent)
            .map_err(|e| LogError::io("syncing the directory", parent, e))?;
    }
    Ok(())
}
