//! The file backend: a persistent partition log made of segments in one
//! directory. This module owns the segment list, the write path (append,
//! roll, group-commit sync), the read paths across segments, recovery on
//! open (the same code path as a fresh start) and retention.
//!
//! Concurrency: one writer at a time (the `writer` mutex) appends to the
//! active segment with positional writes; readers take the `shared` read lock
//! only to pick `Arc<Segment>` handles, then read with `pread` without any
//! log-wide lock, up to the segment length they observed.

mod cursor;
mod index;
mod record;
mod segment;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::{Mutex, RwLock};

use self::record::{RecordHeader, HEADER_LEN, MAX_META_LEN};
use self::segment::{OpenMode, Segment};
use crate::group_commit::GroupCommit;
use crate::io_util::fsync_dir;
use crate::memory::check_ranges;
use crate::{
    check_batch, now_us, AppendBatch, Appended, LogConfig, LogStats, PartitionLog, Result,
    StorageError, StoredBatch, SyncToken,
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
    config: LogConfig,
    shared: RwLock<Shared>,
    writer: Mutex<Writer>,
    /// Highest sync token handed out.
    written: AtomicU64,
    group: GroupCommit,
}

/// Base offsets of the segments present in `dir` (from `.log` and `.data`).
fn list_segments(dir: &Path) -> Result<BTreeSet<u64>> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| StorageError::io(format!("listing {}", dir.display()), e))?;
    let mut bases = BTreeSet::new();
    for entry in entries {
        let entry = entry.map_err(|e| StorageError::io(format!("listing {}", dir.display()), e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
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
    /// Opens (creating if missing) the partition log in `dir` and recovers it:
    /// sealed segments load or rebuild their indexes, the active segment is
    /// scanned and its torn or corrupt tail truncated.
    pub fn open(dir: &Path, config: LogConfig) -> Result<Self> {
        config.validate()?;
        std::fs::create_dir_all(dir)
            .map_err(|e| StorageError::io(format!("creating {}", dir.display()), e))?;
        let interval = u64::from(config.index_interval_bytes);
        let bases: Vec<u64> = list_segments(dir)?.into_iter().collect();
        let mut segments: Vec<Arc<Segment>> = Vec::with_capacity(bases.len().max(1));
        for (i, &base) in bases.iter().enumerate() {
            let mode = if i + 1 == bases.len() {
                OpenMode::Active
            } else {
                OpenMode::Sealed
            };
            let seg = Segment::open(dir, base, interval, mode)?;
            let next = seg.next_offset();
            if mode == OpenMode::Sealed && seg.log_file_is_empty()? {
                tracing::warn!(segment = base, dir = %dir.display(), "removing an empty sealed segment");
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
                        "offsets missing between segments (lost to corruption)");
                }
            }
            tracing::debug!(segment = base, next_offset = next, "segment opened");
            segments.push(Arc::new(seg));
        }
        if segments.is_empty() {
            segments.push(Arc::new(Segment::create(dir, 0, interval)?));
            fsync_dir(dir)
                .map_err(|e| StorageError::io(format!("syncing {}", dir.display()), e))?;
        }
        let first = segments[0].base;
        let next = segments[segments.len() - 1].next_offset();
        let last_ts = segments.iter().map(|s| s.max_ts()).max().unwrap_or(0);
        tracing::info!(dir = %dir.display(), first_offset = first, next_offset = next,
            segments = segments.len(), "file partition log opened");
        Ok(FileLog {
            dir: dir.to_path_buf(),
            config,
            shared: RwLock::new(Shared {
                segments,
                first,
                next,
            }),
            writer: Mutex::new(Writer { last_ts, seq: 0 }),
            written: AtomicU64::new(0),
            group: GroupCommit::default(),
        })
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

    /// Seals `old` (sync + index files) and starts a new active segment.
    fn roll(&self, old: &Segment) -> Result<Arc<Segment>> {
        old.seal()?;
        let base = old.next_offset();
        let seg = Arc::new(Segment::create(
            &self.dir,
            base,
            u64::from(self.config.index_interval_bytes),
        )?);
        fsync_dir(&self.dir)
            .map_err(|e| StorageError::io(format!("syncing {}", self.dir.display()), e))?;
        self.shared.write().segments.push(seg.clone());
        tracing::info!(dir = %self.dir.display(), sealed = old.base, segment = base, "rolled to a new segment");
        Ok(seg)
    }
}

impl PartitionLog for FileLog {
    fn append(&self, batch: AppendBatch<'_>) -> Result<Appended> {
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
        let mut seg = self.active();
        let (log_len, mut seg_data_len, base_offset, _) = seg.lens();
        let incoming = HEADER_LEN as u64 + meta_len + data_len;
        if base_offset > seg.base && log_len + seg_data_len + incoming > self.config.segment_bytes {
            seg = self.roll(&seg)?;
            seg_data_len = 0;
        }
        let end = base_offset
            .checked_add(u64::from(batch.count))
            .ok_or_else(|| StorageError::InvalidArgument("offsets exhausted".into()))?;
        let ts = w.last_ts.max(now_us());
        let header = RecordHeader {
            base_offset,
            count: batch.count,
            meta_len: meta_len as u32,
            timestamp_us: ts,
            data_pos: seg_data_len,
            data_len,
            data_crc,
        };
        seg.append(&header, batch.meta, batch.data)?;
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

    fn sync(&self, token: SyncToken) -> Result<()> {
        self.group.sync(
            token.0,
            || self.written.load(Ordering::Acquire),
            // Rolled segments were synced when sealed, so syncing the active
            // segment covers every token written before this point.
            || self.active().sync(),
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
        let mut out = Vec::new();
        let mut bytes = 0usize;
        loop {
            if seg.read_batches(from, max_bytes, &mut out, &mut bytes)? {
                break;
            }
            match self.segment_after(seg.base) {
                Some(next) => seg = next,
                None => break,
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
        let Some(header) = seg.find_batch(batch_base)? else {
            return Err(self.shared.read().out_of_range(batch_base));
        };
        check_ranges(batch_base, header.data_len, ranges)?;
        seg.read_data(&header, ranges, out)
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
        let dropped = {
            // Holding the writer lock keeps a roll from racing with the
            // removal; it is released before the files are deleted.
            let _w = self.writer.lock();
            let mut dropped = Vec::new();
            let mut s = self.shared.write();
            let mut total: u64 = s.segments.iter().map(|seg| seg.size()).sum();
            while s.segments.len() > 1 {
                let oldest = &s.segments[0];
                let too_big = self
                    .config
                    .retention_bytes
                    .is_some_and(|limit| total > limit);
                let too_old = self.config.retention_ms.is_some_and(|ms| {
                    oldest.max_ts().saturating_add(ms.saturating_mul(1000)) < now_us
                });
                if !(too_big || too_old) {
                    break;
                }
                total -= oldest.size();
                dropped.push(s.segments.remove(0));
            }
            s.first = s.segments[0].base;
            dropped
        };
        for seg in &dropped {
            seg.delete_files();
            tracing::info!(dir = %self.dir.display(), segment = seg.base,
                next_offset = seg.next_offset(), "retention removed a segment");
        }
        if !dropped.is_empty() {
            fsync_dir(&self.dir)
                .map_err(|e| StorageError::io(format!("syncing {}", self.dir.display()), e))?;
        }
        Ok(dropped.len() as u32)
    }

    fn stats(&self) -> LogStats {
        let s = self.shared.read();
        LogStats {
            first_offset: s.first,
            next_offset: s.next,
            bytes: s.segments.iter().map(|seg| seg.size()).sum(),
            segments: s.segments.len() as u32,
        }
    }
}
