//! A consumer name's acks of one partition: `ack()` records the offset
//! and returns at once; a background task commits the highest acked
//! offset to the partition's owner, one commit in flight at a time, so
//! acks never cost one request per event. The [`AckFuture`] resolves once
//! the commit covering it is persisted. `AckState` and `settle` are the
//! bookkeeping every cumulative kind of acks shares (the Kafka backend's
//! too).

use std::sync::Arc;
use std::task::Waker;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use strom_proto::{ErrorCode, Request};

use crate::error::{Error, Result};
use crate::event::{nack_refused, poll_settled, wait_settled, AckFuture, AckSource, EventAcks};
use crate::topic::{Owner, Topic};

/// Commit bookkeeping shared by every kind of partition acks: the highest
/// offset asked for, the highest committed, one commit in flight at a
/// time, the first failure, and who waits.
#[derive(Default)]
pub(crate) struct AckState {
    wanted: u64,
    committed: u64,
    in_flight: bool,
    error: Option<(ErrorCode, String)>,
    wakers: Vec<Waker>,
}

impl AckState {
    /// Asks for everything below `next` to be committed; true if the
    /// caller must start the commit loop (none is running).
    pub fn want(&mut self, next: u64) -> bool {
        self.wanted = self.wanted.max(next);
        if !self.in_flight && self.committed < self.wanted {
            self.in_flight = true;
            return true;
        }
        false
    }

    /// The offset the commit loop commits next, or `None` (the loop ends)
    /// once everything wanted is committed.
    pub fn next_target(&mut self) -> Option<u64> {
        if self.committed >= self.wanted {
            self.in_flight = false;
            return None;
        }
        Some(self.wanted)
    }

    /// The outcome for a waiter on `offset`, once there is one.
    pub fn check(&mut self, offset: u64) -> Option<Result<()>> {
        if self.committed >= offset {
            return Some(Ok(()));
        }
        self.error
            .take()
            .map(|(code, msg)| Err(Error::coded(code, format!("ack failed: {msg}"))))
    }

    pub fn wakers(&mut self) -> &mut Vec<Waker> {
        &mut self.wakers
    }
}

/// Records the outcome of committing `target` and wakes every waiter;
/// false if it failed (the commit loop stops; the next ack starts it
/// again). A commit that works supersedes an earlier failure nobody
/// waited for: everything below `target` is committed now.
pub(crate) fn settle(
    state: &Mutex<AckState>,
    cond: &Condvar,
    target: u64,
    outcome: std::result::Result<(), (ErrorCode, String)>,
) -> bool {
    let mut st = state.lock();
    let ok = outcome.is_ok();
    match outcome {
        Ok(()) => {
            st.committed = st.committed.max(target);
            st.error = None;
        }
        Err(e) => {
            st.error = Some(e);
            st.in_flight = false;
        }
    }
    let wakers = std::mem::take(&mut st.wakers);
    drop(st);
    cond.notify_all();
    wakers.into_iter().for_each(Waker::wake);
    ok
}

/// Commit bookkeeping of one partition for one consumer name.
pub(crate) struct PartitionAcks {
    topic: Topic,
    partition: u32,
    name: String,
    /// A partitioned group's holder `(consumer, epoch)`: commits go as
    /// `GroupCommit`, and the owner refuses them once another holds it.
    fence: Option<(u64, u64)>,
    owner: Arc<Mutex<Owner>>,
    state: Mutex<AckState>,
    cond: Condvar,
}

impl PartitionAcks {
    pub fn new(topic: &Topic, partition: u32, name: String, owner: Arc<Mutex<Owner>>) -> Arc<Self> {
        Self::fenced(topic, partition, name, owner, None)
    }

    /// Acks of a partition held in a partitioned group under `fence`.
    pub fn fenced(
        topic: &Topic,
        partition: u32,
        name: String,
        owner: Arc<Mutex<Owner>>,
        fence: Option<(u64, u64)>,
    ) -> Arc<Self> {
        Arc::new(PartitionAcks {
            topic: topic.clone(),
            partition,
            name,
            fence,
            owner,
            state: Mutex::new(AckState::default()),
            cond: Condvar::new(),
        })
    }

    fn ack(self: &Arc<Self>, next: u64) -> AckFuture {
        if self.state.lock().want(next) {
            self.topic
                .driver
                .inner
                .handle
                .spawn(self.clone().commit_loop());
        }
        AckFuture::new(self.clone(), next)
    }

    async fn commit_loop(self: Arc<Self>) {
        loop {
            let Some(target) = self.state.lock().next_target() else {
                return;
            };
            let topic = self.topic.name().to_string();
            let req = match self.fence {
                Some((consumer, epoch)) => Request::GroupCommit {
                    topic,
                    partition: self.partition,
                    group: self.name.clone(),
                    consumer,
                    epoch,
                    offset: target,
                },
                None => Request::Commit {
                    topic,
                    partition: self.partition,
                    consumer: self.name.clone(),
                    offset: target,
                },
            };
            let addr = self.owner.lock().addr.clone();
            let r = match self.topic.driver.conn(&addr).await {
                Ok(conn) => conn.call(&req, Vec::new()).await,
                Err(e) => Err(e),
            };
            let outcome = r.map(|_| ()).map_err(|e| (e.code(), e.to_string()));
            if !settle(&self.state, &self.cond, target, outcome) {
                return;
            }
        }
    }

    /// Everything below `offset` is committed already (where a group's
    /// subscription started: the group's committed offset).
    pub fn committed_from(&self, offset: u64) {
        let mut st = self.state.lock();
        st.committed = st.committed.max(offset);
    }

    /// The highest offset known committed.
    pub fn committed(&self) -> u64 {
        self.state.lock().committed
    }

    /// Waits until no commit is in flight (or `limit` passed).
    pub async fn settle(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while self.state.lock().in_flight && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

impl AckSource for PartitionAcks {
    fn poll_ticket(&self, t: u64, waker: Option<&Waker>) -> Option<Result<()>> {
        poll_settled(&self.state, waker, |st| st.check(t), AckState::wakers)
    }

    fn wait_ticket(&self, t: u64, deadline: Option<Instant>) -> Option<Result<()>> {
        wait_settled(&self.state, &self.cond, deadline, |st| st.check(t))
    }
}

impl EventAcks for PartitionAcks {
    fn ack_event(self: Arc<Self>, offset: u64) -> AckFuture {
        self.ack(offset + 1)
    }

    fn nack_event(self: Arc<Self>, _offset: u64) -> AckFuture {
        nack_refused(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One round of a commit loop, as `commit_loop` runs it: true while
    /// the loop goes on.
    fn commit(st: &Mutex<AckState>, cond: &Condvar, ok: bool) -> bool {
        let target = st.lock().next_target().expect("a commit to make");
        let outcome = if ok {
            Ok(())
        } else {
            Err((ErrorCode::NOT_PARTITION_LEADER, "moved away".to_string()))
        };
        settle(st, cond, target, outcome)
    }

    /// A commit that failed (the partition moved), whose error nobody
    /// waited for, must not stop every later commit: a consumer that never
    /// waits on its acks (`strom consume`) kept reading after a move, but
    /// its committed offset stayed where the failure left it.
    #[test]
    fn a_failed_commit_nobody_waited_for_does_not_stop_later_commits() {
        let (st, cond) = (Mutex::new(AckState::default()), Condvar::new());
        assert!(st.lock().want(5), "the first ack starts the commit loop");
        assert!(!commit(&st, &cond, false), "the failure ends the loop");
        assert!(st.lock().want(9), "the next ack starts it again");
        assert!(commit(&st, &cond, true), "a commit that worked goes on");
        assert_eq!(st.lock().next_target(), None, "everything is committed");
        assert!(st.lock().want(12), "and later acks start it again");
        assert!(commit(&st, &cond, true));
        assert_eq!(st.lock().committed, 12);
        assert!(matches!(st.lock().check(12), Some(Ok(()))));
    }
}
