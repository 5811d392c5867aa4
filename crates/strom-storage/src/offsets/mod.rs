//! The consumer offset store of one partition: consumer name -> committed
//! offset, in memory or in a [`RecordFile`] (magic `"STRO"`, version 2)
//! whose records are commits ([`codec`]). `RecordFile` owns the file's
//! I/O: open and replay (a torn tail cut with a warning, damage followed by
//! a valid record refused as corrupt), append + fdatasync (a commit is
//! durable when it returns) and compaction (the live map rewritten
//! atomically: temp file, fdatasync, rename, directory fsync).
//!
//! A file of version 1 (this store's own format before it moved onto
//! `RecordFile`, read by [`legacy`]) is upgraded once, when it is opened:
//! its commits are written as a version 2 file that replaces it atomically,
//! so a crash at any point leaves one file or the other, whole, and no
//! commit is lost.

mod codec;
mod legacy;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::record::FILE_HEADER;
use crate::record_file::{self, Format, RecordFile, RecordFileError};
use crate::vfs::{RealFs, Vfs};
use crate::{Result, StorageError};
use codec::{Commit, OffsetCodec, MAX_NAME};

const FORMAT: Format = Format {
    magic: *b"STRO",
    version: 2,
    what: "consumer offset file",
};
/// Compact once the file holds this many records (and twice the live names).
const COMPACT_RECORDS: u64 = 4096;

struct OffsetFile {
    file: RecordFile<OffsetCodec>,
    compact_after: u64,
}

/// Persistent consumer-name -> committed-offset map of one partition.
pub struct OffsetStore {
    map: RwLock<HashMap<String, u64>>,
    file: Option<Mutex<OffsetFile>>,
}

fn storage(e: RecordFileError) -> StorageError {
    StorageError::from_record_file(FORMAT.what, e)
}

/// Every (name, offset) of `map`, sorted by name.
fn sorted(map: &HashMap<String, u64>) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = map.iter().map(|(k, v)| (k.clone(), *v)).collect();
    v.sort();
    v
}

fn commits(entries: Vec<(String, u64)>) -> Vec<Commit> {
    entries
        .into_iter()
        .map(|(name, offset)| Commit { name, offset })
        .collect()
}

/// The first bytes (at most a file header) of `path`, or `None` if it does
/// not exist.
fn read_head(vfs: &dyn Vfs, path: &Path) -> Result<Option<Vec<u8>>> {
    let io = |step: &str| {
        let context = format!("{step} {}", path.display());
        move |e| StorageError::io(context, e)
    };
    if !vfs.exists(path).map_err(io("looking for"))? {
        return Ok(None);
    }
    let f = vfs.open(path, false).map_err(io("opening"))?;
    let len = f.len().map_err(io("reading"))?;
    let mut head = vec![0u8; len.min(FILE_HEADER as u64) as usize];
    f.read_exact_at(&mut head, 0).map_err(io("reading"))?;
    Ok(Some(head))
}

impl OffsetStore {
    /// An ephemeral store (memory partitions).
    pub fn in_memory() -> Self {
        OffsetStore {
            map: RwLock::new(HashMap::new()),
            file: None,
        }
    }

    /// Opens (creating if missing) the offset file at `path`: a torn tail
    /// is cut, damage followed by a valid record is
    /// [`StorageError::Corrupt`], and a version 1 file is upgraded.
    pub fn open(path: &Path) -> Result<Self> {
        Self::open_with(Arc::new(RealFs), path)
    }

    /// [`OffsetStore::open`] over the file system `vfs`.
    ///
    /// A version 1 file is read whole (its valid prefix, as version 1 read
    /// it), then replaced by a version 2 file holding every consumer's
    /// last commit with [`RecordFile::create`] (`<path>.tmp` written and
    /// fdatasync'ed, renamed over `path`, directory fsync'ed). Until that
    /// rename the version 1 file is the one on disk, intact, and the next
    /// open upgrades it again; a leftover `<path>.tmp` is removed.
    pub fn open_with(vfs: Arc<dyn Vfs>, path: &Path) -> Result<Self> {
        let (dir, name) = record_file::split_path(path, FORMAT.what)?;
        let head = read_head(&*vfs, path)?;
        let (file, records) = if head.as_deref().is_some_and(legacy::is_v1) {
            let bytes = crate::whole_file::read_all(&*vfs, path)
                .map_err(|e| storage(e.into()))?
                .unwrap_or_default();
            let (map, valid) = legacy::parse(&bytes);
            if valid < bytes.len() {
                tracing::warn!(path = %path.display(), valid, size = bytes.len(),
                    "dropping a torn or damaged tail of a version 1 offset file");
            }
            let consumers = map.len();
            let opened = RecordFile::create(vfs, dir, name, FORMAT, OffsetCodec, 1, {
                commits(sorted(&map))
            })
            .map_err(storage)?;
            tracing::info!(path = %path.display(), consumers,
                "upgraded the consumer offset file from version 1 to version 2");
            opened
        } else {
            RecordFile::open(vfs, dir, name, FORMAT, OffsetCodec, 1, Vec::new).map_err(storage)?
        };
        let mut map = HashMap::new();
        for r in records {
            map.insert(r.record.name, r.record.offset);
        }
        Ok(OffsetStore {
            map: RwLock::new(map),
            file: Some(Mutex::new(OffsetFile {
                file,
                compact_after: COMPACT_RECORDS,
            })),
        })
    }

    /// Compacts once the file holds `records` records (default 4096) and
    /// at least twice as many as there are consumers. Tests use a small
    /// value to compact often; the in-memory store ignores it.
    pub fn set_compaction_threshold(&self, records: u64) {
        if let Some(file) = &self.file {
            file.lock().compact_after = records;
        }
    }

    /// Records `offset` for consumer `name`; for the file kind it is durable
    /// when this returns.
    pub fn commit(&self, name: &str, offset: u64) -> Result<()> {
        if name.len() > MAX_NAME {
            return Err(StorageError::InvalidArgument(format!(
                "consumer name of {} bytes is longer than {MAX_NAME} bytes",
                name.len()
            )));
        }
        let Some(file) = &self.file else {
            self.map.write().insert(name.to_string(), offset);
            return Ok(());
        };
        let mut f = file.lock();
        let c = Commit {
            name: name.to_string(),
            offset,
        };
        f.file
            .append(std::slice::from_ref(&c), true)
            .map_err(storage)?;
        let live = {
            let mut map = self.map.write();
            map.insert(c.name, offset);
            map.len() as u64
        };
        let records = f.file.records();
        if records >= f.compact_after && records >= 2 * live {
            let entries = commits(self.all());
            match f.file.rewrite(1, &entries) {
                Ok(()) => tracing::debug!(path = %f.file.path().display(), records,
                    live, "compacted the consumer offset file"),
                // The commit is durable either way; a failure before the
                // rename leaves the old file in use, one after it stops
                // later commits (RecordFile refuses them) until a reopen.
                Err(e) => tracing::warn!(path = %f.file.path().display(), error = %e,
                    "consumer offset file compaction failed"),
            }
        }
        Ok(())
    }

    /// The committed offset of consumer `name`, if any.
    pub fn get(&self, name: &str) -> Option<u64> {
        self.map.read().get(name).copied()
    }

    /// Every (consumer name, committed offset), sorted by name.
    pub fn all(&self) -> Vec<(String, u64)> {
        sorted(&self.map.read())
    }
}
