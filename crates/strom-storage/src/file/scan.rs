//! Scanning a segment's `.log`: the recovery scan on open (which tells a
//! torn tail, truncated, from damage in the middle, quarantined), and the
//! resync that finds the next valid record after a damaged one.
//!
//! A damaged record with a valid record after it is *mid-segment damage*:
//! the valid records before and after are kept, and the offsets between
//! them become a gap (quarantined by the caller). Only damage with nothing
//! valid after it, up to the end of the file, is a *torn tail*. Resync looks
//! for the next position holding the record magic whose header decodes, whose
//! record CRC verifies, and whose base offset and data position do not go
//! backwards.

use super::cursor::{Cursor, Rec, ScanError};
use super::index::{IndexEntry, SegmentSummary};
use super::record::{HEADER_LEN, MAGIC};
use super::segment::{note_record, truncate, Gaps, Segment, DATA_CHUNK};
use crate::{Result, StorageError};

/// Resync reads the log in chunks of this size.
const RESYNC_CHUNK: u64 = 64 * 1024;

/// What a scan of a segment's log found.
pub(crate) struct Scanned {
    /// The valid records (with index entries).
    pub summary: SegmentSummary,
    /// Damaged offset ranges with valid records after them.
    pub gaps: Gaps,
    /// Where a damaged tail (nothing valid after it) starts, and why.
    pub torn: Option<(u64, &'static str)>,
    /// Intact records seen (record CRC, and data CRC if verified).
    pub intact: u64,
}

/// What a scrub of one segment found.
pub(crate) struct SegmentCheck {
    pub batches: u64,
    pub bytes: u64,
    pub damaged: Gaps,
}

/// Records whose data is damaged, at the current end of the scan: a torn
/// tail if nothing valid follows, a gap otherwise.
struct BadDataRun {
    pos: u64,
    first: u64,
    reason: &'static str,
    before: SegmentSummary,
}

/// Adds `first..=last` to `gaps`, merging with the previous gap if adjacent.
fn push_gap(gaps: &mut Gaps, first: u64, last: u64) {
    if first > last {
        return;
    }
    match gaps.last_mut() {
        Some(prev) if prev.1.checked_add(1) == Some(first) => prev.1 = last,
        _ => gaps.push((first, last)),
    }
}

impl Segment {
    /// Scans the log past the records `from` already describes (a
    /// checkpoint, or nothing), stepping over damaged records.
    pub(super) fn scan(
        &self,
        from: SegmentSummary,
        log_size: u64,
        data_size: u64,
        verify_data: bool,
    ) -> Result<Scanned> {
        let mut cursor = Cursor::new(&*self.log, &self.log_path, from.log_len, log_size);
        let mut s = from;
        let mut gaps = Gaps::new();
        let mut run: Option<BadDataRun> = None;
        let mut force = false;
        let mut intact = 0u64;
        let torn = loop {
            let expected = self.base + s.next_rel;
            let (bad_pos, reason) = match cursor.next_record() {
                Ok(None) => break None,
                Err(ScanError::Io(e)) => return Err(e),
                Err(ScanError::Bad { pos, reason }) => (pos, reason),
                Ok(Some(rec)) => {
                    let h = rec.header;
                    let bad = if h.base_offset < expected {
                        Some("base offset goes backwards")
                    } else if h.data_pos < s.data_len {
                        Some("data position goes backwards")
                    } else if h.timestamp_us < s.max_ts {
                        Some("timestamp goes backwards")
                    } else {
                        None
                    };
                    if let Some(reason) = bad {
                        (rec.pos, reason)
                    } else {
                        let data_bad = if !verify_data {
                            None
                        } else if h.data_pos + h.data_len > data_size {
                            Some("data extends past the end of the data file")
                        } else if self.data_crc(h.data_pos, h.data_len)? != h.data_crc {
                            Some("data checksum mismatch")
                        } else {
                            None
                        };
                        if data_bad.is_none() {
                            intact += 1;
                        }
                        match (data_bad, &run) {
                            (Some(reason), None) => {
                                run = Some(BadDataRun {
                                    pos: rec.pos,
                                    first: h.base_offset,
                                    reason,
                                    before: s.clone(),
                                })
                            }
                            (Some(_), Some(_)) => {}
                            (None, _) => {
                                if let Some(r) = run.take() {
                                    push_gap(&mut gaps, r.first, h.base_offset - 1);
                                    force = true;
                                }
                            }
                        }
                        if h.base_offset > expected {
                            push_gap(&mut gaps, expected, h.base_offset - 1);
                            force = true;
                        }
                        note_record(&mut s, self.base, self.index_interval, rec.pos, &h, force);
                        force = false;
                        continue;
                    }
                }
            };
            match self.find_next_record(bad_pos + 1, log_size, expected, s.data_len)? {
                None => break Some((bad_pos, reason)),
                Some(next) => {
                    let first = run.take().map_or(expected, |r| r.first);
                    let next_base = next.header.base_offset;
                    tracing::error!(segment = self.base, pos = bad_pos, reason,
                        resync_pos = next.pos, first, next_base,
                        log = %self.log_path.display(), "damaged record in the middle of a segment");
                    if next_base > first {
                        push_gap(&mut gaps, first, next_base - 1);
                    }
                    cursor.seek(next.pos);
                    force = true;
                }
            }
        };
        // Trailing records with damaged data and nothing valid after them are
        // part of the torn tail.
        let (summary, torn) = match run {
            Some(r) => (r.before, Some((r.pos, r.reason))),
            None => (s, torn),
        };
        gaps.retain(|&(_, last)| last < self.base + summary.next_rel);
        Ok(Scanned {
            summary,
            gaps,
            torn,
            intact,
        })
    }

    /// Scrub: checks every record and data CRC of the segment up to what is
    /// published now, without holding any lock while reading. Damage at the
    /// end counts too (the bytes were published, so they were written whole).
    pub(crate) fn verify(&self) -> Result<SegmentCheck> {
        let (log_len, data_len, next, _) = self.lens();
        let scanned = self.scan(SegmentSummary::default(), log_len, data_len, true)?;
        let mut damaged = scanned.gaps;
        let valid_end = self.base + scanned.summary.next_rel;
        if valid_end < next {
            push_gap(&mut damaged, valid_end, next - 1);
        }
        Ok(SegmentCheck {
            batches: scanned.intact,
            bytes: log_len + data_len,
            damaged,
        })
    }

    /// Recovery of the active segment past `from` (a checkpoint or nothing):
    /// keep every valid record, report the gaps between them, truncate a
    /// torn tail.
    pub(super) fn recover(
        &self,
        from: SegmentSummary,
        log_size: u64,
        data_size: u64,
    ) -> Result<(SegmentSummary, Gaps)> {
        let Scanned {
            summary: s,
            gaps,
            torn,
            ..
        } = self.scan(from, log_size, data_size, true)?;
        if let Some((pos, reason)) = torn {
            tracing::warn!(segment = self.base, pos, reason, log = %self.log_path.display(),
                dropped_bytes = log_size - pos, "truncating a torn tail of the log");
        }
        if s.log_len < log_size {
            truncate(&*self.log, &self.log_path, s.log_len)?;
        }
        if s.data_len < data_size {
            tracing::warn!(
                segment = self.base,
                data_len = s.data_len,
                data_size,
                "truncating unreferenced bytes at the end of the data file"
            );
            truncate(&*self.data, &self.data_path, s.data_len)?;
        }
        Ok((s, gaps))
    }

    pub(super) fn data_crc(&self, pos: u64, len: u64) -> Result<u32> {
        let mut crc = 0u32;
        let mut buf = vec![0u8; len.min(DATA_CHUNK) as usize];
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(DATA_CHUNK) as usize;
            self.data
                .read_exact_at(&mut buf[..n], pos + done)
                .map_err(|e| {
                    StorageError::io(format!("reading {}", self.data_path.display()), e)
                })?;
            crc = crc32c::crc32c_append(crc, &buf[..n]);
            done += n as u64;
        }
        Ok(crc)
    }

    /// The first valid record at or after `from` (and before `end`) whose
    /// base offset is >= `min_base` and data position >= `min_data_pos`.
    pub(super) fn find_next_record(
        &self,
        from: u64,
        end: u64,
        min_base: u64,
        min_data_pos: u64,
    ) -> Result<Option<Rec>> {
        let mut buf = vec![0u8; RESYNC_CHUNK as usize];
        let mut pos = from;
        while end.saturating_sub(pos) >= HEADER_LEN as u64 {
            let n = (end - pos).min(RESYNC_CHUNK) as usize;
            self.log
                .read_exact_at(&mut buf[..n], pos)
                .map_err(|e| StorageError::io(format!("reading {}", self.log_path.display()), e))?;
            for i in 0..=n - MAGIC.len() {
                if buf[i..i + MAGIC.len()] != MAGIC {
                    continue;
                }
                let at = pos + i as u64;
                let mut c = Cursor::new(&*self.log, &self.log_path, at, end);
                match c.next_record() {
                    Ok(Some(rec))
                        if rec.header.base_offset >= min_base
                            && rec.header.data_pos >= min_data_pos =>
                    {
                        return Ok(Some(rec))
                    }
                    Err(ScanError::Io(e)) => return Err(e),
                    _ => {}
                }
            }
            // Overlap so that a magic split across two chunks is found.
            pos += (n - (MAGIC.len() - 1)) as u64;
        }
        Ok(None)
    }

    /// Runtime repair after a reader met a damaged record at `pos` where it
    /// expected offset `expected`: finds the next valid record, adds an
    /// index entry for it, and returns its base offset (the segment's next
    /// offset if nothing valid follows) and log position.
    pub(crate) fn resync(&self, pos: u64, expected: u64) -> Result<(u64, Option<u64>)> {
        let end = self.state.read().log_len;
        let Some(rec) = self.find_next_record(pos + 1, end, expected, 0)? else {
            return Ok((self.next_offset().max(expected), None));
        };
        let h = rec.header;
        let mut s = self.state.write();
        let rel = h.base_offset - self.base;
        let i = s.entries.partition_point(|e| e.rel < rel);
        if s.entries.get(i).is_none_or(|e| e.rel != rel) {
            s.entries.insert(
                i,
                IndexEntry {
                    rel,
                    pos: rec.pos,
                    ts: h.timestamp_us,
                },
            );
        }
        Ok((h.base_offset, Some(rec.pos)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adjacent_gaps_merge() {
        let mut g = Gaps::new();
        push_gap(&mut g, 4, 5);
        push_gap(&mut g, 6, 7);
        push_gap(&mut g, 10, 9);
        push_gap(&mut g, 18, 19);
        assert_eq!(g, vec![(4, 7), (18, 19)]);
    }
}
