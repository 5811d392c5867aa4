//! Fences of partitioned consumer groups on a partition's owner (design
//! §4): only the `(consumer, epoch)` the master fenced last may read the
//! partition for the group and commit its offset.
//!
//! The fences live beside the partition (in the `Host`'s slot for it), not
//! on it. The epoch is stored durably in the partition's `OffsetStore` under the
//! reserved name `"<group>\0fence"` (group names use the topic-name
//! alphabet; a plain commit under a name holding a NUL is refused, and
//! [`is_reserved`] hides these from offset listings). Epochs are unique per
//! group, so after a restart the epoch alone identifies the holder; the
//! consumer id is also checked while this process remembers it. The check plus the commit, and a fence write, run
//! under one mutex per (group, partition); each fence also has a `watch`
//! that ends the streams of older holders.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use strom_proto::ErrorCode;
use tokio::sync::watch;

use crate::error::ServerError;
use crate::partition::PartitionManager;

/// The offset-store name holding the group's fence epoch.
pub fn fence_key(group: &str) -> String {
    format!("{group}\u{0}fence")
}

/// Whether an offset-store name is one of these fences, not a consumer.
pub fn is_reserved(name: &str) -> bool {
    name.contains('\u{0}')
}

/// The holder a fence admits: epoch, and the consumer when known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Holder {
    pub epoch: u64,
    pub consumer: Option<u64>,
}

/// One (group, partition) fence.
pub struct Fence {
    /// Serializes fence writes with checked commits.
    lock: Mutex<()>,
    holder: watch::Sender<Holder>,
}

impl Fence {
    pub fn watch(&self) -> watch::Receiver<Holder> {
        self.holder.subscribe()
    }

    fn admits(&self, consumer: u64, epoch: u64) -> Result<(), ServerError> {
        let h = *self.holder.borrow();
        if h.epoch == 0 || h.epoch != epoch || h.consumer.is_some_and(|c| c != consumer) {
            return Err(fenced(consumer, epoch, h));
        }
        Ok(())
    }
}

fn fenced(consumer: u64, epoch: u64, h: Holder) -> ServerError {
    ServerError::coded(
        ErrorCode::FENCED,
        format!(
            "consumer {consumer} at epoch {epoch} does not hold this partition (fenced at epoch {}); it was reassigned",
            h.epoch
        ),
    )
}

/// The fences of one partition, by group.
#[derive(Default)]
pub struct Fences {
    map: Mutex<HashMap<String, Arc<Fence>>>,
}

impl Fences {
    /// The group's fence on `p`, loaded from its offset store on first use.
    pub fn get(&self, p: &PartitionManager, group: &str) -> Arc<Fence> {
        self.map
            .lock()
            .entry(group.to_string())
            .or_insert_with(|| {
                let epoch = p.committed(&fence_key(group)).unwrap_or(0);
                let (holder, _) = watch::channel(Holder {
                    epoch,
                    consumer: None,
                });
                Arc::new(Fence {
                    lock: Mutex::new(()),
                    holder,
                })
            })
            .clone()
    }

    /// Forgets a dropped group's fence (its stored epoch stays, harmlessly).
    pub fn forget(&self, group: &str) {
        self.map.lock().remove(group);
    }
}

/// Stores the fence `(consumer, epoch)` durably, ending older holders'
/// streams. An older epoch than the stored one is refused (`FENCED`).
/// Blocking (fsync).
pub fn fence(
    p: &PartitionManager,
    fences: &Fences,
    group: &str,
    consumer: u64,
    epoch: u64,
) -> Result<(), ServerError> {
    let f = fences.get(p, group);
    let _g = f.lock.lock();
    let h = *f.holder.borrow();
    if epoch < h.epoch {
        return Err(fenced(consumer, epoch, h));
    }
    p.commit_offset(&fence_key(group), epoch)?;
    f.holder.send_replace(Holder {
        epoch,
        consumer: Some(consumer),
    });
    tracing::debug!(topic = %p.topic, partition = p.id, group = %group, consumer, epoch, "partition fenced");
    Ok(())
}

/// `FENCED` unless `(consumer, epoch)` holds the group's fence on `p`.
pub fn check(
    p: &PartitionManager,
    fences: &Fences,
    group: &str,
    consumer: u64,
    epoch: u64,
) -> Result<Arc<Fence>, ServerError> {
    let f = fences.get(p, group);
    f.admits(consumer, epoch)?;
    Ok(f)
}

/// Commits `offset` for the group if `(consumer, epoch)` holds the fence.
/// Blocking (fsync).
pub fn commit(
    p: &PartitionManager,
    fences: &Fences,
    group: &str,
    consumer: u64,
    epoch: u64,
    offset: u64,
) -> Result<(), ServerError> {
    let f = fences.get(p, group);
    let _g = f.lock.lock();
    f.admits(consumer, epoch)?;
    p.commit_offset(group, offset)?;
    p.consumer_at(group, offset);
    Ok(())
}

/// Resets a deleted group's fence on `p`, so a group created again
/// under the name starts from epoch 0.
pub fn drop_group(p: &PartitionManager, fences: &Fences, group: &str) -> Result<(), ServerError> {
    let key = fence_key(group);
    fences.forget(group);
    if p.committed(&key).is_some_and(|e| e > 0) {
        p.commit_offset(&key, 0)?;
    }
    Ok(())
}

/// `INVALID_ARGUMENT` for a reserved name; `FENCED` if `name` is a
/// partitioned group with a fence on `p`: its offset moves only through
/// `GroupCommit`.
pub fn refuse_plain(p: &PartitionManager, name: &str) -> Result<(), ServerError> {
    if is_reserved(name) {
        return Err(ServerError::coded(
            ErrorCode::INVALID_ARGUMENT,
            "a consumer name cannot hold a NUL character",
        ));
    }
    if p.committed(&fence_key(name)).is_some_and(|e| e > 0) {
        return Err(ServerError::coded(
            ErrorCode::FENCED,
            format!("'{name}' is a partitioned consumer group on this partition; its members commit with GroupCommit"),
        ));
    }
    Ok(())
}
