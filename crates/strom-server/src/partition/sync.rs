//! Durability of a partition's appends: the group-commit syncer of
//! `always` (one fdatasync for every batch waiting at that moment, then
//! their replies together) and the timer thread of `interval:<ms>`.

use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use strom_proto::ErrorCode;
use strom_storage::Appended;

use super::{AppendReply, PartitionManager};
use crate::error::ServerError;

/// An appended batch waiting for its fdatasync.
pub(super) struct Unsynced {
    pub(super) appended: Appended,
    pub(super) meta: Bytes,
    pub(super) reply: AppendReply,
    /// A resent batch answered with its first append: nothing to publish.
    pub(super) resent: bool,
}

impl PartitionManager {
    /// Group commit: one fdatasync covers every batch waiting at that moment.
    pub(super) fn run_syncer(self: Arc<Self>, rx: mpsc::Receiver<Unsynced>) {
        while let Ok(first) = rx.recv() {
            let mut group = vec![first];
            while let Ok(more) = rx.try_recv() {
                group.push(more);
            }
            let token = group
                .iter()
                .map(|u| u.appended.token)
                .max()
                .expect("non-empty group");
            let started = std::time::Instant::now();
            let synced = self.log.sync(token);
            self.stats.synced(started.elapsed());
            match synced {
                Ok(()) => {
                    for u in group {
                        if !u.resent {
                            self.make_visible(&u.appended, &u.meta);
                        }
                        (u.reply)(Ok(u.appended));
                    }
                }
                Err(e) => {
                    tracing::error!(topic = %self.topic, partition = self.id, error = %e, "fdatasync failed");
                    let code = ErrorCode(e.code());
                    for u in group {
                        (u.reply)(Err(ServerError::coded(code, e.to_string())));
                    }
                }
            }
        }
    }

    pub(super) fn run_interval(self: Arc<Self>, every: Duration) {
        while !self.stop.load(Ordering::Acquire) {
            std::thread::park_timeout(every);
            let started = std::time::Instant::now();
            let synced = self.log.sync_all();
            self.stats.synced(started.elapsed());
            if let Err(e) = synced {
                tracing::warn!(topic = %self.topic, partition = self.id, error = %e, "interval sync failed");
            }
        }
    }
}

pub(super) fn spawn(
    pm: &PartitionManager,
    role: &str,
    f: impl FnOnce() + Send + 'static,
) -> Result<JoinHandle<()>, ServerError> {
    std::thread::Builder::new()
        .name(format!("strom-{role}-{}", pm.id))
        .spawn(f)
        .map_err(|e| ServerError::io("starting a partition thread", e))
}
