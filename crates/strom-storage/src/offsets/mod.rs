//! The consumer offset store of one partition: consumer name -> committed
//! offset, in memory or in an append-only file of CRC-protected records that
//! is compacted (rewrite to a temporary file, fsync, rename) when it grows.
//!
//! File layout: an 8-byte header (`"STRO"`, u32 LE version 1), then records
//! `u32 crc32c | u16 name_len | u64 offset | name bytes` (little endian; the
//! CRC covers everything after it). A torn or corrupt tail is truncated on
//! open. A commit is fdatasync'ed before it returns.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::vfs::{RealFs, Vfs, VfsFile};
use crate::{Result, StorageError};

const MAGIC: [u8; 4] = *b"STRO";
const VERSION: u32 = 1;
const FILE_HEADER: usize = 8;
const RECORD_HEADER: usize = 14;
/// Compact once the file holds this many records (and twice the live names).
const COMPACT_RECORDS: usize = 4096;

struct OffsetFile {
    vfs: Arc<dyn Vfs>,
    path: PathBuf,
    file: Box<dyn VfsFile>,
    len: u64,
    records: usize,
    compact_after: usize,
}

/// Persistent consumer-name -> committed-offset map of one partition.
pub struct OffsetStore {
    map: RwLock<HashMap<String, u64>>,
    file: Option<Mutex<OffsetFile>>,
}

fn encode_record(out: &mut Vec<u8>, name: &str, offset: u64) {
    let start = out.len();
    out.extend_from_slice(&[0u8; 4]);
    out.extend_from_slice(&(name.len() as u16).to_le_bytes());
    out.extend_from_slice(&offset.to_le_bytes());
    out.extend_from_slice(name.as_bytes());
    let crc = crc32c::crc32c(&out[start + 4..]);
    out[start..start + 4].copy_from_slice(&crc.to_le_bytes());
}

fn file_header() -> Vec<u8> {
    let mut b = MAGIC.to_vec();
    b.extend_from_slice(&VERSION.to_le_bytes());
    b
}

/// Parses the valid prefix of an offset file: (map, records, valid length).
fn parse(bytes: &[u8]) -> (HashMap<String, u64>, usize, usize) {
    let mut map = HashMap::new();
    if bytes.len() < FILE_HEADER || bytes[..FILE_HEADER] != file_header()[..] {
        return (map, 0, 0);
    }
    let mut pos = FILE_HEADER;
    let mut records = 0;
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
        records += 1;
        pos += total;
    }
    (map, records, pos)
}

fn io_err(context: &str, path: &Path) -> impl FnOnce(std::io::Error) -> StorageError {
    let context = format!("{context} {}", path.display());
    move |e| StorageError::io(context, e)
}

impl OffsetStore {
    /// An ephemeral store (memory partitions).
    pub fn in_memory() -> Self {
        OffsetStore {
            map: RwLock::new(HashMap::new()),
            file: None,
        }
    }

    /// Opens (creating if missing) the offset file at `path`, dropping a torn
    /// or corrupt tail.
    pub fn open(path: &Path) -> Result<Self> {
        Self::open_with(Arc::new(RealFs), path)
    }

    /// [`OffsetStore::open`] over the file system `vfs`.
    pub fn open_with(vfs: Arc<dyn Vfs>, path: &Path) -> Result<Self> {
        Self::open_inner(vfs, path, COMPACT_RECORDS)
    }

    fn open_inner(vfs: Arc<dyn Vfs>, path: &Path, compact_after: usize) -> Result<Self> {
        let file = vfs.open(path, true).map_err(io_err("opening", path))?;
        let size = file.len().map_err(io_err("reading the size of", path))?;
        let mut bytes = vec![0u8; size as usize];
        file.read_exact_at(&mut bytes, 0)
            .map_err(io_err("reading", path))?;
        let (map, records, valid) = parse(&bytes);
        let mut len = valid as u64;
        if valid < FILE_HEADER {
            if !bytes.is_empty() {
                tracing::warn!(path = %path.display(), "offset file has a bad header; starting empty");
            }
            file.set_len(0).map_err(io_err("truncating", path))?;
            file.write_all_at(&[&file_header()], 0)
                .map_err(io_err("writing", path))?;
            file.sync_data().map_err(io_err("syncing", path))?;
            if let Some(dir) = path.parent() {
                vfs.sync_dir(dir)
                    .map_err(io_err("syncing the directory of", path))?;
            }
            len = FILE_HEADER as u64;
        } else if valid < bytes.len() {
            tracing::warn!(path = %path.display(), valid, size = bytes.len(),
                "truncating a torn or corrupt tail of the offset file");
            file.set_len(len).map_err(io_err("truncating", path))?;
            file.sync_data().map_err(io_err("syncing", path))?;
        }
        Ok(OffsetStore {
            map: RwLock::new(map),
            file: Some(Mutex::new(OffsetFile {
                vfs,
                path: path.to_path_buf(),
                file,
                len,
                records,
                compact_after,
            })),
        })
    }

    /// Records `offset` for consumer `name`; for the file kind it is durable
    /// when this returns.
    pub fn commit(&self, name: &str, offset: u64) -> Result<()> {
        if name.len() > usize::from(u16::MAX) {
            return Err(StorageError::InvalidArgument(format!(
                "consumer name of {} bytes is longer than 65535 bytes",
                name.len()
            )));
        }
        let Some(file) = &self.file else {
            self.map.write().insert(name.to_string(), offset);
            return Ok(());
        };
        let mut f = file.lock();
        let mut rec = Vec::with_capacity(RECORD_HEADER + name.len());
        encode_record(&mut rec, name, offset);
        if let Err(e) = f.file.write_all_at(&[&rec], f.len) {
            let _ = f.file.set_len(f.len);
            return Err(io_err("writing", &f.path)(e));
        }
        f.file.sync_data().map_err(io_err("syncing", &f.path))?;
        f.len += rec.len() as u64;
        f.records += 1;
        let live = {
            let mut map = self.map.write();
            map.insert(name.to_string(), offset);
            map.len()
        };
        if f.records >= f.compact_after && f.records >= 2 * live {
            if let Err(e) = self.compact(&mut f) {
                tracing::warn!(path = %f.path.display(), error = %e, "offset file compaction failed");
            }
        }
        Ok(())
    }

    fn compact(&self, f: &mut OffsetFile) -> Result<()> {
        let mut bytes = file_header();
        let entries = self.all();
        for (name, offset) in &entries {
            encode_record(&mut bytes, name, *offset);
        }
        let mut tmp_name = f.path.as_os_str().to_owned();
        tmp_name.push(".tmp");
        let tmp = PathBuf::from(tmp_name);
        let file = f.vfs.open(&tmp, true).map_err(io_err("creating", &tmp))?;
        file.set_len(0).map_err(io_err("truncating", &tmp))?;
        file.write_all_at(&[&bytes], 0)
            .map_err(io_err("writing", &tmp))?;
        file.sync_data().map_err(io_err("syncing", &tmp))?;
        f.vfs
            .rename(&tmp, &f.path)
            .map_err(io_err("renaming", &tmp))?;
        if let Some(dir) = f.path.parent() {
            f.vfs
                .sync_dir(dir)
                .map_err(io_err("syncing the directory of", &f.path))?;
        }
        tracing::debug!(path = %f.path.display(), records = f.records, live = entries.len(),
            "compacted the offset file");
        f.file = file;
        f.len = bytes.len() as u64;
        f.records = entries.len();
        Ok(())
    }

    /// The committed offset of consumer `name`, if any.
    pub fn get(&self, name: &str) -> Option<u64> {
        self.map.read().get(name).copied()
    }

    /// Every (consumer name, committed offset), sorted by name.
    pub fn all(&self) -> Vec<(String, u64)> {
        let mut v: Vec<(String, u64)> = self
            .map
            .read()
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        v.sort();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_file_is_compacted_when_it_grows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("offsets");
        {
            let store = OffsetStore::open_inner(Arc::new(RealFs), &path, 32).unwrap();
            for i in 0..300u64 {
                store.commit(["a", "b", "c"][(i % 3) as usize], i).unwrap();
            }
        }
        let len = std::fs::metadata(&path).unwrap().len();
        assert!(
            len < 32 * 20,
            "offset file was never compacted: {len} bytes"
        );
        let store = OffsetStore::open(&path).unwrap();
        let expected = vec![
            ("a".to_string(), 297),
            ("b".to_string(), 298),
            ("c".to_string(), 299),
        ];
        assert_eq!(store.all(), expected);
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "no temporary file left behind");
    }
}
