//! The leader-epoch history of a partition: which leader epoch started at
//! which offset, as an ordered list of `(epoch, start_offset)`. A follower
//! asks its leader for the end offset of its own latest epoch (Kafka's
//! OffsetsForLeaderEpoch, [`EpochHistory::end_offset_for`]) and truncates
//! its log (and this history) there before it copies anything, so that a
//! deposed leader's divergent tail goes.
//!
//! The history lives in one small file (for example `leader-epochs` in the
//! partition directory), framed by [`crate::record`]: the file header
//! (magic `"STRE"`, version 1) and one record whose payload is `n` entries
//! of `u64 epoch, u64 start_offset` (little endian). Every change rewrites
//! it whole through [`crate::whole_file::replace`] (temp file, fdatasync,
//! rename, directory fsync) before it returns, so a crash leaves the old
//! history or the new one. Content read back is checked (CRC, sizes, order)
//! before use; damage is `Corrupt` (code 301), never a panic.
//!
//! Storage knows nothing of who the leader is: the caller keeps the log and
//! the history consistent (truncate both at the same offset).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::record::{self, FILE_HEADER, HEADER};
use crate::vfs::Vfs;
use crate::whole_file::{self, StepError};
use crate::{Result, StorageError};

const MAGIC: [u8; 4] = *b"STRE";
/// Bytes of one entry in the payload.
const ENTRY: usize = 16;
/// The most entries a history holds (one per leader change).
pub const MAX_ENTRIES: usize = 1 << 16;
/// The largest file a valid history can be.
const MAX_FILE_LEN: u64 = (FILE_HEADER + HEADER + ENTRY * MAX_ENTRIES) as u64;

/// One leader epoch and the first offset written in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EpochEntry {
    pub epoch: u64,
    pub start_offset: u64,
}

/// The leader-epoch history of one partition, held in memory and in its
/// file. Methods take `&self`; changes are serialized.
pub struct EpochHistory {
    vfs: Arc<dyn Vfs>,
    dir: PathBuf,
    name: String,
    entries: Mutex<Vec<EpochEntry>>,
}

fn step_error(e: StepError) -> StorageError {
    StorageError::io(format!("{} {}", e.step, e.path.display()), e.source)
}

fn encode(entries: &[EpochEntry]) -> Vec<u8> {
    let mut payload = Vec::with_capacity(entries.len() * ENTRY);
    for e in entries {
        payload.extend_from_slice(&e.epoch.to_le_bytes());
        payload.extend_from_slice(&e.start_offset.to_le_bytes());
    }
    let mut bytes = record::file_header(MAGIC).to_vec();
    bytes.extend_from_slice(&record::encode(entries.len() as u64, &payload));
    bytes
}

fn u64_at(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

/// The entries a history file holds, or why it is unreadable.
fn decode(bytes: &[u8]) -> std::result::Result<Vec<EpochEntry>, String> {
    let rec = record::decode_snapshot(bytes, MAGIC, "leader-epoch history")
        .map_err(|d| format!("{} (at byte {})", d.reason, d.at))?;
    let payload = rec.payload;
    if payload.len() % ENTRY != 0 || payload.len() / ENTRY > MAX_ENTRIES {
        return Err(format!(
            "a payload of {} bytes is not a whole number of {ENTRY}-byte entries (at most {MAX_ENTRIES})",
            payload.len()
        ));
    }
    if rec.index != (payload.len() / ENTRY) as u64 {
        return Err(format!(
            "the record says {} entries but holds {}",
            rec.index,
            payload.len() / ENTRY
        ));
    }
    let mut entries: Vec<EpochEntry> = Vec::with_capacity(payload.len() / ENTRY);
    for chunk in payload.chunks_exact(ENTRY) {
        let e = EpochEntry {
            epoch: u64_at(&chunk[..8]),
            start_offset: u64_at(&chunk[8..]),
        };
        if let Some(prev) = entries.last() {
            check_order(prev, e.epoch, e.start_offset)?;
        }
        entries.push(e);
    }
    Ok(entries)
}

/// Epochs strictly increase; start offsets never decrease.
fn check_order(
    prev: &EpochEntry,
    epoch: u64,
    start_offset: u64,
) -> std::result::Result<(), String> {
    if epoch <= prev.epoch {
        return Err(format!(
            "epoch {epoch} follows epoch {}: epochs must increase",
            prev.epoch
        ));
    }
    if start_offset < prev.start_offset {
        return Err(format!(
            "epoch {epoch} starts at offset {start_offset}, before epoch {} (offset {})",
            prev.epoch, prev.start_offset
        ));
    }
    Ok(())
}

impl EpochHistory {
    /// Opens the history kept in the file `path` (empty if the file does
    /// not exist yet: the first `assign` creates it). The parent directory
    /// must exist.
    pub fn open(vfs: Arc<dyn Vfs>, path: &Path) -> Result<Self> {
        let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(StorageError::InvalidArgument(format!(
                "{} is not a file path for a leader-epoch history",
                path.display()
            )));
        };
        let entries = match read_capped(&*vfs, path)? {
            None => Vec::new(),
            Some(bytes) => decode(&bytes).map_err(|reason| {
                StorageError::corrupt(format!(
                    "leader-epoch history {}: {reason}; it is replaced atomically, so this is \
                     damage: restore it from a replica",
                    path.display()
                ))
            })?,
        };
        Ok(EpochHistory {
            vfs,
            dir: dir.to_path_buf(),
            name: name.to_string_lossy().into_owned(),
            entries: Mutex::new(entries),
        })
    }

    /// Every entry, oldest first.
    pub fn entries(&self) -> Vec<EpochEntry> {
        self.entries.lock().clone()
    }

    /// The latest epoch and its start offset.
    pub fn latest(&self) -> Option<EpochEntry> {
        self.entries.lock().last().copied()
    }

    /// Records that `epoch` starts at `start_offset`, durably before it
    /// returns. Epochs strictly increase and start offsets never decrease
    /// (else `InvalidArgument`, nothing written); assigning the latest
    /// epoch again with the same start is a no-op.
    pub fn assign(&self, epoch: u64, start_offset: u64) -> Result<()> {
        let mut entries = self.entries.lock();
        let new = EpochEntry {
            epoch,
            start_offset,
        };
        if let Some(last) = entries.last() {
            if *last == new {
                return Ok(());
            }
            check_order(last, epoch, start_offset).map_err(StorageError::InvalidArgument)?;
        }
        if entries.len() >= MAX_ENTRIES {
            return Err(StorageError::InvalidArgument(format!(
                "a leader-epoch history holds at most {MAX_ENTRIES} epochs"
            )));
        }
        let mut next = entries.clone();
        next.push(new);
        self.persist(&next)?;
        *entries = next;
        tracing::info!(file = %self.dir.join(&self.name).display(), epoch, start_offset,
            "leader epoch assigned");
        Ok(())
    }

    /// Kafka's OffsetsForLeaderEpoch: for the largest epoch <= `epoch`
    /// known here, that epoch and its end offset (the start offset of the
    /// next epoch, or `log_end` for the latest). `None` when every known
    /// epoch is above `epoch` (or none is known): the asker has nothing in
    /// common with this log and truncates to its own start.
    pub fn end_offset_for(&self, epoch: u64, log_end: u64) -> Option<(u64, u64)> {
        let entries = self.entries.lock();
        let i = entries.partition_point(|e| e.epoch <= epoch);
        let found = entries.get(i.checked_sub(1)?)?;
        let end = entries.get(i).map_or(log_end, |next| next.start_offset);
        Some((found.epoch, end))
    }

    /// Drops the entries whose start offset is >= `offset` (the log was
    /// truncated there), durably. A no-op when none does.
    pub fn truncate_from(&self, offset: u64) -> Result<()> {
        let mut entries = self.entries.lock();
        let keep = entries.partition_point(|e| e.start_offset < offset);
        if keep == entries.len() {
            return Ok(());
        }
        let next = entries[..keep].to_vec();
        self.persist(&next)?;
        *entries = next;
        tracing::info!(file = %self.dir.join(&self.name).display(), offset, kept = keep,
            "leader-epoch history truncated");
        Ok(())
    }

    fn persist(&self, entries: &[EpochEntry]) -> Result<()> {
        whole_file::replace(&*self.vfs, &self.dir, &self.name, &[&encode(entries)])
            .map(|_| ())
            .map_err(|(e, _)| step_error(e))
    }
}

/// The whole file at `path` if it exists, refused (as `Corrupt`) when it is
/// larger than any valid history, before anything is allocated.
fn read_capped(vfs: &dyn Vfs, path: &Path) -> Result<Option<Vec<u8>>> {
    if !whole_file::exists(vfs, path).map_err(step_error)? {
        return Ok(None);
    }
    let io = |e| StorageError::io(format!("reading {}", path.display()), e);
    let file = vfs.open(path, false).map_err(io)?;
    let len = file.len().map_err(io)?;
    if len > MAX_FILE_LEN {
        return Err(StorageError::corrupt(format!(
            "leader-epoch history {} is {len} bytes, more than the {MAX_FILE_LEN} a history of \
             {MAX_ENTRIES} epochs takes",
            path.display()
        )));
    }
    let mut buf = vec![0u8; len as usize];
    file.read_exact_at(&mut buf, 0).map_err(io)?;
    Ok(Some(buf))
}

#[cfg(test)]
#[path = "epochs_tests.rs"]
mod tests;
