//! Moving replicated partitions between members while they serve
//! (docs/elasticity.md): `strom partition move`, `member drain` and
//! `member remove`, and the plans `strom rebalance` applies.
//!
//! A move records the partition's *target* replicas (the wanted leader
//! first) in the registry; it survives a registry failover. On every tick
//! [`Registry::advance_moves`] takes each moving partition one step on:
//! 1. the new replicas join the replica set out of sync, host the
//!    partition and copy it from the leader (the same path a follower
//!    takes after a restart);
//! 2. once every target replica is in sync, the leadership moves to the
//!    wanted leader if it must (a new epoch, as in a failover, but with
//!    every acknowledged event already on the new leader);
//! 3. the old replicas leave the set and drop their copies.
//!
//! A drained member leaves the group once it holds nothing; a removed
//! (dead) one too, its copies re-created from the in-sync ones left.

use std::collections::BTreeMap;

use strom_proto::{ErrorCode, Request};

use super::machine::{RegistryCommand, TopicMeta};
use super::member_machine::MemberCommand;
use super::replica_machine::{ReplicaCommand, ReplicaSet};
use super::replicas::{host_of, role_calls, RoleCall};
use super::{Inner, Registry};
use crate::error::ServerError;

fn invalid(msg: String) -> ServerError {
    ServerError::coded(ErrorCode::INVALID_ARGUMENT, msg)
}

/// The one step a moving partition takes next, and the member calls that
/// follow it; `None` while it waits (a copy catching up, a member down).
fn next_step(inner: &Inner, t: &TopicMeta, p: usize) -> Option<(ReplicaCommand, Vec<Call>)> {
    let set = t.replicas.get(p)?;
    let target = set.target.as_ref()?;
    let (topic, partition) = (t.spec.name.clone(), p as u32);
    let adding: Vec<u32> = target
        .iter()
        .copied()
        .filter(|m| !set.members.contains(m))
        .collect();
    if !adding.is_empty() {
        if adding.iter().any(|m| !inner.alive(*m)) {
            return None;
        }
        let mut members = set.members.clone();
        members.extend(&adding);
        let calls = adding
            .iter()
            .map(|m| (*m, inner.addr_of(*m), host_request(t, partition)))
            .map(|c| Call::Member(Box::new(c)))
            .chain([Call::Roles(topic.clone())])
            .collect();
        let cmd = ReplicaCommand::Members {
            topic,
            partition,
            members,
            isr: set.isr.clone(),
        };
        return Some((cmd, calls));
    }
    if target.iter().any(|m| !set.isr.contains(m)) {
        return None;
    }
    let leader = t.placement[p];
    // The wanted leader, or (if it is down and the leader must go) any
    // live target replica.
    let next = if leader == target[0] {
        None
    } else if inner.alive(target[0]) {
        Some(target[0])
    } else if !target.contains(&leader) {
        target.iter().copied().find(|m| inner.alive(*m))
    } else {
        None
    };
    if let Some(next) = next {
        let cmd = ReplicaCommand::Leader {
            topic: topic.clone(),
            partition,
            leader: next,
            epoch: set.epoch + 1,
            isr: set.isr.clone(),
        };
        return Some((cmd, vec![Call::Roles(topic)]));
    }
    if !target.contains(&leader) {
        return None;
    }
    if set.members != *target {
        let release = set
            .members
            .iter()
            .filter(|m| !target.contains(m) && inner.alive(**m))
            .map(|m| {
                let req = Request::ReleasePartitions {
                    topic: topic.clone(),
                    topic_id: t.id,
                    partitions: vec![partition],
                };
                Call::Member(Box::new((*m, inner.addr_of(*m), req)))
            });
        let calls = std::iter::once(Call::Roles(topic.clone()))
            .chain(release)
            .collect();
        let cmd = ReplicaCommand::Members {
            topic,
            partition,
            members: target.clone(),
            isr: set
                .isr
                .iter()
                .copied()
                .filter(|m| target.contains(m))
                .collect(),
        };
        return Some((cmd, calls));
    }
    let done = ReplicaCommand::Target {
        topic,
        partition,
        target: None,
    };
    Some((done, Vec::new()))
}

/// A member call to make after a step: one request, or the roles of every
/// holder of a topic (computed once the step is committed).
enum Call {
    Member(Box<RoleCall>),
    Roles(String),
}

fn host_request(t: &TopicMeta, partition: u32) -> Request {
    Request::HostPartitions {
        topic_id: t.id,
        spec: t.spec.clone(),
        partitions: vec![partition],
        sealed: t.state().ended,
    }
}

/// `HostPartitions` for the new replicas of moving partitions that are not
/// in sync yet (sent again with the periodic roles, so a member that
/// missed it, or dropped the copy, hosts it again).
pub(super) fn host_moving(inner: &Inner) -> Vec<RoleCall> {
    let mut calls = Vec::new();
    for t in inner.state.topics.values() {
        for (p, set) in t.replicas.iter().enumerate() {
            let Some(target) = &set.target else { continue };
            for m in target
                .iter()
                .filter(|m| set.members.contains(m) && !set.isr.contains(m) && inner.alive(**m))
            {
                calls.push((*m, inner.addr_of(*m), host_request(t, p as u32)));
            }
        }
    }
    calls
}

/// `ReleasePartitions` for a member that joins: every partition of a
/// replicated topic it is not (or no longer, after a move made while it
/// was down) a replica of, nor moving to.
pub(super) fn released_on_join(inner: &Inner, member: u32) -> Vec<Request> {
    inner
        .state
        .topics
        .values()
        .filter(|t| !t.replicas.is_empty())
        .filter_map(|t| {
            let partitions: Vec<u32> = (0..t.replicas.len())
                .filter(|p| {
                    let set = &t.replicas[*p];
                    !set.members.contains(&member)
                        && !set.target.as_ref().is_some_and(|x| x.contains(&member))
                })
                .map(|p| p as u32)
                .collect();
            (!partitions.is_empty()).then(|| Request::ReleasePartitions {
                topic: t.spec.name.clone(),
                topic_id: t.id,
                partitions,
            })
        })
        .collect()
}

/// How many copies each member holds (or is moving to hold).
fn load(inner: &Inner) -> BTreeMap<u32, usize> {
    let mut load: BTreeMap<u32, usize> = inner.state.members.keys().map(|m| (*m, 0)).collect();
    for t in inner.state.topics.values() {
        for (p, m) in t.placement.iter().enumerate() {
            let set = t.replicas.get(p);
            let holders = set.map_or_else(
                || vec![*m],
                |s| s.target.clone().unwrap_or_else(|| s.members.clone()),
            );
            for h in holders {
                *load.entry(h).or_default() += 1;
            }
        }
    }
    load
}

/// Where each replicated partition `member` holds goes instead: the live
/// member, not being drained and holding no copy of it, on a host none of
/// its other copies is on if possible, with the fewest copies.
fn plan_drain(
    inner: &Inner,
    member: u32,
    dead: bool,
) -> Result<Vec<(String, u32, Vec<u32>)>, ServerError> {
    let mut load = load(inner);
    let candidates: Vec<u32> = inner
        .live_members()
        .into_iter()
        .filter(|m| *m != member)
        .collect();
    let host = |m: u32| host_of(inner.state.members.get(&m).map_or("", |a| a)).to_string();
    let mut plan = Vec::new();
    let mut alone = Vec::new();
    for t in inner.state.topics.values() {
        let sets: Vec<ReplicaSet> = match t.replicas.is_empty() {
            true => t.placement.iter().map(|m| ReplicaSet::one(*m)).collect(),
            false => t.replicas.clone(),
        };
        for (p, set) in sets.iter().enumerate() {
            let base = set.target.clone().unwrap_or_else(|| set.members.clone());
            if !base.contains(&member) {
                continue;
            }
            // A dead member's only copy cannot be copied from anywhere.
            let others = set.isr.iter().any(|m| *m != member && inner.alive(*m));
            if !others && dead {
                alone.push(format!("{}/{p}", t.spec.name));
                continue;
            }
            let used: Vec<String> = base
                .iter()
                .filter(|m| **m != member)
                .map(|m| host(*m))
                .collect();
            let pick = candidates
                .iter()
                .filter(|c| !base.contains(c))
                .min_by_key(|c| (used.contains(&host(**c)), load.get(c).copied().unwrap_or(0), **c))
                .copied()
                .ok_or_else(|| {
                    invalid(format!(
                        "no member can take partition {}/{p}: every live member other than {member} holds a copy of it already (add a member first)",
                        t.spec.name
                    ))
                })?;
            *load.entry(pick).or_default() += 1;
            // The leader leaves: an in-sync copy that stays leads next.
            let leader = t.placement[p];
            let mut target: Vec<u32> = base.iter().copied().filter(|m| *m != member).collect();
            if leader == member {
                if let Some(i) = target
                    .iter()
                    .position(|m| set.isr.contains(m) && inner.alive(*m))
                {
                    target[..=i].rotate_right(1);
                }
                target.push(pick);
            } else {
                let at = base.iter().position(|m| *m == member).unwrap_or(base.len());
                target.insert(at.min(target.len()), pick);
            }
            plan.push((t.spec.name.clone(), p as u32, target));
        }
    }
    if !alone.is_empty() {
        let n = alone.len();
        alone.truncate(8);
        return Err(invalid(format!(
            "member {member} is dead and holds the only in-sync copy of {n} partitions ({}): they cannot be re-created; start it again (or wait for its copies to come back in sync) and drain it",
            alone.join(", ")
        )));
    }
    Ok(plan)
}

impl Registry {
    /// Starts moving `topic`'s `partition` to `replicas` (the wanted leader
    /// first); [`Self::advance_moves`] carries it out.
    pub async fn move_partition(
        &self,
        topic: &str,
        partition: u32,
        replicas: Vec<u32>,
    ) -> Result<(), ServerError> {
        let mut inner = self.inner.lock().await;
        let t = super::topics::topic(&inner, topic)?;
        if partition as usize >= t.placement.len() {
            return Err(ServerError::coded(
                ErrorCode::PARTITION_NOT_FOUND,
                format!("topic '{topic}' has no partition {partition}"),
            ));
        }
        let rf = t.spec.replicas() as usize;
        if replicas.len() != rf {
            return Err(invalid(format!(
                "topic '{topic}' keeps {rf} copies of each partition; name {rf} distinct members, not {}",
                replicas.len()
            )));
        }
        for (i, m) in replicas.iter().enumerate() {
            if replicas[..i].contains(m) {
                return Err(invalid(format!("member {m} is named twice")));
            }
            if !inner.state.members.contains_key(m) {
                return Err(invalid(format!("there is no member {m} in this group")));
            }
            if inner.state.draining.contains_key(m) {
                return Err(invalid(format!("member {m} is being drained")));
            }
            if !inner.alive(*m) {
                return Err(ServerError::coded(
                    ErrorCode::CONNECTION_FAILED,
                    format!("member {m} is not alive; a partition cannot move to it"),
                ));
            }
        }
        replicate(&mut inner, topic).await?;
        let cmd = ReplicaCommand::Target {
            topic: topic.to_string(),
            partition,
            target: Some(replicas.clone()),
        };
        inner.commit(RegistryCommand::Replica(cmd)).await?;
        tracing::info!(topic, partition, to = ?replicas, "partition move started");
        Ok(())
    }

    /// Starts moving every partition off `member` (`dead`: it is gone, and
    /// its copies are re-created from the in-sync ones left); it leaves the
    /// group once it holds nothing.
    pub async fn drain_member(&self, member: u32, dead: bool) -> Result<(), ServerError> {
        let roles = self.roles();
        let mut inner = self.inner.lock().await;
        if !inner.state.members.contains_key(&member) {
            return Err(invalid(format!(
                "there is no member {member} in this group"
            )));
        }
        let keeps_registry = |r: &&str| matches!(*r, "master" | "leader" | "voter");
        let role = roles.get(&member).copied();
        // A dead voter is replaced in the quorum by a live member that does
        // not vote yet (`quorum.rs`); without one it must stay.
        let spare = inner.state.members.keys().any(|id| {
            *id != member
                && !roles.get(id).is_some_and(keeps_registry)
                && inner.alive(*id)
                && !inner.state.draining.contains_key(id)
        });
        let replaceable = dead && role == Some("voter") && spare;
        if member == inner.me || (role.is_some_and(|r| keeps_registry(&r)) && !replaceable) {
            let why = if dead && role == Some("voter") {
                "; no live member outside the quorum can take its place: add one \
                 (`strom server --join`) and remove it again"
            } else {
                ""
            };
            return Err(invalid(format!(
                "member {member} keeps the registry ({}); it cannot leave the group{why}",
                role.unwrap_or("master")
            )));
        }
        match (dead, inner.alive(member)) {
            (false, false) => return Err(invalid(format!(
                "member {member} is not alive, so nothing can be copied from it: `strom member remove {member}` re-creates its copies from the others"
            ))),
            (true, true) => return Err(invalid(format!(
                "member {member} is alive: `strom member drain {member}` moves its partitions off it (a remove copies nothing from it)"
            ))),
            _ => {}
        }
        let plan = plan_drain(&inner, member, dead)?;
        let cmd = MemberCommand::Draining { id: member, dead };
        inner.commit(RegistryCommand::Member(cmd)).await?;
        for (topic, partition, target) in plan {
            replicate(&mut inner, &topic).await?;
            let cmd = ReplicaCommand::Target {
                topic,
                partition,
                target: Some(target),
            };
            inner.commit(RegistryCommand::Replica(cmd)).await?;
        }
        tracing::warn!(member, dead, "member drain started");
        Ok(())
    }

    /// Takes every moving partition one step on, then lets drained members
    /// that hold nothing leave.
    pub async fn advance_moves(&self) {
        let mut inner = self.inner.lock().await;
        // Liveness is unknown until the members had a timeout to heartbeat.
        if inner.since.elapsed() < inner.timeout {
            return;
        }
        // Drained members that held nothing already when this tick began:
        // the calls that released their last copies were answered in an
        // earlier tick, so they may go now.
        let done: Vec<u32> = inner
            .state
            .draining
            .keys()
            .copied()
            .filter(|m| !holds_anything(&inner, *m))
            .collect();
        let steps: Vec<(ReplicaCommand, Vec<Call>)> = inner
            .state
            .topics
            .values()
            .flat_map(|t| (0..t.replicas.len()).filter_map(|p| next_step(&inner, t, p)))
            .collect();
        let mut calls: Vec<RoleCall> = Vec::new();
        for (cmd, after) in steps {
            let (topic, partition) = cmd.partition();
            let (topic, partition) = (topic.to_string(), partition);
            tracing::info!(topic = %topic, partition, step = ?cmd, "partition move step");
            if let Err(e) = inner.commit(RegistryCommand::Replica(cmd)).await {
                tracing::warn!(topic = %topic, partition, error = %e, "a partition move step failed; retried");
                break;
            }
            for call in after {
                match call {
                    Call::Member(c) => calls.push(*c),
                    Call::Roles(name) => {
                        if let Some(meta) = inner.state.topics.get(&name) {
                            // The partition's leader first: it takes appends
                            // as soon as it knows, and the old one refers
                            // producers to it only after.
                            let mut rc = role_calls(&inner, meta, None);
                            let leader = meta.placement.get(partition as usize).copied();
                            rc.sort_by_key(|(m, _, _)| Some(*m) != leader);
                            calls.extend(rc);
                        }
                    }
                }
            }
        }
        for id in done {
            match inner
                .commit(RegistryCommand::Member(MemberCommand::Left { id }))
                .await
            {
                Ok(()) => {
                    tracing::warn!(member = id, "member drained; it left the group");
                    self.publish_group(&inner);
                }
                Err(e) => {
                    tracing::warn!(member = id, error = %e, "a drained member could not leave yet")
                }
            }
        }
        drop(inner);
        self.send_roles(calls).await;
    }
}

/// Gives a topic without replication a replica set of one copy per
/// partition (once), so that its partitions can move like replicas.
async fn replicate(inner: &mut Inner, topic: &str) -> Result<(), ServerError> {
    let unreplicated = inner
        .state
        .topics
        .get(topic)
        .is_some_and(|t| t.replicas.is_empty());
    if unreplicated {
        let cmd = ReplicaCommand::Replicate {
            topic: topic.to_string(),
        };
        inner.commit(RegistryCommand::Replica(cmd)).await?;
        tracing::info!(
            topic,
            "a topic without replication got replica sets of one copy (its partitions move)"
        );
    }
    Ok(())
}

/// Whether `member` holds a copy of, or is moving to, any partition.
fn holds_anything(inner: &Inner, member: u32) -> bool {
    inner.state.topics.values().any(|t| {
        t.holders().contains_key(&member)
            || t.replicas
                .iter()
                .any(|s| s.target.as_ref().is_some_and(|x| x.contains(&member)))
    })
}

impl Registry {
    /// Sends every replicated topic's roles to its live holders again
    /// (after asking the new replicas of moving partitions to host them).
    pub async fn resend_roles(&self) {
        let calls: Vec<RoleCall> = {
            let inner = self.inner.lock().await;
            let hosts = host_moving(&inner);
            let roles = inner
                .state
                .topics
                .values()
                .filter(|t| !t.replicas.is_empty())
                .flat_map(|meta| role_calls(&inner, meta, None));
            hosts.into_iter().chain(roles).collect()
        };
        self.send_roles(calls).await;
    }
}
