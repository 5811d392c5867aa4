//! The quorum as a user of it sees it: elections, replication, failover,
//! redirects, restarts and snapshot catch-up, on real files in temporary
//! directories, over the in-process network of `common`.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{addr, cmd, quick, Cluster};
use strom_meta::{codec, MetaConfig, MetaError};
use tokio::task::JoinSet;

/// Proposes `range` in concurrent waves of 100, following redirects.
async fn propose_all(c: &std::sync::Arc<Cluster>, range: std::ops::Range<u64>) {
    let all: Vec<u64> = range.collect();
    for wave in all.chunks(100) {
        let mut set = JoinSet::new();
        for n in wave {
            let (c, n) = (c.clone(), *n);
            set.spawn(async move { c.propose(cmd(n)).await });
        }
        while let Some(r) = set.join_next().await {
            r.expect("proposal task");
        }
    }
}

fn sorted(mut v: Vec<u64>) -> Vec<u64> {
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_voters_apply_a_thousand_commands_in_the_same_order() {
    let c = std::sync::Arc::new(Cluster::voters(3, quick()).await);
    let leader = c.leader(Duration::from_secs(5)).await;
    propose_all(&c, 0..1000).await;
    c.converge(leader).await;
    let first = c.applied(1);
    assert_eq!(sorted(first.clone()), (0..1000).collect::<Vec<_>>());
    assert_eq!(c.applied(2), first);
    assert_eq!(c.applied(3), first);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leader_death_elects_a_new_leader_within_5s_and_loses_nothing() {
    let c = std::sync::Arc::new(Cluster::voters(3, MetaConfig::default()).await);
    let old = c.leader(Duration::from_secs(5)).await;
    propose_all(&c, 0..100).await;
    c.kill(old).await;
    let killed_at = Instant::now();
    let new = c.leader(Duration::from_secs(5)).await;
    let failover = killed_at.elapsed();
    assert_ne!(new, old);
    assert!(
        failover < Duration::from_secs(5),
        "failover took {failover:?}"
    );
    eprintln!("failover with default settings: {failover:?}");
    propose_all(&c, 100..200).await;
    c.converge(new).await;
    let on_new = c.applied(new);
    assert_eq!(sorted(on_new.clone()), (0..200).collect::<Vec<_>>());
    // The killed leader restarts from its directory and catches up.
    c.start(old).await;
    c.converge(new).await;
    assert_eq!(c.applied(old), on_new);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follower_answers_not_leader_with_the_leaders_id_and_address() {
    let c = Cluster::voters(3, quick()).await;
    let leader = c.leader(Duration::from_secs(5)).await;
    let follower = (1..=3).find(|id| *id != leader).unwrap_or(1);
    match c.node(follower).propose(cmd(7)).await {
        Err(e @ MetaError::NotLeader { .. }) => {
            assert_eq!(e.code(), strom_meta::code::NOT_MASTER);
            let MetaError::NotLeader { leader: hint } = e else {
                unreachable!()
            };
            assert_eq!(hint, Some((leader, addr(leader))));
        }
        other => panic!("a follower accepted a proposal: {other:?}"),
    }
    assert_eq!(
        c.node(leader).propose(cmd(7)).await.expect("leader"),
        1u64.to_le_bytes()
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn restarting_every_member_restores_the_same_state() {
    let c = std::sync::Arc::new(Cluster::voters(3, quick()).await);
    let leader = c.leader(Duration::from_secs(5)).await;
    propose_all(&c, 0..300).await;
    c.converge(leader).await;
    let before = c.applied(leader);
    c.shutdown().await;
    for id in 1..=3 {
        c.start(id).await;
    }
    let leader = c.leader(Duration::from_secs(5)).await;
    // A new leader commits a blank entry first, which re-applies the log.
    c.propose(cmd(300)).await;
    c.converge(leader).await;
    for id in 1..=3 {
        let after = c.applied(id);
        assert_eq!(after[..300], before[..], "member {id}");
        assert_eq!(after[300..], [300], "member {id}");
    }
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_member_down_while_the_log_was_purged_catches_up_by_snapshot() {
    let config = MetaConfig {
        snapshot_every: 20,
        keep_after_snapshot: 0,
        ..quick()
    };
    let c = std::sync::Arc::new(Cluster::voters(3, config).await);
    let leader = c.leader(Duration::from_secs(5)).await;
    let down = (1..=3).find(|id| *id != leader).unwrap_or(1);
    propose_all(&c, 0..10).await;
    c.converge(leader).await;
    let down_applied = c.node(down).metrics().last_applied.map_or(0, |l| l.index);
    c.kill(down).await;
    propose_all(&c, 10..200).await;
    let purged = wait_purged_past(&c, leader, down_applied).await;
    eprintln!("leader purged its log up to {purged}; member {down} had applied {down_applied}");
    c.start(down).await;
    c.converge(leader).await;
    let m = c.node(down).metrics();
    let snap = m.snapshot.map_or(0, |l| l.index);
    assert!(
        snap > down_applied,
        "member {down} did not install a snapshot: {m:?}"
    );
    assert_eq!(c.applied(down), c.applied(leader));
    assert_eq!(sorted(c.applied(down)), (0..200).collect::<Vec<_>>());
    c.shutdown().await;
}

/// Waits until `leader` has purged its log past `index`; returns how far.
async fn wait_purged_past(c: &Cluster, leader: u64, index: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let purged = c.node(leader).metrics().purged.map_or(0, |l| l.index);
        if purged > index {
            return purged;
        }
        assert!(
            Instant::now() < deadline,
            "the leader never purged past {index}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The mean time of a 100-byte append and fdatasync in `dir`, to print a
/// proposal's cost next to what the disk alone costs.
fn fdatasync_latency(dir: &std::path::Path) -> Duration {
    use std::io::Write;
    let path = dir.join("fdatasync-probe");
    let mut f = std::fs::File::create(&path).expect("probe file");
    let start = Instant::now();
    for _ in 0..200 {
        f.write_all(&[7u8; 100]).expect("write");
        f.sync_data().expect("fdatasync");
    }
    let per = start.elapsed() / 200;
    let _ = std::fs::remove_file(&path);
    per
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_voter_commits_alone_and_survives_a_restart() {
    let c = Cluster::voters(1, MetaConfig::default()).await;
    c.leader(Duration::from_secs(5)).await;
    let start = Instant::now();
    for n in 0..200 {
        c.node(1).propose(cmd(n)).await.expect("propose");
    }
    let per = start.elapsed() / 200;
    eprintln!(
        "one voter: {per:?} per sequential proposal; a plain append + fdatasync here: {:?}",
        fdatasync_latency(&c.dir(1))
    );
    c.kill(1).await;
    c.start(1).await;
    c.leader(Duration::from_secs(5)).await;
    c.node(1)
        .propose(cmd(200))
        .await
        .expect("propose after restart");
    assert_eq!(c.applied(1), (0..=200).collect::<Vec<_>>());
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_and_oversized_commands_are_typed_errors() {
    let c = Cluster::voters(1, quick()).await;
    c.leader(Duration::from_secs(5)).await;
    let node = c.node(1);
    match node.propose(vec![1, 2, 3]).await {
        Err(e @ MetaError::Rejected(_)) => assert!(e.to_string().contains("3 bytes"), "{e}"),
        other => panic!("{other:?}"),
    }
    let big = vec![0u8; MetaConfig::default().max_command + 1];
    assert!(matches!(
        node.propose(big).await,
        Err(MetaError::TooLarge { .. })
    ));
    let again = node.initialize(BTreeMap::from([(1, addr(1))])).await;
    assert!(
        matches!(again, Err(MetaError::AlreadyInitialized)),
        "{again:?}"
    );
    // The refused command left no trace; the next one is the first applied.
    assert_eq!(
        node.propose(cmd(9)).await.expect("propose"),
        1u64.to_le_bytes()
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_rpc_bytes_get_a_refusal_and_the_member_carries_on() {
    let c = Cluster::voters(1, quick()).await;
    c.leader(Duration::from_secs(5)).await;
    let node = c.node(1);
    for bytes in [
        &b""[..],
        b"\x01",
        b"\x01{",
        b"\x09{}",
        b"\x01{\"Vote\":17}",
        &[0xff; 64],
    ] {
        let answer = node.handle(bytes).await;
        let reply: strom_meta::codec::RpcReply =
            strom_meta::codec::decode_rpc(&answer, "answer").expect("the answer decodes");
        assert!(
            matches!(reply, strom_meta::codec::RpcReply::Refused(_)),
            "{reply:?}"
        );
    }
    // Well-formed, but far past any data: it would size an allocation.
    let far = codec::Rpc::InstallSnapshot(codec::SnapshotChunk {
        vote: node.metrics().vote,
        meta: Default::default(),
        offset: 1 << 50,
        data: strom_meta::types::Blob(vec![1; 16]),
        done: true,
    });
    let answer = node.handle(&codec::encode_rpc(&far).expect("encode")).await;
    let reply: codec::RpcReply = codec::decode_rpc(&answer, "answer").expect("the answer decodes");
    assert!(
        matches!(reply, codec::RpcReply::InstallSnapshot(Err(_))),
        "{reply:?}"
    );
    node.propose(cmd(1)).await.expect("still serving");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_learner_catches_up_and_becomes_a_voter_in_place_of_another() {
    let c = std::sync::Arc::new(Cluster::voters(3, quick()).await);
    let leader = c.leader(Duration::from_secs(5)).await;
    propose_all(&c, 0..50).await;
    c.start(4).await;
    c.node(leader)
        .add_learner(4, addr(4))
        .await
        .expect("add learner");
    let gone = (1..=3).find(|id| *id != leader).unwrap_or(1);
    let voters = (1..=4).filter(|id| *id != gone).collect();
    c.node(leader)
        .change_membership(voters)
        .await
        .expect("change membership");
    c.kill(gone).await;
    propose_all(&c, 50..60).await;
    c.converge(leader).await;
    assert_eq!(c.applied(4), c.applied(leader));
    assert_eq!(c.applied(4).len(), 60);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lagging_member_catches_up_on_entries_too_large_for_one_rpc() {
    // Each append-entries round trip must fit in a heartbeat: this debug
    // build hex-encodes a 1 MiB command slowly.
    let slow = MetaConfig {
        heartbeat: Duration::from_millis(500),
        election_timeout_min: Duration::from_millis(1500),
        election_timeout_max: Duration::from_millis(3000),
        ..MetaConfig::default()
    };
    let c = std::sync::Arc::new(Cluster::voters(3, slow).await);
    let leader = c.leader(Duration::from_secs(5)).await;
    let down = (1..=3).find(|id| *id != leader).unwrap_or(1);
    c.kill(down).await;
    // Four commands of the largest size, 8 MiB of hex: far over one
    // append-entries RPC's 1 MiB. The machine refuses them, but they are
    // in the log all the same.
    let big = vec![7u8; MetaConfig::default().max_command];
    for _ in 0..4 {
        let r = c.node(leader).propose(big.clone()).await;
        assert!(matches!(r, Err(MetaError::Rejected(_))), "{r:?}");
    }
    c.node(leader).propose(cmd(1)).await.expect("propose");
    c.start(down).await;
    c.converge(leader).await;
    assert_eq!(c.applied(down), [1]);
    c.shutdown().await;
}
