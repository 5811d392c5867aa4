//! The reader of version 1 of the consumer offset file, kept only to
//! upgrade such files once, when they are opened (see
//! [`super::OffsetStore::open_with`]). Nothing writes this format any more.
//!
//! Version 1: an 8-byte header (`"STRO"`, u32 LE `1`), then records
//! `u32 crc32c | u16 name_len | u64 offset | name bytes` (little endian;
//! the CRC covers everything after it). The last record for a name wins.
//! Records carry no length prefix of their own beyond the name's, so a
//! torn tail cannot be told from damage: as version 1 itself did, the
//! valid prefix is kept and the rest is dropped.

use std::collections::HashMap;

use crate::record::FILE_HEADER;

const MAGIC: [u8; 4] = *b"STRO";
const VERSION: u32 = 1;
const RECORD_HEADER: usize = 14;

fn header() -> [u8; FILE_HEADER] {
    crate::record::versioned_header(MAGIC, VERSION)
}

/// Whether the first bytes of a file (at most [`FILE_HEADER`]) are those of
/// a version 1 file: its whole header, or a prefix of it (a version 1 file
/// whose creation a crash cut short, which holds no commit).
pub fn is_v1(head: &[u8]) -> bool {
    !head.is_empty() && header().starts_with(&head[..head.len().min(FILE_HEADER)])
}

/// The commits of a version 1 file, every name's last one, and how many
/// bytes of it formed valid records (header included); bytes past that are
/// a torn or damaged tail, which version 1 dropped on open too.
pub fn parse(bytes: &[u8]) -> (HashMap<String, u64>, usize) {
    let mut map = HashMap::new();
    if bytes.len() < FILE_HEADER || bytes[..FILE_HEADER] != header() {
        return (map, 0);
    }
    let mut pos = FILE_HEADER;
    while bytes.len() - pos >= RECORD_HEADER {
        let r = &bytes[pos..];
        let crc = u32::from_le_bytes([r[0], r[1], r[2], r[3]]);
        let name_len = usize::from(u16::from_le_bytes([r[4], r[5]]));
        let total = RECORD_HEADER + name_len;
        if r.len() < total || crc32c::crc32c(&r[4..total]) != crc {
            break;
        }
        let mut off = [0u8; 8];
        off.copy_from_slice(&r[6..14]);
        let Ok(name) = std::str::from_utf8(&r[RECORD_HEADER..total]) else {
            break;
        };
        map.insert(name.to_string(), u64::from_le_bytes(off));
        pos += total;
    }
    (map, pos)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_of_the_v1_header_is_v1_and_the_v2_header_is_not() {
        assert!(is_v1(b"STRO\x01\0\0\0"));
        assert!(is_v1(b"STRO\x01\0\0\0more bytes"));
        assert!(is_v1(b"ST"));
        assert!(!is_v1(b""));
        assert!(!is_v1(b"STRO\x02\0\0\0"));
        assert!(!is_v1(b"XXXX\x01\0\0\0"));
    }

    #[test]
    fn hostile_name_lengths_end_the_valid_prefix_without_panicking() {
        let mut bytes = header().to_vec();
        // crc, name_len 65535, offset, then 3 bytes of a "name".
        bytes.extend_from_slice(&[0, 0, 0, 0, 0xFF, 0xFF]);
        bytes.extend_from_slice(&7u64.to_le_bytes());
        bytes.extend_from_slice(b"abc");
        let (map, valid) = parse(&bytes);
        assert!(map.is_empty());
        assert_eq!(valid, FILE_HEADER);
    }
}
