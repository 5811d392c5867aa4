//! The quarantine of a partition: the ranges of offsets that are damaged on
//! disk and are never served again, kept in memory and in the partition's
//! `quarantine` file (append-only, fdatasync'ed before a range is reported).
//!
//! File layout: an 8-byte header (`"STRQ"`, u32 LE version 1), then 20-byte
//! records `u32 crc32c | u64 first | u64 last` (the CRC covers the two
//! offsets). A torn or corrupt tail is ignored on load and overwritten by
//! the next record.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use parking_lot::{Mutex, RwLock};

use crate::vfs::{Vfs, VfsFile};
use crate::{Result, StorageError};

pub(crate) const FILE_NAME: &str = "quarantine";
const MAGIC: [u8; 4] = *b"STRQ";
const VERSION: u32 = 1;
const HEADER: usize = 8;
const RECORD: usize = 20;
/// A quarantine file larger than this is refused (about 800 000 ranges).
const MAX_FILE_LEN: u64 = 16 << 20;

struct QFile {
    file: Option<Box<dyn VfsFile>>,
    len: u64,
}

pub(crate) struct Quarantine {
    path: PathBuf,
    dir: PathBuf,
    vfs: std::sync::Arc<dyn Vfs>,
    /// first -> last (inclusive); ranges may overlap.
    ranges: RwLock<BTreeMap<u64, u64>>,
    file: Mutex<QFile>,
}

fn header() -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..4].copy_from_slice(&MAGIC);
    h[4..].copy_from_slice(&VERSION.to_le_bytes());
    h
}

fn encode(first: u64, last: u64) -> [u8; RECORD] {
    let mut r = [0u8; RECORD];
    r[4..12].copy_from_slice(&first.to_le_bytes());
    r[12..20].copy_from_slice(&last.to_le_bytes());
    let crc = crc32c::crc32c(&r[4..]);
    r[..4].copy_from_slice(&crc.to_le_bytes());
    r
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

impl Quarantine {
    /// Loads the quarantine of partition directory `dir` (empty if the file
    /// does not exist; it is created by the first [`Quarantine::add`]).
    pub(crate) fn load(vfs: std::sync::Arc<dyn Vfs>, dir: &Path) -> Result<Self> {
        let path = dir.join(FILE_NAME);
        let io = |what: &str| {
            let ctx = format!("{what} {}", path.display());
            move |e| StorageError::io(ctx, e)
        };
        let mut ranges = BTreeMap::new();
        let mut qfile = QFile { file: None, len: 0 };
        if vfs.exists(&path).map_err(io("checking"))? {
            let file = vfs.open(&path, false).map_err(io("opening"))?;
            let size = file.len().map_err(io("reading the size of"))?;
            if size > MAX_FILE_LEN {
                return Err(StorageError::corrupt(format!(
                    "{} is {size} bytes, more than the {MAX_FILE_LEN} a quarantine file can hold",
                    path.display()
                )));
            }
            let mut bytes = vec![0u8; size as usize];
            file.read_exact_at(&mut bytes, 0).map_err(io("reading"))?;
            let mut valid = 0usize;
            if bytes.len() >= HEADER && bytes[..HEADER] == header() {
                valid = HEADER;
                while bytes.len() - valid >= RECORD {
                    let r = &bytes[valid..valid + RECORD];
                    let crc = u32::from_le_bytes([r[0], r[1], r[2], r[3]]);
                    let (first, last) = (u64_at(r, 4), u64_at(r, 12));
                    if crc32c::crc32c(&r[4..]) != crc || first > last {
                        break;
                    }
                    let e = ranges.entry(first).or_insert(last);
                    *e = (*e).max(last);
                    valid += RECORD;
                }
            }
            if valid < bytes.len() {
                tracing::warn!(path = %path.display(), valid, size,
                    "ignoring a torn or corrupt tail of the quarantine file");
            }
            qfile = QFile {
                file: Some(file),
                len: valid as u64,
            };
        }
        if !ranges.is_empty() {
            tracing::warn!(dir = %dir.display(), ranges = ranges.len(),
                "partition has quarantined (damaged) offset ranges");
        }
        Ok(Quarantine {
            path,
            dir: dir.to_path_buf(),
            vfs,
            ranges: RwLock::new(ranges),
            file: Mutex::new(qfile),
        })
    }

    /// The quarantined range holding `offset`, if any.
    pub(crate) fn containing(&self, offset: u64) -> Option<(u64, u64)> {
        let r = self.ranges.read();
        // Ranges may overlap: the one reaching furthest wins.
        r.range(..=offset)
            .filter(|(_, &last)| last >= offset)
            .map(|(&f, &l)| (f, l))
            .max_by_key(|&(_, l)| l)
    }

    /// Smallest first offset of a range starting after `offset`.
    pub(crate) fn next_start_after(&self, offset: u64) -> Option<u64> {
        let r = self.ranges.read();
        r.range(offset.saturating_add(1)..).next().map(|(&f, _)| f)
    }

    /// Every quarantined range, by first offset.
    pub(crate) fn ranges(&self) -> Vec<(u64, u64)> {
        self.ranges.read().iter().map(|(&f, &l)| (f, l)).collect()
    }

    /// Forgets the quarantined offsets >= `end` (a truncation removed
    /// them), durably: the file is rewritten whole and replaced atomically.
    /// A no-op when no range reaches `end`.
    pub(crate) fn truncate_from(&self, end: u64) -> Result<()> {
        let mut f = self.file.lock();
        let mut ranges = self.ranges.read().clone();
        if ranges.values().all(|&last| last < end) {
            return Ok(());
        }
        ranges.retain(|&first, _| first < end);
        for last in ranges.values_mut() {
            *last = (*last).min(end - 1);
        }
        let mut bytes = header().to_vec();
        for (&first, &last) in &ranges {
            bytes.extend_from_slice(&encode(first, last));
        }
        let file = crate::whole_file::replace(&*self.vfs, &self.dir, FILE_NAME, &[&bytes])
            .map_err(|(e, _)| {
                StorageError::io(format!("{} {}", e.step, e.path.display()), e.source)
            })?;
        *f = QFile {
            file: Some(file),
            len: bytes.len() as u64,
        };
        tracing::info!(dir = %self.dir.display(), end, ranges = ranges.len(),
            "quarantine trimmed by a truncation");
        *self.ranges.write() = ranges;
        Ok(())
    }

    /// Quarantines `first..=last` durably (a no-op when already covered).
    pub(crate) fn add(&self, first: u64, last: u64) -> Result<()> {
        if self.containing(first).is_some_and(|(_, l)| l >= last) {
            return Ok(());
        }
        let mut f = self.file.lock();
        let io = |what: &str| {
            let ctx = format!("{what} {}", self.path.display());
            move |e| StorageError::io(ctx, e)
        };
        if f.file.is_none() {
            let file = self.vfs.open(&self.path, true).map_err(io("creating"))?;
            file.set_len(0).map_err(io("truncating"))?;
            file.write_all_at(&[&header()[..]], 0)
                .map_err(io("writing"))?;
            file.sync_data().map_err(io("syncing"))?;
            self.vfs
                .sync_dir(&self.dir)
                .map_err(io("syncing the directory of"))?;
            *f = QFile {
                file: Some(file),
                len: HEADER as u64,
            };
        }
        let len = f.len;
        if let Some(file) = &f.file {
            file.write_all_at(&[&encode(first, last)[..]], len)
                .map_err(io("writing"))?;
            file.sync_data().map_err(io("syncing"))?;
        }
        f.len += RECORD as u64;
        let mut r = self.ranges.write();
        let e = r.entry(first).or_insert(last);
        *e = (*e).max(last);
        tracing::error!(dir = %self.dir.display(), first, last,
            "quarantined a damaged offset range; readers get DataCorrupt for it");
        Ok(())
    }
}
