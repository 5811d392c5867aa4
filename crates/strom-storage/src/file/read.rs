//! The per-segment read paths: batches from an offset, one batch's header,
//! timestamp lookup, and data reads. A damaged record met on the way is
//! reported to the caller (`FileLog`), which resyncs and quarantines; it is
//! never served. Every data read is verified against the batch's data CRC.

use bytes::Bytes;

use super::cursor::{Cursor, ScanError};
use super::index::IndexEntry;
use super::record::RecordHeader;
use super::segment::Segment;
use crate::{Result, StorageError, StoredBatch};

/// How a walk over a segment's records ended.
pub(crate) enum Walk<T> {
    /// Finished (limit reached, batch found, ...).
    Done(T),
    /// The damaged record at log position `pos`, where offset `expected` was
    /// due, stopped the walk.
    Damaged { pos: u64, expected: u64 },
}

impl Segment {
    fn cursor_at(&self, entry: Option<IndexEntry>, end: u64) -> (Cursor<'_>, u64) {
        let cursor = Cursor::new(&*self.log, &self.log_path, entry.map_or(0, |e| e.pos), end);
        (cursor, self.base + entry.map_or(0, |e| e.rel))
    }

    /// Appends to `out` the batches of this segment holding offsets >= `from`
    /// and starting before `stop_at`, until `*bytes` (meta returned so far)
    /// reaches `max_bytes`. `Done(true)` once a limit is reached.
    pub(crate) fn read_batches(
        &self,
        from: u64,
        stop_at: u64,
        max_bytes: usize,
        out: &mut Vec<StoredBatch>,
        bytes: &mut usize,
    ) -> Result<Walk<bool>> {
        let (start, end) = {
            let s = self.state.read();
            (s.floor_by_rel(from.saturating_sub(self.base)), s.log_len)
        };
        let (mut cursor, mut expected) = self.cursor_at(start, end);
        loop {
            let rec = match cursor.next_record() {
                Ok(Some(rec)) => rec,
                Ok(None) => return Ok(Walk::Done(false)),
                Err(ScanError::Io(e)) => return Err(e),
                Err(ScanError::Bad { pos, .. }) => return Ok(Walk::Damaged { pos, expected }),
            };
            let h = rec.header;
            if h.base_offset < expected {
                return Ok(Walk::Damaged {
                    pos: rec.pos,
                    expected,
                });
            }
            expected = h.end_offset();
            if h.end_offset() <= from {
                continue;
            }
            if h.base_offset >= stop_at {
                return Ok(Walk::Done(true));
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
                return Ok(Walk::Done(true));
            }
        }
    }

    /// The header of the batch whose base offset is exactly `base_offset`.
    pub(crate) fn find_batch(&self, base_offset: u64) -> Result<Walk<Option<RecordHeader>>> {
        let (start, end) = {
            let s = self.state.read();
            (
                s.floor_by_rel(base_offset.saturating_sub(self.base)),
                s.log_len,
            )
        };
        let (mut cursor, mut expected) = self.cursor_at(start, end);
        loop {
            let rec = match cursor.next_record() {
                Ok(Some(rec)) => rec,
                Ok(None) => return Ok(Walk::Done(None)),
                Err(ScanError::Io(e)) => return Err(e),
                Err(ScanError::Bad { pos, .. }) => return Ok(Walk::Damaged { pos, expected }),
            };
            if rec.header.base_offset >= base_offset {
                let h = rec.header;
                return Ok(Walk::Done((h.base_offset == base_offset).then_some(h)));
            }
            expected = rec.header.end_offset();
        }
    }

    /// Base offset of the first batch with timestamp >= `ts`, if any.
    pub(crate) fn offset_for_timestamp(&self, ts: u64) -> Result<Option<u64>> {
        let (start, end) = {
            let s = self.state.read();
            (s.floor_before_ts(ts), s.log_len)
        };
        let (mut cursor, _) = self.cursor_at(start, end);
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
    /// batch `h`. The whole data section is read once and its CRC verified
    /// (verify-on-read, also for partial reads), then the ranges are sliced
    /// from it without copies. A mismatch is `DataCorrupt` for the batch.
    pub(crate) fn read_data(
        &self,
        h: &RecordHeader,
        ranges: &[(u64, u64)],
        out: &mut Vec<Bytes>,
    ) -> Result<()> {
        let seg_data_len = self.state.read().data_len;
        let damaged = StorageError::DataCorrupt {
            first: h.base_offset,
            last: h.end_offset() - 1,
        };
        if h.data_pos + h.data_len > seg_data_len {
            tracing::error!(segment = self.base, batch = h.base_offset, data = %self.data_path.display(),
                "batch points past the end of the data file");
            return Err(damaged);
        }
        out.reserve(ranges.len());
        if h.data_len == 0 || ranges.iter().all(|r| r.1 == 0) {
            out.extend(ranges.iter().map(|_| Bytes::new()));
            return Ok(());
        }
        let mut buf = vec![0u8; h.data_len as usize];
        self.data
            .read_exact_at(&mut buf, h.data_pos)
            .map_err(|e| StorageError::io(format!("reading {}", self.data_path.display()), e))?;
        if crc32c::crc32c(&buf) != h.data_crc {
            tracing::error!(segment = self.base, batch = h.base_offset, data = %self.data_path.display(),
                "data checksum mismatch");
            return Err(damaged);
        }
        let all = Bytes::from(buf);
        out.extend(
            ranges
                .iter()
                .map(|&(pos, len)| all.slice(pos as usize..(pos + len) as usize)),
        );
        Ok(())
    }
}
