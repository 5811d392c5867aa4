//! The `.log` record codec: a fixed 64-byte little-endian header followed by
//! the batch's meta bytes, protected by one CRC32C. Pure code, no I/O.
//!
//! ```text
//! off len field
//!   0   4 magic "STRL"
//!   4   4 crc32c over bytes 8..64 of the header and the meta bytes
//!   8   2 version (1)
//!  10   2 flags (0)
//!  12   4 record_len = 64 + meta_len
//!  16   8 base_offset
//!  24   4 count (>= 1)
//!  28   4 meta_len
//!  32   8 timestamp_us
//!  40   8 data_pos (byte position of the data section in the .data file)
//!  48   8 data_len
//!  56   4 data_crc (crc32c of the data section)
//!  60   4 reserved (0)
//!  64   meta_len bytes of meta
//! ```

pub(crate) const MAGIC: [u8; 4] = *b"STRL";
pub(crate) const VERSION: u16 = 1;
pub(crate) const HEADER_LEN: usize = 64;
/// Largest meta section a record can hold (record_len is a u32).
pub(crate) const MAX_META_LEN: u64 = u32::MAX as u64 - HEADER_LEN as u64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RecordHeader {
    pub base_offset: u64,
    pub count: u32,
    pub meta_len: u32,
    pub timestamp_us: u64,
    pub data_pos: u64,
    pub data_len: u64,
    pub data_crc: u32,
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

pub(crate) fn read_u32(b: &[u8], at: usize) -> u32 {
    u32_at(b, at)
}

pub(crate) fn read_u64(b: &[u8], at: usize) -> u64 {
    u64_at(b, at)
}

impl RecordHeader {
    /// Total bytes of the record in the `.log` file.
    pub(crate) fn record_len(&self) -> u64 {
        HEADER_LEN as u64 + u64::from(self.meta_len)
    }

    /// One past the last offset of the batch.
    pub(crate) fn end_offset(&self) -> u64 {
        self.base_offset.saturating_add(u64::from(self.count))
    }

    /// Encodes the header for `meta`, computing the record CRC.
    pub(crate) fn encode(&self, meta: &[u8]) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0..4].copy_from_slice(&MAGIC);
        h[8..10].copy_from_slice(&VERSION.to_le_bytes());
        h[12..16].copy_from_slice(&(HEADER_LEN as u32 + self.meta_len).to_le_bytes());
        h[16..24].copy_from_slice(&self.base_offset.to_le_bytes());
        h[24..28].copy_from_slice(&self.count.to_le_bytes());
        h[28..32].copy_from_slice(&self.meta_len.to_le_bytes());
        h[32..40].copy_from_slice(&self.timestamp_us.to_le_bytes());
        h[40..48].copy_from_slice(&self.data_pos.to_le_bytes());
        h[48..56].copy_from_slice(&self.data_len.to_le_bytes());
        h[56..60].copy_from_slice(&self.data_crc.to_le_bytes());
        let crc = crc32c::crc32c_append(crc32c::crc32c(&h[8..]), meta);
        h[4..8].copy_from_slice(&crc.to_le_bytes());
        h
    }

    /// Decodes and sanity-checks a header (not the CRC, which needs the meta).
    pub(crate) fn decode(h: &[u8]) -> Result<Self, &'static str> {
        if h.len() < HEADER_LEN {
            return Err("short header");
        }
        if h[0..4] != MAGIC {
            return Err("bad magic");
        }
        if u16_at(h, 8) != VERSION {
            return Err("unknown record version");
        }
        let meta_len = u32_at(h, 28);
        if u64::from(u32_at(h, 12)) != HEADER_LEN as u64 + u64::from(meta_len) {
            return Err("record length does not match meta length");
        }
        let header = RecordHeader {
            base_offset: u64_at(h, 16),
            count: u32_at(h, 24),
            meta_len,
            timestamp_us: u64_at(h, 32),
            data_pos: u64_at(h, 40),
            data_len: u64_at(h, 48),
            data_crc: u32_at(h, 56),
        };
        if header.count == 0 {
            return Err("zero event count");
        }
        if header.data_pos.checked_add(header.data_len).is_none() {
            return Err("data range overflows");
        }
        Ok(header)
    }

    /// Checks the record CRC of `h` (the encoded header) over `meta`.
    pub(crate) fn crc_matches(h: &[u8], meta: &[u8]) -> bool {
        let stored = u32_at(h, 4);
        crc32c::crc32c_append(crc32c::crc32c(&h[8..HEADER_LEN]), meta) == stored
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> RecordHeader {
        RecordHeader {
            base_offset: 42,
            count: 3,
            meta_len: 5,
            timestamp_us: 1_700_000_000_000_000,
            data_pos: 1000,
            data_len: 77,
            data_crc: 0xdead_beef,
        }
    }

    #[test]
    fn header_round_trips_and_crc_covers_meta() {
        let h = sample();
        let enc = h.encode(b"hello");
        assert_eq!(RecordHeader::decode(&enc), Ok(h));
        assert!(RecordHeader::crc_matches(&enc, b"hello"));
        assert!(!RecordHeader::crc_matches(&enc, b"hellp"));
    }

    #[test]
    fn every_flipped_header_byte_is_rejected() {
        let enc = sample().encode(b"hello");
        for i in 0..HEADER_LEN {
            let mut bad = enc;
            bad[i] ^= 0x01;
            let ok =
                RecordHeader::decode(&bad).is_ok() && RecordHeader::crc_matches(&bad, b"hello");
            assert!(!ok, "flip at byte {i} went unnoticed");
        }
    }

    #[test]
    fn mismatched_record_length_is_rejected() {
        let mut enc = sample().encode(b"hello");
        enc[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(RecordHeader::decode(&enc).is_err());
    }
}
