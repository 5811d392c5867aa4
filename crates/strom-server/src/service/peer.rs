//! Operations other members ask of this one about the partitions it
//! hosts, as service operations: a follower's fetch of a partition this
//! member leads. (The registry's requests to members, such as hosting,
//! sealing and fencing, are `members.rs`'s, reached through `MemberLink`.)
//! Only a connection that proved membership gets here (`native/trust.rs`).

use strom_proto::{ErrorCode, Response};

use super::DataService;
use crate::error::ServerError;

/// One follower's fetch: where it is and what it may take.
pub struct ReplicaFetch {
    pub topic: String,
    pub partition: u32,
    pub epoch: u64,
    /// The proven member asking.
    pub follower: u32,
    pub from: u64,
    pub last_epoch: u64,
    pub max_bytes: u32,
}

impl DataService {
    /// Answers a follower's fetch from the partition's leader: its batches
    /// from `from` (or where to cut its log), the high watermark and the
    /// consumer offsets. `NOT_PARTITION_LEADER` where this member has no
    /// role for the partition.
    pub async fn replica_fetch(&self, f: ReplicaFetch) -> Result<Response, ServerError> {
        let slot = self.host().slot(&f.topic, f.partition)?;
        let r = slot.replica().cloned().ok_or_else(|| {
            ServerError::coded(
                ErrorCode::NOT_PARTITION_LEADER,
                format!(
                    "partition {}/{} has no replica role here",
                    f.topic, f.partition
                ),
            )
        })?;
        r.serve_fetch(f.epoch, f.follower, f.from, f.last_epoch, f.max_bytes)
            .await
    }
}
