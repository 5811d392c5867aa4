//! The backend seam: what a [`Driver`]'s topics, producers and consumers
//! ask of the system behind it. Each backend implements these traits once:
//! the native one (Strom servers over the Strom protocol, `native.rs` and
//! the types it hands out) and, with the `kafka` feature, the Kafka one
//! (`kafka/`). The driver holds one `Arc<dyn Backend>`, chosen when it
//! connects (`kafka://` picks Kafka); `Driver`, `Producer`, `Consumer` and
//! `Event` call through these traits and never ask which backend they have.
//!
//! This file names the client's public types (`Driver`, `Topic`,
//! `Consumer`, the option types) because the traits take and return them,
//! and those types hold the traits: they share one import circle. It is
//! the circle of the client's handles themselves (a `Topic` holds its
//! `Driver`, which makes topics; producers and consumers hold their
//! `Topic`), and the backends sit inside it because they build those
//! handles. The layers under it (errors, data buffers, connections,
//! batching, the frame codec) are outside it.

use std::sync::Arc;

use strom_policy::MetadataInput;
use strom_proto::{StartPos, TopicInfo, TopicSpec};

use crate::consumer::{Consumer, ConsumerOptions};
use crate::driver::Driver;
use crate::error::Result;
use crate::group::Membership;
use crate::producer::{Data, ProducerOptions, PushFuture};
use crate::topic::Topic;

/// A driver's backend: topic administration, and the producers and
/// consumers of its topics.
pub(crate) trait Backend: Send + Sync {
    /// The backend's name in [`crate::Error::Unsupported`] (`"native"`,
    /// `"kafka"`).
    fn name(&self) -> &'static str;

    /// Whether requests beyond these traits (the registry master, native
    /// connections) are available: only Strom servers have them.
    fn is_native(&self) -> bool;

    /// Creates a topic (every partition on `member`, or placed by the
    /// backend) and describes it.
    fn create_topic(&self, d: &Driver, spec: TopicSpec, member: Option<u32>) -> Result<TopicInfo>;

    /// The topic's partitions with their first and next offsets.
    fn describe(&self, d: &Driver, name: &str) -> Result<TopicInfo>;

    fn list_topics(&self, d: &Driver) -> Result<Vec<TopicInfo>>;

    fn delete_topic(&self, d: &Driver, name: &str) -> Result<()>;

    /// A producer writing to `topic`.
    fn producer(&self, topic: Topic, opts: ProducerOptions) -> Result<Box<dyn ProducerBackend>>;

    /// A consumer reading `topic` as `name` (a non-empty name), or as a
    /// member of the Strom consumer group `group`.
    fn consumer(
        &self,
        topic: Topic,
        name: &str,
        opts: ConsumerOptions,
        group: Option<Arc<Membership>>,
    ) -> Result<Consumer>;
}

/// What a [`crate::Producer`] does, per backend.
pub(crate) trait ProducerBackend: Send + Sync {
    fn push_with(
        &self,
        metadata: MetadataInput,
        data: Data,
        partition: Option<u32>,
        descriptor: &[u8],
    ) -> Result<PushFuture>;
    fn flush(&self) -> Result<()>;
    fn close(&self) -> Result<()>;
    fn topic(&self) -> &Topic;
    fn id(&self) -> u64;
}

/// A reader that fills a consumer's queue from outside the native
/// partition subscriptions (the Kafka backend's poll loop).
pub(crate) trait Feed: Send + Sync {
    /// Moves the reader to `pos`; `reset` empties the consumer's queue
    /// and returns its new epoch.
    fn reposition(&self, pos: StartPos, reset: &dyn Fn() -> u64) -> Result<()>;
}
