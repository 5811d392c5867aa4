//! The consumer: named, over some or all partitions of a topic, or a
//! member of a consumer group. This file is the public face: `Consumer`,
//! which calls its backend's consumer through `ConsumerBackend`, the
//! topic's factories for it, and `PullFuture`. The consumer every backend
//! builds is `queue.rs` over the state in `state.rs`; its options are
//! `consumer_options.rs` (a leaf outside this folder, which the backend
//! seam names too).
//!
//! Events are queued once their selected data landed in the broker's
//! buffers. A partition whose server is unreachable reports one error and
//! keeps retrying, while the other partitions carry on.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use strom_proto::StartPos;

use crate::backend::ConsumerBackend;
use crate::error::{Error, Result};
use crate::event::Event;
pub use crate::event::Next;
use crate::membership::Membership;
use crate::topic::Topic;

pub(crate) mod queue;
pub(crate) mod state;

pub use crate::consumer_options::{
    default_spin, ConsumerOptions, DEFAULT_SPIN, LATENCY_SPIN, SPARE_CORES, SPIN_ENV,
};

/// Reads a topic as a named consumer or a group member: `pull`,
/// `pull_many`, iteration, `process`, `seek`.
pub struct Consumer(Box<dyn ConsumerBackend>);

impl Topic {
    /// A consumer named `name` over every partition, resuming after the
    /// name's last ack, fetching every event's whole data part.
    pub fn consumer(&self, name: &str) -> Result<Consumer> {
        Consumer::new(self.clone(), name, ConsumerOptions::default())
    }

    pub fn consumer_with(&self, name: &str, options: ConsumerOptions) -> Result<Consumer> {
        Consumer::new(self.clone(), name, options)
    }
}

impl Consumer {
    pub(crate) fn new(topic: Topic, name: &str, opts: ConsumerOptions) -> Result<Consumer> {
        Self::with_group(topic, name, opts, None)
    }

    /// A consumer reading as `name`, or as a member of `group` (then `name`
    /// is the group's name).
    pub(crate) fn with_group(
        topic: Topic,
        name: &str,
        opts: ConsumerOptions,
        group: Option<Arc<Membership>>,
    ) -> Result<Consumer> {
        if name.is_empty() {
            return Err(Error::InvalidArgument(
                "a consumer needs a non-empty name".into(),
            ));
        }
        let backend = topic.driver.inner.backend.clone();
        Ok(Consumer(backend.consumer(topic, name, opts, group)?))
    }

    pub fn name(&self) -> &str {
        self.0.name()
    }

    /// The consumer group this consumer is a member of, if any.
    pub fn group(&self) -> Option<&str> {
        self.0.group()
    }

    /// The partitions this consumer reads: in a partitioned group, those
    /// assigned to it now; otherwise every partition it subscribed.
    pub fn assignment(&self) -> Vec<u32> {
        self.0.assignment()
    }

    /// The member id this consumer holds in its consumer group.
    pub fn member_id(&self) -> Option<u64> {
        self.0.member_id()
    }

    pub fn topic(&self) -> &Topic {
        self.0.topic()
    }

    /// Waits for the next event or the end of the stream.
    pub fn pull(&self) -> PullFuture<'_> {
        PullFuture { consumer: self }
    }

    /// Like `pull().wait()` with a time limit.
    pub fn pull_timeout(&self, timeout: Duration) -> Result<Next> {
        self.0
            .next_blocking(Some(Instant::now() + timeout))
            .unwrap_or(Err(Error::Timeout(timeout)))
    }

    /// Takes every event that has arrived, up to `max`, in one call: waits
    /// up to `timeout` for the first one, never for more. `Ok(None)` at the
    /// end of the stream (after every event was returned); an empty batch
    /// when `timeout` passed with nothing to take. An error is returned on
    /// its own, after the events queued before it.
    pub fn pull_many(&self, max: usize, timeout: Duration) -> Result<Option<Vec<Event>>> {
        self.0.pull_many(max, timeout)
    }

    /// Moves every partition to `pos` (offset, timestamp, beginning, end,
    /// or back to the committed offsets). Queued events are dropped.
    pub fn seek(&self, pos: StartPos) -> Result<()> {
        self.0.seek(pos)
    }

    /// Runs the MPI-stream style loop: `on_start` once, `on_event` for every
    /// event until the end of the stream, then `on_end` once.
    pub fn process(
        &self,
        on_start: impl FnOnce(),
        mut on_event: impl FnMut(Event) -> Result<()>,
        on_end: impl FnOnce(),
    ) -> Result<()> {
        on_start();
        while let Next::Event(e) = self.pull().wait()? {
            on_event(e)?;
        }
        on_end();
        Ok(())
    }
}

impl Iterator for &Consumer {
    type Item = Result<Event>;
    fn next(&mut self) -> Option<Result<Event>> {
        match self.pull().wait() {
            Ok(Next::Event(e)) => Some(Ok(e)),
            Ok(Next::EndOfStream) => None,
            Err(e) => Some(Err(e)),
        }
    }
}

/// Resolves to the next event or end of stream; `.wait()` or `.await`.
pub struct PullFuture<'a> {
    consumer: &'a Consumer,
}

impl PullFuture<'_> {
    pub fn wait(self) -> Result<Next> {
        self.consumer
            .0
            .next_blocking(None)
            .unwrap_or(Err(Error::Closed("consumer")))
    }
}

impl std::future::Future for PullFuture<'_> {
    type Output = Result<Next>;
    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<Next>> {
        self.consumer.0.poll_next(cx)
    }
}
