//! The Strom server: one process of a group.
//!
//! It owns the topic registry (when it is the master), one partition manager
//! per partition it holds, request dispatch for every connection, and the
//! group file. It talks to storage only through `strom-storage`'s
//! `PartitionLog` trait and to the network only through `strom-net`; it must
//! never depend on the client or CLI crates.

mod accept_errors;
pub mod audit;
mod batch;
mod config;
mod error;
mod fd_budget;
mod fence;
mod group;
pub mod health;
mod host;
mod hosted_groups;
mod launch;
pub mod member_auth;
mod member_id;
mod members;
mod meta_net;
mod names;
mod native;
mod ownership;
mod partition;
mod peers;
mod producers;
mod quorum_boot;
pub mod quota;
mod registry;
mod replica;
mod security_sync;
mod server;
mod service;
mod share;
mod sink;
pub mod stats;

pub use accept_errors::AcceptErrors;
pub use config::{local_only, ConfigError, ServerConfig};
pub use error::ServerError;
pub use group::{read_group_file, write_group_file};
pub use launch::{rank_from_env, rendezvous_file};
pub use meta_net::{MetaEndpoint, PeerMetaNet};
pub use server::{Server, ServerHandle};
pub use service::access::now_secs;
/// TLS for front ends that terminate it themselves (the Kafka listener):
/// the acceptor's library and a client certificate's subject.
pub mod tls {
    pub use strom_net::{client_config, client_config_from_env, client_subject, tokio_rustls};
}
pub use service::{CheckError, Invalid, Services, Validation};
// What other front ends (strom-kafka) need to produce into and read from
// hosted partitions through `Services`: the checked batch, the partition
// manager the data service hands out, and the sinks a long poll parks.
pub use batch::ValidBatch;
pub use partition::{AppendReply, PartitionManager};
pub use producers::{kafka_stamp, KAFKA_MAX_PRODUCER_ID};
pub use sink::{BatchSink, Waiters};
// The stored batches a front end reads, and what an append reports.
pub use strom_net::Transports;
pub use strom_storage::{Appended, StoredBatch};
