//! Power loss on simulated disks that keep only what was synced (plus a
//! random, possibly torn, part of the rest): every command acknowledged
//! before the crash is still there, in the same order, after a restart.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{cmd, quick, Cluster};
use parking_lot::Mutex;
use strom_storage::sim::SimRng;

/// Proposes 0, 1, 2, ... in order until stopped; records what was acked.
fn proposer(c: Arc<Cluster>, acked: Arc<Mutex<Vec<u64>>>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        for n in 0.. {
            let leader = c.live().into_iter().find(|id| c.node(*id).is_leader());
            let Some(leader) = leader else {
                tokio::time::sleep(Duration::from_millis(5)).await;
                continue;
            };
            match c.node(leader).propose(cmd(n)).await {
                Ok(_) => acked.lock().push(n),
                Err(_) => return,
            }
        }
    })
}

async fn acked_commands_survive_power_loss(voters: u64, seed: u64) {
    let config = strom_meta::MetaConfig {
        snapshot_every: 25,
        keep_after_snapshot: 5,
        ..quick()
    };
    let c = Arc::new(Cluster::voters_on_sim(voters, config).await);
    c.leader(Duration::from_secs(5)).await;
    let acked = Arc::new(Mutex::new(Vec::new()));
    let task = proposer(c.clone(), acked.clone());
    let mut rng = SimRng::new(seed);
    tokio::time::sleep(Duration::from_millis(50 + rng.below(150))).await;
    // Everything acknowledged so far was synced on a quorum before this.
    let before: Vec<u64> = acked.lock().clone();
    c.power_loss(&mut rng).await;
    task.abort();
    for id in 1..=voters {
        c.start(id).await;
    }
    let leader = c.leader(Duration::from_secs(5)).await;
    c.node(leader)
        .propose(cmd(u64::MAX))
        .await
        .expect("propose after the crash");
    c.converge(leader).await;
    for id in 1..=voters {
        let after = c.applied(id);
        let kept = after
            .iter()
            .zip(&before)
            .take_while(|(a, b)| a == b)
            .count();
        assert!(
            kept == before.len() && after.len() > before.len(),
            "seed {seed}, member {id}: {} commands were acknowledged before the crash; \
             after it, the first {kept} of them are in place, out of {} applied",
            before.len(),
            after.len()
        );
        // Commands never acknowledged may survive too, in order, and nothing else.
        let n = after.len() - 1;
        assert_eq!(
            after[..n],
            (0..n as u64).collect::<Vec<_>>()[..],
            "seed {seed}, member {id}"
        );
    }
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_voter_keeps_every_acknowledged_command_through_power_loss() {
    for seed in 1..=8 {
        acked_commands_survive_power_loss(1, seed).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_voters_keep_every_acknowledged_command_through_power_loss() {
    for seed in 1..=5 {
        acked_commands_survive_power_loss(3, seed).await;
    }
}

/// A follower cut off long enough gets the leader's snapshot instead of
/// entries; openraft purges the log the snapshot covers as it hands the
/// snapshot to the state machine. Power lost at any point of that must
/// leave a member that starts again: never a log purged past its snapshot.
async fn snapshot_install_survives_power_loss(crash_after: u64, seed: u64) {
    let config = strom_meta::MetaConfig {
        snapshot_every: 10,
        keep_after_snapshot: 0,
        ..quick()
    };
    let c = Cluster::voters_on_sim(3, config).await;
    let leader = c.leader(Duration::from_secs(5)).await;
    let behind = if leader == 3 { 2 } else { 3 };
    c.cut(behind, true);
    for n in 0..60 {
        c.propose(cmd(n)).await;
    }
    c.disk(behind).crash_after(crash_after);
    c.cut(behind, false);
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    while !c.disk(behind).crashed() && c.applied(behind).len() < 60 {
        assert!(
            std::time::Instant::now() < deadline,
            "member {behind} never caught up"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    c.power_loss_of(behind, &mut SimRng::new(seed)).await;
    c.start(behind).await;
    c.propose(cmd(60)).await;
    let leader = c.leader(Duration::from_secs(5)).await;
    c.converge(leader).await;
    assert_eq!(
        c.applied(behind),
        (0..=60).collect::<Vec<u64>>(),
        "crash after {crash_after} operations, seed {seed}"
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follower_installing_a_snapshot_survives_power_loss_at_every_step() {
    for crash_after in 1..=14 {
        snapshot_install_survives_power_loss(crash_after, crash_after).await;
    }
}
