//! Consumer groups in the registry's state machine: each group's spec, its
//! members, and (partitioned groups) which member holds which partition
//! under which epoch. Pure, like `machine`: every id and epoch is chosen by
//! the operation and recorded in the command.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use strom_proto::ConsumerGroupSpec;

use super::machine::{RegistryState, Rejected};

/// One consumer group as the registry records it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ConsumerGroupMeta {
    pub spec: ConsumerGroupSpec,
    /// Bumped whenever a consumer joins or leaves.
    pub generation: u64,
    /// Consumer ids are never reused.
    pub next_consumer: u64,
    /// Epochs only grow, across every partition of the group.
    pub max_epoch: u64,
    /// consumer id -> label
    pub consumers: BTreeMap<u64, String>,
    /// Partitioned groups: partition -> (consumer, epoch).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub assignment: BTreeMap<u32, (u64, u64)>,
    /// Partitioned groups: partition -> end offset, once read and committed
    /// to the end of the stream.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub done: BTreeMap<u32, u64>,
}

impl ConsumerGroupMeta {
    pub fn new(spec: ConsumerGroupSpec) -> Self {
        ConsumerGroupMeta {
            spec,
            generation: 0,
            next_consumer: 1,
            max_epoch: 0,
            consumers: BTreeMap::new(),
            assignment: BTreeMap::new(),
            done: BTreeMap::new(),
        }
    }
}

/// A change to the registry's consumer groups.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum GroupCommand {
    Create {
        spec: ConsumerGroupSpec,
    },
    Delete {
        name: String,
    },
    /// A consumer joined under `consumer` (new, or a rejoin of an old id).
    Joined {
        group: String,
        consumer: u64,
        label: String,
    },
    /// A consumer left or its session expired; its partitions are freed.
    Left {
        group: String,
        consumer: u64,
    },
    /// Partitioned: nobody holds `partition` now.
    Released {
        group: String,
        partition: u32,
    },
    /// Partitioned: `consumer` holds `partition` under `epoch`.
    Assigned {
        group: String,
        partition: u32,
        consumer: u64,
        epoch: u64,
    },
    /// Partitioned: `partition` was read and committed up to its end.
    Done {
        group: String,
        partition: u32,
        end: u64,
    },
}

fn group<'a>(st: &'a RegistryState, name: &str) -> Result<&'a ConsumerGroupMeta, Rejected> {
    st.consumer_groups
        .get(name)
        .ok_or_else(|| Rejected(format!("no consumer group named '{name}'")))
}

/// Whether `cmd` applies to `st`.
pub fn check(st: &RegistryState, cmd: &GroupCommand) -> Result<(), Rejected> {
    use GroupCommand as G;
    let fail = |why: String| Err(Rejected(why));
    match cmd {
        G::Create { spec } => {
            st.topic(&spec.topic)?;
            if st.consumer_groups.contains_key(&spec.name) {
                return fail(format!("consumer group '{}' already exists", spec.name));
            }
        }
        G::Delete { name } => {
            group(st, name)?;
        }
        G::Joined {
            group: g, consumer, ..
        } => {
            let meta = group(st, g)?;
            if *consumer == 0 || *consumer == u64::MAX {
                return fail(format!("consumer id {consumer} is not allowed"));
            }
            if meta.consumers.contains_key(consumer) {
                return fail(format!(
                    "consumer {consumer} of group '{g}' is already a member"
                ));
            }
        }
        G::Left { group: g, consumer } => {
            if !group(st, g)?.consumers.contains_key(consumer) {
                return fail(format!("consumer group '{g}' has no consumer {consumer}"));
            }
        }
        G::Released {
            group: g,
            partition,
        } => {
            if !group(st, g)?.assignment.contains_key(partition) {
                return fail(format!("partition {partition} of group '{g}' is not held"));
            }
        }
        G::Assigned {
            group: g,
            partition,
            consumer,
            epoch,
        } => {
            let meta = group(st, g)?;
            let partitions = st.topic(&meta.spec.topic)?.spec.partitions;
            if *partition >= partitions {
                return fail(format!("group '{g}': no partition {partition}"));
            }
            if !meta.consumers.contains_key(consumer) {
                return fail(format!("consumer group '{g}' has no consumer {consumer}"));
            }
            if meta.assignment.contains_key(partition) {
                return fail(format!("partition {partition} of group '{g}' is held"));
            }
            if *epoch <= meta.max_epoch {
                return fail(format!(
                    "epoch {epoch} of group '{g}' is not above {}",
                    meta.max_epoch
                ));
            }
        }
        G::Done { group: g, .. } => {
            group(st, g)?;
        }
    }
    Ok(())
}

/// Applies a command that [`check`] accepted on this very state.
pub fn apply(st: &mut RegistryState, cmd: &GroupCommand) {
    use GroupCommand as G;
    let groups = &mut st.consumer_groups;
    match cmd {
        G::Create { spec } => {
            groups.insert(spec.name.clone(), ConsumerGroupMeta::new(spec.clone()));
        }
        G::Delete { name } => {
            groups.remove(name);
        }
        G::Joined {
            group,
            consumer,
            label,
        } => {
            if let Some(m) = groups.get_mut(group) {
                m.consumers.insert(*consumer, label.clone());
                m.next_consumer = m.next_consumer.max(consumer + 1);
                m.generation += 1;
            }
        }
        G::Left { group, consumer } => {
            if let Some(m) = groups.get_mut(group) {
                m.consumers.remove(consumer);
                m.assignment.retain(|_, (c, _)| c != consumer);
                m.generation += 1;
            }
        }
        G::Released { group, partition } => {
            if let Some(m) = groups.get_mut(group) {
                m.assignment.remove(partition);
            }
        }
        G::Assigned {
            group,
            partition,
            consumer,
            epoch,
        } => {
            if let Some(m) = groups.get_mut(group) {
                m.assignment.insert(*partition, (*consumer, *epoch));
                m.max_epoch = *epoch;
            }
        }
        G::Done {
            group,
            partition,
            end,
        } => {
            if let Some(m) = groups.get_mut(group) {
                m.done.insert(*partition, *end);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::machine::{RegistryCommand, RegistryState};
    use super::*;
    use strom_proto::ConsumerGroupMode;

    fn state_with_group() -> RegistryState {
        let mut st = RegistryState::default();
        let create = super::super::tests::create(&st, "t", vec![0; 4]);
        st.apply(&create).unwrap();
        let spec = ConsumerGroupSpec::new("g", "t", ConsumerGroupMode::Partitioned);
        st.apply(&RegistryCommand::ConsumerGroup(GroupCommand::Create {
            spec,
        }))
        .unwrap();
        st
    }

    fn g(cmd: GroupCommand) -> RegistryCommand {
        RegistryCommand::ConsumerGroup(cmd)
    }

    #[test]
    fn joins_leaves_and_epochs_are_checked_and_survive_persistence() {
        let mut st = state_with_group();
        let join = |c: u64| {
            g(GroupCommand::Joined {
                group: "g".into(),
                consumer: c,
                label: format!("w{c}"),
            })
        };
        st.apply(&join(1)).unwrap();
        assert!(st.apply(&join(1)).is_err(), "a member cannot join twice");
        st.apply(&join(2)).unwrap();
        let assign = |p: u32, c: u64, e: u64| {
            g(GroupCommand::Assigned {
                group: "g".into(),
                partition: p,
                consumer: c,
                epoch: e,
            })
        };
        st.apply(&assign(0, 1, 1)).unwrap();
        assert!(st.apply(&assign(1, 2, 1)).is_err(), "epochs only grow");
        assert!(st.apply(&assign(0, 2, 5)).is_err(), "a held partition");
        assert!(st.apply(&assign(9, 2, 5)).is_err(), "no such partition");
        st.apply(&assign(1, 2, 2)).unwrap();
        st.apply(&g(GroupCommand::Left {
            group: "g".into(),
            consumer: 1,
        }))
        .unwrap();
        let m = &st.consumer_groups["g"];
        assert_eq!(m.generation, 3);
        assert_eq!(m.next_consumer, 3);
        assert_eq!(m.assignment.len(), 1, "the leaver's partitions are freed");
        let back = RegistryState::from_persisted(
            serde_json::from_slice(&serde_json::to_vec(&st.to_persisted()).unwrap()).unwrap(),
        )
        .unwrap();
        assert_eq!(back, st);
        st.apply(&RegistryCommand::DeleteTopic { name: "t".into() })
            .unwrap();
        assert!(st.consumer_groups.is_empty(), "a topic's groups go with it");
    }
}
