//! The metrics tap's operator parts: the metadata quorum as this member's
//! Raft sees it, and (on the registry master) every partition's leader,
//! copies, in-sync replicas and whether it is offline. See
//! [`crate::health`] for the snapshot types.

use std::collections::HashSet;
use std::time::Duration;

use strom_proto::PartitionStatus;

use crate::health::{GroupPartition, LeaseSnapshot, QuorumSnapshot};

use super::Services;

/// How long the registry master may take to describe every partition
/// (it asks each hosting member for its offsets; a dead one refuses at
/// once, a hung one is waited for this long).
const DESCRIBE_WAIT: Duration = Duration::from_millis(1500);

impl Services {
    /// The metadata quorum as this member sees it; without a quorum (the
    /// registry on member 0 alone) `enabled` is false and there is one
    /// voter, the master.
    pub(super) fn quorum_snapshot(&self) -> QuorumSnapshot {
        let Some(meta) = self.control.quorum_meta() else {
            return QuorumSnapshot {
                enabled: false,
                state: "none".into(),
                voters: 1,
                ..QuorumSnapshot::default()
            };
        };
        let m = meta.metrics();
        let cfg = m.membership_config.membership();
        let voters: HashSet<u64> = cfg.voter_ids().collect();
        let learners = cfg.nodes().filter(|(id, _)| !voters.contains(id)).count();
        // The commit index, on the leader: the highest log index a majority
        // of voters hold (openraft 0.9 reports only what each one matched).
        let committed = m.replication.as_ref().and_then(|repl| {
            let mut matched: Vec<u64> = voters
                .iter()
                .map(|v| match repl.get(v) {
                    Some(l) => l.map_or(0, |l| l.index),
                    None if Some(*v) == m.current_leader => m.last_log_index.unwrap_or(0),
                    None => 0,
                })
                .collect();
            matched.sort_unstable_by(|a, b| b.cmp(a));
            matched.get(voters.len() / 2).copied()
        });
        QuorumSnapshot {
            enabled: true,
            state: format!("{:?}", m.state).to_lowercase(),
            term: m.current_term,
            leader: m.current_leader,
            committed_index: committed,
            applied_index: m.last_applied.map(|l| l.index),
            last_log_index: m.last_log_index,
            voters: u32::try_from(voters.len()).unwrap_or(u32::MAX),
            learners: u32::try_from(learners).unwrap_or(u32::MAX),
        }
    }

    /// Producer leases: those open (on the master; 0 elsewhere, or while
    /// the registry is busy past 500 ms) and those expired here.
    pub(super) async fn lease_snapshot(&self) -> LeaseSnapshot {
        let open = match self.control.master_registry() {
            Some(r) => tokio::time::timeout(super::tap::REGISTRY_WAIT, r.open_leases())
                .await
                .unwrap_or(0),
            None => 0,
        };
        LeaseSnapshot {
            open,
            expired: self.stats.expired_leases(),
        }
    }

    /// Every partition of the group as the registry records it, on the
    /// master (empty elsewhere, or when describing takes too long).
    pub(super) async fn group_partitions(&self) -> Vec<GroupPartition> {
        let Some(registry) = self.control.master_registry() else {
            return Vec::new();
        };
        let Ok(members) = tokio::time::timeout(DESCRIBE_WAIT, registry.members()).await else {
            return Vec::new();
        };
        let alive: HashSet<u32> = members.iter().filter(|m| m.alive).map(|m| m.id).collect();
        let Ok(topics) = tokio::time::timeout(DESCRIBE_WAIT, registry.list()).await else {
            tracing::warn!("describing the topics for /metrics took too long");
            return Vec::new();
        };
        topics
            .iter()
            .flat_map(|t| {
                let alive = &alive;
                t.partitions.iter().map(move |p| GroupPartition {
                    topic: t.spec.name.clone(),
                    partition: p.id,
                    leader: p.member,
                    replicas: u32::try_from(p.replicas.len().max(1)).unwrap_or(u32::MAX),
                    isr: u32::try_from(p.isr.len().max(usize::from(p.replicas.is_empty())))
                        .unwrap_or(u32::MAX),
                    offline: !alive.contains(&p.member) || !matches!(p.status, PartitionStatus::Ok),
                })
            })
            .collect()
    }
}
