//! The backend seam: what a [`Driver`]'s topics, producers and consumers
//! ask of the system behind it. Each backend implements these traits once:
//! the native one (Strom servers over the Strom protocol, `native.rs` and
//! the types it hands out) and, with the `kafka` feature, the Kafka one
//! (`kafka/`). The driver holds one `Arc<dyn Backend>`, chosen when it
//! connects (`kafka://` picks Kafka); `Driver`, `Producer`, `Consumer` and
//! `Event` call through these traits and never ask which backend they have.
//!
//! These traits name only the handles (`Driver`, `Topic`, a group's
//! `Membership`) and value types (options, `Data`, `PushFuture`, `Event`,
//! `Next`), so the handles and this seam form the client's one small
//! import circle: a `Topic` holds its `Driver`, the `Driver` holds its
//! backend (and the leases it renews, `lease.rs`), and the backend's
//! factories take a `Topic` and a `Membership` (which holds its `Topic`).
//! Everything a backend builds (producers, consumers, their queues and
//! subscriptions) sits above that circle and is reached through these
//! traits only.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use strom_policy::MetadataInput;
use strom_proto::{StartPos, TopicInfo, TopicSpec};

use crate::consumer_options::ConsumerOptions;
use crate::driver::Driver;
use crate::error::Result;
use crate::event::{Event, Next};
use crate::membership::Membership;
use crate::push::{Data, ProducerOptions, PushFuture};
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
    ) -> Result<Box<dyn ConsumerBackend>>;
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

/// What a [`crate::Consumer`] does, per backend.
pub(crate) trait ConsumerBackend: Send + Sync {
    fn name(&self) -> &str;
    fn group(&self) -> Option<&str>;
    fn assignment(&self) -> Vec<u32>;
    fn member_id(&self) -> Option<u64>;
    fn topic(&self) -> &Topic;
    /// The next event or the end, waiting until `deadline` (forever with
    /// `None`); `None` if it passed first.
    fn next_blocking(&self, deadline: Option<Instant>) -> Option<Result<Next>>;
    /// The next event or the end if one is queued; registers the waker
    /// otherwise.
    fn poll_next(&self, cx: &mut Context<'_>) -> Poll<Result<Next>>;
    fn pull_many(&self, max: usize, timeout: Duration) -> Result<Option<Vec<Event>>>;
    fn seek(&self, pos: StartPos) -> Result<()>;
}
