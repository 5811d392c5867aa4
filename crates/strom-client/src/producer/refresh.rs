//! A producer's view of where its partitions live: the refresh loop that
//! picks up added partitions and owners that moved (failing the batches
//! that wait on a silent former owner), gives up connections whose owner
//! leaves batches unanswered past the request timeout, and the owners'
//! size limits.

use std::collections::HashMap;
use std::sync::Weak;
use std::time::Duration;

use strom_proto::PartitionInfo;

use super::state::Inner;
use crate::conn::ServerLimits;
use crate::topic::Topic;

/// Picks up partitions added to the topic while the producer runs.
pub(super) async fn refresh_loop(weak: Weak<Inner>) {
    loop {
        tokio::time::sleep(crate::topic::REFRESH).await;
        let Some(inner) = weak.upgrade() else { return };
        let Ok(info) = inner.topic.refresh().await else {
            continue;
        };
        // Follow owners that moved (a member restarted on a new address).
        let mut moved = Vec::new();
        let mut former = Vec::new();
        for (q, p) in inner.parts.read().iter().zip(&info.partitions) {
            let mut owner = q.owner.lock();
            if owner.1 != p.addr {
                *owner = (p.member, p.addr.clone());
                former.extend(q.conn.lock().take().map(|c| (q.clone(), c)));
                moved.push(q.clone());
            }
        }
        // Batches waiting on a former owner that went silent (a paused
        // leader the registry replaced) fail now, instead of waiting for it
        // to wake up. Outside the locks: their completions take them.
        // Those it still answers stay watched by the request timeout.
        for (q, old) in former {
            if old.drop_if_silent(OWNER_SILENCE) {
                tracing::warn!(topic = %inner.topic.name(), partition = q.partition, "the partition's former owner is silent; its pending batches failed");
            } else if !old.is_dead() {
                q.former.lock().push(old);
            }
        }
        let grew = info.partitions.len() > inner.parts.read().len();
        if moved.is_empty() && !grew {
            continue;
        }
        let limits = limits_of(&inner.topic, &info.partitions).await;
        for q in moved {
            let addr = q.owner.lock().1.clone();
            q.state.lock().limit = inner.event_limit(&addr, limits.get(&addr).copied());
        }
        if grew {
            tracing::info!(topic = %inner.topic.name(), partitions = info.partitions.len(), "producer picked up new partitions");
            inner.add_partitions(&info.partitions, &limits);
        }
    }
}

/// Every second, gives up the connections of each partition whose owner
/// left its batches unanswered for the request timeout: they fail as on a
/// lost connection (an idempotent producer resends them to the leader the
/// registry names then), so no push or flush waits for ever on a server
/// that stopped answering. Its own task: a registry that stopped answering
/// holds the refresh loop.
pub(super) async fn unanswered_loop(weak: Weak<Inner>) {
    loop {
        tokio::time::sleep(crate::topic::REFRESH).await;
        let Some(inner) = weak.upgrade() else { return };
        let Some(limit) = inner.request_timeout else {
            return;
        };
        give_up_unanswered(&inner, limit);
    }
}

fn give_up_unanswered(inner: &Inner, limit: Duration) {
    for q in inner.parts.read().iter() {
        q.former
            .lock()
            .retain(|c| !c.is_dead() && c.in_flight() > 0);
        let waited = {
            let st = q.state.lock();
            if st.unanswered() == 0 {
                continue;
            }
            st.answered_at.elapsed()
        };
        if waited <= limit {
            continue;
        }
        let conns: Vec<_> = q
            .conn
            .lock()
            .take()
            .into_iter()
            .chain(q.former.lock().drain(..))
            .collect();
        let (member, addr) = q.owner.lock().clone();
        tracing::warn!(topic = %inner.topic.name(), partition = q.partition, member, %addr, waited = ?waited, "the partition's owner answered none of its batches within the request timeout; giving its connections up");
        for conn in conns {
            conn.abandon(format!(
                "no answer to a batch for partition {} within the request timeout ({limit:?})",
                q.partition
            ));
        }
    }
}

/// How long a partition's former owner may stay silent, with batches
/// waiting on it, before they fail.
const OWNER_SILENCE: Duration = Duration::from_secs(2);

/// Longest wait for a partition owner's limits when a producer starts.
const LIMITS_WAIT: Duration = Duration::from_secs(2);

/// The size limits of the servers owning `partitions`, by address (an
/// unreachable server is left out: the server itself then checks).
async fn limits_of(topic: &Topic, partitions: &[PartitionInfo]) -> HashMap<String, ServerLimits> {
    let mut out = HashMap::new();
    for p in partitions {
        if out.contains_key(&p.addr) {
            continue;
        }
        // Bounded: a dead member must not stall the producer's creation.
        let conn = tokio::time::timeout(LIMITS_WAIT, topic.driver.conn(&p.addr)).await;
        if let Some(l) = conn.ok().and_then(|c| c.ok()).and_then(|c| c.limits()) {
            out.insert(p.addr.clone(), l);
        }
    }
    out
}

pub(super) fn learn_limits(
    topic: &Topic,
    partitions: &[PartitionInfo],
) -> HashMap<String, ServerLimits> {
    let (t, parts) = (topic.clone(), partitions.to_vec());
    topic
        .driver
        .block_on(async move { Ok(limits_of(&t, &parts).await) })
        .unwrap_or_default()
}
