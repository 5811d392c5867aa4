//! The fetched-segment cache: a read below the first local segment fetches
//! the whole segment (`.log` and `.data`) from the tier into
//! `<partition>/tier-cache/`, checks the length and CRC32C of both files
//! against the manifest, and opens it as a read-only segment (a scan that
//! also checks every record CRC rebuilds its index). At most `capacity`
//! segments stay cached; the least recently used one is removed first
//! (readers still holding it keep reading their open files). The cache is
//! emptied when the partition is opened.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use super::{crc_by_chunks, segment_key, TierStore, TieredSegment};
use crate::file::SegmentReader;
use crate::vfs::{create_dir_durable, Vfs, VfsFile};
use crate::{Result, StorageError};

pub(crate) const CACHE_DIR: &str = "tier-cache";
const EXTENSIONS: [&str; 4] = ["log", "data", "index", "timeindex"];

pub(crate) struct SegmentCache {
    vfs: Arc<dyn Vfs>,
    dir: PathBuf,
    capacity: usize,
    index_interval: u64,
    /// Least recently used first.
    entries: Mutex<Vec<(u64, Arc<SegmentReader>)>>,
    /// One fetch at a time.
    fetching: Mutex<()>,
}

impl SegmentCache {
    /// The cache of the partition in `partition_dir`, emptied.
    pub(crate) fn open(
        vfs: Arc<dyn Vfs>,
        partition_dir: &Path,
        capacity: usize,
        index_interval: u64,
    ) -> Result<Self> {
        let dir = partition_dir.join(CACHE_DIR);
        let io_err = |e| StorageError::io(format!("preparing {}", dir.display()), e);
        create_dir_durable(&*vfs, &dir).map_err(io_err)?;
        for name in vfs.list(&dir).map_err(io_err)? {
            let _ = vfs.remove_file(&dir.join(name));
        }
        Ok(SegmentCache {
            vfs,
            dir,
            capacity: capacity.max(1),
            index_interval,
            entries: Mutex::new(Vec::new()),
            fetching: Mutex::new(()),
        })
    }

    fn hit(&self, base: u64) -> Option<Arc<SegmentReader>> {
        let mut entries = self.entries.lock();
        let i = entries.iter().position(|(b, _)| *b == base)?;
        let e = entries.remove(i);
        let reader = e.1.clone();
        entries.push(e);
        Some(reader)
    }

    /// The segment `seg`, from the cache or fetched from `store`.
    pub(crate) fn get(
        &self,
        store: &dyn TierStore,
        prefix: &str,
        seg: &TieredSegment,
    ) -> Result<Arc<SegmentReader>> {
        if let Some(r) = self.hit(seg.base) {
            return Ok(r);
        }
        let _one = self.fetching.lock();
        if let Some(r) = self.hit(seg.base) {
            return Ok(r);
        }
        self.remove_files(seg.base);
        let fetched = self.fetch(store, prefix, seg);
        let reader = match fetched {
            Ok(r) => Arc::new(r),
            Err(e) => {
                self.remove_files(seg.base);
                return Err(e);
            }
        };
        let mut entries = self.entries.lock();
        entries.push((seg.base, reader.clone()));
        while entries.len() > self.capacity {
            let (old, _) = entries.remove(0);
            self.remove_files(old);
        }
        Ok(reader)
    }

    fn fetch(
        &self,
        store: &dyn TierStore,
        prefix: &str,
        seg: &TieredSegment,
    ) -> Result<SegmentReader> {
        for (ext, len, crc) in [
            ("log", seg.log_len, seg.log_crc),
            ("data", seg.data_len, seg.data_crc),
        ] {
            let key = segment_key(prefix, seg.base, ext);
            let path = self.dir.join(format!("{:020}.{ext}", seg.base));
            let file = self
                .vfs
                .open(&path, true)
                .map_err(|e| StorageError::io(format!("creating {}", path.display()), e))?;
            self.fetch_file(store, &key, &*file, len, crc)?;
        }
        tracing::info!(tier = %store.describe(), segment = seg.base, bytes = seg.size(),
            "fetched a segment from the tier");
        SegmentReader::open(&self.vfs, &self.dir, seg.base, self.index_interval)
    }

    /// Copies object `key` into `file`, checking its length and CRC.
    fn fetch_file(
        &self,
        store: &dyn TierStore,
        key: &str,
        file: &dyn VfsFile,
        len: u64,
        crc: u32,
    ) -> Result<()> {
        let corrupt = |why: String| {
            tracing::error!(tier = %store.describe(), key, why, "corrupt tier copy");
            StorageError::corrupt(format!(
                "tier copy {key} in {}: {why}; the segment cannot be served from the tier",
                store.describe()
            ))
        };
        let size = match store.size(key) {
            Ok(n) => n,
            Err(StorageError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                return Err(corrupt("missing".into()))
            }
            Err(e) => return Err(e),
        };
        if size != len {
            return Err(corrupt(format!("{size} bytes, the manifest says {len}")));
        }
        let got = crc_by_chunks(len, |p, n| {
            let buf = store.get_range(key, p, n)?;
            file.write_all_at(&[&buf], p)
                .map_err(|e| StorageError::io(format!("writing the cached copy of {key}"), e))?;
            Ok(buf)
        })?;
        if got != crc {
            return Err(corrupt(format!(
                "checksum {got:#010x}, the manifest says {crc:#010x}"
            )));
        }
        Ok(())
    }

    /// Forgets a segment removed from the tier.
    pub(crate) fn forget(&self, base: u64) {
        self.entries.lock().retain(|(b, _)| *b != base);
        self.remove_files(base);
    }

    fn remove_files(&self, base: u64) {
        for ext in EXTENSIONS {
            let _ = self
                .vfs
                .remove_file(&self.dir.join(format!("{base:020}.{ext}")));
        }
    }
}
