//! The registry's file names, its typed storage error, and the file
//! primitives it is built from (`strom_storage::whole_file`: read a whole
//! file, remove one, sync a directory), with their errors, and those of
//! `strom_storage::RecordFile`, as [`StoreError`]. All I/O goes through `strom_storage::vfs`, so tests can
//! run it over a simulated disk that loses unsynced writes.

use std::io;
use std::path::{Path, PathBuf};

use strom_proto::ErrorCode;
use strom_storage::vfs::Vfs;
use strom_storage::whole_file::{self, StepError};
use strom_storage::RecordFileError;

use crate::error::ServerError;

/// The append-only command log.
pub const LOG: &str = "registry.log";
/// The state as of some log index.
pub const SNAPSHOT: &str = "registry.snapshot";
/// The registry of versions before the log, read once and renamed.
pub const OLD_JSON: &str = "registry.json";
pub const OLD_JSON_MIGRATED: &str = "registry.json.migrated";
/// File magics of the log and the snapshot (framing: `strom_storage::record`).
pub const LOG_MAGIC: [u8; 4] = *b"STRG";
pub const SNAPSHOT_MAGIC: [u8; 4] = *b"STRS";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "{} is damaged at byte {offset}: {reason}. The registry cannot be read safely, so the \
         server does not start; restore the data directory from a backup (partition data is \
         stored apart and is not affected)",
        file.display()
    )]
    Corrupt {
        file: PathBuf,
        offset: u64,
        reason: String,
    },
    #[error("I/O error while {context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
    #[error("a registry command of {0} bytes is over the 16 MiB limit of a log record")]
    TooLarge(usize),
    #[error(
        "the registry log is unusable after a failed write that could not be undone ({0}); \
         restart the server"
    )]
    Broken(String),
}

impl StoreError {
    pub fn corrupt(file: &Path, offset: usize, reason: impl Into<String>) -> Self {
        StoreError::Corrupt {
            file: file.to_path_buf(),
            offset: offset as u64,
            reason: reason.into(),
        }
    }

    pub fn io(what: &str, path: &Path, source: io::Error) -> Self {
        StoreError::Io {
            context: format!("{what} {}", path.display()),
            source,
        }
    }
}

impl From<StoreError> for ServerError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Io { context, source } => ServerError::io(context, source),
            StoreError::Corrupt { .. } => ServerError::coded(ErrorCode::CORRUPT, e.to_string()),
            StoreError::TooLarge(_) => {
                ServerError::coded(ErrorCode::INVALID_ARGUMENT, e.to_string())
            }
            StoreError::Broken(_) => ServerError::coded(ErrorCode::STORAGE_IO, e.to_string()),
        }
    }
}

impl From<StepError> for StoreError {
    fn from(e: StepError) -> Self {
        StoreError::io(e.step, &e.path, e.source)
    }
}

impl From<RecordFileError> for StoreError {
    fn from(e: RecordFileError) -> Self {
        match e {
            RecordFileError::Io { step, path, source } => StoreError::io(step, &path, source),
            RecordFileError::Corrupt { path, at, reason } => StoreError::corrupt(&path, at, reason),
            RecordFileError::TooLarge(n) => StoreError::TooLarge(n),
            RecordFileError::Encode(why) | RecordFileError::Broken(why) => StoreError::Broken(why),
        }
    }
}

/// Whether `path` exists.
pub fn exists(vfs: &dyn Vfs, path: &Path) -> Result<bool, StoreError> {
    Ok(whole_file::exists(vfs, path)?)
}

/// The whole contents of `path`, or `None` if it does not exist.
pub fn read_all(vfs: &dyn Vfs, path: &Path) -> Result<Option<Vec<u8>>, StoreError> {
    Ok(whole_file::read_all(vfs, path)?)
}

/// Removes `path` if it exists.
pub fn remove_if_exists(vfs: &dyn Vfs, path: &Path) -> Result<(), StoreError> {
    Ok(whole_file::remove_if_exists(vfs, path)?)
}

pub fn sync_dir(vfs: &dyn Vfs, dir: &Path) -> Result<(), StoreError> {
    Ok(whole_file::sync_dir(vfs, dir)?)
}
