//! The Strom client library.
//!
//! A [`Driver`] connects to a group of servers (or runs one in-process) and
//! hands out [`Topic`]s; a topic makes [`Producer`]s, which batch in the
//! background and return futures, and named [`Consumer`]s, which receive
//! metadata ahead of demand and fetch only the selected part of each
//! event's data into buffers the application provides. Network progress
//! runs on the driver's own threads. Every call routes per partition to the
//! server that owns it. This crate must never depend on the CLI, and on the
//! server only for the optional `embedded` feature (off by default, so a
//! client carries no server unless it asks for one). With the optional
//! `kafka` feature the same API runs on a Kafka cluster
//! (`Driver::connect_addr("kafka://host:port")`, librdkafka inside).

mod ack_when;
mod acks;
#[cfg(feature = "mimalloc")]
pub mod alloc;
mod backend;
mod batching;
mod compress;
mod conn;
mod connect;
mod consumer;
mod consumer_options;
pub mod credentials;
mod data;
mod driver;
mod error;
mod event;
mod fetch;
mod group;
#[cfg(feature = "kafka")]
mod kafka;
mod leader;
mod lease;
mod membership;
mod native;
mod owner;
mod partitioned;
mod pool;
mod producer;
mod push;
mod quota;
mod security;
pub mod select;
mod share;
mod slot;
mod subscription;
mod topic;
pub mod transform;
mod unpack;

pub use batching::{Batching, Trigger};
pub use consumer::{
    default_spin, Consumer, ConsumerOptions, Next, PullFuture, DEFAULT_SPIN, LATENCY_SPIN,
    SPARE_CORES, SPIN_ENV,
};
pub use data::{
    ChunkPart, DataBroker, DataBuffer, DataDescriptor, DataSelector, EventMeta, VecBroker,
};
pub use driver::{Driver, ScrubReport, KAFKA_SCHEME, REQUEST_TIMEOUT};
pub use error::{Error, FrameError, Result};
pub use event::{AckFuture, Event};
pub use group::{ConsumerGroupMode, GroupOptions, RebalanceListener};
pub use pool::{PoolBroker, PooledBuffer};
pub use producer::{Acks, Data, EventId, Producer, ProducerOptions, PushFuture};
pub use strom_net::{MemTransport, Transport, Transports, TLS_CA_ENV};
pub use strom_policy::MetadataInput;
pub use strom_proto::{
    Compression, ConsumerGroupInfo, Durability, ErrorCode, GroupPartitionInfo, MemberInfo,
    Overflow, PartitionInfo, PartitionType, Selection, StartPos, TopicInfo, TopicSpec,
};
/// The embedded server's configuration, for [`Driver::embedded_with`].
#[cfg(feature = "embedded")]
pub use strom_server::ServerConfig;
pub use topic::Topic;
