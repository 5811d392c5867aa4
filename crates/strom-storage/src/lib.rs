//! strom-storage owns the partition log: an ordered, append-only log of
//! *batches* of events, in two backends (`MemoryLog`, `FileLog`), plus the
//! per-partition consumer offset store (`OffsetStore`), the ack ledger of
//! each shared consumer group on a partition (`ledger`: `ShareLedger`,
//! `LedgerFile`) and the leader-epoch history of a replicated partition
//! (`EpochHistory`).
//!
//! Replication (issue 17) uses two more log primitives: a follower stores
//! the batches it copies from its leader with `append_replica` (the leader's
//! offsets and timestamps, byte-identical records) and drops a deposed
//! leader's divergent tail with `truncate_from`.
//!
//! Storage takes bytes and returns bytes. Each batch carries an opaque `meta`
//! section (storage never parses it) and a `data` section written straight
//! from the caller's `Bytes` segments. Storage assigns dense offsets and
//! non-decreasing timestamps, keeps CRCs of everything on disk, recovers from
//! torn tails, quarantines (never serves, never truncates) damaged ranges,
//! stops after a failed fsync or write, and enforces retention. It must never
//! depend on the network, the protocol crate or the server: nothing here
//! knows what a socket is. File I/O goes through the `vfs::Vfs` trait, which
//! `sim::SimFs` implements for power-loss and fault-injection tests, and
//! `faulty::FaultyFs` for fault injection into a real server process.
//!
//! Tiered storage (`tier`) copies closed segments of a file log to a
//! second location and reads them back from there (`docs/tiering.md`).
//!
//! The on-disk layout is documented in `docs/on-disk-format.md`.

mod config;
pub mod epochs;
mod error;
pub mod faulty;
mod file;
mod io_util;
pub mod ledger;
mod memory;
pub mod name;
mod offsets;
pub mod record;
pub mod record_file;
pub mod sim;
mod sync_gate;
pub mod tier;
pub mod vfs;
pub mod whole_file;

pub use config::LogConfig;
pub use epochs::EpochHistory;
pub use error::{is_disk_full, Result, StorageError};
pub use file::{ClosedSegment, FileLog, LocalSegment};
pub use ledger::{DeadLetter, LedgerFile, LedgerRecord, LedgerSnapshot, ShareLedger};
pub use memory::MemoryLog;
pub use name::{check_name, is_valid_name};
pub use offsets::OffsetStore;
pub use record_file::{Codec, Format, RecordFile, RecordFileError, Replayed};

use bytes::Bytes;

/// One batch handed to [`PartitionLog::append`].
pub struct AppendBatch<'a> {
    /// Number of events in the batch (>= 1); the batch occupies that many offsets.
    pub count: u32,
    /// Opaque metadata section (encoded metadata + offset table); stored as is.
    pub meta: &'a [u8],
    /// Data section as scatter/gather segments; written without concatenation.
    pub data: &'a [Bytes],
}

/// One batch copied from a leader's log, handed to
/// [`PartitionLog::append_replica`]: stored at `base_offset` (which must be
/// the follower's `next_offset()`) with the leader's timestamp, so that the
/// follower's `read` and `read_data` answer exactly as the leader's do.
pub struct ReplicaBatch<'a> {
    /// Base offset the leader assigned (`StoredBatch::base_offset`).
    pub base_offset: u64,
    /// Number of events in the batch (>= 1).
    pub count: u32,
    /// Timestamp the leader assigned (`StoredBatch::timestamp_us`).
    pub timestamp_us: u64,
    /// The leader's meta section, as read.
    pub meta: &'a [u8],
    /// The leader's data section, as read (any split into segments).
    pub data: &'a [Bytes],
}

/// Who decides a batch's base offset and timestamp: the log itself (a
/// leader's `append`) or the leader it copies (`append_replica`).
#[derive(Clone, Copy)]
pub(crate) enum Stamp {
    /// Next offset, timestamp `max(last, now)`.
    Own,
    /// As given; checked against the log's next offset and last timestamp.
    Replica { base_offset: u64, timestamp_us: u64 },
}

impl<'a> ReplicaBatch<'a> {
    /// The batch as an append, and the stamp the leader gave it.
    pub(crate) fn split(self) -> (AppendBatch<'a>, Stamp) {
        let stamp = Stamp::Replica {
            base_offset: self.base_offset,
            timestamp_us: self.timestamp_us,
        };
        let batch = AppendBatch {
            count: self.count,
            meta: self.meta,
            data: self.data,
        };
        (batch, stamp)
    }
}

impl Stamp {
    /// The timestamp for a batch at `next` in a log whose last timestamp is
    /// `last_ts`, or why a replicated batch does not fit there.
    pub(crate) fn timestamp(self, next: u64, last_ts: u64) -> Result<u64> {
        match self {
            Stamp::Own => Ok(last_ts.max(now_us())),
            Stamp::Replica { base_offset, .. } if base_offset != next => {
                Err(StorageError::InvalidArgument(format!(
                    "replica batch at offset {base_offset} does not continue the log, whose \
                     next offset is {next}; truncate the log or fetch from offset {next}"
                )))
            }
            Stamp::Replica { timestamp_us, .. } if timestamp_us < last_ts => {
                Err(StorageError::InvalidArgument(format!(
                    "replica batch at offset {next} has timestamp {timestamp_us} us, below the \
                     log's last timestamp {last_ts} us; timestamps never decrease"
                )))
            }
            Stamp::Replica { timestamp_us, .. } => Ok(timestamp_us),
        }
    }
}

/// Opaque durability position returned by an append; pass it to
/// [`PartitionLog::sync`]. Tokens of one log instance are totally ordered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct SyncToken(pub u64);

/// What storage assigned to an appended batch.
#[derive(Clone, Debug)]
pub struct Appended {
    pub base_offset: u64,
    pub count: u32,
    pub timestamp_us: u64,
    pub token: SyncToken,
}

/// A batch as returned by [`PartitionLog::read`]: its meta section (CRC
/// verified) and the length of its data section (fetch it with
/// [`PartitionLog::read_data`]).
#[derive(Clone, Debug)]
pub struct StoredBatch {
    pub base_offset: u64,
    pub count: u32,
    pub timestamp_us: u64,
    pub meta: Bytes,
    pub data_len: u64,
}

/// Size and offset range of a log.
#[derive(Clone, Debug, Default)]
pub struct LogStats {
    pub first_offset: u64,
    pub next_offset: u64,
    /// Bytes held: meta + data (file backend: `.log` + `.data` file sizes).
    pub bytes: u64,
    /// Number of segments (memory backend: always 1).
    pub segments: u32,
    /// Tiered storage's counts (logs with a tier only).
    pub tier: Option<TierLogStats>,
}

/// What a log with a tier did with it, for metrics.
#[derive(Clone, Debug, Default)]
pub struct TierLogStats {
    /// Bytes of the partition's segments in the tier (its manifest).
    pub tiered_bytes: u64,
    pub tiered_segments: u32,
    /// Bytes this copy uploaded (a sole copy's, or a replicated
    /// partition's leader's), since it opened.
    pub uploaded_bytes: u64,
    /// Reads served from segments only in the tier, since it opened.
    pub reads: u64,
    /// Tier copies and fetches that failed, since it opened.
    pub errors: u64,
}

/// A partition log backend. One writer thread may append while other threads
/// read, read data and sync concurrently.
pub trait PartitionLog: Send + Sync + 'static {
    /// Appends one batch (count >= 1). Writes data then the log record. Does
    /// NOT fsync. On any error the log stays consistent (partial writes are
    /// truncated away) and the next append works.
    fn append(&self, batch: AppendBatch<'_>) -> Result<Appended>;
    /// Appends one batch copied from a leader, at the leader's base offset
    /// and timestamp, with the same guarantees as `append` (no fsync). The
    /// base offset must equal `next_offset()` and the timestamp must not be
    /// below the last batch's, else `InvalidArgument` (code 308) and nothing
    /// is written. The stored bytes equal the leader's.
    fn append_replica(&self, batch: ReplicaBatch<'_>) -> Result<Appended>;
    /// Removes every batch holding an offset >= `offset` (a batch that
    /// straddles `offset` goes whole) durably, and returns the new
    /// `next_offset()`, which is <= `offset`. A no-op when `offset >=
    /// next_offset()`; `OffsetOutOfRange` when `offset < first_offset()`;
    /// `offset == first_offset()` empties the log (it then restarts at that
    /// offset). Appends continue at the returned offset. File backend: a
    /// crash at any point leaves, on reopen, either the old log or the
    /// truncated one, never anything below `offset` lost.
    fn truncate_from(&self, offset: u64) -> Result<u64>;
    /// Blocks until everything up to `token` is durable (fdatasync of the data
    /// file, then the log file). Concurrent callers share one fdatasync.
    fn sync(&self, token: SyncToken) -> Result<()>;
    /// Makes everything appended so far durable.
    fn sync_all(&self) -> Result<()>;
    /// Whole batches containing offsets >= `from`, in order, stopping once
    /// `max_bytes` of meta were returned (always at least one batch if any
    /// exists). Empty when `from >= next_offset`; `OffsetOutOfRange` when
    /// `from < first_offset`. Every returned meta is CRC-verified.
    fn read(&self, from: u64, max_bytes: usize) -> Result<Vec<StoredBatch>>;
    /// Reads byte ranges `(pos, len)` of the data section of the batch whose
    /// base offset is `batch_base`, appending one `Bytes` per range to `out`.
    fn read_data(&self, batch_base: u64, ranges: &[(u64, u64)], out: &mut Vec<Bytes>)
        -> Result<()>;
    fn first_offset(&self) -> u64;
    fn next_offset(&self) -> u64;
    /// First offset whose batch timestamp >= `ts_us`; `next_offset()` if none.
    fn offset_for_timestamp(&self, ts_us: u64) -> u64;
    /// Drops the oldest whole segments (memory: oldest batches) per the
    /// retention config, never the active segment (memory: the last batch).
    /// Returns how many were dropped.
    fn enforce_retention(&self, now_us: u64) -> Result<u32>;
    /// Background upkeep, off the append path: makes the segments the log
    /// rolled away from durable and writes their index files (`sync` and
    /// `close` do it too). Returns how many it sealed; 0 for the memory
    /// backend.
    fn seal_rolled(&self) -> Result<u32> {
        Ok(0)
    }
    /// Tiered storage (`tier::TieredLog`): copies the oldest closed
    /// segment not yet in the tier, verifies and records it, then drops
    /// local segments per the local retention. Slow (a whole segment
    /// moves): call it from a background thread, and again while it
    /// returns one. Returns how many segments it copied (0 or 1); always 0
    /// for logs without a tier.
    fn tier_pass(&self) -> Result<u32> {
        Ok(0)
    }
    /// Tiered storage: the place of this copy among the copies of its
    /// partition, which decides what [`PartitionLog::tier_pass`] does
    /// (copy, or record the leader's copies) and whether retention deletes
    /// tier objects. Ignored by logs without a tier.
    fn set_tier_role(&self, role: tier::TierRole) {
        let _ = role;
    }
    fn stats(&self) -> LogStats;
    /// Why the log stopped, if a write or fsync failed (then `append`
    /// returns `PartitionFailed` and `sync` never succeeds again until the
    /// log is reopened). `None` while the log is healthy.
    fn failure(&self) -> Option<String> {
        None
    }
    /// A clean close: makes everything durable and (file backend) writes the
    /// active segment's index checkpoint, so the next open rescans nothing.
    /// Dropping an unclosed log does the same, as a fallback.
    fn close(&self) -> Result<()> {
        self.sync_all()
    }
    /// Scrub: checks every CRC of the partition (records and data) while
    /// appends and reads go on, quarantines what is damaged and reports it.
    /// The memory backend has nothing on disk and reports nothing.
    fn verify(&self) -> Result<VerifyReport> {
        Ok(VerifyReport::default())
    }
}

/// What [`PartitionLog::verify`] checked and found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Segments checked.
    pub segments: u32,
    /// Intact batches checked (record and data CRC).
    pub batches: u64,
    /// Bytes read and checked (records and data).
    pub bytes: u64,
    /// Damaged offset ranges found by this pass that were not quarantined
    /// before (they are now), as `(first, last)`.
    pub damaged: Vec<(u64, u64)>,
    /// Every quarantined range of the partition after the pass.
    pub quarantined: Vec<(u64, u64)>,
}

/// Microseconds since the UNIX epoch (0 if the clock is before the epoch).
pub fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Checks the parts of a batch that do not depend on the backend and returns
/// its data length.
pub(crate) fn check_batch(batch: &AppendBatch<'_>, config: &LogConfig) -> Result<u64> {
    if batch.count == 0 {
        return Err(StorageError::InvalidArgument(
            "a batch must hold at least one event (count >= 1)".into(),
        ));
    }
    let data_len: u64 = batch.data.iter().map(|b| b.len() as u64).sum();
    let size = data_len + batch.meta.len() as u64;
    if size > config.max_batch_bytes {
        return Err(StorageError::BatchTooLarge {
            size,
            limit: config.max_batch_bytes,
        });
    }
    Ok(data_len)
}
