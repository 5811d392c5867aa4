//! Consumer groups on the partitions this server hosts: their state lives
//! beside each partition, in the `Host`'s slot for it (shared cursors,
//! partitioned groups' fences). These are the operations on it that need
//! the host: open a shared cursor, check and commit a partitioned group's
//! fence, ack, describe, drop. The service layer (`service/groups.rs`)
//! and the member requests (`members.rs`) call them; no front end reaches
//! `share/` or `fence.rs` itself.

use std::sync::{Arc, Weak};

use strom_proto::{
    ConsumerGroupMode, ConsumerGroupSpec, ErrorCode, GroupPartitionInfo, PartitionStatus,
};

use crate::error::ServerError;
use crate::fence::{self, Fence};
use crate::host::Host;
use crate::names::check_name;
use crate::partition::Lookup;
use crate::share::{self, ShareCursor};

/// The shared cursor of `spec` on one hosted partition, opened on first use.
pub fn cursor(
    host: &Arc<Host>,
    partition: u32,
    spec: &ConsumerGroupSpec,
) -> Result<Arc<ShareCursor>, ServerError> {
    let slot = host.slot(&spec.topic, partition)?;
    let lookup: Weak<dyn Lookup> = Arc::downgrade(host) as Weak<dyn Lookup>;
    share::cursor(&slot.shares, &slot.partition, spec, lookup)
}

/// The shared cursor of `group` on a hosted partition, if a member opened it.
pub fn open_cursor(
    host: &Host,
    topic: &str,
    partition: u32,
    group: &str,
) -> Result<Arc<ShareCursor>, ServerError> {
    host.slot(topic, partition)?.shares.get(group).ok_or_else(|| {
        ServerError::coded(
            ErrorCode::CONSUMER_GROUP_NOT_FOUND,
            format!("no member of consumer group '{group}' has subscribed to partition {partition} of topic '{topic}' on this server (since it started); subscribe, then ack"),
        )
    })
}

/// A partitioned group's holder on one partition: the consumer the master
/// assigned it to, at the assignment's epoch.
pub struct Claim<'a> {
    pub topic: &'a str,
    pub partition: u32,
    pub group: &'a str,
    pub consumer: u64,
    pub epoch: u64,
}

/// `FENCED` unless the claim holds the group's fence on the partition; the
/// fence, to watch for a newer holder.
pub fn check_fence(host: &Host, c: &Claim) -> Result<Arc<Fence>, ServerError> {
    let slot = host.slot(c.topic, c.partition)?;
    fence::check(&slot.partition, &slot.fences, c.group, c.consumer, c.epoch)
}

/// Stores the claim as the group's fence on the partition (the master
/// reassigned it). Blocking (fsync).
pub fn set_fence(host: &Host, c: &Claim) -> Result<(), ServerError> {
    let slot = host.slot(c.topic, c.partition)?;
    fence::fence(&slot.partition, &slot.fences, c.group, c.consumer, c.epoch)
}

/// Commits a partitioned group's offset for the claim's holder. Blocking.
pub fn commit(host: &Host, c: &Claim, offset: u64) -> Result<(), ServerError> {
    let slot = host.slot(c.topic, c.partition)?;
    fence::commit(
        &slot.partition,
        &slot.fences,
        c.group,
        c.consumer,
        c.epoch,
        offset,
    )
}

/// A consumer group's state on the listed partitions this server hosts
/// (`ConsumerGroupStats`, asked by the master for describe).
pub fn stats(
    host: &Arc<Host>,
    spec: &ConsumerGroupSpec,
    partitions: &[u32],
    member: u32,
) -> Vec<GroupPartitionInfo> {
    partitions
        .iter()
        .map(|p| {
            let failed = |why: String| GroupPartitionInfo {
                partition: *p,
                member,
                status: PartitionStatus::Unavailable(why),
                ..Default::default()
            };
            let pm = match host.get(&spec.topic, *p) {
                Ok(pm) => pm,
                Err(e) => return failed(e.to_string()),
            };
            match spec.mode {
                ConsumerGroupMode::Shared => match cursor(host, *p, spec) {
                    Ok(c) => c.info(&pm, member),
                    Err(e) => failed(e.to_string()),
                },
                ConsumerGroupMode::Partitioned | ConsumerGroupMode::Kafka => GroupPartitionInfo {
                    partition: *p,
                    member,
                    committed: pm
                        .committed(&spec.name)
                        .unwrap_or_else(|| pm.first_offset()),
                    next_offset: pm.next_offset(),
                    ..Default::default()
                },
            }
        })
        .collect()
}

/// Forgets a consumer group on every hosted partition of `topic`: its
/// shared cursors and ledgers, and its fences. The name is checked before
/// anything is looked up or removed. Blocking.
pub fn drop_group(host: &Host, topic: &str, group: &str) -> Result<(), ServerError> {
    check_name("consumer group", group, ErrorCode::INVALID_ARGUMENT)?;
    for slot in host.slots_of(topic) {
        slot.shares.drop_group(&slot.partition, group)?;
        fence::drop_group(&slot.partition, &slot.fences, group)?;
    }
    Ok(())
}
