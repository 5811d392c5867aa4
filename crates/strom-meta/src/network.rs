//! How the quorum's members talk: the [`MetaNet`] trait a transport
//! implements (one opaque request, one opaque answer), openraft's network
//! over it, and the receiving side, [`serve`], which decodes an RPC, hands
//! it to the local Raft node and encodes the answer. The bytes are
//! [`crate::codec`]'s; a server carries them in a single opcode.

use std::sync::Arc;

use async_trait::async_trait;
use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError,
    SnapshotMismatch, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{Raft, SnapshotSegmentId};
use parking_lot::Mutex;

use crate::codec::{decode_rpc, encode_rpc, Rpc, RpcReply, SnapshotChunk, MAX_APPEND, MAX_RPC};
use crate::error::NetError;
use crate::types::{Node, NodeId, TypeConfig};

/// Carries one encoded RPC to member `target` at `addr` and returns its
/// answer: the bytes that member's [`crate::Meta::handle`] returned.
#[async_trait]
pub trait MetaNet: Send + Sync + 'static {
    async fn call(&self, target: NodeId, addr: &str, rpc: Vec<u8>) -> Result<Vec<u8>, NetError>;
}

/// openraft's network factory: one [`Peer`] per target.
pub struct NetFactory {
    pub net: Arc<dyn MetaNet>,
}

impl RaftNetworkFactory<TypeConfig> for NetFactory {
    type Network = Peer;

    async fn new_client(&mut self, target: NodeId, node: &Node) -> Peer {
        Peer {
            net: self.net.clone(),
            target,
            addr: node.addr.clone(),
        }
    }
}

/// The network towards one member.
pub struct Peer {
    net: Arc<dyn MetaNet>,
    target: NodeId,
    addr: String,
}

type RpcErr<E = openraft::error::Infallible> = RPCError<NodeId, Node, RaftError<NodeId, E>>;

impl Peer {
    /// Encodes `rpc`. An append-entries RPC of several entries over
    /// [`MAX_APPEND`] is refused as too large (openraft then retries with
    /// fewer entries); anything else over [`MAX_RPC`] is refused outright.
    // openraft's RPCError is large, and it is the type Raft wants back.
    #[allow(clippy::result_large_err)]
    fn encode<E: std::error::Error>(&self, rpc: &Rpc) -> Result<Vec<u8>, RpcErr<E>> {
        let bytes = encode_rpc(rpc).map_err(|e| {
            net_error(&NetError::Failed {
                target: self.target,
                reason: e,
            })
        })?;
        let entries = match rpc {
            Rpc::AppendEntries(r) => r.entries.len(),
            _ => 0,
        };
        let limit = if entries > 1 { MAX_APPEND } else { MAX_RPC };
        if bytes.len() <= limit {
            return Ok(bytes);
        }
        if entries == 0 {
            return Err(net_error(&NetError::Failed {
                target: self.target,
                reason: format!(
                    "an RPC of {} bytes, over the limit of {MAX_RPC}",
                    bytes.len()
                ),
            }));
        }
        // As many entries as fit, if they are about the same size.
        let fit = (entries * MAX_APPEND / bytes.len()).max(1) as u64;
        tracing::debug!(
            target_member = self.target,
            bytes = bytes.len(),
            entries,
            fit,
            "an append-entries RPC is too large; asking for fewer entries"
        );
        Err(RPCError::PayloadTooLarge(
            PayloadTooLarge::new_entries_hint(fit),
        ))
    }

    /// Sends `rpc` and decodes the answer, within the RPC's time limit.
    async fn send<E: std::error::Error>(
        &self,
        rpc: Rpc,
        option: &RPCOption,
    ) -> Result<RpcReply, RpcErr<E>> {
        let bytes = self.encode(&rpc)?;
        drop(rpc);
        let call = self.net.call(self.target, &self.addr, bytes);
        let answer = match tokio::time::timeout(option.hard_ttl(), call).await {
            Ok(Ok(a)) => a,
            Ok(Err(e @ NetError::Unreachable { .. })) => {
                return Err(RPCError::Unreachable(Unreachable::new(&e)))
            }
            Ok(Err(e)) => return Err(net_error(&e)),
            Err(_) => {
                return Err(net_error(&NetError::Failed {
                    target: self.target,
                    reason: format!("no answer within {:?}", option.hard_ttl()),
                }))
            }
        };
        match decode_rpc::<RpcReply>(&answer, "a Raft RPC answer") {
            Ok(RpcReply::Refused(reason)) => Err(net_error(&NetError::Failed {
                target: self.target,
                reason,
            })),
            Ok(reply) => Ok(reply),
            Err(e) => Err(net_error(&NetError::Failed {
                target: self.target,
                reason: e.to_string(),
            })),
        }
    }

    fn mismatch<E: std::error::Error>(&self, reply: &RpcReply) -> RpcErr<E> {
        net_error(&NetError::Failed {
            target: self.target,
            reason: format!("an answer of the wrong kind: {}", kind(reply)),
        })
    }

    fn remote<E: std::error::Error>(&self, e: RaftError<NodeId, E>) -> RpcErr<E> {
        RPCError::RemoteError(RemoteError::new(self.target, e))
    }
}

fn net_error<E: std::error::Error>(e: &NetError) -> RpcErr<E> {
    RPCError::Network(NetworkError::new(e))
}

fn kind(reply: &RpcReply) -> &'static str {
    match reply {
        RpcReply::AppendEntries(_) => "append-entries",
        RpcReply::Vote(_) => "vote",
        RpcReply::InstallSnapshot(_) => "install-snapshot",
        RpcReply::Refused(_) => "refusal",
    }
}

impl RaftNetwork<TypeConfig> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RpcErr> {
        match self.send(Rpc::AppendEntries(rpc), &option).await? {
            RpcReply::AppendEntries(r) => r.map_err(|e| self.remote(e)),
            other => Err(self.mismatch(&other)),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RpcErr<InstallSnapshotError>> {
        match self.send(Rpc::InstallSnapshot(rpc.into()), &option).await? {
            RpcReply::InstallSnapshot(r) => r.map_err(|e| self.remote(e)),
            other => Err(self.mismatch(&other)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RpcErr> {
        match self.send(Rpc::Vote(rpc), &option).await? {
            RpcReply::Vote(r) => r.map_err(|e| self.remote(e)),
            other => Err(self.mismatch(&other)),
        }
    }
}

/// The largest snapshot a member receives (what `sm.snapshot` can hold).
const MAX_SNAPSHOT: u64 = u32::MAX as u64;

/// Where the snapshot being received stands. openraft writes each chunk
/// at the offset it names, growing the buffer up to it, so a chunk far
/// past the data received would size an allocation: a chunk must start
/// within what arrived (a retry may repeat it) and end under
/// [`MAX_SNAPSHOT`].
#[derive(Default)]
pub struct SnapshotGate {
    /// The snapshot id and the bytes received of it.
    current: Mutex<Option<(String, u64)>>,
}

impl SnapshotGate {
    fn admit(&self, c: &SnapshotChunk) -> Result<(), SnapshotMismatch> {
        let mut current = self.current.lock();
        let id = &c.meta.snapshot_id;
        let received = match &*current {
            Some((cur, n)) if cur == id => *n,
            _ => 0,
        };
        let end = c.offset.saturating_add(c.data.0.len() as u64);
        if c.offset > received || end > MAX_SNAPSHOT {
            tracing::warn!(snapshot = %id, offset = c.offset, end, received, "refusing a snapshot chunk that does not follow on");
            let at = |offset| SnapshotSegmentId {
                id: id.clone(),
                offset,
            };
            return Err(SnapshotMismatch {
                expect: at(received),
                got: at(c.offset),
            });
        }
        *current = (!c.done).then(|| (id.clone(), received.max(end)));
        Ok(())
    }
}

/// Handles one encoded RPC on the receiving member and encodes the answer.
/// Bytes that do not decode get a [`RpcReply::Refused`] answer naming the
/// problem; nothing here panics on them.
pub async fn serve(raft: &Raft<TypeConfig>, gate: &SnapshotGate, rpc: &[u8]) -> Vec<u8> {
    let reply = match decode_rpc::<Rpc>(rpc, "a Raft RPC") {
        Err(e) => {
            tracing::warn!(error = %e, bytes = rpc.len(), "refusing a Raft RPC that does not decode");
            RpcReply::Refused(e.to_string())
        }
        Ok(Rpc::AppendEntries(r)) => RpcReply::AppendEntries(raft.append_entries(r).await),
        Ok(Rpc::Vote(r)) => RpcReply::Vote(raft.vote(r).await),
        Ok(Rpc::InstallSnapshot(c)) => RpcReply::InstallSnapshot(match gate.admit(&c) {
            Ok(()) => raft.install_snapshot(c.into()).await,
            Err(mismatch) => Err(RaftError::APIError(mismatch.into())),
        }),
    };
    encode_rpc(&reply).unwrap_or_else(|e| {
        tracing::error!(error = %e, "encoding a Raft RPC answer failed");
        encode_rpc(&RpcReply::Refused(format!(
            "encoding the answer failed: {e}"
        )))
        .unwrap_or_default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Blob, SnapshotMeta, Vote};

    fn chunk(id: &str, offset: u64, len: usize, done: bool) -> SnapshotChunk {
        SnapshotChunk {
            vote: Vote::new_committed(1, 1),
            meta: SnapshotMeta {
                snapshot_id: id.into(),
                ..Default::default()
            },
            offset,
            data: Blob(vec![0; len]),
            done,
        }
    }

    #[test]
    fn snapshot_chunks_must_follow_on_from_what_arrived() {
        let gate = SnapshotGate::default();
        assert!(gate.admit(&chunk("a", 1 << 40, 10, false)).is_err());
        assert!(gate.admit(&chunk("a", 0, 10, false)).is_ok());
        assert!(gate.admit(&chunk("a", 0, 10, false)).is_ok(), "a retry");
        assert!(gate.admit(&chunk("a", 10, 10, false)).is_ok());
        assert!(gate.admit(&chunk("a", 21, 10, false)).is_err(), "a gap");
        assert!(
            gate.admit(&chunk("b", 10, 10, false)).is_err(),
            "another snapshot"
        );
        assert!(gate.admit(&chunk("a", 20, 5, true)).is_ok());
        assert!(
            gate.admit(&chunk("a", 25, 5, false)).is_err(),
            "after the end"
        );
        assert!(gate.admit(&chunk("c", MAX_SNAPSHOT, 0, false)).is_err());
    }
}
