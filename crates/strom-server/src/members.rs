//! The narrow handle the control plane uses to reach group members: this
//! server's own id and address, the partitions it hosts, and connections to
//! its peers. The registry holds one instead of the whole server state, so
//! the control plane never calls back up into the object that owns it.
//!
//! A call addressed to this server's own id runs here, directly on the
//! local [`Host`]; any other goes to the peer at its address.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;

use strom_proto::{ErrorCode, GroupMember, Request, Response};

use crate::error::ServerError;
use crate::host::Host;
use crate::peers::Peers;

pub struct MemberLink {
    member: AtomicU32,
    addr: String,
    /// Every address this server listens on, `addr` first, then those
    /// front ends started beside it advertise (`kafka://…`).
    addrs: RwLock<Vec<String>>,
    host: Arc<Host>,
    peers: Arc<Peers>,
    /// The registry master's address as this member last reached it (for
    /// replicas that report to it).
    master: Arc<RwLock<Option<String>>>,
}

impl MemberLink {
    /// `peers` reaches the other members (through the server's transports).
    pub fn new(member: u32, addrs: Vec<String>, host: Arc<Host>, peers: Peers) -> Self {
        MemberLink {
            member: AtomicU32::new(member),
            addr: addrs.first().cloned().unwrap_or_default(),
            addrs: RwLock::new(addrs),
            host,
            peers: Arc::new(peers),
            master: Arc::new(RwLock::new(None)),
        }
    }

    /// Records where the registry master is (joined, or this server).
    pub fn set_master(&self, addr: &str) {
        let mut m = self.master.write();
        if m.as_deref() != Some(addr) {
            *m = Some(addr.to_string());
        }
    }

    /// What this member's replicated partitions need to reach the others.
    pub fn replica_ctx(&self) -> crate::replica::ReplicaCtx {
        crate::replica::ReplicaCtx {
            me: self.member(),
            peers: self.peers.clone(),
            master: self.master.clone(),
        }
    }

    /// This server's member id (`u32::MAX` until it has joined).
    pub fn member(&self) -> u32 {
        self.member.load(Ordering::Acquire)
    }

    /// Records this server's id, which it proves on the connections it
    /// opens from now on.
    pub fn set_member(&self, id: u32) {
        self.member.store(id, Ordering::Release);
        self.peers.identity().set_claim(id);
    }

    /// The address this server listens on.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    pub fn peers(&self) -> &Peers {
        &self.peers
    }

    /// Every address this server listens on, the primary first.
    pub fn addrs(&self) -> Vec<String> {
        self.addrs.read().clone()
    }

    /// Adds an address a front end beside the native one serves (e.g.
    /// `kafka://host:port`), published with the others; false if known.
    pub fn advertise(&self, url: &str) -> bool {
        let mut addrs = self.addrs.write();
        if addrs.iter().any(|a| a == url) {
            return false;
        }
        addrs.push(url.to_string());
        true
    }

    /// This server alone, as a member list.
    pub fn brief(&self) -> Vec<GroupMember> {
        vec![GroupMember {
            id: self.member(),
            addr: self.addr.clone(),
            addrs: self.addrs(),
        }]
    }

    /// Runs a member-directed request here or on the member at `addr`.
    pub async fn call(
        &self,
        member: u32,
        addr: &str,
        req: Request,
    ) -> Result<Response, ServerError> {
        if member == self.member() {
            self.local(req).await
        } else {
            self.peers.call(addr, &req).await
        }
    }

    /// Requests the master sends to members about the partitions they host.
    pub async fn local(&self, req: Request) -> Result<Response, ServerError> {
        let host = self.host.clone();
        match req {
            Request::HostPartitions {
                topic_id,
                spec,
                partitions,
                sealed,
            } => {
                blocking(move || host.host(topic_id, &spec, &partitions, sealed)).await?;
                Ok(Response::Done)
            }
            Request::SetReplicaRoles { topic, roles } => {
                let ctx = self.replica_ctx();
                let h = host.clone();
                tokio::task::spawn_blocking(move || {
                    // Roles start tasks on this runtime.
                    h.set_replica_roles(&ctx, &topic, &roles)
                })
                .await
                .map_err(|e| ServerError::coded(ErrorCode::INTERNAL, e.to_string()))??;
                Ok(Response::Done)
            }
            Request::SealPartitions { topic } => host.seal(&topic).await.map(|_| Response::Done),
            Request::DropPartitions { topic } => {
                blocking(move || host.drop_topic(&topic)).await?;
                Ok(Response::Done)
            }
            Request::ReleasePartitions {
                topic,
                topic_id,
                partitions,
            } => {
                blocking(move || host.release(&topic, topic_id, &partitions)).await?;
                Ok(Response::Done)
            }
            Request::PartitionStats { topic, partitions } => Ok(Response::Stats(host.stats(
                &topic,
                &partitions,
                self.member(),
                &self.addr,
            ))),
            Request::ConsumerGroupStats { spec, partitions } => Ok(Response::GroupStats(
                crate::hosted_groups::stats(&host, &spec, &partitions, self.member()),
            )),
            Request::DropConsumerGroup { topic, group } => {
                blocking(move || crate::hosted_groups::drop_group(&host, &topic, &group)).await?;
                Ok(Response::Done)
            }
            Request::FenceGroupPartition {
                topic,
                partition,
                group,
                consumer,
                epoch,
            } => {
                blocking(move || {
                    let claim = crate::hosted_groups::Claim {
                        topic: &topic,
                        partition,
                        group: &group,
                        consumer,
                        epoch,
                    };
                    crate::hosted_groups::set_fence(&host, &claim)
                })
                .await?;
                Ok(Response::Done)
            }
            other => Err(ServerError::coded(
                ErrorCode::UNKNOWN_OPCODE,
                format!("not a member request: opcode {}", other.opcode()),
            )),
        }
    }
}

/// Runs blocking file work off the async workers.
async fn blocking(
    f: impl FnOnce() -> Result<(), ServerError> + Send + 'static,
) -> Result<(), ServerError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ServerError::coded(ErrorCode::INTERNAL, e.to_string()))?
}
