//! libfabric (OFI) for Strom: raw bindings ([`sys`]) generated at build
//! time from the system's libfabric 1.17 headers, and a small safe layer.
//!
//! - [`Endpoint`]: one RDM endpoint of a provider (`"tcp;ofi_rxm"`,
//!   `"shm"`, `"verbs;ofi_rxm"`, `"cxi"`), optionally on a named domain (one
//!   NIC), with an AV table, one CQ and a progress thread. Messages go out
//!   with [`Endpoint::send`] and come in through the callback given at
//!   open; [`Endpoint::read`] and [`Endpoint::write`] move bytes one-sidedly.
//! - [`MemoryRegion`] / [`MrCache`]: registrations, and a bounded cache so
//!   the same buffers are not registered again for every transfer.
//!
//! Provider requirements are honoured: the `FI_CONTEXT`/`FI_CONTEXT2`
//! modes and the `FI_MR_LOCAL`, `FI_MR_VIRT_ADDR`, `FI_MR_PROV_KEY`,
//! `FI_MR_ALLOCATED` and `FI_MR_ENDPOINT` registration modes (see
//! [`Traits`]).

mod completion;
mod dynload;
mod endpoint;
mod error;
mod fabric;
mod mr;
mod progress;
pub mod sys;

pub use completion::Completion;
pub use endpoint::{
    Endpoint, EndpointConfig, OnRecv, Peer, DEFAULT_MSG_SIZE, DEFAULT_RECV_BUFFERS,
};
pub use error::{strerror, OfiError};
pub use fabric::{ProviderSpec, Traits};
pub use mr::{Access, CacheStats, MemoryRegion, MrCache, RemoteRegion};
