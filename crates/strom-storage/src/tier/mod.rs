//! Tiered storage of file partitions: closed segments are copied to a
//! second location (a directory on a parallel file system or any mounted
//! path, or an S3-compatible object store through `object_store`), verified
//! there, recorded in a manifest, and then dropped locally under a local
//! retention setting. Reads below the first local segment fetch the
//! segment from the tier into a bounded cache directory and serve it from
//! there, so a consumer replaying from offset 0 does not notice.
//!
//! The pieces: [`TierStore`] (put/get/get_range/list/delete of whole
//! objects) with a directory implementation ([`DirTier`]) and an
//! `object_store` one ([`ObjectTier`]); the manifest (`manifest.rs`); the
//! copy protocol (`copy.rs`); the fetched-segment cache (`cache.rs`); and
//! [`TieredLog`], a [`crate::PartitionLog`] over a [`crate::FileLog`]
//! (`log.rs`). The copies of a replicated partition share one tier: the
//! leader copies ([`TierRole::Leader`]) and the followers record copies
//! they verified against their own files (`adopt.rs`,
//! [`TierRole::Follower`]). The protocol and its crash safety are in
//! `docs/tiering.md`.

mod adopt;
mod cache;
mod copy;
mod dir;
mod log;
mod manifest;
mod object;

use std::io;

pub use dir::DirTier;
pub use log::{TierSettings, TierStats, TieredLog};
pub use manifest::{Manifest, TieredSegment, MANIFEST_FILE};
pub use object::ObjectTier;

use crate::vfs::VfsFile;
use crate::{Result, StorageError};

/// Bytes moved per call when streaming an object in or out of the tier.
pub const CHUNK: u64 = 8 << 20;

/// A second storage location for closed segments. Objects are named by
/// `/`-separated keys. `put` is atomic: a reader sees the old object, or
/// none, or the whole new one, never a part.
pub trait TierStore: Send + Sync + 'static {
    /// Stores the whole of `src` (its current length) under `key`, durably.
    fn put(&self, key: &str, src: &dyn VfsFile) -> Result<()>;
    /// The whole object.
    fn get(&self, key: &str) -> Result<Vec<u8>> {
        let len = self.size(key)?;
        self.get_range(key, 0, len)
    }
    /// `len` bytes of the object from `start`; an error if it is shorter.
    fn get_range(&self, key: &str, start: u64, len: u64) -> Result<Vec<u8>>;
    /// Size of the object in bytes (a missing object is an I/O error of
    /// kind NotFound).
    fn size(&self, key: &str) -> Result<u64>;
    /// Keys (with sizes) starting with `prefix`, in key order.
    fn list(&self, prefix: &str) -> Result<Vec<(String, u64)>>;
    /// Removes the object; a missing one is not an error.
    fn delete(&self, key: &str) -> Result<()>;
    /// Makes the object as it is now durable, whoever stored it (a
    /// follower calls it before it relies on the leader's copy). The
    /// default suits object stores, where a completed upload is durable.
    fn make_durable(&self, key: &str) -> Result<()> {
        let _ = key;
        Ok(())
    }
    /// Where the tier is, for logs and errors (a path or a URL).
    fn describe(&self) -> String;
}

/// What a tiered log does in its copy pass, which depends on its place
/// among the copies of the partition (they all share one tier, under one
/// key prefix).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TierRole {
    /// The only copy (replication factor 1): copies every closed segment,
    /// and deletes the tier objects of the segments its retention removes.
    Sole,
    /// The leader of a replicated partition: copies the closed segments
    /// that end at or below `below` (its high watermark, so a copy in the
    /// tier is never cut by a later truncation), and deletes the tier
    /// objects of the segments the topic's retention removes.
    Leader { below: u64 },
    /// A follower (or a copy without a role yet): copies nothing, records a
    /// closed segment ending at or below `below` once the tier holds a
    /// durable copy byte-identical to its own files, and never deletes a
    /// tier object (the leader does).
    Follower { below: u64 },
}

impl TierRole {
    /// Whether this copy may delete tier objects.
    pub fn owns_objects(self) -> bool {
        !matches!(self, TierRole::Follower { .. })
    }

    /// The end, exclusive, of the offsets this copy may copy or record.
    pub fn below(self) -> u64 {
        match self {
            TierRole::Sole => u64::MAX,
            TierRole::Leader { below } | TierRole::Follower { below } => below,
        }
    }
}

/// The key of one file of the segment at `base` of the partition whose
/// keys start with `prefix`.
pub fn segment_key(prefix: &str, base: u64, ext: &str) -> String {
    let name = format!("{base:020}.{ext}");
    if prefix.is_empty() {
        name
    } else {
        format!("{}/{name}", prefix.trim_end_matches('/'))
    }
}

/// An I/O error of the tier at `key`.
pub(crate) fn tier_io(store: &str, what: &str, key: &str, e: io::Error) -> StorageError {
    StorageError::io(format!("{what} {key} in the tier {store}"), e)
}

/// CRC32C and length of `len` bytes read through `read(pos, len)`, in
/// chunks of [`CHUNK`].
pub(crate) fn crc_by_chunks(
    len: u64,
    mut read: impl FnMut(u64, u64) -> Result<Vec<u8>>,
) -> Result<u32> {
    let mut crc = 0u32;
    let mut pos = 0;
    while pos < len {
        let n = CHUNK.min(len - pos);
        let buf = read(pos, n)?;
        if buf.len() as u64 != n {
            return Err(StorageError::corrupt(format!(
                "short read: {} bytes at {pos}, expected {n}",
                buf.len()
            )));
        }
        crc = crc32c::crc32c_append(crc, &buf);
        pos += n;
    }
    Ok(crc)
}

/// Reads `len` bytes of `file` at `pos`.
pub(crate) fn read_file_range(file: &dyn VfsFile, pos: u64, len: u64) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len as usize];
    file.read_exact_at(&mut buf, pos)?;
    Ok(buf)
}
