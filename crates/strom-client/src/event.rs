//! Events as a consumer receives them, and acknowledgements.
//!
//! `ack()` records the offset and returns at once; a background task
//! commits the highest acked offset of each partition to the server, one
//! commit in flight at a time, so acks never cost one request per event.
//! The returned [`AckFuture`] resolves once the commit covering it is
//! persisted.

use std::ops::Deref;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use strom_proto::{ErrorCode, Request};

use crate::data::{DataBuffer, EventMeta};
use crate::error::{Error, Result};
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
    pub(crate) acks: Arc<PartitionAcks>,
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

    /// Marks this event (and every earlier one of its partition) consumed
    /// for the consumer's name; persisted on the server in the background.
    pub fn ack(&self) -> AckFuture {
        self.acks.ack(self.meta.offset + 1)
    }
}

struct AckState {
    wanted: u64,
    committed: u64,
    in_flight: bool,
    error: Option<(ErrorCode, String)>,
    wakers: Vec<Waker>,
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
    owner: Arc<Mutex<Owner>>,
    state: Mutex<AckState>,
    cond: Condvar,
}

impl PartitionAcks {
    pub fn new(topic: &Topic, partition: u32, name: String, owner: Arc<Mutex<Owner>>) -> Arc<Self> {
        Arc::new(PartitionAcks {
            topic: topic.clone(),
            partition,
            name,
            owner,
            state: Mutex::new(AckState {
                wanted: 0,
                committed: 0,
                in_flight: false,
                error: None,
                wakers: Vec::new(),
            }),
            cond: Condvar::new(),
        })
    }

    fn ack(self: &Arc<Self>, next: u64) -> AckFuture {
        let mut st = self.state.lock();
        st.wanted = st.wanted.max(next);
        if !st.in_flight && st.committed < st.wanted {
            st.in_flight = true;
            self.topic
                .driver
                .inner
                .handle
                .spawn(self.clone().commit_loop());
        }
        AckFuture {
            acks: self.clone(),
            offset: next,
        }
    }

    async fn commit_loop(self: Arc<Self>) {
        loop {
            let target = {
                let mut st = self.state.lock();
                if st.committed >= st.wanted {
                    st.in_flight = false;
                    return;
                }
                st.wanted
            };
            let req = Request::Commit {
                topic: self.topic.name().to_string(),
                partition: self.partition,
                consumer: self.name.clone(),
                offset: target,
            };
            let addr = self.owner.lock().addr.clone();
            let r = match self.topic.driver.conn(&addr).await {
                Ok(conn) => conn.call(&req, Vec::new()).await,
                Err(e) => Err(e),
            };
            let mut st = self.state.lock();
            match r {
                Ok(_) => st.committed = st.committed.max(target),
                Err(e) => {
                    st.error = Some((e.code(), e.to_string()));
                    st.in_flight = false;
                }
            }
            let wakers = std::mem::take(&mut st.wakers);
            let failed = st.error.is_some();
            drop(st);
            self.cond.notify_all();
            wakers.into_iter().for_each(Waker::wake);
            if failed {
                return;
            }
        }
    }

    fn check(&self, st: &mut AckState, offset: u64) -> Option<Result<()>> {
        if st.committed >= offset {
            return Some(Ok(()));
        }
        st.error
            .take()
            .map(|(code, msg)| Err(Error::coded(code, format!("ack failed: {msg}"))))
    }
}

/// Resolves once the ack is persisted on the server.
pub struct AckFuture {
    acks: Arc<PartitionAcks>,
    offset: u64,
}

impl AckFuture {
    pub fn wait(self) -> Result<()> {
        self.wait_timeout(None)
    }

    pub fn wait_timeout(&self, timeout: Option<Duration>) -> Result<()> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut st = self.acks.state.lock();
        loop {
            if let Some(r) = self.acks.check(&mut st, self.offset) {
                return r;
            }
            match deadline {
                None => self.acks.cond.wait(&mut st),
                Some(d) => {
                    if self.acks.cond.wait_until(&mut st, d).timed_out() {
                        return Err(Error::Timeout(timeout.unwrap_or_default()));
                    }
                }
            }
        }
    }
}

impl std::future::Future for AckFuture {
    type Output = Result<()>;
    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        self.poll_ref(cx)
    }
}

impl AckFuture {
    /// Polls through a shared reference (for bindings).
    pub fn poll_ref(&self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let mut st = self.acks.state.lock();
        match self.acks.check(&mut st, self.offset) {
            Some(r) => Poll::Ready(r),
            None => {
                st.wakers.push(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}
