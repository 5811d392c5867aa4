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
//! This file holds the public face: `Producer`, which calls its backend
//! through `ProducerBackend`, and the topic's factories for it; the value
//! types it hands out are `crate::push` (a leaf outside this folder, which
//! the backend seam names too). The native producer is `native.rs`
//! over its queues (`state.rs`), its partition refreshes `refresh.rs` and
//! its idempotent resends `retry.rs`.

use strom_policy::MetadataInput;

use crate::backend::ProducerBackend;
use crate::error::Result;
use crate::topic::Topic;

mod native;

mod refresh;
pub(crate) mod retry;
mod state;

pub use crate::push::{Acks, Data, EventId, ProducerOptions, PushFuture};
pub(crate) use native::NativeProducer;

pub struct Producer(Box<dyn ProducerBackend>);

impl Topic {
    pub fn producer(&self) -> Result<Producer> {
        Producer::new(self.clone(), ProducerOptions::default())
    }

    pub fn producer_with(&self, options: ProducerOptions) -> Result<Producer> {
        Producer::new(self.clone(), options)
    }
}

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
