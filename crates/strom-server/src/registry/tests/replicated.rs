//! The registry's state machine on the metadata quorum: three voters over
//! an in-process network apply a random registry history in one order and
//! reach the state the same commands give applied directly; a refused
//! command is refused on every voter; after a leader dies the others carry
//! on; and every voter restarts from its directory (snapshots included)
//! with the same state.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use strom_meta::{async_trait, Meta, MetaConfig, MetaError, MetaNet, NetError, NodeId};

use super::super::replicated::{encode, RegistryMachine};
use super::*;

type Node = Arc<Meta<RegistryMachine>>;

/// Routes each call to the target voter's `handle`, if it is up.
#[derive(Default)]
struct Router {
    nodes: Mutex<HashMap<NodeId, Node>>,
}

struct Net(Arc<Router>);

#[async_trait]
impl MetaNet for Net {
    async fn call(&self, target: NodeId, _addr: &str, rpc: Vec<u8>) -> Result<Vec<u8>, NetError> {
        let node = self.0.nodes.lock().get(&target).cloned();
        match node {
            Some(n) => Ok(n.handle(&rpc).await),
            None => Err(NetError::Unreachable {
                target,
                reason: "down".into(),
            }),
        }
    }
}

fn config() -> MetaConfig {
    MetaConfig {
        snapshot_every: 40,
        keep_after_snapshot: 10,
        ..MetaConfig::default()
    }
}

async fn start(router: &Arc<Router>, dir: &Path, id: NodeId) -> Node {
    let net = Arc::new(Net(router.clone()));
    let dir = dir.join(format!("voter-{id}"));
    let m = Meta::start(id, &dir, config(), RegistryMachine::default(), net)
        .await
        .expect("starting a voter");
    let m = Arc::new(m);
    router.nodes.lock().insert(id, m.clone());
    m
}

/// Proposes at whichever voter leads now, following `NotLeader`.
async fn propose(router: &Arc<Router>, cmd: &RegistryCommand) -> Result<(), MetaError> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let nodes: Vec<Node> = router.nodes.lock().values().cloned().collect();
        let leader = nodes.iter().find(|n| n.is_leader()).cloned();
        if let Some(l) = leader {
            match l.propose(encode(cmd)).await {
                Err(MetaError::NotLeader { .. }) => {}
                other => return other.map(|_| ()),
            }
        }
        assert!(Instant::now() < deadline, "no leader took {cmd:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn state_of(n: &Node) -> RegistryState {
    n.read(|m| m.state().clone())
}

/// Every live voter holds `want` once it applied everything committed.
async fn converge(router: &Arc<Router>, want: &RegistryState) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let nodes: Vec<Node> = router.nodes.lock().values().cloned().collect();
        let mut same = true;
        for n in &nodes {
            same &= state_of(n).await == *want;
        }
        if same {
            return;
        }
        assert!(Instant::now() < deadline, "voters did not converge");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_voters_replicate_the_registry_through_a_leader_death_and_restarts() {
    let tmp = tempfile::tempdir().unwrap();
    let router = Arc::new(Router::default());
    for id in 1..=3 {
        start(&router, tmp.path(), id).await;
    }
    let voters: BTreeMap<NodeId, String> = (1..=3).map(|i| (i, format!("mem://{i}"))).collect();
    let first = router.nodes.lock()[&1].clone();
    first.initialize(voters).await.expect("initializing");

    // A history of registry commands, applied directly as the reference.
    let history = random_history(17, 120);
    let mut want = RegistryState::default();
    for cmd in &history[..60] {
        want.apply(cmd).unwrap();
        propose(&router, cmd).await.expect("proposing");
    }
    // A command the state refuses is refused through the quorum too, and
    // changes nothing anywhere.
    let dup = history[..60]
        .iter()
        .find(|c| matches!(c, RegistryCommand::CreateTopic { meta } if want.topics.contains_key(&meta.spec.name)))
        .expect("the history created a topic that still exists")
        .clone();
    assert!(
        want.clone().apply(&dup).is_err(),
        "creating it again is refused"
    );
    let refused = propose(&router, &dup).await;
    assert!(
        matches!(refused, Err(MetaError::Rejected(_))),
        "{refused:?}"
    );
    converge(&router, &want).await;

    // The leader dies; the other two elect one and take the rest.
    let leader = router
        .nodes
        .lock()
        .values()
        .find(|n| n.is_leader())
        .cloned()
        .expect("a leader");
    let dead = leader.id();
    router.nodes.lock().remove(&dead);
    leader.shutdown().await.expect("shutting the leader down");
    drop(leader);
    for cmd in &history[60..] {
        want.apply(cmd).unwrap();
        propose(&router, cmd)
            .await
            .expect("proposing after the failover");
    }
    // It comes back from its directory and catches up.
    start(&router, tmp.path(), dead).await;
    converge(&router, &want).await;

    // Everyone restarts from disk (snapshots every 40 entries): same state.
    let all: Vec<Node> = router.nodes.lock().drain().map(|(_, n)| n).collect();
    for n in all {
        n.shutdown().await.expect("shutdown");
    }
    for id in 1..=3 {
        start(&router, tmp.path(), id).await;
    }
    converge(&router, &want).await;
    assert!(want.topics.len() > 1, "the history made topics: {want:?}");
}
