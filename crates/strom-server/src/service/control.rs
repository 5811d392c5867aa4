//! Control operations: the server's identity and limits, the registry
//! (topics, producers, the group) and member requests about hosted
//! partitions. Every registry operation needs the registry, so a server
//! that is not the master refuses them all with `NOT_MASTER`, here, in one
//! place ([`ControlService::registry`]).

use std::sync::Arc;

use strom_proto::{ErrorCode, GroupMember};

use crate::error::ServerError;
use crate::members::MemberLink;
use crate::meta_net::MetaEndpoint;
use crate::registry::Registry;

pub struct ControlService {
    registry: Option<Registry>,
    /// This member's metadata-quorum handle, once one is registered.
    meta: std::sync::OnceLock<Arc<dyn MetaEndpoint>>,
    link: Arc<MemberLink>,
    max_frame_bytes: u64,
    max_batch_bytes: u64,
}

/// Who a server is, as told to a client that says hello.
pub struct Greeting {
    pub member: u32,
    pub master: u32,
    pub members: Vec<GroupMember>,
}

impl ControlService {
    pub fn new(
        registry: Option<Registry>,
        link: Arc<MemberLink>,
        max_frame_bytes: u32,
        max_batch_bytes: u64,
    ) -> Self {
        ControlService {
            registry,
            meta: std::sync::OnceLock::new(),
            link,
            max_frame_bytes: u64::from(max_frame_bytes),
            max_batch_bytes,
        }
    }

    /// This server's member id (`u32::MAX` until it has joined).
    pub fn member(&self) -> u32 {
        self.link.member()
    }

    /// The address this server listens on.
    pub fn addr(&self) -> &str {
        self.link.addr()
    }

    /// The link to the group's members (this server included).
    pub fn link(&self) -> &Arc<MemberLink> {
        &self.link
    }

    /// The registry, if this server is the master.
    pub fn master_registry(&self) -> Option<&Registry> {
        self.registry.as_ref()
    }

    /// The registry, or `NOT_MASTER` naming where to go instead.
    pub fn registry(&self) -> Result<&Registry, ServerError> {
        self.registry.as_ref().ok_or_else(|| {
            ServerError::coded(
                ErrorCode::NOT_MASTER,
                format!(
                    "server {} is member {}, not the registry master; send registry requests to member 0 (see the group file)",
                    self.addr(),
                    self.member()
                ),
            )
        })
    }

    /// Hands this member's `MetaRpc` requests to `endpoint` from now on;
    /// false if one is registered already.
    pub fn serve_meta(&self, endpoint: Arc<dyn MetaEndpoint>) -> bool {
        self.meta.set(endpoint).is_ok()
    }

    /// Answers one Raft RPC of the metadata quorum; `INVALID_ARGUMENT` if
    /// this member runs none.
    pub async fn meta_rpc(&self, rpc: &[u8]) -> Result<Vec<u8>, ServerError> {
        match self.meta.get() {
            Some(m) => Ok(m.handle(rpc).await),
            None => Err(ServerError::coded(
                ErrorCode::INVALID_ARGUMENT,
                format!(
                    "member {} at {} runs no metadata quorum",
                    self.member(),
                    self.addr()
                ),
            )),
        }
    }

    /// `(max_frame_bytes, max_batch_bytes)` this server accepts.
    pub fn limits(&self) -> (u64, u64) {
        (self.max_frame_bytes, self.max_batch_bytes)
    }

    /// This server's id and the group's members as far as it knows them.
    pub async fn hello(&self) -> Greeting {
        let members = match &self.registry {
            Some(r) => r.group_members().await,
            None => self.link.brief(),
        };
        Greeting {
            member: self.member(),
            master: 0,
            members,
        }
    }
}
