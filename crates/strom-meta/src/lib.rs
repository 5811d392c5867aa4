//! strom-meta owns the metadata quorum: a command log replicated with Raft
//! (openraft 0.9) over 1, 3 or 5 voters, persisted in a member's data
//! directory, feeding a deterministic [`Machine`] (the topic registry, once
//! strom-server plugs it in). It owns the Raft types ([`types`]), the
//! durable log and snapshot files (on `strom_storage::record` framing),
//! the RPC encoding ([`codec`]), the [`MetaNet`] transport trait, and the
//! [`Meta`] handle. It must never depend on strom-server, the protocol
//! crate or a concrete transport: commands and RPCs are opaque bytes here,
//! and the server carries them.
//!
//! The design (what is persisted, when it is fsynced, the RPC encoding,
//! the leader hint) is in `docs/replication.md`, "Metadata quorum".

pub mod codec;
mod config;
mod error;
mod files;
pub mod log_file;
mod log_store;
mod meta;
mod network;
mod state_machine;
pub mod types;

pub use async_trait::async_trait;
pub use config::MetaConfig;
pub use error::{code, LogError, MetaError, NetError};
pub use meta::Meta;
pub use network::MetaNet;
pub use state_machine::Machine;
pub use types::NodeId;
