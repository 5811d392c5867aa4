//! One segment of a file partition log: its four files (`.log`, `.data`,
//! `.index`, `.timeindex`), its in-memory sparse index, opening (recovery of
//! the active segment, index loading/rebuilding of sealed segments; the
//! scans themselves are in `scan.rs`), the write path and sealing. The read
//! paths are in `read.rs`.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::{Mutex, RwLock};

use super::index::{IndexEntry, SegmentSummary};
use super::record::RecordHeader;
use crate::vfs::{Vfs, VfsFile};
use crate::{Result, StorageError};

/// Largest index file read to learn how far a checkpoint that no longer fits
/// its shrunken log reached.
const CHECKPOINT_FLOOR_MAX: u64 = 64 << 20;

/// Data is read in chunks of this size when verifying data CRCs.
pub(super) const DATA_CHUNK: u64 = 1 << 20;

pub(crate) const EXTENSIONS: [&str; 4] = ["log", "data", "index", "timeindex"];

/// `<base as 20 digits>.<ext>`
pub(crate) fn file_name(base: u64, ext: &str) -> String {
    format!("{base:020}.{ext}")
}

/// How to open a segment found on disk.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum OpenMode {
    /// The last segment: scan every record, verify meta and data CRCs,
    /// truncate the torn or corrupt tail.
    Active,
    /// Any other segment: load the index files, or rebuild them by a scan.
    Sealed,
}

/// A failed append: the error, and whether the files were truncated back to
/// their previous lengths.
pub(crate) struct AppendFailure {
    pub error: StorageError,
    pub rolled_back: bool,
}

/// Offset ranges `(first, last)` found damaged while opening a segment.
pub(crate) type Gaps = Vec<(u64, u64)>;

pub(crate) struct Segment {
    pub base: u64,
    pub(super) log: Box<dyn VfsFile>,
    pub(super) data: Box<dyn VfsFile>,
    pub(super) vfs: Arc<dyn Vfs>,
    pub(super) dir: PathBuf,
    pub(super) log_path: PathBuf,
    pub(super) data_path: PathBuf,
    pub(super) index_interval: u64,
    pub(super) state: RwLock<SegmentSummary>,
    /// `(log_len, log_len + data_len)` covered by the index files on disk;
    /// held while they are written, so that writes never interleave and an
    /// older checkpoint never replaces a newer one.
    pub(super) index_written: Mutex<(u64, u64)>,
}

fn open_rw(vfs: &dyn Vfs, path: &Path) -> Result<Box<dyn VfsFile>> {
    vfs.open(path, true)
        .map_err(|e| StorageError::io(format!("opening {}", path.display()), e))
}

fn file_len(file: &dyn VfsFile, path: &Path) -> Result<u64> {
    file.len()
        .map_err(|e| StorageError::io(format!("reading the size of {}", path.display()), e))
}

pub(super) fn truncate(file: &dyn VfsFile, path: &Path, len: u64) -> Result<()> {
    file.set_len(len)
        .and_then(|_| file.sync_data())
        .map_err(|e| StorageError::io(format!("truncating {} to {len} bytes", path.display()), e))
}

/// Reads a whole index file if it exists and is not larger than `max_len`.
fn read_small_file(vfs: &dyn Vfs, path: &Path, max_len: u64) -> io::Result<Vec<u8>> {
    let file = vfs.open(path, false)?;
    let len = file.len()?;
    if len > max_len {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "index file too large",
        ));
    }
    let mut buf = vec![0u8; len as usize];
    file.read_exact_at(&mut buf, 0)?;
    Ok(buf)
}

fn write_synced(vfs: &dyn Vfs, path: &Path, bytes: &[u8]) -> io::Result<()> {
    let file = vfs.open(path, true)?;
    file.set_len(0)?;
    file.write_all_at(&[bytes], 0)?;
    file.sync_data()
}

/// Adds the record at `pos` to `s`, with an index entry if due or `force`d
/// (the first record after a damaged range always gets one, so that readers
/// can start right after the range).
pub(super) fn note_record(
    s: &mut SegmentSummary,
    base: u64,
    interval: u64,
    pos: u64,
    h: &RecordHeader,
    force: bool,
) {
    let due = match s.entries.last() {
        None => true,
        Some(last) => force || pos - last.pos >= interval,
    };
    if due {
        s.entries.push(IndexEntry {
            rel: h.base_offset - base,
            pos,
            ts: h.timestamp_us,
        });
    }
    s.log_len = pos + h.record_len();
    s.data_len = h.data_pos + h.data_len;
    s.next_rel = h.end_offset() - base;
    s.max_ts = s.max_ts.max(h.timestamp_us);
}

impl Segment {
    fn open_files(vfs: &Arc<dyn Vfs>, dir: &Path, base: u64, interval: u64) -> Result<Self> {
        let log_path = dir.join(file_name(base, "log"));
        let data_path = dir.join(file_name(base, "data"));
        Ok(Segment {
            base,
            log: open_rw(&**vfs, &log_path)?,
            data: open_rw(&**vfs, &data_path)?,
            vfs: vfs.clone(),
            dir: dir.to_path_buf(),
            log_path,
            data_path,
            index_interval: interval,
            state: RwLock::new(SegmentSummary::default()),
            index_written: Mutex::new((0, 0)),
        })
    }

    /// Creates a new, empty segment (the files may exist but must be empty:
    /// leftovers of an interrupted roll).
    /// The caller fsyncs the directory.
    pub(crate) fn create(vfs: &Arc<dyn Vfs>, dir: &Path, base: u64, interval: u64) -> Result<Self> {
        let seg = Self::open_files(vfs, dir, base, interval)?;
        if file_len(&*seg.log, &seg.log_path)? != 0 || file_len(&*seg.data, &seg.data_path)? != 0 {
            return Err(StorageError::corrupt(format!(
                "segment {base} in {} already exists and is not empty",
                dir.display()
            )));
        }
        Ok(seg)
    }

    /// Opens a segment found on disk (the same path for a fresh start and a
    /// restart after a crash). Returns the damaged offset ranges found inside
    /// it (the caller quarantines them before serving anything).
    pub(crate) fn open(
        vfs: &Arc<dyn Vfs>,
        dir: &Path,
        base: u64,
        interval: u64,
        mode: OpenMode,
    ) -> Result<(Self, Gaps)> {
        let seg = Self::open_files(vfs, dir, base, interval)?;
        let log_size = file_len(&*seg.log, &seg.log_path)?;
        let data_size = file_len(&*seg.data, &seg.data_path)?;
        let (summary, gaps) = match mode {
            // The index files of the active segment are a checkpoint of a
            // durable prefix (written after a sync, and on clean close):
            // only the log past it is scanned.
            OpenMode::Active => match seg.load_index(log_size, data_size, false) {
                Ok(checkpoint) => {
                    let covered = checkpoint.log_len;
                    *seg.index_written.lock() = (covered, covered + checkpoint.data_len);
                    tracing::debug!(
                        segment = base,
                        covered,
                        log_size,
                        "recovering past a checkpoint"
                    );
                    seg.recover(checkpoint, log_size, data_size)?
                }
                Err(reason) => {
                    tracing::debug!(
                        segment = base,
                        reason,
                        "no usable checkpoint; scanning the whole segment"
                    );
                    let (summary, mut gaps) =
                        seg.recover(SegmentSummary::default(), log_size, data_size)?;
                    // A valid checkpoint that no longer fits means durable
                    // bytes were lost (the files shrank): its offsets were
                    // assigned and must stay quarantined, never reused.
                    let end = base + summary.next_rel;
                    if let Ok(ckpt) = seg.decode_index(CHECKPOINT_FLOOR_MAX) {
                        let ckpt_end = base.saturating_add(ckpt.next_rel);
                        if ckpt_end > end {
                            tracing::error!(segment = base, end, ckpt_end,
                                "the active segment lost durable batches; quarantining their offsets");
                            gaps.push((end, ckpt_end - 1));
                        }
                    }
                    (summary, gaps)
                }
            },
            OpenMode::Sealed => match seg.load_index(log_size, data_size, true) {
                Ok(s) => {
                    *seg.index_written.lock() = (s.log_len, s.log_len + s.data_len);
                    (s, Vec::new())
                }
                // No index files for the whole log: the log rolled away
                // from this segment but a crash came before its seal (the
                // seal runs off the append path), or they were lost. Its
                // data may be as torn as an active segment's, so it is
                // recovered the same way: every CRC checked, a torn tail cut
                // (the caller quarantines the offsets it held).
                Err(reason) => {
                    tracing::info!(segment = base, dir = %dir.display(), reason, "rebuilding segment index");
                    let (summary, gaps) =
                        seg.recover(SegmentSummary::default(), log_size, data_size)?;
                    // `checkpoint` writes nothing beyond the segment's state.
                    *seg.state.write() = summary.clone();
                    if let Err(e) = seg.checkpoint(&summary) {
                        tracing::warn!(segment = base, error = %e, "could not write rebuilt index files");
                    }
                    (summary, gaps)
                }
            },
        };
        *seg.state.write() = summary;
        Ok((seg, gaps))
    }

    /// Loads the index files; they must cover the whole log if `exact`, a
    /// prefix of it otherwise.
    fn load_index(
        &self,
        log_size: u64,
        data_size: u64,
        exact: bool,
    ) -> std::result::Result<SegmentSummary, String> {
        let s = self.decode_index(SegmentSummary::max_index_file_len(log_size))?;
        if s.log_len > log_size || (exact && s.log_len != log_size) {
            return Err(format!(
                "index covers {} log bytes, log has {log_size}",
                s.log_len
            ));
        }
        if s.data_len > data_size {
            return Err(format!(
                "index covers {} data bytes, data has {data_size}",
                s.data_len
            ));
        }
        Ok(s)
    }

    /// Reads and checks both index files (each at most `max` bytes).
    fn decode_index(&self, max: u64) -> std::result::Result<SegmentSummary, String> {
        let vfs = &*self.vfs;
        let oi = read_small_file(vfs, &self.dir.join(file_name(self.base, "index")), max)
            .map_err(|e| format!("offset index unreadable: {e}"))?;
        let ti = read_small_file(vfs, &self.dir.join(file_name(self.base, "timeindex")), max)
            .map_err(|e| format!("time index unreadable: {e}"))?;
        SegmentSummary::decode(&oi, &ti).map_err(str::to_string)
    }

    fn write_index(&self, s: &SegmentSummary) -> Result<()> {
        for (ext, bytes) in [
            ("index", s.encode_offset_index()),
            ("timeindex", s.encode_time_index()),
        ] {
            let path = self.dir.join(file_name(self.base, ext));
            write_synced(&*self.vfs, &path, &bytes)
                .map_err(|e| StorageError::io(format!("writing {}", path.display()), e))?;
        }
        // The index files may be new entries of the directory.
        self.vfs
            .sync_dir(&self.dir)
            .map_err(|e| StorageError::io(format!("syncing {}", self.dir.display()), e))
    }

    /// Removes all four files of the segment (retention).
    pub(crate) fn delete_files(&self) {
        for ext in EXTENSIONS {
            let path = self.dir.join(file_name(self.base, ext));
            if let Err(e) = self.vfs.remove_file(&path) {
                if e.kind() != io::ErrorKind::NotFound {
                    tracing::warn!(path = %path.display(), error = %e, "could not remove a segment file");
                }
            }
        }
    }

    /// (log_len, data_len, next_offset, max_ts)
    pub(crate) fn lens(&self) -> (u64, u64, u64, u64) {
        let s = self.state.read();
        (s.log_len, s.data_len, self.base + s.next_rel, s.max_ts)
    }

    /// True when the `.log` file itself is empty (not just its valid prefix).
    pub(crate) fn log_file_is_empty(&self) -> Result<bool> {
        Ok(file_len(&*self.log, &self.log_path)? == 0)
    }

    pub(crate) fn size(&self) -> u64 {
        let s = self.state.read();
        s.log_len + s.data_len
    }

    pub(crate) fn next_offset(&self) -> u64 {
        self.base + self.state.read().next_rel
    }

    /// Makes the next append start at `offset` (> the last batch): the
    /// offsets in between were assigned before and are quarantined.
    pub(crate) fn skip_to(&self, offset: u64) {
        let mut s = self.state.write();
        s.next_rel = s.next_rel.max(offset - self.base);
    }

    pub(crate) fn max_ts(&self) -> u64 {
        self.state.read().max_ts
    }

    /// Writes one batch at the current end (writer thread only): data first,
    /// then the log record, then the in-memory index. On error the files are
    /// truncated back so that the next append starts from a clean end; the
    /// error says whether that worked.
    pub(crate) fn append(
        &self,
        h: &RecordHeader,
        meta: &[u8],
        data: &[Bytes],
    ) -> std::result::Result<(), AppendFailure> {
        let (log_pos, data_pos) = {
            let s = self.state.read();
            (s.log_len, s.data_len)
        };
        debug_assert_eq!(h.data_pos, data_pos);
        if h.data_len > 0 {
            let bufs: Vec<&[u8]> = data.iter().map(|b| &b[..]).collect();
            if let Err(e) = self.data.write_all_at(&bufs, data_pos) {
                let rolled_back = self.data.set_len(data_pos).is_ok();
                return Err(AppendFailure {
                    error: StorageError::io(
                        format!(
                            "writing the data of batch {} to {}",
                            h.base_offset,
                            self.data_path.display()
                        ),
                        e,
                    ),
                    rolled_back,
                });
            }
        }
        let head = h.encode(meta);
        if let Err(e) = self.log.write_all_at(&[&head[..], meta], log_pos) {
            let rolled_back =
                self.log.set_len(log_pos).is_ok() && self.data.set_len(data_pos).is_ok();
            return Err(AppendFailure {
                error: StorageError::io(
                    format!(
                        "writing the record of batch {} to {}",
                        h.base_offset,
                        self.log_path.display()
                    ),
                    e,
                ),
                rolled_back,
            });
        }
        note_record(
            &mut self.state.write(),
            self.base,
            self.index_interval,
            log_pos,
            h,
            false,
        );
        Ok(())
    }

    /// fdatasync of the data file, then the log file.
    pub(crate) fn sync(&self) -> Result<()> {
        self.data
            .sync_data()
            .map_err(|e| StorageError::io(format!("syncing {}", self.data_path.display()), e))?;
        self.log
            .sync_data()
            .map_err(|e| StorageError::io(format!("syncing {}", self.log_path.display()), e))
    }

    /// The in-memory summary (to checkpoint once it is durable).
    pub(crate) fn summary(&self) -> SegmentSummary {
        self.state.read().clone()
    }

    /// Whether `log + data` grew by `every` bytes since the index files were
    /// last written.
    pub(crate) fn checkpoint_due(&self, every: u64) -> bool {
        let size = self.size();
        size >= self.index_written.lock().1.saturating_add(every)
    }

    /// Writes `summary` (which must describe durable bytes) as the index
    /// files, unless newer ones are already there.
    pub(crate) fn checkpoint(&self, summary: &SegmentSummary) -> Result<()> {
        let mut written = self.index_written.lock();
        // Older than what is on disk, or describing bytes a truncation
        // has cut since it was taken.
        if summary.log_len < written.0 || summary.log_len > self.state.read().log_len {
            return Ok(());
        }
        self.write_index(summary)?;
        *written = (summary.log_len, summary.log_len + summary.data_len);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_are_zero_padded_base_offsets() {
        assert_eq!(file_name(42, "log"), "00000000000000000042.log");
        assert_eq!(
            file_name(u64::MAX, "timeindex"),
            "18446744073709551615.timeindex"
        );
    }
}
