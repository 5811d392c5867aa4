//! Acks of a shared consumer group's events, one partition: each event is
//! acked (or nacked) on its own, out of order. `ack()` queues the offset,
//! merged into ranges, and returns at once; one `GroupAck` per partition is
//! in flight at a time, carrying everything queued meanwhile (adaptive: no
//! linger, no request per event). An [`AckFuture`] resolves when the
//! request that carried its ack was answered, i.e. when the owner made it
//! durable.
//!
//! If the owner is unreachable, or restarted and has not seen this group's
//! stream yet, the ranges go back in the queue and are sent again (to the
//! owner's new address if it moved) for up to [`RETRY_FOR`].

use std::sync::Arc;
use std::task::Waker;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use strom_proto::{ErrorCode, Request, Response};

use crate::error::{Error, Result};
use crate::event::{poll_settled, wait_settled, AckFuture, AckSource, EventAcks};
use crate::topic::{Owner, Topic};

/// How long acks are retried while the owner is away.
pub(crate) const RETRY_FOR: Duration = Duration::from_secs(120);
const RETRY_EVERY: Duration = Duration::from_millis(250);

#[derive(Default)]
struct State {
    acks: Vec<(u64, u32)>,
    nacks: Vec<(u64, u32)>,
    /// The ticket of the latest ack or nack queued.
    queued: u64,
    /// Every ticket up to this one is settled.
    done: u64,
    in_flight: bool,
    /// Ticket ranges `[from, upto]` that failed, with the error (the
    /// latest few).
    errors: Vec<(u64, u64, ErrorCode, String)>,
    wakers: Vec<Waker>,
}

/// Ack bookkeeping of one partition for one shared group.
pub(crate) struct ShareAcks {
    topic: Topic,
    partition: u32,
    group: String,
    owner: Arc<Mutex<Owner>>,
    state: Mutex<State>,
    /// Shared with the send loop, which drops its own reference to these
    /// acks before it wakes the waiters (see `send_loop`).
    cond: Arc<Condvar>,
}

/// Adds `offset` to a list of `(first, count)` ranges, merging with the
/// last range when adjacent.
fn add(ranges: &mut Vec<(u64, u32)>, offset: u64) {
    match ranges.last_mut() {
        Some((first, count)) if *first + u64::from(*count) == offset && *count < u32::MAX => {
            *count += 1
        }
        _ => ranges.push((offset, 1)),
    }
}

fn retryable(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::CONNECTION_FAILED
            | ErrorCode::CONNECTION_CLOSED
            | ErrorCode::TIMEOUT
            | ErrorCode::CONSUMER_GROUP_NOT_FOUND
            | ErrorCode::PARTITION_UNAVAILABLE
            | ErrorCode::TOPIC_NOT_FOUND
    )
}

impl ShareAcks {
    pub fn new(topic: &Topic, partition: u32, group: &str, owner: Arc<Mutex<Owner>>) -> Arc<Self> {
        Arc::new(ShareAcks {
            topic: topic.clone(),
            partition,
            group: group.to_string(),
            owner,
            state: Mutex::new(State::default()),
            cond: Arc::new(Condvar::new()),
        })
    }

    pub fn ack(self: &Arc<Self>, offset: u64) -> AckFuture {
        self.queue(offset, false)
    }

    pub fn nack(self: &Arc<Self>, offset: u64) -> AckFuture {
        self.queue(offset, true)
    }

    fn queue(self: &Arc<Self>, offset: u64, nack: bool) -> AckFuture {
        let mut st = self.state.lock();
        add(if nack { &mut st.nacks } else { &mut st.acks }, offset);
        st.queued += 1;
        let ticket = st.queued;
        if !st.in_flight {
            st.in_flight = true;
            let me = self.clone();
            self.topic.driver.inner.handle.spawn(me.send_loop());
        }
        AckFuture::new(self.clone(), ticket)
    }

    /// Sends what is queued, one request at a time, until nothing is. The
    /// last round drops this task's reference before it wakes the waiters:
    /// an application that drops everything once its acks are confirmed
    /// then drops the driver itself (and an embedded server stops before
    /// the call returns), not this task later.
    async fn send_loop(self: Arc<Self>) {
        let mut retry_until: Option<Instant> = None;
        let mut me = Some(self);
        while let Some(this) = me.take() {
            let (acks, nacks, upto) = {
                let mut st = this.state.lock();
                if st.acks.is_empty() && st.nacks.is_empty() {
                    st.in_flight = false;
                    return;
                }
                (
                    std::mem::take(&mut st.acks),
                    std::mem::take(&mut st.nacks),
                    st.queued,
                )
            };
            let error = match this.send(acks.clone(), nacks.clone()).await {
                Ok(()) => None,
                Err(e) if retryable(e.code()) => {
                    let until = *retry_until.get_or_insert_with(|| Instant::now() + RETRY_FOR);
                    if Instant::now() < until {
                        this.requeue(acks, nacks);
                        tokio::time::sleep(RETRY_EVERY).await;
                        this.refresh_owner().await;
                        me = Some(this);
                        continue;
                    }
                    Some(e)
                }
                Err(e) => Some(e),
            };
            retry_until = None;
            let (wakers, last) = this.settle(upto, error);
            let cond = this.cond.clone();
            if !last {
                me = Some(this);
            } else {
                drop(this);
            }
            cond.notify_all();
            wakers.into_iter().for_each(Waker::wake);
        }
    }

    /// Puts ranges that could not be sent back in front of the queue.
    fn requeue(&self, mut acks: Vec<(u64, u32)>, mut nacks: Vec<(u64, u32)>) {
        let mut st = self.state.lock();
        acks.append(&mut st.acks);
        nacks.append(&mut st.nacks);
        st.acks = acks;
        st.nacks = nacks;
    }

    async fn send(&self, acks: Vec<(u64, u32)>, nacks: Vec<(u64, u32)>) -> Result<()> {
        let req = Request::GroupAck {
            topic: self.topic.name().to_string(),
            partition: self.partition,
            group: self.group.clone(),
            acks,
            nacks,
        };
        let addr = self.owner.lock().addr.clone();
        let conn = self.topic.driver.conn(&addr).await?;
        match conn.call(&req, Vec::new()).await? {
            Response::Acked { .. } => Ok(()),
            other => Err(crate::error::unexpected(other)),
        }
    }

    async fn refresh_owner(&self) {
        let Ok(info) = self.topic.refresh().await else {
            return;
        };
        if let Some(p) = info.partitions.get(self.partition as usize) {
            let mut o = self.owner.lock();
            o.member = p.member;
            o.addr = p.addr.clone();
        }
    }

    /// Marks every ticket up to `upto` settled; returns the wakers to wake
    /// and whether the queue is empty (then the loop ends: `in_flight` is
    /// cleared under the same lock, so a new ack starts a new loop).
    fn settle(&self, upto: u64, error: Option<Error>) -> (Vec<Waker>, bool) {
        let mut st = self.state.lock();
        if let Some(e) = error {
            tracing::warn!(group = %self.group, partition = self.partition, error = %e, "acks failed");
            if st.errors.len() >= 64 {
                st.errors.remove(0);
            }
            let from = st.done + 1;
            st.errors.push((from, upto, e.code(), e.to_string()));
        }
        st.done = st.done.max(upto);
        let last = st.acks.is_empty() && st.nacks.is_empty();
        if last {
            st.in_flight = false;
        }
        (std::mem::take(&mut st.wakers), last)
    }

    fn check(st: &State, t: u64) -> Option<Result<()>> {
        if st.done < t {
            return None;
        }
        match st
            .errors
            .iter()
            .find(|(from, upto, ..)| (*from..=*upto).contains(&t))
        {
            Some((_, _, code, msg)) => Some(Err(Error::coded(*code, format!("ack failed: {msg}")))),
            None => Some(Ok(())),
        }
    }
}

impl AckSource for ShareAcks {
    fn poll_ticket(&self, t: u64, waker: Option<&Waker>) -> Option<Result<()>> {
        poll_settled(
            &self.state,
            waker,
            |st| Self::check(st, t),
            |st| &mut st.wakers,
        )
    }

    fn wait_ticket(&self, t: u64, deadline: Option<Instant>) -> Option<Result<()>> {
        wait_settled(&self.state, &self.cond, deadline, |st| Self::check(st, t))
    }
}

impl EventAcks for ShareAcks {
    fn ack_event(self: Arc<Self>, offset: u64) -> AckFuture {
        self.ack(offset)
    }

    fn nack_event(self: Arc<Self>, offset: u64) -> AckFuture {
        self.nack(offset)
    }
}

#[cfg(test)]
mod tests {
    use super::add;

    #[test]
    fn adjacent_offsets_merge_into_ranges() {
        let mut r = Vec::new();
        for o in [5, 6, 7, 9, 3, 4] {
            add(&mut r, o);
        }
        assert_eq!(r, vec![(5, 3), (9, 1), (3, 2)]);
    }
}
