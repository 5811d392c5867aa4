//! The metadata quorum (strom-meta, docs/replication.md) over the native
//! protocol: [`PeerMetaNet`] sends each Raft RPC to the target member as a
//! `MetaRpc` request through this server's peer connections, and
//! [`MetaEndpoint`] is what a member's `MetaRpc` requests are handed to
//! (its quorum handle, registered with `ControlService::serve_meta`). The
//! RPC bytes are strom-meta's own encoding; nothing here reads them.

use std::sync::Arc;

use bytes::Bytes;
use strom_meta::{async_trait, Machine, Meta, MetaNet, NetError, NodeId};
use strom_proto::{ErrorCode, Request, Response};

use crate::members::MemberLink;

/// Raft RPCs to other members, over the native protocol.
pub struct PeerMetaNet {
    link: Arc<MemberLink>,
}

impl PeerMetaNet {
    pub fn new(link: Arc<MemberLink>) -> Self {
        PeerMetaNet { link }
    }
}

#[async_trait]
impl MetaNet for PeerMetaNet {
    async fn call(&self, target: NodeId, addr: &str, rpc: Vec<u8>) -> Result<Vec<u8>, NetError> {
        let req = Request::MetaRpc {
            rpc: Bytes::from(rpc),
        };
        match self.link.peers().call(addr, &req).await {
            Ok(Response::MetaRpc { rpc }) => Ok(rpc.to_vec()),
            Ok(other) => Err(NetError::Failed {
                target,
                reason: format!("unexpected answer {} to MetaRpc", other.opcode()),
            }),
            // Down, or no answer in time: Raft backs off before retrying.
            Err(e) if e.code() == ErrorCode::CONNECTION_FAILED => Err(NetError::Unreachable {
                target,
                reason: e.to_string(),
            }),
            // It answered with an error (e.g. it runs no quorum).
            Err(e) => Err(NetError::Failed {
                target,
                reason: e.to_string(),
            }),
        }
    }
}

/// Receives this member's `MetaRpc` requests.
#[async_trait]
pub trait MetaEndpoint: Send + Sync + 'static {
    /// Strom-meta's answer to one encoded RPC (never fails: bad bytes get
    /// an encoded refusal).
    async fn handle(&self, rpc: &[u8]) -> Vec<u8>;
}

#[async_trait]
impl<M: Machine> MetaEndpoint for Meta<M> {
    async fn handle(&self, rpc: &[u8]) -> Vec<u8> {
        Meta::handle(self, rpc).await
    }
}
