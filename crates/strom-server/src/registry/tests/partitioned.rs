//! The coordinator of partitioned consumer groups through a live
//! [`Registry`] (member 0 hosting the topic, so fences land locally):
//! assignment on join, cooperative revocation that waits for the holder to
//! let go, and new epochs for every handoff.

use std::collections::BTreeMap;

use strom_proto::{ConsumerGroupMode, ConsumerGroupSpec, Response};

use super::super::Registry;
use super::through_registry::link;
use super::*;

/// What a heartbeat answers: partition -> epoch.
async fn beat(r: &Registry, consumer: u64, owned: &BTreeMap<u32, u64>) -> BTreeMap<u32, u64> {
    let owned = owned.iter().map(|(p, e)| (*p, *e)).collect();
    match r
        .consumer_heartbeat("g", consumer, owned, Vec::new())
        .await
        .unwrap()
    {
        Response::ConsumerAssignment { assigned, .. } => assigned.into_iter().collect(),
        other => panic!("unexpected answer {}", other.opcode()),
    }
}

/// A registry with topic `t` of `partitions` partitions and partitioned
/// group `g` on it, joined by one consumer; returns the consumer's id.
async fn one_member_group(
    dir: &std::path::Path,
    partitions: u32,
    session_ms: u32,
) -> (Registry, ConsumerGroupSpec, u64) {
    let r = Registry::open(dir, None, 1, link(dir)).unwrap();
    r.create(TopicSpec::new("t", partitions), Some(0))
        .await
        .unwrap();
    let mut spec = ConsumerGroupSpec::new("g", "t", ConsumerGroupMode::Partitioned);
    spec.session_ms = session_ms;
    let a = r
        .join_group(spec.clone(), None, "a".into())
        .await
        .unwrap()
        .consumer;
    (r, spec, a)
}

#[tokio::test]
async fn a_revoked_partition_moves_only_once_its_holder_lets_go() {
    let tmp = tempfile::tempdir().unwrap();
    let (r, spec, a) = one_member_group(tmp.path(), 4, 60_000).await;
    r.rebalance_groups().await;
    let held_a = beat(&r, a, &BTreeMap::new()).await;
    assert_eq!(held_a.keys().copied().collect::<Vec<_>>(), [0, 1, 2, 3]);

    let b = r.join_group(spec, None, "b".into()).await.unwrap().consumer;
    r.rebalance_groups().await;
    // `a` still reads all four: two are revoked, none moves yet.
    let kept = beat(&r, a, &held_a).await;
    assert_eq!(kept.len(), 2, "{kept:?}");
    r.rebalance_groups().await;
    assert!(
        beat(&r, b, &BTreeMap::new()).await.is_empty(),
        "not before a lets go"
    );
    assert_eq!(beat(&r, a, &held_a).await, kept, "a keeps its two");
    r.rebalance_groups().await;
    assert!(beat(&r, b, &BTreeMap::new()).await.is_empty());

    // `a` gives the two up; the next tick fences them over to `b`.
    beat(&r, a, &kept).await;
    r.rebalance_groups().await;
    let got = beat(&r, b, &BTreeMap::new()).await;
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(
        got.keys().all(|p| !kept.contains_key(p)),
        "b got the revoked ones"
    );
    let old_max = held_a.values().max().unwrap();
    assert!(got.values().all(|e| e > old_max), "new epochs: {got:?}");
    assert_eq!(
        beat(&r, a, &kept).await,
        kept,
        "unmoved partitions keep their epochs"
    );

    // `a` leaves: `b` takes everything at once, under new epochs again.
    r.leave_group("g", a).await.unwrap();
    r.rebalance_groups().await;
    let all = beat(&r, b, &got).await;
    assert_eq!(all.len(), 4, "{all:?}");
    for (p, e) in &got {
        assert_eq!(all[p], *e, "b's own partitions did not move");
    }
}

#[tokio::test]
async fn a_holder_that_never_lets_go_loses_the_partition_after_a_session() {
    let tmp = tempfile::tempdir().unwrap();
    let (r, spec, a) = one_member_group(tmp.path(), 2, 1_000).await;
    r.rebalance_groups().await;
    let held = beat(&r, a, &BTreeMap::new()).await;
    assert_eq!(held.len(), 2);
    let b = r.join_group(spec, None, "b".into()).await.unwrap().consumer;
    r.rebalance_groups().await;
    // `a` heartbeats but keeps listing both: the revoked one stays put...
    beat(&r, a, &held).await;
    r.rebalance_groups().await;
    assert!(beat(&r, b, &BTreeMap::new()).await.is_empty());
    // ...until a session has passed since the revocation.
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    beat(&r, a, &held).await;
    r.rebalance_groups().await;
    assert_eq!(beat(&r, b, &BTreeMap::new()).await.len(), 1);
    assert_eq!(beat(&r, a, &held).await.len(), 1);
}
