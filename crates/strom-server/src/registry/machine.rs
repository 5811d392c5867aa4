//! The registry's state machine: the durable part of the master's database
//! (the group id, topics with their placement and end-of-stream bookkeeping,
//! and the members' addresses) and the commands that change it.
//!
//! [`RegistryState::apply`] is pure: no I/O, no clock, no randomness. Every
//! choice (topic and producer ids, placement, the group id) is made by the
//! operation that proposes a command and is recorded in the command, so
//! replaying the same commands from the same state always gives the same
//! state. That is the contract a replicated (Raft) log needs. Volatile
//! things, such as when a member last sent a heartbeat, live outside.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use strom_auth::SecurityTable;
use strom_proto::{GroupMember, TopicSpec, TopicState};

use super::group_machine::{self, ConsumerGroupMeta, GroupCommand};
use super::member_machine::{self, MemberCommand};
use super::replica_machine::{self, ReplicaCommand, ReplicaSet};
use super::security_machine::{self, SecurityCommand};
use crate::quota::{QuotaChange, QuotaTable, MAX_QUOTAS};

/// The most partitions a topic may have.
pub const MAX_PARTITIONS: u32 = 65_536;

/// One topic as the registry records it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct TopicMeta {
    pub id: u64,
    pub spec: TopicSpec,
    /// Member id owning each partition.
    pub placement: Vec<u32>,
    /// producer id -> closed
    pub producers: BTreeMap<u64, bool>,
    pub next_producer: u64,
    pub completed: bool,
    /// Open producers holding a lease: producer id -> lease in milliseconds.
    /// A producer leaves it when it closes or expires.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub leases: BTreeMap<u64, u32>,
    /// Producers whose lease ran out. Each also counts as closed in
    /// `producers`, so the end of stream is decided as for a close.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub expired: BTreeSet<u64>,
    /// Each partition's replicas, epoch and in-sync replicas; empty for a
    /// topic without replication.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replicas: Vec<ReplicaSet>,
}

impl TopicMeta {
    pub fn state(&self) -> TopicState {
        let finished = self.producers.values().filter(|c| **c).count() as u32;
        let open = self.producers.len() as u32 - finished;
        let expired = self.expired.len() as u32;
        TopicState {
            open_producers: open,
            closed_producers: finished - expired,
            ended: self.completed || (open == 0 && finished > 0),
            expired_producers: expired,
        }
    }

    /// Member -> partitions it owns.
    pub fn by_member(&self) -> BTreeMap<u32, Vec<u32>> {
        let mut m: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for (p, member) in self.placement.iter().enumerate() {
            m.entry(*member).or_default().push(p as u32);
        }
        m
    }

    /// The invariants every recorded topic keeps.
    fn check(&self) -> Result<(), Rejected> {
        let bad = |why: String| Err(Rejected(format!("topic '{}': {why}", self.spec.name)));
        let n = self.spec.partitions;
        if n == 0 || n > MAX_PARTITIONS {
            return bad(format!("{n} partitions (1 to {MAX_PARTITIONS} allowed)"));
        }
        if self.placement.len() != n as usize {
            return bad(format!(
                "{} partitions placed but the spec says {n}",
                self.placement.len()
            ));
        }
        self.check_replicas()?;
        if self
            .producers
            .keys()
            .next_back()
            .is_some_and(|p| *p >= self.next_producer)
        {
            return bad(format!(
                "a producer id at or above the next one ({})",
                self.next_producer
            ));
        }
        Ok(())
    }
}

/// A change to the registry, with every choice already made.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum RegistryCommand {
    /// The group's id, chosen once at the master's first start.
    SetGroupId {
        group_id: u64,
    },
    /// A new topic, its id and the owner of each partition included.
    CreateTopic {
        meta: Box<TopicMeta>,
    },
    DeleteTopic {
        name: String,
    },
    /// A producer registered under the id `producer`, holding a lease of
    /// `lease_ms` if set (absent in records written before leases).
    RegisterProducer {
        topic: String,
        producer: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lease_ms: Option<u32>,
    },
    /// A leased producer was not renewed in time: its part of the stream is
    /// closed, and it is reported as expired rather than closed.
    ExpireProducer {
        topic: String,
        producer: u64,
    },
    CloseProducer {
        topic: String,
        producer: u64,
    },
    /// The topic's stream was ended explicitly.
    CompleteTopic {
        topic: String,
    },
    /// New partitions appended to the topic, with the owner of each (and
    /// the replica set of each, for a topic with replica sets).
    AddPartitions {
        topic: String,
        placement: Vec<u32>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        replicas: Vec<ReplicaSet>,
    },
    /// A member joined (or rejoined) under `id`.
    MemberJoined {
        id: u32,
        addr: String,
    },
    /// A known member now listens at `addr`.
    MemberAddress {
        id: u32,
        addr: String,
    },
    /// A change to the consumer groups.
    ConsumerGroup(GroupCommand),
    /// A change of a replicated partition's leader or in-sync replicas.
    Replica(ReplicaCommand),
    /// A member is drained, or leaves the group.
    Member(MemberCommand),
    /// A change to the ACLs or the revoked tokens.
    Security(SecurityCommand),
    /// A change to the quotas (`crate::quota`).
    Quota(QuotaChange),
}

/// Why a command does not apply to a state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Rejected(pub String);

/// The durable state of the registry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegistryState {
    /// 0 until [`RegistryCommand::SetGroupId`].
    pub group_id: u64,
    /// Topic ids are never reused: the next topic's id is at least this.
    pub next_topic_id: u64,
    pub topics: BTreeMap<String, TopicMeta>,
    /// member id -> address
    pub members: BTreeMap<u32, String>,
    pub consumer_groups: BTreeMap<String, ConsumerGroupMeta>,
    /// Members being drained: id -> whether it is dead (removed).
    pub draining: BTreeMap<u32, bool>,
    /// Members that left the group for good; their ids are not reused.
    pub removed: BTreeSet<u32>,
    /// ACLs and revoked tokens.
    pub security: SecurityTable,
    /// Produce, consume and storage quotas.
    pub quotas: QuotaTable,
}

/// The state as JSON: the body of a snapshot, and exactly the layout of the
/// old `registry.json`, so a migration reads it unchanged.
#[derive(Serialize, Deserialize, Default)]
pub struct Persisted {
    /// 0 in files written before the group id existed.
    #[serde(default)]
    pub group_id: u64,
    pub next_topic_id: u64,
    pub topics: Vec<TopicMeta>,
    pub members: Vec<GroupMember>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub consumer_groups: Vec<ConsumerGroupMeta>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub draining: BTreeMap<u32, bool>,
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub removed: BTreeSet<u32>,
    #[serde(default, skip_serializing_if = "SecurityTable::is_empty")]
    pub security: SecurityTable,
    #[serde(default, skip_serializing_if = "QuotaTable::is_empty")]
    pub quotas: QuotaTable,
}

impl RegistryState {
    pub fn to_persisted(&self) -> Persisted {
        Persisted {
            group_id: self.group_id,
            next_topic_id: self.next_topic_id,
            topics: self.topics.values().cloned().collect(),
            members: self
                .members
                .iter()
                .map(|(id, addr)| GroupMember::new(*id, addr.clone()))
                .collect(),
            consumer_groups: self.consumer_groups.values().cloned().collect(),
            draining: self.draining.clone(),
            removed: self.removed.clone(),
            security: self.security.clone(),
            quotas: self.quotas.clone(),
        }
    }

    /// Rebuilds a state, checking the invariants `apply` keeps.
    pub fn from_persisted(p: Persisted) -> Result<Self, Rejected> {
        let mut st = RegistryState {
            group_id: p.group_id,
            next_topic_id: p.next_topic_id,
            draining: p.draining,
            removed: p.removed,
            security: p.security,
            quotas: p.quotas,
            ..Default::default()
        };
        for t in p.topics {
            t.check()?;
            if t.id >= st.next_topic_id {
                return Err(Rejected(format!(
                    "topic '{}' has id {}, not below the next topic id {}",
                    t.spec.name, t.id, st.next_topic_id
                )));
            }
            if let Some(t) = st.topics.insert(t.spec.name.clone(), t) {
                return Err(Rejected(format!("topic '{}' appears twice", t.spec.name)));
            }
        }
        for m in p.members {
            if st.members.insert(m.id, m.addr).is_some() {
                return Err(Rejected(format!("member {} appears twice", m.id)));
            }
        }
        for g in p.consumer_groups {
            st.topic(&g.spec.topic)?;
            let name = g.spec.name.clone();
            if st.consumer_groups.insert(name.clone(), g).is_some() {
                return Err(Rejected(format!("consumer group '{name}' appears twice")));
            }
        }
        Ok(st)
    }

    pub fn topic(&self, name: &str) -> Result<&TopicMeta, Rejected> {
        self.topics
            .get(name)
            .ok_or_else(|| Rejected(format!("no topic named '{name}'")))
    }

    /// Whether `cmd` applies to this state; `apply` checks it first.
    pub fn check(&self, cmd: &RegistryCommand) -> Result<(), Rejected> {
        use RegistryCommand as C;
        let fail = |why: String| Err(Rejected(why));
        match cmd {
            C::SetGroupId { group_id } => {
                if *group_id == 0 {
                    return fail("the group id cannot be 0".into());
                }
                if self.group_id != 0 {
                    return fail(format!("the group id is already {}", self.group_id));
                }
            }
            C::CreateTopic { meta } => {
                meta.check()?;
                if self.topics.contains_key(&meta.spec.name) {
                    return fail(format!("topic '{}' already exists", meta.spec.name));
                }
                if meta.id < self.next_topic_id || meta.id == u64::MAX {
                    return fail(format!(
                        "topic id {} is taken (the next free one is {})",
                        meta.id, self.next_topic_id
                    ));
                }
            }
            C::DeleteTopic { name } | C::CompleteTopic { topic: name } => {
                self.topic(name)?;
            }
            C::RegisterProducer {
                topic, producer, ..
            } => {
                let t = self.topic(topic)?;
                if t.state().ended {
                    return fail(format!("topic '{topic}' has ended"));
                }
                if *producer < t.next_producer || *producer == u64::MAX {
                    return fail(format!(
                        "producer id {producer} of topic '{topic}' is taken (the next free one is {})",
                        t.next_producer
                    ));
                }
            }
            C::CloseProducer { topic, producer } => {
                if !self.topic(topic)?.producers.contains_key(producer) {
                    return fail(format!("topic '{topic}' has no producer {producer}"));
                }
            }
            C::ExpireProducer { topic, producer } => {
                if !self.topic(topic)?.leases.contains_key(producer) {
                    return fail(format!(
                        "producer {producer} of topic '{topic}' holds no open lease"
                    ));
                }
            }
            C::AddPartitions {
                topic,
                placement,
                replicas,
            } => {
                let t = self.topic(topic)?;
                if t.state().ended {
                    return fail(format!("topic '{topic}' has ended"));
                }
                let sets_fit = match t.replicas.is_empty() {
                    true => replicas.is_empty(),
                    false => {
                        replicas.len() == placement.len()
                            && replicas.iter().zip(placement).all(|(s, m)| s.fits(*m))
                    }
                };
                if !sets_fit {
                    return fail(format!(
                        "the new partitions of topic '{topic}' need one well-formed replica set each exactly when the topic has replica sets"
                    ));
                }
                let total = t.placement.len() as u64 + placement.len() as u64;
                if placement.is_empty() || total > MAX_PARTITIONS as u64 {
                    return fail(format!(
                        "cannot add {} partitions to topic '{topic}' of {}",
                        placement.len(),
                        t.placement.len()
                    ));
                }
            }
            C::MemberJoined { id, .. } => {
                if self.removed.contains(id) {
                    return fail(format!(
                        "member {id} left the group for good; a new server joins under a new id"
                    ));
                }
            }
            C::MemberAddress { id, .. } => {
                if !self.members.contains_key(id) {
                    return fail(format!("there is no member {id}"));
                }
            }
            C::ConsumerGroup(g) => group_machine::check(self, g)?,
            C::Replica(r) => replica_machine::check(self, r)?,
            C::Member(m) => member_machine::check(self, m)?,
            C::Security(c) => security_machine::check(self, c)?,
            C::Quota(q) => {
                q.check().map_err(Rejected)?;
                let new = matches!(q, QuotaChange::Set { key, .. } if !self.quotas.quotas.contains_key(key));
                if new && self.quotas.quotas.len() >= MAX_QUOTAS {
                    return fail(format!("a group holds at most {MAX_QUOTAS} quotas"));
                }
            }
        }
        Ok(())
    }

    /// Applies `cmd`, or leaves the state unchanged and says why not.
    pub fn apply(&mut self, cmd: &RegistryCommand) -> Result<(), Rejected> {
        self.check(cmd)?;
        self.apply_checked(cmd);
        Ok(())
    }

    /// Applies a command that [`Self::check`] accepted on this very state.
    pub fn apply_checked(&mut self, cmd: &RegistryCommand) {
        use RegistryCommand as C;
        match cmd {
            C::SetGroupId { group_id } => self.group_id = *group_id,
            C::CreateTopic { meta } => {
                self.next_topic_id = meta.id + 1;
                self.topics
                    .insert(meta.spec.name.clone(), meta.as_ref().clone());
            }
            C::DeleteTopic { name } => {
                self.topics.remove(name);
                self.consumer_groups.retain(|_, g| g.spec.topic != *name);
            }
            C::RegisterProducer {
                topic,
                producer,
                lease_ms,
            } => {
                if let Some(t) = self.topics.get_mut(topic) {
                    t.producers.insert(*producer, false);
                    t.next_producer = producer + 1;
                    if let Some(ms) = lease_ms {
                        t.leases.insert(*producer, *ms);
                    }
                }
            }
            C::CloseProducer { topic, producer } => {
                if let Some(t) = self.topics.get_mut(topic) {
                    t.producers.insert(*producer, true);
                    t.leases.remove(producer);
                }
            }
            C::ExpireProducer { topic, producer } => {
                if let Some(t) = self.topics.get_mut(topic) {
                    t.producers.insert(*producer, true);
                    t.leases.remove(producer);
                    t.expired.insert(*producer);
                }
            }
            C::CompleteTopic { topic } => {
                if let Some(t) = self.topics.get_mut(topic) {
                    t.completed = true;
                }
            }
            C::AddPartitions {
                topic,
                placement,
                replicas,
            } => {
                if let Some(t) = self.topics.get_mut(topic) {
                    t.placement.extend_from_slice(placement);
                    t.replicas.extend_from_slice(replicas);
                    t.spec.partitions = t.placement.len() as u32;
                }
            }
            C::MemberJoined { id, addr } | C::MemberAddress { id, addr } => {
                self.members.insert(*id, addr.clone());
            }
            C::ConsumerGroup(g) => group_machine::apply(self, g),
            C::Replica(r) => replica_machine::apply(self, r),
            C::Member(m) => member_machine::apply(self, m),
            C::Security(c) => security_machine::apply(self, c),
            C::Quota(q) => self.quotas.apply(q),
        }
    }
}
