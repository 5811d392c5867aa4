//! The protocol-neutral service layer: what a server does, as typed async
//! functions over domain values. Front ends (the native protocol in
//! `native/`; later the Kafka front end, the HTTP endpoint and the C API's
//! embedded mode) decode their requests, call these, and encode the
//! answers. Nothing here knows a wire format.
//!
//! - [`DataService`]: produce, subscribe positions, fetch, commit, scrub and
//!   offsets on the partitions this server hosts.
//! - [`ControlService`]: the server's limits and identity, the registry's
//!   operations (topics, producers, the group) on the master, and the
//!   requests the master sends to members about their partitions.
//! - [`Validation`]: produced batches checked against their topic's
//!   validator, for clients that did not validate.
//!
//! Both depend only downward: on the registry, the member link, the host
//! and its partition managers. `server.rs` builds them.

mod control;
mod data;
pub mod groups;
mod offsets;
mod peer;
mod registry_ops;
mod tap;
mod tap_health;
mod validate;

pub use control::{ControlService, QuorumPlace};
pub use data::DataService;
pub use peer::ReplicaFetch;
pub use validate::{CheckError, Invalid, Validation};

use crate::config::ServerConfig;
use crate::ownership::DataDirLock;

/// The services of one server process, shared by all its front ends.
pub struct Services {
    pub config: ServerConfig,
    pub data: DataService,
    pub control: ControlService,
    /// Server-wide counters the front ends update (the metrics tap).
    pub stats: crate::stats::ServerStats,
    /// Set once the registry says this member left the group (it was
    /// drained or removed): the process should stop.
    pub left: tokio::sync::watch::Sender<bool>,
    /// Held for the server's whole life: one server per data directory.
    pub(crate) _lock: DataDirLock,
}
