//! The metrics tap's read side: a [`ServerSnapshot`] of this server (its
//! counters, its hosted partitions with storage, offsets and consumer lag,
//! and the group's members as far as it knows them), for the front ends
//! that show it. Reading it never blocks appends: counters are atomics and
//! storage figures come from each log's own stats.

use std::time::Duration;

use crate::partition::PartitionManager;
use crate::stats::{ConsumerLag, MemberSnapshot, PartitionSnapshot, ServerSnapshot};

use super::Services;

/// How long a snapshot waits for the registry (busy with a slow topic
/// operation) before it lists this server alone.
const REGISTRY_WAIT: Duration = Duration::from_millis(500);

impl Services {
    /// This server at this moment.
    pub async fn snapshot(&self) -> ServerSnapshot {
        let mut partitions: Vec<PartitionSnapshot> = self
            .data
            .host()
            .all()
            .iter()
            .map(|p| self.partition_snapshot(p))
            .collect();
        partitions.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
        let (connections_open, connections_total) = self.stats.connections();
        ServerSnapshot {
            member: self.control.member(),
            addr: self.control.addr().to_string(),
            master: self.control.master_registry().is_some(),
            members: self.members().await,
            connections_open,
            connections_total,
            errors: self.stats.errors(),
            rss_bytes: crate::stats::rss_bytes(),
            taken_us: crate::server::now_us(),
            partitions,
        }
    }

    fn partition_snapshot(&self, p: &PartitionManager) -> PartitionSnapshot {
        let log = p.log.stats();
        let consumers = self
            .data
            .offsets(p)
            .into_iter()
            .map(|(name, committed)| ConsumerLag {
                lag: log.next_offset.saturating_sub(committed),
                name,
                committed,
            })
            .collect();
        PartitionSnapshot {
            topic: p.topic.clone(),
            partition: p.id,
            partition_type: p.partition_type().to_string(),
            first_offset: log.first_offset,
            next_offset: log.next_offset,
            storage_bytes: log.bytes,
            segments: log.segments,
            dropped_events: p.dropped_events(),
            sealed: p.is_sealed(),
            consumers,
            ..PartitionSnapshot::counters(&p.stats)
        }
    }

    async fn members(&self) -> Vec<MemberSnapshot> {
        let me = || {
            vec![MemberSnapshot {
                id: self.control.member(),
                addr: self.control.addr().to_string(),
                alive: true,
            }]
        };
        let Some(registry) = self.control.master_registry() else {
            return me();
        };
        match tokio::time::timeout(REGISTRY_WAIT, registry.members()).await {
            Ok(members) => members
                .into_iter()
                .map(|m| MemberSnapshot {
                    id: m.id,
                    addr: m.addr,
                    alive: m.alive,
                })
                .collect(),
            Err(_) => me(),
        }
    }
}
