//! The machine's side of moving partitions and members leaving: which
//! steps of a move it accepts, in which order, and what it keeps.

use super::*;
use crate::registry::member_machine::MemberCommand;
use crate::registry::replica_machine::{ReplicaCommand, ReplicaSet};

/// Members 0-3, and topic `t` of one partition on [0, 1, 2], led by 0.
fn state() -> RegistryState {
    let mut st = RegistryState::default();
    for id in 0..4 {
        st.apply(&RegistryCommand::MemberJoined {
            id,
            addr: format!("h:{id}"),
        })
        .unwrap();
    }
    let RegistryCommand::CreateTopic { mut meta } = create(&st, "t", vec![0]) else {
        unreachable!()
    };
    meta.spec.replication_factor = 3;
    meta.replicas = vec![ReplicaSet {
        members: vec![0, 1, 2],
        epoch: 1,
        isr: vec![0, 1, 2],
        target: None,
    }];
    st.apply(&RegistryCommand::CreateTopic { meta }).unwrap();
    st
}

fn r(cmd: ReplicaCommand) -> RegistryCommand {
    RegistryCommand::Replica(cmd)
}

fn members(members: &[u32], isr: &[u32]) -> RegistryCommand {
    r(ReplicaCommand::Members {
        topic: "t".into(),
        partition: 0,
        members: members.to_vec(),
        isr: isr.to_vec(),
    })
}

fn leader(leader: u32, epoch: u64, isr: &[u32]) -> RegistryCommand {
    r(ReplicaCommand::Leader {
        topic: "t".into(),
        partition: 0,
        leader,
        epoch,
        isr: isr.to_vec(),
    })
}

fn set(st: &RegistryState) -> &ReplicaSet {
    &st.topics["t"].replicas[0]
}

#[test]
fn a_move_adds_the_new_copy_moves_the_leadership_then_drops_the_old_copy() {
    let mut st = state();
    let target = r(ReplicaCommand::Target {
        topic: "t".into(),
        partition: 0,
        target: Some(vec![3, 1, 2]),
    });
    st.apply(&target).unwrap();
    st.apply(&members(&[0, 1, 2, 3], &[0, 1, 2])).unwrap();
    // Not in sync yet: it cannot lead.
    assert!(st.apply(&leader(3, 2, &[0, 1, 2])).is_err());
    st.apply(&r(ReplicaCommand::Isr {
        topic: "t".into(),
        partition: 0,
        epoch: 1,
        isr: vec![0, 1, 2, 3],
    }))
    .unwrap();
    st.apply(&leader(3, 2, &[0, 1, 2, 3])).unwrap();
    assert_eq!(st.topics["t"].placement, [3]);
    // The old copy cannot stay out of the replicas while in sync.
    assert!(st.apply(&members(&[3, 1, 2], &[0, 1, 2, 3])).is_err());
    st.apply(&members(&[3, 1, 2], &[1, 2, 3])).unwrap();
    assert_eq!(set(&st).members, [3, 1, 2]);
    assert_eq!(set(&st).target, None, "the move ended");
    assert_eq!(set(&st).epoch, 2);
}

#[test]
fn bad_replica_sets_and_targets_are_refused() {
    let mut st = state();
    let before = st.clone();
    let bad = [
        // The leader must stay a replica, in sync.
        members(&[1, 2, 3], &[1, 2]),
        members(&[0, 1, 1], &[0, 1]),
        members(&[0, 1], &[0, 1, 2]),
        r(ReplicaCommand::Target {
            topic: "t".into(),
            partition: 0,
            target: Some(vec![0, 9, 2]),
        }),
        r(ReplicaCommand::Target {
            topic: "t".into(),
            partition: 0,
            target: Some(vec![0, 0, 2]),
        }),
        r(ReplicaCommand::Target {
            topic: "t".into(),
            partition: 0,
            target: Some(vec![]),
        }),
        r(ReplicaCommand::Target {
            topic: "t".into(),
            partition: 1,
            target: None,
        }),
    ];
    for cmd in bad {
        assert!(st.apply(&cmd).is_err(), "{cmd:?}");
        assert_eq!(st, before, "{cmd:?} left the state unchanged");
    }
}

#[test]
fn a_member_leaves_only_once_it_holds_nothing_and_never_comes_back() {
    let mut st = state();
    let left = RegistryCommand::Member(MemberCommand::Left { id: 2 });
    st.apply(&RegistryCommand::Member(MemberCommand::Draining {
        id: 2,
        dead: false,
    }))
    .unwrap();
    assert!(st.apply(&left).is_err(), "member 2 still holds a copy");
    st.apply(&members(&[0, 1, 2, 3], &[0, 1, 2])).unwrap();
    st.apply(&members(&[0, 1, 3], &[0, 1])).unwrap();
    st.apply(&left).unwrap();
    assert!(!st.members.contains_key(&2));
    assert!(st.draining.is_empty());
    let back = RegistryCommand::MemberJoined {
        id: 2,
        addr: "h:2".into(),
    };
    assert!(st.apply(&back).is_err(), "a member that left cannot rejoin");
    // What a snapshot keeps.
    st.apply(&RegistryCommand::Member(MemberCommand::Draining {
        id: 3,
        dead: true,
    }))
    .unwrap();
    st.apply(&r(ReplicaCommand::Target {
        topic: "t".into(),
        partition: 0,
        target: Some(vec![0, 1, 3]),
    }))
    .unwrap();
    let json = serde_json::to_vec(&st.to_persisted()).unwrap();
    let again = RegistryState::from_persisted(serde_json::from_slice(&json).unwrap()).unwrap();
    assert_eq!(again, st);
    assert!(again.removed.contains(&2));
    assert_eq!(again.draining.get(&3), Some(&true));
}
