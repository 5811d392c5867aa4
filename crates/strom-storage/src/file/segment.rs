//! One segment of a file partition log: its four files (`.log`, `.data`,
//! `.index`, `.timeindex`), its in-memory sparse index, recovery of the
//! active segment, index loading/rebuilding of sealed segments, and the
//! per-segment read paths.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

use bytes::{Bytes, BytesMut};
use parking_lot::RwLock;

use super::cursor::{Cursor, ScanError};
use super::index::{IndexEntry, SegmentSummary};
use super::record::RecordHeader;
use crate::io_util::{pwritev_all, read_exact_at};
use crate::{Result, StorageError, StoredBatch};

/// Data is read in chunks of this size when verifying data CRCs.
const DATA_CHUNK: u64 = 1 << 20;

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

pub(crate) struct Segment {
    pub base: u64,
    log: File,
    data: File,
    dir: PathBuf,
    log_path: PathBuf,
    data_path: PathBuf,
    index_interval: u64,
    state: RwLock<SegmentSummary>,
}

fn open_rw(path: &Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| StorageError::io(format!("opening {}", path.display()), e))
}

fn file_len(file: &File, path: &Path) -> Result<u64> {
    file.metadata()
        .map(|m| m.len())
        .map_err(|e| StorageError::io(format!("reading the size of {}", path.display()), e))
}

fn truncate(file: &File, path: &Path, len: u64) -> Result<()> {
    file.set_len(len)
        .and_then(|_| file.sync_data())
        .map_err(|e| StorageError::io(format!("truncating {} to {len} bytes", path.display()), e))
}

/// Reads a whole index file if it exists and is not larger than `max_len`.
fn read_small_file(path: &Path, max_len: u64) -> io::Result<Vec<u8>> {
    let len = std::fs::metadata(path)?.len();
    if len > max_len {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "index file too large",
        ));
    }
    std::fs::read(path)
}

fn write_synced(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    pwritev_all(&file, &[bytes], 0)?;
    file.sync_data()
}

/// Adds the record at `pos` to `s`, with an index entry if due.
fn note_record(s: &mut SegmentSummary, base: u64, interval: u64, pos: u64, h: &RecordHeader) {
    let due = match s.entries.last() {
        None => true,
        Some(last) => pos - last.pos >= interval,
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
    fn open_files(dir: &Path, base: u64, interval: u64) -> Result<Self> {
        let log_path = dir.join(file_name(base, "log"));
        let data_path = dir.join(file_name(base, "data"));
        Ok(Segment {
            base,
            log: open_rw(&log_path)?,
            data: open_rw(&data_path)?,
            dir: dir.to_path_buf(),
            log_path,
            data_path,
            index_interval: interval,
            state: RwLock::new(SegmentSummary::default()),
        })
    }

    /// Creates a new, empty segment (the files may exist but must be empty:
    /// leftovers of an interrupted roll).
    pub(crate) fn create(dir: &Path, base: u64, interval: u64) -> Result<Self> {
        let seg = Self::open_files(dir, base, interval)?;
        if file_len(&seg.log, &seg.log_path)? != 0 || file_len(&seg.data, &seg.data_path)? != 0 {
            return Err(StorageError::corrupt(format!(
                "segment {base} in {} already exists and is not empty",
                dir.display()
            )));
        }
        Ok(seg)
    }

    /// Opens a segment found on disk (the same path for a fresh start and a
    /// restart after a crash).
    pub(crate) fn open(dir: &Path, base: u64, interval: u64, mode: OpenMode) -> Result<Self> {
        let seg = Self::open_files(dir, base, interval)?;
        let log_size = file_len(&seg.log, &seg.log_path)?;
        let data_size = file_len(&seg.data, &seg.data_path)?;
        let summary = match mode {
            OpenMode::Active => {
                seg.remove_index_files();
                seg.recover(log_size, data_size)?
            }
            OpenMode::Sealed => match seg.load_index(log_size, data_size) {
                Ok(s) => s,
                Err(reason) => {
                    tracing::info!(segment = base, dir = %dir.display(), reason, "rebuilding segment index");
                    let (s, bad) = seg.scan(log_size, data_size, false)?;
                    if let Some((pos, why)) = bad {
                        tracing::error!(segment = base, pos, reason = why, log = %seg.log_path.display(),
                            "corrupt record in a sealed segment; the rest of the segment is not served");
                    }
                    if let Err(e) = seg.write_index(&s) {
                        tracing::warn!(segment = base, error = %e, "could not write rebuilt index files");
                    }
                    s
                }
            },
        };
        *seg.state.write() = summary;
        Ok(seg)
    }

    fn load_index(
        &self,
        log_size: u64,
        data_size: u64,
    ) -> std::result::Result<SegmentSummary, String> {
        let max = SegmentSummary::max_index_file_len(log_size);
        let oi = read_small_file(&self.dir.join(file_name(self.base, "index")), max)
            .map_err(|e| format!("offset index unreadable: {e}"))?;
        let ti = read_small_file(&self.dir.join(file_name(self.base, "timeindex")), max)
            .map_err(|e| format!("time index unreadable: {e}"))?;
        let s = SegmentSummary::decode(&oi, &ti).map_err(str::to_string)?;
        if s.log_len != log_size {
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

    /// Scans the whole log. Returns the summary of the valid prefix and, if
    /// the scan stopped early, where and why.
    fn scan(
        &self,
        log_size: u64,
        data_size: u64,
        verify_data: bool,
    ) -> Result<(SegmentSummary, Option<(u64, &'static str)>)> {
        let mut s = SegmentSummary::default();
        let mut cursor = Cursor::new(&self.log, &self.log_path, 0, log_size);
        loop {
            let rec = match cursor.next_record() {
                Ok(Some(rec)) => rec,
                Ok(None) => return Ok((s, None)),
                Err(ScanError::Io(e)) => return Err(e),
                Err(ScanError::Bad { pos, reason }) => return Ok((s, Some((pos, reason)))),
            };
            let h = rec.header;
            let bad = if h.base_offset != self.base + s.next_rel {
                Some("base offset does not follow the previous batch")
            } else if h.data_pos != s.data_len {
                Some("data position does not follow the previous batch")
            } else if h.timestamp_us < s.max_ts {
                Some("timestamp goes backwards")
            } else if verify_data && h.data_pos + h.data_len > data_size {
                Some("data extends past the end of the data file")
            } else if verify_data && self.data_crc(h.data_pos, h.data_len)? != h.data_crc {
                Some("data checksum mismatch")
            } else {
                None
            };
            if let Some(reason) = bad {
                return Ok((s, Some((rec.pos, reason))));
            }
            note_record(&mut s, self.base, self.index_interval, rec.pos, &h);
        }
    }

    /// Recovery of the active segment: keep the longest valid prefix.
    fn recover(&self, log_size: u64, data_size: u64) -> Result<SegmentSummary> {
        let (s, bad) = self.scan(log_size, data_size, true)?;
        if let Some((pos, reason)) = bad {
            tracing::warn!(segment = self.base, pos, reason, log = %self.log_path.display(),
                dropped_bytes = log_size - pos, "truncating the log at a torn or corrupt record");
        }
        if s.log_len < log_size {
            truncate(&self.log, &self.log_path, s.log_len)?;
        }
        if s.data_len < data_size {
            tracing::warn!(
                segment = self.base,
                data_len = s.data_len,
                data_size,
                "truncating unreferenced bytes at the end of the data file"
            );
            truncate(&self.data, &self.data_path, s.data_len)?;
        }
        Ok(s)
    }

    fn data_crc(&self, pos: u64, len: u64) -> Result<u32> {
        let mut crc = 0u32;
        let mut buf = vec![0u8; len.min(DATA_CHUNK) as usize];
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(DATA_CHUNK) as usize;
            read_exact_at(&self.data, &mut buf[..n], pos + done).map_err(|e| {
                StorageError::io(format!("reading {}", self.data_path.display()), e)
            })?;
            crc = crc32c::crc32c_append(crc, &buf[..n]);
            done += n as u64;
        }
        Ok(crc)
    }

    fn write_index(&self, s: &SegmentSummary) -> Result<()> {
        for (ext, bytes) in [
            ("index", s.encode_offset_index()),
            ("timeindex", s.encode_time_index()),
        ] {
            let path = self.dir.join(file_name(self.base, ext));
            write_synced(&path, &bytes)
                .map_err(|e| StorageError::io(format!("writing {}", path.display()), e))?;
        }
        Ok(())
    }

    fn remove_index_files(&self) {
        for ext in ["index", "timeindex"] {
            let path = self.dir.join(file_name(self.base, ext));
            if let Err(e) = std::fs::remove_file(&path) {
                if e.kind() != io::ErrorKind::NotFound {
                    tracing::warn!(path = %path.display(), error = %e, "could not remove a stale index file");
                }
            }
        }
    }

    /// Removes all four files of the segment (retention).
    pub(crate) fn delete_files(&self) {
        for ext in EXTENSIONS {
            let path = self.dir.join(file_name(self.base, ext));
            if let Err(e) = std::fs::remove_file(&path) {
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
        Ok(file_len(&self.log, &self.log_path)? == 0)
    }

    pub(crate) fn size(&self) -> u64 {
        let s = self.state.read();
        s.log_len + s.data_len
    }

    pub(crate) fn next_offset(&self) -> u64 {
        self.base + self.state.read().next_rel
    }

    pub(crate) fn max_ts(&self) -> u64 {
        self.state.read().max_ts
    }

    /// Writes one batch at the current end (writer thread only): data first,
    /// then the log record, then the in-memory index. On error the files are
    /// truncated back so that the next append starts from a clean end.
    pub(crate) fn append(&self, h: &RecordHeader, meta: &[u8], data: &[Bytes]) -> Result<()> {
        let (log_pos, data_pos) = {
            let s = self.state.read();
            (s.log_len, s.data_len)
        };
        debug_assert_eq!(h.data_pos, data_pos);
        if h.data_len > 0 {
            if let Err(e) = pwritev_all(&self.data, data, data_pos) {
                let _ = self.data.set_len(data_pos);
                return Err(StorageError::io(
                    format!(
                        "writing the data of batch {} to {}",
                        h.base_offset,
                        self.data_path.display()
                    ),
                    e,
                ));
            }
        }
        let head = h.encode(meta);
        if let Err(e) = pwritev_all(&self.log, &[&head[..], meta], log_pos) {
            let _ = self.log.set_len(log_pos);
            let _ = self.data.set_len(data_pos);
            return Err(StorageError::io(
                format!(
                    "writing the record of batch {} to {}",
                    h.base_offset,
                    self.log_path.display()
                ),
                e,
            ));
        }
        note_record(
            &mut self.state.write(),
            self.base,
            self.index_interval,
            log_pos,
            h,
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

    /// Makes the segment durable and writes its index files.
    pub(crate) fn seal(&self) -> Result<()> {
        self.sync()?;
        let summary = self.state.read().clone();
        self.write_index(&summary)
    }

    fn cursor_at(&self, entry: Option<IndexEntry>, end: u64) -> Cursor<'_> {
        Cursor::new(&self.log, &self.log_path, entry.map_or(0, |e| e.pos), end)
    }

    /// Appends to `out` the batches of this segment holding offsets >= `from`
    /// until `*bytes` (meta returned so far) reaches `max_bytes`. Returns true
    /// once the limit is reached.
    pub(crate) fn read_batches(
        &self,
        from: u64,
        max_bytes: usize,
        out: &mut Vec<StoredBatch>,
        bytes: &mut usize,
    ) -> Result<bool> {
        let (start, end) = {
            let s = self.state.read();
            (s.floor_by_rel(from.saturating_sub(self.base)), s.log_len)
        };
        let mut cursor = self.cursor_at(start, end);
        while let Some(rec) = cursor
            .next_record()
            .map_err(|e| e.into_storage(&self.log_path))?
        {
            let h = rec.header;
            if h.end_offset() <= from {
                continue;
            }
            *bytes += rec.meta.len();
            out.push(StoredBatch {
                base_offset: h.base_offset,
                count: h.count,
                timestamp_us: h.timestamp_us,
                meta: rec.meta,
                data_len: h.data_len,
            });
            if *bytes >= max_bytes {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The header of the batch whose base offset is exactly `base_offset`.
    pub(crate) fn find_batch(&self, base_offset: u64) -> Result<Option<RecordHeader>> {
        let (start, end) = {
            let s = self.state.read();
            (
                s.floor_by_rel(base_offset.saturating_sub(self.base)),
                s.log_len,
            )
        };
        let mut cursor = self.cursor_at(start, end);
        while let Some(rec) = cursor
            .next_record()
            .map_err(|e| e.into_storage(&self.log_path))?
        {
            if rec.header.base_offset >= base_offset {
                return Ok((rec.header.base_offset == base_offset).then_some(rec.header));
            }
        }
        Ok(None)
    }

    /// Base offset of the first batch with timestamp >= `ts`, if any.
    pub(crate) fn offset_for_timestamp(&self, ts: u64) -> Result<Option<u64>> {
        let (start, end) = {
            let s = self.state.read();
            (s.floor_before_ts(ts), s.log_len)
        };
        let mut cursor = self.cursor_at(start, end);
        while let Some(rec) = cursor
            .next_record()
            .map_err(|e| e.into_storage(&self.log_path))?
        {
            if rec.header.timestamp_us >= ts {
                return Ok(Some(rec.header.base_offset));
            }
        }
        Ok(None)
    }

    /// Reads `ranges` (already checked against `h.data_len`) of the data of
    /// batch `h`. When the ranges cover at least as many bytes as the whole
    /// data section, it is read once, its CRC is verified, and the ranges are
    /// sliced from it; otherwise each run of adjacent ranges is one pread.
    pub(crate) fn read_data(
        &self,
        h: &RecordHeader,
        ranges: &[(u64, u64)],
        out: &mut Vec<Bytes>,
    ) -> Result<()> {
        let seg_data_len = self.state.read().data_len;
        if h.data_pos + h.data_len > seg_data_len {
            return Err(StorageError::corrupt(format!(
                "batch {} points past the data of {}",
                h.base_offset,
                self.data_path.display()
            )));
        }
        let io_err = |e| StorageError::io(format!("reading {}", self.data_path.display()), e);
        let total = ranges.iter().fold(0u64, |t, r| t.saturating_add(r.1));
        out.reserve(ranges.len());
        if h.data_len > 0 && total >= h.data_len {
            let mut buf = vec![0u8; h.data_len as usize];
            read_exact_at(&self.data, &mut buf, h.data_pos).map_err(io_err)?;
            if crc32c::crc32c(&buf) != h.data_crc {
                return Err(StorageError::corrupt(format!(
                    "data of batch {} in {} (checksum mismatch)",
                    h.base_offset,
                    self.data_path.display()
                )));
            }
            let all = Bytes::from(buf);
            out.extend(
                ranges
                    .iter()
                    .map(|&(pos, len)| all.slice(pos as usize..(pos + len) as usize)),
            );
            return Ok(());
        }
        let mut buf = BytesMut::zeroed(total as usize);
        let mut run: Option<(u64, usize, usize)> = None; // (file pos, buf start, len)
        let mut at = 0usize;
        for &(pos, len) in ranges {
            let file_pos = h.data_pos + pos;
            run = match run {
                Some((p, b, l)) if p + l as u64 == file_pos => Some((p, b, l + len as usize)),
                Some((p, b, l)) => {
                    read_exact_at(&self.data, &mut buf[b..b + l], p).map_err(io_err)?;
                    Some((file_pos, at, len as usize))
                }
                None => Some((file_pos, at, len as usize)),
            };
            at += len as usize;
        }
        if let Some((p, b, l)) = run {
            read_exact_at(&self.data, &mut buf[b..b + l], p).map_err(io_err)?;
        }
        let all = buf.freeze();
        let mut at = 0usize;
        for &(_, len) in ranges {
            out.push(all.slice(at..at + len as usize));
            at += len as usize;
        }
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
