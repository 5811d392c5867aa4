//! The metadata quorum over the native protocol: three real servers (port
//! 0, temporary directories), each running a strom-meta member whose Raft
//! RPCs travel as `MetaRpc` requests through the servers' own peer
//! connections. Commands proposed at the leader are applied in one order on
//! all three; when the leader's server shuts down, the other two elect a
//! leader within 5 s and carry on; hostile RPC bytes get a refusal and the
//! member keeps working; a server running no quorum says so. The three
//! share one cluster secret, as the members of a group do.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use strom_meta::{Machine, Meta, MetaConfig, MetaError};
use strom_proto::{ErrorCode, Request};
use strom_server::{PeerMetaNet, Server, ServerConfig, ServerHandle};

/// Commands are 8-byte numbers, kept in the order applied.
#[derive(Default)]
struct Log(Vec<u64>);

impl Machine for Log {
    fn apply(&mut self, cmd: &[u8]) -> Result<Vec<u8>, String> {
        let n: [u8; 8] = cmd.try_into().map_err(|_| "not 8 bytes".to_string())?;
        self.0.push(u64::from_le_bytes(n));
        Ok(Vec::new())
    }
    fn snapshot(&self) -> Vec<u8> {
        self.0.iter().flat_map(|n| n.to_le_bytes()).collect()
    }
    fn restore(&mut self, snap: &[u8]) -> Result<(), String> {
        self.0 = snap
            .chunks_exact(8)
            .map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default()))
            .collect();
        Ok(())
    }
}

struct Member {
    server: Option<ServerHandle>,
    meta: Arc<Meta<Log>>,
}

/// The cluster secret the three servers share, so that their connections
/// prove membership (docs/safety.md, "What members trust").
fn shared_secret(dir: &std::path::Path) -> std::path::PathBuf {
    let f = dir.join("cluster.secret");
    if !f.exists() {
        strom_server::member_auth::ClusterSecret::generate()
            .and_then(|s| s.write(&f))
            .expect("writing the shared cluster secret");
    }
    f
}

async fn member(dir: &std::path::Path, id: u64) -> Member {
    let config = ServerConfig {
        data_dir: dir.join(format!("server-{id}")),
        cluster_secret_file: Some(shared_secret(dir)),
        ..Default::default()
    };
    let server = Server::start(config).await.expect("starting a server");
    let services = server.services();
    let net = Arc::new(PeerMetaNet::new(services.control.link().clone()));
    let meta = Meta::start(
        id,
        &dir.join(format!("meta-{id}")),
        MetaConfig::default(),
        Log::default(),
        net,
    )
    .await
    .expect("starting the quorum member");
    let meta = Arc::new(meta);
    assert!(services.control.serve_meta(meta.clone()));
    Member {
        server: Some(server),
        meta,
    }
}

async fn leader(members: &[Member]) -> Arc<Meta<Log>> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(m) = members
            .iter()
            .find(|m| m.server.is_some() && m.meta.is_leader())
        {
            return m.meta.clone();
        }
        assert!(Instant::now() < deadline, "no leader within 5 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn converge(members: &[Member], want: &[u64]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let live = members.iter().filter(|m| m.server.is_some());
        if live.clone().all(|m| m.meta.read(|l| l.0 == want)) {
            return;
        }
        assert!(Instant::now() < deadline, "members did not converge");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raft_rpcs_travel_between_real_servers_as_meta_rpc_requests() {
    let tmp = tempfile::tempdir().unwrap();
    let mut members = Vec::new();
    for id in 1..=3 {
        members.push(member(tmp.path(), id).await);
    }
    let voters: BTreeMap<u64, String> = members
        .iter()
        .enumerate()
        .map(|(i, m)| (i as u64 + 1, m.server.as_ref().unwrap().addr().to_string()))
        .collect();
    members[0]
        .meta
        .initialize(voters)
        .await
        .expect("initializing");
    let mut want = Vec::new();
    for n in 0..100u64 {
        leader(&members)
            .await
            .propose(n.to_le_bytes().to_vec())
            .await
            .expect("proposing");
        want.push(n);
    }
    converge(&members, &want).await;

    // Hostile bytes in a MetaRpc: an encoded refusal, and the member goes on.
    let addr = members[1].server.as_ref().unwrap().addr().to_string();
    let driver_side = strom_server::PeerMetaNet::new(
        members[2]
            .server
            .as_ref()
            .unwrap()
            .services()
            .control
            .link()
            .clone(),
    );
    let answer = strom_meta::MetaNet::call(&driver_side, 2, &addr, b"\x01{not json".to_vec())
        .await
        .expect("an answer");
    assert!(
        String::from_utf8_lossy(&answer).contains("Refused"),
        "{answer:?}"
    );

    // The leader's server stops: a new leader within 5 s, and no loss.
    let old = leader(&members).await;
    let i = members
        .iter()
        .position(|m| Arc::ptr_eq(&m.meta, &old))
        .unwrap();
    let server = members[i].server.take().unwrap();
    server.shutdown().await;
    old.shutdown()
        .await
        .expect("stopping the old leader's member");
    let t0 = Instant::now();
    let new = leader(&members).await;
    assert_ne!(new.id(), old.id());
    eprintln!("new leader after {:?}", t0.elapsed());
    for n in 100..120u64 {
        leader(&members)
            .await
            .propose(n.to_le_bytes().to_vec())
            .await
            .expect("proposing after failover");
        want.push(n);
    }
    converge(&members, &want).await;
    let follower = members
        .iter()
        .find(|m| m.server.is_some() && !m.meta.is_leader())
        .unwrap();
    assert!(matches!(
        follower.meta.propose(0u64.to_le_bytes().to_vec()).await,
        Err(MetaError::NotLeader { leader: Some(_) })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_a_quorum_refuses_meta_rpcs() {
    let tmp = tempfile::tempdir().unwrap();
    let config = ServerConfig {
        data_dir: tmp.path().join("server"),
        ..Default::default()
    };
    let server = Server::start(config).await.unwrap();
    let services = server.services();
    let link = services.control.link().clone();
    let req = Request::MetaRpc {
        rpc: bytes::Bytes::from_static(b"\x01{}"),
    };
    match link.peers().call(server.addr(), &req).await {
        Err(e) => {
            assert_eq!(e.code(), ErrorCode::INVALID_ARGUMENT);
            assert!(e.to_string().contains("runs no metadata quorum"), "{e}");
        }
        Ok(other) => panic!("{:?}", other.opcode()),
    }
    server.shutdown().await;
}
