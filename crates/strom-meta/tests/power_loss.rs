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
