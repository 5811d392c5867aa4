//! A full disk on one voter blocks nothing: the other two keep committing,
//! whether the full one follows (its appends fail and it stops) or leads
//! (it stops, and the other two elect a leader and go on). What was
//! committed before stays, in order.

mod common;

use std::time::Duration;

use common::{cmd, quick, Cluster};
use strom_storage::sim::{Fault, FaultOp};

/// `ENOSPC` (Linux), on every write of that disk from now on.
fn full() -> Fault {
    Fault {
        op: FaultOp::Write,
        errno: 28,
        path_contains: String::new(),
        times: None,
    }
}

/// Commands `0..n`, proposed at whichever healthy member leads.
async fn propose_all(c: &Cluster, range: std::ops::Range<u64>) {
    for n in range {
        c.propose(cmd(n)).await;
    }
}

/// The commands member `id` applied are exactly `0..n`, in order.
async fn applied_all(c: &Cluster, id: u64, n: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let got = c.applied(id);
        if got == (0..n).collect::<Vec<_>>() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "member {id} applied {} commands, not 0..{n} in order",
            got.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_on_a_follower_blocks_nothing() {
    let c = Cluster::voters_on_sim(3, quick()).await;
    let leader = c.leader(Duration::from_secs(5)).await;
    propose_all(&c, 0..20).await;
    let victim = (1..=3).find(|id| *id != leader).unwrap();
    c.disk(victim).inject(full());
    propose_all(&c, 20..120).await;
    for id in (1..=3).filter(|id| *id != victim) {
        applied_all(&c, id, 120).await;
    }
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_on_the_leader_hands_over_and_blocks_nothing() {
    let c = Cluster::voters_on_sim(3, quick()).await;
    let leader = c.leader(Duration::from_secs(5)).await;
    propose_all(&c, 0..20).await;
    c.disk(leader).inject(full());
    propose_all(&c, 20..120).await;
    for id in (1..=3).filter(|id| *id != leader) {
        applied_all(&c, id, 120).await;
    }
    c.shutdown().await;
}
