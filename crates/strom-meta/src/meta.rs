//! [`Meta`], one member's handle on the metadata quorum: it starts Raft
//! over the member's directory, proposes commands (answering
//! [`MetaError::NotLeader`] with the leader's id and address when this
//! member does not lead), changes the membership, serves the RPCs other
//! members send, and reads the local state machine.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{
    CheckIsLeaderError, ClientWriteError, ForwardToLeader, InitializeError, RaftError,
};
use openraft::{BasicNode, ChangeMembers, Raft, RaftMetrics, ServerState};
use parking_lot::Mutex;
use strom_storage::vfs::{RealFs, Vfs};

use crate::config::MetaConfig;
use crate::error::MetaError;
use crate::log_file::LogFile;
use crate::log_store::LogStore;
use crate::network::{serve, MetaNet, NetFactory, SnapshotGate};
use crate::state_machine::{Machine, MachineStore};
use crate::types::{Blob, Node, NodeId, Reply, TypeConfig};

/// One member of the metadata quorum (a voter or a learner).
pub struct Meta<M: Machine> {
    id: NodeId,
    raft: Raft<TypeConfig>,
    machine: Arc<Mutex<M>>,
    max_command: usize,
    gate: SnapshotGate,
    /// Stops snapshot writes at shutdown.
    snapshots: crate::state_machine::SnapshotCloser,
}

impl<M: Machine> Meta<M> {
    /// Starts member `id` over `dir` (created if missing): the machine
    /// starts from the snapshot there, and Raft replays the log after it.
    /// A fresh member waits to be initialized or added by a leader.
    pub async fn start(
        id: NodeId,
        dir: &Path,
        config: MetaConfig,
        machine: M,
        net: Arc<dyn MetaNet>,
    ) -> Result<Self, MetaError> {
        Self::start_on(Arc::new(RealFs), id, dir, config, machine, net).await
    }

    /// [`Meta::start`] on another file system (a simulated disk in tests).
    pub async fn start_on(
        vfs: Arc<dyn Vfs>,
        id: NodeId,
        dir: &Path,
        config: MetaConfig,
        machine: M,
        net: Arc<dyn MetaNet>,
    ) -> Result<Self, MetaError> {
        let raft_config = Arc::new(config.to_raft()?);
        let log = LogFile::open(vfs.clone(), dir)?;
        let store = MachineStore::open(vfs, dir, machine)?;
        let snapshot = store.durable_snapshot();
        check_purge_covered(&log, *snapshot.borrow(), dir)?;
        let machine = store.machine();
        let snapshots = store.closer();
        let raft = Raft::new(
            id,
            raft_config,
            NetFactory { net },
            LogStore::new(log, snapshot),
            store,
        )
        .await
        .map_err(|e| MetaError::Stopped(e.to_string()))?;
        tracing::info!(member = id, dir = %dir.display(), "metadata quorum member started");
        Ok(Meta {
            id,
            raft,
            machine,
            max_command: config.max_command,
            gate: SnapshotGate::default(),
            snapshots,
        })
    }

    pub fn id(&self) -> NodeId {
        self.id
    }

    /// Makes a fresh quorum of `voters` (id and address each), this member
    /// among them. Call it on one member, once; a member whose log is not
    /// empty answers [`MetaError::AlreadyInitialized`].
    pub async fn initialize(&self, voters: BTreeMap<NodeId, String>) -> Result<(), MetaError> {
        let nodes: BTreeMap<NodeId, Node> = voters
            .into_iter()
            .map(|(id, addr)| (id, BasicNode::new(addr)))
            .collect();
        match self.raft.initialize(nodes).await {
            Ok(()) => Ok(()),
            Err(RaftError::APIError(InitializeError::NotAllowed(_))) => {
                Err(MetaError::AlreadyInitialized)
            }
            Err(RaftError::APIError(e)) => Err(MetaError::Membership(e.to_string())),
            Err(RaftError::Fatal(e)) => Err(MetaError::Stopped(e.to_string())),
        }
    }

    /// Appends `cmd` to the replicated log and returns the machine's answer
    /// once a quorum holds it and this member applied it.
    pub async fn propose(&self, cmd: Vec<u8>) -> Result<Vec<u8>, MetaError> {
        if cmd.len() > self.max_command {
            return Err(MetaError::TooLarge {
                size: cmd.len(),
                limit: self.max_command,
            });
        }
        let resp = self
            .raft
            .client_write(Blob(cmd))
            .await
            .map_err(|e| self.write_error(e))?;
        match resp.data {
            Reply(Ok(bytes)) => Ok(bytes.0),
            Reply(Err(why)) => Err(MetaError::Rejected(why)),
        }
    }

    /// Adds (or updates) a learner and waits until it has caught up.
    pub async fn add_learner(&self, id: NodeId, addr: String) -> Result<(), MetaError> {
        self.raft
            .add_learner(id, BasicNode::new(addr), true)
            .await
            .map_err(|e| self.write_error(e))?;
        Ok(())
    }

    /// Makes `voters` the voting members (each must be a member already,
    /// e.g. a caught-up learner); members left out are removed.
    pub async fn change_membership(&self, voters: BTreeSet<NodeId>) -> Result<(), MetaError> {
        self.raft
            .change_membership(voters, false)
            .await
            .map_err(|e| self.write_error(e))?;
        Ok(())
    }

    /// Gives members already in the membership new addresses (a member
    /// restarted on another port): the quorum reaches them there from now
    /// on. The ids and the voting set are unchanged.
    pub async fn set_addresses(&self, addrs: BTreeMap<NodeId, String>) -> Result<(), MetaError> {
        let nodes: BTreeMap<NodeId, Node> = addrs
            .into_iter()
            .map(|(id, addr)| (id, BasicNode::new(addr)))
            .collect();
        self.raft
            .change_membership(ChangeMembers::SetNodes(nodes), false)
            .await
            .map_err(|e| self.write_error(e))?;
        Ok(())
    }

    fn write_error(&self, e: RaftError<NodeId, ClientWriteError<NodeId, Node>>) -> MetaError {
        match e {
            RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => self.not_leader(f),
            RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
                MetaError::Membership(e.to_string())
            }
            RaftError::Fatal(e) => MetaError::Stopped(e.to_string()),
        }
    }

    /// The redirect hint: the leader's id, and its address when known.
    fn not_leader(&self, f: ForwardToLeader<NodeId, Node>) -> MetaError {
        let leader = match (f.leader_id, f.leader_node) {
            (Some(id), Some(node)) => Some((id, node.addr)),
            (Some(id), None) => self.address_of(id).map(|a| (id, a)),
            _ => None,
        };
        MetaError::NotLeader { leader }
    }

    fn address_of(&self, id: NodeId) -> Option<String> {
        let m = self.raft.metrics();
        let m = m.borrow();
        m.membership_config
            .membership()
            .get_node(&id)
            .map(|n| n.addr.clone())
    }

    /// The leader this member knows of, with its address.
    pub fn leader(&self) -> Option<(NodeId, String)> {
        let id = self.raft.metrics().borrow().current_leader?;
        self.address_of(id).map(|a| (id, a))
    }

    /// Whether this member believes it leads (it may have been deposed
    /// without knowing yet; `propose` is what settles it).
    pub fn is_leader(&self) -> bool {
        self.raft.metrics().borrow().state == ServerState::Leader
    }

    /// The term this member leads in, if it believes it leads.
    pub fn leader_term(&self) -> Option<u64> {
        let m = self.raft.metrics();
        let m = m.borrow();
        (m.state == ServerState::Leader).then_some(m.current_term)
    }

    /// The voting members and the learners, with their addresses, as this
    /// member's latest membership config has them.
    pub fn members(&self) -> (BTreeMap<NodeId, String>, BTreeMap<NodeId, String>) {
        let m = self.raft.metrics();
        let m = m.borrow();
        let cfg = m.membership_config.membership();
        let voters: BTreeSet<NodeId> = cfg.voter_ids().collect();
        let (mut v, mut l) = (BTreeMap::new(), BTreeMap::new());
        for (id, node) in cfg.nodes() {
            let side = if voters.contains(id) { &mut v } else { &mut l };
            side.insert(*id, node.addr.clone());
        }
        (v, l)
    }

    /// Raft's view of this member: term, indexes, membership, snapshot.
    pub fn metrics(&self) -> RaftMetrics<NodeId, Node> {
        self.raft.metrics().borrow().clone()
    }

    /// Waits until this member has applied the log up to `index`.
    pub async fn wait_applied(&self, index: u64, timeout: Duration) -> Result<(), MetaError> {
        self.raft
            .wait(Some(timeout))
            .applied_index_at_least(Some(index), "wait_applied")
            .await
            .map(|_| ())
            .map_err(|_| MetaError::Timeout(timeout))
    }

    /// Reads the local state machine. On a follower it may lag the leader.
    pub fn read<R>(&self, f: impl FnOnce(&M) -> R) -> R {
        f(&self.machine.lock())
    }

    /// Reads the state machine after confirming with a quorum that this
    /// member still leads, and after applying everything committed before
    /// the call: the read sees every write acknowledged before it began.
    pub async fn read_linearizable<R>(&self, f: impl FnOnce(&M) -> R) -> Result<R, MetaError> {
        match self.raft.ensure_linearizable().await {
            Ok(_) => Ok(self.read(f)),
            Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(fw))) => {
                Err(self.not_leader(fw))
            }
            Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(e))) => {
                Err(MetaError::NoQuorum(e.to_string()))
            }
            Err(RaftError::Fatal(e)) => Err(MetaError::Stopped(e.to_string())),
        }
    }

    /// Handles an RPC another member's [`MetaNet`] carried here.
    pub async fn handle(&self, rpc: &[u8]) -> Vec<u8> {
        serve(&self.raft, &self.gate, rpc).await
    }

    /// Stops Raft on this member; its directory can be started again.
    pub async fn shutdown(&self) -> Result<(), MetaError> {
        tracing::info!(member = self.id, "metadata quorum member stopping");
        let stopped = self
            .raft
            .shutdown()
            .await
            .map_err(|e| MetaError::Stopped(e.to_string()));
        // A snapshot openraft was still building is not written after this.
        self.snapshots.close();
        stopped
    }
}

/// Refuses a log purged past the snapshot on disk (which the purge rule in
/// the log store prevents; an older build could leave one after a power
/// loss): Raft would stop on it with an assertion, not a reason.
fn check_purge_covered(
    log: &LogFile,
    snapshot: Option<crate::types::LogId>,
    dir: &Path,
) -> Result<(), MetaError> {
    let purged = log.state().lock().purged;
    let Some(purged) = purged else {
        return Ok(());
    };
    if snapshot.is_some_and(|s| s.index >= purged.index) {
        return Ok(());
    }
    let had = snapshot.map_or("no snapshot".to_string(), |s| {
        format!("a snapshot up to index {}", s.index)
    });
    Err(MetaError::Log(crate::error::LogError::corrupt(
        &dir.join(crate::log_file::LOG),
        0,
        format!(
            "the Raft log is purged up to index {} but there is {had}; \
             this member's metadata cannot be rebuilt from its directory: \
             move the directory away and let the member rejoin as a new one",
            purged.index
        ),
    )))
}
