//! Where a subscribed partition lives, kept current: following its owner
//! when it moves (the old owner sends the reader away, and the registry
//! says where the partition went) or restarts elsewhere, and subscribing
//! to partitions added to the topic after the consumer started.

use std::sync::Weak;
use std::time::Duration;

use strom_proto::{ErrorCode, StartPos};

use crate::consumer::state::{PartSub, Shared};
use crate::error::Error;
use crate::subscription::run_partition;

/// How often a reader sent away from a partition's old owner asks the
/// registry where it went, and for how long.
const FOLLOW_POLL: Duration = Duration::from_millis(100);
const FOLLOW_WAIT: Duration = Duration::from_secs(10);

pub(crate) fn is_unreachable(e: &Error) -> bool {
    matches!(
        e.code(),
        ErrorCode::CONNECTION_FAILED | ErrorCode::CONNECTION_CLOSED
    )
}

/// Whether the member says the partition is not (or no longer) its to
/// serve: it moved away (`NOT_PARTITION_LEADER`), or the member released
/// it already (`PARTITION_NOT_FOUND`, or `TOPIC_NOT_FOUND` when it held no
/// other partition of the topic). The registry says where it went; a
/// topic that was really deleted is not found there either.
pub(crate) fn moved_away(e: &Error) -> bool {
    matches!(
        e.code(),
        ErrorCode::NOT_PARTITION_LEADER
            | ErrorCode::PARTITION_NOT_FOUND
            | ErrorCode::TOPIC_NOT_FOUND
    )
}

/// What the registry says of a partition its member sent the reader away
/// from.
pub(crate) enum Follow {
    /// It lives elsewhere now: subscribe there.
    Moved,
    /// The topic (or the partition) is gone: the error stands.
    Gone,
    /// A seek or a rebalance replaced this subscription meanwhile.
    Superseded,
}

/// Waits until the registry names another owner for the partition, as it
/// does once a move completes (the old owner may answer before the
/// registry is updated), for as long as the registry still knows the
/// partition, and for at most [`FOLLOW_WAIT`] while it keeps naming the
/// member that sent the reader away (the error then stands).
pub(crate) async fn follow_move(shared: &Shared, sub: &PartSub, epoch: u64) -> Follow {
    let deadline = tokio::time::Instant::now() + FOLLOW_WAIT;
    loop {
        let Ok(info) = shared.topic.refresh().await else {
            return Follow::Gone;
        };
        let Some(p) = info.partitions.get(sub.partition as usize) else {
            return Follow::Gone;
        };
        {
            let mut o = sub.owner.lock();
            if o.addr != p.addr {
                tracing::info!(partition = sub.partition, from = %o.addr, to = %p.addr, "the partition moved; following it");
                o.member = p.member;
                o.addr = p.addr.clone();
                return Follow::Moved;
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return Follow::Gone;
        }
        tokio::time::sleep(FOLLOW_POLL).await;
        if shared.epoch() != epoch {
            return Follow::Superseded;
        }
    }
}

/// Re-reads where the partition lives; true if its owner's address changed.
pub(crate) async fn refresh_owner(shared: &Shared, sub: &PartSub) -> bool {
    let Ok(info) = shared.topic.refresh().await else {
        return false;
    };
    let Some(p) = info.partitions.get(sub.partition as usize) else {
        return false;
    };
    let mut o = sub.owner.lock();
    let moved = o.addr != p.addr;
    o.member = p.member;
    o.addr = p.addr.clone();
    moved
}

/// Subscribes to partitions added to the topic after the consumer started.
pub(crate) async fn refresh_loop(weak: Weak<Shared>) {
    loop {
        tokio::time::sleep(crate::topic::REFRESH).await;
        let Some(shared) = weak.upgrade() else { return };
        let known = shared.parts.read().len();
        let Ok(info) = shared.topic.refresh().await else {
            continue;
        };
        for p in info.partitions.iter().skip(known) {
            let sub = PartSub::new(
                &shared.topic,
                &shared.name,
                shared.group.as_deref(),
                p.id,
                p.member,
                p.addr.clone(),
            );
            let (slot, epoch) = shared.add_part(sub);
            let start = match shared.opts.start {
                StartPos::End => StartPos::End,
                _ => StartPos::Committed,
            };
            let task = run_partition(shared.clone(), slot, start, epoch, None);
            let handle = shared.topic.driver.inner.handle.clone();
            shared.tasks.lock().push(handle.spawn(task));
            tracing::info!(topic = %shared.topic.name(), partition = p.id, "consumer picked up a new partition");
        }
    }
}
