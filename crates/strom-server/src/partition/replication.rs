//! How replication plugs into a partition: the partition asks these few
//! things of its role among the copies and knows nothing else of
//! replication (`replica/` implements [`Replication`]; the partition never
//! imports it). A partition is *replicated* when its topic keeps more than
//! one copy, or once the registry gave it a role (it moved): then its
//! consumers see only what every in-sync copy holds (the high watermark,
//! published through [`PartitionManager::publish_hwm`]) and only its
//! leader takes appends.

use std::sync::Arc;

use strom_proto::{Durability, ErrorCode};
use strom_storage::ReplicaBatch;

use super::{AppendReply, PartitionManager};
use crate::error::ServerError;

/// A file partition's leader-epoch history, in its directory.
pub const EPOCHS_FILE: &str = "leader-epochs";

/// An admitted append's reply (it may wait for the in-sync copies), or the
/// refusal with the reply handed back.
pub type Admitted = Result<AppendReply, (AppendReply, ServerError)>;

/// A partition's role among its copies, as the partition sees it.
pub trait Replication: Send + Sync {
    /// Whether this copy leads (takes appends).
    fn is_leader(&self) -> bool;
    /// Whether an append may go in now (leader only; `acks_all` ones only
    /// with enough copies in sync), and the reply to give it: with
    /// `acks_all` it waits until every in-sync copy has the batch.
    fn admit(self: Arc<Self>, acks_all: bool, reply: AppendReply) -> Admitted;
    /// Everything below `end` is durable on this copy.
    fn durable(&self, p: &PartitionManager, end: u64);
    /// The copy leaves (the partition moved away or was deleted).
    fn stop(&self);
    /// Its role, in-sync replicas and followers' lag, for the metrics.
    fn status(&self) -> Option<crate::health::ReplicaSnapshot> {
        None
    }
}

impl PartitionManager {
    /// Its role among the copies, once the registry gave one.
    pub fn replication(&self) -> Option<&Arc<dyn Replication>> {
        self.replication.get()
    }

    /// Gives the partition its role (the first one given stays); returns
    /// the role it has.
    pub(crate) fn replicate_with(&self, r: Arc<dyn Replication>) -> Arc<dyn Replication> {
        self.replication.get_or_init(|| r).clone()
    }

    /// Whether an append may go in here now, and the reply to give it: a
    /// replicated partition takes appends only on its leader, `acks_all`
    /// ones only with `min_in_sync` replicas in sync, and their reply waits
    /// until every in-sync replica has the batch. Hands `reply` back with
    /// the refusal.
    pub fn admit(&self, acks_all: bool, reply: AppendReply) -> Admitted {
        if !self.replicated() {
            return Ok(reply);
        }
        match self.replication.get() {
            Some(r) => r.clone().admit(acks_all, reply),
            None => Err((
                reply,
                ServerError::coded(
                    ErrorCode::NOT_PARTITION_LEADER,
                    format!(
                        "partition {}/{} has no role from the registry yet",
                        self.topic, self.id
                    ),
                ),
            )),
        }
    }

    /// Whether this copy may take appends: not replicated, or leading.
    pub(crate) fn leads(&self) -> bool {
        !self.replicated() || self.replication.get().is_some_and(|r| r.is_leader())
    }
}

/// What replication does to a copy's log, each under the append lock so
/// no append interleaves.
impl PartitionManager {
    /// Syncs the log; returns its end (a new leader's durable start).
    pub(crate) fn sync_end(&self) -> Result<u64, ServerError> {
        self.exclusive(|| {
            self.log.sync_all()?;
            Ok(self.log.next_offset())
        })
    }

    /// Cuts the log from `at` (a tail the leader does not hold, or one
    /// never made durable); returns the new end. The producers' sequence
    /// table is read again when next needed.
    pub(crate) fn cut_from(&self, at: u64) -> Result<u64, ServerError> {
        self.exclusive(|| {
            let end = self.log.truncate_from(at)?;
            *self.producers.lock() = None;
            Ok(end)
        })
    }

    /// Stores the leader's batches at their offsets (a follower's copy);
    /// `always` durability syncs them before returning the new end, so the
    /// high watermark means durable on every in-sync copy.
    pub(crate) fn copy_in(&self, batches: &[ReplicaBatch<'_>]) -> Result<u64, ServerError> {
        self.exclusive(|| {
            for b in batches {
                let a = self.log.append_replica(ReplicaBatch {
                    base_offset: b.base_offset,
                    count: b.count,
                    timestamp_us: b.timestamp_us,
                    meta: b.meta,
                    data: b.data,
                })?;
                self.copied(b.meta, &a);
            }
            if !batches.is_empty() && self.dir.is_some() && self.durability == Durability::Always {
                self.log.sync_all()?;
            }
            Ok(self.log.next_offset())
        })
    }
}
