//! Control operations: the server's identity and limits, the registry
//! (topics, producers, the group) and member requests about hosted
//! partitions. Every registry operation needs the registry, so a server
//! that is not the master (without a quorum: member 0; with one: the Raft
//! leader) refuses them all with `NOT_MASTER` and the leader it knows of,
//! here, in one place ([`ControlService::registry`]). A member of a
//! metadata quorum starts its quorum handle and registry here too: at
//! startup if it has a quorum directory, or on the first Raft RPC a leader
//! sends it ([`ControlService::start_quorum`]).

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use strom_meta::{Meta, MetaConfig};
use strom_proto::{ErrorCode, GroupMember};
use tokio::sync::watch;

use crate::error::ServerError;
use crate::members::MemberLink;
use crate::meta_net::{MetaEndpoint, PeerMetaNet};
use crate::registry::{QuorumSetup, Registry, RegistryMachine};

/// Where a member keeps its share of the metadata quorum, and what it
/// needs to run the registry when it leads.
pub struct QuorumPlace {
    pub dir: PathBuf,
    pub setup: QuorumSetup,
    pub stop: watch::Receiver<bool>,
}

pub struct ControlService {
    registry: OnceLock<Arc<Registry>>,
    /// Set on servers that may take part in a metadata quorum.
    quorum: Option<QuorumPlace>,
    /// Serializes starts of the quorum handle.
    starting: tokio::sync::Mutex<()>,
    /// This member's metadata-quorum handle, once one is registered.
    meta: OnceLock<Arc<dyn MetaEndpoint>>,
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
        let cell = OnceLock::new();
        if let Some(r) = registry {
            let _ = cell.set(Arc::new(r));
        }
        ControlService {
            registry: cell,
            quorum: None,
            starting: tokio::sync::Mutex::new(()),
            meta: OnceLock::new(),
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

    /// Lets this server take part in a metadata quorum kept in `place`.
    pub fn with_quorum(mut self, place: QuorumPlace) -> Self {
        self.quorum = Some(place);
        self
    }

    /// The registry, if this server is the master (with a quorum: the
    /// leader, with its state loaded).
    pub fn master_registry(&self) -> Option<&Registry> {
        self.registry.get().map(|r| &**r).filter(|r| r.leads())
    }

    /// The quorum's leader as this member knows it (id, address); None
    /// without a quorum or while no leader is known.
    pub fn leader_hint(&self) -> Option<(u32, String)> {
        self.registry.get()?.leader_hint()
    }

    /// This member's metadata-quorum handle, once started (for metrics).
    pub fn quorum_meta(&self) -> Option<&Arc<Meta<RegistryMachine>>> {
        self.registry.get()?.meta()
    }

    /// The registry, or `NOT_MASTER` naming where to go instead.
    pub fn registry(&self) -> Result<&Registry, ServerError> {
        if let Some(r) = self.master_registry() {
            return Ok(r);
        }
        let hint = match (self.registry.get(), self.leader_hint()) {
            (None, _) => "send registry requests to member 0 (see the group file)".to_string(),
            (Some(_), Some((id, addr))) if id != self.member() => {
                format!("the metadata leader is member {id} at {addr}")
            }
            (Some(_), _) => "no metadata leader is ready yet (an election or a takeover is in progress); retry shortly".to_string(),
        };
        Err(ServerError::coded(
            ErrorCode::NOT_MASTER,
            format!(
                "server {} is member {}, not the registry master; {hint}",
                self.addr(),
                self.member()
            ),
        ))
    }

    /// Whether this server may take part in a metadata quorum.
    pub fn has_quorum(&self) -> bool {
        self.quorum.is_some()
    }

    /// Starts this member's quorum handle and its registry (once; later
    /// calls return the running one). The member must know its id.
    pub async fn start_quorum(&self) -> Result<Arc<Meta<RegistryMachine>>, ServerError> {
        let _one = self.starting.lock().await;
        if let Some(m) = self.registry.get().and_then(|r| r.meta()) {
            return Ok(m.clone());
        }
        let place = self.quorum.as_ref().ok_or_else(|| {
            ServerError::coded(
                ErrorCode::INVALID_ARGUMENT,
                format!(
                    "member {} at {} runs no metadata quorum",
                    self.member(),
                    self.addr()
                ),
            )
        })?;
        let me = self.member();
        let why = if self.registry.get().is_some() {
            "it holds the registry without a quorum (meta_voters = 1)"
        } else if me == u32::MAX {
            "it has not joined the group yet"
        } else {
            ""
        };
        if !why.is_empty() {
            return Err(ServerError::coded(
                ErrorCode::INVALID_ARGUMENT,
                format!(
                    "member {me} at {} runs no metadata quorum: {why}",
                    self.addr()
                ),
            ));
        }
        let net = Arc::new(PeerMetaNet::new(self.link.clone()));
        let meta = Meta::start(
            u64::from(me),
            &place.dir,
            MetaConfig::default(),
            RegistryMachine::default(),
            net,
        )
        .await
        .map_err(|e| {
            ServerError::coded(
                ErrorCode(e.code()),
                format!(
                    "starting the metadata quorum in {}: {e}",
                    place.dir.display()
                ),
            )
        })?;
        let meta = Arc::new(meta);
        let reg = Arc::new(Registry::on_quorum(
            meta.clone(),
            self.link.clone(),
            &place.setup,
        ));
        let _ = self.registry.set(reg.clone());
        let endpoint: Arc<dyn MetaEndpoint> = meta.clone();
        let _ = self.meta.set(endpoint);
        tokio::spawn(reg.watch(place.setup.voters, place.stop.clone()));
        Ok(meta)
    }

    /// Stops this member's quorum handle, if it runs one.
    pub async fn stop_quorum(&self) {
        if let Some(m) = self.registry.get().and_then(|r| r.meta()) {
            let _ = m.shutdown().await;
        }
    }

    /// Hands this member's `MetaRpc` requests to `endpoint` from now on;
    /// false if one is registered already.
    pub fn serve_meta(&self, endpoint: Arc<dyn MetaEndpoint>) -> bool {
        self.meta.set(endpoint).is_ok()
    }

    /// Answers one Raft RPC of the metadata quorum; `INVALID_ARGUMENT` if
    /// this member runs none.
    pub async fn meta_rpc(&self, rpc: &[u8]) -> Result<Vec<u8>, ServerError> {
        if let Some(m) = self.meta.get() {
            return Ok(m.handle(rpc).await);
        }
        // A leader adds this member to its quorum: start taking part.
        let m = self.start_quorum().await?;
        Ok(m.handle(rpc).await)
    }

    /// Voters of the metadata quorum this server belongs to (1: none).
    pub fn meta_voters(&self) -> u32 {
        self.quorum.as_ref().map_or(1, |q| q.setup.voters.max(1))
    }

    /// `(max_frame_bytes, max_batch_bytes)` this server accepts.
    pub fn limits(&self) -> (u64, u64) {
        (self.max_frame_bytes, self.max_batch_bytes)
    }

    /// This server's id and the group's members as far as it knows them.
    pub async fn hello(&self) -> Greeting {
        let members = match (self.master_registry(), self.registry.get()) {
            (Some(r), _) => r.group_members().await,
            (None, Some(r)) => r.known_members(),
            (None, None) => self.link.brief(),
        };
        let master = match self.registry.get() {
            Some(r) if r.meta().is_some() => self.leader_hint().map_or(u32::MAX, |(id, _)| id),
            _ => 0,
        };
        Greeting {
            member: self.member(),
            master,
            members,
        }
    }
}
