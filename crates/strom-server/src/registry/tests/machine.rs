//! The pure state machine: determinism, validation, and the JSON round trip.

use super::*;

#[test]
fn replaying_the_same_commands_gives_the_same_state() {
    for seed in 0..20 {
        let history = random_history(seed, 200);
        let replay = |cmds: &[RegistryCommand]| {
            let mut st = RegistryState::default();
            for c in cmds {
                st.apply(c).unwrap();
            }
            st
        };
        let a = replay(&history);
        // Through JSON, as the log stores them.
        let decoded: Vec<RegistryCommand> = history
            .iter()
            .map(|c| serde_json::from_slice(&serde_json::to_vec(c).unwrap()).unwrap())
            .collect();
        let b = replay(&decoded);
        assert_eq!(a, b, "seed {seed}");
        assert!(!a.topics.is_empty() || history.len() < 10, "seed {seed}");
        // A snapshot of the state reads back as the same state.
        let json = serde_json::to_vec(&a.to_persisted()).unwrap();
        let back = RegistryState::from_persisted(serde_json::from_slice(&json).unwrap()).unwrap();
        assert_eq!(a, back, "seed {seed}");
    }
}

#[test]
fn a_rejected_command_leaves_the_state_unchanged() {
    let history = random_history(7, 100);
    let mut st = RegistryState::default();
    for c in &history {
        st.apply(c).unwrap();
    }
    let t = st.topics.values().next().unwrap().clone();
    let bad = [
        RegistryCommand::SetGroupId { group_id: 0 },
        create(&st, &t.spec.name, vec![0]),
        RegistryCommand::CreateTopic {
            meta: Box::new(TopicMeta {
                id: st.next_topic_id - 1,
                ..match create(&st, "fresh-name", vec![0]) {
                    RegistryCommand::CreateTopic { meta } => *meta,
                    _ => unreachable!(),
                }
            }),
        },
        create(&st, "no-partitions", vec![]),
        RegistryCommand::DeleteTopic {
            name: "missing".into(),
        },
        RegistryCommand::RegisterProducer {
            topic: t.spec.name.clone(),
            producer: t.next_producer - 1,
            lease_ms: None,
        },
        RegistryCommand::ExpireProducer {
            topic: t.spec.name.clone(),
            producer: u64::MAX,
        },
        RegistryCommand::CloseProducer {
            topic: t.spec.name.clone(),
            producer: u64::MAX,
        },
        RegistryCommand::AddPartitions {
            topic: t.spec.name.clone(),
            placement: vec![],
            replicas: vec![],
        },
        // A topic without replica sets takes no replica sets.
        RegistryCommand::AddPartitions {
            topic: t.spec.name.clone(),
            placement: vec![0],
            replicas: vec![super::super::replica_machine::ReplicaSet::one(0)],
        },
        RegistryCommand::MemberAddress {
            id: 999,
            addr: "x".into(),
        },
    ];
    for cmd in bad {
        let before = st.clone();
        assert!(st.apply(&cmd).is_err(), "{cmd:?} should be rejected");
        assert_eq!(st, before, "{cmd:?} changed the state");
    }
}

#[test]
fn group_id_is_set_once() {
    let mut st = RegistryState::default();
    st.apply(&RegistryCommand::SetGroupId { group_id: 42 })
        .unwrap();
    assert_eq!(st.group_id, 42);
    assert!(st
        .apply(&RegistryCommand::SetGroupId { group_id: 43 })
        .is_err());
    assert_eq!(st.group_id, 42);
}
