//! The metrics tap's read side: a [`ServerSnapshot`] of this server (its
//! counters, its hosted partitions with storage, offsets and consumer lag,
//! the group's members as far as it knows them, and the operator's view in
//! `tap_health.rs`: replication, quorum, disk), for the front ends
//! that show it. Reading it never blocks appends: counters are atomics and
//! storage figures come from each log's own stats.

use std::sync::Arc;
use std::time::Duration;

use strom_proto::{Request, Response};

use crate::health::SharedGroupSnapshot;
use crate::host::Slot;
use crate::stats::{
    ConsumerLag, GroupSnapshot, MemberSnapshot, PartitionSnapshot, ServerSnapshot, Unreachable,
};

use super::Services;

/// How long a snapshot waits for the registry (busy with a slow topic
/// operation) before it lists this server alone.
pub(super) const REGISTRY_WAIT: Duration = Duration::from_millis(500);

/// How long the master waits for one member's snapshot.
const MEMBER_WAIT: Duration = Duration::from_secs(2);

impl Services {
    /// This server at this moment.
    pub async fn snapshot(&self) -> ServerSnapshot {
        let mut partitions: Vec<PartitionSnapshot> = self
            .data
            .host()
            .all_slots()
            .iter()
            .map(|s| self.partition_snapshot(s))
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
            taken_us: strom_storage::now_us(),
            partitions,
            quorum: self.quorum_snapshot(),
            disk: crate::health::DiskSnapshot::of(&self.config.data_dir),
            group_partitions: self.group_partitions().await,
            leases: self.lease_snapshot().await,
            kafka: self.stats.kafka.snapshot(),
            audit: self.audit.snapshot(),
            quotas: self.quotas.snapshot(),
        }
    }

    /// Every live member's snapshot, this one's first, asked in parallel
    /// (on the master; elsewhere this server alone). A member that does
    /// not answer within 2 s is listed as unreachable, with why.
    pub async fn group_snapshot(self: &Arc<Self>) -> GroupSnapshot {
        let me = self.snapshot().await;
        let mut asks = tokio::task::JoinSet::new();
        for m in me.members.iter().filter(|m| m.alive && m.id != me.member) {
            let (svc, m) = (self.clone(), m.clone());
            asks.spawn(async move {
                let answer = tokio::time::timeout(MEMBER_WAIT, svc.member_snapshot(&m.addr)).await;
                let error = match answer {
                    Ok(Ok(snap)) => return Ok(snap),
                    Ok(Err(e)) => e,
                    Err(_) => format!("no answer within {MEMBER_WAIT:?}"),
                };
                Err(Unreachable {
                    id: m.id,
                    addr: m.addr,
                    error,
                })
            });
        }
        let mut group = GroupSnapshot {
            servers: vec![me],
            unreachable: Vec::new(),
        };
        while let Some(done) = asks.join_next().await {
            match done {
                Ok(Ok(snap)) => group.servers.push(snap),
                Ok(Err(u)) => group.unreachable.push(u),
                Err(e) => tracing::warn!(error = %e, "a member snapshot task failed"),
            }
        }
        group.servers[1..].sort_by_key(|s| s.member);
        group.unreachable.sort_by_key(|u| u.id);
        group
    }

    async fn member_snapshot(&self, addr: &str) -> Result<ServerSnapshot, String> {
        let peers = self.control.link().peers();
        match peers.call(addr, &Request::ServerSnapshot).await {
            Ok(Response::ServerSnapshot { json }) => serde_json::from_str(&json)
                .map_err(|e| format!("a snapshot that does not parse: {e}")),
            Ok(Response::Error { code, message }) => Err(format!("{message} [{code:?}]")),
            Ok(other) => Err(format!("unexpected answer (opcode {})", other.opcode())),
            Err(e) => Err(e.to_string()),
        }
    }

    fn partition_snapshot(&self, slot: &Slot) -> PartitionSnapshot {
        let p = &slot.partition;
        let log = p.log_stats();
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
            replica: p.replication().and_then(|r| r.status()),
            shared_groups: shared_groups(slot),
            tier: log.tier.clone().map(Into::into),
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

/// The shared groups open on `slot`'s partition.
fn shared_groups(slot: &Slot) -> Vec<SharedGroupSnapshot> {
    let pm = &slot.partition;
    slot.shares
        .all()
        .into_iter()
        .map(|(group, c)| {
            let i = c.info(pm, 0);
            SharedGroupSnapshot {
                group,
                committed: i.committed,
                pending: i.pending,
                redelivered: i.redelivered,
                dead_lettered: i.dead_lettered,
                pending_by_consumer: i.pending_by_consumer,
            }
        })
        .collect()
}
