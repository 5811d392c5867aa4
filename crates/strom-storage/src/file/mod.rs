//! The file backend: a persistent partition log made of segments in one
//! directory. This module owns the segment list, the write path (append,
//! roll, group-commit sync), the read paths across segments, recovery on
//! open (the same code path as a fresh start) and retention.
//!
//! Concurrency: one writer at a time (the `writer` mutex) appends to the
//! active segment with positional writes; readers take the `shared` read lock
//! only to pick `Arc<Segment>` handles, then read with `pread` without any
//! log-wide lock, up to the segment length they observed.
//!
//! Damage: offsets whose records or data are damaged on disk are
//! quarantined (`quarantine.rs`) and reported to readers as
//! `DataCorrupt { first, last }`; reads resume at `last + 1`.

mod cursor;
mod index;
mod quarantine;
mod read;
mod record;
mod scan;
mod segment;
mod tiered;
mod truncate;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::{Mutex, RwLock};

use self::quarantine::Quarantine;
use self::read::Walk;
use self::record::{RecordHeader, HEADER_LEN, MAX_META_LEN};
use self::segment::{OpenMode, Segment};
pub use self::tiered::{ClosedSegment, LocalSegment, SegmentReader};
use crate::memory::check_ranges;
use crate::sync_gate::SyncGate;
use crate::vfs::{RealFs, Vfs};
use crate::{
    check_batch, AppendBatch, Appended, LogConfig, LogStats, PartitionLog, ReplicaBatch, Result,
    Stamp, StorageError, StoredBatch, SyncToken, VerifyReport,
};

struct Shared {
    /// Oldest first; the last one is the active segment. Never empty.
    segments: Vec<Arc<Segment>>,
    first: u64,
    next: u64,
}

impl Shared {
    /// The segment holding `offset` (`offset >= first`).
    fn segment_for(&self, offset: u64) -> Arc<Segment> {
        let i = self.segments.partition_point(|s| s.base <= offset);
        self.segments[i.saturating_sub(1)].clone()
    }

    fn out_of_range(&self, requested: u64) -> StorageError {
        StorageError::OffsetOutOfRange {
            requested,
            first: self.first,
            next: self.next,
        }
    }
}

struct Writer {
    last_ts: u64,
    seq: u64,
}

/// Persistent partition log (the `file` partition type).
pub struct FileLog {
    dir: PathBuf,
    vfs: Arc<dyn Vfs>,
    config: LogConfig,
    quarantine: Quarantine,
    shared: RwLock<Shared>,
    writer: Mutex<Writer>,
    /// Highest sync token handed out.
    written: AtomicU64,
    group: SyncGate,
    /// Set by the first failed write or fsync: the log then refuses appends
    /// and syncs until reopened (see `fail`).
    failed: Mutex<Option<String>>,
    /// Closed cleanly (checkpointed) and nothing appended since.
    closed: std::sync::atomic::AtomicBool,
    /// Segments rolled away from and not sealed yet (fdatasync, then index
    /// files), oldest first. Sealing a full segment can take seconds of
    /// write-back, so a roll only queues it here: `sync` seals them before
    /// the active segment (so a sync still covers every earlier batch), and
    /// `seal_rolled` (the server's periodic pass) and `close` seal the rest.
    unsealed: Mutex<Vec<Arc<Segment>>>,
    /// Held while sealing, so that seals never run twice at once and
    /// retention waits for a seal in progress before removing its files.
    sealing: Mutex<()>,
}

/// Base offsets of the segments present in `dir` (from `.log` and `.data`).
fn list_segments(vfs: &dyn Vfs, dir: &Path) -> Result<BTreeSet<u64>> {
    let names = vfs
        .list(dir)
        .map_err(|e| StorageError::io(format!("listing {}", dir.display()), e))?;
    let mut bases = BTreeSet::new();
    for name in &names {
        let name = name.as_str();
        let Some((stem, ext)) = name.split_once('.') else {
            continue;
        };
        if stem.len() != 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(base) = stem.parse::<u64>() else {
            continue;
        };
        match ext {
            "log" | "data" => {
                bases.insert(base);
            }
            "index" | "timeindex" => {}
            _ => tracing::debug!(file = name, "ignoring unknown file in partition directory"),
        }
    }
    Ok(bases)
}

impl FileLog {
    /// Opens the existing partition log in `dir` and recovers it: sealed
    /// segments load or rebuild their indexes, the active segment is scanned
    /// (a torn tail is truncated, damage with valid records after it is
    /// quarantined). A missing directory is an error (code 300, NotFound):
    /// only [`FileLog::create`] makes new partitions.
    pub fn open(dir: &Path, config: LogConfig) -> Result<Self> {
        Self::open_with(Arc::new(RealFs), dir, config)
    }

    /// Creates the partition log in `dir` (and any missing parent, each
    /// fsync'ed into its parent), or opens it if it already exists. Call it
    /// only for a partition this server is asked to host for the first time.
    pub fn create(dir: &Path, config: LogConfig) -> Result<Self> {
        Self::create_with(Arc::new(RealFs), dir, config)
    }

    /// [`FileLog::open`] over the file system `vfs` (tests use a simulated
    /// disk, see [`crate::sim`]).
    pub fn open_with(vfs: Arc<dyn Vfs>, dir: &Path, config: LogConfig) -> Result<Self> {
        config.validate()?;
        let exists = vfs
            .exists(dir)
            .map_err(|e| StorageError::io(format!("checking {}", dir.display()), e))?;
        if !exists {
            return Err(StorageError::io(
                format!(
                    "opening partition directory {} (it does not exist: the partition was never \
                     created on this server or its data is gone; only create a partition this \
                     server is asked to host for the first time)",
                    dir.display()
                ),
                std::io::Error::from(std::io::ErrorKind::NotFound),
            ));
        }
        Self::load(vfs, dir, config, false)
    }

    /// [`FileLog::create`] over the file system `vfs`.
    pub fn create_with(vfs: Arc<dyn Vfs>, dir: &Path, config: LogConfig) -> Result<Self> {
        config.validate()?;
        let created = crate::vfs::create_dir_durable(&*vfs, dir)
            .map_err(|e| StorageError::io(format!("creating {}", dir.display()), e))?;
        if !created {
            tracing::info!(dir = %dir.display(), "partition directory already exists; opening it");
        }
        Self::load(vfs, dir, config, true)
    }

    /// Recovery, the same code path for a new and an existing partition.
    /// `new` allows starting without segments; otherwise only an empty
    /// directory (a `create` interrupted before its first segment) may.
    fn load(vfs: Arc<dyn Vfs>, dir: &Path, config: LogConfig, new: bool) -> Result<Self> {
        let interval = u64::from(config.index_interval_bytes);
        let quarantine = Quarantine::load(vfs.clone(), dir)?;
        let bases: Vec<u64> = list_segments(&*vfs, dir)?.into_iter().collect();
        let mut segments: Vec<Arc<Segment>> = Vec::with_capacity(bases.len().max(1));
        for (i, &base) in bases.iter().enumerate() {
            let mode = if i + 1 == bases.len() {
                OpenMode::Active
            } else {
                OpenMode::Sealed
            };
            let (seg, gaps) = Segment::open(&vfs, dir, base, interval, mode)?;
            for (first, last) in gaps {
                quarantine.add(first, last)?;
            }
            let next = seg.next_offset();
            // An empty segment is the leftover of an interrupted roll: any
            // but the last, or a last one starting inside the previous
            // segment (a roll that failed after creating its files, after
            // which appends went on in the previous segment).
            let overlaps = segments.last().is_some_and(|p| base < p.next_offset());
            if (mode == OpenMode::Sealed || overlaps) && seg.log_file_is_empty()? {
                tracing::warn!(segment = base, dir = %dir.display(), "removing an empty leftover segment");
                seg.delete_files();
                continue;
            }
            if let Some(prev) = segments.last() {
                let prev_end = prev.next_offset();
                if base < prev_end {
                    return Err(StorageError::corrupt(format!(
                        "segment {base} in {} overlaps the previous segment ending at offset {prev_end}",
                        dir.display()
                    )));
                }
                if base > prev_end {
                    tracing::error!(segment = base, prev_end, dir = %dir.display(),
                        "offsets missing between segments (lost to damage); quarantining them");
                    quarantine.add(prev_end, base - 1)?;
                }
            }
            tracing::debug!(segment = base, next_offset = next, "segment opened");
            segments.push(Arc::new(seg));
        }
        if segments.is_empty() {
            let names = vfs
                .list(dir)
                .map_err(|e| StorageError::io(format!("listing {}", dir.display()), e))?;
            if !new && !names.is_empty() {
                return Err(StorageError::corrupt(format!(
                    "partition directory {} holds no segment files but other files ({}): its \
                     data is gone; restore it, or delete the directory and create the partition \
                     again if losing its data is acceptable",
                    dir.display(),
                    names.join(", ")
                )));
            }
            segments.push(Arc::new(Segment::create(&vfs, dir, 0, interval)?));
            vfs.sync_dir(dir)
                .map_err(|e| StorageError::io(format!("syncing {}", dir.display()), e))?;
        }
        // Offsets are never reused: a quarantined range past the last valid
        // batch (damage found at the end of the active segment) still counts
        // as assigned.
        let active = &segments[segments.len() - 1];
        if let Some(&(_, last)) = quarantine.ranges().iter().max_by_key(|r| r.1) {
            if last >= active.next_offset() {
                active.skip_to(last.saturating_add(1));
            }
        }
        // Recovery may have created the missing half of a segment pair.
        vfs.sync_dir(dir)
            .map_err(|e| StorageError::io(format!("syncing {}", dir.display()), e))?;
        let first = segments[0].base;
        let next = active.next_offset();
        let last_ts = segments.iter().map(|s| s.max_ts()).max().unwrap_or(0);
        tracing::info!(dir = %dir.display(), first_offset = first, next_offset = next,
            segments = segments.len(), "file partition log opened");
        let log = FileLog {
            dir: dir.to_path_buf(),
            vfs,
            config,
            quarantine,
            shared: RwLock::new(Shared {
                segments,
                first,
                next,
            }),
            writer: Mutex::new(Writer { last_ts, seq: 0 }),
            written: AtomicU64::new(0),
            group: SyncGate::default(),
            failed: Mutex::new(None),
            closed: std::sync::atomic::AtomicBool::new(false),
            unsealed: Mutex::new(Vec::new()),
            sealing: Mutex::new(()),
        };
        log.resume_truncation()?;
        Ok(log)
    }

    /// A reader met a damaged record at `pos` of `seg` where offset
    /// `expected` was due: resync past it, quarantine the offsets in between,
    /// and return the first offset after the damage.
    fn repair(&self, seg: &Segment, pos: u64, expected: u64) -> Result<u64> {
        let (next_base, resync_pos) = seg.resync(pos, expected)?;
        tracing::error!(dir = %self.dir.display(), segment = seg.base, pos, expected, next_base,
            resync_pos, "a read met a damaged record");
        if next_base > expected {
            self.quarantine_live(expected, next_base - 1)?;
        }
        Ok(next_base)
    }

    /// Quarantines the part of `first..=last` below the log's end: a read
    /// or scrub racing with a truncation may meet the cut tail, which is
    /// gone, not damaged.
    fn quarantine_live(&self, first: u64, last: u64) -> Result<()> {
        let last = last.min(self.shared.read().next.saturating_sub(1));
        if first > last {
            return Ok(());
        }
        self.quarantine.add(first, last)
    }

    /// Enters the failed state (if not already in it) because of `error`,
    /// and returns `error`. After a failed fdatasync the kernel may have
    /// dropped the dirty pages while reads still see them, so no later sync
    /// can prove anything durable; after a failed write the files may hold
    /// bytes the log does not account for. Only reopening (recovery from
    /// what is on disk) is safe, as in PostgreSQL after the fsync-gate.
    fn fail(&self, error: StorageError) -> StorageError {
        let mut failed = self.failed.lock();
        if failed.is_none() {
            tracing::error!(dir = %self.dir.display(), error = %error,
                "partition log stopped after a failed write or fsync; reopen it to recover");
            *failed = Some(error.to_string());
        }
        error
    }

    /// `PartitionFailed` if the log is in the failed state.
    fn check_failed(&self) -> Result<()> {
        match &*self.failed.lock() {
            Some(cause) => Err(StorageError::PartitionFailed {
                cause: cause.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Poisons the log for any error but a full disk (which leaves the files
    /// as they were).
    fn fail_unless_full(&self, error: StorageError) -> StorageError {
        match error {
            StorageError::DiskFull { .. } => error,
            e => self.fail(e),
        }
    }

    /// Bytes of growth of the active segment between two checkpoints of its
    /// index (written by `sync`): an eighth of a segment, at most 128 MiB.
    fn checkpoint_every(&self) -> u64 {
        (self.config.segment_bytes / 8).clamp(1, 128 << 20)
    }

    /// Each repair leaves an index entry past the damage, so a read needs
    /// few; this bound only guards against a loop on an inconsistent index.
    fn check_repairs(&self, repairs: &mut u32, seg: &Segment) -> Result<()> {
        *repairs += 1;
        if *repairs > 64 {
            return Err(StorageError::corrupt(format!(
                "segment {} in {}: a read kept meeting damaged records; run a scrub",
                seg.base,
                self.dir.display()
            )));
        }
        Ok(())
    }

    /// The quarantined (damaged, never served) offset ranges, by first offset.
    pub fn quarantined(&self) -> Vec<(u64, u64)> {
        self.quarantine.ranges()
    }

    fn active(&self) -> Arc<Segment> {
        let s = self.shared.read();
        s.segments[s.segments.len() - 1].clone()
    }

    fn segment_after(&self, base: u64) -> Option<Arc<Segment>> {
        let s = self.shared.read();
        let i = s.segments.partition_point(|seg| seg.base <= base);
        s.segments.get(i).cloned()
    }

    /// Starts a new active segment after `old`, which is queued to be
    /// sealed off the append path (see `unsealed`).
    fn roll(&self, old: &Arc<Segment>) -> Result<Arc<Segment>> {
        let base = old.next_offset();
        let seg = Arc::new(Segment::create(
            &self.vfs,
            &self.dir,
            base,
            u64::from(self.config.index_interval_bytes),
        )?);
        // A failed directory fsync is a failed fsync: the log stops (and the
        // new segment's files, left empty, are removed on reopen).
        self.vfs.sync_dir(&self.dir).map_err(|e| {
            self.fail(StorageError::io(
                format!("syncing {}", self.dir.display()),
                e,
            ))
        })?;
        self.shared.write().segments.push(seg.clone());
        self.unsealed.lock().push(old.clone());
        tracing::info!(dir = %self.dir.display(), previous = old.base, segment = base, "rolled to a new segment");
        Ok(seg)
    }

    /// Seals every segment rolled away from so far, oldest first; a failed
    /// fdatasync stops the log (as any failed sync does).
    fn seal_unsealed(&self) -> Result<u32> {
        let _sealing = self.sealing.lock();
        let mut sealed = 0;
        loop {
            let Some(seg) = self.unsealed.lock().first().cloned() else {
                return Ok(sealed);
            };
            self.check_failed()?;
            seg.sync().map_err(|e| self.fail(e))?;
            // The segment is durable; without index files (a full disk) the
            // next open rebuilds them by a scan of the segment.
            if let Err(e) = seg.checkpoint(&seg.summary()) {
                tracing::warn!(dir = %self.dir.display(), segment = seg.base, error = %e,
                    "could not write the index files of a rolled segment; the next open rebuilds them");
            }
            self.unsealed.lock().retain(|s| !Arc::ptr_eq(s, &seg));
            tracing::debug!(dir = %self.dir.display(), segment = seg.base, "sealed a rolled segment");
            sealed += 1;
        }
    }
}

impl FileLog {
    /// The one append path of `append` and `append_replica`.
    fn append_stamped(&self, batch: AppendBatch<'_>, stamp: Stamp) -> Result<Appended> {
        self.closed.store(false, Ordering::Release);
        let data_len = check_batch(&batch, &self.config)?;
        let meta_len = batch.meta.len() as u64;
        if meta_len > MAX_META_LEN {
            return Err(StorageError::BatchTooLarge {
                size: meta_len,
                limit: MAX_META_LEN,
            });
        }
        let data_crc = batch
            .data
            .iter()
            .fold(0u32, |crc, seg| crc32c::crc32c_append(crc, seg));
        let mut w = self.writer.lock();
        self.check_failed()?;
        let mut seg = self.active();
        let (log_len, mut seg_data_len, base_offset, _) = seg.lens();
        let end = base_offset
            .checked_add(u64::from(batch.count))
            .ok_or_else(|| StorageError::InvalidArgument("offsets exhausted".into()))?;
        let ts = stamp.timestamp(base_offset, w.last_ts)?;
        let incoming = HEADER_LEN as u64 + meta_len + data_len;
        if base_offset > seg.base && log_len + seg_data_len + incoming > self.config.segment_bytes {
            seg = self.roll(&seg)?;
            seg_data_len = 0;
        }
        let header = RecordHeader {
            base_offset,
            count: batch.count,
            meta_len: meta_len as u32,
            timestamp_us: ts,
            data_pos: seg_data_len,
            data_len,
            data_crc,
        };
        if let Err(f) = seg.append(&header, batch.meta, batch.data) {
            return Err(if f.rolled_back {
                self.fail_unless_full(f.error)
            } else {
                self.fail(f.error)
            });
        }
        w.last_ts = ts;
        w.seq += 1;
        self.shared.write().next = end;
        self.written.store(w.seq, Ordering::Release);
        Ok(Appended {
            base_offset,
            count: batch.count,
            timestamp_us: ts,
            token: SyncToken(w.seq),
        })
    }
}

impl PartitionLog for FileLog {
    fn close(&self) -> Result<()> {
        if let Some(cause) = self.failed.lock().clone() {
            return Err(StorageError::PartitionFailed { cause });
        }
        self.checkpoint_on_close()?;
        self.closed.store(true, Ordering::Release);
        Ok(())
    }

    fn append(&self, batch: AppendBatch<'_>) -> Result<Appended> {
        self.append_stamped(batch, Stamp::Own)
    }

    fn append_replica(&self, batch: ReplicaBatch<'_>) -> Result<Appended> {
        let (batch, stamp) = batch.split();
        self.append_stamped(batch, stamp)
    }

    fn truncate_from(&self, offset: u64) -> Result<u64> {
        self.truncate(offset)
    }

    fn sync(&self, token: SyncToken) -> Result<()> {
        self.group.sync(
            token.0,
            || self.written.load(Ordering::Acquire),
            // Rolled segments were synced when sealed, so syncing the active
            // segment covers every token written before this point. Once a
            // sync failed, none may succeed again.
            || {
                self.check_failed()?;
                self.seal_unsealed()?;
                let seg = self.active();
                let checkpoint = seg
                    .checkpoint_due(self.checkpoint_every())
                    .then(|| seg.summary());
                seg.sync().map_err(|e| self.fail(e))?;
                if let Some(summary) = checkpoint {
                    // Only what was just synced: a restart after a crash
                    // scans the active segment from here on.
                    if let Err(e) = seg.checkpoint(&summary) {
                        tracing::warn!(dir = %self.dir.display(), segment = seg.base, error = %e,
                            "could not checkpoint the active segment");
                    }
                }
                Ok(())
            },
        )
    }

    fn sync_all(&self) -> Result<()> {
        self.sync(SyncToken(self.written.load(Ordering::Acquire)))
    }

    fn read(&self, from: u64, max_bytes: usize) -> Result<Vec<StoredBatch>> {
        let mut seg = {
            let s = self.shared.read();
            if from < s.first {
                return Err(s.out_of_range(from));
            }
            if from >= s.next {
                return Ok(Vec::new());
            }
            s.segment_for(from)
        };
        if let Some((first, last)) = self.quarantine.containing(from) {
            return Err(StorageError::DataCorrupt { first, last });
        }
        let stop_at = self.quarantine.next_start_after(from).unwrap_or(u64::MAX);
        let mut out = Vec::new();
        let mut bytes = 0usize;
        let mut repairs = 0u32;
        loop {
            match seg.read_batches(from, stop_at, max_bytes, &mut out, &mut bytes)? {
                Walk::Done(true) => break,
                Walk::Done(false) => match self.segment_after(seg.base) {
                    Some(next) => seg = next,
                    None => break,
                },
                Walk::Damaged { pos, expected } => {
                    self.check_repairs(&mut repairs, &seg)?;
                    let next_base = self.repair(&seg, pos, expected)?;
                    if !out.is_empty() {
                        break;
                    }
                    if from < next_base {
                        return Err(StorageError::DataCorrupt {
                            first: expected.min(from),
                            last: next_base - 1,
                        });
                    }
                    // The damage lies before `from`: the resync left an
                    // index entry past it, so the next walk skips it.
                }
            }
        }
        Ok(out)
    }

    fn read_data(
        &self,
        batch_base: u64,
        ranges: &[(u64, u64)],
        out: &mut Vec<Bytes>,
    ) -> Result<()> {
        let seg = {
            let s = self.shared.read();
            if batch_base < s.first || batch_base >= s.next {
                return Err(s.out_of_range(batch_base));
            }
            s.segment_for(batch_base)
        };
        if let Some((first, last)) = self.quarantine.containing(batch_base) {
            return Err(StorageError::DataCorrupt { first, last });
        }
        let mut repairs = 0u32;
        let header = loop {
            match seg.find_batch(batch_base)? {
                Walk::Done(Some(h)) => break h,
                Walk::Done(None) => return Err(self.shared.read().out_of_range(batch_base)),
                Walk::Damaged { pos, expected } => {
                    self.check_repairs(&mut repairs, &seg)?;
                    let next_base = self.repair(&seg, pos, expected)?;
                    if batch_base < next_base {
                        return Err(StorageError::DataCorrupt {
                            first: expected.min(batch_base),
                            last: next_base - 1,
                        });
                    }
                }
            }
        };
        check_ranges(batch_base, header.data_len, ranges)?;
        match seg.read_data(&header, ranges, out) {
            Err(StorageError::DataCorrupt { first, last }) => {
                self.quarantine_live(first, last)?;
                Err(StorageError::DataCorrupt { first, last })
            }
            other => other,
        }
    }

    fn first_offset(&self) -> u64 {
        self.shared.read().first
    }

    fn next_offset(&self) -> u64 {
        self.shared.read().next
    }

    fn offset_for_timestamp(&self, ts_us: u64) -> u64 {
        let (segments, next) = {
            let s = self.shared.read();
            (s.segments.clone(), s.next)
        };
        // Timestamps never decrease, so the first segment whose newest batch
        // is recent enough holds the answer.
        for seg in segments.iter().filter(|s| s.max_ts() >= ts_us) {
            match seg.offset_for_timestamp(ts_us) {
                Ok(Some(offset)) => return offset,
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!(segment = seg.base, error = %e,
                        "timestamp lookup failed; answering with the segment start");
                    return seg.base;
                }
            }
        }
        next
    }

    fn enforce_retention(&self, now_us: u64) -> Result<u32> {
        let (bytes, ms) = (self.config.retention_bytes, self.config.retention_ms);
        let dropped = self.drop_oldest_while(|oldest, total| {
            let too_big = bytes.is_some_and(|limit| total > limit);
            let too_old =
                ms.is_some_and(|ms| oldest.max_ts.saturating_add(ms.saturating_mul(1000)) < now_us);
            too_big || too_old
        })?;
        Ok(dropped.len() as u32)
    }

    fn seal_rolled(&self) -> Result<u32> {
        self.seal_unsealed()
    }

    fn failure(&self) -> Option<String> {
        self.failed.lock().clone()
    }

    fn verify(&self) -> Result<VerifyReport> {
        // Only the list of segments is taken under the lock; each segment
        // is then read up to its published length while appends go on.
        let segments = self.shared.read().segments.clone();
        let mut report = VerifyReport::default();
        for seg in &segments {
            let check = seg.verify()?;
            report.segments += 1;
            report.batches += check.batches;
            report.bytes += check.bytes;
            for (first, last) in check.damaged {
                if self
                    .quarantine
                    .containing(first)
                    .is_some_and(|(_, l)| l >= last)
                {
                    continue;
                }
                tracing::error!(dir = %self.dir.display(), segment = seg.base, first, last,
                    "scrub found damaged batches");
                self.quarantine_live(first, last)?;
                report.damaged.push((first, last));
            }
        }
        report.quarantined = self.quarantine.ranges();
        tracing::info!(dir = %self.dir.display(), segments = report.segments,
            batches = report.batches, bytes = report.bytes, damaged = report.damaged.len(),
            "scrub finished");
        Ok(report)
    }

    fn stats(&self) -> LogStats {
        let s = self.shared.read();
        LogStats {
            first_offset: s.first,
            next_offset: s.next,
            bytes: s.segments.iter().map(|seg| seg.size()).sum(),
            segments: s.segments.len() as u32,
            tier: None,
        }
    }
}

impl FileLog {
    /// Seals the rolled segments, syncs the active one and checkpoints its
    /// index.
    fn checkpoint_on_close(&self) -> Result<()> {
        self.seal_unsealed()?;
        let seg = self.active();
        let summary = seg.summary();
        seg.sync().and_then(|()| seg.checkpoint(&summary))
    }
}

impl Drop for FileLog {
    /// An unclosed log closes on drop: the active segment is made durable
    /// and its index checkpointed, so that the next open does not rescan it.
    fn drop(&mut self) {
        if self.failed.lock().is_some() || self.closed.load(Ordering::Acquire) {
            return;
        }
        if let Err(e) = self.checkpoint_on_close() {
            tracing::warn!(dir = %self.dir.display(), error = %e,
                "could not checkpoint the active segment on close; the next open rescans it");
        }
    }
}
