//! An idempotent producer's resends: a batch whose attempt failed in a way
//! a leader change or a lost connection explains waits until every batch
//! sent to the partition before it has its answer, then goes again, in
//! sequence order, to the leader the registry names now. The partition
//! answers a batch it already holds with its first offsets, so a resend
//! never appends twice. The first batch of each resend is marked as a
//! sequence restart (every earlier batch has its answer by then), so a
//! partition whose new leader lost batches the old one acknowledged alone
//! (`acks=leader`) takes it instead of waiting for them. After `retry_for`
//! the push fails, and so do the partition's later batches (they cannot
//! follow a missing one in order).

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use strom_proto::ErrorCode;

use super::state::{Inner, PartQueue, Sealed};
use crate::error::Error;

/// Most batches an idempotent producer keeps in flight per partition: as
/// many as a partition remembers per producer to answer resends.
pub(super) const MAX_IN_FLIGHT: usize = 64;

/// Pause before a resend, so a failover has a moment to happen.
const PAUSE: Duration = Duration::from_millis(200);

impl Sealed {
    /// The batch again, to resend (the buffers are shared, not copied).
    pub(super) fn copy(&self) -> Sealed {
        Sealed {
            meta: self.meta.clone(),
            count: self.count,
            data: self.data.clone(),
            slot: self.slot.clone(),
            seq: self.seq,
            failed_at: self.failed_at,
            packed: self.packed,
        }
    }
}

/// Whether another attempt may succeed where this one failed (also what
/// transforms retry their output batches on).
pub(crate) fn worth_resending(e: &Error) -> bool {
    matches!(
        e.code(),
        ErrorCode::CONNECTION_FAILED
            | ErrorCode::CONNECTION_CLOSED
            | ErrorCode::NOT_PARTITION_LEADER
            | ErrorCode::NOT_ENOUGH_REPLICAS
            | ErrorCode::NOT_ENOUGH_REPLICAS_AFTER_APPEND
            | ErrorCode::PARTITION_UNAVAILABLE
            | ErrorCode::OUT_OF_ORDER_SEQUENCE
            | ErrorCode::TIMEOUT
    )
}

/// The server holds no copy of the partition: after a move, a former
/// owner that already released it answers so, where it answered
/// `NOT_PARTITION_LEADER` a moment before. Worth a resend to the leader the
/// registry names now, if it names one.
fn moved_away(e: &Error) -> bool {
    matches!(
        e.code(),
        ErrorCode::PARTITION_NOT_FOUND | ErrorCode::TOPIC_NOT_FOUND
    )
}

/// Takes a failed batch of an idempotent producer for a later resend
/// (`None`), or hands back the error its push fails with.
pub(super) fn resend_later(
    inner: &Arc<Inner>,
    q: &Arc<PartQueue>,
    mut b: Sealed,
    e: Error,
) -> Option<Error> {
    let mut st = q.state.lock();
    st.answered_at = Instant::now();
    if st.gave_up || !(worth_resending(&e) || moved_away(&e)) {
        return Some(e);
    }
    if moved_away(&e) {
        st.not_hosted.get_or_insert_with(|| e.shared());
    }
    let first = *b.failed_at.get_or_insert_with(Instant::now);
    if first.elapsed() > inner.opts.retry_for {
        st.gave_up = true;
        tracing::warn!(topic = %inner.topic.name(), partition = q.partition, seq = b.seq, error = %e, "gave up resending a batch; the partition's later batches fail too");
        return Some(e);
    }
    let seq = b.seq.expect("an idempotent producer's batch");
    tracing::debug!(topic = %inner.topic.name(), partition = q.partition, seq, error = %e, "batch will be resent");
    st.resend.insert(seq, b);
    if !st.resending {
        st.resending = true;
        let weak = Arc::downgrade(inner);
        inner
            .topic
            .driver
            .inner
            .handle
            .spawn(resend_loop(weak, q.clone()));
    }
    None
}

/// Waits for the partition's other answers, finds its leader, and queues
/// the failed batches again in order.
async fn resend_loop(weak: Weak<Inner>, q: Arc<PartQueue>) {
    loop {
        tokio::time::sleep(PAUSE).await;
        let Some(inner) = weak.upgrade() else {
            return fail_all(&q, Error::Closed("producer"));
        };
        {
            let st = q.state.lock();
            if st.unanswered() > 0 {
                continue;
            }
        }
        let named = follow_leader(&inner, &q).await;
        let mut st = q.state.lock();
        if let Some(e) = st.not_hosted.take() {
            if !named {
                // The topic or partition is gone, not moved: later
                // batches cannot follow the failed ones in order.
                st.gave_up = true;
                drop(st);
                return fail_all(&q, e);
            }
        }
        let batches = std::mem::take(&mut st.resend);
        st.resending = false;
        // They go out again now: the owner's time to answer starts.
        st.answered_at = Instant::now();
        for (i, (_, mut b)) in batches.into_iter().enumerate() {
            // Every earlier batch has its answer now: the first resend
            // restarts the sequence, so the partition does not wait for
            // batches a dead leader acknowledged alone (acks=leader).
            if i == 0 {
                b.meta = b.meta.with_restart();
            }
            q.queued.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            if let Err(tokio::sync::mpsc::error::SendError(b)) = q.outbox.send(b) {
                q.queued.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
                st.in_flight -= 1;
                b.slot.complete(Err(Error::Closed("driver")));
            }
        }
        inner.dispatch(&q, &mut st);
        drop(st);
        q.cond.notify_all();
        return;
    }
}

/// Points the partition at the leader the registry names now; false if
/// the registry could not be asked or does not know the partition.
async fn follow_leader(inner: &Inner, q: &PartQueue) -> bool {
    let Ok(info) = inner.topic.refresh().await else {
        return false;
    };
    let Some(p) = info.partitions.get(q.partition as usize) else {
        return false;
    };
    let moved = {
        let mut owner = q.owner.lock();
        let moved = owner.1 != p.addr;
        if moved {
            *owner = (p.member, p.addr.clone());
        }
        moved
    };
    let mut conn = q.conn.lock();
    if moved || conn.as_ref().is_some_and(|c| c.is_dead()) {
        conn.take();
    }
    true
}

/// The producer is gone: every batch waiting for a resend fails.
fn fail_all(q: &PartQueue, e: Error) {
    let mut st = q.state.lock();
    let batches = std::mem::take(&mut st.resend);
    st.resending = false;
    for (_, b) in batches {
        st.in_flight -= 1;
        b.slot.complete(Err(e.shared()));
    }
    drop(st);
    q.cond.notify_all();
}
