//! Truncation of a file partition log (`PartitionLog::truncate_from`): a
//! follower drops the divergent tail a deposed leader left it.
//!
//! Crash safety rests on an intent file, `truncation` in the partition
//! directory (the `crate::record` framing, magic `"STRU"`, one record whose
//! payload is the truncation offset as a u64 LE), written atomically and
//! durably before anything is cut and removed once everything is durable.
//! Between the two, the steps are: quarantined ranges at or past the new end
//! are trimmed, the later segments are deleted newest first (index files,
//! `.data`, then `.log`, one directory fsync per segment, so a crash leaves
//! a prefix of the segments), the index files of the segment holding the
//! cut are removed, then its `.log` and `.data` are cut and fdatasync'ed.
//! An open that finds the intent file redoes the truncation before serving
//! anything, so a crash anywhere leaves either the old log (the intent never
//! reached the disk) or the truncated one, and never touches a byte below
//! the cut.

use std::sync::Arc;

use super::cursor::Cursor;
use super::index::SegmentSummary;
use super::segment::{file_name, truncate, Segment};
use super::FileLog;
use crate::record::{self, FILE_HEADER};
use crate::whole_file::{self, StepError};
use crate::{Result, StorageError};

/// Name of the intent file in the partition directory.
pub(super) const MARKER: &str = "truncation";
const MAGIC: [u8; 4] = *b"STRU";

fn step_error(e: StepError) -> StorageError {
    StorageError::io(format!("{} {}", e.step, e.path.display()), e.source)
}

/// What a truncation removes: the segments from `keep` on (`doomed`), and
/// the tail of `target` (the last kept segment) from `cut`.
struct Plan {
    keep: usize,
    doomed: Vec<Arc<Segment>>,
    target: Arc<Segment>,
    cut: Cut,
    /// `target`'s summary once cut.
    summary: SegmentSummary,
}

/// Where a truncation cuts the segment that keeps a prefix.
struct Cut {
    log_pos: u64,
    data_pos: u64,
    /// The log's next offset afterwards.
    next: u64,
}

impl Segment {
    /// The first record holding an offset >= `offset`: its log position,
    /// data position and base offset; `None` if every record ends at or
    /// before `offset`. A damaged record on the way is an error (the cut
    /// cannot be placed without knowing what it held).
    fn first_record_reaching(&self, offset: u64) -> Result<Option<(u64, u64, u64)>> {
        let (start, end) = {
            let s = self.state.read();
            (s.floor_by_rel(offset.saturating_sub(self.base)), s.log_len)
        };
        let pos = start.map_or(0, |e| e.pos);
        let mut cursor = Cursor::new(&*self.log, &self.log_path, pos, end);
        while let Some(rec) = cursor
            .next_record()
            .map_err(|e| e.into_storage(&self.log_path))?
        {
            let h = rec.header;
            if h.end_offset() > offset {
                return Ok(Some((rec.pos, h.data_pos, h.base_offset)));
            }
        }
        Ok(None)
    }

    /// The summary of the records before log position `log_pos`.
    fn summary_before(&self, log_pos: u64, data_pos: u64) -> Result<SegmentSummary> {
        Ok(self
            .scan(SegmentSummary::default(), log_pos, data_pos, false)?
            .summary)
    }

    /// Removes the segment's files, index files first (a stale index left
    /// alone could be taken for a checkpoint of a later segment of the same
    /// base), `.log` last. The caller fsyncs the directory.
    fn remove_files(&self) -> Result<()> {
        for ext in ["index", "timeindex", "data", "log"] {
            let path = self.dir.join(file_name(self.base, ext));
            whole_file::remove_if_exists(&*self.vfs, &path).map_err(step_error)?;
        }
        Ok(())
    }

    /// Cuts the files at `cut`, durably: the index files go first (they
    /// describe more than will be left), then `.log`, then `.data`. The new
    /// summary is published before any byte goes, and under the index lock,
    /// so that no checkpoint of the old length can land after the cut.
    fn cut_files(&self, cut: &Cut, summary: SegmentSummary) -> Result<()> {
        let mut written = self.index_written.lock();
        *self.state.write() = summary;
        self.skip_to(cut.next);
        for ext in ["index", "timeindex"] {
            let path = self.dir.join(file_name(self.base, ext));
            whole_file::remove_if_exists(&*self.vfs, &path).map_err(step_error)?;
        }
        whole_file::sync_dir(&*self.vfs, &self.dir).map_err(step_error)?;
        *written = (0, 0);
        truncate(&*self.log, &self.log_path, cut.log_pos)?;
        truncate(&*self.data, &self.data_path, cut.data_pos)
    }
}

impl FileLog {
    /// `PartitionLog::truncate_from` for the file backend.
    pub(super) fn truncate(&self, offset: u64) -> Result<u64> {
        let mut w = self.writer.lock();
        self.check_failed()?;
        // No seal may write index files of a segment being cut or removed.
        let _sealing = self.sealing.lock();
        {
            let s = self.shared.read();
            if offset >= s.next {
                return Ok(s.next);
            }
            if offset < s.first {
                return Err(s.out_of_range(offset));
            }
        }
        let plan = self.plan(offset)?;
        self.write_marker(offset)?;
        let next = self.apply(plan).map_err(|e| self.fail(e))?;
        self.remove_marker().map_err(|e| self.fail(e))?;
        w.last_ts = self
            .shared
            .read()
            .segments
            .iter()
            .map(|s| s.max_ts())
            .max()
            .unwrap_or(0);
        self.closed
            .store(false, std::sync::atomic::Ordering::Release);
        tracing::info!(dir = %self.dir.display(), offset, next_offset = next, "partition log truncated");
        Ok(next)
    }

    /// Where the truncation at `offset` cuts, read before anything changes.
    fn plan(&self, offset: u64) -> Result<Plan> {
        let (keep, doomed, target) = {
            let s = self.shared.read();
            let keep = s.segments.partition_point(|g| g.base < offset).max(1);
            (
                keep,
                s.segments[keep..].to_vec(),
                s.segments[keep - 1].clone(),
            )
        };
        let cut = match target.first_record_reaching(offset)? {
            Some((log_pos, data_pos, base)) => Cut {
                log_pos,
                data_pos,
                next: base.min(offset),
            },
            None => {
                let (log_pos, data_pos, _, _) = target.lens();
                Cut {
                    log_pos,
                    data_pos,
                    next: offset,
                }
            }
        };
        let summary = target.summary_before(cut.log_pos, cut.data_pos)?;
        Ok(Plan {
            keep,
            doomed,
            target,
            cut,
            summary,
        })
    }

    /// Every step between the intent file's write and its removal.
    fn apply(&self, plan: Plan) -> Result<u64> {
        let Plan {
            keep,
            doomed,
            target,
            cut,
            summary,
        } = plan;
        // Readers stop at the new end before any byte goes.
        {
            let mut s = self.shared.write();
            s.segments.truncate(keep);
            s.next = cut.next;
        }
        self.unsealed
            .lock()
            .retain(|u| !Arc::ptr_eq(u, &target) && !doomed.iter().any(|d| Arc::ptr_eq(u, d)));
        self.quarantine.truncate_from(cut.next)?;
        for seg in doomed.iter().rev() {
            seg.remove_files()?;
            whole_file::sync_dir(&*self.vfs, &self.dir).map_err(step_error)?;
        }
        target.cut_files(&cut, summary)?;
        if let Err(e) = target.checkpoint(&target.summary()) {
            tracing::warn!(dir = %self.dir.display(), segment = target.base, error = %e,
                "could not checkpoint the segment cut by a truncation; the next open rescans it");
        }
        Ok(cut.next)
    }

    /// Writes the intent file. If it may have reached the disk and the
    /// write still failed, the log stops: a reopen then finishes the
    /// truncation (or finds no intent and keeps the old log).
    fn write_marker(&self, offset: u64) -> Result<()> {
        let mut bytes = record::file_header(MAGIC).to_vec();
        bytes.extend_from_slice(&record::encode(1, &offset.to_le_bytes()));
        match whole_file::replace(&*self.vfs, &self.dir, MARKER, &[&bytes]) {
            Ok(_) => Ok(()),
            Err((e, false)) => Err(step_error(e)),
            Err((e, true)) => Err(self.fail(step_error(e))),
        }
    }

    fn remove_marker(&self) -> Result<()> {
        whole_file::remove_if_exists(&*self.vfs, &self.dir.join(MARKER)).map_err(step_error)?;
        whole_file::sync_dir(&*self.vfs, &self.dir).map_err(step_error)
    }

    /// On open: finishes a truncation a crash interrupted, if the intent
    /// file is there.
    pub(super) fn resume_truncation(&self) -> Result<()> {
        let path = self.dir.join(MARKER);
        let Some(bytes) = whole_file::read_all(&*self.vfs, &path).map_err(step_error)? else {
            return Ok(());
        };
        let offset = decode_marker(&bytes).map_err(|reason| {
            StorageError::corrupt(format!(
                "truncation intent {}: {reason}; it is written atomically, so this is damage: \
                 remove it to keep the log as it is, or truncate the log again",
                path.display()
            ))
        })?;
        tracing::warn!(dir = %self.dir.display(), offset, "finishing a truncation interrupted by a crash");
        let first = self.shared.read().first;
        if offset < first {
            return Err(StorageError::corrupt(format!(
                "truncation intent {} asks for offset {offset}, below the log's first offset \
                 {first}",
                path.display()
            )));
        }
        self.truncate(offset)?;
        self.remove_marker()
    }
}

/// The offset an intent file holds, or why it is unreadable.
fn decode_marker(bytes: &[u8]) -> std::result::Result<u64, String> {
    let rec = record::decode_snapshot(bytes, MAGIC, "truncation intent").map_err(|d| d.reason)?;
    let payload: [u8; 8] = rec.payload.try_into().map_err(|_| {
        format!(
            "a payload of {} bytes where an offset of 8 was expected (file header {FILE_HEADER} bytes)",
            rec.payload.len()
        )
    })?;
    Ok(u64::from_le_bytes(payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intent_file_round_trips_and_rejects_damage() {
        let mut bytes = record::file_header(MAGIC).to_vec();
        bytes.extend_from_slice(&record::encode(1, &42u64.to_le_bytes()));
        assert_eq!(decode_marker(&bytes), Ok(42));
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x01;
            assert!(decode_marker(&bad).is_err(), "flipped byte {i}");
        }
        for len in 0..bytes.len() {
            assert!(decode_marker(&bytes[..len]).is_err(), "cut to {len} bytes");
        }
        let mut short = record::file_header(MAGIC).to_vec();
        short.extend_from_slice(&record::encode(1, &[1, 2, 3]));
        assert!(decode_marker(&short).is_err());
    }
}
