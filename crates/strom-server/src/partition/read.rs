//! Reading a partition: its offsets, its stored batches and their data
//! ranges, a scrub of every checksum, and the consumer offsets (the
//! partition's `OffsetStore`: plain consumers, partitioned groups and
//! their fences, replicated to followers). Blocking file I/O where the log
//! is a file: call these off the async workers for anything large.

use bytes::Bytes;
use strom_storage::{LogStats, StoredBatch, VerifyReport};

use super::PartitionManager;
use crate::error::ServerError;

impl PartitionManager {
    /// The first offset still stored (retention and overflow move it).
    pub fn first_offset(&self) -> u64 {
        self.log.first_offset()
    }

    /// The offset the next append gets (what readers may not see yet
    /// included: see [`PartitionManager::visible`]).
    pub fn next_offset(&self) -> u64 {
        self.log.next_offset()
    }

    /// The first offset stored at or after `ts_us`.
    pub fn offset_for_timestamp(&self, ts_us: u64) -> u64 {
        self.log.offset_for_timestamp(ts_us)
    }

    /// Whole stored batches from the one holding `from`, within about
    /// `max_bytes` (at least one), visible or not: for replication and
    /// for redelivering events already dispatched. Readers of the tail use
    /// [`PartitionManager::read_visible`].
    pub(crate) fn read(
        &self,
        from: u64,
        max_bytes: usize,
    ) -> Result<Vec<StoredBatch>, strom_storage::StorageError> {
        self.log.read(from, max_bytes)
    }

    /// Stored batches from `from` that consumers may see (below
    /// `visible`), within about `max_bytes` (at least one batch).
    pub fn read_visible(
        &self,
        from: u64,
        max_bytes: usize,
    ) -> Result<Vec<StoredBatch>, ServerError> {
        Ok(self.read_visible_log(from, max_bytes)?)
    }

    /// [`PartitionManager::read_visible`] with the storage error as it is,
    /// for the readers in this crate that step over its kinds (gaps,
    /// quarantined ranges).
    pub(crate) fn read_visible_log(
        &self,
        from: u64,
        max_bytes: usize,
    ) -> Result<Vec<StoredBatch>, strom_storage::StorageError> {
        let visible = self.visible();
        if from >= visible {
            return Ok(Vec::new());
        }
        let mut batches = self.log.read(from, max_bytes)?;
        batches.retain(|b| b.base_offset < visible);
        Ok(batches)
    }

    /// Byte ranges `(start, len)` of the data part of the batch at
    /// `batch_base`, appended to `out` in order.
    pub fn read_data(
        &self,
        batch_base: u64,
        ranges: &[(u64, u64)],
        out: &mut Vec<Bytes>,
    ) -> Result<(), ServerError> {
        Ok(self.log.read_data(batch_base, ranges, out)?)
    }

    /// A batch's whole data part, in one buffer.
    pub fn read_all_data(&self, b: &StoredBatch) -> Result<Bytes, ServerError> {
        let mut data = Vec::new();
        if b.data_len > 0 {
            self.read_data(b.base_offset, &[(0, b.data_len)], &mut data)?;
        }
        Ok(match data.len() {
            0 => Bytes::new(),
            1 => data.swap_remove(0),
            _ => data.concat().into(),
        })
    }

    /// Reads everything and checks every checksum (quarantining damage).
    pub fn verify(&self) -> Result<VerifyReport, ServerError> {
        Ok(self.log.verify()?)
    }

    /// The log's own counters (segments, bytes, tiering).
    pub fn log_stats(&self) -> LogStats {
        self.log.stats()
    }

    /// Why the log stopped taking writes, if it did (a failed fdatasync).
    pub fn failure(&self) -> Option<String> {
        self.log.failure()
    }

    /// The offset `name` committed here, if any.
    pub fn committed(&self, name: &str) -> Option<u64> {
        self.offsets.get(name)
    }

    /// Every name's committed offset (fences included: see `fence.rs`).
    pub fn committed_all(&self) -> Vec<(String, u64)> {
        self.offsets.all()
    }

    /// Durably records `offset` for `name` (fsync for file partitions).
    pub fn commit_offset(&self, name: &str, offset: u64) -> Result<(), ServerError> {
        Ok(self.offsets.commit(name, offset)?)
    }
}
