//! The directory tier: objects are files under a root directory (a parallel
//! file system or any mounted path), written through [`crate::vfs::Vfs`] so
//! that the simulated disk covers the tier side of the copy protocol too.
//! A put writes `<key>.tmp`, fsyncs it, renames it over `<key>` and fsyncs
//! the directory.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{read_file_range, tier_io, TierStore, CHUNK};
use crate::vfs::{create_dir_durable, RealFs, Vfs, VfsFile};
use crate::Result;

/// A tier in a directory.
pub struct DirTier {
    root: PathBuf,
    vfs: Arc<dyn Vfs>,
}

impl DirTier {
    /// A tier rooted at `root` on the real file system (created if missing).
    pub fn new(root: &Path) -> Result<Self> {
        Self::with_vfs(Arc::new(RealFs), root)
    }

    /// A tier rooted at `root` on `vfs` (tests use the simulated disk).
    pub fn with_vfs(vfs: Arc<dyn Vfs>, root: &Path) -> Result<Self> {
        let tier = DirTier {
            root: root.to_path_buf(),
            vfs,
        };
        create_dir_durable(&*tier.vfs, root).map_err(|e| tier.err("creating", "", e))?;
        Ok(tier)
    }

    fn path(&self, key: &str) -> PathBuf {
        self.root.join(key)
    }

    fn err(&self, what: &str, key: &str, e: io::Error) -> crate::StorageError {
        tier_io(&self.describe(), what, key, e)
    }

    fn copy_in(&self, dst: &dyn VfsFile, src: &dyn VfsFile, key: &str) -> io::Result<()> {
        let len = src.len()?;
        dst.set_len(0)?;
        let mut pos = 0;
        while pos < len {
            let n = CHUNK.min(len - pos);
            let buf = read_file_range(src, pos, n)?;
            dst.write_all_at(&[&buf], pos)?;
            pos += n;
        }
        dst.sync_data()?;
        tracing::debug!(tier = %self.root.display(), key, bytes = len, "wrote a tier object");
        Ok(())
    }
}

impl TierStore for DirTier {
    fn put(&self, key: &str, src: &dyn VfsFile) -> Result<()> {
        let path = self.path(key);
        let parent = path.parent().unwrap_or(&self.root).to_path_buf();
        create_dir_durable(&*self.vfs, &parent)
            .map_err(|e| self.err("creating the directory of", key, e))?;
        let tmp = PathBuf::from(format!("{}.tmp", path.display()));
        let file = self
            .vfs
            .open(&tmp, true)
            .map_err(|e| self.err("creating", key, e))?;
        self.copy_in(&*file, src, key)
            .map_err(|e| self.err("writing", key, e))?;
        drop(file);
        self.vfs
            .rename(&tmp, &path)
            .map_err(|e| self.err("renaming", key, e))?;
        self.vfs
            .sync_dir(&parent)
            .map_err(|e| self.err("syncing the directory of", key, e))
    }

    fn get_range(&self, key: &str, start: u64, len: u64) -> Result<Vec<u8>> {
        let file = self
            .vfs
            .open(&self.path(key), false)
            .map_err(|e| self.err("opening", key, e))?;
        read_file_range(&*file, start, len).map_err(|e| self.err("reading", key, e))
    }

    fn size(&self, key: &str) -> Result<u64> {
        let file = self
            .vfs
            .open(&self.path(key), false)
            .map_err(|e| self.err("opening", key, e))?;
        file.len()
            .map_err(|e| self.err("reading the size of", key, e))
    }

    /// Non-recursive: the objects in the directory part of `prefix` whose
    /// names start with its last part (temporary files excluded).
    fn list(&self, prefix: &str) -> Result<Vec<(String, u64)>> {
        let (dir, start) = match prefix.rsplit_once('/') {
            Some((d, s)) => (d, s),
            None => ("", prefix),
        };
        let names = match self.vfs.list(&self.root.join(dir)) {
            Ok(names) => names,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(self.err("listing", prefix, e)),
        };
        let mut out = Vec::new();
        for name in names
            .iter()
            .filter(|n| n.starts_with(start) && !n.ends_with(".tmp"))
        {
            let key = if dir.is_empty() {
                name.clone()
            } else {
                format!("{dir}/{name}")
            };
            if let Ok(size) = self.size(&key) {
                out.push((key, size));
            }
        }
        out.sort();
        Ok(out)
    }

    fn delete(&self, key: &str) -> Result<()> {
        let path = self.path(key);
        match self.vfs.remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(self.err("removing", key, e)),
        }
        let parent = path.parent().unwrap_or(&self.root);
        self.vfs
            .sync_dir(parent)
            .map_err(|e| self.err("syncing the directory of", key, e))
    }

    /// Syncs the object's file and its directory: a put whose writer
    /// died between its rename and its directory fsync becomes durable.
    fn make_durable(&self, key: &str) -> Result<()> {
        let path = self.path(key);
        let file = self
            .vfs
            .open(&path, false)
            .map_err(|e| self.err("opening", key, e))?;
        file.sync_data().map_err(|e| self.err("syncing", key, e))?;
        drop(file);
        let parent = path.parent().unwrap_or(&self.root);
        self.vfs
            .sync_dir(parent)
            .map_err(|e| self.err("syncing the directory of", key, e))
    }

    fn describe(&self) -> String {
        self.root.display().to_string()
    }
}
