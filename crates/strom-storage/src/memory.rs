//! The memory backend: an ephemeral partition log held in a deque of
//! batches. Meta and data are kept as the caller's `Bytes` (data segments are
//! stored as given, never concatenated), and `read_data` returns zero-copy
//! slices of them unless a range spans two segments.
//!
//! Two ways out for old batches: retention (`enforce_retention`, by size or
//! age), which counts what it drops in [`MemoryLog::dropped_events`], and
//! [`MemoryLog::make_room`], which the server's `block` overflow policy uses
//! to free only batches every consumer has acked.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::{Bytes, BytesMut};
use parking_lot::RwLock;

use crate::{
    check_batch, AppendBatch, Appended, LogConfig, LogStats, PartitionLog, ReplicaBatch, Result,
    Stamp, StorageError, StoredBatch, SyncToken,
};

struct MemBatch {
    base: u64,
    count: u32,
    ts: u64,
    meta: Bytes,
    /// Non-empty data segments, as given.
    data: Vec<Bytes>,
    /// Start position of each segment of `data` within the data section.
    starts: Vec<u64>,
    data_len: u64,
}

impl MemBatch {
    fn end(&self) -> u64 {
        self.base + u64::from(self.count)
    }

    fn size(&self) -> u64 {
        self.meta.len() as u64 + self.data_len
    }

    fn slice(&self, pos: u64, len: u64) -> Bytes {
        if len == 0 {
            return Bytes::new();
        }
        // Index of the segment holding `pos`.
        let j = self.starts.partition_point(|&s| s <= pos) - 1;
        let seg_pos = (pos - self.starts[j]) as usize;
        let seg = &self.data[j];
        if seg_pos as u64 + len <= seg.len() as u64 {
            return seg.slice(seg_pos..seg_pos + len as usize);
        }
        // The range spans segments: one copy is unavoidable.
        let mut out = BytesMut::with_capacity(len as usize);
        let mut remaining = len as usize;
        let mut k = j;
        let mut off = seg_pos;
        while remaining > 0 {
            let seg = &self.data[k];
            let take = (seg.len() - off).min(remaining);
            out.extend_from_slice(&seg[off..off + take]);
            remaining -= take;
            k += 1;
            off = 0;
        }
        out.freeze()
    }
}

#[derive(Default)]
struct State {
    batches: VecDeque<MemBatch>,
    first: u64,
    next: u64,
    bytes: u64,
    last_ts: u64,
}

/// Ephemeral partition log (the `memory` partition type).
pub struct MemoryLog {
    config: LogConfig,
    state: RwLock<State>,
    seq: AtomicU64,
    /// Events dropped by retention since the log was created.
    dropped: AtomicU64,
}

impl MemoryLog {
    pub fn new(config: LogConfig) -> Self {
        MemoryLog {
            config,
            state: RwLock::new(State::default()),
            seq: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        }
    }

    /// Events dropped by retention (size bound or age) since the log was
    /// created. Batches freed by [`make_room`](Self::make_room) are not
    /// counted: every consumer had acked them.
    pub fn dropped_events(&self) -> u64 {
        self.dropped.load(Ordering::Acquire)
    }

    /// Whether a batch of `incoming` bytes fits under `bound`, after freeing
    /// the oldest batches that lie wholly below `floor` (every consumer acked
    /// them) as far as needed. An empty log always has room, so one batch
    /// larger than the bound still goes through.
    pub fn make_room(&self, incoming: u64, bound: u64, floor: Option<u64>) -> bool {
        let fits = |s: &State| s.bytes == 0 || s.bytes.saturating_add(incoming) <= bound;
        if fits(&self.state.read()) {
            return true;
        }
        let Some(floor) = floor else { return false };
        let mut s = self.state.write();
        let mut freed = 0u64;
        while !fits(&s) {
            match s.batches.front() {
                Some(b) if b.end() <= floor => {}
                _ => break,
            }
            if let Some(b) = s.batches.pop_front() {
                s.bytes -= b.size();
                s.first = b.end();
                freed += u64::from(b.count);
            }
        }
        if freed > 0 {
            tracing::debug!(
                freed,
                first_offset = s.first,
                "memory log freed acked batches"
            );
        }
        fits(&s)
    }
}

fn out_of_range(requested: u64, s: &State) -> StorageError {
    StorageError::OffsetOutOfRange {
        requested,
        first: s.first,
        next: s.next,
    }
}

impl MemoryLog {
    /// The one append path of `append` and `append_replica`.
    fn append_stamped(&self, batch: AppendBatch<'_>, stamp: Stamp) -> Result<Appended> {
        let data_len = check_batch(&batch, &self.config)?;
        let meta = Bytes::copy_from_slice(batch.meta);
        let mut data = Vec::with_capacity(batch.data.len());
        let mut starts = Vec::with_capacity(batch.data.len());
        let mut pos = 0u64;
        for seg in batch.data.iter().filter(|s| !s.is_empty()) {
            starts.push(pos);
            pos += seg.len() as u64;
            data.push(seg.clone());
        }
        let mut s = self.state.write();
        let base = s.next;
        let next = base
            .checked_add(u64::from(batch.count))
            .ok_or_else(|| StorageError::InvalidArgument("offsets exhausted".into()))?;
        let ts = stamp.timestamp(base, s.last_ts)?;
        let b = MemBatch {
            base,
            count: batch.count,
            ts,
            meta,
            data,
            starts,
            data_len,
        };
        s.bytes += b.size();
        s.batches.push_back(b);
        s.next = next;
        s.last_ts = ts;
        let token = self.seq.fetch_add(1, Ordering::AcqRel) + 1;
        Ok(Appended {
            base_offset: base,
            count: batch.count,
            timestamp_us: ts,
            token: SyncToken(token),
        })
    }
}

impl PartitionLog for MemoryLog {
    fn append(&self, batch: AppendBatch<'_>) -> Result<Appended> {
        self.append_stamped(batch, Stamp::Own)
    }

    fn append_replica(&self, batch: ReplicaBatch<'_>) -> Result<Appended> {
        let (batch, stamp) = batch.split();
        self.append_stamped(batch, stamp)
    }

    fn truncate_from(&self, offset: u64) -> Result<u64> {
        let mut s = self.state.write();
        if offset >= s.next {
            return Ok(s.next);
        }
        if offset < s.first {
            return Err(out_of_range(offset, &s));
        }
        while s.batches.back().is_some_and(|b| b.end() > offset) {
            if let Some(b) = s.batches.pop_back() {
                s.bytes -= b.size();
                s.next = b.base;
            }
        }
        // The timestamps of what is left bound the next ones; an emptied
        // log takes any.
        s.last_ts = s.batches.back().map_or(0, |b| b.ts);
        tracing::debug!(offset, next_offset = s.next, "memory log truncated");
        Ok(s.next)
    }

    fn sync(&self, _token: SyncToken) -> Result<()> {
        Ok(())
    }

    fn sync_all(&self) -> Result<()> {
        Ok(())
    }

    fn read(&self, from: u64, max_bytes: usize) -> Result<Vec<StoredBatch>> {
        let s = self.state.read();
        if from < s.first {
            return Err(out_of_range(from, &s));
        }
        let start = s.batches.partition_point(|b| b.end() <= from);
        let mut out = Vec::new();
        let mut bytes = 0usize;
        for b in s.batches.range(start..) {
            out.push(StoredBatch {
                base_offset: b.base,
                count: b.count,
                timestamp_us: b.ts,
                meta: b.meta.clone(),
                data_len: b.data_len,
            });
            bytes += b.meta.len();
            if bytes >= max_bytes {
                break;
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
        let s = self.state.read();
        let i = s.batches.partition_point(|b| b.base < batch_base);
        let b = match s.batches.get(i) {
            Some(b) if b.base == batch_base => b,
            _ => return Err(out_of_range(batch_base, &s)),
        };
        check_ranges(batch_base, b.data_len, ranges)?;
        out.reserve(ranges.len());
        for &(pos, len) in ranges {
            out.push(b.slice(pos, len));
        }
        Ok(())
    }

    fn first_offset(&self) -> u64 {
        self.state.read().first
    }

    fn next_offset(&self) -> u64 {
        self.state.read().next
    }

    fn offset_for_timestamp(&self, ts_us: u64) -> u64 {
        let s = self.state.read();
        let i = s.batches.partition_point(|b| b.ts < ts_us);
        s.batches.get(i).map_or(s.next, |b| b.base)
    }

    fn enforce_retention(&self, now_us: u64) -> Result<u32> {
        let mut s = self.state.write();
        let mut dropped = 0u32;
        while s.batches.len() > 1 {
            let front = &s.batches[0];
            let too_big = self
                .config
                .retention_bytes
                .is_some_and(|limit| s.bytes > limit);
            let too_old = self
                .config
                .retention_ms
                .is_some_and(|ms| front.ts.saturating_add(ms.saturating_mul(1000)) < now_us);
            if !(too_big || too_old) {
                break;
            }
            if let Some(b) = s.batches.pop_front() {
                s.bytes -= b.size();
                s.first = b.end();
                dropped += 1;
                self.dropped.fetch_add(u64::from(b.count), Ordering::AcqRel);
            }
        }
        if dropped > 0 {
            tracing::debug!(
                batches = dropped,
                first_offset = s.first,
                "memory log retention dropped batches"
            );
        }
        Ok(dropped)
    }

    fn stats(&self) -> LogStats {
        let s = self.state.read();
        LogStats {
            first_offset: s.first,
            next_offset: s.next,
            bytes: s.bytes,
            segments: 1,
            tier: None,
        }
    }
}

/// Rejects any range that does not lie within `data_len`.
pub(crate) fn check_ranges(batch_base: u64, data_len: u64, ranges: &[(u64, u64)]) -> Result<()> {
    for &(pos, len) in ranges {
        let inside = matches!(pos.checked_add(len), Some(end) if end <= data_len);
        if !inside {
            return Err(StorageError::BadDataRange {
                batch_base,
                pos,
                len,
                data_len,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::now_us;

    fn append(log: &MemoryLog, bytes: usize) {
        let data = [Bytes::from(vec![0u8; bytes])];
        log.append(AppendBatch {
            count: 2,
            meta: b"m",
            data: &data,
        })
        .unwrap();
    }

    #[test]
    fn make_room_frees_only_batches_below_the_floor_and_counts_nothing() {
        let log = MemoryLog::new(LogConfig::default());
        assert!(
            log.make_room(500, 100, None),
            "an empty log takes any batch"
        );
        append(&log, 99); // offsets 0..2, 100 bytes
        append(&log, 99); // offsets 2..4
        assert!(!log.make_room(100, 250, None), "nobody acked: no room");
        assert!(
            !log.make_room(100, 250, Some(1)),
            "a batch partly unread stays"
        );
        assert!(log.make_room(100, 250, Some(2)));
        assert_eq!(log.first_offset(), 2);
        assert_eq!(log.stats().bytes, 100);
        assert_eq!(
            log.dropped_events(),
            0,
            "acked batches are not dropped events"
        );
    }

    #[test]
    fn retention_counts_the_events_it_drops() {
        let log = MemoryLog::new(LogConfig {
            retention_bytes: Some(150),
            ..LogConfig::default()
        });
        for _ in 0..4 {
            append(&log, 99);
        }
        log.enforce_retention(now_us()).unwrap();
        assert_eq!(log.first_offset(), 6);
        assert_eq!(log.dropped_events(), 6);
    }
}
