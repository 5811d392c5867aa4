//! The copy protocol of one closed segment: for its `.log` then its
//! `.data` file, the local CRC32C is computed, the file is put in the tier
//! (atomically: temporary name, fsync, rename, directory fsync for a
//! directory tier; one PUT or a completed multipart upload for an object
//! store), then read back from the tier and its length and CRC compared
//! with the local ones. Only a segment whose two files both verify is
//! returned, for the caller to record in the manifest.

use std::path::Path;
use std::sync::Arc;

use super::{crc_by_chunks, read_file_range, segment_key, TierStore, TieredSegment};
use crate::file::ClosedSegment;
use crate::vfs::{Vfs, VfsFile};
use crate::{Result, StorageError};

/// Copies `seg` to `store` under `prefix` and verifies the copy.
pub(crate) fn copy_segment(
    store: &dyn TierStore,
    prefix: &str,
    vfs: &Arc<dyn Vfs>,
    seg: &ClosedSegment,
) -> Result<TieredSegment> {
    let log = copy_file(store, prefix, vfs, seg, "log")?;
    let data = copy_file(store, prefix, vfs, seg, "data")?;
    tracing::info!(tier = %store.describe(), segment = seg.base, next_offset = seg.next,
        bytes = log.0 + data.0, "segment copied to the tier and verified");
    Ok(TieredSegment::of(seg, log, data))
}

/// Puts one file of `seg` and verifies it; returns its length and CRC.
fn copy_file(
    store: &dyn TierStore,
    prefix: &str,
    vfs: &Arc<dyn Vfs>,
    seg: &ClosedSegment,
    ext: &str,
) -> Result<(u64, u32)> {
    let local = LocalFile::open(vfs, seg, ext)?;
    let crc = local.crc()?;
    let key = segment_key(prefix, seg.base, ext);
    store.put(&key, &*local.file)?;
    verify(store, &key, local.len, crc)?;
    Ok((local.len, crc))
}

/// One local file of a closed segment (its `.log` or `.data`), open, with
/// its length.
pub(super) struct LocalFile<'a> {
    path: &'a Path,
    pub file: Box<dyn VfsFile>,
    pub len: u64,
}

impl<'a> LocalFile<'a> {
    pub fn open(vfs: &Arc<dyn Vfs>, seg: &'a ClosedSegment, ext: &str) -> Result<Self> {
        let path = if ext == "log" {
            &seg.log_path
        } else {
            &seg.data_path
        };
        let file = vfs
            .open(path, false)
            .map_err(|e| StorageError::io(format!("opening {}", path.display()), e))?;
        let len = file
            .len()
            .map_err(|e| StorageError::io(format!("reading the size of {}", path.display()), e))?;
        Ok(LocalFile { path, file, len })
    }

    /// Its CRC32C, read in chunks.
    pub fn crc(&self) -> Result<u32> {
        crc_by_chunks(self.len, |p, n| {
            read_file_range(&*self.file, p, n)
                .map_err(|e| StorageError::io(format!("reading {}", self.path.display()), e))
        })
    }
}

/// Reads the tier copy back and compares its length and CRC.
fn verify(store: &dyn TierStore, key: &str, len: u64, crc: u32) -> Result<()> {
    let size = store.size(key)?;
    let got = if size == len {
        Some(crc_by_chunks(len, |p, n| store.get_range(key, p, n))?)
    } else {
        None
    };
    if got == Some(crc) {
        return Ok(());
    }
    tracing::error!(tier = %store.describe(), key, size, len, "the tier copy does not match the local file; the local segment is kept");
    Err(StorageError::corrupt(format!(
        "tier copy {key} in {} does not match the local file ({size} bytes, crc {got:?}; \
         local {len} bytes, crc {crc:#010x}); the local segment is kept and the copy is \
         retried on the next pass",
        store.describe()
    )))
}
