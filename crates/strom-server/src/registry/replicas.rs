//! The registry's part in replicated partitions (docs/replication.md):
//! placing R copies of each partition on distinct members, telling every
//! holder its role (`SetReplicaRoles`), recording the in-sync replicas the
//! leaders report (refusing a stale epoch, which fences a deposed leader),
//! and failing over: when a partition's leader is dead, an in-sync
//! follower that is alive leads from the next epoch. A partition none of
//! whose in-sync replicas is alive waits (no unclean election).

use std::collections::BTreeMap;
use std::time::Duration;

use strom_proto::{ErrorCode, ReplicaRole, Request, TopicSpec};

use super::machine::{RegistryCommand, TopicMeta};
use super::replica_machine::{ReplicaCommand, ReplicaSet};
use super::{Inner, Registry};
use crate::error::ServerError;

/// How often roles are sent again to every live holder (one that missed
/// a change, or restarted, gets it this way too).
pub const ROLES_EVERY: Duration = Duration::from_secs(2);

/// The replica sets of a new topic whose leaders are `leaders`: each
/// partition's followers are the next live members after its leader,
/// those on other hosts first ([`replica_members`]).
pub(super) fn place(
    inner: &Inner,
    spec: &TopicSpec,
    leaders: &[u32],
) -> Result<Vec<ReplicaSet>, ServerError> {
    let r = spec.replicas() as usize;
    if r <= 1 {
        return Ok(Vec::new());
    }
    let alive = inner.live_members();
    if alive.len() < r {
        return Err(ServerError::coded(
            ErrorCode::INVALID_TOPIC_SPEC,
            format!(
                "replication factor {r} needs {r} live members; {} are alive ({alive:?})",
                alive.len()
            ),
        ));
    }
    if spec.min_in_sync_replicas() as usize > r {
        return Err(ServerError::coded(
            ErrorCode::INVALID_TOPIC_SPEC,
            format!(
                "min_in_sync {} is above the replication factor {r}",
                spec.min_in_sync
            ),
        ));
    }
    let hosts: Vec<(u32, &str)> = alive
        .iter()
        .map(|m| (*m, inner.state.members.get(m).map_or("", |a| host_of(a))))
        .collect();
    Ok(leaders
        .iter()
        .map(|leader| {
            let members = replica_members(&hosts, *leader, r);
            ReplicaSet {
                isr: members.clone(),
                members,
                epoch: 1,
                target: None,
            }
        })
        .collect())
}

/// The host part of a member's `host:port` address (`[v6]:port` too).
pub(super) fn host_of(addr: &str) -> &str {
    let addr = addr.split_once("://").map_or(addr, |(_, rest)| rest);
    addr.rsplit_once(':').map_or(addr, |(host, _)| host)
}

/// `leader` and the `r - 1` members after it in `hosts` (live members and
/// their hosts, in id order, wrapping around): first those on hosts no
/// chosen copy is on yet, then the others, so copies land on distinct
/// hosts whenever the members span enough of them.
fn replica_members(hosts: &[(u32, &str)], leader: u32, r: usize) -> Vec<u32> {
    let at = hosts.iter().position(|(m, _)| *m == leader).unwrap_or(0);
    let ring: Vec<(u32, &str)> = (1..hosts.len())
        .map(|i| hosts[(at + i) % hosts.len()])
        .filter(|(m, _)| *m != leader)
        .collect();
    let mut members = vec![leader];
    let mut used: Vec<&str> = hosts.get(at).map(|(_, h)| *h).into_iter().collect();
    for (m, h) in &ring {
        if members.len() < r && !used.contains(h) {
            members.push(*m);
            used.push(h);
        }
    }
    for (m, _) in &ring {
        if members.len() < r && !members.contains(m) {
            members.push(*m);
        }
    }
    members
}

/// A `SetReplicaRoles` for one member: (member, address, request).
pub(super) type RoleCall = (u32, String, Request);

/// The `SetReplicaRoles` requests for the live holders of `meta`'s
/// partitions (`only`: one member).
pub(super) fn role_calls(inner: &Inner, meta: &TopicMeta, only: Option<u32>) -> Vec<RoleCall> {
    roles(inner, meta)
        .into_iter()
        .filter(|(m, _)| only.is_none_or(|o| o == *m) && inner.alive(*m))
        .map(|(m, roles)| {
            let req = Request::SetReplicaRoles {
                topic: meta.spec.name.clone(),
                roles,
            };
            (m, inner.addr_of(m), req)
        })
        .collect()
}

/// Each holder's roles in the partitions of `meta` it holds.
fn roles(inner: &Inner, meta: &TopicMeta) -> BTreeMap<u32, Vec<ReplicaRole>> {
    let mut out: BTreeMap<u32, Vec<ReplicaRole>> = BTreeMap::new();
    for (p, set) in meta.replicas.iter().enumerate() {
        let leader = meta.placement[p];
        let role = ReplicaRole {
            partition: p as u32,
            epoch: set.epoch,
            leader,
            leader_addr: inner.addr_of(leader),
            followers: set
                .members
                .iter()
                .copied()
                .filter(|m| *m != leader)
                .collect(),
            isr: set.isr.clone(),
        };
        for m in &set.members {
            out.entry(*m).or_default().push(role.clone());
        }
    }
    out
}

impl Registry {
    /// Tells the holders their roles; failures are logged, and the
    /// periodic resend retries.
    pub(super) async fn send_roles(&self, calls: Vec<RoleCall>) {
        for (member, addr, req) in calls {
            if let Err(e) = self.link.call(member, &addr, req).await {
                tracing::debug!(member, error = %e, "could not send replica roles; sent again later");
            }
        }
    }

    /// A partition leader reports its in-sync replicas: recorded if its
    /// epoch is still the partition's, else `FENCED`; refused
    /// (`NOT_A_MEMBER`) from any member but the partition's leader.
    pub async fn report_isr(
        &self,
        reporter: u32,
        topic: &str,
        partition: u32,
        epoch: u64,
        isr: Vec<u32>,
    ) -> Result<(), ServerError> {
        let mut inner = self.inner.lock().await;
        let meta = inner.state.topics.get(topic);
        let Some(set) = meta.and_then(|t| t.replicas.get(partition as usize)) else {
            return Err(ServerError::coded(
                ErrorCode::PARTITION_NOT_FOUND,
                format!("partition {topic}/{partition} is not replicated"),
            ));
        };
        if set.epoch != epoch {
            return Err(ServerError::coded(
                ErrorCode::FENCED,
                format!(
                    "partition {topic}/{partition}: epoch {epoch} is over, the partition is in epoch {}",
                    set.epoch
                ),
            ));
        }
        let leader = meta.and_then(|t| t.placement.get(partition as usize).copied());
        if leader.is_some_and(|l| l != reporter) {
            return Err(ServerError::coded(
                ErrorCode::NOT_A_MEMBER,
                format!("partition {topic}/{partition}: member {reporter} reported its in-sync replicas, but it does not lead it"),
            ));
        }
        if set.isr == isr {
            // A leader asking again after an answer it did not get.
            return Ok(());
        }
        let cmd = ReplicaCommand::Isr {
            topic: topic.to_string(),
            partition,
            epoch,
            isr: isr.clone(),
        };
        inner.commit(RegistryCommand::Replica(cmd)).await?;
        tracing::info!(topic, partition, epoch, isr = ?isr, "in-sync replicas recorded");
        Ok(())
    }

    /// Fails over every replicated partition whose leader is dead to an
    /// in-sync replica that is alive, then sends the new roles.
    pub async fn fail_over(&self) {
        let mut inner = self.inner.lock().await;
        // A registry that just started (or took over) has not heard from
        // the members yet: they get a heartbeat timeout first.
        if inner.since.elapsed() < inner.timeout {
            return;
        }
        let mut moves = Vec::new();
        for t in inner.state.topics.values() {
            for (p, set) in t.replicas.iter().enumerate() {
                let leader = t.placement[p];
                if inner.alive(leader) {
                    continue;
                }
                let Some(next) = set
                    .isr
                    .iter()
                    .copied()
                    .find(|m| *m != leader && inner.alive(*m))
                else {
                    continue;
                };
                let isr: Vec<u32> = set.isr.iter().copied().filter(|m| *m != leader).collect();
                moves.push(ReplicaCommand::Leader {
                    topic: t.spec.name.clone(),
                    partition: p as u32,
                    leader: next,
                    epoch: set.epoch + 1,
                    isr,
                });
            }
        }
        let mut changed: Vec<String> = Vec::new();
        for cmd in moves {
            let ReplicaCommand::Leader {
                topic,
                partition,
                leader,
                epoch,
                ..
            } = &cmd
            else {
                continue;
            };
            let (topic, partition, leader, epoch) = (topic.clone(), *partition, *leader, *epoch);
            match inner.commit(RegistryCommand::Replica(cmd)).await {
                Ok(()) => {
                    tracing::warn!(topic = %topic, partition, leader, epoch, "partition leader failed over");
                    if !changed.contains(&topic) {
                        changed.push(topic);
                    }
                }
                Err(e) => {
                    tracing::warn!(topic = %topic, partition, error = %e, "could not fail over a partition");
                    return;
                }
            }
        }
        let calls: Vec<RoleCall> = changed
            .iter()
            .filter_map(|name| inner.state.topics.get(name))
            .flat_map(|meta| role_calls(&inner, meta, None))
            .collect();
        drop(inner);
        self.send_roles(calls).await;
    }

    /// Member `member` restarted (its first join since its process
    /// started): its copies may have lost what they held (a memory
    /// partition, an emptied data dir, an unsynced tail). It leaves every
    /// ISR, and what it led fails over to a live in-sync replica, if there
    /// is one (else it leads again with what it has). Returns the topics
    /// whose roles changed.
    pub(super) async fn after_restart(
        inner: &mut Inner,
        member: u32,
    ) -> Result<Vec<String>, ServerError> {
        let mut cmds = Vec::new();
        for t in inner.state.topics.values() {
            for (p, set) in t.replicas.iter().enumerate() {
                let isr: Vec<u32> = set.isr.iter().copied().filter(|m| *m != member).collect();
                let (topic, partition) = (t.spec.name.clone(), p as u32);
                if t.placement[p] == member {
                    if let Some(next) = isr.iter().copied().find(|m| inner.alive(*m)) {
                        cmds.push(ReplicaCommand::Leader {
                            topic,
                            partition,
                            leader: next,
                            epoch: set.epoch + 1,
                            isr,
                        });
                    }
                } else if set.isr.contains(&member) {
                    cmds.push(ReplicaCommand::Isr {
                        topic,
                        partition,
                        epoch: set.epoch,
                        isr,
                    });
                }
            }
        }
        let mut changed = Vec::new();
        for cmd in cmds {
            let (topic, partition) = cmd.partition();
            let (topic, partition) = (topic.to_string(), partition);
            inner.commit(RegistryCommand::Replica(cmd)).await?;
            tracing::warn!(topic = %topic, partition, member, "a restarted member left the partition's in-sync replicas (and its leadership, if it led)");
            if !changed.contains(&topic) {
                changed.push(topic);
            }
        }
        Ok(changed)
    }
}

#[cfg(test)]
mod tests {
    use super::{host_of, replica_members};

    #[test]
    fn copies_go_to_distinct_hosts_when_the_members_span_them() {
        // Members 0-3 on host a, 4-5 on host b, 6 on host c.
        let hosts: Vec<(u32, &str)> = [
            (0, "a"),
            (1, "a"),
            (2, "a"),
            (3, "a"),
            (4, "b"),
            (5, "b"),
            (6, "c"),
        ]
        .into_iter()
        .collect();
        assert_eq!(replica_members(&hosts, 0, 3), [0, 4, 6]);
        assert_eq!(replica_members(&hosts, 4, 3), [4, 6, 0]);
        assert_eq!(replica_members(&hosts, 6, 2), [6, 0]);
        // More copies than hosts: the rest in ring order.
        assert_eq!(replica_members(&hosts, 0, 5), [0, 4, 6, 1, 2]);
        // One host: the next members after the leader, as before.
        let one: Vec<(u32, &str)> = (0..4).map(|m| (m, "h")).collect();
        assert_eq!(replica_members(&one, 2, 3), [2, 3, 0]);
    }

    #[test]
    fn the_host_is_the_address_without_its_port() {
        assert_eq!(host_of("10.0.0.7:7400"), "10.0.0.7");
        assert_eq!(host_of("[::1]:7400"), "[::1]");
        assert_eq!(host_of("tcp://node12:7400"), "node12");
        assert_eq!(host_of("node12"), "node12");
    }
}
