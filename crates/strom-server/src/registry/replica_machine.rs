//! The registry's record of replicated partitions (docs/replication.md):
//! each partition's replicas, its leader epoch and its in-sync replicas,
//! and the commands that change them. Pure, as the rest of the machine.
//! The leader of partition `p` is `TopicMeta::placement[p]`, so routing
//! needs nothing new; a failover changes it and bumps the epoch.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::machine::{RegistryState, Rejected, TopicMeta};

/// The copies of one partition.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ReplicaSet {
    /// Every replica's member, in placement order.
    pub members: Vec<u32>,
    /// The leader epoch: bumped by every change of leader.
    pub epoch: u64,
    /// The replicas in sync with the leader, the leader included.
    pub isr: Vec<u32>,
    /// The replicas this partition is moving to (docs/elasticity.md), its
    /// wanted leader first; `None` when it is not moving.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<Vec<u32>>,
}

impl ReplicaSet {
    /// One copy, on `member`, in sync, in epoch 1.
    pub fn one(member: u32) -> ReplicaSet {
        ReplicaSet {
            members: vec![member],
            epoch: 1,
            isr: vec![member],
            target: None,
        }
    }

    /// Whether the set is well formed for leader `leader`: distinct
    /// replicas holding the in-sync ones, the leader among those.
    pub(super) fn fits(&self, leader: u32) -> bool {
        well_formed(&self.members, &self.isr, leader)
    }
}

/// A change to a replicated partition.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum ReplicaCommand {
    /// `leader` (an in-sync replica) leads from `epoch` on, with `isr`.
    Leader {
        topic: String,
        partition: u32,
        leader: u32,
        epoch: u64,
        isr: Vec<u32>,
    },
    /// The leader of `epoch` reports its in-sync replicas.
    Isr {
        topic: String,
        partition: u32,
        epoch: u64,
        isr: Vec<u32>,
    },
    /// A topic without replication gets a replica set of one copy (its
    /// owner) for each partition, so that its partitions can move.
    Replicate { topic: String },
    /// The partition is to move to `target` (`None`: the move is
    /// cancelled, or done).
    Target {
        topic: String,
        partition: u32,
        target: Option<Vec<u32>>,
    },
    /// The replicas are now `members`, in sync `isr` (a move adds its new
    /// replicas, then drops the old ones); the leader stays. The move ends
    /// once `members` is its target.
    Members {
        topic: String,
        partition: u32,
        members: Vec<u32>,
        isr: Vec<u32>,
    },
}

impl ReplicaCommand {
    /// The partition the command changes.
    pub fn partition(&self) -> (&str, u32) {
        match self {
            ReplicaCommand::Leader {
                topic, partition, ..
            }
            | ReplicaCommand::Isr {
                topic, partition, ..
            }
            | ReplicaCommand::Target {
                topic, partition, ..
            }
            | ReplicaCommand::Members {
                topic, partition, ..
            } => (topic, *partition),
            ReplicaCommand::Replicate { topic } => (topic, 0),
        }
    }
}

/// Distinct replicas that hold the in-sync ones, `leader` among those.
fn well_formed(members: &[u32], isr: &[u32], leader: u32) -> bool {
    distinct(members) && isr.contains(&leader) && isr.iter().all(|m| members.contains(m))
}

/// Whether `members` names each member once, and at most 255 of them.
fn distinct(members: &[u32]) -> bool {
    let mut seen = std::collections::BTreeSet::new();
    members.len() <= 255 && members.iter().all(|m| seen.insert(*m))
}

impl TopicMeta {
    /// Member -> every partition it holds a copy of (leader or follower).
    pub fn holders(&self) -> BTreeMap<u32, Vec<u32>> {
        if self.replicas.is_empty() {
            return self.by_member();
        }
        let mut m: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for (p, set) in self.replicas.iter().enumerate() {
            for member in &set.members {
                m.entry(*member).or_default().push(p as u32);
            }
        }
        m
    }

    /// The invariants of the replica sets.
    pub(super) fn check_replicas(&self) -> Result<(), Rejected> {
        if self.replicas.is_empty() {
            return Ok(());
        }
        let bad = |why: String| Err(Rejected(format!("topic '{}': {why}", self.spec.name)));
        if self.replicas.len() != self.placement.len() {
            return bad(format!(
                "{} replica sets for {} partitions",
                self.replicas.len(),
                self.placement.len()
            ));
        }
        for (p, set) in self.replicas.iter().enumerate() {
            let leader = self.placement[p];
            if !set.isr.contains(&leader) || set.isr.iter().any(|m| !set.members.contains(m)) {
                return bad(format!(
                    "partition {p}: leader {leader} and in-sync replicas {:?} must be among its replicas {:?}",
                    set.isr, set.members
                ));
            }
        }
        Ok(())
    }
}

fn set_of<'a>(
    state: &'a RegistryState,
    topic: &str,
    partition: u32,
) -> Result<(&'a TopicMeta, &'a ReplicaSet), Rejected> {
    let t = state
        .topics
        .get(topic)
        .ok_or_else(|| Rejected(format!("no topic named '{topic}'")))?;
    let set = t
        .replicas
        .get(partition as usize)
        .ok_or_else(|| Rejected(format!("partition {topic}/{partition} is not replicated")))?;
    Ok((t, set))
}

pub(super) fn check(state: &RegistryState, cmd: &ReplicaCommand) -> Result<(), Rejected> {
    match cmd {
        ReplicaCommand::Leader {
            topic,
            partition,
            leader,
            epoch,
            isr,
        } => {
            let (_, set) = set_of(state, topic, *partition)?;
            if *epoch <= set.epoch {
                return Err(Rejected(format!(
                    "partition {topic}/{partition}: epoch {epoch} is not after {}",
                    set.epoch
                )));
            }
            if !isr.contains(leader) || isr.iter().any(|m| !set.members.contains(m)) {
                return Err(Rejected(format!(
                    "partition {topic}/{partition}: leader {leader} and {isr:?} must be among {:?}",
                    set.members
                )));
            }
        }
        ReplicaCommand::Isr {
            topic,
            partition,
            epoch,
            isr,
        } => {
            let (t, set) = set_of(state, topic, *partition)?;
            let leader = t.placement[*partition as usize];
            if *epoch != set.epoch {
                return Err(Rejected(format!(
                    "partition {topic}/{partition}: epoch {epoch} is over (now {})",
                    set.epoch
                )));
            }
            if !isr.contains(&leader) || isr.iter().any(|m| !set.members.contains(m)) {
                return Err(Rejected(format!(
                    "partition {topic}/{partition}: in-sync replicas {isr:?} must hold leader {leader} and be among {:?}",
                    set.members
                )));
            }
        }
        ReplicaCommand::Replicate { topic } => {
            let t = state
                .topics
                .get(topic)
                .ok_or_else(|| Rejected(format!("no topic named '{topic}'")))?;
            if !t.replicas.is_empty() {
                return Err(Rejected(format!(
                    "topic '{topic}' has replica sets already"
                )));
            }
        }
        ReplicaCommand::Target {
            topic,
            partition,
            target,
        } => {
            let (_, _) = set_of(state, topic, *partition)?;
            if let Some(t) = target {
                if t.is_empty() || !distinct(t) {
                    return Err(Rejected(format!(
                        "partition {topic}/{partition}: target replicas {t:?} must be distinct and not empty"
                    )));
                }
                if let Some(m) = t.iter().find(|m| !state.members.contains_key(m)) {
                    return Err(Rejected(format!(
                        "partition {topic}/{partition}: member {m} of the target is not in the group"
                    )));
                }
            }
        }
        ReplicaCommand::Members {
            topic,
            partition,
            members,
            isr,
        } => {
            let (t, _) = set_of(state, topic, *partition)?;
            let leader = t.placement[*partition as usize];
            if !well_formed(members, isr, leader) {
                return Err(Rejected(format!(
                    "partition {topic}/{partition}: replicas {members:?} must be distinct and hold the in-sync replicas {isr:?}, leader {leader} among them"
                )));
            }
        }
    }
    Ok(())
}

pub(super) fn apply(state: &mut RegistryState, cmd: &ReplicaCommand) {
    match cmd {
        ReplicaCommand::Leader {
            topic,
            partition,
            leader,
            epoch,
            isr,
        } => {
            if let Some(t) = state.topics.get_mut(topic) {
                let p = *partition as usize;
                t.placement[p] = *leader;
                t.replicas[p].epoch = *epoch;
                t.replicas[p].isr = isr.clone();
            }
        }
        ReplicaCommand::Isr {
            topic,
            partition,
            isr,
            ..
        } => {
            if let Some(t) = state.topics.get_mut(topic) {
                t.replicas[*partition as usize].isr = isr.clone();
            }
        }
        ReplicaCommand::Replicate { topic } => {
            if let Some(t) = state.topics.get_mut(topic) {
                t.replicas = t.placement.iter().map(|m| ReplicaSet::one(*m)).collect();
            }
        }
        ReplicaCommand::Target {
            topic,
            partition,
            target,
        } => {
            if let Some(t) = state.topics.get_mut(topic) {
                t.replicas[*partition as usize].target = target.clone();
            }
        }
        ReplicaCommand::Members {
            topic,
            partition,
            members,
            isr,
        } => {
            if let Some(t) = state.topics.get_mut(topic) {
                let set = &mut t.replicas[*partition as usize];
                set.members = members.clone();
                set.isr = isr.clone();
                if set.target.as_ref() == Some(members) {
                    set.target = None;
                }
            }
        }
    }
}
