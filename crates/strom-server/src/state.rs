//! What every connection of one server process shares: its configuration,
//! hosted partitions, the registry (on the master), and the link to the
//! other members. Front ends (`conn.rs`, `control.rs`) reach the server
//! through it; `server.rs` builds it.

use std::sync::Arc;

use strom_proto::ErrorCode;

use crate::config::ServerConfig;
use crate::error::ServerError;
use crate::host::Host;
use crate::members::MemberLink;
use crate::ownership::DataDirLock;
use crate::registry::Registry;

/// State shared by every connection of one server process.
pub struct State {
    pub config: ServerConfig,
    pub host: Arc<Host>,
    pub registry: Option<Registry>,
    /// This server's id, address, hosted partitions and peers.
    pub link: Arc<MemberLink>,
    pub addr: String,
    /// Held for the server's whole life: one server per data directory.
    pub(crate) _lock: DataDirLock,
}

impl State {
    /// This server's member id (`u32::MAX` until it has joined).
    pub fn member(&self) -> u32 {
        self.link.member()
    }

    pub fn registry(&self) -> Result<&Registry, ServerError> {
        self.registry.as_ref().ok_or_else(|| {
            ServerError::coded(
                ErrorCode::NOT_MASTER,
                format!(
                    "server {} is member {}, not the registry master; send registry requests to member 0 (see the group file)",
                    self.addr,
                    self.member()
                ),
            )
        })
    }
}
