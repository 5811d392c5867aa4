//! The test harness: a counting state machine, an in-process `MetaNet`
//! that routes each call to the target member's `handle` (and can cut a
//! member off), and a cluster of members over temporary directories.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use strom_meta::{async_trait, Machine, Meta, MetaConfig, MetaError, MetaNet, NetError, NodeId};
use strom_storage::sim::{SimFs, SimRng};
use strom_storage::vfs::{RealFs, Vfs};
use tempfile::TempDir;

/// Commands are 8-byte little-endian numbers, applied in log order.
#[derive(Default)]
pub struct Counter {
    pub applied: Vec<u64>,
}

impl Machine for Counter {
    fn apply(&mut self, cmd: &[u8]) -> Result<Vec<u8>, String> {
        let n: [u8; 8] = cmd
            .try_into()
            .map_err(|_| format!("a command of {} bytes, not 8", cmd.len()))?;
        self.applied.push(u64::from_le_bytes(n));
        Ok((self.applied.len() as u64).to_le_bytes().to_vec())
    }

    fn snapshot(&self) -> Vec<u8> {
        self.applied.iter().flat_map(|n| n.to_le_bytes()).collect()
    }

    fn restore(&mut self, snap: &[u8]) -> Result<(), String> {
        let words = snap.chunks_exact(8);
        if !words.remainder().is_empty() {
            return Err(format!("a snapshot of {} bytes", snap.len()));
        }
        self.applied = words
            .map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default()))
            .collect();
        Ok(())
    }
}

pub type Node = Arc<Meta<Counter>>;

/// Delivers calls between live, connected members.
#[derive(Default)]
pub struct Router {
    nodes: Mutex<HashMap<NodeId, Node>>,
    cut: Mutex<BTreeSet<NodeId>>,
}

impl Router {
    fn route(&self, from: NodeId, to: NodeId) -> Option<Node> {
        let cut = self.cut.lock();
        if cut.contains(&from) || cut.contains(&to) {
            return None;
        }
        self.nodes.lock().get(&to).cloned()
    }
}

/// One member's view of the in-process network.
pub struct Net {
    from: NodeId,
    router: Arc<Router>,
}

#[async_trait]
impl MetaNet for Net {
    async fn call(&self, target: NodeId, _addr: &str, rpc: Vec<u8>) -> Result<Vec<u8>, NetError> {
        match self.router.route(self.from, target) {
            Some(node) => Ok(node.handle(&rpc).await),
            None => Err(NetError::Unreachable {
                target,
                reason: "down or cut off".into(),
            }),
        }
    }
}

/// A network on which every other member is unreachable.
pub struct NoNet;

#[async_trait]
impl MetaNet for NoNet {
    async fn call(&self, target: NodeId, _addr: &str, _rpc: Vec<u8>) -> Result<Vec<u8>, NetError> {
        Err(NetError::Unreachable {
            target,
            reason: "no network".into(),
        })
    }
}

pub fn addr(id: NodeId) -> String {
    format!("mem://member-{id}")
}

pub fn cmd(n: u64) -> Vec<u8> {
    n.to_le_bytes().to_vec()
}

/// Members `1..=n` over directories under one temporary root, or each on
/// its own simulated disk.
pub struct Cluster {
    pub router: Arc<Router>,
    pub config: MetaConfig,
    root: TempDir,
    disks: Option<Mutex<HashMap<NodeId, SimFs>>>,
}

impl Cluster {
    /// Starts members `1..=n` on real files and initializes them as the voters.
    pub async fn voters(n: u64, config: MetaConfig) -> Cluster {
        Self::build(n, config, None).await
    }

    /// The same, each member on a simulated disk that loses unsynced writes.
    pub async fn voters_on_sim(n: u64, config: MetaConfig) -> Cluster {
        Self::build(n, config, Some(Mutex::default())).await
    }

    async fn build(
        n: u64,
        config: MetaConfig,
        disks: Option<Mutex<HashMap<NodeId, SimFs>>>,
    ) -> Cluster {
        let c = Cluster {
            router: Arc::default(),
            config,
            root: tempfile::tempdir().expect("temp dir"),
            disks,
        };
        for id in 1..=n {
            c.start(id).await;
        }
        let voters: BTreeMap<NodeId, String> = (1..=n).map(|id| (id, addr(id))).collect();
        c.node(1).initialize(voters).await.expect("initialize");
        c
    }

    /// The simulated disk of member `id` (clusters on simulated disks).
    pub fn disk(&self, id: NodeId) -> SimFs {
        let disks = self.disks.as_ref().expect("simulated disks");
        let mut disks = disks.lock();
        disks.entry(id).or_default().clone()
    }

    pub fn dir(&self, id: NodeId) -> PathBuf {
        self.root.path().join(format!("member-{id}"))
    }

    /// Starts (or restarts) member `id` from its directory.
    pub async fn start(&self, id: NodeId) -> Node {
        let net = Arc::new(Net {
            from: id,
            router: self.router.clone(),
        });
        let (vfs, dir): (Arc<dyn Vfs>, PathBuf) = match &self.disks {
            None => (Arc::new(RealFs), self.dir(id)),
            Some(disks) => {
                let disk = disks.lock().entry(id).or_insert_with(SimFs::new).clone();
                (Arc::new(disk), PathBuf::from(format!("/member-{id}")))
            }
        };
        let meta = Meta::start_on(vfs, id, &dir, self.config.clone(), Counter::default(), net)
            .await
            .expect("start member");
        let node = Arc::new(meta);
        self.router.nodes.lock().insert(id, node.clone());
        node
    }

    pub fn node(&self, id: NodeId) -> Node {
        self.router.nodes.lock()[&id].clone()
    }

    pub fn live(&self) -> Vec<NodeId> {
        let mut ids: Vec<NodeId> = self.router.nodes.lock().keys().copied().collect();
        ids.sort();
        ids
    }

    /// Shuts member `id` down and takes it off the network.
    pub async fn kill(&self, id: NodeId) {
        let node = self.router.nodes.lock().remove(&id).expect("live member");
        node.shutdown().await.expect("shutdown");
    }

    /// Power loss on every simulated disk at once: each keeps what it had
    /// synced, plus a random part of the rest; then every member stops.
    pub async fn power_loss(&self, rng: &mut SimRng) {
        let disks = self.disks.as_ref().expect("simulated disks");
        {
            let mut disks = disks.lock();
            for disk in disks.values_mut() {
                *disk = disk.crash_image(rng);
            }
        }
        self.shutdown().await;
    }

    /// Power loss on member `id` alone: its disk keeps what it had synced
    /// (up to its crash point, if one was set), plus a random part of the
    /// rest; the member stops, whatever its storage reports on the way.
    pub async fn power_loss_of(&self, id: NodeId, rng: &mut SimRng) {
        let disks = self.disks.as_ref().expect("simulated disks");
        {
            let mut disks = disks.lock();
            let disk = disks.get_mut(&id).expect("a simulated disk");
            *disk = disk.crash_image(rng);
        }
        let node = self.router.nodes.lock().remove(&id).expect("live member");
        let _ = node.shutdown().await;
    }

    pub fn cut(&self, id: NodeId, cut: bool) {
        let mut set = self.router.cut.lock();
        if cut {
            set.insert(id);
        } else {
            set.remove(&id);
        }
    }

    /// Waits until a live member leads and every live member knows it.
    pub async fn leader(&self, within: Duration) -> NodeId {
        let deadline = Instant::now() + within;
        loop {
            let live = self.live();
            let views: BTreeSet<Option<NodeId>> = live
                .iter()
                .map(|id| self.node(*id).leader().map(|l| l.0))
                .collect();
            if let [Some(l)] = views.iter().copied().collect::<Vec<_>>()[..] {
                if live.contains(&l) && self.node(l).is_leader() {
                    return l;
                }
            }
            assert!(
                Instant::now() < deadline,
                "no leader within {within:?}: {views:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Proposes `c` at any live member, following `NotLeader` hints.
    pub async fn propose(&self, c: Vec<u8>) -> Vec<u8> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut target = self.live()[0];
        loop {
            match self.node(target).propose(c.clone()).await {
                Ok(r) => return r,
                Err(MetaError::NotLeader {
                    leader: Some((l, _)),
                }) if self.live().contains(&l) => target = l,
                Err(e) => {
                    assert!(
                        Instant::now() < deadline,
                        "proposing failed until the deadline: {e}"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    let live = self.live();
                    target = live
                        [(live.iter().position(|x| *x == target).unwrap_or(0) + 1) % live.len()];
                }
            }
        }
    }

    /// Waits until every live member has applied `leader`'s whole log. (The
    /// leader's `last_applied` metric may lag the answers it already gave;
    /// its last log index never does.)
    pub async fn converge(&self, leader: NodeId) {
        let index = self.node(leader).metrics().last_log_index.unwrap_or(0);
        for id in self.live() {
            self.node(id)
                .wait_applied(index, Duration::from_secs(10))
                .await
                .unwrap_or_else(|e| panic!("member {id} did not reach {index}: {e}"));
        }
    }

    pub fn applied(&self, id: NodeId) -> Vec<u64> {
        self.node(id).read(|c| c.applied.clone())
    }

    pub async fn shutdown(&self) {
        for id in self.live() {
            self.kill(id).await;
        }
    }
}

/// A config with shorter timeouts, for tests that do not measure failover.
pub fn quick() -> MetaConfig {
    MetaConfig {
        heartbeat: Duration::from_millis(50),
        election_timeout_min: Duration::from_millis(200),
        election_timeout_max: Duration::from_millis(400),
        ..MetaConfig::default()
    }
}
