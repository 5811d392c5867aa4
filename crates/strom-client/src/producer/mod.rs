//! The producer: validates, routes and serializes each event on the caller's
//! thread, accumulates per-partition batches, and sends them from the
//! background runtime with at most `max_batches` in flight per partition.
//! Past that, `push` blocks (backpressure) instead of growing memory.
//!
//! Batching and size limits are one type, [`Batching`] (see `batching.rs`):
//! `Count(n)` and `Full` send a batch when it is full (or after `linger`);
//! `Adaptive` sends whatever is ready as soon as an in-flight slot frees
//! up, so batches grow with load and latency stays low when idle.
//!
//! This file holds the public face (options, `Data`, `EventId`,
//! `PushFuture`, and `Producer`, which calls its backend through
//! `ProducerBackend`); the native producer is `native.rs`, its partition
//! refreshes `refresh.rs` and its idempotent resends `retry.rs`.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use strom_policy::MetadataInput;

use crate::backend::ProducerBackend;
use crate::batching::Batching;
use crate::error::{Error, Result};
use crate::slot::Slot;
use crate::topic::Topic;

mod native;
mod refresh;
pub(crate) mod retry;

pub(crate) use native::NativeProducer;

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
    pub(super) slot: Arc<Slot<BatchAck>>,
    pub(super) partition: u32,
    pub(super) index: u32,
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

pub struct Producer(Box<dyn ProducerBackend>);

impl Producer {
    pub(crate) fn new(topic: Topic, opts: ProducerOptions) -> Result<Producer> {
        let backend = topic.driver.inner.backend.clone();
        Ok(Producer(backend.producer(topic, opts)?))
    }

    /// Queues an event; returns at once unless the partition's in-flight
    /// limit is reached (backpressure).
    pub fn push(
        &self,
        metadata: impl Into<MetadataInput>,
        data: impl Into<Data>,
    ) -> Result<PushFuture> {
        self.push_with(metadata, data, None, &[])
    }

    /// [`push`](Self::push) with an explicit partition and a data descriptor.
    pub fn push_with(
        &self,
        metadata: impl Into<MetadataInput>,
        data: impl Into<Data>,
        partition: Option<u32>,
        descriptor: &[u8],
    ) -> Result<PushFuture> {
        self.0
            .push_with(metadata.into(), data.into(), partition, descriptor)
    }

    /// Sends every pending event and waits until all are acknowledged.
    /// Returns the first error any batch met since the last flush.
    pub fn flush(&self) -> Result<()> {
        self.0.flush()
    }

    /// Flushes, then ends this producer's contribution to the stream. When
    /// every producer of the topic has closed, consumers see end-of-stream.
    pub fn close(&self) -> Result<()> {
        self.0.close()
    }

    pub fn topic(&self) -> &Topic {
        self.0.topic()
    }

    /// This producer's id in the topic's registry (see [`Topic::close_producer`]).
    pub fn id(&self) -> u64 {
        self.0.id()
    }
}
