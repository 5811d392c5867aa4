//! The tier manifest: the durable record, in the partition directory, of
//! which segments are in the tier and verified there. Only a segment listed
//! here may be dropped locally, and reads below the first local segment
//! find their segment here.
//!
//! ```text
//! tier.manifest
//!   0  8 magic "STRMTIER"
//!   8  4 version (1)
//!  12  4 entry count n
//!  16  n x 48-byte entries, by base offset:
//!        u64 base, u64 next (first offset after the segment),
//!        u64 max timestamp_us, u64 .log length, u64 .data length,
//!        u32 crc32c of the .log file, u32 crc32c of the .data file
//!  16 + 48n  4 crc32c of every byte before it
//! ```
//!
//! Little-endian. Written whole to `tier.manifest.tmp`, fsynced, renamed
//! over `tier.manifest`, then the directory is fsynced: a crash leaves the
//! old manifest or the new one.

use std::io;
use std::path::Path;

use crate::vfs::Vfs;
use crate::{Result, StorageError};

pub const MANIFEST_FILE: &str = "tier.manifest";
const TMP_FILE: &str = "tier.manifest.tmp";
const MAGIC: &[u8; 8] = b"STRMTIER";
const VERSION: u32 = 1;
const HEADER: usize = 16;
const ENTRY: usize = 48;
/// More entries than any partition has segments: a bound on what is read.
const MAX_ENTRIES: usize = 1 << 22;

/// One segment copied to the tier and verified there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TieredSegment {
    pub base: u64,
    pub next: u64,
    pub max_ts: u64,
    pub log_len: u64,
    pub data_len: u64,
    pub log_crc: u32,
    pub data_crc: u32,
}

impl TieredSegment {
    /// The entry of closed segment `seg` whose `.log` and `.data` files
    /// have these `(length, CRC32C)` in the tier.
    pub(crate) fn of(seg: &crate::file::ClosedSegment, log: (u64, u32), data: (u64, u32)) -> Self {
        TieredSegment {
            base: seg.base,
            next: seg.next,
            max_ts: seg.max_ts,
            log_len: log.0,
            data_len: data.0,
            log_crc: log.1,
            data_crc: data.1,
        }
    }

    pub fn size(&self) -> u64 {
        self.log_len + self.data_len
    }
}

/// The tiered segments of a partition, by base offset.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Manifest {
    pub segments: Vec<TieredSegment>,
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(x)
}

impl Manifest {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HEADER + ENTRY * self.segments.len() + 4);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&(self.segments.len() as u32).to_le_bytes());
        for s in &self.segments {
            for v in [s.base, s.next, s.max_ts, s.log_len, s.data_len] {
                b.extend_from_slice(&v.to_le_bytes());
            }
            b.extend_from_slice(&s.log_crc.to_le_bytes());
            b.extend_from_slice(&s.data_crc.to_le_bytes());
        }
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes and checks a manifest (every length checked before use).
    pub fn decode(b: &[u8]) -> std::result::Result<Self, String> {
        if b.len() < HEADER + 4 || &b[..8] != MAGIC {
            return Err("not a tier manifest (bad magic or too short)".into());
        }
        let body = b.len() - 4;
        if crc32c::crc32c(&b[..body]) != u32_at(b, body) {
            return Err("checksum mismatch".into());
        }
        let version = u32_at(b, 8);
        if version != VERSION {
            return Err(format!("unknown version {version}"));
        }
        let n = u32_at(b, 12) as usize;
        if n > MAX_ENTRIES || HEADER + n * ENTRY != body {
            return Err(format!("{n} entries do not fit {} bytes", b.len()));
        }
        let segments: Vec<TieredSegment> = (0..n)
            .map(|i| {
                let at = HEADER + i * ENTRY;
                TieredSegment {
                    base: u64_at(b, at),
                    next: u64_at(b, at + 8),
                    max_ts: u64_at(b, at + 16),
                    log_len: u64_at(b, at + 24),
                    data_len: u64_at(b, at + 32),
                    log_crc: u32_at(b, at + 40),
                    data_crc: u32_at(b, at + 44),
                }
            })
            .collect();
        let ordered = segments.windows(2).all(|w| w[0].next <= w[1].base);
        if !ordered || segments.iter().any(|s| s.next <= s.base) {
            return Err("segments out of order or empty".into());
        }
        Ok(Manifest { segments })
    }

    /// Loads the manifest of the partition in `dir`; none yet is empty.
    pub fn load(vfs: &dyn Vfs, dir: &Path) -> Result<Self> {
        let path = dir.join(MANIFEST_FILE);
        let file = match vfs.open(&path, false) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Manifest::default()),
            Err(e) => return Err(StorageError::io(format!("opening {}", path.display()), e)),
        };
        let len = file
            .len()
            .map_err(|e| StorageError::io(format!("reading {}", path.display()), e))?;
        if len > (HEADER + MAX_ENTRIES * ENTRY + 4) as u64 {
            return Err(StorageError::corrupt(format!(
                "{} is too large",
                path.display()
            )));
        }
        let mut buf = vec![0u8; len as usize];
        file.read_exact_at(&mut buf, 0)
            .map_err(|e| StorageError::io(format!("reading {}", path.display()), e))?;
        Manifest::decode(&buf).map_err(|why| {
            StorageError::corrupt(format!(
                "tier manifest {}: {why}; the record of which segments are in the tier is \
                 damaged: restore it, or remove it (segments only in the tier are then lost \
                 to this partition)",
                path.display()
            ))
        })
    }

    /// Replaces the manifest of `dir` atomically and durably.
    pub fn store(&self, vfs: &dyn Vfs, dir: &Path) -> Result<()> {
        let tmp = dir.join(TMP_FILE);
        let path = dir.join(MANIFEST_FILE);
        let io_err = |what: &str, e| StorageError::io(format!("{what} {}", path.display()), e);
        let bytes = self.encode();
        let file = vfs.open(&tmp, true).map_err(|e| io_err("creating", e))?;
        file.set_len(0)
            .and_then(|()| file.write_all_at(&[&bytes], 0))
            .and_then(|()| file.sync_data())
            .map_err(|e| io_err("writing", e))?;
        drop(file);
        vfs.rename(&tmp, &path)
            .map_err(|e| io_err("renaming onto", e))?;
        vfs.sync_dir(dir)
            .map_err(|e| io_err("syncing the directory of", e))
    }

    /// The entry whose segment holds `offset`.
    pub fn holding(&self, offset: u64) -> Option<TieredSegment> {
        let i = self.segments.partition_point(|s| s.base <= offset);
        let s = *self.segments.get(i.checked_sub(1)?)?;
        (offset < s.next).then_some(s)
    }

    pub fn contains(&self, base: u64) -> bool {
        self.segments
            .binary_search_by_key(&base, |s| s.base)
            .is_ok()
    }

    pub fn bytes(&self) -> u64 {
        self.segments.iter().map(TieredSegment::size).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(base: u64, next: u64) -> TieredSegment {
        TieredSegment {
            base,
            next,
            max_ts: 7,
            log_len: 100,
            data_len: 200,
            log_crc: 1,
            data_crc: 2,
        }
    }

    #[test]
    fn manifest_round_trips_and_rejects_damage() {
        let m = Manifest {
            segments: vec![entry(0, 10), entry(10, 25)],
        };
        let mut b = m.encode();
        assert_eq!(Manifest::decode(&b).unwrap(), m);
        assert_eq!(m.holding(12), Some(entry(10, 25)));
        assert_eq!(m.holding(25), None);
        b[20] ^= 1;
        assert!(Manifest::decode(&b).unwrap_err().contains("checksum"));
        assert!(Manifest::decode(&b[..10]).is_err());
    }
}
