//! The file primitives the durable log and the snapshot file are built
//! from (`strom_storage::whole_file`: read a whole file, replace one
//! atomically and durably, create the data directory durably), with their
//! errors as [`LogError`]. All I/O goes through `strom_storage::vfs`, so a
//! simulated disk can stand in for the real one.

use std::path::Path;

use strom_storage::vfs::{Vfs, VfsFile};
use strom_storage::whole_file::{self, StepError};

use crate::error::LogError;

impl From<StepError> for LogError {
    fn from(e: StepError) -> Self {
        LogError::io(e.step, &e.path, e.source)
    }
}

/// The whole contents of `path`, or `None` if it does not exist.
pub fn read_all(vfs: &dyn Vfs, path: &Path) -> Result<Option<Vec<u8>>, LogError> {
    Ok(whole_file::read_all(vfs, path)?)
}

/// Removes `path` if it exists.
pub fn remove_if_exists(vfs: &dyn Vfs, path: &Path) -> Result<(), LogError> {
    Ok(whole_file::remove_if_exists(vfs, path)?)
}

/// Replaces `dir/name` with the concatenation of `bufs`, atomically and
/// durably, and returns the new file, open. On failure, the flag says
/// whether the new file already took the name.
pub fn replace(
    vfs: &dyn Vfs,
    dir: &Path,
    name: &str,
    bufs: &[&[u8]],
) -> Result<Box<dyn VfsFile>, (LogError, bool)> {
    whole_file::replace(vfs, dir, name, bufs).map_err(|(e, named)| (e.into(), named))
}

/// Creates `dir` (and missing ancestors), fsyncing each new entry's parent.
pub fn create_dir_durable(vfs: &dyn Vfs, dir: &Path) -> Result<(), LogError> {
    Ok(whole_file::create_dir_durable(vfs, dir)?)
}
