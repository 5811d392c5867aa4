//! What an operator watches beyond traffic: replication (each replicated
//! partition's role, in-sync replicas and followers' lag, and on the
//! registry master every partition's state), the metadata quorum (Raft's
//! term, leader and indexes), shared consumer groups, producer leases, the
//! Kafka front end, tiered storage and the data directory's free space. These
//! are parts of a [`crate::stats::ServerSnapshot`]; each field there has
//! `#[serde(default)]`, so members of different versions still read each
//! other's snapshots.

use serde::{Deserialize, Serialize};

/// One follower of a partition this member leads.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct FollowerSnapshot {
    pub member: u32,
    /// Whether it is in the in-sync replicas.
    pub in_sync: bool,
    /// Events the leader holds durably that the follower has not fetched.
    pub lag_events: u64,
    /// Seconds since the follower last caught up (had fetched everything
    /// the leader held when it asked before); None before it ever did.
    pub lag_seconds: Option<f64>,
}

/// A replicated partition's copy on this member.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ReplicaSnapshot {
    /// `leader`, `follower` or `idle` (no role yet, or deposed).
    pub role: String,
    pub epoch: u64,
    /// The leader's member id, when known.
    pub leader: Option<u32>,
    /// The high watermark: what every in-sync copy holds (leader only; 0
    /// elsewhere).
    pub high_watermark: u64,
    /// Members holding a copy (leader only: the leader and its followers).
    pub replicas: u32,
    /// In-sync replicas (leader only).
    pub isr: Vec<u32>,
    /// The leader's followers (empty elsewhere).
    pub followers: Vec<FollowerSnapshot>,
}

/// One partition as the registry master records it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct GroupPartition {
    pub topic: String,
    pub partition: u32,
    /// Its leader (the member hosting it for an unreplicated topic).
    pub leader: u32,
    /// Copies the registry assigned (1 for an unreplicated topic).
    pub replicas: u32,
    /// In-sync replicas the registry recorded.
    pub isr: u32,
    /// No live leader serves it (its member is down or it failed).
    pub offline: bool,
}

/// The metadata quorum as this member's Raft sees it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct QuorumSnapshot {
    /// Whether the group keeps its registry in a Raft quorum (false: the
    /// registry lives on member 0 alone, as with `--meta-voters 1`).
    pub enabled: bool,
    /// `leader`, `follower`, `candidate`, `learner` or `shutdown`.
    pub state: String,
    pub term: u64,
    pub leader: Option<u64>,
    pub committed_index: Option<u64>,
    pub applied_index: Option<u64>,
    pub last_log_index: Option<u64>,
    pub voters: u32,
    pub learners: u32,
}

/// A shared consumer group's state on one partition this member owns.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SharedGroupSnapshot {
    pub group: String,
    /// The lowest unresolved offset (everything below is acked or
    /// dead-lettered).
    pub committed: u64,
    /// Events delivered and not yet acked.
    pub pending: u64,
    /// Deliveries after the first, since the group began.
    pub redelivered: u64,
    /// Events sent to the dead-letter topic, since the group began.
    pub dead_lettered: u64,
    /// Pending events per member stream, `(consumer, count)`.
    pub pending_by_consumer: Vec<(u64, u64)>,
}

/// Producer leases, as the registry master keeps them.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LeaseSnapshot {
    /// Producers holding a lease now.
    pub open: u64,
    /// Leases that ran out since this server started.
    pub expired: u64,
}

/// The audit trail's counts since this server started.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct AuditSnapshot {
    /// Whether records also go to the `strom.audit` topic (`auth` on).
    pub to_topic: bool,
    /// Records made (each also a log line).
    pub recorded: u64,
    /// Records appended to `strom.audit`.
    pub written: u64,
    /// Records the full queue kept from `strom.audit` (in the log only).
    pub dropped: u64,
}

/// Requests (or errors) of one Kafka API.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ApiCount {
    pub api: String,
    /// The Kafka error's name for errors; empty for requests.
    #[serde(default)]
    pub error: String,
    pub count: u64,
}

/// The Kafka front end of this server.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct KafkaSnapshot {
    /// Whether this server runs a Kafka listener.
    pub enabled: bool,
    pub requests: Vec<ApiCount>,
    pub errors: Vec<ApiCount>,
    /// Kafka consumer groups this server coordinates, and their members.
    pub groups: u64,
    pub members: u64,
}

/// A tiered partition's copy here and the tier (docs/tiering.md).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct TierSnapshot {
    /// Bytes and segments of the partition in the tier.
    pub tiered_bytes: u64,
    pub tiered_segments: u32,
    /// Bytes this copy uploaded since it opened.
    pub uploaded_bytes: u64,
    /// Reads served from the tier since it opened.
    pub reads: u64,
    /// Failed tier copies and fetches since it opened.
    pub errors: u64,
}

impl From<strom_storage::TierLogStats> for TierSnapshot {
    fn from(t: strom_storage::TierLogStats) -> Self {
        TierSnapshot {
            tiered_bytes: t.tiered_bytes,
            tiered_segments: t.tiered_segments,
            uploaded_bytes: t.uploaded_bytes,
            reads: t.reads,
            errors: t.errors,
        }
    }
}

/// Free space of the file system holding the data directory.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct DiskSnapshot {
    pub path: String,
    pub total_bytes: u64,
    /// Bytes an unprivileged process may still write (`f_bavail`).
    pub free_bytes: u64,
    pub total_inodes: u64,
    pub free_inodes: u64,
}

impl DiskSnapshot {
    /// `statvfs(2)` of `dir`; None if it fails (the directory is gone).
    pub fn of(dir: &std::path::Path) -> Option<DiskSnapshot> {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
        // SAFETY: all-zero is a valid statvfs, and `c` is NUL-terminated.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: `c` lives across the call and `st` is a valid out pointer.
        if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
            return None;
        }
        let frsize = st.f_frsize as u64;
        Some(DiskSnapshot {
            path: dir.display().to_string(),
            total_bytes: (st.f_blocks as u64).saturating_mul(frsize),
            free_bytes: (st.f_bavail as u64).saturating_mul(frsize),
            total_inodes: st.f_files as u64,
            free_inodes: st.f_favail as u64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statvfs_of_a_real_directory_has_space_and_inodes() {
        let dir = std::env::temp_dir();
        let d = DiskSnapshot::of(&dir).expect("statvfs of the temp dir");
        assert!(d.total_bytes > 0 && d.free_bytes <= d.total_bytes, "{d:?}");
        assert!(d.free_inodes <= d.total_inodes, "{d:?}");
        assert!(DiskSnapshot::of(std::path::Path::new("/no/such/dir/here")).is_none());
    }
}
