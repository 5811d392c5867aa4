//! A partitioned consumer group's member: one task on the driver's runtime
//! heartbeats to the master and applies each answer as a diff against the
//! partitions it holds (design §4, §7.1).
//!
//! - Newly assigned partitions: an `Assigned` marker is queued first (the
//!   listener hears of them before any of their events), then a
//!   subscription (`GroupSubscribe` with the epoch) starts at the group's
//!   committed offset.
//! - Revoked partitions: the subscription stops, queued unpulled events
//!   are dropped, the commit in flight is awaited, and only then does the
//!   partition leave `owned`, with an immediate heartbeat.
//! - `UNKNOWN_CONSUMER` or `FENCED`: every partition counts as lost; the
//!   member joins again under a new id.
//! - A partition read to its end, and committed there, is reported `done`;
//!   once the master answers `ended`, the consumer ends after its queue.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use strom_proto::{ErrorCode, Request, Response, StartPos};

use crate::consumer::state::{Item, PartSub, Shared};
use crate::subscription::run_partition;
use crate::topic::Owner;

/// Pause after a failed heartbeat.
const RETRY: Duration = Duration::from_millis(200);

/// Partition -> (slot in the consumer, epoch).
type Held = BTreeMap<u32, (usize, u64)>;

pub(crate) async fn follow(weak: Weak<Shared>) {
    let mut held = Held::new();
    let mut ended = false;
    let mut wait = Duration::ZERO;
    loop {
        tokio::time::sleep(wait).await;
        let Some(shared) = weak.upgrade() else { return };
        let Some(m) = shared.group.clone() else {
            return;
        };
        if m.has_left() {
            return;
        }
        let every = Duration::from_millis(u64::from(m.spec.session_ms / 3).clamp(100, 1000));
        let owned = held.iter().map(|(p, (_, e))| (*p, *e)).collect();
        let done = held
            .values()
            .filter_map(|(slot, _)| shared.part(*slot).finished())
            .collect();
        let req = Request::ConsumerHeartbeat {
            group: m.spec.name.clone(),
            consumer: m.consumer(),
            owned,
            done,
        };
        wait = match m.topic.driver.master_call(req).await {
            Ok(Response::ConsumerAssignment {
                assigned,
                ended: group_ended,
                heartbeat_ms,
                ..
            }) => {
                let revoked = apply(&shared, &mut held, assigned, m.consumer()).await;
                if group_ended && !ended {
                    ended = true;
                    shared.mark(Item::GroupEnd);
                }
                match (revoked, heartbeat_ms) {
                    (true, _) => Duration::ZERO,
                    (false, 0) => every,
                    (false, ms) => Duration::from_millis(u64::from(ms)).min(every),
                }
            }
            Ok(other) => {
                tracing::warn!(group = %m.spec.name, answer = other.opcode(), "unexpected heartbeat answer");
                RETRY
            }
            Err(e) if matches!(e.code(), ErrorCode::UNKNOWN_CONSUMER | ErrorCode::FENCED) => {
                if m.has_left() {
                    return;
                }
                tracing::info!(group = %m.spec.name, consumer = m.consumer(), error = %e, "lost the group's partitions; joining again");
                lose_all(&shared, &mut held).await;
                match m.rejoin_fresh().await {
                    Ok(_) => Duration::ZERO,
                    Err(e) => {
                        tracing::warn!(group = %m.spec.name, error = %e, "could not join the consumer group again");
                        RETRY
                    }
                }
            }
            Err(e) => {
                tracing::debug!(group = %m.spec.name, error = %e, "consumer heartbeat failed");
                RETRY
            }
        };
    }
}

/// Gives up every partition held.
async fn lose_all(shared: &Arc<Shared>, held: &mut Held) {
    let mut lost = Vec::new();
    for (p, (slot, _)) in std::mem::take(held) {
        if shared.revoke(slot).await {
            lost.push(p);
        }
    }
    shared.assigned.lock().clear();
    if !lost.is_empty() {
        shared.mark_first(Item::Revoked(lost));
    }
}

/// Applies an assignment: gives up what is no longer listed (or listed
/// under another epoch), then starts what is new. True if anything was
/// given up (the master should hear of it at once).
async fn apply(
    shared: &Arc<Shared>,
    held: &mut Held,
    assigned: Vec<(u32, u64)>,
    consumer: u64,
) -> bool {
    let want: BTreeMap<u32, u64> = assigned.into_iter().collect();
    let revoked: Vec<u32> = held
        .iter()
        .filter(|(p, (_, e))| want.get(p) != Some(e))
        .map(|(p, _)| *p)
        .collect();
    let mut announced = Vec::new();
    for p in &revoked {
        if let Some((slot, _)) = held.remove(p) {
            if shared.revoke(slot).await {
                announced.push(*p);
            }
        }
    }
    if !revoked.is_empty() {
        tracing::info!(topic = %shared.topic.name(), partitions = ?revoked, "partitions revoked");
    }
    if !announced.is_empty() {
        shared.mark_first(Item::Revoked(announced));
    }
    let new: Vec<(u32, u64)> = want
        .iter()
        .filter(|(p, _)| !held.contains_key(p))
        .map(|(p, e)| (*p, *e))
        .collect();
    if !new.is_empty() {
        match shared.topic.refresh().await {
            Ok(info) => {
                let new: Vec<(u32, u64)> = new
                    .into_iter()
                    .filter(|(p, _)| info.partitions.get(*p as usize).is_some())
                    .collect();
                let ps: Vec<u32> = new.iter().map(|(p, _)| *p).collect();
                // Ahead of any of their events.
                shared.mark(Item::Assigned(ps.clone()));
                for (p, epoch) in new {
                    let pi = &info.partitions[p as usize];
                    let owner = Owner {
                        member: pi.member,
                        addr: pi.addr.clone(),
                    };
                    let sub =
                        PartSub::held(&shared.topic, &shared.name, p, owner, (consumer, epoch));
                    let (slot, qepoch) = shared.add_part(sub.clone());
                    let task =
                        run_partition(shared.clone(), slot, StartPos::Committed, qepoch, None);
                    let handle = shared.topic.driver.inner.handle.spawn(task);
                    *sub.task.lock() = Some(handle.abort_handle());
                    shared.tasks.lock().push(handle);
                    held.insert(p, (slot, epoch));
                }
                tracing::info!(topic = %shared.topic.name(), partitions = ?ps, "partitions assigned");
            }
            Err(e) => {
                tracing::debug!(error = %e, "could not locate newly assigned partitions; next heartbeat retries")
            }
        }
    }
    *shared.assigned.lock() = held.keys().copied().collect();
    !revoked.is_empty()
}
