//! What the tier layer (`crate::tier`) needs from a file log: the closed
//! (rolled and sealed) segments it may copy, removal of the oldest local
//! segments under a caller's rule (retention, and local retention of
//! segments already verified in the tier), and read access to a single
//! segment fetched from the tier into a cache directory.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;

use super::read::Walk;
use super::segment::{file_name, OpenMode, Segment};
use super::FileLog;
use crate::memory::check_ranges;
use crate::vfs::Vfs;
use crate::{Result, StorageError, StoredBatch};

/// A closed segment of a file log: rolled away from and sealed, so its
/// `.log` and `.data` files never change again (until retention removes
/// them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClosedSegment {
    pub base: u64,
    /// First offset after the segment.
    pub next: u64,
    /// Newest batch timestamp in the segment.
    pub max_ts: u64,
    /// `.log` + `.data` bytes.
    pub size: u64,
    pub log_path: PathBuf,
    pub data_path: PathBuf,
}

/// One local segment as the removal rule sees it.
pub struct LocalSegment {
    pub base: u64,
    pub next: u64,
    pub max_ts: u64,
    pub size: u64,
}

impl FileLog {
    /// The closed segments, oldest first: every segment but the active one
    /// and those still waiting for their seal.
    pub fn closed_segments(&self) -> Vec<ClosedSegment> {
        let segments = self.shared.read().segments.clone();
        let unsealed = self.unsealed.lock().clone();
        let closed = &segments[..segments.len() - 1];
        closed
            .iter()
            .filter(|s| !unsealed.iter().any(|u| Arc::ptr_eq(u, s)))
            .map(|s| ClosedSegment {
                base: s.base,
                next: s.next_offset(),
                max_ts: s.max_ts(),
                size: s.size(),
                log_path: s.log_path.clone(),
                data_path: s.data_path.clone(),
            })
            .collect()
    }

    /// The file system and directory of the log.
    pub fn vfs(&self) -> &Arc<dyn Vfs> {
        &self.vfs
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Removes the oldest local segments, one at a time, while `drop`
    /// answers true for the oldest one given the local bytes held; never
    /// the active segment. Returns the base offsets removed, oldest first.
    pub fn drop_oldest_while(
        &self,
        mut drop: impl FnMut(&LocalSegment, u64) -> bool,
    ) -> Result<Vec<u64>> {
        let dropped = {
            // Holding the writer lock keeps a roll from racing with the
            // removal; it is released before the files are deleted.
            let _w = self.writer.lock();
            let mut dropped = Vec::new();
            let mut s = self.shared.write();
            let mut total: u64 = s.segments.iter().map(|seg| seg.size()).sum();
            while s.segments.len() > 1 {
                let oldest = &s.segments[0];
                let view = LocalSegment {
                    base: oldest.base,
                    next: oldest.next_offset(),
                    max_ts: oldest.max_ts(),
                    size: oldest.size(),
                };
                if !drop(&view, total) {
                    break;
                }
                total -= view.size;
                dropped.push(s.segments.remove(0));
            }
            s.first = s.segments[0].base;
            dropped
        };
        self.remove_dropped(&dropped)?;
        Ok(dropped.iter().map(|s| s.base).collect())
    }

    /// Deletes the files of segments taken out of the list.
    fn remove_dropped(&self, dropped: &[Arc<Segment>]) -> Result<()> {
        if !dropped.is_empty() {
            // A seal in progress finishes first, and no later one may
            // write index files for removed segments.
            let _sealing = self.sealing.lock();
            self.unsealed
                .lock()
                .retain(|u| !dropped.iter().any(|d| Arc::ptr_eq(u, d)));
        }
        // Oldest first, one directory fsync per segment: a crash can only
        // leave a prefix of the dropped segments removed, never a hole that
        // recovery would take for lost (quarantined) offsets.
        // A failed fsync does not stop the removals: a segment left behind
        // would come back on reopen, after a hole.
        let mut first_error = None;
        for seg in dropped {
            seg.delete_files();
            if let Err(e) = self.vfs.sync_dir(&self.dir) {
                tracing::warn!(dir = %self.dir.display(), error = %e,
                    "could not fsync the directory after removing a segment");
                first_error.get_or_insert(StorageError::io(
                    format!("syncing {}", self.dir.display()),
                    e,
                ));
            }
            tracing::info!(dir = %self.dir.display(), segment = seg.base,
                next_offset = seg.next_offset(), "removed a local segment");
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// A single sealed segment opened read-only from its `.log` and `.data`
/// files in `dir` (a segment fetched from the tier). Opening rebuilds its
/// index by a scan that checks every record CRC.
pub struct SegmentReader {
    seg: Segment,
}

impl SegmentReader {
    pub fn open(vfs: &Arc<dyn Vfs>, dir: &Path, base: u64, index_interval: u64) -> Result<Self> {
        let (seg, gaps) = Segment::open(vfs, dir, base, index_interval, OpenMode::Sealed)?;
        if let Some(&(first, last)) = gaps.first() {
            return Err(StorageError::corrupt(format!(
                "segment {} fetched from the tier holds damaged batches (offsets {first}..={last})",
                dir.join(file_name(base, "log")).display()
            )));
        }
        Ok(SegmentReader { seg })
    }

    /// The batches holding offsets >= `from`, up to `max_bytes` of meta
    /// (at least one).
    pub fn read(&self, from: u64, max_bytes: usize) -> Result<Vec<StoredBatch>> {
        let mut out = Vec::new();
        let mut bytes = 0;
        match self
            .seg
            .read_batches(from, u64::MAX, max_bytes, &mut out, &mut bytes)?
        {
            Walk::Done(_) => Ok(out),
            Walk::Damaged { pos, expected } => Err(self.damaged(pos, expected)),
        }
    }

    pub fn read_data(&self, base: u64, ranges: &[(u64, u64)], out: &mut Vec<Bytes>) -> Result<()> {
        let header = match self.seg.find_batch(base)? {
            Walk::Done(Some(h)) => h,
            Walk::Done(None) => {
                return Err(StorageError::OffsetOutOfRange {
                    requested: base,
                    first: self.seg.base,
                    next: self.seg.next_offset(),
                })
            }
            Walk::Damaged { pos, expected } => return Err(self.damaged(pos, expected)),
        };
        check_ranges(base, header.data_len, ranges)?;
        self.seg.read_data(&header, ranges, out)
    }

    pub fn offset_for_timestamp(&self, ts: u64) -> Result<Option<u64>> {
        self.seg.offset_for_timestamp(ts)
    }

    fn damaged(&self, pos: u64, expected: u64) -> StorageError {
        StorageError::corrupt(format!(
            "tier copy of segment {} is damaged at log position {pos} (offset {expected})",
            self.seg.base
        ))
    }
}
