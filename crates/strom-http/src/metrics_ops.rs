//! The operator's part of `/metrics`: replication (each replicated
//! partition's copy here; on the leader its in-sync replicas and followers'
//! lag; on the registry master every partition's state, so under-replicated
//! and offline partitions are counted in one place), the metadata quorum,
//! tiered storage and the data directory's free space. docs/observability.md lists them.

use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Unit;
use strom_server::health::ReplicaSnapshot;
use strom_server::stats::{PartitionSnapshot, ServerSnapshot};

use crate::metrics::{family, gauge, Labels, Value};

type Fmt = Result<(), std::fmt::Error>;

/// Every operator metric of `s`.
pub(crate) fn encode(enc: &mut DescriptorEncoder, s: &ServerSnapshot) -> Fmt {
    replication(enc, &s.partitions)?;
    followers(enc, &s.partitions)?;
    group_partitions(enc, s)?;
    quorum(enc, s)?;
    tier(enc, &s.partitions)?;
    disk(enc, s)
}

/// Tiered partitions here: what the tier holds and what this copy did.
fn tier(enc: &mut DescriptorEncoder, parts: &[PartitionSnapshot]) -> Fmt {
    let rows = || {
        parts
            .iter()
            .filter_map(|p| p.tier.as_ref().map(|t| (labels(&p.topic, p.partition), t)))
    };
    family(
        enc,
        "strom_tier",
        "Bytes of the partition's segments in the tier.",
        Some(Unit::Bytes),
        rows().map(|(l, t)| (l, Value::Gauge(gauge(t.tiered_bytes)))),
    )?;
    family(
        enc,
        "strom_tier_segments",
        "Segments of the partition in the tier.",
        None,
        rows().map(|(l, t)| (l, Value::Gauge(i64::from(t.tiered_segments)))),
    )?;
    family(
        enc,
        "strom_tier_uploaded",
        "Bytes this copy uploaded to the tier (a sole copy, or a replicated partition's leader).",
        Some(Unit::Bytes),
        rows().map(|(l, t)| (l, Value::Counter(t.uploaded_bytes))),
    )?;
    family(
        enc,
        "strom_tier_reads",
        "Reads served from segments only in the tier.",
        None,
        rows().map(|(l, t)| (l, Value::Counter(t.reads))),
    )?;
    family(
        enc,
        "strom_tier_errors",
        "Tier copies and fetches that failed (each retried).",
        None,
        rows().map(|(l, t)| (l, Value::Counter(t.errors))),
    )
}

fn labels(topic: &str, partition: u32) -> Labels {
    vec![
        ("topic", topic.to_string()),
        ("partition", partition.to_string()),
    ]
}

/// Replicated partitions here, with their copy's state.
fn replicas(
    parts: &[PartitionSnapshot],
) -> impl Iterator<Item = (&PartitionSnapshot, &ReplicaSnapshot)> + Clone {
    parts
        .iter()
        .filter_map(|p| p.replica.as_ref().map(|r| (p, r)))
}

/// Replicated partitions this member leads.
fn led(
    parts: &[PartitionSnapshot],
) -> impl Iterator<Item = (&PartitionSnapshot, &ReplicaSnapshot)> + Clone {
    replicas(parts).filter(|(_, r)| r.role == "leader")
}

fn replication(enc: &mut DescriptorEncoder, parts: &[PartitionSnapshot]) -> Fmt {
    let g = |v: u64| Value::Gauge(gauge(v));
    family(
        enc,
        "strom_replica_role",
        "This member's copy of a replicated partition: 1 for its role (leader, follower or idle).",
        None,
        replicas(parts).map(|(p, r)| {
            let mut l = labels(&p.topic, p.partition);
            l.push(("role", r.role.clone()));
            (l, Value::Gauge(1))
        }),
    )?;
    family(
        enc,
        "strom_replica_epoch",
        "The leader epoch this member's copy is in.",
        None,
        replicas(parts).map(|(p, r)| (labels(&p.topic, p.partition), g(r.epoch))),
    )?;
    family(
        enc,
        "strom_partition_replicas",
        "Copies of the partition (on its leader).",
        None,
        led(parts).map(|(p, r)| (labels(&p.topic, p.partition), g(u64::from(r.replicas)))),
    )?;
    family(
        enc,
        "strom_partition_isr_size",
        "In-sync replicas of the partition, the leader included (on its leader).",
        None,
        led(parts).map(|(p, r)| (labels(&p.topic, p.partition), g(r.isr.len() as u64))),
    )?;
    family(
        enc,
        "strom_partition_under_replicated",
        "1 if fewer copies are in sync than the partition has (on its leader).",
        None,
        led(parts).map(|(p, r)| {
            let under = (r.isr.len() as u64) < u64::from(r.replicas);
            (labels(&p.topic, p.partition), g(u64::from(under)))
        }),
    )?;
    family(
        enc,
        "strom_partition_high_watermark",
        "The high watermark: every in-sync copy holds the events below it (on its leader).",
        None,
        led(parts).map(|(p, r)| (labels(&p.topic, p.partition), g(r.high_watermark))),
    )?;
    family(
        enc,
        "strom_partition_high_watermark_lag_events",
        "Events the leader holds past the high watermark, not yet visible to consumers.",
        None,
        led(parts).map(|(p, r)| {
            let lag = p.next_offset.saturating_sub(r.high_watermark);
            (labels(&p.topic, p.partition), g(lag))
        }),
    )
}

fn followers(enc: &mut DescriptorEncoder, parts: &[PartitionSnapshot]) -> Fmt {
    let rows = || {
        led(parts).flat_map(|(p, r)| {
            r.followers.iter().map(move |f| {
                let mut l = labels(&p.topic, p.partition);
                l.push(("member", f.member.to_string()));
                (l, f)
            })
        })
    };
    family(
        enc,
        "strom_replica_follower_lag_events",
        "Events the leader holds durably that the follower has not fetched yet.",
        None,
        rows().map(|(l, f)| (l, Value::Gauge(gauge(f.lag_events)))),
    )?;
    family(
        enc,
        "strom_replica_follower_lag",
        "Time since the follower last caught up with the leader (absent until it first does).",
        Some(Unit::Seconds),
        rows().filter_map(|(l, f)| Some((l, Value::GaugeF(f.lag_seconds?)))),
    )?;
    family(
        enc,
        "strom_replica_follower_in_sync",
        "1 if the follower is in the partition's in-sync replicas.",
        None,
        rows().map(|(l, f)| (l, Value::Gauge(i64::from(f.in_sync)))),
    )
}

/// On the registry master: every partition of the group, and the counts
/// alert rules watch.
fn group_partitions(enc: &mut DescriptorEncoder, s: &ServerSnapshot) -> Fmt {
    if !s.master {
        return Ok(());
    }
    let parts = &s.group_partitions;
    let row = |t: &str, p: u32, v: i64| (labels(t, p), Value::Gauge(v));
    family(
        enc,
        "strom_group_partition_isr_size",
        "In-sync replicas of each partition of the group, as the registry records them (on the master).",
        None,
        parts.iter().map(|p| row(&p.topic, p.partition, i64::from(p.isr))),
    )?;
    family(
        enc,
        "strom_group_partition_offline",
        "1 if no live leader serves the partition (on the master).",
        None,
        parts
            .iter()
            .map(|p| row(&p.topic, p.partition, i64::from(p.offline))),
    )?;
    let count = |f: &dyn Fn(&strom_server::health::GroupPartition) -> bool| {
        parts.iter().filter(|p| f(p)).count() as i64
    };
    family(
        enc,
        "strom_group_under_replicated_partitions",
        "Partitions of the group with fewer in-sync replicas than copies (on the master).",
        None,
        [(Labels::new(), Value::Gauge(count(&|p| p.isr < p.replicas)))],
    )?;
    family(
        enc,
        "strom_group_offline_partitions",
        "Partitions of the group no live leader serves (on the master).",
        None,
        [(Labels::new(), Value::Gauge(count(&|p| p.offline)))],
    )
}

fn quorum(enc: &mut DescriptorEncoder, s: &ServerSnapshot) -> Fmt {
    let q = &s.quorum;
    let one = |v: i64| [(Labels::new(), Value::Gauge(v))];
    family(
        enc,
        "strom_meta_quorum_enabled",
        "1 if the group keeps its registry in a Raft quorum; 0 if member 0 holds it alone (one voter).",
        None,
        one(i64::from(q.enabled)),
    )?;
    family(
        enc,
        "strom_meta_voters",
        "Voting members of the metadata quorum (1 without a quorum).",
        None,
        one(i64::from(q.voters)),
    )?;
    family(
        enc,
        "strom_meta_learners",
        "Non-voting members of the metadata quorum.",
        None,
        one(i64::from(q.learners)),
    )?;
    if !q.enabled {
        return Ok(());
    }
    family(
        enc,
        "strom_meta_state",
        "This member's Raft state: 1 for the state it is in.",
        None,
        [(vec![("state", q.state.clone())], Value::Gauge(1))],
    )?;
    family(
        enc,
        "strom_meta_term",
        "The Raft term this member is in.",
        None,
        one(gauge(q.term)),
    )?;
    family(
        enc,
        "strom_meta_has_leader",
        "1 if this member knows a leader of the metadata quorum.",
        None,
        one(i64::from(q.leader.is_some())),
    )?;
    family(
        enc,
        "strom_meta_leader_id",
        "The member id of the quorum's leader as this member knows it (absent while none is known).",
        None,
        q.leader.map(|id| (Labels::new(), Value::Gauge(gauge(id)))),
    )?;
    family(
        enc,
        "strom_meta_committed_index",
        "The highest log index a majority of voters hold (on the quorum's leader).",
        None,
        q.committed_index
            .map(|i| (Labels::new(), Value::Gauge(gauge(i)))),
    )?;
    family(
        enc,
        "strom_meta_applied_index",
        "The last log index this member applied to its registry.",
        None,
        q.applied_index
            .map(|i| (Labels::new(), Value::Gauge(gauge(i)))),
    )?;
    family(
        enc,
        "strom_meta_last_log_index",
        "The last log index this member holds.",
        None,
        q.last_log_index
            .map(|i| (Labels::new(), Value::Gauge(gauge(i)))),
    )
}

fn disk(enc: &mut DescriptorEncoder, s: &ServerSnapshot) -> Fmt {
    let Some(d) = &s.disk else {
        return Ok(());
    };
    let b = Some(Unit::Bytes);
    let one = |v: u64| [(vec![("path", d.path.clone())], Value::Gauge(gauge(v)))];
    family(
        enc,
        "strom_data_dir_free",
        "Bytes the server may still write on the data directory's file system.",
        b.clone(),
        one(d.free_bytes),
    )?;
    family(
        enc,
        "strom_data_dir_size",
        "Size of the data directory's file system.",
        b,
        one(d.total_bytes),
    )?;
    family(
        enc,
        "strom_data_dir_free_inodes",
        "Free inodes on the data directory's file system.",
        None,
        one(d.free_inodes),
    )?;
    family(
        enc,
        "strom_data_dir_inodes",
        "Inodes of the data directory's file system.",
        None,
        one(d.total_inodes),
    )
}
