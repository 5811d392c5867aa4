//! Sparse segment indexes: the in-memory entry list and the codec of the
//! `.index` (relative offset -> log position) and `.timeindex` (timestamp ->
//! relative offset) files. Pure code, no I/O.
//!
//! ```text
//! .index                                 .timeindex
//!   0  4 magic "STRX"                      0  4 magic "STRT"
//!   4  4 version (1)                       4  4 version (1)
//!   8  8 entry count n                     8  8 entry count n
//!  16  8 log_len covered                  16  8 log_len covered
//!  24  8 data_len covered                 24  4 crc32c of all other bytes
//!  32  8 next_rel (offsets in segment)    28  4 reserved (0)
//!  40  8 max timestamp_us                 32  n x (u64 timestamp_us, u64 rel)
//!  48  4 crc32c of all other bytes
//!  52  4 reserved (0)
//!  56  n x (u64 rel, u64 log position)
//! ```

use super::record::{read_u32, read_u64, HEADER_LEN as RECORD_HEADER_LEN};

const OFFSET_MAGIC: [u8; 4] = *b"STRX";
const TIME_MAGIC: [u8; 4] = *b"STRT";
const VERSION: u32 = 1;
const OFFSET_HEADER: usize = 56;
const TIME_HEADER: usize = 32;
const ENTRY: usize = 16;

/// One sparse index point: the batch starting at relative offset `rel` has
/// its record at log position `pos` and timestamp `ts`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IndexEntry {
    pub rel: u64,
    pub pos: u64,
    pub ts: u64,
}

/// Everything needed to serve a sealed segment without scanning it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct SegmentSummary {
    pub log_len: u64,
    pub data_len: u64,
    /// Number of offsets in the segment (next offset - base).
    pub next_rel: u64,
    pub max_ts: u64,
    pub entries: Vec<IndexEntry>,
}

impl SegmentSummary {
    /// Last entry at or before relative offset `rel`.
    pub(crate) fn floor_by_rel(&self, rel: u64) -> Option<IndexEntry> {
        let i = self.entries.partition_point(|e| e.rel <= rel);
        i.checked_sub(1).map(|i| self.entries[i])
    }

    /// Last entry whose timestamp is strictly before `ts`.
    pub(crate) fn floor_before_ts(&self, ts: u64) -> Option<IndexEntry> {
        let i = self.entries.partition_point(|e| e.ts < ts);
        i.checked_sub(1).map(|i| self.entries[i])
    }

    /// Largest `.index` file a segment whose log is `log_len` bytes can have:
    /// at most one entry per record.
    pub(crate) fn max_index_file_len(log_len: u64) -> u64 {
        OFFSET_HEADER as u64 + ENTRY as u64 * (log_len / RECORD_HEADER_LEN as u64 + 1)
    }

    pub(crate) fn encode_offset_index(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(OFFSET_HEADER + ENTRY * self.entries.len());
        b.extend_from_slice(&OFFSET_MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&(self.entries.len() as u64).to_le_bytes());
        b.extend_from_slice(&self.log_len.to_le_bytes());
        b.extend_from_slice(&self.data_len.to_le_bytes());
        b.extend_from_slice(&self.next_rel.to_le_bytes());
        b.extend_from_slice(&self.max_ts.to_le_bytes());
        b.extend_from_slice(&[0u8; 8]);
        for e in &self.entries {
            b.extend_from_slice(&e.rel.to_le_bytes());
            b.extend_from_slice(&e.pos.to_le_bytes());
        }
        let crc = crc32c::crc32c_append(crc32c::crc32c(&b[..48]), &b[52..]);
        b[48..52].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub(crate) fn encode_time_index(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(TIME_HEADER + ENTRY * self.entries.len());
        b.extend_from_slice(&TIME_MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&(self.entries.len() as u64).to_le_bytes());
        b.extend_from_slice(&self.log_len.to_le_bytes());
        b.extend_from_slice(&[0u8; 8]);
        for e in &self.entries {
            b.extend_from_slice(&e.ts.to_le_bytes());
            b.extend_from_slice(&e.rel.to_le_bytes());
        }
        let crc = crc32c::crc32c_append(crc32c::crc32c(&b[..24]), &b[28..]);
        b[24..28].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes and cross-checks both index files. Any inconsistency is an
    /// error: the caller then rebuilds the index from the log.
    pub(crate) fn decode(offset_idx: &[u8], time_idx: &[u8]) -> Result<Self, &'static str> {
        if offset_idx.len() < OFFSET_HEADER || time_idx.len() < TIME_HEADER {
            return Err("index file too short");
        }
        if offset_idx[0..4] != OFFSET_MAGIC || time_idx[0..4] != TIME_MAGIC {
            return Err("bad index magic");
        }
        if read_u32(offset_idx, 4) != VERSION || read_u32(time_idx, 4) != VERSION {
            return Err("unknown index version");
        }
        let n = read_u64(offset_idx, 8);
        let body = (offset_idx.len() - OFFSET_HEADER) as u64;
        if n.checked_mul(ENTRY as u64) != Some(body)
            || read_u64(time_idx, 8) != n
            || (time_idx.len() - TIME_HEADER) as u64 != body
        {
            return Err("index entry count does not match file size");
        }
        let crc = crc32c::crc32c_append(crc32c::crc32c(&offset_idx[..48]), &offset_idx[52..]);
        if crc != read_u32(offset_idx, 48) {
            return Err("offset index checksum mismatch");
        }
        let crc = crc32c::crc32c_append(crc32c::crc32c(&time_idx[..24]), &time_idx[28..]);
        if crc != read_u32(time_idx, 24) {
            return Err("time index checksum mismatch");
        }
        let log_len = read_u64(offset_idx, 16);
        if read_u64(time_idx, 16) != log_len {
            return Err("index files cover different log lengths");
        }
        let mut s = SegmentSummary {
            log_len,
            data_len: read_u64(offset_idx, 24),
            next_rel: read_u64(offset_idx, 32),
            max_ts: read_u64(offset_idx, 40),
            entries: Vec::with_capacity(n as usize),
        };
        for i in 0..n as usize {
            let o = OFFSET_HEADER + i * ENTRY;
            let t = TIME_HEADER + i * ENTRY;
            let e = IndexEntry {
                rel: read_u64(offset_idx, o),
                pos: read_u64(offset_idx, o + 8),
                ts: read_u64(time_idx, t),
            };
            if read_u64(time_idx, t + 8) != e.rel {
                return Err("time index does not match offset index");
            }
            let ordered = match s.entries.last() {
                None => e.rel == 0 && e.pos == 0,
                Some(p) => e.rel > p.rel && e.pos > p.pos && e.ts >= p.ts,
            };
            if !ordered || e.pos >= log_len || e.rel >= s.next_rel || e.ts > s.max_ts {
                return Err("index entries out of order or out of bounds");
            }
            s.entries.push(e);
        }
        if (log_len == 0) != s.entries.is_empty() || (log_len == 0) != (s.next_rel == 0) {
            return Err("index of an empty segment is not empty");
        }
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> SegmentSummary {
        SegmentSummary {
            log_len: 10_000,
            data_len: 5_000,
            next_rel: 300,
            max_ts: 99,
            entries: vec![
                IndexEntry {
                    rel: 0,
                    pos: 0,
                    ts: 10,
                },
                IndexEntry {
                    rel: 100,
                    pos: 4100,
                    ts: 50,
                },
                IndexEntry {
                    rel: 200,
                    pos: 8300,
                    ts: 99,
                },
            ],
        }
    }

    #[test]
    fn index_files_round_trip() {
        let s = sample();
        let got = SegmentSummary::decode(&s.encode_offset_index(), &s.encode_time_index());
        assert_eq!(got, Ok(s));
    }

    #[test]
    fn any_flipped_index_byte_is_rejected() {
        let s = sample();
        let (oi, ti) = (s.encode_offset_index(), s.encode_time_index());
        for i in 0..oi.len() {
            let mut bad = oi.clone();
            bad[i] ^= 0x10;
            assert!(
                SegmentSummary::decode(&bad, &ti).is_err(),
                "offset index byte {i}"
            );
        }
        for i in 0..ti.len() {
            let mut bad = ti.clone();
            bad[i] ^= 0x10;
            assert!(
                SegmentSummary::decode(&oi, &bad).is_err(),
                "time index byte {i}"
            );
        }
        assert!(SegmentSummary::decode(&oi[..oi.len() - 1], &ti).is_err());
    }

    #[test]
    fn floor_lookups_pick_the_right_entry() {
        let s = sample();
        assert_eq!(s.floor_by_rel(0).map(|e| e.rel), Some(0));
        assert_eq!(s.floor_by_rel(150).map(|e| e.rel), Some(100));
        assert_eq!(s.floor_by_rel(299).map(|e| e.rel), Some(200));
        assert_eq!(s.floor_before_ts(10), None);
        assert_eq!(s.floor_before_ts(51).map(|e| e.rel), Some(100));
    }
}
