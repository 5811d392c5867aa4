//! The quorum's tunables, with defaults that elect a new leader within
//! about a second of the old one's death on a small, busy machine, and
//! their translation into openraft's `Config`.

use std::time::Duration;

use openraft::SnapshotPolicy;

use crate::error::MetaError;

#[derive(Clone, Debug)]
pub struct MetaConfig {
    /// How often the leader sends heartbeats. openraft also gives every
    /// append-entries round trip (sending, the follower's write and
    /// fdatasync, the answer) this long before it counts as failed, so it
    /// must stay above the slowest such round trip: one entry of
    /// `max_command` bytes, or up to 1 MiB of encoded entries.
    pub heartbeat: Duration,
    /// A follower that hears no leader for a random time in this range
    /// starts an election. Must be well above `heartbeat`.
    pub election_timeout_min: Duration,
    pub election_timeout_max: Duration,
    /// Build a snapshot after this many log entries since the last one.
    pub snapshot_every: u64,
    /// Log entries kept behind a snapshot (a briefly lagging follower
    /// catches up from them rather than from the snapshot).
    pub keep_after_snapshot: u64,
    /// The largest command `propose` accepts, in bytes.
    pub max_command: usize,
}

impl Default for MetaConfig {
    fn default() -> Self {
        MetaConfig {
            heartbeat: Duration::from_millis(100),
            election_timeout_min: Duration::from_millis(400),
            election_timeout_max: Duration::from_millis(800),
            snapshot_every: 1_000,
            keep_after_snapshot: 500,
            max_command: 1 << 20,
        }
    }
}

/// Commands are stored hex-encoded in 16 MiB log records.
const MAX_COMMAND_LIMIT: usize = 6 << 20;

impl MetaConfig {
    /// Checks the values and builds openraft's configuration from them.
    pub(crate) fn to_raft(&self) -> Result<openraft::Config, MetaError> {
        if self.max_command == 0 || self.max_command > MAX_COMMAND_LIMIT {
            return Err(MetaError::Config(format!(
                "max_command is {} bytes; it must be between 1 and {MAX_COMMAND_LIMIT}",
                self.max_command
            )));
        }
        if self.snapshot_every == 0 {
            return Err(MetaError::Config(
                "snapshot_every must be at least 1".into(),
            ));
        }
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let config = openraft::Config {
            cluster_name: "strom-meta".into(),
            heartbeat_interval: ms(self.heartbeat),
            election_timeout_min: ms(self.election_timeout_min),
            election_timeout_max: ms(self.election_timeout_max),
            snapshot_policy: SnapshotPolicy::LogsSinceLast(self.snapshot_every),
            max_in_snapshot_log_to_keep: self.keep_after_snapshot,
            ..Default::default()
        };
        config
            .validate()
            .map_err(|e| MetaError::Config(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_values_are_named() {
        assert!(MetaConfig::default().to_raft().is_ok());
        let bad = MetaConfig {
            election_timeout_min: Duration::from_millis(50),
            ..Default::default()
        };
        assert!(matches!(bad.to_raft(), Err(MetaError::Config(_))));
        let bad = MetaConfig {
            max_command: 100 << 20,
            ..Default::default()
        };
        let e = bad.to_raft().unwrap_err().to_string();
        assert!(e.contains("max_command"), "{e}");
    }
}
