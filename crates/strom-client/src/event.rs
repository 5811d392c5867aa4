//! Events as a consumer receives them, and acknowledgements.
//!
//! `ack()` records the offset and returns at once; a background task
//! commits the highest acked offset of each partition to the server, one
//! commit in flight at a time, so acks never cost one request per event.
//! The returned [`AckFuture`] resolves once the commit covering it is
//! persisted. Events of a shared consumer group are acked one by one
//! instead (`share.rs`), with the same future.

use std::ops::Deref;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use strom_proto::{ErrorCode, Request};

use crate::data::{DataBuffer, EventMeta};
use crate::error::{Error, Result};
use crate::share::ShareAcks;
use crate::topic::Topic;

/// One consumed event: metadata, the fetched part of its data, and its ack.
pub struct Event {
    pub(crate) meta: EventMeta,
    /// Size of the whole data part on the server.
    pub(crate) data_size: u64,
    /// Bytes fetched into `buffers` (the selected part).
    pub(crate) fetched: u64,
    pub(crate) buffers: Vec<Box<dyn DataBuffer>>,
    pub(crate) descriptor: bytes::Bytes,
    pub(crate) acks: AckTarget,
    /// Deliveries of this event so far, this one included (shared groups;
    /// 1 otherwise).
    pub(crate) deliveries: u32,
    /// The offset after the last event of the stored batch this event
    /// came in (`offset + 1` where batches are not known).
    pub(crate) batch_end: u64,
}

/// An event's ack, without the event.
pub(crate) struct LaterAck {
    acks: AckTarget,
    offset: u64,
}

impl LaterAck {
    pub fn ack(&self) -> AckFuture {
        match &self.acks {
            AckTarget::Offsets(a) => a.ack(self.offset + 1),
            AckTarget::Share(s) => s.ack(self.offset),
            AckTarget::Committed(c) => c.clone().ack(self.offset + 1),
        }
    }
}

/// Where an event's ack goes.
#[derive(Clone)]
pub(crate) enum AckTarget {
    /// Cumulative: the partition's committed offset of a consumer name.
    Offsets(Arc<PartitionAcks>),
    /// One by one: a shared group's acks of the partition.
    Share(Arc<ShareAcks>),
    /// Cumulative: offsets another backend commits (the Kafka group's
    /// committed offset of the partition).
    #[cfg_attr(not(feature = "kafka"), allow(dead_code))]
    Committed(Arc<dyn CommitAcks>),
}

impl Deref for Event {
    type Target = EventMeta;
    fn deref(&self) -> &EventMeta {
        &self.meta
    }
}

impl Event {
    /// The fetched bytes when they landed in a single buffer (the default broker).
    pub fn data(&self) -> &[u8] {
        match self.buffers.as_slice() {
            [] => &[],
            [one] => &one.as_slice()[..self.fetched as usize],
            _ => &[],
        }
    }

    /// The destination buffers the broker provided, filled in order.
    pub fn buffers(&self) -> &[Box<dyn DataBuffer>] {
        &self.buffers
    }

    pub fn take_buffers(&mut self) -> Vec<Box<dyn DataBuffer>> {
        std::mem::take(&mut self.buffers)
    }

    /// The fetched bytes, concatenated (copies if there are several buffers).
    pub fn data_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.fetched as usize);
        let mut left = self.fetched as usize;
        for b in &self.buffers {
            let n = left.min(b.as_slice().len());
            out.extend_from_slice(&b.as_slice()[..n]);
            left -= n;
        }
        out
    }

    pub fn data_size(&self) -> u64 {
        self.data_size
    }

    pub fn fetched_len(&self) -> u64 {
        self.fetched
    }

    pub fn descriptor(&self) -> &bytes::Bytes {
        &self.descriptor
    }

    pub fn meta(&self) -> &EventMeta {
        &self.meta
    }

    /// The offset after the last event of the stored batch this event came
    /// in: the batch boundaries the producer made, the same on every read
    /// and every copy (`offset + 1` on shared groups and Kafka). Transforms
    /// (`crate::transform`) follow them to write exactly once.
    pub fn batch_end(&self) -> u64 {
        self.batch_end
    }

    /// What [`ack`](Self::ack) does, kept to run after the event itself
    /// was handed on (transforms ack a source batch once its output is in).
    pub(crate) fn ack_later(&self) -> LaterAck {
        LaterAck {
            acks: self.acks.clone(),
            offset: self.meta.offset,
        }
    }

    /// Marks this event consumed; persisted on the server in the
    /// background. For a named consumer this covers every earlier event of
    /// its partition too; in a shared group it covers this event alone.
    pub fn ack(&self) -> AckFuture {
        self.ack_later().ack()
    }

    /// Shared groups: gives the event back, to be delivered again (to any
    /// member) now rather than after its visibility timeout. It counts as
    /// a delivery. `INVALID_ARGUMENT` for other consumers.
    pub fn nack(&self) -> AckFuture {
        match &self.acks {
            AckTarget::Share(s) => s.nack(self.meta.offset),
            AckTarget::Offsets(a) => AckFuture::failed(
                a.clone(),
                Error::InvalidArgument("nack applies to events of a shared consumer group".into()),
            ),
            AckTarget::Committed(c) => AckFuture::failed(
                c.clone(),
                Error::InvalidArgument("nack applies to events of a shared consumer group".into()),
            ),
        }
    }

    /// How many times this event was delivered, this time included: above
    /// 1 when a shared group delivers it again (its member died, did not
    /// ack in time, or gave it back). Always 1 for other consumers.
    pub fn deliveries(&self) -> u32 {
        self.deliveries
    }
}

/// Something whose acks resolve by ticket: `Some(result)` once ticket
/// `t` is settled.
pub(crate) trait AckSource: Send + Sync {
    /// Checks ticket `t`; registers `waker` if it is not settled yet.
    fn poll_ticket(&self, t: u64, waker: Option<&Waker>) -> Option<Result<()>>;
    /// Waits for ticket `t` until `deadline`; `None` on timeout.
    fn wait_ticket(&self, t: u64, deadline: Option<Instant>) -> Option<Result<()>>;
}

impl AckSource for PartitionAcks {
    fn poll_ticket(&self, t: u64, waker: Option<&Waker>) -> Option<Result<()>> {
        poll_settled(&self.state, waker, |st| st.check(t), AckState::wakers)
    }

    fn wait_ticket(&self, t: u64, deadline: Option<Instant>) -> Option<Result<()>> {
        wait_settled(&self.state, &self.cond, deadline, |st| st.check(t))
    }
}

/// Cumulative acks of one partition kept by a backend other than the
/// native consumer names (the Kafka group's committed offsets).
pub(crate) trait CommitAcks: AckSource {
    /// Asks for everything below `next` to be committed.
    fn ack(self: Arc<Self>, next: u64) -> AckFuture;
}

/// Runs `check` under the lock; if nothing is settled yet, registers
/// `waker` in the list `wakers` picks out of the state.
pub(crate) fn poll_settled<T>(
    state: &Mutex<T>,
    waker: Option<&Waker>,
    check: impl FnOnce(&mut T) -> Option<Result<()>>,
    wakers: impl FnOnce(&mut T) -> &mut Vec<Waker>,
) -> Option<Result<()>> {
    let mut st = state.lock();
    let r = check(&mut st);
    if let (None, Some(w)) = (&r, waker) {
        wakers(&mut st).push(w.clone());
    }
    r
}

/// Waits on `cond` until `check` settles, or `deadline` passes (`None`).
pub(crate) fn wait_settled<T>(
    state: &Mutex<T>,
    cond: &Condvar,
    deadline: Option<Instant>,
    mut check: impl FnMut(&mut T) -> Option<Result<()>>,
) -> Option<Result<()>> {
    let mut st = state.lock();
    loop {
        if let Some(r) = check(&mut st) {
            return Some(r);
        }
        match deadline {
            None => cond.wait(&mut st),
            Some(d) => {
                if cond.wait_until(&mut st, d).timed_out() {
                    return None;
                }
            }
        }
    }
}

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
/// false if it failed (the commit loop stops).
pub(crate) fn settle(
    state: &Mutex<AckState>,
    cond: &Condvar,
    target: u64,
    outcome: std::result::Result<(), (ErrorCode, String)>,
) -> bool {
    let mut st = state.lock();
    match outcome {
        Ok(()) => st.committed = st.committed.max(target),
        Err(e) => {
            st.error = Some(e);
            st.in_flight = false;
        }
    }
    let wakers = std::mem::take(&mut st.wakers);
    let ok = st.error.is_none();
    drop(st);
    cond.notify_all();
    wakers.into_iter().for_each(Waker::wake);
    ok
}

/// The member owning a partition and its address; follows restarts.
pub(crate) struct Owner {
    pub member: u32,
    pub addr: String,
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

/// Resolves once the ack is persisted on the server.
pub struct AckFuture {
    src: Arc<dyn AckSource>,
    ticket: u64,
    /// Settled before it was ever polled (a refused nack).
    failed: Mutex<Option<Error>>,
}

impl AckFuture {
    pub(crate) fn new(src: Arc<dyn AckSource>, ticket: u64) -> Self {
        AckFuture {
            src,
            ticket,
            failed: Mutex::new(None),
        }
    }

    pub(crate) fn failed(src: Arc<dyn AckSource>, e: Error) -> Self {
        AckFuture {
            src,
            ticket: 0,
            failed: Mutex::new(Some(e)),
        }
    }

    pub fn wait(self) -> Result<()> {
        self.wait_timeout(None)
    }

    pub fn wait_timeout(&self, timeout: Option<Duration>) -> Result<()> {
        if let Some(e) = self.failed.lock().take() {
            return Err(e);
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        self.src
            .wait_ticket(self.ticket, deadline)
            .unwrap_or_else(|| Err(Error::Timeout(timeout.unwrap_or_default())))
    }

    /// Polls through a shared reference (for bindings).
    pub fn poll_ref(&self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        if let Some(e) = self.failed.lock().take() {
            return Poll::Ready(Err(e));
        }
        match self.src.poll_ticket(self.ticket, Some(cx.waker())) {
            Some(r) => Poll::Ready(r),
            None => Poll::Pending,
        }
    }
}

impl std::future::Future for AckFuture {
    type Output = Result<()>;
    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        self.poll_ref(cx)
    }
}
