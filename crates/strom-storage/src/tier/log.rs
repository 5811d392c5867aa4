//! [`TieredLog`]: a file partition log with a second tier. Appends, syncs
//! and reads at or above the first local segment go to the local
//! [`FileLog`]; reads below it go to the segment fetched from the tier.
//! [`PartitionLog::tier_pass`] copies the oldest closed segment not yet in
//! the tier, records it in the manifest once verified, then
//! applies the local retention, which only ever drops segments the
//! manifest lists. What a pass copies depends on the log's [`TierRole`]:
//! a follower of a replicated partition records the leader's copies
//! instead (`adopt.rs`). `enforce_retention` applies the topic's retention
//! to the whole log, tier included.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;

use super::adopt::adopt_segment;
use super::cache::SegmentCache;
use super::copy::copy_segment;
use super::manifest::{Manifest, TieredSegment};
use super::{segment_key, TierRole, TierStore};
use crate::file::SegmentReader;
use crate::vfs::Vfs;
use crate::{
    AppendBatch, Appended, FileLog, LogConfig, LogStats, PartitionLog, ReplicaBatch, Result,
    StorageError, StoredBatch, SyncToken, VerifyReport,
};

/// How one partition uses the tier.
#[derive(Clone, Debug)]
pub struct TierSettings {
    /// Key prefix of the partition's objects (e.g. `topic.7/0`).
    pub prefix: String,
    /// Keep at most this many bytes of segments locally (the active segment
    /// always stays); only segments verified in the tier are dropped.
    pub local_retention_bytes: Option<u64>,
    /// Drop local segments (verified in the tier) whose newest batch is
    /// older than this.
    pub local_retention_ms: Option<u64>,
    /// Segments fetched from the tier kept in the cache directory.
    pub cache_segments: usize,
    /// The role the log opens with (see [`PartitionLog::set_tier_role`]):
    /// a copy of a replicated partition opens as a follower that may
    /// record nothing (`Follower { below: 0 }`) until its role is known.
    pub role: TierRole,
}

impl Default for TierSettings {
    fn default() -> Self {
        TierSettings {
            prefix: String::new(),
            local_retention_bytes: None,
            local_retention_ms: None,
            cache_segments: 4,
            role: TierRole::Sole,
        }
    }
}

/// What is where, for status and metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TierStats {
    /// Segments verified in the tier (some may still be local too).
    pub tiered_segments: u32,
    pub tiered_bytes: u64,
    /// Segments only in the tier (dropped locally).
    pub remote_only_segments: u32,
}

/// A file partition log with a second tier.
pub struct TieredLog {
    local: FileLog,
    store: Arc<dyn TierStore>,
    settings: TierSettings,
    retention_bytes: Option<u64>,
    retention_ms: Option<u64>,
    /// The manifest as last stored.
    manifest: Mutex<Manifest>,
    cache: SegmentCache,
    /// Serializes copy passes, retention and truncation.
    pass: Mutex<()>,
    role: Mutex<TierRole>,
    stopping: AtomicBool,
    /// Bytes uploaded, tier reads and failures since it opened (metrics).
    uploaded: AtomicU64,
    reads: AtomicU64,
    errors: AtomicU64,
}

impl TieredLog {
    /// Opens (`create`: or creates) the partition in `dir` on `vfs`, with
    /// `store` as its tier. The topic's retention in `config` applies to
    /// the whole log, tier included.
    pub fn open_with(
        vfs: Arc<dyn Vfs>,
        dir: &Path,
        config: LogConfig,
        create: bool,
        store: Arc<dyn TierStore>,
        settings: TierSettings,
    ) -> Result<Self> {
        let local_config = LogConfig {
            retention_bytes: None,
            retention_ms: None,
            ..config.clone()
        };
        let local = if create {
            FileLog::create_with(vfs.clone(), dir, local_config)?
        } else {
            FileLog::open_with(vfs.clone(), dir, local_config)?
        };
        let manifest = Manifest::load(&*vfs, dir)?;
        let interval = u64::from(config.index_interval_bytes);
        let cache = SegmentCache::open(vfs, dir, settings.cache_segments, interval)?;
        if let Some(last) = manifest.segments.last() {
            if last.next < local.first_offset() {
                tracing::error!(dir = %dir.display(), tier_end = last.next, local_first = local.first_offset(),
                    "offsets between the tier and the local segments are missing");
            }
        }
        tracing::info!(dir = %dir.display(), tier = %store.describe(), prefix = %settings.prefix,
            tiered = manifest.segments.len(), role = ?settings.role, "tiered partition log opened");
        Ok(TieredLog {
            local,
            store,
            retention_bytes: config.retention_bytes,
            retention_ms: config.retention_ms,
            manifest: Mutex::new(manifest),
            cache,
            pass: Mutex::new(()),
            role: Mutex::new(settings.role),
            settings,
            stopping: AtomicBool::new(false),
            uploaded: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            errors: AtomicU64::new(0),
        })
    }

    /// The local log.
    pub fn local(&self) -> &FileLog {
        &self.local
    }

    /// The manifest as last stored.
    pub fn manifest(&self) -> Manifest {
        self.manifest.lock().clone()
    }

    pub fn tier_stats(&self) -> TierStats {
        let m = self.manifest.lock();
        let local_first = self.local.first_offset();
        TierStats {
            tiered_segments: m.segments.len() as u32,
            tiered_bytes: m.bytes(),
            remote_only_segments: m.segments.iter().filter(|s| s.base < local_first).count() as u32,
        }
    }

    /// What the tier holds of this partition and what this copy did with it.
    fn counters(&self) -> crate::TierLogStats {
        let m = self.manifest.lock();
        crate::TierLogStats {
            tiered_bytes: m.bytes(),
            tiered_segments: m.segments.len() as u32,
            uploaded_bytes: self.uploaded.load(Ordering::Relaxed),
            reads: self.reads.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
        }
    }

    /// Tiered segments that are no longer local, oldest first.
    fn remote_only(&self) -> Vec<TieredSegment> {
        let local_first = self.local.first_offset();
        let m = self.manifest.lock();
        m.segments
            .iter()
            .take_while(|s| s.base < local_first)
            .copied()
            .collect()
    }

    /// The tiered segment holding `offset`, if it is below the local log.
    fn remote_holding(&self, offset: u64) -> Result<TieredSegment> {
        let held = self.manifest.lock().holding(offset);
        match held {
            Some(s) if offset < self.local.first_offset() => Ok(s),
            _ => Err(StorageError::OffsetOutOfRange {
                requested: offset,
                first: self.first_offset(),
                next: self.local.next_offset(),
            }),
        }
    }

    /// The reader of a segment only in the tier (cached); counted as a
    /// tier read, and as an error if it fails.
    fn fetch(&self, seg: &TieredSegment) -> Result<Arc<SegmentReader>> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        let r = self.cache.get(&*self.store, &self.settings.prefix, seg);
        if r.is_err() {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    /// The role the copy passes follow now.
    pub fn role(&self) -> TierRole {
        *self.role.lock()
    }

    /// Stores `m` as the manifest (durably) and publishes it.
    fn store_manifest(&self, m: Manifest) -> Result<()> {
        m.store(&**self.local.vfs(), self.local.dir())?;
        *self.manifest.lock() = m;
        Ok(())
    }

    /// Removes tiered segments from the manifest (durably first), then,
    /// with `delete_objects`, their objects: a crash in between leaves
    /// unreferenced objects, never a manifest naming a deleted one. The
    /// copies of a replicated partition share the objects, so only its
    /// leader deletes them.
    fn forget_tiered(&self, bases: &[u64], delete_objects: bool) -> Result<()> {
        if bases.is_empty() {
            return Ok(());
        }
        let mut m = self.manifest.lock().clone();
        m.segments.retain(|s| !bases.contains(&s.base));
        self.store_manifest(m)?;
        for &base in bases {
            self.cache.forget(base);
            if !delete_objects {
                continue;
            }
            for ext in ["log", "data"] {
                self.store
                    .delete(&segment_key(&self.settings.prefix, base, ext))?;
            }
            tracing::info!(tier = %self.store.describe(), segment = base, "removed a segment from the tier");
        }
        Ok(())
    }

    /// Copies the oldest closed segment not in the tier yet, if any and if
    /// `role` lets it (a follower records the leader's copy instead).
    fn copy_next(&self, role: TierRole) -> Result<u32> {
        if self.stopping.load(Ordering::Acquire) {
            return Ok(0);
        }
        let end = self.manifest.lock().segments.last().map_or(0, |s| s.next);
        let closed = self.local.closed_segments();
        let Some(seg) = closed.iter().find(|s| s.base >= end) else {
            return Ok(0);
        };
        if seg.next > role.below() {
            return Ok(0);
        }
        let (store, prefix, vfs) = (&*self.store, &self.settings.prefix, self.local.vfs());
        let entry = match role {
            TierRole::Follower { .. } => match adopt_segment(store, prefix, vfs, seg)? {
                Some(entry) => entry,
                None => return Ok(0),
            },
            TierRole::Sole | TierRole::Leader { .. } => copy_segment(store, prefix, vfs, seg)?,
        };
        let mut m = self.manifest.lock().clone();
        m.segments.push(entry);
        self.store_manifest(m)?;
        if !matches!(role, TierRole::Follower { .. }) {
            self.uploaded.fetch_add(entry.size(), Ordering::Relaxed);
        }
        Ok(1)
    }

    /// Runs [`PartitionLog::tier_pass`] until nothing is left to copy;
    /// returns how many segments it copied.
    pub fn copy_all(&self) -> Result<u32> {
        let mut copied = 0;
        loop {
            match self.tier_pass()? {
                0 => return Ok(copied),
                n => copied += n,
            }
        }
    }

    /// Drops local segments verified in the tier, per the local retention.
    fn enforce_local_retention(&self, now_us: u64) -> Result<u32> {
        let (bytes, ms) = (
            self.settings.local_retention_bytes,
            self.settings.local_retention_ms,
        );
        if bytes.is_none() && ms.is_none() {
            return Ok(0);
        }
        let tiered = self.manifest.lock().clone();
        let dropped = self.local.drop_oldest_while(|seg, total| {
            let too_big = bytes.is_some_and(|limit| total > limit);
            let too_old =
                ms.is_some_and(|ms| seg.max_ts.saturating_add(ms.saturating_mul(1000)) < now_us);
            tiered.contains(seg.base) && (too_big || too_old)
        })?;
        if !dropped.is_empty() {
            tracing::info!(dir = %self.local.dir().display(), segments = dropped.len(),
                first_local = self.local.first_offset(), "dropped local segments kept in the tier");
        }
        Ok(dropped.len() as u32)
    }

    fn too_old(&self, max_ts: u64, now_us: u64) -> bool {
        self.retention_ms
            .is_some_and(|ms| max_ts.saturating_add(ms.saturating_mul(1000)) < now_us)
    }

    /// The topic's retention over segments only in the tier; returns how
    /// many it removed.
    fn retain_remote(&self, now_us: u64) -> Result<u32> {
        let remote = self.remote_only();
        let mut total =
            remote.iter().map(TieredSegment::size).sum::<u64>() + self.local.stats().bytes;
        let mut gone = Vec::new();
        for s in &remote {
            let too_big = self.retention_bytes.is_some_and(|limit| total > limit);
            if !(too_big || self.too_old(s.max_ts, now_us)) {
                break;
            }
            total -= s.size();
            gone.push(s.base);
        }
        self.forget_tiered(&gone, self.role().owns_objects())?;
        Ok(gone.len() as u32)
    }
}

impl PartitionLog for TieredLog {
    fn append(&self, batch: AppendBatch<'_>) -> Result<Appended> {
        self.local.append(batch)
    }

    fn append_replica(&self, batch: ReplicaBatch<'_>) -> Result<Appended> {
        self.local.append_replica(batch)
    }

    /// Truncation stays within the local segments; tiered segments it cuts
    /// into are removed from the manifest first, and from the tier when
    /// this is the only copy. A replicated partition tiers only segments
    /// below its high watermark, which no truncation reaches, so its
    /// truncations never meet a tiered segment; if one did, the objects
    /// stay, since other copies may rely on them.
    fn truncate_from(&self, offset: u64) -> Result<u64> {
        let _pass = self.pass.lock();
        if offset < self.local.first_offset() && offset >= self.first_offset() {
            return Err(StorageError::InvalidArgument(format!(
                "cannot truncate from offset {offset}: it is in a segment kept only in the tier"
            )));
        }
        let cut: Vec<u64> = {
            let m = self.manifest.lock();
            m.segments
                .iter()
                .filter(|s| s.next > offset)
                .map(|s| s.base)
                .collect()
        };
        if !cut.is_empty() {
            tracing::warn!(dir = %self.local.dir().display(), offset, segments = cut.len(),
                "truncation cuts into tiered segments; they leave the manifest");
        }
        self.forget_tiered(&cut, self.role() == TierRole::Sole)?;
        self.local.truncate_from(offset)
    }

    fn sync(&self, token: SyncToken) -> Result<()> {
        self.local.sync(token)
    }

    fn sync_all(&self) -> Result<()> {
        self.local.sync_all()
    }

    fn read(&self, from: u64, max_bytes: usize) -> Result<Vec<StoredBatch>> {
        if from >= self.local.first_offset() {
            match self.local.read(from, max_bytes) {
                // Local retention dropped the segment meanwhile.
                Err(StorageError::OffsetOutOfRange { .. }) if from < self.local.first_offset() => {}
                r => return r,
            }
        }
        let seg = self.remote_holding(from)?;
        self.fetch(&seg)?.read(from, max_bytes)
    }

    fn read_data(
        &self,
        batch_base: u64,
        ranges: &[(u64, u64)],
        out: &mut Vec<Bytes>,
    ) -> Result<()> {
        if batch_base >= self.local.first_offset() {
            match self.local.read_data(batch_base, ranges, out) {
                Err(StorageError::OffsetOutOfRange { .. })
                    if batch_base < self.local.first_offset() => {}
                r => return r,
            }
        }
        let seg = self.remote_holding(batch_base)?;
        self.fetch(&seg)?.read_data(batch_base, ranges, out)
    }

    /// The first offset in the tier (or of the local log, with nothing
    /// only in the tier).
    fn first_offset(&self) -> u64 {
        let local_first = self.local.first_offset();
        let m = self.manifest.lock();
        m.segments
            .first()
            .map_or(local_first, |s| s.base.min(local_first))
    }

    fn next_offset(&self) -> u64 {
        self.local.next_offset()
    }

    fn offset_for_timestamp(&self, ts_us: u64) -> u64 {
        for seg in self.remote_only().iter().filter(|s| s.max_ts >= ts_us) {
            match self.fetch(seg).and_then(|r| r.offset_for_timestamp(ts_us)) {
                Ok(Some(offset)) => return offset,
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!(segment = seg.base, error = %e,
                        "timestamp lookup in the tier failed; answering with the segment start");
                    return seg.base;
                }
            }
        }
        self.local.offset_for_timestamp(ts_us)
    }

    /// The topic's retention over the whole log: segments only in the tier
    /// go first (manifest, then objects), then local segments (and their
    /// tier copies).
    fn enforce_retention(&self, now_us: u64) -> Result<u32> {
        // A copy in progress can take long: retention runs again soon.
        let Some(_pass) = self.pass.try_lock() else {
            return Ok(0);
        };
        let remote = self.retain_remote(now_us)?;
        let remote_bytes: u64 = self.remote_only().iter().map(TieredSegment::size).sum();
        let (bytes, ms) = (self.retention_bytes, self.retention_ms);
        let dropped = self.local.drop_oldest_while(|seg, total| {
            let too_big = bytes.is_some_and(|limit| total + remote_bytes > limit);
            let too_old =
                ms.is_some_and(|ms| seg.max_ts.saturating_add(ms.saturating_mul(1000)) < now_us);
            too_big || too_old
        })?;
        let tiered: Vec<u64> = {
            let m = self.manifest.lock();
            dropped.iter().copied().filter(|b| m.contains(*b)).collect()
        };
        self.forget_tiered(&tiered, self.role().owns_objects())?;
        Ok(remote + dropped.len() as u32)
    }

    fn seal_rolled(&self) -> Result<u32> {
        self.local.seal_rolled()
    }

    fn set_tier_role(&self, role: TierRole) {
        let old = std::mem::replace(&mut *self.role.lock(), role);
        if std::mem::discriminant(&old) != std::mem::discriminant(&role) {
            tracing::info!(dir = %self.local.dir().display(), ?old, new = ?role, "tier role changed");
        }
    }

    /// Copies at most one segment per call, so that the caller can stop
    /// between segments (the server's tier thread calls it again while it
    /// copies something).
    fn tier_pass(&self) -> Result<u32> {
        let _pass = self.pass.lock();
        self.local.seal_rolled()?;
        let copied = self.copy_next(self.role());
        if copied.is_err() {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        // Segments verified before a failed copy may still be dropped.
        self.enforce_local_retention(crate::now_us())?;
        copied
    }

    fn stats(&self) -> LogStats {
        let local = self.local.stats();
        let remote = self.remote_only();
        LogStats {
            first_offset: self.first_offset(),
            next_offset: local.next_offset,
            bytes: local.bytes + remote.iter().map(TieredSegment::size).sum::<u64>(),
            segments: local.segments + remote.len() as u32,
            tier: Some(self.counters()),
        }
    }

    fn failure(&self) -> Option<String> {
        self.local.failure()
    }

    fn close(&self) -> Result<()> {
        self.stopping.store(true, Ordering::Release);
        self.local.close()
    }

    /// Scrubs the local segments; tier copies were verified when copied
    /// and are checked again whenever they are fetched.
    fn verify(&self) -> Result<VerifyReport> {
        self.local.verify()
    }
}
