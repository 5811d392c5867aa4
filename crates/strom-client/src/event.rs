//! Events as a consumer receives them, and what acking one returns.
//!
//! An event's ack goes where its consumer's backend sends it, through
//! [`EventAcks`]: a consumer name's cumulative commits (`acks.rs`), a
//! shared group's one-by-one acks (`share.rs`), or the Kafka group's
//! commits. Each returns an [`AckFuture`] that resolves once the ack is
//! persisted. This file depends on nothing above the data buffers.

use std::ops::Deref;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::data::{DataBuffer, EventMeta};
use crate::error::{Error, Result};

/// One consumed event: metadata, the fetched part of its data, and its ack.
pub struct Event {
    pub(crate) meta: EventMeta,
    /// Size of the whole data part on the server.
    pub(crate) data_size: u64,
    /// Bytes fetched into `buffers` (the selected part).
    pub(crate) fetched: u64,
    pub(crate) buffers: Vec<Box<dyn DataBuffer>>,
    pub(crate) descriptor: bytes::Bytes,
    pub(crate) acks: Arc<dyn EventAcks>,
    /// Deliveries of this event so far, this one included (shared groups;
    /// 1 otherwise).
    pub(crate) deliveries: u32,
    /// The offset after the last event of the stored batch this event
    /// came in (`offset + 1` where batches are not known).
    pub(crate) batch_end: u64,
}

/// An event's ack, without the event.
pub(crate) struct LaterAck {
    acks: Arc<dyn EventAcks>,
    offset: u64,
}

impl LaterAck {
    pub fn ack(&self) -> AckFuture {
        self.acks.clone().ack_event(self.offset)
    }

    pub fn nack(&self) -> AckFuture {
        self.acks.clone().nack_event(self.offset)
    }
}

/// What [`Consumer::pull`](crate::Consumer::pull) gives: an event, or the
/// end of the stream.
pub enum Next {
    Event(Event),
    EndOfStream,
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
        self.acks.clone().nack_event(self.meta.offset)
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

/// Where a consumed event's ack goes: a consumer name's cumulative acks
/// of the partition (`acks.rs`), a shared group's one-by-one acks
/// (`share.rs`), or another backend's commits (the Kafka group's).
pub(crate) trait EventAcks: AckSource {
    /// Acks the event at `offset`.
    fn ack_event(self: Arc<Self>, offset: u64) -> AckFuture;
    /// Gives the event at `offset` back (shared groups; the others refuse).
    fn nack_event(self: Arc<Self>, offset: u64) -> AckFuture;
}

/// The refusal of a nack outside a shared group.
pub(crate) fn nack_refused(src: Arc<dyn AckSource>) -> AckFuture {
    AckFuture::failed(
        src,
        Error::InvalidArgument("nack applies to events of a shared consumer group".into()),
    )
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
