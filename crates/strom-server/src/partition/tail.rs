//! The tail cursor: how every streaming reader of a partition (the native
//! push stream, Kafka's long-poll fetch) follows it. It reads only what
//! consumers may see (below `visible`), skips what retention or overflow
//! dropped (the reader sees the next batch start past its position: an
//! explicit gap), steps over quarantined ranges, tells when the stream has
//! ended, and parks a caught-up reader in the partition's waiters, where
//! the appender hands it the next visible batch directly.

use std::future::Future;
use std::sync::Arc;

use strom_storage::{StorageError, StoredBatch};
use tokio::sync::watch;

use super::PartitionManager;
use crate::sink::BatchSink;

/// Where a tail cursor stands.
#[derive(Debug, PartialEq, Eq)]
pub enum Tail {
    /// The topic was deleted.
    Deleted,
    /// Visible events wait past the cursor: read them.
    Ready,
    /// The stream ended and the cursor has read all of it.
    Ended(u64),
    /// Nothing visible past the cursor yet: park.
    CaughtUp,
}

/// What one read of the tail found.
pub enum Read {
    /// Visible batches, in order; the cursor moved past the last one.
    Batches(Vec<StoredBatch>),
    /// A damaged range, quarantined on disk: the cursor moved past it.
    Gap { first: u64, last: u64 },
}

/// A reader's position in one partition, and its watch on what is visible.
pub struct TailCursor {
    pm: Arc<PartitionManager>,
    pos: u64,
    visible: watch::Receiver<u64>,
    sealed: watch::Receiver<bool>,
}

impl TailCursor {
    pub fn new(pm: Arc<PartitionManager>, pos: u64) -> Self {
        let visible = pm.visible.subscribe();
        let sealed = pm.sealed.subscribe();
        TailCursor {
            pm,
            pos,
            visible,
            sealed,
        }
    }

    pub fn partition(&self) -> &Arc<PartitionManager> {
        &self.pm
    }

    /// The next offset this reader reads.
    pub fn pos(&self) -> u64 {
        self.pos
    }

    /// Moves the cursor (batches handed to the reader another way: pushed
    /// to it while it was parked).
    pub fn advance_to(&mut self, pos: u64) {
        self.pos = self.pos.max(pos);
    }

    /// Where the cursor stands now.
    pub fn poll(&mut self) -> Tail {
        if self.pm.is_deleted() {
            return Tail::Deleted;
        }
        if self.pos < *self.visible.borrow_and_update() {
            return Tail::Ready;
        }
        if *self.sealed.borrow_and_update() && self.pos >= self.pm.next_offset() {
            return Tail::Ended(self.pos);
        }
        Tail::CaughtUp
    }

    /// Reads visible batches from the cursor within about `max_bytes` (at
    /// least one batch). Events dropped below the log's start are skipped.
    /// Blocking file reads.
    pub fn read(&mut self, max_bytes: usize) -> Result<Read, StorageError> {
        loop {
            self.pos = self.pos.max(self.pm.first_offset());
            match self.pm.read_visible_log(self.pos, max_bytes) {
                Ok(batches) => {
                    if let Some(b) = batches.last() {
                        self.pos = self.pos.max(b.base_offset + u64::from(b.count));
                    }
                    return Ok(Read::Batches(batches));
                }
                // Dropped between the two calls: skip again.
                Err(StorageError::OffsetOutOfRange { .. }) => continue,
                Err(StorageError::DataCorrupt { first, last }) => {
                    tracing::warn!(topic = %self.pm.topic, partition = self.pm.id, first, last, "reader reached a quarantined range");
                    self.pos = self.pos.max(last.saturating_add(1));
                    return Ok(Read::Gap { first, last });
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Parks `sink` in the partition's waiters until `woken` completes (the
    /// sink asked to be woken, or the waiters were woken: a publish that
    /// offers nothing, deletion, shutdown) or the partition is sealed.
    /// While parked, the appender offers the sink every batch it makes
    /// visible, and the sink may take many without waking this task.
    /// False once the partition is gone.
    pub async fn park(
        &mut self,
        sink: &Arc<dyn BatchSink>,
        woken: impl Future<Output = ()>,
    ) -> bool {
        self.pm.waiters.park(sink);
        // The appender moves `visible` before it offers: a batch whose
        // offer went by before the sink was parked shows here.
        if self.pos < *self.visible.borrow_and_update() {
            self.pm.waiters.unpark(sink);
            return true;
        }
        let alive = tokio::select! {
            _ = woken => true,
            r = self.sealed.changed() => r.is_ok(),
        };
        self.pm.waiters.unpark(sink);
        alive
    }
}

impl PartitionManager {
    /// Parks a reader that waits for the next visible batch of several
    /// partitions at once (Kafka's long-poll fetch); see [`TailCursor::park`].
    pub fn park(&self, sink: &Arc<dyn BatchSink>) {
        self.waiters.park(sink);
    }

    pub fn unpark(&self, sink: &Arc<dyn BatchSink>) {
        self.waiters.unpark(sink);
    }
}
