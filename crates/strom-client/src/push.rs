//! The producer's public value types: its options, an event's [`Data`],
//! the [`EventId`] it was stored at, and the [`PushFuture`] that resolves
//! to it. Every backend's producer hands these out; they depend on nothing
//! above the batching rules and the completion slot.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;

use crate::batching::Batching;
use crate::error::{Error, Result};
use crate::slot::Slot;

#[derive(Clone, Debug)]
pub struct ProducerOptions {
    /// When batches are sent and how large batches and events may be.
    pub batch: Batching,
    /// Batches per partition sent and not yet acknowledged (at least 1; at
    /// most 64 for an idempotent producer).
    pub max_batches: usize,
    /// Longest a partial `Count`/`Full` batch waits before it is sent.
    pub linger: Duration,
    /// The producer's lease: the driver renews it in the background, and if
    /// the process dies the registry master closes this producer's part of
    /// the stream once the lease runs out (reported as expired). The
    /// default, `Some(Duration::ZERO)`, takes the server's
    /// `producer_lease_ms`; other durations are clamped to 1 s ..= 300 s.
    /// `None` takes no lease: the producer stays open until closed, even
    /// after its process exits (to hand a stream over to others).
    pub lease: Option<Duration>,
    /// When a push to a replicated partition is acknowledged: after every
    /// in-sync replica has it (`All`, the default), or after the leader's
    /// append (`Leader`: faster, and lost if the leader dies before its
    /// followers copied it). Unreplicated partitions ignore it.
    pub acks: Acks,
    /// Idempotence: each batch carries this producer's id and its sequence
    /// number in the partition, so the producer resends batches whose
    /// answer was lost (a dead or deposed leader, a dropped connection) to
    /// the partition's current leader, in order, for up to
    /// [`retry_for`](Self::retry_for), and the partition appends each
    /// batch once. `None` (the default) turns it on for replicated topics.
    pub idempotent: Option<bool>,
    /// How long an idempotent producer keeps resending a batch before its
    /// push fails.
    pub retry_for: Duration,
    /// Longest a partition's owner may leave every batch sent to it
    /// unanswered (Kafka's `request.timeout.ms`): then the connection is
    /// given up, its batches fail as on a lost connection (an idempotent
    /// producer resends them, within [`retry_for`](Self::retry_for)), and
    /// the next batch opens a new one. It also bounds opening that
    /// connection. A `block` memory partition holds appends on purpose
    /// until its readers free room, so its batches wait without this bound.
    pub request_timeout: Duration,
}

/// See [`ProducerOptions::acks`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Acks {
    Leader,
    #[default]
    All,
}

impl Default for ProducerOptions {
    fn default() -> Self {
        ProducerOptions {
            batch: Batching::adaptive(),
            max_batches: 2,
            linger: Duration::from_millis(5),
            lease: Some(Duration::ZERO),
            acks: Acks::All,
            idempotent: None,
            retry_for: Duration::from_secs(30),
            request_timeout: Duration::from_secs(30),
        }
    }
}

/// An event's data part: zero or more segments sent back to back without
/// being copied into one buffer.
#[derive(Clone, Debug, Default)]
pub struct Data(pub Vec<Bytes>);

impl Data {
    pub fn none() -> Self {
        Data(Vec::new())
    }
    pub fn len(&self) -> u64 {
        self.0.iter().map(|b| b.len() as u64).sum()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl From<Bytes> for Data {
    fn from(b: Bytes) -> Self {
        Data(vec![b])
    }
}
impl From<Vec<u8>> for Data {
    fn from(b: Vec<u8>) -> Self {
        Data(vec![Bytes::from(b)])
    }
}
impl From<&'static [u8]> for Data {
    fn from(b: &'static [u8]) -> Self {
        Data(vec![Bytes::from_static(b)])
    }
}
impl From<Vec<Bytes>> for Data {
    fn from(b: Vec<Bytes>) -> Self {
        Data(b)
    }
}
impl From<()> for Data {
    fn from(_: ()) -> Self {
        Data::none()
    }
}

/// Where an acknowledged event was stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId {
    pub partition: u32,
    pub offset: u64,
}

#[derive(Clone, Copy)]
pub(crate) struct BatchAck {
    pub base_offset: u64,
}

/// Resolves to the event's [`EventId`] once its batch is acknowledged.
/// Wait for it with [`wait`](Self::wait), or `.await` it in any executor.
pub struct PushFuture {
    pub(crate) slot: Arc<Slot<BatchAck>>,
    pub(crate) partition: u32,
    pub(crate) index: u32,
}

impl PushFuture {
    /// The future of one event stored alone at the slot's `base_offset`
    /// (the Kafka backend: one delivery report per record).
    #[cfg(feature = "kafka")]
    pub(crate) fn single(slot: Arc<Slot<BatchAck>>, partition: u32) -> Self {
        PushFuture {
            slot,
            partition,
            index: 0,
        }
    }

    pub fn wait(self) -> Result<EventId> {
        self.wait_timeout(None)
    }

    pub fn wait_timeout(&self, timeout: Option<Duration>) -> Result<EventId> {
        match self.slot.wait(timeout) {
            Some(r) => self.id(r),
            None => Err(Error::Timeout(timeout.unwrap_or_default())),
        }
    }

    pub fn is_done(&self) -> bool {
        self.slot.is_done()
    }

    /// The partition the event was routed to (known before it is stored).
    pub fn partition(&self) -> u32 {
        self.partition
    }

    /// Polls through a shared reference (for bindings that both wait on and
    /// await the same future).
    pub fn poll_ref(&self, cx: &mut Context<'_>) -> Poll<Result<EventId>> {
        self.slot.poll(cx).map(|r| self.id(r))
    }

    fn id(&self, r: Result<BatchAck>) -> Result<EventId> {
        r.map(|a| EventId {
            partition: self.partition,
            offset: a.base_offset + self.index as u64,
        })
    }
}

impl std::future::Future for PushFuture {
    type Output = Result<EventId>;
    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.poll_ref(cx)
    }
}
